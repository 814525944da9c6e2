"""Numba kernels of the projection: Gustavson row-by-row ``H = B^T B`` with fused filters.

Output row ``u`` (a column of ``B``) is ``sum over k in N(u) of row k of B``. Each thread owns a
dense accumulator (``acc``), a bitmap of touched columns (``bits``) and a list of touched
columns (``tl``). After a row, the touched columns are put in order either by scanning the
bitmap words between the smallest and largest touched column (dense rows: O(range/64 + t)) or
by sorting the list (sparse rows: O(t log t)), whichever is cheaper for that row. The emit step
applies the self-loop rule, ``min_weight`` and ``top_k`` before anything is written, and
clears the accumulator, so nothing is materialised that is filtered out.

Rows are processed in blocks (contiguous rows, balanced by flops); block ``b`` writes its rows
compactly into its own region ``[cap[b], cap[b+1])`` of the output buffers, sized by an upper
bound of its rows' entries, so threads never share a write cursor. ``compact`` then closes the
gaps between blocks.

Modes: 0 count, 1 ratio, 2 jaccard, 3 overlap (integer accumulators); 4 product, 5 newman,
6 hive (float64 accumulators).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import trailing_zeros

from ._simd import LANES, sweep16

COUNT, RATIO, JACCARD, OVERLAP, PRODUCT, NEWMAN, HIVE = range(7)


@njit(cache=True, inline="always")
def _first_above(idx, lo, hi, u):
    """First position ``p`` in ``[lo, hi)`` with ``idx[p] > u`` (``idx`` sorted)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if idx[mid] <= u:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def _segment(b_ptr, b_idx, k, upper, lim):
    """Entries ``[s, e)`` of row ``k`` of ``B`` that output row ``u`` adds: all of them, or
    for the upper triangle only the columns above ``lim`` (one binary search)."""
    s = b_ptr[k]
    e = b_ptr[k + 1]
    if upper:
        s = _first_above(b_idx, s, e, lim)
    return s, e


@njit(cache=True, inline="always")
def _order_touched(tl, t, bits):
    """Put the ``t`` distinct touched columns ``tl[:t]`` in ascending order.

    Dense rows scan a bitmap of the touched columns between the smallest and largest one
    (``O(range / 64 + t)``), sparse rows sort the list (``O(t log t)``), whichever is cheaper.
    """
    if t <= 1:
        return
    vmin = tl[0]
    vmax = tl[0]
    for q in range(1, t):
        v = tl[q]
        vmin = min(vmin, v)
        vmax = max(vmax, v)
    w0 = vmin >> 6
    w1 = vmax >> 6
    logt = 1
    while (1 << logt) < t:
        logt += 1
    if w1 - w0 + 1 <= t * logt:
        for q in range(t):
            v = tl[q]
            bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
        i = 0
        for w in range(w0, w1 + 1):
            word = bits[w]
            if word != 0:
                bits[w] = np.uint64(0)
                base = w << 6
                while word != 0:
                    tl[i] = base + np.int64(trailing_zeros(word))
                    i += 1
                    word &= word - np.uint64(1)
    else:
        tl[:t].sort()


@njit(cache=True, inline="always")
def _top_k(sc_idx, sc_val, m, k, out_idx, out_val, pos):
    """Write the ``k`` largest of ``m`` candidates (ties: smaller column first), column order."""
    if m <= k:
        for i in range(m):
            out_idx[pos + i] = sc_idx[i]
            out_val[pos + i] = sc_val[i]
        return m
    # candidates are in column order, so a stable sort by -weight breaks ties by column
    order = np.argsort(-sc_val[:m], kind="mergesort")
    sel = np.sort(order[:k])
    for i in range(k):
        j = sel[i]
        out_idx[pos + i] = sc_idx[j]
        out_val[pos + i] = sc_val[j]
    return k


#: A row is accumulated without bookkeeping when ``DENSE_RATIO * flops >= columns in range``.
DENSE_RATIO = 4.0
#: Otherwise its ``t`` distinct columns are emitted by one sweep of the range when
#: ``SWEEP_RATIO * t >= columns in range``, else by a bitmap scan or a sort of the list.
SWEEP_RATIO = 8.0


