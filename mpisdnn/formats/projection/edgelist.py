"""Edge lists and ratings files: text (:mod:`.text`'s grammar) -> ids -> a :class:`Graph`.

Two ways through, the same result: numeric files (integer ids, the common big case) are
parsed by one compiled pass over a byte range (:func:`parse_numeric_range`, which the
collective loader runs on every rank's share of the file); anything else (text ids, RFC 4180
quotes, a header to detect) goes through :func:`.text.read_records`. Ids become indices
(:func:`map_ids`) exactly: int64 integers or text, never a float.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...errors import InputError, UsageError
from . import text as T

__all__ = [
    "ID_MODES",
    "TextPlan",
    "NumericPart",
    "plan_text",
    "parse_numeric_range",
    "NumericChunks",
    "numeric_chunks",
    "parse_numeric_into",
    "map_ids",
    "graph_from_columns",
    "read_edge_list",
    "file_buffer",
]

#: ``ids`` choices of :func:`read_edge_list`.
ID_MODES = ("auto", "index", "label")
#: ``auto``: integer ids are used as indices while the index range is at most this many
#: times the number of distinct ids (MovieLens-100k's 1..1682 is; ids up to 1,682,007 for
#: 1,682 items are not, and become labels) ...
_DENSE_IDS = 2
#: ... or leaves at most this many indices unused (small files keep index semantics).
_EMPTY_IDS = 1 << 16


def file_buffer(path, what="a graph file"):
    """The whole file as a read-only buffer (memory-mapped: ranks on a node share the pages)."""
    import mmap

    from ..tsv import regular_file_size

    size = regular_file_size(path, what)
    if size == 0:
        return b""
    try:
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class TextPlan:
    """Where the data of an edge list starts and how its lines split (same on every rank)."""

    start: int
    dialect: T.Dialect
    ncols: int
    header: tuple | None
    numeric: bool  # worth the compiled numeric pass (no quotes; ids may be integers)


def _first_fields(buf, start, dialect, ncols) -> list:
    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    s = np.zeros((1, ncols), np.int64)
    e = np.zeros((1, ncols), np.int64)
    K.split_fields(arr, start, start + 1, dialect.mode, dialect.byte, ncols, s, e,
                   np.zeros(1, np.int64))  # fmt: skip
    return [bytes(arr[a:b]).decode("utf-8", "replace") for a, b in zip(s[0], e[0])]


def _numeric_record(fields, strict) -> bool:
    ids = all(T.is_int_text(f, strict) for f in fields[:2])
    return ids and (len(fields) < 3 or T._is_number(fields[2]))


def plan_text(path, buf, fmt, allowed, sep="auto", header=None, skip_lines=0, strict=True):
    """The :class:`TextPlan` of an edge list (reads only the first data line).

    A first record that is not numeric where the rest may be is taken as a header here only
    tentatively: the numeric pass must then succeed on every other line, or the file goes
    through :func:`.text.read_records`, which decides with the whole file. Where the first
    data record already has an id that is not an integer, the numeric pass would stop there
    (``TEXT``), so the plan says not to try it (``numeric`` False): a file of text ids then
    costs no compile of the numeric parser on a first run (13-17 s on the 2-core VM).
    """
    start = T.data_start(buf, skip_lines)
    if start >= len(buf):
        raise InputError(f"{path}: no edges found")
    dialect = T.detect_dialect(path, buf, start, fmt, sep)
    ncols = T._ncols(path, buf, start, dialect, allowed)
    if dialect.quoted:
        return TextPlan(start, dialect, ncols, None, False)
    first = _first_fields(buf, start, dialect, ncols)
    head = None
    if header or (header is None and not _numeric_record(first, strict)):
        line = T.line_at(buf, start)
        if header or T.decide_header(path, None, first, line, lambda j: True):
            head = tuple(first)
            nl = buf.find(b"\n", start)
            start = len(buf) if nl < 0 else nl + 1
            start = T._first_data_line(buf, start)[0] if start < len(buf) else start
            first = _first_fields(buf, start, dialect, ncols) if start < len(buf) else []
    return TextPlan(start, dialect, ncols, head, not _text_ids(first, strict))


def _text_ids(fields, strict) -> bool:
    """Whether a record's id fields hold one the numeric pass cannot read (a field that is
    there and not an integer), so that the pass would stop at this record with ``TEXT``.
    An empty field (a short line, two separators in a row) is left to the numeric pass, as
    before."""
    return any(f and not T.is_int_text(f, strict) for f in fields[:2])


@dataclass
class NumericPart:
    """One byte range's records of a numeric edge list (``status`` TEXT: not numeric)."""

    status: int
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray | None
    lo: int  # the range start the records are counted from (for line numbers)
    line: int = 0  # with TEXT: the line, its text and the field that is not an integer
    text: bytes = b""
    field: int = 0


