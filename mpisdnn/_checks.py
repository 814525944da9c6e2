"""Checks of what callers of the Python API give: shapes, dtypes, index ranges.

Each raises :class:`~mpisdnn.errors.ShapeError` or :class:`~mpisdnn.errors.InputError` naming
the argument, before any work (a Y with more columns than the network has neurons used to
run on the cpu backend and return wrong "categories"). Called at the top of the public entry
points (:func:`mpisdnn.sdnn.infer`, :func:`mpisdnn.sdnn.reference_inference`, ...); cheap:
no pass over the data beyond an index range check.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp

from .errors import InputError, ShapeError, UsageError

__all__ = [
    "check_matrix",
    "check_int",
    "check_bias",
    "check_infer_args",
    "check_reference_args",
    "check_layer_args",
    "layer_weight_bound",
    "overflow_text",
    "check_streamed_layer",
    "python_scalars",
]

#: The largest float32: a sum that passes it becomes ``inf`` (and ``inf - inf`` NaN).
F32_MAX = float(np.finfo(np.float32).max)


def check_matrix(name: str, x, cols=None, rows=None):
    """``x`` is a 2-D sparse or dense matrix of numbers (with ``cols`` columns / ``rows``
    rows when given); returns it, a nested list or other array-like as a numpy array."""
    if isinstance(x, (str, bytes)) or x is None:
        raise InputError(f"{name} must be a 2-D matrix of numbers, got {type(x).__name__}")
    if not sp.issparse(x):
        if hasattr(x, "iloc") or hasattr(x, "column_names"):
            raise InputError(f"{name} must be a matrix, not a table ({type(x).__name__})")
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as exc:  # ragged rows
            raise InputError(f"{name} is not a 2-D matrix of numbers ({exc})") from None
        shape, dtype = arr.shape, arr.dtype
        if not isinstance(x, np.ndarray) and not hasattr(x, "shape"):
            x = arr  # a list of rows: what scipy and the reference take too
    else:
        shape, dtype = x.shape, np.dtype(x.dtype)
    kind = dtype.kind
    if len(shape) != 2:
        raise ShapeError(f"{name} must be 2-D, got shape {tuple(int(s) for s in shape)}")
    if kind not in "iufb":
        raise InputError(f"{name} must hold numbers, got dtype {dtype}")
    if cols is not None and int(shape[1]) != int(cols):
        raise ShapeError(f"{name} has {int(shape[1])} columns, expected {int(cols)}")
    if rows is not None and int(shape[0]) != int(rows):
        raise ShapeError(f"{name} has {int(shape[0])} rows, expected {int(rows)}")
    return x


def check_int(name: str, value, low=None, high=None, optional=False):
    """An integer (not bool, not float) in ``[low, high]``; returns it as int."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise UsageError(f"{name} must be an integer, got {_plain(value)}")
    v = int(value)
    if low is not None and v < low:
        raise InputError(f"{name} must be >= {low}, got {v}")
    if high is not None and v > high:
        raise InputError(f"{name} must be <= {high}, got {v}")
    return v


def check_bias(name: str, bias, n: int):
    """A scalar or one value per neuron (``n``)."""
    arr = np.asarray(bias)
    if arr.dtype.kind not in "iuf":
        raise InputError(f"{name} must hold numbers, got dtype {arr.dtype}")
    if arr.ndim == 0 or arr.shape == (n,):
        return arr
    raise ShapeError(f"{name} has shape {tuple(arr.shape)}, expected a scalar or ({n},)")


def python_scalars(options) -> None:
    """Replace the numpy scalars among a (frozen) dataclass's fields by the Python values
    they stand for: ``np.int64(2)`` threads is ``2`` (it was refused as "must be a positive
    integer, got 2"), and a report serialises the options."""
    import dataclasses

    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, np.generic):
            object.__setattr__(options, f.name, value.item())


def _plain(v) -> str:
    """A value for a message, never a Python repr such as ``np.int64(3)``."""
    if isinstance(v, np.generic):
        v = v.item()
    return str(v) if not isinstance(v, str) else f"'{v}'"


def _neurons(network) -> int:
    n = getattr(network, "neurons", None)
    if n is None:
        raise InputError(
            f"network must be a Network or a WeightStore, got {type(network).__name__}"
        )
    return int(n)


def check_infer_args(network, y_local, row_offset, g_rows, start_layer, live_rows, block_rows):
    """:func:`mpisdnn.sdnn.infer`'s arguments (on this rank); returns ``y_local`` as
    :func:`check_matrix` gives it."""
    n = _neurons(network)
    y_local = check_matrix("y_local", y_local, cols=n)
    rows = int(y_local.shape[0])
    offset = check_int("row_offset", row_offset, low=0)
    check_int("g_rows", g_rows, low=0, optional=True)
    if g_rows is not None and offset + (block_rows or rows) > int(g_rows):
        raise ShapeError(
            f"y_local rows {offset}..{offset + (block_rows or rows) - 1} lie beyond g_rows "
            f"= {int(g_rows)}"
        )
    check_int("start_layer", start_layer, low=0, high=len(network))
    if live_rows is not None:
        block = check_int("block_rows", block_rows, low=0)
        ids = np.asarray(live_rows)
        if ids.ndim != 1 or ids.size != rows:
            raise ShapeError(f"live_rows has shape {tuple(ids.shape)}, expected ({rows},)")
        if ids.size and ids.dtype.kind not in "iu":
            raise InputError(f"live_rows must be integers, got dtype {ids.dtype}")
        if ids.size and (ids.min() < offset or ids.max() >= offset + block):
            raise InputError(
                f"live_rows must lie in {offset}..{offset + block - 1}, got "
                f"{int(ids.min())}..{int(ids.max())}"
            )
    return y_local