@njit(cache=True, inline="always")
def _weight_of(mode, c, du, dv, n_other):
    if mode == COUNT:
        return float(c)
    if mode == RATIO:
        return c / n_other
    if mode == JACCARD:
        return c / (du + dv - c)
    return c / min(du, dv)


@njit(cache=True, inline="always")
def _keep(v, u, w, keep_diag, use_min, min_w):
    if use_min and w < min_w:
        return False
    return keep_diag or v != u


@njit(parallel=True, cache=True, nogil=True)
def count_chunk(
    bt_ptr,
    bt_idx,
    bt_row0,
    b_ptr,
    b_idx,
    row0,
    work,
    blk_rows,
    blk_cap,
    upper,
    keep_diag,
    mode,
    use_min,
    min_w,
    top_k,
    deg,
    n_other,
    acc,
    bits,
    tls,
    sc_idx,
    sc_val,
    out_idx,
    out_val,
    row_cnt,
    blk_cnt,
    dense_ratio,
    sweep_ratio,
):
    """Count-family rows ``row0 + [blk_rows[0], blk_rows[-1])`` (modes 0-3).

    ``bt_*`` hold the rows of ``B^T`` from global row ``bt_row0`` on; ``work[i]`` is the flop
    count of row ``row0 + i`` (picks the dense or sparse path); ``out_val`` is integer for
    ``count`` and float64 otherwise; ``row_cnt[i]`` receives the entries written for row
    ``row0 + i`` and ``blk_cnt[b]`` those of block ``b``. Every block region has one spare
    slot (the branch-free emit stores one entry past the last one it keeps).
    """
    n = acc.shape[1]
    nblocks = blk_rows.size - 1
    plain = mode == COUNT and not use_min and top_k == 0
    for b in prange(nblocks):
        tid = numba.get_thread_id()
        a = acc[tid]
        bt = bits[tid]
        tl = tls[tid]
        si = sc_idx[tid]
        sv = sc_val[tid]
        pos = blk_cap[b]
        for i in range(blk_rows[b], blk_rows[b + 1]):
            u = row0 + i
            ul = u - bt_row0
            lim = u - 1 if keep_diag else u
            lo = lim + 1 if upper else 0
            start = pos
            m = 0
            du = deg[u]
            t = 0
            if dense_ratio * work[i] >= n - lo:
                # surely dense output: plain increments, no bookkeeping
                for p in range(bt_ptr[ul], bt_ptr[ul + 1]):
                    k = bt_idx[p]
                    s, e = _segment(b_ptr, b_idx, k, upper, lim)
                    for j in range(s, e):
                        a[b_idx[j]] += 1
                sweep = True
            else:
                for p in range(bt_ptr[ul], bt_ptr[ul + 1]):
                    k = bt_idx[p]
                    s, e = _segment(b_ptr, b_idx, k, upper, lim)
                    for j in range(s, e):
                        # branch-free: first touches are too irregular to predict
                        v = b_idx[j]
                        c = a[v]
                        tl[t] = v
                        t += c == 0
                        a[v] = c + 1
                # many duplicates make flops a poor guess of the output: decide on t
                sweep = sweep_ratio * t >= n - lo
            if sweep:
                # one sequential pass over the range emits the non-zeros in column order
                if plain:
                    if not keep_diag and not upper:
                        a[u] = 0
                    tail = lo
                    while tail + LANES <= n:
                        pos += sweep16(a, tail, out_idx, out_val, pos)
                        tail += LANES
                    for v in range(tail, n):
                        c = a[v]
                        out_idx[pos] = v
                        out_val[pos] = c
                        pos += c != 0
                        a[v] = 0
                else:
                    for v in range(lo, n):
                        c = a[v]
                        if c == 0:
                            continue
                        a[v] = 0
                        w = _weight_of(mode, c, du, deg[v], n_other)
                        if not _keep(v, u, w, keep_diag, use_min, min_w):
                            continue
                        if top_k > 0:
                            si[m] = v
                            sv[m] = w
                            m += 1
                        else:
                            out_idx[pos] = v
                            out_val[pos] = c if mode == COUNT else w
                            pos += 1
            else:
                _order_touched(tl, t, bt)
                for q in range(t):
                    v = tl[q]
                    c = a[v]
                    a[v] = 0
                    w = _weight_of(mode, c, du, deg[v], n_other)
                    if not _keep(v, u, w, keep_diag, use_min, min_w):
                        continue
                    if top_k > 0:
                        si[m] = v
                        sv[m] = w
                        m += 1
                    else:
                        out_idx[pos] = v
                        out_val[pos] = c if mode == COUNT else w
                        pos += 1
            if top_k > 0:
                pos += _top_k(si, sv, m, top_k, out_idx, out_val, pos)
            row_cnt[i] = pos - start
        blk_cnt[b] = pos - blk_cap[b]


