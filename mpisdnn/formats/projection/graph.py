"""Graph inputs for projection: Matrix Market, TSV/CSV edge lists, ratings files, graph HDF5.

Every reader returns a :class:`Graph`: a canonical CSR adjacency (sorted unique columns per
row, float64 weights, no stored zeros) of shape ``rows x cols``. Text is parsed by compiled
passes over the bytes with one grammar per format (:mod:`.text`, :mod:`.edgelist`); errors
name the line as ``path:line: problem``. :meth:`Graph.from_edges` builds one from a pandas
DataFrame, a pyarrow Table or a mapping of arrays (:mod:`.frames`).
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ...errors import InputError, ShapeError, UsageError
from .._atomic import H5_LIBVER, atomic_path, no_space
from .._tsv_write import format_int_lines
from .adjacency import Graph, build_csr
from .edgelist import ID_MODES, file_buffer, read_edge_list
from .text import SEPARATORS

__all__ = [
    "Graph",
    "ID_MODES",
    "SEPARATORS",
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
#: What :func:`write_graph` writes, by the output's name (``mpisdnn.formats.names``).
GRAPH_OUTPUTS = ("mtx", "tsv", "csv", "h5")


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


# --- shared helpers ---------------------------------------------------------------------------


def _alts(allowed) -> str:
    allowed = sorted(allowed)
    return " or ".join(str(a) for a in allowed)


def _show(raw: bytes) -> str:
    from .text import show

    return show(raw)


def _fmt(x: float) -> str:
    return str(int(x)) if np.isfinite(x) and x == int(x) else repr(float(x))


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
    and the problem (``g.mtx:4: row index must be ...``). Indices are exact integers.
    """
    buf = file_buffer(path)
    head = mtx_plan(path, buf)
    part = mtx_range(path, buf, 0, len(buf), head)
    return mtx_graph(path, head, part, duplicates, lambda i: part_line(buf, part, i))


def mtx_plan(path, buf):
    """``(field, symmetry, (rows, cols, entries), TextPlan)`` of a Matrix Market file."""
    from .edgelist import TextPlan
    from .text import Dialect

    head = bytes(buf[: min(len(buf), 1 << 16)])
    field, symmetry, size, pos, _line = _mtx_header(path, head if len(buf) > len(head) else
                                                    bytes(buf))  # fmt: skip
    if pos >= len(head) and len(buf) > len(head):  # comments past 64 KiB: read them all
        field, symmetry, size, pos, _line = _mtx_header(path, bytes(buf))
    ncols = 2 if field == "pattern" else 3
    plan = TextPlan(pos, Dialect("whitespace"), ncols, None, True)
    return field, symmetry, size, plan


def mtx_range(path, buf, lo, hi, head):
    """The entries of the lines starting in ``[lo, hi)`` of a Matrix Market body."""
    from . import _text_kernels as K
    from .edgelist import parse_numeric_range

    field, _, _, plan = head
    part = parse_numeric_range(path, buf, lo, hi, plan, strict=False)
    if part.status == K.TEXT:
        line = part.line
        raise InputError(
            f"{path}:{line}: {'row' if part.field == 0 else 'column'} index must be an "
            f"integer: {_show(part.text)}"
        )
    return part


def part_line(buf, part, i) -> int:
    from .edgelist import record_line

    return record_line(buf, part.lo, i)


def mtx_graph(path, head, part, duplicates, where) -> Graph:
    """The :class:`Graph` of a Matrix Market file's entries (all of them, in file order)."""
    field, symmetry, (nr, nc, nnz), _ = head
    rows, cols, w = part.rows, part.cols, part.vals
    if rows.size != nnz:
        raise InputError(f"{path}: size line says {nnz} entries, found {rows.size}")
    for name, col, bound in (("row", rows, nr), ("column", cols, nc)):
        bad = (col < 1) | (col > bound)
        if col.size and bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"{path}:{where(i)}: {name} index must be an integer in 1..{bound}, got {col[i]}"
            )
    rows -= 1  # in place: the parsed arrays are this reader's own
    cols -= 1
    if w is not None:
        bad = np.flatnonzero(~np.isfinite(w))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}:{where(i)}: weight is {w[i]} (must be finite)")
        if field == "integer" and (w != np.floor(w)).any():
            i = int(np.flatnonzero(w != np.floor(w))[0])
            raise InputError(f"{path}:{where(i)}: value {_fmt(float(w[i]))} in an integer file")
    lines = where
    if symmetry != "general":
        if nr != nc:
            raise InputError(f"{path}:1: a {symmetry} matrix must be square, size is {nr}x{nc}")
        upper = rows < cols
        if upper.any():
            i = int(np.flatnonzero(upper)[0])
            raise InputError(
                f"{path}:{where(i)}: entry ({rows[i] + 1}, {cols[i] + 1}) above the diagonal "
                f"in a {symmetry} file (only the lower triangle is stored)"
            )
        off = np.flatnonzero(rows != cols)
        sign = -1.0 if symmetry == "skew-symmetric" else 1.0
        mirror_w = None if w is None else sign * w[off]
        n0 = rows.size
        rows, cols = np.concatenate((rows, cols[off])), np.concatenate((cols, rows[off]))
        lines = lambda i: where(i if i < n0 else int(off[i - n0]))  # noqa: E731
        if w is not None:
            w = np.concatenate((w, mirror_w))
    mat = build_csr(path, rows, cols, w, (nr, nc), duplicates, lines)
    return Graph(mat, field != "pattern", os.fspath(path), index_base=1, validate=False)