def check_reference_args(y0, network, layers):
    """:func:`mpisdnn.sdnn.reference_inference`'s arguments."""
    n = _neurons(network)
    check_matrix("y0", y0, cols=n)
    check_int("layers", layers, low=0, high=len(network), optional=True)


def check_layer_args(y, w, bias, ymax):
    """:func:`mpisdnn.sdnn.reference_layer`'s arguments."""
    check_matrix("w", w)
    check_matrix("y", y, cols=int(w.shape[0]))
    check_bias("bias", bias, int(w.shape[1]))
    if isinstance(ymax, (str, bytes)) or not np.isfinite(float(np.asarray(ymax))):
        raise InputError(f"ymax must be a finite number, got {_plain(ymax)}")


def layer_weight_bound(layer) -> tuple[float, float, int]:
    """``(C, w, m)`` of a :class:`~mpisdnn.weights.CompactLayer` (pure): ``C = max_j sum_i
    |W_ij|`` (float64, exact to rounding), the largest ``|w|`` and the most weights of one
    column. Free for a layer of one value (the official ones); one vectorised pass over the
    values otherwise. A NaN or infinite weight makes ``C`` NaN or infinite."""
    n = int(layer.neurons)
    ptr = None if layer.colptr is None else np.asarray(layer.colptr)
    if ptr is None:
        count = int(layer.per_col)
    else:
        count = int((ptr[1:] - ptr[:-1]).max()) if n else 0
    if layer.values is None:
        w = abs(float(layer.value)) if count else 0.0
        return w * count, w, count
    a = np.abs(np.asarray(layer.values), dtype=np.float64)  # float64: the sums stay finite
    if a.size == 0:
        return 0.0, 0.0, count
    if ptr is None:
        sums = a.reshape(n, count).sum(axis=1)
    else:
        sums = np.add.reduceat(a, ptr[:-1][ptr[1:] > ptr[:-1]])  # empty columns add nothing
    return float(sums.max()), float(a.max()), count


def overflow_text(layer_no, bound, in_bound, bias_max) -> str | None:
    """The one line refusing layer ``layer_no`` (1-based) when a float32 sum of it can reach
    ``inf``, else ``None`` (pure).

    ``bound`` is :func:`layer_weight_bound`'s ``(C, w, m)``, ``in_bound`` the largest
    ``|y|`` entering the layer and ``bias_max`` the largest ``|b|``. Any partial sum of
    ``Y W`` in any order is at most ``in_bound * C`` in exact arithmetic; float32 rounding
    of the ``m`` products and sums and of the bias adds at most ``(1 + 2^-24)^(m + 2)``.
    Refused when that reaches float32's largest value, or when anything is not finite.
    """
    c, w, m = bound
    worst = (float(in_bound) * c + float(bias_max)) * math.exp((m + 2) * 2.0**-24) * (1 + 1e-12)
    if worst < F32_MAX:  # False for NaN too
        return None
    # what is not finite is named for itself (it was "weights up to ... can overflow", the
    # inputs' NaN in parentheses)
    undefined = "the backends' results would not be defined"
    if not math.isfinite(in_bound):
        return f"layer {int(layer_no)}: the inputs hold a NaN or an infinite value: {undefined}"
    if not (math.isfinite(w) and math.isfinite(c)):
        return f"layer {int(layer_no)}: a weight is NaN or infinite: {undefined}"
    if not math.isfinite(bias_max):
        return f"layer {int(layer_no)}: a bias is NaN or infinite: {undefined}"
    inputs = f"inputs up to {float(in_bound):.3g}"
    return (
        f"layer {int(layer_no)}: weights up to {w:.3g} with {m} per neuron can overflow "
        f"float32 ({inputs}, biases up to {float(bias_max):.3g}): the backends' results "
        f"would not be defined"
    )


def check_streamed_layer(layer, g: int, ymax: float) -> None:
    """A layer of a streamed network (global index ``g``) checked as the stream reads it,
    its inputs clipped to ``[0, ymax]`` (:mod:`mpisdnn.sdnn.overflow` checks global layer 1,
    which sees Y0, before the run). Raises :class:`InputError` on the reading rank."""
    if g == 0:
        return
    b = float(np.abs(layer.bias).max(initial=0))
    text = overflow_text(g + 1, layer_weight_bound(layer), abs(float(ymax)), b)
    if text is not None:
        raise InputError(text)
