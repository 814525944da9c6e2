"""The grammar of graph edge lists: how a text file becomes records, byte for byte.

* **TSV** (a tab anywhere in the data, or ``--sep tab``): fields are split at tabs and
  nothing else. An id is the whole field, byte for byte (``isbn:111``, ``Route 66``,
  ``a,b;c``, ``007``, any UTF-8 text).
* **CSV** (``--format csv``, a ``.csv`` name, ``--sep comma|semicolon``, or a first data line
  with commas and no blank): RFC 4180: fields split at the separator, a field in double
  quotes may hold separators, tabs, newlines and ``""`` (one quote).
* **Blank-separated** (no tab in the file, or ``--sep whitespace``): fields split at runs of
  spaces and tabs. Detected only where it is certain: the ids are integers, or there is no
  weight column that a blank inside an id could have made (two fields per line). Otherwise
  the file is refused with the line and the flag to give (``u1 Route 66`` is either
  ``u1``/``Route 66`` or ``u1``/``Route``/weight 66).
* **MovieLens** ``::`` (no tab, and ``::`` on the first data line, or ``--sep ::``).

Every data line has the same number of fields (the first line's: 2 or 3 for edge lists, 3
or 4 for ratings). Lines before the first data line that start with ``#`` or ``%`` are
comments; blank lines are skipped anywhere; a ``\\r`` before ``\\n`` is part of the line end.
A **header** (the first record) is detected only with numeric evidence: every one of its
fields is not a number while every other record's fields in those columns are (the weight
column, or integer ids), or named (``header=True``). Ids are parsed as exact integers
(int64, canonical spelling: no ``+``, no leading zero) or kept as text; never through a float.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from ...errors import InputError, UsageError
from .._tsv_text import UTF8_BOM

__all__ = ["SEPARATORS", "Dialect", "Records", "detect_dialect", "read_records", "show"]

#: ``sep`` choices (``auto``: see the module docstring).
SEPARATORS = ("auto", "tab", "comma", "semicolon", "whitespace", "::")
_SEP_BYTE = {"tab": 9, "comma": 44, "semicolon": 59}
#: Column names that make a first record a header although the ids are text.
_HEADER_WORDS = {
    "source", "target", "src", "dst", "from", "to", "u", "v", "user", "item", "users",
    "items", "userid", "itemid", "movieid", "user_id", "item_id", "movie_id", "node",
    "node1", "node2", "weight", "rating", "timestamp", "id1", "id2", "head", "tail",
}  # fmt: skip


def show(raw) -> str:
    """A field or line for a message: quoted, shortened, never a Python bytes repr."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
    text = text if len(text) <= 60 else text[:57] + "..."
    return "'" + "".join(c if c.isprintable() else _escaped(c) for c in text) + "'"


#: How :func:`show` writes the characters it cannot print as they are.
_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}


def _escaped(c: str) -> str:
    """A character that prints as nothing or as a blank (a NUL, a no-break space, a
    byte-order mark), written so the message shows it: ``\\xa0``, ``\\ufeff``."""
    if c in _ESCAPES:
        return _ESCAPES[c]
    return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"


@dataclass(frozen=True)
class Dialect:
    """How a file's lines split into fields."""

    sep: str  # one of SEPARATORS but auto
    quoted: bool = False  # RFC 4180 quotes present (CSV)
    certain: bool = True  # False: blank-separated by default (checked after parsing)

    @property
    def mode(self) -> int:
        from . import _text_kernels as K

        if self.sep == "whitespace":
            return K.BLANKS
        if self.sep == "::":
            return K.COLONS
        return K.SEP_BYTE

    @property
    def byte(self) -> int:
        return _SEP_BYTE.get(self.sep, 0)

    def describe(self) -> str:
        return {"tab": "tab-separated", "comma": "CSV", "semicolon": "CSV (;)",
                "whitespace": "blank-separated", "::": "'::'-separated"}[self.sep]  # fmt: skip