# --- HDF5 graph layout -----------------------------------------------------------------------


def read_graph_h5(path) -> Graph:
    """Read the ``mpisdnn.graph`` HDF5 layout (see docs/projection.md) and validate it."""
    from ..hdf5 import reading

    path = os.fspath(path)
    with reading(path, GRAPH_FORMAT) as f:
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
    with h5py.File(image, "w", libver=H5_LIBVER) as f:
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


# one keyword per documented reader option (the command line's flags)
def read_graph(path, fmt="auto", index_base=None, skip_lines=0,  # noqa: PLR0913
               duplicates="sum", shape=None, ids="auto", sep="auto", header=None):  # fmt: skip
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
        Lines to skip at the start of edge lists and ratings files.
    duplicates : {"sum", "error"}
        Repeated edges: add their weights (default) or reject the file naming the line.
    shape : (int, int), optional
        Size of edge-list graphs (default: largest id + 1).
    ids : {"auto", "index", "label"}
        How edge-list and ratings ids map to indices (see :func:`.edgelist.map_ids`).
    sep : {"auto", "tab", "comma", "semicolon", "whitespace", "::"}
        How edge-list fields split (see :mod:`.text`; ``auto`` only where it is certain).
    header : bool, optional
        The first record of an edge list is a header (True), data (False), or detected.

    Returns
    -------
    Graph

    Raises
    ------
    InputError
        ``path:line: problem`` for malformed text, or ``path: problem`` for HDF5 files.
    """
    check_read_args(path, fmt, index_base, skip_lines, duplicates, shape, ids, sep, header)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "h5":
        return read_graph_h5(path)
    if fmt == "mtx":
        return read_mtx(path, duplicates)
    return read_edge_list(path, fmt, index_base, skip_lines, duplicates, shape, ids, sep, header)


def write_graph(path, graph, fmt="auto", index_base=None) -> None:
    """Write a :class:`Graph` (or a sparse matrix) as graph HDF5, Matrix Market or TSV/CSV.

    ``auto`` picks by extension (:data:`mpisdnn.formats.names.EXTENSIONS`): ``.mtx``/``.mm``
    Matrix Market, ``.tsv``/``.txt`` TSV, ``.csv`` CSV, anything else HDF5 (the command line
    refuses a name that gives no format).
    """
    if not isinstance(graph, Graph):
        mat = sp.csr_matrix(graph, dtype=np.float64)
        mat.sum_duplicates()
        mat.eliminate_zeros()
        graph = Graph(mat, not bool(np.all(mat.data == 1)), "")
    if fmt == "auto":
        from ..names import format_of_name

        fmt = format_of_name(path, GRAPH_OUTPUTS) or "h5"
    if fmt == "h5":
        write_graph_h5(path, graph)
    elif fmt in ("mtx", "tsv", "csv"):
        write_graph_text(path, graph, fmt, index_base)
    else:
        raise UsageError(f"unknown output format {fmt!r} (h5, mtx, tsv or csv)")


def check_read_args(path, fmt, index_base, skip_lines, duplicates, shape, ids, sep,  # noqa: PLR0913
                    header):  # fmt: skip - read_graph's arguments, each checked
    """The arguments of :func:`read_graph`, each named when wrong."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise UsageError(f"path must be a file name, got {type(path).__name__}")
    if fmt not in INPUT_FORMATS:
        raise UsageError(f"unknown input format {fmt}; choose one of {', '.join(INPUT_FORMATS)}")
    if index_base not in (None, 0, 1):
        raise UsageError(f"index_base must be 0 or 1, got {index_base}")
    if not isinstance(skip_lines, (int, np.integer)) or skip_lines < 0:
        raise UsageError(f"skip_lines must be an integer >= 0, got {skip_lines}")
    if duplicates not in ("sum", "error"):
        raise UsageError(f"duplicates must be 'sum' or 'error', got {duplicates}")
    if ids not in ID_MODES:
        raise UsageError(f"ids must be one of {', '.join(ID_MODES)}, got {ids}")
    if sep not in SEPARATORS:
        raise UsageError(f"sep must be one of {', '.join(SEPARATORS)}, got {sep}")
    if header not in (None, True, False):
        raise UsageError(f"header must be true, false or left unset (detected), got {header}")
    if shape is not None:
        try:
            ok = len(shape) == 2 and all(int(x) == x and x >= 0 for x in shape)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ShapeError(f"shape must be two integers >= 0, got {shape}")

