"""The graph a projection reads: any accepted input as a checked Graph, oriented, sized.

A :class:`~mpisdnn.formats.projection.graph.Graph`, a sparse or dense matrix or an edge-list
table becomes a checked ``Graph`` (:func:`_as_graph`, the caller's arrays never modified);
node counts the memory cannot hold are refused before anything sized by them is allocated
(:func:`_check_size`); ``B`` is the input oriented for the projected side (:func:`_oriented`).
Split from :mod:`mpisdnn.projection.core`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError, UsageError
from ..formats.projection.graph import Graph
from ..system import format_size
from . import plan
from . import weightings as W


def _as_graph(graph) -> Graph:
    """The input as a :class:`Graph`, checked: a Graph, a 2-D sparse or dense matrix of
    numbers, or an edge list (pandas DataFrame, pyarrow Table) with ``source`` and
    ``target`` columns (and ``weight`` when present)."""
    from ..formats.projection.frames import is_table, table_columns

    if isinstance(graph, Graph):
        return graph
    if is_table(graph):
        names = table_columns(graph)
        if "source" not in names or "target" not in names:
            raise InputError(
                f"graph: a table is taken as an edge list and needs 'source' and 'target' "
                f"columns (found: {', '.join(names)}); use Graph.from_edges(table, "
                "source=..., target=..., weight=...)"
            )
        return Graph.from_edges(graph, weight="weight" if "weight" in names else None)
    if isinstance(graph, dict):
        raise InputError("graph: a mapping of columns goes through Graph.from_edges(mapping)")
    if not sp.issparse(graph):
        arr = np.asarray(graph)
        if arr.ndim != 2:
            raise ShapeError(f"graph must be a 2-D matrix, got shape {tuple(arr.shape)}")
        if arr.dtype.kind not in "iufb":
            raise InputError(f"graph values must be numbers, got dtype {arr.dtype}")
    elif graph.ndim != 2:
        raise ShapeError(f"graph must be a 2-D matrix, got shape {tuple(graph.shape)}")
    elif graph.dtype.kind not in "iufb":
        raise InputError(f"graph values must be numbers, got dtype {graph.dtype}")
    mat = sp.csr_matrix(graph, dtype=np.float64)
    if mat.nnz and not np.isfinite(mat.data).all():
        raise InputError("graph holds NaN or infinite weights")
    if mat.has_canonical_format and mat.data.all():
        return Graph(mat, not bool(np.all(mat.data == 1)), "")
    if _shares_arrays(mat, graph):
        mat = mat.copy()  # canonicalise a copy, never the caller's matrix
    mat.sum_duplicates()
    mat.eliminate_zeros()
    mat.sort_indices()
    return Graph(mat, not bool(np.all(mat.data == 1)), "")


def _shares_arrays(mat, graph) -> bool:
    theirs = [getattr(graph, a, None) for a in ("indptr", "indices", "data")]
    theirs = [x for x in theirs if isinstance(x, np.ndarray)] or [np.asarray(graph)]
    return any(np.shares_memory(x, y) for x in (mat.indptr, mat.indices, mat.data) for y in theirs)


def _check_size(g: Graph, onto: str, mem: int, nthreads: int, top_k) -> None:
    """Refuse, before allocating anything sized by them, node counts the memory cannot hold.

    Sizes come from file headers (a Matrix Market size line, HDF5 attributes) and can claim
    billions of nodes for a handful of edges; the kernel's scratch grows with the projected
    side and the transposed input with the other.
    """
    rows, cols = (int(x) for x in g.matrix.shape)
    n, m = (cols, rows) if onto == "cols" else (rows, cols)
    # the least the kernel can run with (4-byte counts and indices); plan_chunks checks the
    # exact figure later, once the arrays sized by the real dtypes exist
    need = plan.scratch_bytes(n, nthreads, 4, 4, None) + 8 * (n + m + 2)
    if need > mem:
        raise UsageError(
            f"--memory-per-rank {format_size(mem)} is too small for "
            f"{g.source or 'the graph'}: {n} nodes to project onto ({m} on the other side) "
            f"need {format_size(need)} of kernel scratch (edge lists: --ids label "
            "compacts sparse ids)"
        )


def _oriented(graph: Graph, onto: str) -> sp.csr_matrix:
    b = graph.matrix if onto == "cols" else graph.matrix.T.tocsr()
    if not b.has_sorted_indices:
        b = b.copy()
        b.sort_indices()
    return b


def _prepare(graph, opts, nthreads):
    """The graph, with the checks every rank must agree on (memory, the weighting's input)."""
    g = _as_graph(graph)
    _check_size(g, opts.onto, int(opts.memory_per_rank), nthreads, opts.top_k)
    W.check_input(W.WEIGHTINGS[opts.weight], g, opts.onto)
    return g


def labels_of(g: Graph, onto: str):
    """The ids of the projected side (None: the indices are the ids)."""
    return g.col_labels if onto == "cols" else g.row_labels