def _first_data_line(buf: bytes, start: int) -> tuple[int, bytes]:
    """``(offset, line)`` of the first line after the leading comments and blank lines."""
    p = start
    while p < len(buf):
        e = buf.find(b"\n", p)
        e = len(buf) if e < 0 else e
        line = buf[p:e].rstrip(b"\r")
        if line.strip(b" \t") and line[:1] not in (b"#", b"%"):
            return p, line
        p = e + 1
    return len(buf), b""


def data_start(buf, skip_lines: int = 0) -> int:
    """Offset of the first data line: after a UTF-8 byte-order mark (text encoding, not data:
    read as part of the first id, it made ``1`` and ``\ufeff1`` two nodes and every integer
    id a text label), ``skip_lines`` lines, then leading comment lines (``#``, ``%``) and
    blank lines."""
    p = len(UTF8_BOM) if buf[: len(UTF8_BOM)] == UTF8_BOM else 0
    for _ in range(skip_lines):
        e = buf.find(b"\n", p)
        if e < 0:
            return len(buf)
        p = e + 1
    return _first_data_line(buf, p)[0]


def detect_dialect(path, buf, start: int, fmt: str, sep: str = "auto") -> Dialect:
    """The dialect of the data from ``start`` on (``sep`` forces one)."""
    if sep not in SEPARATORS:
        raise UsageError(f"--sep must be one of {', '.join(SEPARATORS)}, got {sep}")
    csv_name = os.fspath(path).lower().endswith(".csv")
    quoted = buf.find(b'"', start) >= 0
    if sep != "auto":
        return Dialect(sep, quoted and sep in ("comma", "semicolon"))
    if fmt == "csv" or (csv_name and fmt != "ratings"):
        return Dialect("comma", quoted)
    if buf.find(b"\t", start) >= 0:
        return Dialect("tab")
    _, line = _first_data_line(buf, start)
    if b"::" in line:
        return Dialect("::")
    if b"," in line and b" " not in line:
        return Dialect("comma", quoted)
    return Dialect("whitespace", certain=False)


@dataclass
class Records:
    """The data records of an edge list: two id columns and the weights.

    ``ids[j]`` is int64 (every field an exact integer) or a bytes array (``dtype S``, or
    object for very long ids); ``weights`` float64 or None; ``line(i)`` the 1-based line of
    record ``i``; ``header`` the header's fields when one was skipped.
    """

    ids: list
    weights: np.ndarray | None
    line: object
    header: tuple | None = None
    dialect: Dialect | None = None

    @property
    def size(self) -> int:
        return int(self.ids[0].size)


class LineOf:
    """1-based line numbers from byte offsets (computed only for a message)."""

    def __init__(self, buf, offsets, first_line=1):
        self.buf, self.offsets, self.first = buf, offsets, first_line

    def __call__(self, i: int) -> int:
        off = int(self.offsets[i])
        return self.first + bytes(self.buf[:off]).count(b"\n")


def line_at(buf, offset: int) -> int:
    return bytes(buf[:offset]).count(b"\n") + 1


def _line_text(buf, offset: int) -> bytes:
    e = buf.find(b"\n", offset)
    return bytes(buf[offset : len(buf) if e < 0 else e]).rstrip(b"\r")


def read_records(path, buf, fmt: str, allowed, sep="auto", header=None, skip_lines=0,
                 strict=True) -> Records:  # fmt: skip
    """Every record of the edge list in ``buf`` (the whole file), by its dialect.

    ``allowed`` are the field counts (``(2, 3)`` edge lists, ``(3, 4)`` ratings); ``header``
    True / False / None (detect, see :func:`decide_header`); ``strict`` asks for canonical
    integer ids (``007`` and ``+7`` stay text).
    """
    start = data_start(buf, skip_lines)
    if start >= len(buf):
        raise InputError(f"{path}: no edges found")
    dialect = detect_dialect(path, buf, start, fmt, sep)
    if dialect.quoted:
        rec = _csv_records(path, buf, start, dialect, allowed, header)
    else:
        rec = _split_records(path, buf, start, dialect, allowed, strict, header)
    rec.dialect = dialect
    return rec


