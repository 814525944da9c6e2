"""Numba kernels of the CPU backend (compiled on first use, cached on disk).

Layout: a *tile* holds ``LANES`` (16) rows of Y feature-major, ``tile[pos(j) * LANES + lane]``
with ``pos(j) = j + (j >> PAD_SHIFT)``. One vector op then advances 16 rows at once, and the
spare slot every 64 features stops the radix-net pattern (columns 64 apart, i.e. 4 KiB apart
in a tile) from mapping every access of a column to the same L1 set (measured 2x).

A layer is computed column by column ("pull", W in CSC): for output neuron ``c`` the 16 row
sums are accumulated in one register over W's column ``c`` in ascending input order ``j``, then
bias, ReLU and clip are applied in the register and the column is stored once. Compared with
the scatter ("push") form this needs no accumulator array, no touched list and no clearing,
and it keeps the canonical summation order: every output entry is the ascending-``j`` sum, with
extra ``0 * w`` terms for inputs that are zero in that row (adding a signed zero never changes a
float32 sum, and the sum starts at +0, so "numerically non-zero" is unchanged too).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ._simd import LANES, vactivate, vaxpy, vcompress, vcount, vload, vmuladd, vstore, vzero

#: One spare slot every ``2**PAD_SHIFT`` features of a tile (see the module docstring).
PAD_SHIFT = 6


def padded(n: int) -> int:
    """Slots per lane of a tile for ``n`` features: ``pos(n - 1) + 1``."""
    return n + ((n - 1) >> PAD_SHIFT) if n > 0 else 0


def slot_offsets(rows: np.ndarray) -> np.ndarray:
    """``pos(j) * LANES`` for input neurons ``j``: what the CSC row indices are stored as."""
    rows = np.asarray(rows, dtype=np.int64)
    return ((rows + (rows >> PAD_SHIFT)) * LANES).astype(np.int32)


@njit(cache=True, inline="always")
def _pos(c):
    return (c + (c >> PAD_SHIFT)) * LANES


@njit(cache=True, boundscheck=False)
def pull_tile(src, sb, dst, db, cp, cs, cd, order, shared, bias, top, n):
    """One layer for one tile: ``dst`` tile at ``db`` from ``src`` tile at ``sb``.

    ``cp, cs, cd`` is W in CSC with row indices stored as slot offsets (:func:`slot_offsets`).
    Output columns are computed in ``order`` (:func:`column_order`: columns reading the same
    inputs are adjacent, so their inputs stay in L1), four at a time so four independent add
    chains hide the add latency; where ``shared[q // 4]`` says the four read exactly the same
    inputs, each input vector is loaded once for all four. Entry indices are unsigned: numba
    then skips its negative-index wrap-around code (~10 scalar instructions per vector op).
    Returns the number of non-zeros per lane (float32 vector).
    """
    cnt = vzero()
    q = 0
    while q + 4 <= n:
        c0 = order[q]
        c1 = order[q + 1]
        c2 = order[q + 2]
        c3 = order[q + 3]
        s0 = np.uint64(cp[c0])
        s1 = np.uint64(cp[c1])
        s2 = np.uint64(cp[c2])
        s3 = np.uint64(cp[c3])
        e0 = np.uint64(cp[c0 + 1])
        e1 = np.uint64(cp[c1 + 1])
        e2 = np.uint64(cp[c2 + 1])
        e3 = np.uint64(cp[c3 + 1])
        a0 = vzero()
        a1 = vzero()
        a2 = vzero()
        a3 = vzero()
        if shared[q >> 2]:
            for t in range(e0 - s0):
                y = vload(src, sb + cs[s0 + t])
                a0 = vaxpy(a0, y, cd[s0 + t])
                a1 = vaxpy(a1, y, cd[s1 + t])
                a2 = vaxpy(a2, y, cd[s2 + t])
                a3 = vaxpy(a3, y, cd[s3 + t])
        else:
            m = min(min(e0 - s0, e1 - s1), min(e2 - s2, e3 - s3))
            for t in range(m):
                a0 = vmuladd(a0, src, sb + cs[s0 + t], cd[s0 + t])
                a1 = vmuladd(a1, src, sb + cs[s1 + t], cd[s1 + t])
                a2 = vmuladd(a2, src, sb + cs[s2 + t], cd[s2 + t])
                a3 = vmuladd(a3, src, sb + cs[s3 + t], cd[s3 + t])
            for kk in range(s0 + m, e0):
                a0 = vmuladd(a0, src, sb + cs[kk], cd[kk])
            for kk in range(s1 + m, e1):
                a1 = vmuladd(a1, src, sb + cs[kk], cd[kk])
            for kk in range(s2 + m, e2):
                a2 = vmuladd(a2, src, sb + cs[kk], cd[kk])
            for kk in range(s3 + m, e3):
                a3 = vmuladd(a3, src, sb + cs[kk], cd[kk])
        o0 = vactivate(a0, bias[c0], top)
        o1 = vactivate(a1, bias[c1], top)
        o2 = vactivate(a2, bias[c2], top)
        o3 = vactivate(a3, bias[c3], top)
        vstore(dst, db + _pos(c0), o0)
        vstore(dst, db + _pos(c1), o1)
        vstore(dst, db + _pos(c2), o2)
        vstore(dst, db + _pos(c3), o3)
        cnt = vcount(vcount(vcount(vcount(cnt, o0), o1), o2), o3)
        q += 4
    while q < n:
        c = order[q]
        a0 = vzero()
        for kk in range(np.uint64(cp[c]), np.uint64(cp[c + 1])):
            a0 = vmuladd(a0, src, sb + cs[kk], cd[kk])
        o0 = vactivate(a0, bias[c], top)
        vstore(dst, db + _pos(c), o0)
        cnt = vcount(cnt, o0)
        q += 1
    return cnt


def column_order(indptr, indices):
    """Order of W's columns for :func:`pull_tile`, and its "four share their inputs" flags.

    Radix-nets connect groups of 16 or 32 outputs to the same 32 inputs; computing such a
    group back to back keeps its inputs in L1 and lets one load serve four columns. Columns
    are sorted by (first input, degree, a hash of the input set), so equal sets end up
    adjacent; the flags are then checked exactly (a hash collision only costs locality).
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    rows = np.asarray(indices, dtype=np.int64)
    n = indptr.size - 1
    deg = np.diff(indptr)
    starts = np.minimum(indptr[:-1], max(rows.size - 1, 0))
    first = np.where(deg > 0, rows[starts] if rows.size else 0, -1)
    mixed = (rows.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        h = np.add.reduceat(mixed, starts) if rows.size else np.zeros(n, np.uint64)
    h = np.where(deg > 0, h, np.uint64(0))
    order = np.lexsort((h, deg, first)).astype(np.int64)
    return order, _shared_quads(indptr, rows, order)


@njit(cache=True)
def _shared_quads(indptr, rows, order):
    n = order.size
    out = np.zeros(n // 4, np.bool_)
    for g in range(n // 4):
        c0 = order[4 * g]
        s0 = indptr[c0]
        d = indptr[c0 + 1] - s0
        same = True
        for k in range(1, 4):
            c = order[4 * g + k]
            s = indptr[c]
            if indptr[c + 1] - s != d:
                same = False
                break
            for t in range(d):
                if rows[s + t] != rows[s0 + t]:
                    same = False
                    break
            if not same:
                break
        out[g] = same
    return out


@njit(parallel=True, cache=True, boundscheck=False)
def tile_group(
    ys,
    yl,
    yi,
    yd,
    chunk_bounds,
    cps,
    css,
    cds,
    orders,
    shareds,
    bias,
    k0,
    k1,
    ymax,
    n,
    prune,
    buf,
    out_base,
    oi,
    od,
    out_start,
    out_len,
    stats,
):
    """Layers ``[k0, k1)`` for every chunk of rows, each chunk staying in its thread's tiles.

    Parameters
    ----------
    ys, yl, yi, yd : row starts, row lengths, column indices, values of the input rows.
    chunk_bounds : int64, chunk ``c`` is input rows ``[chunk_bounds[c], chunk_bounds[c+1])``.
    cps, css, cds : typed lists of every layer's W in CSC (row indices as slot offsets).
    orders, shareds : typed lists of every layer's :func:`column_order`.
    bias : float32 (layers, n).  ``prune``: drop rows that died and repack the tiles.
    buf : float32 (threads, 2, tiles * slots * LANES) scratch; ping-pong tile buffers.
    out_base : int64 per chunk, where its output rows start in ``oi``/``od`` (room for
        ``rows * n`` entries; pages never written are never touched).
    out_start, out_len : int64 per input row; rows that died get length 0.
    stats : int64 (chunks, k1 - k0, 3): rows alive, non-zeros, tiles computed per layer.

    Rows never interact, so the result of a row is independent of the chunking, the thread
    count and the rank count (bit for bit).
    """
    nchunks = chunk_bounds.size - 1
    nl = k1 - k0
    top = np.float32(ymax)
    slots = n + ((n - 1) >> PAD_SHIFT)
    tsz = slots * LANES
    for c in prange(nchunks):
        tid = numba.get_thread_id()
        a = buf[tid, 0]
        b = buf[tid, 1]
        r0 = chunk_bounds[c]
        nr = chunk_bounds[c + 1] - r0
        ntile = (nr + LANES - 1) // LANES
        lane_row = np.full(ntile * LANES, -1, np.int64)
        cnt = np.zeros(ntile * LANES, np.float32)
        for q in range(ntile * tsz):
            a[q] = 0.0
        for i in range(nr):
            r = r0 + i
            out_len[r] = 0
            lane_row[i] = r
            base = (i // LANES) * tsz + i % LANES
            s = ys[r]
            for jj in range(s, s + yl[r]):
                j = yi[jj]
                a[base + _pos(j)] = yd[jj]
        live = ntile
        for layer in range(nl):
            k = k0 + layer
            cp = cps[k]
            cs = css[k]
            cd = cds[k]
            order = orders[k]
            shared = shareds[k]
            bl = bias[k]
            for t in range(live):
                tb = t * tsz
                cnt_t = pull_tile(a, tb, b, tb, cp, cs, cd, order, shared, bl, top, n)
                vstore(cnt, t * LANES, cnt_t)
            a, b = b, a
            alive = 0
            nnz = 0
            for i in range(live * LANES):
                if cnt[i] > 0:
                    alive += 1
                    nnz += np.int64(cnt[i])
            stats[c, layer, 0] = alive
            stats[c, layer, 1] = nnz
            stats[c, layer, 2] = live
            if prune and alive <= (live - 1) * LANES:
                live = _repack(a, tsz, n, live, lane_row, cnt)
                if live == 0:
                    break
        # Surviving rows, in row order, packed at the start of the chunk's output slot.
        pos = out_base[c]
        order = np.argsort(lane_row[: live * LANES])
        for i in order:
            r = lane_row[i]
            if r < 0:
                continue
            out_start[r] = pos
            if cnt[i] == 0:  # died in the last layer, not repacked out
                continue
            base = (i // LANES) * tsz + i % LANES
            for c0 in range(0, n - LANES + 1, LANES):
                pos += vcompress(a, base + _pos(c0), oi, od, pos, c0)
            for col in range(n - n % LANES, n):  # N not a multiple of 16
                v = a[base + _pos(col)]
                if v != 0.0:
                    oi[pos] = col
                    od[pos] = v
                    pos += 1
            out_len[r] = pos - out_start[r]


@njit(cache=True, boundscheck=False)
def _repack(a, tsz, n, live, lane_row, cnt):
    """Free the chunk's last tiles by moving their live rows into dead lanes; returns tiles used.

    Only rows of the freed tiles move (the fewest copies; rows may change order, the output
    is written in row order). Dead lanes hold only zeros, so a moved lane is cleared behind.
    """
    alive = 0
    for i in range(live * LANES):
        if cnt[i] > 0:
            alive += 1
    keep = (alive + LANES - 1) // LANES
    hole = 0
    for i in range(keep * LANES, live * LANES):
        if cnt[i] > 0:
            while cnt[hole] > 0:
                hole += 1
            src = (i // LANES) * tsz + i % LANES
            dst = (hole // LANES) * tsz + hole % LANES
            for col in range(n):
                p = _pos(col)
                a[dst + p] = a[src + p]
                a[src + p] = 0.0
            lane_row[hole] = lane_row[i]
            cnt[hole] = cnt[i]
        lane_row[i] = -1
        cnt[i] = 0.0
    for i in range(keep * LANES):
        if cnt[i] == 0:
            lane_row[i] = -1
    return keep


@njit(parallel=True, cache=True, boundscheck=False)
def gather_rows(ys, yl, yi, yd, indptr, oi, od):
    """Copy rows (given by starts and lengths) into contiguous CSR arrays."""
    for r in prange(ys.size):
        s = ys[r]
        d = indptr[r]
        for t in range(yl[r]):
            oi[d + t] = yi[s + t]
            od[d + t] = yd[s + t]