@njit(parallel=True, cache=True, nogil=True)
def float_chunk(
    bt_ptr,
    bt_idx,
    bt_val,
    bt_row0,
    b_ptr,
    b_idx,
    b_val,
    row0,
    work,
    blk_rows,
    blk_cap,
    upper,
    keep_diag,
    mode,
    use_min,
    min_w,
    top_k,
    kfac,
    acc,
    seens,
    bits,
    tls,
    sc_idx,
    sc_val,
    out_idx,
    out_val,
    row_cnt,
    blk_cnt,
    dense_ratio,
    sweep_ratio,
):
    """Float-accumulated rows (modes 4-6: product, newman, hive); see :func:`count_chunk`.

    ``seens`` is a per-thread uint8 touched flag (``acc`` cannot tell: float sums may be 0).
    ``kfac[k]`` is newman's ``1 / (deg(k) - 1)`` (0 where ``deg(k) <= 1``). Every term is
    added in ascending ``k`` order, so a row's value never depends on the rank or chunk split.
    """
    n = acc.shape[1]
    nblocks = blk_rows.size - 1
    for b in prange(nblocks):
        tid = numba.get_thread_id()
        a = acc[tid]
        bt = bits[tid]
        tl = tls[tid]
        si = sc_idx[tid]
        sv = sc_val[tid]
        seen = seens[tid]
        pos = blk_cap[b]
        for i in range(blk_rows[b], blk_rows[b + 1]):
            u = row0 + i
            ul = u - bt_row0
            lim = u - 1 if keep_diag else u
            lo = lim + 1 if upper else 0
            dense = dense_ratio * work[i] >= n - lo
            start = pos
            m = 0
            t = 0
            for p in range(bt_ptr[ul], bt_ptr[ul + 1]):
                k = bt_idx[p]
                s, e = _segment(b_ptr, b_idx, k, upper, lim)
                wu = bt_val[p] if mode != NEWMAN else 0.0
                fk = kfac[k] if mode == NEWMAN else 0.0
                for j in range(s, e):
                    v = b_idx[j]
                    if mode == PRODUCT:
                        term = wu * b_val[j]
                    elif mode == NEWMAN:
                        term = fk
                    else:
                        term = wu / (wu + b_val[j])
                    a[v] += term
                    if dense:
                        seen[v] = 1
                    else:
                        # branch-free first-touch bookkeeping
                        f = seen[v]
                        tl[t] = v
                        t += f == 0
                        seen[v] = 1
            if dense or sweep_ratio * t >= n - lo:
                t = 0
                for v in range(lo, n):
                    tl[t] = v
                    t += seen[v] != 0
            else:
                _order_touched(tl, t, bt)
            for q in range(t):
                v = tl[q]
                w = a[v]
                a[v] = 0.0
                seen[v] = 0
                if not _keep(v, u, w, keep_diag, use_min, min_w):
                    continue
                if top_k > 0:
                    si[m] = v
                    sv[m] = w
                    m += 1
                else:
                    out_idx[pos] = v
                    out_val[pos] = w
                    pos += 1
            if top_k > 0:
                pos += _top_k(si, sv, m, top_k, out_idx, out_val, pos)
            row_cnt[i] = pos - start
        blk_cnt[b] = pos - blk_cap[b]