def _ncols(path, buf, start, dialect, allowed) -> int:
    """Fields on the first data line (must be one of ``allowed``)."""
    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    s = np.zeros((1, 9), np.int64)
    status, n, _, k = K.split_fields(arr, start, start + 1, dialect.mode, dialect.byte, 8, s, s,
                                     np.zeros(1, np.int64))  # fmt: skip
    k = 8 if status == K.OK and n else k
    if k not in allowed:
        line = _line_text(buf, start)
        raise InputError(
            f"{path}:{line_at(buf, start)}: {k} field{'s' if k != 1 else ''} in a "
            f"{dialect.describe()} line, expected {_alts(allowed)}: {show(line)}"
            + _sep_hint(dialect, line)
        )
    return k


def _sep_hint(dialect: Dialect, line: bytes) -> str:
    if dialect.sep == "tab" and b"\t" not in line:
        return " (the file has tabs elsewhere: tab-separated; use --sep to choose)"
    if dialect.sep in ("tab", "whitespace") and b"," in line:
        return " (comma-separated? use --sep comma or --format csv)"
    if dialect.sep == "comma" and b"\t" in line:
        return " (tab-separated? use --sep tab)"
    return ""


def _split_records(path, buf, start, dialect, allowed, strict, header) -> Records:
    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    ncols = _ncols(path, buf, start, dialect, allowed)
    cap = K.count_lines(arr, start, arr.size) + 1
    starts = np.empty((cap, ncols), np.int64)
    ends = np.empty((cap, ncols), np.int64)
    lines = np.empty(cap, np.int64)
    status, n, pos, k = K.split_fields(arr, start, arr.size, dialect.mode, dialect.byte, ncols,
                                       starts, ends, lines)  # fmt: skip
    if status != K.OK:
        line = _line_text(buf, pos)
        raise InputError(
            f"{path}:{line_at(buf, pos)}: {k} field{'s' if k != 1 else ''}, expected {ncols} "
            f"like the first record ({dialect.describe()}): {show(line)}"
            + _sep_hint(dialect, line)
        )
    starts, ends, lines = starts[:n], ends[:n], lines[:n]
    first = [bytes(arr[s:e]).decode("utf-8", "replace") for s, e in zip(starts[0], ends[0])]

    def rest_numeric(j):
        s, e = starts[1:, j], ends[1:, j]
        if s.size == 0:
            return False
        if j < 2:
            return K.int_column(arr, s, e, False, np.empty(s.size, np.int64))[0] == K.INT_OK
        return K.float_column(arr, s, e, np.empty(s.size), np.empty(s.size, np.int64))[0] == K.OK

    head = None
    if decide_header(path, header, first, line_at(buf, int(lines[0])), rest_numeric):
        head = tuple(first)
        starts, ends, lines = starts[1:], ends[1:], lines[1:]
        if lines.size == 0:
            raise InputError(f"{path}: no edges found (only a header)")
    where = LineOf(arr, lines)
    empty = [np.flatnonzero(ends[:, j] == starts[:, j]) for j in (0, 1)]
    _refuse_empty_id(path, where, [int(e[0]) if e.size else None for e in empty],
                     lambda i: _line_text(buf, int(lines[i])))  # fmt: skip
    ids = [_id_column(arr, starts[:, j], ends[:, j], strict) for j in (0, 1)]
    if not dialect.certain and ncols > min(allowed) and any(c.dtype.kind != "i" for c in ids):
        raise InputError(
            f"{path}:{where(0)}: blank-separated fields and text ids: is "
            f"{show(_line_text(buf, int(lines[0])))} {ncols} fields, or fewer with a blank "
            "inside an id? Separate fields by tabs, or give --sep whitespace (blanks "
            "separate fields) or --sep tab"
        )
    weights = None
    if ncols >= 3:
        hint = "" if head or header is False else " (a header line? give --header)"
        weights = _float_column(path, arr, starts[:, 2], ends[:, 2], where, "weight", hint)
    return Records(ids, weights, where, head)


