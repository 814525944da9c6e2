"""The in-memory graph of projection inputs: :class:`Graph` (a canonical CSR adjacency with
optional node ids), its checks, and the one way triples become it (:func:`build_csr`)."""

from __future__ import annotations

from dataclasses import InitVar, dataclass

import numpy as np
import scipy.sparse as sp

from ...errors import InputError, ShapeError, UsageError, shown
from .frames import column, ids_of, is_table

__all__ = ["Graph", "build_csr", "small_empty", "graph_from_edges"]


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
        The ids of the rows and columns (index ``i`` is the ``i``-th smallest id: int64
        numerically, text by code points) when the input had its own ids; ``None`` when the
        ids are the indices (plus ``index_base``). Distinct, one per row / column.
    index_base : int
        The first id of an input whose ids are indices (1 for 1-based edge lists, ratings
        and Matrix Market): outputs write that side's ids with it.
    header : tuple of str, optional
        The column names of a text input's header line, when it had one.

    ``Graph(matrix, ...)`` checks what it is given (2-D sparse or dense numbers, labels of
    the right length and distinct) and raises :class:`ShapeError`/:class:`InputError`.
    """

    matrix: sp.csr_matrix
    weighted: bool
    source: str = ""
    row_labels: np.ndarray | None = None
    col_labels: np.ndarray | None = None
    index_base: int = 0
    header: tuple | None = None
    validate: InitVar[bool] = True

    def __post_init__(self, validate):
        if isinstance(self.weighted, np.bool_):
            self.weighted = bool(self.weighted)
        if not isinstance(self.weighted, bool):  # "yes" was taken as weighted, "" as not
            raise UsageError(f"Graph: weighted must be True or False, got {shown(self.weighted)}")
        if validate:
            # a caller's matrix and labels are checked before any use, and replaced by their
            # canonical forms (a copy: the caller's own matrix is never changed)
            self.matrix, self.row_labels, self.col_labels = _checked_parts(
                self.matrix, self.row_labels, self.col_labels, self.index_base
            )

    @property
    def shape(self):
        return self.matrix.shape

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)

    @property
    def labelled(self) -> bool:
        return self.row_labels is not None or self.col_labels is not None

    @classmethod
    def from_edges(cls, edges, source="source", target="target", weight=None,
                   duplicates="sum") -> Graph:  # fmt: skip
        """A graph from an edge list held in a pandas DataFrame, a pyarrow Table or a
        mapping of 1-D arrays (``{"source": [...], "target": [...]}``), like networkx's
        ``from_pandas_edgelist``.

        Rows are the distinct ``source`` ids, columns the distinct ``target`` ids, each in
        sorted order (numbers numerically, text by code points), kept as ``row_labels`` and
        ``col_labels``; projections of the graph are labelled by them.

        Parameters
        ----------
        edges : DataFrame, pyarrow.Table or mapping of arrays
        source, target : str
            Column names of the two ids (integers or text; not floats, not missing, not empty).
        weight : str, optional
            Column of finite numeric weights (default: every edge weighs 1).
        duplicates : {"sum", "error"}
            Repeated ``(source, target)`` pairs: weights added (scipy), or refused.

        Raises
        ------
        InputError
            A missing column, a missing, empty or float id, a non-finite weight, mixed id types,
            naming the argument and the column.
        """
        return graph_from_edges(edges, source, target, weight, duplicates)


def build_csr(path, rows, cols, w, shape, duplicates: str, lines=None) -> sp.csr_matrix:
    """Canonical CSR from triples (one compiled pass: a counting sort by row, columns sorted
    per row, repeats added in file order); zero weights are not edges and are dropped.

    ``lines`` is the record's line (an array, or a callable ``lines(i)``) for messages.
    """
    from ._text_kernels import coo_to_csr

    if w is not None:
        keep = w != 0
        if not keep.all():
            kept = np.flatnonzero(keep)
            rows, cols, w = rows[kept], cols[kept], w[kept]
            lines = _subset_lines(lines, kept)
    nr, nc = int(shape[0]), int(shape[1])
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    weighted = w is not None
    vals = np.asarray(w, dtype=np.float64) if weighted else np.empty(0, np.float64)
    narrow = max(nr, nc, rows.size) < 2**31
    idx = small_empty(rows.size, np.int32 if narrow else np.int64)
    val = small_empty(rows.size if weighted else 0, np.float64)
    indptr, nnz, dups = coo_to_csr(nr, rows, cols, vals, weighted, idx, val,
                                   np.zeros(nr + 1, np.int64))  # fmt: skip
    indices = idx[:nnz]
    data = val[:nnz] if weighted else np.ones(nnz, np.float64)
    if dups and duplicates == "error":
        key = rows * max(nc, 1) + cols
        order = np.argsort(key, kind="stable")
        dup = np.flatnonzero(np.diff(key[order]) == 0)
        i = int(order[dup[0] + 1])
        where = f"{path}:{_line(lines, i)}" if lines is not None else str(path)
        raise InputError(f"{where}: duplicate edge ({rows[i]}, {cols[i]})")
    idx = np.int32 if max(nr, nc, indices.size) < 2**31 else np.int64
    return sp.csr_matrix(
        (data, indices.astype(idx, copy=False), indptr.astype(idx, copy=False)), shape=(nr, nc)
    )


def small_empty(n: int, dtype) -> np.ndarray:
    """``np.empty`` on 4 KiB pages (first touch of huge pages costs ~4x on VMs that hand
    memory back to the host: 1.13 s against 0.26 s for 160 MB here; see system.small_pages)."""
    from ...system import small_pages

    arr = np.empty(int(n), dtype)
    if arr.nbytes >= 1 << 22:
        small_pages(arr)
    return arr


def _line(lines, i):
    return lines(i) if callable(lines) else lines[i]


def _subset_lines(lines, kept):
    if lines is None:
        return None
    if callable(lines):
        return lambda i: lines(int(kept[i]))
    return np.asarray(lines)[kept]


def graph_from_edges(edges, source="source", target="target", weight=None, duplicates="sum"):
    """:meth:`Graph.from_edges` (see there)."""
    if duplicates not in ("sum", "error"):
        raise UsageError(f"duplicates must be 'sum' or 'error', got {duplicates}")
    if not (is_table(edges) or hasattr(edges, "keys")):
        raise InputError(
            f"edges: expected a pandas DataFrame, a pyarrow Table or a mapping of arrays, "
            f"got {type(edges).__name__}"
        )
    src = column(edges, source, "source")
    dst = column(edges, target, "target")
    if src.size != dst.size:
        raise ShapeError(f"edges: {source!r} has {src.size} values, {target!r} {dst.size}")
    w = None
    if weight is not None:
        w = column(edges, weight, "weight")
        if w.size != src.size:
            raise ShapeError(f"edges: {weight!r} has {w.size} values, {source!r} {src.size}")
        if w.dtype.kind == "O" and all(
            isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in w.tolist()
        ):
            w = np.array(w.tolist(), dtype=np.float64)
        if w.dtype.kind not in "iufb":
            raise InputError(f"edges[{weight!r}]: weights must be numbers, got dtype {w.dtype}")
        w = w.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(w))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"edges[{weight!r}] row {i}: weight {w[i]} is not finite")
    rows, row_labels = ids_of(src, source)
    cols, col_labels = ids_of(dst, target)
    shape = (row_labels.size, col_labels.size)
    mat = build_csr("edges", rows, cols, w, shape, duplicates, np.arange(rows.size))
    return Graph(mat, w is not None, "edges", row_labels, col_labels, validate=False)


def _labels_ok(labels, size, name):
    if labels is None:
        return None
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size != size:
        raise ShapeError(f"Graph: {name} has shape {tuple(arr.shape)}, expected ({size},)")
    if arr.dtype.kind == "f":
        raise InputError(f"Graph: {name} are floats; labels must be integers or text")
    uniq = np.unique(arr)
    if uniq.size != arr.size:
        sorted_ = np.sort(arr)
        dup = sorted_[np.flatnonzero(sorted_[1:] == sorted_[:-1])[0]]
        raise InputError(f"Graph: {name} are not distinct ({dup} appears more than once)")
    return arr


def _checked_parts(m, row_labels, col_labels, index_base):
    """The parts of a :class:`Graph` built by a caller, checked: a 2-D numeric matrix (made
    canonical CSR float64 on a copy), labels of the right length and distinct, an index base
    of 0 or 1.

    Returns
    -------
    (scipy.sparse.csr_matrix, ndarray or None, ndarray or None)
        The canonical matrix and the labels as arrays.

    Raises
    ------
    ShapeError, InputError, UsageError
        One line naming the part.
    """
    if not sp.issparse(m):
        arr = np.asarray(m)
        if arr.ndim != 2:
            raise ShapeError(f"Graph: matrix must be 2-D, got shape {tuple(arr.shape)}")
        m = arr
    if m.ndim != 2:
        raise ShapeError(f"Graph: matrix must be 2-D, got shape {tuple(m.shape)}")
    if m.dtype.kind not in "iufb":
        raise InputError(f"Graph: matrix values must be numbers, got dtype {m.dtype}")
    mat = sp.csr_matrix(m, dtype=np.float64, copy=True)
    if mat.nnz and not np.isfinite(mat.data).all():
        raise InputError("Graph: matrix holds NaN or infinite weights")
    mat.sum_duplicates()
    mat.eliminate_zeros()
    mat.sort_indices()
    row_labels = _labels_ok(row_labels, mat.shape[0], "row_labels")
    col_labels = _labels_ok(col_labels, mat.shape[1], "col_labels")
    if index_base not in (0, 1):
        raise UsageError(f"Graph: index_base must be 0 or 1, got {index_base}")
    return mat, row_labels, col_labels


