"""The per-element arithmetic of the GPU kernels, one source for the GPU, the simulator and CPU.

Every output of a layer is ``sum_j y[j] * w[j]`` over the weight column's inputs in ascending
order, each product and each partial sum rounded to float32 on its own (no fused multiply-add:
``fma`` rounds once, which changes the last bit and can flip a sum that lands on the ReLU
threshold). On the GPU the rounding is forced with libdevice's ``__fmul_rn``/``__fadd_rn``,
which NVVM never contracts. The CUDA simulator has no libdevice, and a CPU compiler does not
contract without fast-math, so there plain float32 ``*`` and ``+`` are the same operations.

:func:`make` builds the functions for one target; the kernels and the tests take them from
here, so the summation the tests check at full size is the one the kernels run.
"""

from __future__ import annotations

import os

__all__ = ["make", "simulated"]


def simulated() -> bool:
    """True when numba-cuda runs kernels in its Python simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def make(target: str):
    """``(column_sum, activate)`` compiled for ``target``: ``"cuda"`` (device functions) or
    ``"cpu"`` (numba ``njit``).

    ``column_sum(y, ybase, stride, widx, ioff, wval, voff, p0, p1, wconst, hasval)`` sums
    ``y[ybase + widx[ioff + p] * stride] * w`` for ``p`` in ``[p0, p1)``, in that order
    (``w = wval[voff + p]``, or ``wconst`` when ``hasval`` is false);
    ``activate(z, b, ymax)`` is the layer's bias-where-non-zero, ReLU and clip.
    """
    from numba import float32, int64, uint64

    if target == "cuda":
        from numba import cuda

        if simulated():

            def mul_rn(a, b):
                return a * b

            def add_rn(a, b):
                return a + b

        else:
            from numba.cuda import libdevice

            def mul_rn(a, b):
                return libdevice.fmul_rn(a, b)

            def add_rn(a, b):
                return libdevice.fadd_rn(a, b)

        jit = cuda.jit(device=True, inline=True) if not simulated() else cuda.jit(device=True)
    elif target == "cpu":
        from numba import njit

        def mul_rn(a, b):
            return a * b

        def add_rn(a, b):
            return a + b

        # No fastmath: LLVM then keeps every multiply and add separately rounded.
        jit = njit(inline="always")
    else:
        raise ValueError(f"unknown target {target!r}")

    mul_rn = jit(mul_rn)
    add_rn = jit(add_rn)

    @jit
    def load(y, ybase, stride, widx, ioff, p):
        # int64 first: a uint16 index times the stride must not wrap. Unsigned positions:
        # numba then emits no negative-index wraparound code in the hot loop.
        return y[uint64(ybase + int64(widx[uint64(ioff + p)]) * stride)]

    @jit
    def weight(wval, voff, p, wconst, hasval):
        return wval[uint64(voff + p)] if hasval else wconst

    # Flat arguments: called from the kernels' innermost loop, once per row and column.
    def column_sum(y, ybase, stride, widx, ioff, wval, voff, p0, p1, wconst, hasval):  # noqa: PLR0913
        acc = float32(0)
        p = p0
        # Eight loads first, then their eight sums in ascending order: the loads are
        # independent, so a GPU warp keeps eight L2 requests in flight instead of one (the
        # loop was latency-bound: 1.9x on an H200 at N=1024 with 64-row chunks, docs/gpu.md);
        # the rounding sequence is the plain loop's.
        while p + 8 <= p1:
            v0 = load(y, ybase, stride, widx, ioff, p)
            v1 = load(y, ybase, stride, widx, ioff, p + 1)
            v2 = load(y, ybase, stride, widx, ioff, p + 2)
            v3 = load(y, ybase, stride, widx, ioff, p + 3)
            v4 = load(y, ybase, stride, widx, ioff, p + 4)
            v5 = load(y, ybase, stride, widx, ioff, p + 5)
            v6 = load(y, ybase, stride, widx, ioff, p + 6)
            v7 = load(y, ybase, stride, widx, ioff, p + 7)
            acc = add_rn(acc, mul_rn(v0, weight(wval, voff, p, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v1, weight(wval, voff, p + 1, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v2, weight(wval, voff, p + 2, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v3, weight(wval, voff, p + 3, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v4, weight(wval, voff, p + 4, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v5, weight(wval, voff, p + 5, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v6, weight(wval, voff, p + 6, wconst, hasval)))
            acc = add_rn(acc, mul_rn(v7, weight(wval, voff, p + 7, wconst, hasval)))
            p += 8
        while p < p1:
            v = load(y, ybase, stride, widx, ioff, p)
            acc = add_rn(acc, mul_rn(v, weight(wval, voff, p, wconst, hasval)))
            p += 1
        return acc

    def activate(z, b, ymax):
        zero = float32(0)
        if z != zero:  # the bias only where Y W is non-zero: empty rows stay empty
            z = add_rn(z, b)
        if z < zero:
            z = zero
        if z > ymax:
            z = ymax
        return z

    return jit(column_sum), jit(activate)