def _refuse_empty_id(path, where, first_empty, text) -> None:
    """One line for the earliest record with an empty id (``first_empty``: per id field,
    the first such record or None). An empty field is a missing id, not an id of no
    characters: taken as one, it made a node named "" and turned the column's integers
    into text labels."""
    found = [(i, j) for j, i in enumerate(first_empty) if i is not None]
    if not found:
        return
    i, j = min(found)
    raise InputError(
        f"{path}:{where(i)}: the {('first', 'second')[j]} field (an id) is empty: "
        f"{show(text(i))} (a missing id; every record needs both)"
    )


def _id_column(arr, starts, ends, strict):
    """int64 when every field is an exact integer, else the fields as bytes."""
    from . import _text_kernels as K

    out = np.empty(starts.size, np.int64)
    code, _ = K.int_column(arr, starts, ends, strict, out)
    if code == K.INT_OK:
        return out
    return _bytes_column(arr, starts, ends)


def _bytes_column(arr, starts, ends):
    """The fields as a fixed-width bytes array (an object array of bytes for long ids or ids
    holding NUL bytes, which a fixed width would lose)."""
    from . import _text_kernels as K

    width = max(int((ends - starts).max()) if starts.size else 1, 1)
    if width * starts.size > (1 << 30) or width > 4096 or K.has_byte(arr, starts, ends, 0) >= 0:
        return np.array([bytes(arr[s:e]) for s, e in zip(starts.tolist(), ends.tolist())],
                        dtype=object)  # fmt: skip
    mat = np.zeros((starts.size, width), np.uint8)
    K.gather_fixed(arr, starts, ends, width, mat)
    return mat.view(f"S{width}").ravel()


def _float_column(path, arr, starts, ends, where, what, hint=""):
    from . import _text_kernels as K

    out = np.empty(starts.size, np.float64)
    slow = np.empty(starts.size, np.int64)
    status, bad, nslow = K.float_column(arr, starts, ends, out, slow)
    if status != K.OK:
        raise InputError(
            f"{path}:{where(bad)}: {what} {show(bytes(arr[starts[bad]:ends[bad]]))} is not a "
            "number" + (hint if bad == 0 else "")
        )
    if nslow:
        sl = slow[:nslow]
        out[sl] = slow_floats(path, arr, starts[sl], ends[sl], lambda i: where(int(sl[i])), what)
    return out


def slow_floats(path, arr, starts, ends, where, what):
    """Numbers the fast path left to numpy's correctly rounded conversion."""
    fields = [bytes(arr[s:e]).strip() for s, e in zip(starts.tolist(), ends.tolist())]
    try:
        return np.array(fields, dtype=bytes).astype(np.float64)
    except ValueError:
        for i, f in enumerate(fields):
            try:
                float(f)
            except ValueError:
                raise InputError(f"{path}:{where(i)}: {what} {show(f)} is not a number") from None
        raise  # pragma: no cover


def _csv_records(path, buf, start, dialect, allowed, header) -> Records:
    """RFC 4180 records (quotes, separators and newlines inside quotes), by Python's csv."""
    import csv
    import io

    try:
        text = bytes(buf[start:]).decode("utf-8")
    except UnicodeDecodeError as exc:
        line = line_at(buf, start + exc.start)
        raise InputError(f"{path}:{line}: not UTF-8 text") from None
    first_line = line_at(buf, start)
    delim = "," if dialect.sep == "comma" else ";"
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim, strict=True)
    rows, lines = [], []
    line = first_line
    try:
        for row in reader:
            here, line = line, first_line + reader.line_num
            if not row or (len(row) == 1 and not row[0].strip(" \t\r")):
                continue
            want = len(rows[0]) if rows else None
            if (want is not None and len(row) != want) or len(row) not in allowed:
                like = f"{want} like the first record" if want else _alts(allowed)
                raise InputError(
                    f"{path}:{here}: {len(row)} fields, expected {like} (CSV, RFC 4180 quoting)"
                )
            rows.append(row)
            lines.append(here)
    except csv.Error as exc:
        raise InputError(f"{path}:{line}: bad CSV quoting ({exc})") from None
    if not rows:
        raise InputError(f"{path}: no edges found")

    def rest_numeric(j):
        rest = [r[j] for r in rows[1:]]
        if not rest:
            return False
        if j < 2:
            return all(is_int_text(f, False) for f in rest)
        return all(_is_number(f) for f in rest)

    head = None
    if decide_header(path, header, rows[0], lines[0], rest_numeric):
        head, rows, lines = tuple(rows[0]), rows[1:], lines[1:]
        if not rows:
            raise InputError(f"{path}: no edges found (only a header)")
    where = lines.__getitem__
    empty = [next((i for i, r in enumerate(rows) if r[j] == ""), None) for j in (0, 1)]
    _refuse_empty_id(path, where, empty, lambda i: delim.join(rows[i]).encode())
    ids = [_py_ids([r[j] for r in rows]) for j in (0, 1)]
    weights = None
    if len(rows[0]) >= 3:
        hint = "" if head or header is False else " (a header line? give --header)"
        weights = _py_floats(path, [r[2].encode() for r in rows], where, hint)
    return Records(ids, weights, where, head)


