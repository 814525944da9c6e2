"""Numba kernels for the fused CPU layer (compiled on first use, cached on disk)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def row_bounds(yp, yi, wp, n):
    """Upper bound of each output row's nnz: min(N, sum of nnz of the W rows it touches)."""
    nrows = yp.size - 1
    ub = np.empty(nrows, np.int64)
    for r in prange(nrows):
        s = 0
        for jj in range(yp[r], yp[r + 1]):
            j = yi[jj]
            s += wp[j + 1] - wp[j]
        ub[r] = min(s, n)
    return ub


@njit(parallel=True, cache=True)
def fused_rows(yp, yi, yd, wp, wi, wd, bias, ymax, n, r0, r1, chunk_bounds, out_off, oi, od, cnt):
    """Rows ``[r0, r1)`` of one layer: Gustavson multiply, bias, ReLU, clip and zero-drop.

    Each row is written at ``out_off[r - r0]`` of ``oi``/``od`` and its length stored in
    ``cnt``. The result of a row depends only on that row, never on how rows are split over
    threads or ranks, so every rank count gives bit-identical output.
    """
    nchunks = chunk_bounds.size - 1
    zero = np.float32(0.0)
    top = np.float32(ymax)
    for c in prange(nchunks):
        acc = np.zeros(n, np.float32)
        seen = np.zeros(n, np.bool_)
        touched = np.empty(n, np.int32)
        for r in range(chunk_bounds[c], chunk_bounds[c + 1]):
            base = out_off[r - r0]
            flops = 0
            for jj in range(yp[r], yp[r + 1]):
                j = yi[jj]
                flops += wp[j + 1] - wp[j]
            k = 0
            if 2 * flops >= n:
                # Dense row: accumulate without bookkeeping, then one sorted sweep over N.
                for jj in range(yp[r], yp[r + 1]):
                    j = yi[jj]
                    v = yd[jj]
                    for kk in range(wp[j], wp[j + 1]):
                        acc[wi[kk]] += v * wd[kk]
                for col in range(n):
                    z = acc[col]
                    if z != zero:
                        acc[col] = zero
                        z += bias[col]
                        if z > zero:
                            oi[base + k] = col
                            od[base + k] = z if z < top else top
                            k += 1
            else:
                m = 0
                for jj in range(yp[r], yp[r + 1]):
                    j = yi[jj]
                    v = yd[jj]
                    for kk in range(wp[j], wp[j + 1]):
                        col = wi[kk]
                        if not seen[col]:
                            seen[col] = True
                            touched[m] = col
                            m += 1
                        acc[col] += v * wd[kk]
                touched[:m].sort()
                for t in range(m):
                    col = touched[t]
                    z = acc[col]
                    acc[col] = zero
                    seen[col] = False
                    if z != zero:
                        z += bias[col]
                        if z > zero:
                            oi[base + k] = col
                            od[base + k] = z if z < top else top
                            k += 1
            cnt[r - r0] = k


@njit(parallel=True, cache=True)
def compact(out_off, oi, od, cnt, indptr, ri, rd):
    """Copy each row's ``cnt`` entries from the scratch layout to the final CSR arrays."""
    for r in prange(cnt.size):
        src = out_off[r]
        dst = indptr[r]
        for t in range(cnt[r]):
            ri[dst + t] = oi[src + t]
            rd[dst + t] = od[src + t]
