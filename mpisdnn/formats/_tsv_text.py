"""The grammar of the challenge's text files: ``row<TAB>col<TAB>value`` lines, 1-based.

What every TSV reader of :mod:`mpisdnn.formats.tsv` (and the parallel and archive readers)
shares: refusing what is not a regular file, reading a byte range at line starts, the
one-pass parse (``pyarrow.csv``, typed columns; ``np.fromstring`` for files that use spaces)
with vectorised checks, and the line-by-line pass that runs only when the fast pass finds
something wrong, to name the exact ``file:line``. Split from :mod:`mpisdnn.formats.tsv`,
which keeps the files themselves (layers and network directories, images, categories,
writers) and re-exports the public names defined here.
"""

from __future__ import annotations

import os
import stat
import warnings

import numpy as np
import scipy.sparse as sp

from ..errors import InputError

#: The UTF-8 byte-order mark some editors and spreadsheets write at the start of a text
#: file: text encoding, not data (the readers of edge lists and truth files skip it).
UTF8_BOM = b"\xef\xbb\xbf"

__all__ = [
    "MAX_ROWS",
    "read_triples",
    "read_triples_range",
    "regular_file_size",
    "cut_short_warning",
    "unterminated_line",
    "line_range",
    "written",
    "check_last_line",
    "duplicate_message",
]