@njit(cache=True)
def row_work(ptr, idx, n, upper, keep_diag):
    """Flops per output row (see :func:`mpisdnn.projection.plan.row_work`), in one pass."""
    work = np.zeros(n, np.int64)
    for k in range(ptr.size - 1):
        s = ptr[k]
        e = ptr[k + 1]
        d = e - s
        for j in range(s, e):
            work[idx[j]] += (e - j - 1 + keep_diag) if upper else d
    return work


@njit(cache=True)
def transpose_cols(ptr, idx, c0, c1, out_dtype_like):
    """Pattern of columns ``[c0, c1)`` of a CSR matrix as CSC: ``(indptr, row indices)``.

    Rows come out ascending within each column (filled in row order), so no sort is needed;
    ``out_dtype_like`` (a 0-length array) gives the index dtype.
    """
    m = ptr.size - 1
    cnt = np.zeros(c1 - c0 + 1, np.int64)
    for j in range(ptr[m]):
        c = idx[j]
        if c0 <= c < c1:
            cnt[c - c0 + 1] += 1
    for c in range(c1 - c0):
        cnt[c + 1] += cnt[c]
    out = np.empty(cnt[c1 - c0], out_dtype_like.dtype)
    fill = cnt[:-1].copy()
    for k in range(m):
        for j in range(ptr[k], ptr[k + 1]):
            c = idx[j]
            if c0 <= c < c1:
                out[fill[c - c0]] = k
                fill[c - c0] += 1
    return cnt, out


@njit(cache=True, nogil=True)
def compact(out_idx, out_val, blk_cap, blk_cnt):
    """Move every block's entries left so the chunk is contiguous; returns the entry count.

    Sequential on purpose: a block's destination can overlap the previous block's source.
    """
    pos = 0
    for b in range(blk_cnt.size):
        s = blk_cap[b]
        n = blk_cnt[b]
        if s != pos:
            for j in range(n):
                out_idx[pos + j] = out_idx[s + j]
                out_val[pos + j] = out_val[s + j]
        pos += n
    return pos


@njit(parallel=True, cache=True, nogil=True)
def gather_blocks(src_idx, src_val, blk_cap, blk_cnt, dst_idx, dst_val, pos):
    """Copy block ``b``'s entries from ``src[blk_cap[b]:]`` to ``dst`` behind ``pos``, in order
    (in parallel: the destinations are known from the block counts). Returns the new end."""
    nb = blk_cnt.size
    start = np.empty(nb + 1, np.int64)
    start[0] = pos
    for b in range(nb):
        start[b + 1] = start[b] + blk_cnt[b]
    for b in prange(nb):
        s = blk_cap[b]
        d = start[b]
        for j in range(blk_cnt[b]):
            dst_idx[d + j] = src_idx[s + j]
            dst_val[d + j] = src_val[s + j]
    return start[nb]


@njit(cache=True)
def _digits(x):
    d = 1
    while x >= 10:
        x //= 10
        d += 1
    return d


@njit(cache=True)
def format_int_lines(rows, cols, vals, ncols, sep):
    """ASCII lines ``row<sep>col[<sep>val]\\n`` of non-negative-or-signed int64 columns."""
    n = rows.size
    size = 0
    for i in range(n):
        size += _digits(abs(rows[i])) + _digits(abs(cols[i])) + 2 + (rows[i] < 0) + (cols[i] < 0)
        if ncols == 3:
            size += _digits(abs(vals[i])) + 1 + (vals[i] < 0)
    out = np.empty(size, np.uint8)
    p = 0
    for i in range(n):
        for c in range(ncols):
            x = rows[i] if c == 0 else (cols[i] if c == 1 else vals[i])
            if x < 0:
                out[p] = 45
                p += 1
                x = -x
            d = _digits(x)
            q = p + d - 1
            while True:
                out[q] = 48 + x % 10
                x //= 10
                q -= 1
                if x == 0:
                    break
            p += d
            out[p] = sep if c < ncols - 1 else 10
            p += 1
    return out