def _py_ids(fields: list):
    """A column of str fields: int64 when all are canonical integers in range, else UTF-8
    bytes (object array)."""
    from . import _text_kernels as K

    raw = [f.encode("utf-8") for f in fields]
    if all(is_int_text(f, False) for f in fields):
        arr = np.frombuffer(b"\n".join(raw) + b"\n", np.uint8)
        ends = np.flatnonzero(arr == 10).astype(np.int64)
        starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
        out = np.empty(len(raw), np.int64)
        code, _ = K.int_column(arr, starts, ends, True, out)
        if code == K.INT_OK:
            return out
    return np.array(raw, dtype=object)


def _py_floats(path, fields, where, hint=""):
    try:
        return np.array([f.strip() for f in fields], dtype=bytes).astype(np.float64)
    except ValueError:
        for i, f in enumerate(fields):
            try:
                float(f)
            except ValueError:
                raise InputError(
                    f"{path}:{where(i)}: weight {show(f)} is not a number"
                    + (hint if i == 0 else "")
                ) from None
        raise  # pragma: no cover


def is_int_text(field: str, strict: bool = True) -> bool:
    """Whether ``field`` is an integer id as the compiled parser reads one
    (``_text_kernels.int_field``): ``-?[0-9]+`` in ASCII, and canonical when ``strict``
    (no leading zero, no ``-0``). Past int64 it is still an integer here (the parser then
    says it is too large). ``int()`` alone is not this test: it takes ``+5``, `` 5``, ``1_0``
    and raises on ``--5``."""
    if _INT_TEXT.fullmatch(field) is None:
        return False
    digits = field[1:] if field[0] == "-" else field
    return not strict or digits[0] != "0" or field == "0"


_INT_TEXT = re.compile(r"-?[0-9]+")


def _is_number(field) -> bool:
    try:
        float(field)
    except (ValueError, TypeError):
        return False
    return True


def decide_header(path, header, first: list, line: int, rest_numeric) -> bool:
    """Whether the first record (its fields ``first``, as text) is a header.

    ``header`` True/False is the user's word. Detected (None) only with numeric evidence:
    a weight column whose first field is not a number while ``rest_numeric(2)`` says every
    other record's is; or, without weights, id fields that are all not numbers while every
    other record's ids are integers (``rest_numeric(0)`` and ``(1)``). Text ids with a first
    record of column names (``source,target``) are refused with the flags to give.
    """
    if header is not None:
        return bool(header)
    if len(first) >= 3:
        if not _is_number(first[2]) and rest_numeric(2):
            return True
        if not _is_number(first[2]):
            return False  # the weight check names the line, with the hint
    elif not any(map(_is_number, first[:2])) and rest_numeric(0) and rest_numeric(1):
        return True
    if all(f.strip().lower() in _HEADER_WORDS for f in first[:2]):
        raise InputError(
            f"{path}:{line}: the first record {', '.join(map(show, first))} looks like a "
            "header: give --header to skip it, or --no-header to keep it as an edge"
        )
    return False


def _alts(allowed) -> str:
    return " or ".join(str(a) for a in sorted(allowed))
