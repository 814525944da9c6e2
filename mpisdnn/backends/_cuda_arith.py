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

    # Flat arguments: called from the kernels' innermost loop, once per row and column.
    def column_sum(y, ybase, stride, widx, ioff, wval, voff, p0, p1, wconst, hasval):  # noqa: PLR0913
        acc = float32(0)
        for p in range(p0, p1):
            # int64 first: a uint16 index times the stride must not wrap. Unsigned positions:
            # numba then emits no negative-index wraparound code in the hot loop.
            j = int64(widx[uint64(ioff + p)])
            w = wval[uint64(voff + p)] if hasval else wconst
            acc = add_rn(acc, mul_rn(y[uint64(ybase + j * stride)], w))
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
