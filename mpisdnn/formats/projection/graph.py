"""Graph inputs for projection: Matrix Market, TSV/CSV edge lists, ratings files, graph HDF5.

Every reader returns a :class:`Graph`: a canonical CSR adjacency (sorted unique columns per
row, float64 weights, no stored zeros) of shape ``rows x cols``. Text is parsed in one C-level
pass (``np.fromstring`` over the whole file after a vectorised byte-level clean-up of comments
and separators); only a file that fails the fast checks is walked line by line, to name the
first bad line as ``path:line: problem``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ...errors import InputError, UsageError
from .._atomic import atomic_path, no_space
from .._tsv_write import format_int_lines
from ..tsv import _floats, _read_bytes

__all__ = [
    "Graph",
    "GRAPH_FORMAT",
    "INPUT_FORMATS",
    "detect_format",
    "read_graph",
    "write_graph",
    "format_triples",
]

GRAPH_FORMAT = "mpisdnn.graph"
VERSION = 1
#: Input formats ``read_graph`` understands (``auto`` picks by signature and extension).
INPUT_FORMATS = ("auto", "mtx", "tsv", "csv", "ratings", "h5")


@dataclass
class Graph:
    """A bipartite (or any) graph as its ``rows x cols`` adjacency.

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix
        float64, canonical (sorted unique column indices), no explicit zeros.
    weighted : bool
        False when every weight is 1 by construction (pattern MM, two-column edge lists).
    source : str
    row_labels, col_labels : ndarray, optional
        The file's own ids of the rows and columns (sorted; index ``i`` is the ``i``-th
        smallest id) when the input used ids that are not dense ``0..n-1`` (``base..``)
        numbers; ``None`` when the ids are the indices.
    """

    matrix: sp.csr_matrix
    weighted: bool
    source: str = ""
    row_labels: np.ndarray | None = None
    col_labels: np.ndarray | None = None

    @property
    def shape(self):
        return self.matrix.shape

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)


# --- format detection ------------------------------------------------------------------------


def detect_format(path) -> str:
    """Guess the input format: HDF5 signature, then extension, then a MatrixMarket banner."""
    from ..hdf5 import is_hdf5

    path = os.fspath(path)
    if is_hdf5(path):
        return "h5"
    lower = path.lower()
    for ext, fmt in (
        (".mtx", "mtx"),
        (".mm", "mtx"),
        (".h5", "h5"),
        (".hdf5", "h5"),
        (".csv", "csv"),
        (".dat", "ratings"),
        (".ratings", "ratings"),
    ):
        if lower.endswith(ext):
            return fmt
    try:
        with open(path, "rb") as fh:
            head = fh.read(14)
    except OSError:
        return "tsv"
    return "mtx" if head.startswith(b"%%MatrixMarket") else "tsv"


# --- text parsing ----------------------------------------------------------------------------


# separators other than whitespace become spaces: ',' (CSV) and ':' ('::' in MovieLens files)
_SEPARATORS = bytes.maketrans(b",:;", b"   ")


def _data_mask(b: np.ndarray, skip: int, comment: bytes):
    """Per-byte mask of the lines that hold data, and the 1-based line number of each line.

    A data line is not among the first ``skip`` lines, is not blank and does not start (after
    leading blanks) with a comment character.
    """
    newline = b == 10
    line_of_byte = np.cumsum(newline) - newline  # 0-based line id of every byte
    nlines = int(line_of_byte[-1]) + 1 if b.size else 0
    blank = (b == 32) | (b == 9) | (b == 13) | newline
    first = np.full(nlines, -1, dtype=np.int64)  # first non-blank byte of each line
    nb = np.flatnonzero(~blank)
    if nb.size:
        lines_nb = line_of_byte[nb]
        starts = np.concatenate(([True], lines_nb[1:] != lines_nb[:-1]))
        first[lines_nb[starts]] = nb[starts]
    keep_line = first >= 0
    if comment:
        lead = np.zeros(nlines, dtype=np.uint8)
        lead[keep_line] = b[first[keep_line]]
        keep_line &= ~np.isin(lead, np.frombuffer(comment, dtype=np.uint8))
    keep_line[: min(skip, nlines)] = False
    return keep_line, line_of_byte


def _parse_table(
    path, text: bytes, ncols_allowed, skip=0, comment=b"#%", line_offset=0, strings=False
):
    """Parse whitespace/CSV/'::'-separated numeric records.

    With ``strings``, records that are not all numbers come back as a table of ``bytes``
    fields (``dtype 'S'``) instead of failing; the caller converts the columns it needs.

    Returns
    -------
    table : ndarray of float64 (or bytes), shape (records, ncols)
    lines : ndarray of int64
        1-based line number of each record (for error messages).
    """
    b = np.frombuffer(text, dtype=np.uint8)
    if b.size == 0:
        return np.empty((0, min(ncols_allowed))), np.empty(0, dtype=np.int64)
    keep_line, line_of_byte = _data_mask(b, skip, comment)
    data_lines = np.flatnonzero(keep_line)
    if data_lines.size == 0:
        return np.empty((0, min(ncols_allowed))), np.empty(0, dtype=np.int64)
    if keep_line.all():
        clean = text.translate(_SEPARATORS)
    else:
        keep = keep_line[line_of_byte]
        keep |= b == 10  # keep line structure so fields never run into each other
        clean = b[keep].tobytes().translate(_SEPARATORS)
    cb = np.frombuffer(clean, dtype=np.uint8)
    counts = _fields_per_line(cb)
    ncols = int(counts[0]) if counts.size else 0
    table = None
    if ncols in ncols_allowed and counts.size == data_lines.size and (counts == ncols).all():
        flat = _floats(clean)
        if flat is not None and flat.size == ncols * data_lines.size:
            table = flat.reshape(-1, ncols)
    if table is None and strings and ncols in ncols_allowed and counts.size == data_lines.size:
        if (counts == ncols).all():
            table = np.array(clean.split(), dtype=bytes).reshape(-1, ncols)
    if table is None:
        _slow_scan(path, text, ncols_allowed, data_lines, line_offset)  # raises with the line
        raise InputError(f"{path}: malformed file")  # pragma: no cover - slow scan raises
    return table, data_lines + 1 + line_offset


def _fields_per_line(cb: np.ndarray) -> np.ndarray:
    """Number of fields on every non-blank line of cleaned text (vectorised)."""
    newline = cb == 10
    space = newline | (cb == 9) | (cb == 32) | (cb == 13)
    starts = ~space
    starts[1:] &= space[:-1]
    line_ids = np.cumsum(newline)[np.flatnonzero(starts)]
    if line_ids.size == 0:
        return np.empty(0, dtype=np.int64)
    _, counts = np.unique(line_ids, return_counts=True)
    return counts


def _slow_scan(path, text: bytes, ncols_allowed, data_lines, line_offset=0) -> None:
    raw_lines = text.split(b"\n")
    want = None
    for i in data_lines.tolist():
        raw = raw_lines[i]
        i += line_offset
        fields = raw.translate(_SEPARATORS).split()
        if want is None:
            if len(fields) not in ncols_allowed:
                raise InputError(
                    f"{path}:{i + 1}: expected {_alts(ncols_allowed)} columns, found "
                    f"{len(fields)}: {_show(raw)}"
                )
            want = len(fields)
        elif len(fields) != want:
            raise InputError(
                f"{path}:{i + 1}: expected {want} columns like the first record, found "
                f"{len(fields)}: {_show(raw)}"
            )
        try:
            [float(f) for f in fields]
        except ValueError:
            raise InputError(f"{path}:{i + 1}: non-numeric field: {_show(raw)}") from None


def _alts(allowed) -> str:
    allowed = sorted(allowed)
    return " or ".join(str(a) for a in allowed)


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _fmt(x: float) -> str:
    return str(int(x)) if np.isfinite(x) and x == int(x) else repr(float(x))


def _check_indices(path, idx: np.ndarray, lines, base: int, names=("row", "column"), bounds=None):
    """Indices must be integers >= base (and <= bound + base - 1 when bounds are given)."""
    for axis, name in enumerate(names):
        col = idx[:, axis]
        bad = ~np.isfinite(col) | (col != np.floor(col)) | (col < base)
        if bounds is not None:
            bad |= col > bounds[axis] - 1 + base
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            want = f"an integer >= {base}"
            if bounds is not None:
                want = f"an integer in {base}..{bounds[axis] - 1 + base}"
            raise InputError(f"{path}:{lines[i]}: {name} index must be {want}, got {_fmt(col[i])}")


def _check_weights(path, w: np.ndarray, lines) -> None:
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{path}:{lines[i]}: weight is {w[i]} (must be finite)")


def _build(path, rows, cols, w, shape, duplicates: str, lines=None) -> sp.csr_matrix:
    """Canonical CSR from triples; zero weights are not edges and are dropped."""
    if w is None:
        w = np.ones(rows.size, dtype=np.float64)
    keep = w != 0
    if not keep.all():
        rows, cols, w = rows[keep], cols[keep], w[keep]
        lines = lines[keep] if lines is not None else None
    idx = np.int32 if max(shape) < 2**31 else np.int64
    mat = sp.coo_matrix(
        (w, (rows.astype(idx, copy=False), cols.astype(idx, copy=False))), shape=shape
    ).tocsr()
    if mat.nnz != rows.size or not mat.has_canonical_format:
        if duplicates == "error":
            key = rows.astype(np.int64) * shape[1] + cols
            order = np.argsort(key, kind="stable")
            dup = np.flatnonzero(np.diff(key[order]) == 0)
            i = int(order[dup[0] + 1])
            where = f"{path}:{lines[i]}" if lines is not None else str(path)
            raise InputError(f"{where}: duplicate edge ({rows[i]}, {cols[i]})")
        mat.sum_duplicates()
        mat.eliminate_zeros()  # duplicates that cancel are no edge
    mat.sort_indices()
    return mat


def _shape(rows, cols, shape):
    if shape is not None:
        return int(shape[0]), int(shape[1])
    nr = int(rows.max()) + 1 if rows.size else 0
    nc = int(cols.max()) + 1 if cols.size else 0
    return nr, nc


#: ``ids`` choices of :func:`read_edge_list`.
ID_MODES = ("auto", "index", "label")
#: ``auto``: numeric ids are used as indices while the index range is at most this many
#: times the number of distinct ids (MovieLens-100k's 1..1682 is; ids up to 1,682,007 for
#: 1,682 items are not, and become labels).
_DENSE_IDS = 2
#: ... and leave more than this many indices unused (small files keep index semantics).
_EMPTY_IDS = 1 << 16


def _numbers(path, col: np.ndarray, lines, what: str) -> np.ndarray:
    """A bytes column as float64, naming the first line that is not a number."""
    try:
        return col.astype(np.float64)
    except ValueError:
        for i, x in enumerate(col.tolist()):
            try:
                float(x)
            except ValueError:
                where = f"{path}:{lines[i]}"
                raise InputError(f"{where}: non-numeric field: {what} {_show(x)}") from None
        raise  # pragma: no cover - one of them failed


def _as_labels(col: np.ndarray, path=None, lines=None):
    """Each record's index among the sorted distinct ids, and those ids (bytes become str).

    Ids are decoded as UTF-8 whatever the locale (numpy's ``astype(str)`` decodes ASCII only:
    ``ä`` failed with a raw ``UnicodeDecodeError``); bytes that are not UTF-8 are reported
    with the file and line.
    """
    labels, inverse = np.unique(col, return_inverse=True)
    if labels.dtype.kind == "S":
        try:
            labels = np.array([x.decode("utf-8") for x in labels.tolist()], dtype=str)
        except UnicodeDecodeError:
            bad = next(i for i, x in enumerate(col.tolist()) if not _utf8(x))
            where = f"{path}:{lines[bad]}" if lines is not None else f"{path}"
            raise InputError(f"{where}: id {_show(col[bad])} is not UTF-8 text") from None
    return inverse.astype(np.int64).ravel(), labels


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _side(path, col, lines, base: int, ids: str, name: str):
    """``(indices, labels or None)`` of one id column."""
    if col.dtype.kind == "S":
        try:
            num = col.astype(np.float64)
        except ValueError:
            num = None
        if num is None or ids == "label":
            if ids == "index":
                i = next(i for i, x in enumerate(col.tolist()) if not _is_number(x))
                raise InputError(
                    f"{path}:{lines[i]}: non-numeric field: {name} id {_show(col[i])} "
                    "(--ids index needs numbers; --ids label takes any id)"
                )
            return _as_labels(col, path, lines)
        col = num
    bad = ~np.isfinite(col) | (col != np.floor(col))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{path}:{lines[i]}: {name} index must be an integer, got {_fmt(col[i])}")
    if ids == "label":
        return _as_labels(col.astype(np.int64))
    lo, hi = (float(col.min()), float(col.max())) if col.size else (base, base)
    if ids == "auto" and col.size and lo >= base:
        distinct = np.unique(col).size
        empty = hi - base + 1 - distinct  # indices no id uses
        if empty > max(distinct * (_DENSE_IDS - 1), _EMPTY_IDS):
            return _as_labels(col.astype(np.int64))
    if col.size and lo < base:
        i = int(np.flatnonzero(col < base)[0])
        raise InputError(
            f"{path}:{lines[i]}: {name} index must be an integer >= {base}, got {_fmt(col[i])}"
        )
    if hi >= 2**62:
        i = int(np.argmax(col))
        raise InputError(f"{path}:{lines[i]}: {name} id {_fmt(col[i])} is too large")
    return col.astype(np.int64) - base, None


def _refuse_header(path, table: np.ndarray, lines) -> None:
    """A first record that is not numbers while every other one is: a header line, which
    would otherwise become an edge and turn every id into a label."""
    if table.dtype.kind != "S" or table.shape[0] < 2:
        return
    try:
        table[1:].astype(np.float64)
    except ValueError:
        return  # text ids throughout: labels
    first = b" ".join(table[0].tolist())
    raise InputError(
        f"{path}:{lines[0]}: probable header line {_show(first)} (the other lines are "
        f"numbers); use --skip-lines 1 (or --ids label if it is an edge)"
    )


def _csv_table(path, text: bytes, allowed, skip: int):
    """Records of a CSV file with quoted fields (RFC 4180: ``"x,1"`` is one field, ``""`` a
    quote), by the standard library's reader; blank and ``#``/``%`` comment lines skipped.

    Returns the same ``(table of bytes, 1-based lines)`` as :func:`_parse_table`.
    """
    import csv
    import io

    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = text.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(decoded, newline=""), strict=True)
    records, lines, start = [], [], 1
    try:
        for row in reader:
            line, start = start, reader.line_num + 1
            if line <= skip or not row or (len(row) == 1 and not row[0].strip()):
                continue
            if row[0].lstrip()[:1] in ("#", "%"):
                continue
            fields = [f.strip() for f in row]
            if len(fields) not in allowed:
                raise InputError(
                    f"{path}:{line}: {len(fields)} fields, expected {_alts(allowed)} "
                    f"(CSV, quoted fields allowed)"
                )
            records.append([f.encode("utf-8") for f in fields])
            lines.append(line)
    except csv.Error as exc:
        raise InputError(f"{path}:{reader.line_num}: bad CSV quoting ({exc})") from None
    if not records:
        return np.empty((0, min(allowed))), np.empty(0, dtype=np.int64)
    ncols = len(records[0])
    bad = next((i for i, r in enumerate(records) if len(r) != ncols), None)
    if bad is not None:
        raise InputError(f"{path}:{lines[bad]}: {len(records[bad])} fields, expected {ncols}")
    return np.array(records, dtype=bytes), np.array(lines, dtype=np.int64)


def _is_number(x) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def read_edge_list(
    path, fmt="tsv", index_base=None, skip_lines=0, duplicates="sum", shape=None, ids="auto"
) -> Graph:
    """Read a TSV/CSV edge list (``u v [weight]``) or a ratings file (``user item rating [t]``).

    Parameters
    ----------
    path : path-like
    fmt : {"tsv", "csv", "ratings"}
        Edge lists have 2 or 3 columns (the third is the weight); ratings have 3 or 4 (the
        rating is the weight, a timestamp is ignored). Any mix of whitespace, ``,`` and ``::``
        separates fields; lines starting with ``#`` or ``%`` are comments.
    index_base : {0, 1}, optional
        First id of numeric, dense ids; default 0 for edge lists, 1 for ratings (MovieLens ids
        start at 1).
    skip_lines : int
        Header lines to skip (e.g. 1 for ``userId,movieId,rating,timestamp``).
    duplicates : {"sum", "error"}
    shape : (int, int), optional
        Default: largest id + 1 on each side (index ids only).
    ids : {"auto", "index", "label"}
        ``index``: ids are numbers ``index_base..`` used as matrix indices. ``label``: ids are
        labels (any text), mapped to indices in sorted order (numerically for integer ids,
        else by their UTF-8 bytes), the same at any rank count; ``Graph.row_labels`` and
        ``Graph.col_labels`` keep them. ``auto`` (default): labels for a side whose ids are
        not numbers, or are sparse (the range leaves over half and over 65,536 indices
        unused), indices otherwise.
    """
    if fmt not in ("tsv", "csv", "ratings"):
        raise UsageError(f"not an edge-list format: {fmt!r}")
    if ids not in ID_MODES:
        raise UsageError(f"ids must be one of {', '.join(ID_MODES)}, got {ids!r}")
    ratings = fmt == "ratings"
    base = (1 if ratings else 0) if index_base is None else int(index_base)
    text = _read_bytes(path, what="a graph file")
    allowed = (3, 4) if ratings else (2, 3)
    if b'"' in text and (fmt == "csv" or os.fspath(path).lower().endswith(".csv")):
        table, lines = _csv_table(path, text, allowed, skip_lines)  # RFC 4180 quoting
    else:
        table, lines = _parse_table(path, text, allowed, skip=skip_lines, strings=True)
    if table.shape[0] == 0:
        raise InputError(f"{path}: no edges found")
    if ids == "auto":
        _refuse_header(path, table, lines)
    names = ("user", "item") if ratings else ("source", "target")
    rows, row_labels = _side(path, table[:, 0], lines, base, ids, names[0])
    cols, col_labels = _side(path, table[:, 1], lines, base, ids, names[1])
    weighted = table.shape[1] >= 3
    w = None
    if weighted:
        w = table[:, 2].copy()
        if w.dtype.kind == "S":
            w = _numbers(path, w, lines, "weight")
        _check_weights(path, w, lines)
    if shape is not None and (row_labels is not None or col_labels is not None):
        raise UsageError("a shape applies to numeric index ids only")
    if shape is not None and (rows.max() >= shape[0] or cols.max() >= shape[1]):
        i = int(np.flatnonzero((rows >= shape[0]) | (cols >= shape[1]))[0])
        raise InputError(f"{path}:{lines[i]}: edge ({rows[i]}, {cols[i]}) outside {shape}")
    shp = _shape(rows, cols, shape)
    if row_labels is not None:
        shp = (row_labels.size, shp[1])
    if col_labels is not None:
        shp = (shp[0], col_labels.size)
    mat = _build(path, rows, cols, w, shp, duplicates, lines)
    return Graph(mat, weighted, os.fspath(path), row_labels, col_labels)


_MM_FIELDS = ("real", "double", "integer", "pattern")
_MM_SYMMETRY = ("general", "symmetric", "skew-symmetric")


def _mtx_header(path, text: bytes):
    """``(field, symmetry, (rows, cols, entries), body offset, size line number)`` of a
    Matrix Market coordinate file, checked."""
    nl = text.find(b"\n")
    banner = (text if nl < 0 else text[:nl]).decode("utf-8", "replace").strip()
    parts = banner.lower().split()
    if len(parts) != 5 or parts[0] != "%%matrixmarket" or parts[1] != "matrix":
        raise InputError(
            f"{path}:1: not a Matrix Market file: expected '%%MatrixMarket matrix coordinate "
            f"<field> <symmetry>', got {_show(banner.encode())}"
        )
    layout, field, symmetry = parts[2:]
    if layout != "coordinate":
        raise InputError(
            f"{path}:1: only 'coordinate' Matrix Market files are supported, not {layout!r}"
        )
    if field not in _MM_FIELDS:
        raise InputError(f"{path}:1: unsupported field {field!r} (real, integer or pattern)")
    if symmetry not in _MM_SYMMETRY:
        raise InputError(f"{path}:1: unsupported symmetry {symmetry!r} (general or symmetric)")
    # the size line is the first line that is neither the banner nor a '%' comment
    pos, lineno = (nl + 1 if nl >= 0 else len(text)), 1
    size_line = None
    while pos < len(text):
        end = text.find(b"\n", pos)
        end = len(text) if end < 0 else end
        lineno += 1
        line = text[pos:end].strip()
        pos = end + 1
        if line and not line.startswith(b"%"):
            size_line = line
            break
    if size_line is None:
        raise InputError(f"{path}: missing the size line 'rows cols entries'")
    fields = size_line.split()
    try:
        nr, nc, nnz = (int(f) for f in fields)
        if min(nr, nc, nnz) < 0:
            raise ValueError
    except ValueError:
        raise InputError(
            f"{path}:{lineno}: size line must be three integers 'rows cols entries', got "
            f"{_show(size_line)}"
        ) from None
    return field, symmetry, (nr, nc, nnz), pos, lineno


def read_mtx(path, duplicates="sum") -> Graph:
    """Read a Matrix Market ``coordinate`` file (real/integer/pattern; general/symmetric).

    Symmetric and skew-symmetric files store one triangle; the other is mirrored here.

    Parsed here, not by ``scipy.io.mmread``, which accepts what an input must not be: extra
    fields on a line, fractional values in an ``integer`` file (truncated), NaN weights,
    entries above the diagonal of a symmetric file; and the errors name the file, the line
    and the problem (``g.mtx:4: row index must be ...``).
    """
    text = _read_bytes(path, what="a graph file")
    field, symmetry, (nr, nc, nnz), pos, lineno = _mtx_header(path, text)
    ncols = 2 if field == "pattern" else 3
    table, lines = _parse_table(path, text[pos:], (ncols,), comment=b"%", line_offset=lineno)
    if table.shape[0] != nnz:
        raise InputError(f"{path}: size line says {nnz} entries, found {table.shape[0]}")
    _check_indices(path, table[:, :2], lines, 1, bounds=(nr, nc))
    rows = table[:, 0].astype(np.int64) - 1
    cols = table[:, 1].astype(np.int64) - 1
    w = table[:, 2].copy() if ncols == 3 else None
    if w is not None:
        _check_weights(path, w, lines)
        if field == "integer" and (w != np.floor(w)).any():
            i = int(np.flatnonzero(w != np.floor(w))[0])
            raise InputError(f"{path}:{lines[i]}: value {_fmt(float(w[i]))} in an integer file")
    if symmetry != "general":
        if nr != nc:
            raise InputError(f"{path}:1: a {symmetry} matrix must be square, size is {nr}x{nc}")
        upper = rows < cols
        if upper.any():
            i = int(np.flatnonzero(upper)[0])
            raise InputError(
                f"{path}:{lines[i]}: entry ({rows[i] + 1}, {cols[i] + 1}) above the diagonal "
                f"in a {symmetry} file (only the lower triangle is stored)"
            )
        off = rows != cols
        sign = -1.0 if symmetry == "skew-symmetric" else 1.0
        mirror_w = None if w is None else sign * w[off]
        rows, cols = np.concatenate((rows, cols[off])), np.concatenate((cols, rows[off]))
        lines = np.concatenate((lines, lines[off]))
        if w is not None:
            w = np.concatenate((w, mirror_w))
    mat = _build(path, rows, cols, w, (nr, nc), duplicates, lines)
    return Graph(mat, field != "pattern", os.fspath(path))


# --- HDF5 graph layout -----------------------------------------------------------------------


def read_graph_h5(path) -> Graph:
    """Read the ``mpisdnn.graph`` HDF5 layout (see docs/projection.md) and validate it."""
    from ..hdf5 import open_layout

    path = os.fspath(path)
    with open_layout(path, GRAPH_FORMAT) as f:
        try:
            nr, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
            for name in ("indptr", "indices"):
                # float pointers or ids (NaN among them) would be truncated by the casts below
                if f[name].dtype.kind not in "iu" or f[name].ndim != 1:
                    raise InputError(
                        f"{path}: dataset /{name} must be 1-D integers, found "
                        f"{f[name].dtype} {f[name].shape}"
                    )
            indptr = f["indptr"][()].astype(np.int64, copy=False)
            indices = f["indices"][()]
            data = f["data"][()].astype(np.float64, copy=False) if "data" in f else None
        except KeyError as exc:
            raise InputError(f"{path}: missing attribute or dataset: {exc}") from None
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"{path}: cannot read (corrupt?): {exc}") from None
        source = f.attrs.get("source", path)
        labels = [_read_labels(f, name) for name in ("rows", "cols")]
    nnz = indices.size
    if indptr.shape != (nr + 1,) or indptr[0] != 0 or indptr[-1] != nnz:
        raise InputError(f"{path}: /indptr must have rows+1 = {nr + 1} entries from 0 to {nnz}")
    if (np.diff(indptr) < 0).any():
        raise InputError(f"{path}: /indptr is not non-decreasing")
    if data is not None and data.size != nnz:
        raise InputError(f"{path}: /data has {data.size} entries, /indices {nnz}")
    if nnz and (indices.min() < 0 or indices.max() >= nc):
        raise InputError(f"{path}: /indices outside 0..{nc - 1}")
    if data is not None and not np.isfinite(data).all():
        raise InputError(f"{path}: /data holds NaN or infinite weights")
    idx = np.int32 if max(nr, nc, nnz) < 2**31 else np.int64
    w = data if data is not None else np.ones(nnz, dtype=np.float64)
    mat = sp.csr_matrix(
        (w, indices.astype(idx, copy=False), indptr.astype(idx, copy=False)), shape=(nr, nc)
    )
    if not mat.has_canonical_format:
        mat.sum_duplicates()
    if data is not None and (mat.data == 0).any():
        mat.eliminate_zeros()
    source = source.decode() if isinstance(source, bytes) else str(source)
    for name, lab, size in zip(("rows", "cols"), labels, (nr, nc)):
        if lab is not None and lab.shape != (size,):
            raise InputError(f"{path}: /labels/{name} has {lab.size} entries, not {size}")
    return Graph(mat, data is not None, source, labels[0], labels[1])


def _read_labels(f, name):
    key = f"labels/{name}"
    if key not in f:
        return None
    ds = f[key]
    if ds.dtype.kind in "OS":
        return np.array([x.decode() if isinstance(x, bytes) else str(x) for x in ds[()]])
    return ds[()].astype(np.int64)


def write_graph_h5(path, graph: Graph) -> None:
    """Write the ``mpisdnn.graph`` layout (temp name + rename); /data only when weighted.

    The temporary file is re-read and compared with what was meant to be written before it
    replaces ``path``, so a write error HDF5 swallowed (a full disk) never replaces a good
    file; a full disk is reported as ``path: no space left on device``.
    """
    import io

    import h5py

    from ..hdf5 import chunked_dataset, stamp

    mat = graph.matrix
    nr, nc = mat.shape
    idx = np.int32 if nc < 2**31 else np.int64
    # built in memory (the graph is in memory already; compressed it is smaller), then written
    # with plain writes whose errors are ours to see: HDF5 can swallow a failed write
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        sizes = {"rows": nr, "cols": nc, "nnz": int(mat.nnz), "weighted": bool(graph.weighted)}
        stamp(f, GRAPH_FORMAT, graph.source, sizes, VERSION)
        f.create_dataset("indptr", data=mat.indptr.astype(np.int64))
        chunked_dataset(f, "indices", mat.indices.astype(idx, copy=False))
        if graph.weighted:
            chunked_dataset(f, "data", mat.data.astype(np.float64, copy=False))
        _write_labels(f, graph)
    write_bytes_verified(path, image.getbuffer())


def write_bytes_verified(path, data) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, size check, then rename.

    On any error the previous ``path`` stays as it was and the temporary file is removed; a
    full disk is one :class:`InputError` ``path: no space left on device``.
    """
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if os.path.getsize(tmp) != len(data):
                raise InputError(f"{path}: short write ({os.path.getsize(tmp)} of {len(data)})")
    except OSError as exc:
        if no_space(exc):
            raise InputError(f"{path}: no space left on device") from None
        raise