def regular_file_size(path, what="a TSV file") -> int:
    """Size in bytes of ``path``, which must be a regular file.

    A FIFO, socket or device is refused before anything opens it: opening a FIFO blocks
    until a writer appears, so a reader would hang instead of failing.

    Raises
    ------
    InputError
        One line naming ``path``: not found, a directory or not a regular file (expected
        ``what``), not readable (permission denied).
    """
    from ._validate import stat_or_error

    st = stat_or_error(path, f"{path}: file not found", f"{path}: cannot read: ")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, expected {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file (a FIFO or device?), expected {what}")
    try:  # a regular file: opening it cannot block
        os.close(os.open(path, os.O_RDONLY))
    except PermissionError:
        # said as such: an unreadable file was reported as "not an HDF5 network file"
        raise InputError(f"{path}: permission denied (cannot read {what})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return st.st_size


def _read_bytes(path, start=0, stop=None, what="a TSV file") -> bytes:
    """Bytes ``[start, stop)`` of a file (all from ``start`` when ``stop`` is None).

    Raises
    ------
    InputError
        One line naming ``path``: not found, a directory or not a regular file (expected
        ``what``), unreadable.
    """
    regular_file_size(path, what)
    from . import gz

    if gz.is_gzip(path):
        if start or stop is not None:
            raise InputError(f"{path}: a gzip file cannot be read by byte ranges")
        return gz.read_all(path)
    try:
        with open(path, "rb") as fh:
            if start:
                fh.seek(start)
            return fh.read() if stop is None else fh.read(max(0, stop - start))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def cut_short_warning(path, line: int) -> str:
    """The one warning line for a file whose last line (``line``) has no newline.

    Such a line is parsed (a file may simply end that way) but a download or copy that was
    cut mid-line looks the same, e.g. ``...\t6.`` for ``...\t6.25``: the warning says so.
    """
    return f"mpisdnn: warning: {path}:{line}: last line has no newline: file cut short?"


def unterminated_line(path) -> int:
    """Line number of a last line without a newline, or 0 (ends with one, or empty).

    Reads the whole file: for small files (a truth file); the parallel inputs reader counts
    the lines as it parses.
    """
    text = _read_bytes(path)
    if not text or text.endswith(b"\n"):
        return 0
    return text.count(b"\n") + 1


def _arrow_parse(text: bytes):
    """``(rows, cols, vals)`` of a clean tab-separated triples buffer, else ``None``."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:  # pragma: no cover - pyarrow is a dependency; numpy is the fallback
        return None
    names = ["r", "c", "v"]
    types = {"r": pa.int64(), "c": pa.int64(), "v": pa.float64()}
    try:
        table = pacsv.read_csv(
            pa.py_buffer(text),
            read_options=pacsv.ReadOptions(
                column_names=names, use_threads=False, block_size=1 << 24
            ),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pacsv.ConvertOptions(
                column_types=types, strings_can_be_null=False, quoted_strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
        return None
    if any(col.null_count for col in table.columns):
        return None  # empty fields: let the slow pass name the line
    return tuple(table.column(k).to_numpy() for k in range(3))


def _floats(text: bytes):
    """Every whitespace-separated number of ``text`` as float64 in one C-level pass, or None
    when a field is not a number (numpy would only warn and stop there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None


def _fast_parse(text: bytes, ncols: int):
    if not text.strip():
        return np.empty((0, ncols))
    flat = _floats(text)
    if flat is None:
        return None
    if flat.size % ncols or not _fields_per_line_ok(text, ncols):
        return None  # blank or ragged lines: let the slow pass name the line
    return flat.reshape(-1, ncols)


def _fields_per_line_ok(text: bytes, ncols: int) -> bool:
    """Whether every line holds exactly ``ncols`` whitespace-separated fields (vectorised)."""
    b = np.frombuffer(text, dtype=np.uint8)
    newline = b == 10
    space = newline | (b == 9) | (b == 32) | (b == 13)
    starts = ~space
    starts[1:] &= space[:-1]
    line_ids = np.searchsorted(np.flatnonzero(newline), np.flatnonzero(starts))
    counts = np.bincount(line_ids)
    return bool(counts.size) and bool((counts == ncols).all())


def _slow_parse(path, text: bytes, ncols: int) -> np.ndarray:
    rows = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != ncols:
            raise InputError(
                f"{path}:{lineno}: expected {ncols} tab-separated columns, found {len(fields)}: "
                f"{_show(raw)}"
            )
        try:
            rows.append([float(f) for f in fields])
        except ValueError:
            raise InputError(f"{path}:{lineno}: non-numeric field: {_show(raw)}") from None
    return np.array(rows, dtype=np.float64).reshape(-1, ncols)


def _show(raw: bytes) -> str:
    # only ASCII blanks stripped: str.strip() also took a no-break space, so a line with one
    # was shown as a plain "150\t45\t1" beside "non-numeric field"
    text = raw.decode("utf-8", "replace").strip(" \t\r\n")
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _line_of(text: bytes, index: int) -> int:
    """1-based line number of the ``index``-th non-blank line."""
    count = -1
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            count += 1
            if count == index:
                return lineno
    return index + 1


#: The most rows an inputs file may have: the per-row counts are MPI counts and the rows
#: int32 (the parallel reader, its compiled parser and the serial reader).
MAX_ROWS = 2**31 - 1


def read_triples(path, nrows=None, ncols=None, max_rows=None):
    """Read a 1-based ``row col value`` TSV file and validate it.

    Parameters
    ----------
    path : path-like
        The TSV file.
    nrows, ncols : int, optional
        Upper bounds for the row and column indices (e.g. N); checked when given.
    max_rows : int, optional
        The largest row count where ``nrows`` is not given (an inputs file: ``MAX_ROWS``).

    Returns
    -------
    rows, cols : ndarray of int64
        Zero-based indices.
    vals : ndarray of float32

    Raises
    ------
    InputError
        Naming the file and line: wrong column count, non-numeric field, index that is not a
        positive integer or exceeds the bound, NaN or infinite value, a row past
        ``max_rows``.
    """
    text = _read_bytes(path)
    out = _triples(path, text, nrows, ncols, 0, max_rows=max_rows)
    if text and not text.endswith(b"\n"):
        check_last_line(path, text[-64:])
    return out


def line_range(path, start: int, stop: int) -> tuple[int, int]:
    """Byte range ``[begin, end)`` of the whole lines that *start* in ``[start, stop)``.

    Ranks that split a file at arbitrary byte offsets get disjoint sets of whole lines that
    together cover the file.
    """
    size = os.path.getsize(path)
    stop = min(stop, size)

    def first_line_at(pos):
        if pos <= 0:
            return 0
        if pos >= size:
            return size
        with open(path, "rb") as fh:
            fh.seek(pos - 1)
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    return size
                at = chunk.find(b"\n")
                if at >= 0:
                    return pos + at
                pos += len(chunk)

    begin = first_line_at(start)
    end = first_line_at(stop) if stop < size else size
    return begin, max(begin, end)


def read_triples_range(path, start: int, stop: int, nrows=None, ncols=None):
    """Like :func:`read_triples`, for the lines that start in bytes ``[start, stop)``.

    Errors name the line number within the whole file.
    """
    begin, end = line_range(path, start, stop)
    text = _read_bytes(path, begin, end)
    return _triples(path, text, nrows, ncols, begin)


def _lines_before(path, offset: int) -> int:
    """Newlines in the first ``offset`` bytes of ``path`` (only used to name a bad line)."""
    count = 0
    with open(path, "rb") as fh:
        while offset > 0:
            chunk = fh.read(min(offset, 1 << 22))
            if not chunk:
                break
            count += chunk.count(b"\n")
            offset -= len(chunk)
    return count


class _Lines:
    """Maps an entry index of a buffer to the line number within the file (lazily)."""

    def __init__(self, path, text, byte_offset, line_base=None):
        self.path, self.text, self.byte_offset = path, text, byte_offset
        self.line_base = line_base

    def base(self) -> int:
        """Lines of the file before ``text``."""
        if self.line_base is not None:
            return self.line_base
        return _lines_before(self.path, self.byte_offset) if self.byte_offset else 0

    def __call__(self, index: int) -> int:
        return self.base() + _line_of(self.text, index)

    def field(self, index: int, k: int, value) -> str:
        """Field ``k`` of entry ``index`` as written (``value`` formatted if not found)."""
        return written(self.text, index, k, value)


def written(text: bytes, index: int, k: int, value) -> str:
    """Field ``k`` of the ``index``-th non-blank line of ``text``, as written in the file.

    Messages quote ids and values this way: the parsed number of a huge id is rounded
    (float64) or clipped (int64), so it would name a number that is not in the file.
    """
    count = -1
    for raw in text.splitlines():
        if raw.strip():
            count += 1
            if count == index:
                fields = raw.replace(b",", b" ").split()
                if k < len(fields):
                    return fields[k].decode("utf-8", "replace")[:40]
                break
    return _fmt(value)


def _triples(path, text, nrows, ncols, byte_offset, line_base=None, max_rows=None):  # noqa: PLR0913
    """Entries of ``text`` (whole lines at ``byte_offset`` of ``path``), every check done;
    ``line_base``: the lines before ``text`` when known (an inflated stream has no
    offsets to count them from); ``max_rows``: the most rows a file may have when no
    ``nrows`` bounds them (an inputs file: :data:`MAX_ROWS`)."""
    lines = _Lines(path, text, byte_offset, line_base)
    parsed = _arrow_parse(text) if text.strip() else None
    if parsed is not None:
        r, c, vals = parsed
        idx = None
    else:
        table = _fast_parse(text, 3)
        if table is None:
            try:
                table = _slow_parse(path, text, 3)
            except InputError as exc:
                if not byte_offset and not line_base:
                    raise
                raise _shift_line(exc, path, lines.base()) from None
        idx = table[:, :2]
        r, c, vals = idx[:, 0], idx[:, 1], table[:, 2]
    if idx is None:
        bad = (r < 1) | (c < 1)
    else:
        # an id past float64's range (a 40 MiB run of digits) parses as +inf: refused as
        # too large (issue 42 item 12), not as "not positive"
        huge = (idx == np.inf).any(axis=1)
        if huge.any():
            i = int(np.flatnonzero(huge)[0])
            k = 0 if idx[i, 0] == np.inf else 1
            raise InputError(
                f"{path}:{lines(i)}: {('row', 'column')[k]} index "
                f"{_clip(lines.field(i, k, idx[i, k]))} is too large"
            )
        bad = ~np.isfinite(idx).all(axis=1) | (idx != np.floor(idx)).any(axis=1)
        bad |= (idx < 1).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{path}:{lines(i)}: row and column must be positive 1-based integers, "
            f"got {lines.field(i, 0, r[i])} {lines.field(i, 1, c[i])}"
        )
    for k, (col, bound, name) in enumerate(((r, nrows, "row"), (c, ncols, "column"))):
        if bound is not None and col.size:
            over = np.flatnonzero(col > bound)
            if over.size:
                i = int(over[0])
                raise InputError(
                    f"{path}:{lines(i)}: {name} index {lines.field(i, k, col[i])} exceeds "
                    f"the size {bound}"
                )
    nonfinite = np.flatnonzero(~np.isfinite(vals))
    if nonfinite.size:
        i = int(nonfinite[0])
        raise InputError(
            f"{path}:{lines(i)}: value is {lines.field(i, 2, vals[i])} (must be finite)"
        )
    with np.errstate(over="ignore"):
        vals32 = vals.astype(np.float32)
    over = np.flatnonzero(np.isinf(vals32))
    if over.size:  # 1e39 is finite as float64 but inf as the float32 the weights are
        i = int(over[0])
        raise InputError(
            f"{path}:{lines(i)}: value {lines.field(i, 2, vals[i])} overflows float32 "
            f"(largest {float(np.finfo(np.float32).max):.6g}; must be finite)"
        )
    if idx is not None:  # past int64 the cast would warn and wrap: far past every bound
        r, c = np.minimum(r, 2.0**62), np.minimum(c, 2.0**62)
    r, c = r.astype(np.int64) - 1, c.astype(np.int64) - 1
    if max_rows is not None and r.size and r.max() >= max_rows:
        i = int(np.argmax(r))
        raise InputError(
            f"{path}:{lines(i)}: row index {lines.field(i, 0, r[i] + 1)} is beyond the "
            f"largest supported row count {max_rows}"
        )
    return r, c, vals32


def _clip(text: str) -> str:
    return text if len(text) <= 30 else f"{text[:24]}..."


def check_last_line(path, tail: bytes) -> None:
    """Refuse a file whose last line (no newline after it) is visibly cut: its last field
    ends in ``.``, ``e``, ``+`` or ``-`` (``0.`` for ``0.0625``), which no writer leaves.

    A complete last line without a newline is read (with the :func:`cut_short_warning`
    line where the readers print it); a cut that leaves fewer fields is refused by the
    field count.
    """
    line = tail.rsplit(b"\n", 1)[-1].strip()
    if line and line[-1:] in (b".", b"e", b"E", b"+", b"-"):
        raise InputError(
            f"{path}: last line {_show(line)} is cut in the middle of a number (no newline "
            f"after it: the file is truncated)"
        )


def _shift_line(exc, path, base):
    prefix = f"{path}:"
    msg = str(exc)
    if msg.startswith(prefix):
        rest = msg[len(prefix) :]
        num, _, tail = rest.partition(":")
        if num.isdigit():
            return InputError(f"{prefix}{int(num) + base}:{tail}")
    return exc


def _fmt(x: float) -> str:
    return str(int(x)) if np.isfinite(x) and x == int(x) else repr(float(x))


def _to_csr(rows, cols, vals, shape, path) -> sp.csr_matrix:
    mat = sp.coo_matrix((vals, (rows, cols)), shape=shape).tocsr()
    if mat.nnz != vals.size:
        # the first repeated entry in row-major order, as the parallel reader names it
        order = np.lexsort((np.arange(rows.size), cols, rows))  # (row, column), file order
        r, c = rows[order], cols[order]
        again = np.flatnonzero((r[1:] == r[:-1]) & (c[1:] == c[:-1])) + 1
        raise InputError(duplicate_message(path, rows, cols, int(order[again[0]])))
    mat.sort_indices()
    return mat


def duplicate_message(path, rows, cols, i, text=None) -> str:
    """``file:line: duplicate entry for row R, column C`` (1-based) for entry ``i``, the
    second copy: the line from ``text`` (bytes or a uint8 array), else from the file read
    again; without it where the file cannot be read (an archive member)."""
    where = str(path)
    try:
        raw = _read_bytes(path) if text is None else bytes(text)
        where = f"{path}:{_line_of(raw, i)}"
    except (OSError, InputError):
        pass
    return f"{where}: duplicate entry for row {int(rows[i]) + 1}, column {int(cols[i]) + 1}"
