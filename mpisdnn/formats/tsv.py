"""The official Graph Challenge TSV files: ``row<TAB>col<TAB>value``, 1-based.

Parsing is one C-level pass (``pyarrow.csv``, typed columns; ``np.fromstring`` for files that
use spaces) plus vectorised checks; a line-by-line pass runs only when the fast pass finds
something wrong, to name the exact ``file:line``. Readers also take a byte range of a file, so
ranks can split one large file between them.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError
from ._atomic import atomic_path
from ._validate import check_memory

__all__ = [
    "read_triples",
    "read_triples_range",
    "read_weight_compact",
    "is_layer_file",
    "scan_network_dir",
    "read_weight_tsv",
    "read_network_tsv",
    "read_images_tsv",
    "read_categories",
    "regular_file_size",
    "cut_short_warning",
    "unterminated_line",
    "write_triples",
    "write_categories",
    "layer_file",
    "DEFAULT_BIAS",
]

#: Bias of the official networks per neuron count.
DEFAULT_BIAS = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}


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
    text = raw.decode("utf-8", "replace").strip()
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


def read_triples(path, nrows=None, ncols=None):
    """Read a 1-based ``row col value`` TSV file and validate it.

    Parameters
    ----------
    path : path-like
        The TSV file.
    nrows, ncols : int, optional
        Upper bounds for the row and column indices (e.g. N); checked when given.

    Returns
    -------
    rows, cols : ndarray of int64
        Zero-based indices.
    vals : ndarray of float32

    Raises
    ------
    InputError
        Naming the file and line: wrong column count, non-numeric field, index that is not a
        positive integer or exceeds the bound, NaN or infinite value.
    """
    text = _read_bytes(path)
    out = _triples(path, text, nrows, ncols, 0)
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


def _triples(path, text, nrows, ncols, byte_offset, line_base=None):
    """Entries of ``text`` (whole lines at ``byte_offset`` of ``path``), every check done;
    ``line_base``: the lines before ``text`` when known (an inflated stream has no
    offsets to count them from)."""
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
    return (
        r.astype(np.int64) - 1,
        c.astype(np.int64) - 1,
        vals32,
    )


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
        raise InputError(f"{path}: duplicate (row, column) entries")
    mat.sort_indices()
    return mat


def read_weight_tsv(path, neurons: int) -> sp.csr_matrix:
    """Read one ``n{N}-l{k}.tsv`` layer as an ``N x N`` float32 CSR matrix."""
    rows, cols, vals = read_triples(path, neurons, neurons)
    return _to_csr(rows, cols, vals, (neurons, neurons), path)


def read_weight_compact(path, neurons: int, bias):
    """Read one layer file straight into column-wise :class:`CompactLayer` form.

    The official files are already in column order, so this is one parse, one ordering
    check and no sort; other files are sorted. A duplicate ``(row, column)`` names its line.
    """
    text = _read_bytes(path)
    rows, cols, vals = _triples(path, text, neurons, neurons, 0)
    return compact_from_triples(path, text, rows, cols, vals, neurons, bias)


def compact_from_triples(path, text, rows, cols, vals, neurons: int, bias):
    """A :class:`CompactLayer` from one layer's 0-based entries (copied: the arrays may be a
    parser's reused buffers). ``text`` (bytes or uint8 array, the file's text) names the
    line of a duplicate entry."""
    from ..weights import CompactLayer, index_dtype

    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    key = cols * neurons + rows
    order = None
    if key.size > 1 and not (key[1:] > key[:-1]).all():
        order = np.argsort(key, kind="stable")
        key = key[order]
        dup = np.flatnonzero(key[1:] == key[:-1])
        if dup.size:
            i = int(order[dup[0] + 1])
            raw = text.tobytes() if isinstance(text, np.ndarray) else text
            line = f":{_line_of(raw, i)}" if raw is not None else ""
            raise InputError(
                f"{path}{line}: duplicate entry for row {rows[i] + 1}, column {cols[i] + 1}"
            )
        rows, cols, vals = rows[order], cols[order], vals[order]
    counts = np.bincount(cols, minlength=neurons)
    fixed = bool(np.all(counts == counts[0])) if counts.size else True
    uniform = vals.size > 0 and bool(np.all(vals == vals[0]))
    colptr = None
    if not fixed:
        colptr = np.zeros(neurons + 1, dtype=np.int64)
        np.cumsum(counts, out=colptr[1:])
    return CompactLayer(
        neurons=neurons,
        rows=rows.astype(index_dtype(neurons)),
        colptr=colptr,
        per_col=int(counts[0]) if fixed and counts.size else 0,
        values=None if uniform else np.array(vals, dtype=np.float32),
        value=float(vals[0]) if uniform else 0.0,
        bias=np.full(neurons, bias, dtype=np.float32),
    )


def compact_from_ordered(rows, counts, vals, uniform: bool, neurons: int, bias):
    """A :class:`CompactLayer` from entries already in (column, row) order without a
    repeat (what :func:`~mpisdnn.formats._tsv_kernels.parse_layer_text` found): ``counts``
    holds each column's entries, ``uniform`` whether all of ``vals`` are equal. The same
    layer :func:`compact_from_triples` builds, without its sort and checks."""
    from ..weights import CompactLayer, index_dtype

    fixed = bool(counts.size == 0 or (counts == counts[0]).all())
    colptr = None
    if not fixed:
        colptr = np.zeros(neurons + 1, dtype=np.int64)
        np.cumsum(counts, out=colptr[1:])
    uniform = uniform and vals.size > 0
    return CompactLayer(
        neurons=neurons,
        rows=rows.astype(index_dtype(neurons)),
        colptr=colptr,
        per_col=int(counts[0]) if fixed and counts.size else 0,
        values=None if uniform else np.array(vals, dtype=np.float32),
        value=float(vals[0]) if uniform else 0.0,
        bias=np.full(neurons, bias, dtype=np.float32),
    )


def layer_file(directory, neurons: int, layer: int) -> Path:
    """Path of official layer ``layer`` (1-based) of an ``N``-neuron network directory."""
    return Path(directory) / f"n{neurons}-l{layer}.tsv"


_LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv$")


def is_layer_file(name: str) -> bool:
    """Whether ``name`` looks like a layer file ``n{N}-l{k}.tsv``."""
    return _LAYER_RE.match(name) is not None


def scan_network_dir(directory, layers=None):
    """Check a layer directory and return ``(N, L)``.

    The files must be ``n{N}-l1.tsv`` .. ``n{N}-l{L}.tsv`` for one N, with no gap, no
    ``l0``, no name with leading zeros (``l01`` would duplicate ``l1``): a directory that an
    interrupted writer or two mixed runs left behind is refused rather than half used.
    ``layers`` (the run's depth) must not exceed L.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory of n{{N}}-l{{k}}.tsv layer files")
    found = {}
    for entry in sorted(os.listdir(directory)):
        m = _LAYER_RE.match(entry)
        if not m:
            continue
        n_text, k_text = m.groups()
        if k_text != str(int(k_text)) or n_text != str(int(n_text)) or int(k_text) < 1:
            raise InputError(
                f"{directory / entry}: bad layer file name (layers are numbered 1, 2, ... "
                f"without leading zeros)"
            )
        found.setdefault(int(n_text), set()).add(int(k_text))
    if not found:
        raise InputError(f"{directory}: no n{{N}}-l{{k}}.tsv layer files found")
    if len(found) > 1:
        raise InputError(f"{directory}: layer files for several sizes {sorted(found)}")
    neurons, present = next(iter(found.items()))
    top = max(present)
    if len(present) != top:
        gap = min(set(range(1, top + 1)) - present)
        raise InputError(
            f"{layer_file(directory, neurons, gap)}: missing layer file (the directory has "
            f"layers up to {top}; incomplete or mixed output?)"
        )
    if layers is not None and layers > top:
        raise InputError(
            f"{layer_file(directory, neurons, top + 1)}: missing layer file (asked for "
            f"{layers} layers, the directory has {top})"
        )
    return neurons, top


def _scan_network_dir(directory):
    neurons, top = scan_network_dir(directory)
    return neurons, set(range(1, top + 1))


def read_network_tsv(directory, layers=None, neurons=None, bias=None, layer_start=0):
    """Read an official network directory ``neuron{N}/n{N}-l{k}.tsv``.

    Parameters
    ----------
    directory : path-like
    layers : int, optional
        How many layers to use (the first ``layers`` files, as the challenge does for L=120 and
        480). Default: all files ``n{N}-l1.tsv`` .. ``n{N}-l{L}.tsv``.
    neurons : int, optional
        Expected N; default taken from the file names.
    bias : float, optional
        Bias for every neuron; default the official value for N.
    layer_start : int
        First layer (0-based) to read, for a rank that holds a slice of layers.

    Returns
    -------
    Network
    """
    from ..network import Network

    found_n, top = scan_network_dir(directory, layers)
    if neurons is not None and neurons != found_n:
        raise ShapeError(f"{directory}: files are for N={found_n}, expected N={neurons}")
    neurons = found_n
    if layers is None:
        layers = top
    if bias is None:
        if neurons not in DEFAULT_BIAS:
            raise InputError(f"{directory}: no official bias for N={neurons}; pass --bias")
        bias = DEFAULT_BIAS[neurons]
    mats = [
        read_weight_tsv(layer_file(directory, neurons, k + 1), neurons)
        for k in range(layer_start, layers)
    ]
    bias_arr = np.full((len(mats), neurons), bias, dtype=np.float32)
    return Network(
        mats,
        bias_arr,
        neurons=neurons,
        total_layers=layers,
        layer_start=layer_start,
        source=os.fspath(directory),
    )


def check_image_entries(path, entries: int) -> None:
    """Refuse an inputs TSV without entries when the row count comes from the file.

    Without entries the file gives no row count: an empty (or truncated-to-nothing) download
    would otherwise run as zero inputs and "pass".
    """
    if entries == 0:
        raise InputError(f"{path}: no entries (expected `row<TAB>col<TAB>value` lines)")


def read_images_tsv(path, neurons: int, rows=None) -> sp.csr_matrix:
    """Read ``sparse-images-{N}.tsv`` as a ``rows x N`` float32 CSR matrix.

    ``rows`` defaults to the largest row index present (60,000 for the official files).
    """
    r, c, v = read_triples(path, rows, neurons)
    if rows is None:
        check_image_entries(path, r.size)
    nrows = rows if rows is not None else int(r.max()) + 1
    # one stray huge row id must not size the row pointers (16 B per row while building)
    check_memory(16 * (nrows + 1), f"{path}: {nrows} rows (the largest row id)")
    return _to_csr(r, c, v, (nrows, neurons), path)


def read_categories(path) -> np.ndarray:
    """Read a truth file (one 1-based row index per line) as a sorted int64 array."""
    text = _read_bytes(path)
    if not text.strip():
        return np.empty(0, dtype=np.int64)
    vals = _floats(text)
    nlines = sum(1 for line in text.splitlines() if line.strip())
    if vals is None or vals.size != nlines:
        for lineno, raw in enumerate(text.splitlines(), start=1):
            fields = raw.split()
            if raw.strip() and (len(fields) != 1 or not fields[0].isdigit()):
                raise InputError(
                    f"{path}:{lineno}: expected one positive integer per line, got {_show(raw)}"
                )
        raise InputError(f"{path}: malformed categories file")
    bad = np.flatnonzero(~np.isfinite(vals) | (vals < 1) | (vals != np.floor(vals)))
    if bad.size:
        raise InputError(
            f"{path}:{_line_of(text, int(bad[0]))}: category must be a positive 1-based "
            f"integer, got {_fmt(vals[bad[0]])}"
        )
    return np.unique(vals.astype(np.int64))


def write_triples(path, mat) -> None:
    """Write a sparse matrix as a 1-based ``row col value`` TSV file (temp name + rename).

    Entries go column-major, like the official files. When every value is the same (the
    official inputs are all 1, the layers all 1/16), lines are formatted in column chunks by
    a numba loop (``_tsv_write``): 60,000 inputs of N=65536 are 424 M lines, far too many for
    the object array ``np.savetxt`` formats. An integral value is written as an integer
    (``1``, as in the official ``sparse-images-{N}.tsv``), any other as ``%.6e``.
    """
    csc = sp.csc_matrix(mat)
    csc.sort_indices()
    vals = csc.data
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        if vals.size == 0:
            return
        v = vals[0]
        if not np.all(vals == v):
            coo = csc.tocoo()  # column-major already: CSC order
            rows, cols = coo.row + 1, coo.col + 1
            table = np.column_stack([rows, cols, coo.data]).astype(object)
            np.savetxt(fh, table, fmt="%d\t%d\t%.6e")
            return
        from ._tsv_write import format_lines

        text = (f"{int(v)}" if float(v).is_integer() else f"{float(v):.6e}").encode()
        step = 1 << 22  # entries per chunk: ~100 MB of temporaries
        for lo in range(0, vals.size, step):
            hi = min(lo + step, vals.size)
            # 1-based column of entry p: the number of column starts <= p
            cols = np.searchsorted(csc.indptr, np.arange(lo, hi), side="right")
            fh.write(format_lines(csc.indices[lo:hi] + 1, cols, text))


def write_categories(path, categories) -> None:
    """Write 1-based category row indices, one per line (temp name + rename)."""
    cats = np.asarray(categories, dtype=np.int64)
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        if cats.size:
            np.savetxt(fh, cats, fmt="%d")