def _write_labels(f, graph: Graph) -> None:
    for name, labels in (("rows", graph.row_labels), ("cols", graph.col_labels)):
        if labels is None:
            continue
        arr = np.asarray(labels)
        if arr.dtype.kind in "US":
            import h5py

            f.create_dataset(f"labels/{name}", data=arr.astype(object), dtype=h5py.string_dtype())
        else:
            f.create_dataset(f"labels/{name}", data=arr.astype(np.int64))


# --- text writers ----------------------------------------------------------------------------


def format_triples(rows, cols, vals, base: int = 0, sep: str = "\t") -> bytes:
    """Lines ``row<sep>col[<sep>value]`` for the given entries (values omitted when None).

    Integer values print as integers, floats with the shortest repr that reads back exactly.
    """
    rows = np.asarray(rows, dtype=np.int64) + base
    cols = np.asarray(cols, dtype=np.int64) + base
    if rows.size == 0:
        return b""
    if vals is None:
        return format_int_lines(rows, cols, None, sep)
    vals = np.asarray(vals)
    if vals.dtype.kind in "iu":
        return format_int_lines(rows, cols, vals, sep)
    fmt = "{}" + sep + "{}" + sep + "{!r}\n"
    return "".join(map(fmt.format, rows.tolist(), cols.tolist(), vals.tolist())).encode()


