"""Networks whose float32 sums could overflow, refused before any layer runs.

A sum that passes float32's largest value becomes ``inf``, and ``inf - inf`` NaN; NaN then
meets ``max(z, 0)`` and ``min(z, ymax)``, which the backends evaluate differently (MATLAB's
``Z(Z<0)=0`` keeps it, a kernel testing ``z > 0`` drops it). Rather than define those
semantics in every hot kernel, a run is refused when a bound shows that overflow is
possible (docs/reliability.md, "float32 overflow"): for layer ``k`` every partial sum is at
most ``in_k * max_j sum_i |W_ij| + max |b|`` (:func:`~mpisdnn._checks.overflow_text`),
with ``in_k`` the largest ``|Y0|`` (over every rank) for the first layer run and after it
``ymax`` (Y is clipped to ``[0, ymax]``) or the layer before's bound, when smaller. Below
the bound no intermediate is non-finite, and the backends agree bit for bit.

Cost: nothing for layers of one weight value (the official ones) beyond their column
counts; one vectorised pass over the values otherwise. A network streamed from a v1 file
(:class:`~mpisdnn.sdnn.streaming.StreamingStore`) is not read twice: only its global layer 1
(the one that sees Y0) is checked here; the stream checks every later layer as it reads it
(:func:`~mpisdnn._checks.check_streamed_layer`), and an overflowing one stops the run there.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import layer_weight_bound, overflow_text
from ..errors import InputError
from ..parallel import AgreedError, allgather, allreduce, phase

__all__ = ["check_overflow", "input_bound"]

_NONE = 1 << 62


def input_bound(y) -> float:
    """The largest ``|y|`` of a scipy matrix (``inf`` when one is not finite; pure)."""
    data = np.asarray(y.data)
    if data.size == 0:
        return 0.0
    top = float(np.maximum(data.max(), -data.min()))
    return top if math.isfinite(top) else math.inf


@phase("setup")  # a check of what was loaded, before the timed part
def check_overflow(comm, y, parts) -> None:
    """Refuse the run when a float32 sum of a layer it runs can overflow (collective).

    Parameters
    ----------
    comm : mpi4py communicator
    y : scipy.sparse matrix
        This rank's rows entering the first layer run.
    parts : sequence of (WeightStore or None, int, int)
        ``(store, g0, start)``: this rank runs the store's layers ``[start, len(store))``,
        global layer ``g0 + k`` for store layer ``k``.

    Raises
    ------
    AgreedError
        On every rank, the same line: the lowest layer any rank found at risk.
    """
    parts = [(s, int(g0), int(k0)) for s, g0, k0 in parts if s is not None and k0 < len(s)]
    first = allreduce(comm, min([g0 + k0 for _, g0, k0 in parts], default=_NONE), "min")
    y_top = allreduce(comm, input_bound(y), "max")
    found = None
    for store, g0, k0 in parts:
        found = found or _first_overflow(store, g0, k0, first, y_top)
    failures = [f for f in allgather(comm, found) if f is not None]
    if failures:
        raise AgreedError(min(failures)[1], InputError.exit_code)


def _first_overflow(store, g0, k0, first, y_top):
    """``(global layer, line)`` of the store's first layer at risk, or ``None``."""
    from .streaming import StreamingStore

    ymax = abs(float(store.ymax))
    bias_max = {}  # a uniform bias is one shared array on mapped stores: one pass for all
    out = math.inf  # the bound of the layer before, when this rank checked it
    for k in range(k0, len(store)):
        g = g0 + k
        if isinstance(store, StreamingStore) and g != 0:
            break  # checked by the stream as it reads (not read twice)
        layer = store.layer(k)
        got = bias_max.get(id(layer.bias))
        if got is None:  # the array is kept with its maximum: its id stays its own
            got = bias_max[id(layer.bias)] = (layer.bias, float(np.abs(layer.bias).max(initial=0)))
        b = got[1]
        top = y_top if g == first else min(ymax, out)  # Y is clipped to [0, ymax]
        c = layer_weight_bound(layer)
        text = overflow_text(g + 1, c, top, b)
        if text is not None:
            return g, text
        out = top * c[0] + b
    return None
