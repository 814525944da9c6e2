"""Graphs from tables (pandas, pyarrow, mappings of arrays) and the checks on what callers give.

pandas and pyarrow are never imported here: a table is recognised by what it offers
(``DataFrame.columns``, ``Table.column_names``), so neither is a dependency.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ...errors import InputError, ShapeError, UsageError

__all__ = [
    "check_graph",
    "check_read_args",
    "graph_from_edges",
    "is_table",
    "table_columns",
]


def is_table(obj) -> bool:
    """A pandas DataFrame or a pyarrow Table (or anything shaped like one)."""
    return hasattr(obj, "column_names") or (hasattr(obj, "columns") and hasattr(obj, "iloc"))


def table_columns(obj) -> list:
    """The column names of a DataFrame, a Table or a mapping."""
    if hasattr(obj, "column_names"):
        return [str(c) for c in obj.column_names]
    if hasattr(obj, "columns"):
        return [str(c) for c in obj.columns]
    return [str(k) for k in obj.keys()]


def _column(edges, name, what):
    """One column as a 1-D numpy array (object for text), or an InputError naming it."""
    names = table_columns(edges)
    if name not in names:
        raise InputError(
            f"edges: no column {name!r} for {what} (columns: {', '.join(names) or 'none'}); "
            f"pass {what}=<column name>"
        )
    if hasattr(edges, "column_names"):  # pyarrow Table
        col = edges.column(name)
        if col.null_count:
            raise InputError(f"edges[{name!r}] has {col.null_count} missing values")
        arr = col.to_numpy()
    elif hasattr(edges, "iloc"):  # pandas DataFrame
        col = edges[name]
        if getattr(col, "ndim", 1) != 1:
            raise InputError(f"edges: column {name!r} is not one column (repeated name?)")
        missing = int(col.isna().sum())
        if missing:
            raise InputError(f"edges[{name!r}] has {missing} missing values (NaN/None)")
        arr = col.to_numpy()
    else:
        value = edges[name]
        # a list keeps its Python types (np.asarray(["x", 3]) would make "3" a string)
        listed = isinstance(value, (list, tuple))
        arr = np.array(value, dtype=object) if listed else np.asarray(value)
    if arr.ndim != 1:
        raise ShapeError(f"edges[{name!r}] must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def _ids(arr, name):
    """``(indices, labels)`` of an id column: integers sorted numerically, text by code
    points. Floats, booleans, missing and mixed values are refused (ids are exact)."""
    kind = arr.dtype.kind
    if kind in "iu":
        if kind == "u" and arr.size and int(arr.max()) >= 2**63:
            labels, inverse = np.unique(arr, return_inverse=True)
            return inverse.ravel().astype(np.int64), labels
        labels, inverse = np.unique(arr.astype(np.int64), return_inverse=True)
        return inverse.ravel().astype(np.int64), labels
    if kind in "US":
        arr = arr.astype(str)
        labels, inverse = np.unique(arr, return_inverse=True)
        return inverse.ravel().astype(np.int64), labels
    if kind == "O":
        values = arr.tolist()
        types = {type(x) for x in values}
        if types <= {str}:
            labels, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
            wide = max((len(x) for x in labels.tolist()), default=1) > 256
            return inverse.ravel().astype(np.int64), (
                labels if wide else np.array(labels.tolist(), dtype=str)
            )
        if types <= {int, np.int64} and values:
            if min(values) >= -(2**63) and max(values) < 2**63:
                return _ids(np.array(values, dtype=np.int64), name)
            raise InputError(f"edges[{name!r}]: integer ids beyond int64; pass them as text")
        if any(x is None or (isinstance(x, float) and x != x) for x in values):
            raise InputError(f"edges[{name!r}] has missing values (NaN/None)")
        if types <= {int, float}:
            raise InputError(
                f"edges[{name!r}] holds floats; ids must be integers or text (convert them)"
            )
        found = ", ".join(sorted(t.__name__ for t in types))
        raise InputError(f"edges[{name!r}]: ids of mixed types ({found}); use one type")
    if kind == "f":
        raise InputError(
            f"edges[{name!r}] holds floats ({arr.dtype}); ids must be integers or text "
            "(convert with .astype('int64') or .astype(str))"
        )
    raise InputError(f"edges[{name!r}]: ids of dtype {arr.dtype} (integers or text)")


def graph_from_edges(edges, source="source", target="target", weight=None, duplicates="sum"):
    """:meth:`Graph.from_edges` (see there)."""
    from .graph import Graph, _build

    if duplicates not in ("sum", "error"):
        raise UsageError(f"duplicates must be 'sum' or 'error', got {duplicates}")
    if not (is_table(edges) or hasattr(edges, "keys")):
        raise InputError(
            f"edges: expected a pandas DataFrame, a pyarrow Table or a mapping of arrays, "
            f"got {type(edges).__name__}"
        )
    src = _column(edges, source, "source")
    dst = _column(edges, target, "target")
    if src.size != dst.size:
        raise ShapeError(f"edges: {source!r} has {src.size} values, {target!r} {dst.size}")
    w = None
    if weight is not None:
        w = _column(edges, weight, "weight")
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
    rows, row_labels = _ids(src, source)
    cols, col_labels = _ids(dst, target)
    shape = (row_labels.size, col_labels.size)
    mat = _build("edges", rows, cols, w, shape, duplicates, np.arange(rows.size))
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


def check_graph(g) -> None:
    """A :class:`Graph` built by a caller: a 2-D numeric matrix (made canonical CSR float64
    on a copy), labels of the right length and distinct."""
    from ...errors import InputError as _IE

    m = g.matrix
    if not sp.issparse(m):
        arr = np.asarray(m)
        if arr.ndim != 2:
            raise ShapeError(f"Graph: matrix must be 2-D, got shape {tuple(arr.shape)}")
        m = arr
    if m.ndim != 2:
        raise ShapeError(f"Graph: matrix must be 2-D, got shape {tuple(m.shape)}")
    if m.dtype.kind not in "iufb":
        raise _IE(f"Graph: matrix values must be numbers, got dtype {m.dtype}")
    mat = sp.csr_matrix(m, dtype=np.float64, copy=True)
    if mat.nnz and not np.isfinite(mat.data).all():
        raise _IE("Graph: matrix holds NaN or infinite weights")
    mat.sum_duplicates()
    mat.eliminate_zeros()
    mat.sort_indices()
    g.matrix = mat
    g.row_labels = _labels_ok(g.row_labels, mat.shape[0], "row_labels")
    g.col_labels = _labels_ok(g.col_labels, mat.shape[1], "col_labels")
    if g.index_base not in (0, 1):
        raise UsageError(f"Graph: index_base must be 0 or 1, got {g.index_base}")


def check_read_args(path, fmt, index_base, skip_lines, duplicates, shape, ids, sep,  # noqa: PLR0913
                    header):  # fmt: skip - read_graph's arguments, each checked
    """The arguments of :func:`read_graph`, each named when wrong."""
    from .edgelist import ID_MODES
    from .graph import INPUT_FORMATS
    from .text import SEPARATORS

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
        raise UsageError(f"header must be True, False or None, got {header}")
    if shape is not None:
        try:
            ok = len(shape) == 2 and all(int(x) == x and x >= 0 for x in shape)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ShapeError(f"shape must be two integers >= 0, got {shape}")