def write_graph_text(path, graph: Graph, fmt: str, index_base=None) -> None:
    """Write a graph as Matrix Market (``mtx``, by ``scipy.io.mmwrite``: values in their
    shortest exact form) or an edge list (``tsv``/``csv``)."""
    coo = graph.matrix.tocoo()
    vals = coo.data if graph.weighted else None
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        if fmt == "mtx":
            import scipy.io

            # an open file, not the path: mmwrite would add ".mtx" to the temporary name
            field = "real" if graph.weighted else "pattern"
            comment = f" written by mpisdnn from {graph.source}"
            scipy.io.mmwrite(fh, coo, comment=comment, field=field, symmetry="general")
            return
        base = 0 if index_base is None else int(index_base)
        sep = "," if fmt == "csv" else "\t"
        step = 1 << 20
        for lo in range(0, coo.nnz, step):
            hi = min(coo.nnz, lo + step)
            v = None if vals is None else vals[lo:hi]
            fh.write(format_triples(coo.row[lo:hi], coo.col[lo:hi], v, base, sep))


# --- entry points ----------------------------------------------------------------------------


def read_graph(
    path, fmt="auto", index_base=None, skip_lines=0, duplicates="sum", shape=None, ids="auto"
):
    """Read a graph in any supported format (see :data:`INPUT_FORMATS`).

    Parameters
    ----------
    path : path-like
    fmt : str
        ``auto`` (default): HDF5 by signature; ``.mtx``/``.mm`` Matrix Market; ``.csv`` CSV;
        ``.dat``/``.ratings`` ratings; a ``%%MatrixMarket`` banner; otherwise TSV.
    index_base : {0, 1}, optional
        For edge lists and ratings (Matrix Market is always 1-based, HDF5 0-based).
    skip_lines : int
        Header lines to skip in edge lists and ratings files.
    duplicates : {"sum", "error"}
        Repeated edges: add their weights (default) or reject the file naming the line.
    shape : (int, int), optional
        Size of edge-list graphs (default: largest id + 1).
    ids : {"auto", "index", "label"}
        How edge-list and ratings ids map to indices (see :func:`read_edge_list`).

    Returns
    -------
    Graph

    Raises
    ------
    InputError
        ``path:line: problem`` for malformed text, or ``path: problem`` for HDF5 files.
    """
    if duplicates not in ("sum", "error"):
        raise UsageError(f"duplicates must be 'sum' or 'error', got {duplicates!r}")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "h5":
        return read_graph_h5(path)
    if fmt == "mtx":
        return read_mtx(path, duplicates)
    if fmt in ("tsv", "csv", "ratings"):
        return read_edge_list(path, fmt, index_base, skip_lines, duplicates, shape, ids)
    raise UsageError(f"unknown input format {fmt!r}; choose one of {', '.join(INPUT_FORMATS)}")


def write_graph(path, graph, fmt="auto", index_base=None) -> None:
    """Write a :class:`Graph` (or a sparse matrix) as graph HDF5, Matrix Market or TSV/CSV.

    ``auto`` picks by extension: ``.mtx`` Matrix Market, ``.tsv``/``.txt`` TSV, ``.csv`` CSV,
    anything else HDF5.
    """
    if not isinstance(graph, Graph):
        mat = sp.csr_matrix(graph, dtype=np.float64)
        mat.sum_duplicates()
        mat.eliminate_zeros()
        graph = Graph(mat, not bool(np.all(mat.data == 1)), "")
    if fmt == "auto":
        lower = os.fspath(path).lower()
        fmt = "h5"
        for ext, f in ((".mtx", "mtx"), (".tsv", "tsv"), (".txt", "tsv"), (".csv", "csv")):
            if lower.endswith(ext):
                fmt = f
    if fmt == "h5":
        write_graph_h5(path, graph)
    elif fmt in ("mtx", "tsv", "csv"):
        write_graph_text(path, graph, fmt, index_base)
    else:
        raise UsageError(f"unknown output format {fmt!r} (h5, mtx, tsv or csv)")