def parse_numeric_range(path, buf, lo, hi, plan: TextPlan, strict=True) -> NumericPart:
    """The records of the lines starting in ``[max(lo, plan.start), hi)``, with integer ids,
    parsed by numba's threads in chunks (each chunk writes at its own offset, so the records
    stay in file order).

    Raises :class:`InputError` naming the line for a wrong field count or a weight that is
    not a number; a field that is not an integer id gives ``status == TEXT`` (the caller
    reads the file as text ids).
    """
    from .adjacency import small_empty

    chunks = numeric_chunks(buf, lo, hi, plan)
    cap = chunks.capacity + 1
    rows = small_empty(cap, np.int64)
    cols = small_empty(cap, np.int64)
    vals = small_empty(cap if plan.ncols >= 3 else 0, np.float64)
    return parse_numeric_into(path, buf, chunks, plan, strict, rows, cols, vals)


@dataclass(frozen=True)
class NumericChunks:
    """A byte range cut into the chunks numba's threads parse, and the lines starting in
    each (the most records it can hold): :func:`numeric_chunks`."""

    lo: int
    hi: int
    bounds: np.ndarray
    caps: np.ndarray

    @property
    def capacity(self) -> int:
        """The most records the range can hold (its lines)."""
        return int(self.caps.sum())


def numeric_chunks(buf, lo, hi, plan: TextPlan) -> NumericChunks:
    """The chunks of ``[max(lo, plan.start), hi)`` and their line counts (one pass over the
    bytes), for :func:`parse_numeric_into`'s arrays."""
    import numba

    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    lo = max(lo, plan.start)
    hi = min(hi, arr.size)
    threads = numba.get_num_threads()
    nch = max(1, min(threads * 4, (hi - lo) >> 20)) if hi > lo else 1
    bounds = np.linspace(lo, max(hi, lo), nch + 1).astype(np.int64)
    caps = np.zeros(nch, np.int64)
    if hi > lo:
        (K.chunk_lines if threads > 1 else K.chunk_lines_1)(arr, bounds, caps)
    return NumericChunks(lo, hi, bounds, caps)


