"""Edge lists held in tables (pandas, pyarrow, mappings of arrays): columns and exact ids.

pandas and pyarrow are never imported here: a table is recognised by what it offers
(``DataFrame.columns``, ``Table.column_names``), so neither is a dependency.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError, ShapeError

__all__ = ["is_table", "table_columns", "column", "ids_of"]


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


def column(edges, name, what):
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
            raise InputError(f"edges[{name!r}] has {missing} missing values (NaN, NA or null)")
        arr = col.to_numpy()
    else:
        value = edges[name]
        # a list keeps its Python types (np.asarray(["x", 3]) would make "3" a string)
        listed = isinstance(value, (list, tuple))
        arr = np.array(value, dtype=object) if listed else np.asarray(value)
    if arr.ndim != 1:
        raise ShapeError(f"edges[{name!r}] must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def ids_of(arr, name):
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
        _no_empty(name, labels, inverse)
        return inverse.ravel().astype(np.int64), labels
    if kind == "O":
        values = arr.tolist()
        types = {type(x) for x in values}
        if types <= {str}:
            labels, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
            _no_empty(name, labels, inverse)
            wide = max((len(x) for x in labels.tolist()), default=1) > 256
            return inverse.ravel().astype(np.int64), (
                labels if wide else np.array(labels.tolist(), dtype=str)
            )
        if types <= {int, np.int64} and values:
            if min(values) >= -(2**63) and max(values) < 2**63:
                return ids_of(np.array(values, dtype=np.int64), name)
            raise InputError(f"edges[{name!r}]: integer ids beyond int64; pass them as text")
        if any(x is None or (isinstance(x, float) and x != x) for x in values):
            raise InputError(f"edges[{name!r}] has missing values (NaN, NA or null)")
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


def _no_empty(name, labels, inverse) -> None:
    """Refuse the empty text id (sorted first), as the file readers do: a missing id, not a
    node named ""."""
    if labels.size and labels[0] == "":
        n = int(np.count_nonzero(inverse.ravel() == 0))
        raise InputError(f"edges[{name!r}] has {n} empty id{'s' if n != 1 else ''} ('')")