def parse_numeric_into(path, buf, chunks: NumericChunks, plan: TextPlan, strict, rows, cols,  # noqa: PLR0913
                       vals, shift=0, limit=0) -> NumericPart:  # fmt: skip
    """:func:`parse_numeric_range` into the caller's arrays (at least
    ``chunks.capacity`` long; ``vals`` empty for two columns), whose views it returns.

    With ``limit > 0`` the ids are stored less ``shift`` and must fall in ``0..limit - 1``
    (else ``status == WIDE``): ``rows`` and ``cols`` may then be int32, and ``cols`` and
    ``vals`` memory the caller shares (the collective loader's file-order arrays).
    """
    import numba

    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    lo, hi, bounds, caps = chunks.lo, chunks.hi, chunks.bounds, chunks.caps
    nch = caps.size
    out = np.zeros((nch, 6), np.int64)
    out[1:, 5] = np.cumsum(caps)[:-1]
    weighted = plan.ncols >= 3
    cap = chunks.capacity + 1
    slow = np.empty((nch * min(cap // nch + 1, 1 << 16), 3), np.int64)
    if hi > lo:
        parse = K.numeric_chunks if numba.get_num_threads() > 1 else K.numeric_chunks_1
        parse(arr, bounds, plan.dialect.mode, plan.dialect.byte, plan.ncols, strict, rows,
              cols, vals, slow, out, shift, limit)  # fmt: skip
    bad = np.flatnonzero(out[:, 0] != K.OK)
    if bad.size:
        status, _, pos, _, field = (int(x) for x in out[bad[0], :5])
        return _not_ok(path, buf, lo, plan, status, pos, field)
    total = 0
    for o, n in zip(out[:, 5].tolist(), out[:, 1].tolist()):  # chunks down to close the gaps
        if o != total:
            for a in (rows, cols, vals) if weighted else (rows, cols):
                a[total : total + n] = a[o : o + n]
        total += n
    rows, cols = rows[:total], cols[:total]
    vals = vals[:total] if weighted else vals
    if out[:, 3].any():
        per = slow.shape[0] // nch
        starts = np.concatenate(([0], np.cumsum(out[:, 1])[:-1]))
        pieces = [slow[i * per : i * per + out[i, 3]] + [starts[i], 0, 0] for i in range(nch)]
        sl = np.concatenate(pieces)
        idx, s, e = sl[:, 0], sl[:, 1], sl[:, 2]
        vals[idx] = T.slow_floats(path, arr, s, e, lambda i: T.line_at(buf, int(s[i])), "weight")
    return NumericPart(K.OK, rows, cols, vals if weighted else None, lo)


def _not_ok(path, buf, lo, plan, status, pos, field) -> NumericPart:
    from . import _text_kernels as K

    if status == K.VALUE and field == -1:  # too many slow values: the text path converts them
        return NumericPart(K.TEXT, np.empty(0, np.int64), np.empty(0, np.int64), None, lo)
    line = T._line_text(buf, pos)
    if status == K.COUNT:
        raise InputError(
            f"{path}:{T.line_at(buf, pos)}: {field} field{'s' if field != 1 else ''}, expected "
            f"{plan.ncols} like the first record ({plan.dialect.describe()}): {T.show(line)}"
            + T._sep_hint(plan.dialect, line)
        )
    if status == K.VALUE:
        hint = " (a header line? give --header)" if pos == plan.start and not plan.header else ""
        raise InputError(
            f"{path}:{T.line_at(buf, pos)}: weight is not a number: {T.show(line)}{hint}"
        )
    return NumericPart(status, np.empty(0, np.int64), np.empty(0, np.int64), None, lo,
                       T.line_at(buf, pos), line, field)  # fmt: skip


def record_line(buf, lo, i) -> int:
    """1-based line of record ``i`` counted from ``lo`` (for messages only)."""
    from . import _text_kernels as K

    arr = np.frombuffer(buf, np.uint8)
    return T.line_at(buf, int(K.record_offset(arr, lo, int(i))))


def _fmt_id(x) -> str:
    if isinstance(x, (bytes, np.bytes_)):
        return T.show(bytes(x))
    return str(int(x)) if isinstance(x, (int, np.integer)) else str(x)


def map_ids(path, col, where, base: int, ids: str, name: str):
    """``(indices, labels or None)`` of one id column.

    ``col`` is int64 (every field an exact integer) or bytes (text). ``index``: integers
    ``base..`` used as indices. ``label``: every distinct id a node, in sorted order
    (numerically for int64 ids, by UTF-8 bytes for text). ``auto``: labels for text and for
    sparse integer ids (more than half and more than 65,536 indices unused), else indices.
    """
    if col.dtype.kind != "i":
        if ids == "index":
            i, why = _first_not_index(col)
            raise InputError(
                f"{path}:{where(i)}: {name} id {_fmt_id(col[i])} {why} (--ids index needs "
                "integers; --ids label takes any id)"
            )
        return _text_labels(path, col, where)
    if ids == "label":
        return _int_labels(col)
    if col.size == 0:
        col -= base
        return col, None
    lo, hi = int(col.min()), int(col.max())
    if lo < base:
        i = int(np.flatnonzero(col < base)[0])
        hint = "" if ids == "index" else " (--ids label takes any id)"
        raise InputError(
            f"{path}:{where(i)}: {name} index must be an integer >= {base}, got {col[i]}{hint}"
        )
    if ids == "auto":
        span = hi - lo + 1
        limit = max(col.size * _DENSE_IDS, _EMPTY_IDS) + col.size
        if span > limit:
            return _int_labels(col)
        from . import _text_kernels as K

        distinct = int(K.distinct_in_range(col, lo, span))
        empty = hi - base + 1 - distinct
        if empty > max(distinct * (_DENSE_IDS - 1), _EMPTY_IDS):
            return _int_labels(col)
    if hi - base >= 2**62:
        i = int(np.argmax(col))
        raise InputError(f"{path}:{where(i)}: {name} id {col[i]} is too large for an index")
    if base:
        col -= base
    return col, None


def _first_not_index(col):
    for i, x in enumerate(col.tolist()):
        s = x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
        if not T.is_int_text(s, strict=False):
            return i, "is not an integer"
        if not -(2**63) <= int(s) < 2**63:
            return i, "is out of the int64 range"
    return 0, "is not an integer"  # pragma: no cover


def _int_labels(col):
    labels, inverse = np.unique(col, return_inverse=True)
    return inverse.astype(np.int64).ravel(), labels.astype(np.int64)


def _text_labels(path, col, where):
    """Each record's index among the sorted distinct ids, and the ids as UTF-8 text."""
    labels, inverse = np.unique(col, return_inverse=True)
    out = []
    for x in labels.tolist():
        try:
            text = x.decode("utf-8")
        except UnicodeDecodeError:
            fault = "is not UTF-8 text"
        else:  # numpy's str arrays drop trailing NULs: 'a\0' came out as 'a'
            fault = "holds a NUL byte (a binary or UTF-16 file?)" if "\0" in text else None
        if fault:
            i = next(i for i, y in enumerate(col.tolist()) if y == x)
            raise InputError(f"{path}:{where(i)}: id {T.show(x)} {fault}")
        out.append(text)
    wide = max((len(x) for x in out), default=1) > 256
    arr = np.array(out, dtype=object) if wide else np.array(out, dtype=str)
    return inverse.astype(np.int64).ravel(), arr


def graph_from_columns(path, src, dst, w, where, *, base, ids, duplicates,  # noqa: PLR0913
                       shape=None, names=("source", "target"), header=None):  # fmt: skip
    """A canonical :class:`Graph` of id columns and weights (see :func:`map_ids`)."""
    from .adjacency import Graph, build_csr

    rows, row_labels = map_ids(path, src, where, base, ids, names[0])
    cols, col_labels = map_ids(path, dst, where, base, ids, names[1])
    if w is not None:
        bad = np.flatnonzero(~np.isfinite(w))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}:{where(i)}: weight is {w[i]} (must be finite)")
    if shape is not None and (row_labels is not None or col_labels is not None):
        raise UsageError("a shape applies to numeric index ids only")
    if shape is not None and rows.size and (rows.max() >= shape[0] or cols.max() >= shape[1]):
        i = int(np.flatnonzero((rows >= shape[0]) | (cols >= shape[1]))[0])
        raise InputError(f"{path}:{where(i)}: edge ({rows[i]}, {cols[i]}) outside {shape}")
    if shape is None:
        shape = (int(rows.max()) + 1 if rows.size else 0, int(cols.max()) + 1 if cols.size else 0)
    if row_labels is not None:
        shape = (row_labels.size, shape[1])
    if col_labels is not None:
        shape = (shape[0], col_labels.size)
    mat = build_csr(path, rows, cols, w, shape, duplicates, where)
    index_base = base if row_labels is None or col_labels is None else 0
    return Graph(mat, w is not None, os.fspath(path), row_labels, col_labels,
                 index_base=index_base, header=header, validate=False)  # fmt: skip


# one keyword per documented reader option (read_graph's)
def read_edge_list(path, fmt="tsv", index_base=None, skip_lines=0,  # noqa: PLR0913
                   duplicates="sum", shape=None, ids="auto", sep="auto",
                   header=None):  # fmt: skip
    """Read a TSV/CSV edge list (``u v [weight]``) or a ratings file (``user item rating [t]``).

    Parameters
    ----------
    path : path-like
    fmt : {"tsv", "csv", "ratings"}
        Edge lists have 2 or 3 fields (the third is the weight); ratings have 3 or 4 (the
        rating is the weight, a timestamp is ignored). How fields split: :mod:`.text`.
    index_base : {0, 1}, optional
        First id of integer ids used as indices; default 0 for edge lists, 1 for ratings
        (MovieLens ids start at 1).
    skip_lines : int
        Lines to skip before anything else.
    duplicates : {"sum", "error"}
    shape : (int, int), optional
        Default: largest index + 1 on each side (index ids only).
    ids : {"auto", "index", "label"}
        See :func:`map_ids`. Ids are exact: integers in int64 or text, never floats.
    sep : {"auto", "tab", "comma", "semicolon", "whitespace", "::"}
    header : bool, optional
        The first record is a header (True), data (False), or detected (None).
    """
    if fmt not in ("tsv", "csv", "ratings"):
        raise UsageError(f"not an edge-list format: {fmt!r}")
    if ids not in ID_MODES:
        raise UsageError(f"ids must be one of {', '.join(ID_MODES)}, got {ids}")
    ratings = fmt == "ratings"
    base = (1 if ratings else 0) if index_base is None else int(index_base)
    allowed = (3, 4) if ratings else (2, 3)
    strict = ids != "index"
    names = ("user", "item") if ratings else ("source", "target")
    buf = file_buffer(path)
    plan = plan_text(path, buf, fmt, allowed, sep, header, skip_lines, strict)
    if plan.numeric:
        from . import _text_kernels as K

        part = parse_numeric_range(path, buf, 0, len(buf), plan, strict)
        if part.status == K.OK and (part.rows.size or not plan.header):
            if part.rows.size == 0:
                raise InputError(f"{path}: no edges found")

            def where(i):
                return record_line(buf, part.lo, i)

            return graph_from_columns(
                path, part.rows, part.cols, part.vals, where, base=base, ids=ids,
                duplicates=duplicates, shape=shape, names=names, header=plan.header,
            )  # fmt: skip
    rec = T.read_records(path, buf, fmt, allowed, sep, header, skip_lines, strict)
    return graph_from_columns(
        path, rec.ids[0], rec.ids[1], rec.weights, rec.line, base=base, ids=ids,
        duplicates=duplicates, shape=shape, names=names, header=rec.header,
    )  # fmt: skip
