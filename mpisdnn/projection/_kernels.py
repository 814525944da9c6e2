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

Modes: 0 count, 1 ratio, 2 jaccard, 3 overlap, 8 binary cosine (integer accumulators); 4
product, 5 newman, 6 hive, 7 cosine (float64 accumulators). Cosine is the product scaled by
``1 / (nrm[u] nrm[v])`` at emission; when every input weight is 1 the products are counts, so
the integer kernel computes them (mode 8) and gives the same bits as the float one.

``top_k`` keeps a bounded heap of ``k`` entries per row in the thread's scratch (root: the
weakest kept entry, the smallest weight and, among equal weights, the largest column), fed by
the emit step as entries come out in column order, so the full row is never written anywhere;
the ``k`` survivors are then written in column order.

The arrays travel in named groups (:class:`Csr`, :class:`Rule`, :class:`Tuning`,
:class:`Scratch`, :class:`Chunk`), as scipy hands grouped arrays to its compiled kernels;
numba compiles one specialisation per combination of their element types.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import overload

from ._simd import LANES, prefetch, sweep16

COUNT, RATIO, JACCARD, OVERLAP, PRODUCT, NEWMAN, HIVE, COSINE, BCOSINE = range(9)


class Csr(NamedTuple):
    """Rows of a CSR matrix as the kernels read them."""

    #: int64 row pointers.
    ptr: np.ndarray
    #: Column indices (int32 or int64).
    idx: np.ndarray
    #: float64 values, or a 1-entry placeholder where the weighting does not read them.
    val: np.ndarray
    #: Global index of the first row held (rows of ``B^T`` are a rank's slice).
    row0: int
    #: Rows of ``B^T`` for the upper triangle: where each entry ``(u, k)`` sits in row ``k``
    #: of ``B`` (int32, int64 past 2**31 input entries), so a segment starts there with no
    #: search; else (and for ``B`` itself) a 1-entry placeholder.
    pos: np.ndarray


class Rule(NamedTuple):
    """What an output row keeps and how it is weighed (the projection's options)."""

    #: One of COUNT ... HIVE.
    mode: int
    #: Upper triangle only (columns above the row).
    upper: bool
    #: Keep the diagonal entry ``H[u, u]``.
    keep_diag: bool
    #: Whether ``min_w`` applies.
    use_min: bool
    min_w: float
    #: Keep the ``top_k`` largest entries of a row (0: all).
    top_k: int
    #: int64 degree of every output column (count family).
    deg: np.ndarray
    #: newman's ``1 / (deg(k) - 1)`` per input row (0 where ``deg(k) <= 1``).
    kfac: np.ndarray
    #: Number of input rows (``ratio``'s denominator), as float64.
    n_other: float
    #: float64 ``sqrt(sum_k B[k, u]^2)`` per output column (cosine), else a 1-entry placeholder.
    nrm: np.ndarray
    #: Top-k from the upper triangle (:mod:`mpisdnn.projection.topk`): ``k`` of the heaps every
    #: emitted entry is offered to, for both of its rows (``Scratch.m_*``); 0: none.
    mirror: int


class Tuning(NamedTuple):
    """Path choices that never change a result (see :class:`ProjectionOptions`)."""

    #: A row is accumulated without bookkeeping when ``dense_ratio * flops >= range``.
    dense_ratio: float
    #: Else its ``t`` distinct columns are emitted by one sweep when ``sweep_ratio * t >= range``.
    sweep_ratio: float
    #: Between the two: the row marks its columns in a bitmap while accumulating and emits
    #: the set bits when ``mark_ratio * flops >= range / 64`` (bitmap words).
    mark_ratio: float


class Scratch(NamedTuple):
    """Per-thread work arrays, one row per thread (``numba.get_thread_id()``)."""

    #: Accumulators: int32/int64 for the count family, float64 otherwise.
    acc: np.ndarray
    #: uint64 bitmap of touched columns (always left cleared).
    bits: np.ndarray
    #: Touched-column lists (one spare slot: the branch-free store runs one ahead).
    tl: np.ndarray
    #: uint8 touched flags of the float modes (float sums may be 0); 1 column otherwise.
    seen: np.ndarray
    #: ``top_k`` candidates: columns and values, typed as the output's (``Chunk.idx``, ``.val``).
    sc_idx: np.ndarray
    sc_val: np.ndarray
    #: With ``Rule.mirror = k``: a heap of ``k`` entries per row of the whole matrix (columns
    #: ``m_idx``, weights ``m_val``, ``n * k`` each), its size ``m_cnt`` and root weight
    #: ``m_root`` (``-inf`` while not full); see :func:`offer_row`. 1-entry placeholders else.
    m_idx: np.ndarray
    m_val: np.ndarray
    m_cnt: np.ndarray
    m_root: np.ndarray


class Chunk(NamedTuple):
    """One chunk of output rows ``row0 + [blk_rows[0], blk_rows[-1])`` and where they go.

    ``work[i]`` is the flop count of row ``row0 + i`` (picks the dense or sparse path). Block
    ``b`` covers rows ``[blk_rows[b], blk_rows[b + 1])`` and writes from ``blk_cap[b]`` on,
    with one spare slot (the branch-free emit stores one entry past the last one it keeps);
    ``row_cnt[i]`` receives the entries written for row ``row0 + i`` and ``blk_cnt[b]`` those
    of block ``b``. ``val`` is integer for ``count``, float64 otherwise.
    """

    row0: int
    work: np.ndarray
    blk_rows: np.ndarray
    blk_cap: np.ndarray
    idx: np.ndarray
    val: np.ndarray
    row_cnt: np.ndarray
    blk_cnt: np.ndarray


@njit(cache=True, inline="always")
def _segment(b_ptr, t_idx, t_pos, p, upper, skip):
    """Entries ``[s, e)`` of row ``k = t_idx[p]`` of ``B`` that output row ``u`` adds: all of
    them, or for the upper triangle those after ``u``'s own entry in row ``k``, at
    ``t_pos[p]`` (from ``skip = 0`` with the diagonal, 1 without): no search needed."""
    k = t_idx[p]
    e = b_ptr[k + 1]
    if upper:
        return t_pos[p] + skip, e
    return b_ptr[k], e


#: Rows of ``B`` fetched ahead by :func:`_fetch_ahead` (in neighbour-list order).
AHEAD = 6


@njit(cache=True, inline="always")
def _fetch_ahead(b_ptr, arr, t_idx, t_pos, p, p1, upper, skip):
    """Prefetch every cache line of ``arr`` (``B``'s indices or values) in the segment that
    entry ``p + AHEAD`` of a row of ``B^T`` will add (see :func:`_segment`), when there is
    one: the rows of ``B`` come in neighbour-list order, so each line would otherwise be a
    cache miss (the hardware prefetcher catches on only after a few lines of a row)."""
    q = p + AHEAD
    if q < p1:
        k = t_idx[q]
        s = t_pos[q] + skip if upper else b_ptr[k]
        for j in range(s, b_ptr[k + 1], 64 // arr.itemsize):
            prefetch(arr, j)


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
def _weaker(wa, va, wb, vb):
    """Whether entry ``(wa, va)`` ranks below ``(wb, vb)``: a smaller weight, or an equal
    weight at a larger column (ties go to the smaller column)."""
    return wa < wb or (wa == wb and va > vb)


@njit(cache=True, inline="always")
def _heap_push(h_idx, h_val, base, m, k, v, x):
    """Offer entry ``(v, x)`` to the bounded min-heap ``h_*[base:base + m]`` of at most ``k``
    entries (root: the weakest kept). Returns the new size."""
    if m < k:
        # sift up from the new leaf
        c = m
        while c > 0:
            p = (c - 1) >> 1
            if not _weaker(x, v, h_val[base + p], h_idx[base + p]):
                break
            h_idx[base + c] = h_idx[base + p]
            h_val[base + c] = h_val[base + p]
            c = p
        h_idx[base + c] = v
        h_val[base + c] = x
        return m + 1
    if not _weaker(h_val[base], h_idx[base], x, v):
        return m  # no stronger than the weakest kept: the common case, one comparison
    # replace the root and sift down
    c = 0
    while True:
        lc = 2 * c + 1
        if lc >= m:
            break
        rc = lc + 1
        if rc < m:
            r, q = base + rc, base + lc
            if _weaker(h_val[r], h_idx[r], h_val[q], h_idx[q]):
                lc = rc
        if not _weaker(h_val[base + lc], h_idx[base + lc], x, v):
            break
        h_idx[base + c] = h_idx[base + lc]
        h_val[base + c] = h_val[base + lc]
        c = lc
    h_idx[base + c] = v
    h_val[base + c] = x
    return m


@njit(cache=True, inline="always")
def _heap_out(h_idx, h_val, m, out_idx, out_val, pos):
    """Write the ``m`` kept entries in column order from ``out[pos]`` on; returns ``m``."""
    # insertion sort by column: m <= k is small, and heap order is already roughly sorted
    for i in range(m):
        v = h_idx[i]
        x = h_val[i]
        j = i
        while j > 0 and out_idx[pos + j - 1] > v:
            out_idx[pos + j] = out_idx[pos + j - 1]
            out_val[pos + j] = out_val[pos + j - 1]
            j -= 1
        out_idx[pos + j] = v
        out_val[pos + j] = x
    return m


#: A row is accumulated without bookkeeping when ``DENSE_RATIO * flops >= columns in range``.
DENSE_RATIO = 0.25
#: Otherwise a row whose ``MARK_RATIO * flops`` reaches the range's bitmap words marks its
#: columns in a bitmap while accumulating and emits the set bits.
MARK_RATIO = 8.0
#: Otherwise its ``t`` distinct columns are emitted by one sweep of the range when
#: ``SWEEP_RATIO * t >= columns in range``, else by a bitmap scan or a sort of the list.
SWEEP_RATIO = 8.0


@njit(cache=True, inline="always")
def _mine(scratch, tid):
    """The calling thread's rows of the scratch arrays."""
    return Scratch(
        scratch.acc[tid],
        scratch.bits[tid],
        scratch.tl[tid],
        scratch.seen[tid],
        scratch.sc_idx[tid],
        scratch.sc_val[tid],
        scratch.m_idx[tid],
        scratch.m_val[tid],
        scratch.m_cnt[tid],
        scratch.m_root[tid],
    )


@njit(cache=True, inline="always")
def _span(i, bt, rule, out):
    """Output row ``u`` of chunk row ``i``, its row of ``B^T``, the ``skip`` of
    :func:`_segment` (past ``u`` itself unless the diagonal is kept) and the first column
    the row can hold."""
    u = out.row0 + i
    skip = 0 if rule.keep_diag else 1
    return u, u - bt.row0, skip, u + skip if rule.upper else 0


@njit(cache=True, inline="always")
def _weight_of(rule, c, u, v, du, dv):
    """Weight of count ``c`` between columns ``u`` and ``v`` of degrees ``du`` and ``dv``
    (count family)."""
    if rule.mode == COUNT:
        return float(c)
    if rule.mode == RATIO:
        return c / rule.n_other
    if rule.mode == JACCARD:
        return c / (du + dv - c)
    if rule.mode == OVERLAP:
        return c / min(du, dv)
    return c / (rule.nrm[u] * rule.nrm[v])  # binary cosine


@njit(cache=True, inline="always")
def _scaled(rule, s, u, v):
    """Weight of the float sum ``s`` of entry ``(u, v)``: cosine divides it by the norms, the
    other float weightings are their sums."""
    if rule.mode == COSINE:
        return s / (rule.nrm[u] * rule.nrm[v])
    return s


@njit(cache=True, inline="always")
def _emit(v, c, w, u, rule, idx, val, at):
    """Keep column ``v`` (count ``c``, weight ``w``) of row ``u`` at ``idx/val[at]`` if it
    passes ``min_weight`` and the self-loop rule. Returns the next cursor; with ``top_k`` the
    entry is offered to the row's heap in ``idx/val`` instead (``at`` is its size).

    The arrays come in unpacked: taken out of a named tuple per entry they would cost a
    reference count update each.
    """
    if (rule.use_min and w < rule.min_w) or (not rule.keep_diag and v == u):
        return at
    if rule.top_k > 0:
        return _heap_push(idx, val, 0, at, rule.top_k, v, c if rule.mode == COUNT else w)
    idx[at] = v
    val[at] = c if rule.mode == COUNT else w
    return at + 1


@njit(cache=True, inline="always")
def _count_dense(a, b, bt, ul, upper, skip):
    """Add the rows of ``B`` that row ``ul`` of ``B^T`` lists into ``a`` (plain increments;
    for the upper triangle only the columns after ``u``, see :func:`_segment`)."""
    b_ptr, b_idx, t_ptr, t_idx, t_pos = b.ptr, b.idx, bt.ptr, bt.idx, bt.pos
    p1 = t_ptr[ul + 1]
    for p in range(t_ptr[ul], p1):
        _fetch_ahead(b_ptr, b_idx, t_idx, t_pos, p, p1, upper, skip)
        s, e = _segment(b_ptr, t_idx, t_pos, p, upper, skip)
        for j in range(s, e):
            a[b_idx[j]] += 1


@njit(cache=True, inline="always")
def _count_listed(a, tl, b, bt, ul, upper, skip):
    """As :func:`_count_dense`, listing each first touch in ``tl``; returns how many."""
    b_ptr, b_idx, t_ptr, t_idx, t_pos = b.ptr, b.idx, bt.ptr, bt.idx, bt.pos
    t = 0
    p1 = t_ptr[ul + 1]
    for p in range(t_ptr[ul], p1):
        _fetch_ahead(b_ptr, b_idx, t_idx, t_pos, p, p1, upper, skip)
        s, e = _segment(b_ptr, t_idx, t_pos, p, upper, skip)
        for j in range(s, e):
            # branch-free: first touches are too irregular to predict
            v = b_idx[j]
            c = a[v]
            tl[t] = v
            t += c == 0
            a[v] = c + 1
    return t


@njit(cache=True, inline="always")
def _count_marked(a, bits, b, bt, ul, upper, skip):
    """As :func:`_count_dense`, also marking every touched column in the bitmap ``bits``.

    Returns the smallest and largest touched column (``(a.size, -1)`` for none), read off
    the ends of the sorted segments, so :func:`_emit_marked` scans only the words between.
    """
    b_ptr, b_idx, t_ptr, t_idx, t_pos = b.ptr, b.idx, bt.ptr, bt.idx, bt.pos
    vmin = a.size
    vmax = -1
    p1 = t_ptr[ul + 1]
    for p in range(t_ptr[ul], p1):
        _fetch_ahead(b_ptr, b_idx, t_idx, t_pos, p, p1, upper, skip)
        s, e = _segment(b_ptr, t_idx, t_pos, p, upper, skip)
        if s < e:
            vmin = min(vmin, np.int64(b_idx[s]))
            vmax = max(vmax, np.int64(b_idx[e - 1]))
        for j in range(s, e):
            v = b_idx[j]
            a[v] += 1
            bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
    return vmin, vmax


@njit(cache=True, inline="always")
def _emit_marked(a, bits, span, u, rule, dst, at, floats):
    """Emit the marked columns between ``span = (vmin, vmax)`` in column order (one bitmap
    word at a time, set bits by trailing-zero count), clearing sums and marks. Count-family
    sums are weighed here; float sums (``floats``) are scaled (cosine) or are the weights."""
    vmin, vmax = span
    idx, val = dst
    deg = rule.deg
    du = deg[u]
    for wi in range(vmin >> 6, (vmax >> 6) + 1):
        word = bits[wi]
        if word != 0:
            bits[wi] = np.uint64(0)
            base = wi << 6
            while word != 0:
                v = base + np.int64(trailing_zeros(word))
                c = a[v]
                a[v] = 0
                x = _scaled(rule, c, u, v) if floats else _weight_of(rule, c, u, v, du, deg[v])
                at = _emit(v, c, x, u, rule, idx, val, at)
                word &= word - np.uint64(1)
    return at


@njit(cache=True, inline="always")
def _sweep_plain(a, u, lo, rule, out, pos):
    """Unfiltered counts: emit the non-zeros of ``a[lo:]`` in column order, 16 at a time."""
    o_idx, o_val = out.idx, out.val
    if not rule.keep_diag and not rule.upper:
        a[u] = 0
    tail = lo
    while tail + LANES <= a.size:
        pos += sweep16(a, tail, o_idx, o_val, pos)
        tail += LANES
    for v in range(tail, a.size):
        c = a[v]
        o_idx[pos] = v
        o_val[pos] = c
        pos += c != 0
        a[v] = 0
    return pos


def _count_row(i, at, b, bt, rule, tune, th, out):
    """Count-family row (modes 0-3, 8) of chunk row ``i``, emitted from cursor ``at``."""
    u, ul, skip, lo = _span(i, bt, rule, out)
    a, tl, deg = th.acc, th.tl, rule.deg
    n = a.size
    work = out.work[i]
    if tune.dense_ratio * work >= n - lo:
        # surely dense output: no bookkeeping
        _count_dense(a, b, bt, ul, rule.upper, skip)
        t = 0
        sweep = True
    elif work * tune.mark_ratio >= (n - lo) >> 6:
        # neither: mark touched columns in a bitmap and emit its set bits in order (cheaper
        # than listing first touches, and than a sweep over mostly empty columns)
        span = _count_marked(a, th.bits, b, bt, ul, rule.upper, skip)
        idx, val = (th.sc_idx, th.sc_val) if rule.top_k > 0 else (out.idx, out.val)
        return _emit_marked(a, th.bits, span, u, rule, (idx, val), at, False)
    else:
        t = _count_listed(a, tl, b, bt, ul, rule.upper, skip)
        # many duplicates make flops a poor guess of the output: decide on t
        sweep = tune.sweep_ratio * t >= n - lo
    if sweep and rule.mode == COUNT and not rule.use_min and rule.top_k == 0:
        return _sweep_plain(a, u, lo, rule, out, at)
    # top_k candidates gather in the thread's scratch, other entries go straight out
    idx, val = (th.sc_idx, th.sc_val) if rule.top_k > 0 else (out.idx, out.val)
    du = deg[u]
    if not sweep:
        _order_touched(tl, t, th.bits)
        for q in range(t):
            v = tl[q]
            c = a[v]
            a[v] = 0
            at = _emit(v, c, _weight_of(rule, c, u, v, du, deg[v]), u, rule, idx, val, at)
    else:
        # one sequential pass over the range emits the non-zeros in column order
        for v in range(lo, n):
            c = a[v]
            if c != 0:
                a[v] = 0
                at = _emit(v, c, _weight_of(rule, c, u, v, du, deg[v]), u, rule, idx, val, at)
    return at


def _float_row(i, at, b, bt, rule, tune, th, out):
    """Float-accumulated row (modes 4-7: product, newman, hive, cosine); see :func:`_count_row`.

    ``acc`` cannot tell which columns were touched (float sums may be 0): dense and listed
    rows flag them in ``th.seen``, marked rows in the bitmap ``th.bits``. Every term is added
    in ascending ``k`` order, so a row's value never depends on the rank, the chunk split or
    the path.
    """
    u, ul, skip, lo = _span(i, bt, rule, out)
    a, seen, tl, bits, kfac, mode = th.acc, th.seen, th.tl, th.bits, rule.kfac, rule.mode
    b_ptr, b_idx, b_val, t_ptr, t_idx, t_val = b.ptr, b.idx, b.val, bt.ptr, bt.idx, bt.val
    t_pos = bt.pos
    n = a.size
    work = out.work[i]
    dense = tune.dense_ratio * work >= n - lo
    marked = not dense and work * tune.mark_ratio >= (n - lo) >> 6
    t = 0
    vmin = n
    vmax = -1
    p1 = t_ptr[ul + 1]
    for p in range(t_ptr[ul], p1):
        _fetch_ahead(b_ptr, b_idx, t_idx, t_pos, p, p1, rule.upper, skip)
        if mode != NEWMAN:  # the weights are read too
            _fetch_ahead(b_ptr, b_val, t_idx, t_pos, p, p1, rule.upper, skip)
        k = t_idx[p]
        s, e = _segment(b_ptr, t_idx, t_pos, p, rule.upper, skip)
        wu = t_val[p] if mode != NEWMAN else 0.0
        fk = kfac[k] if mode == NEWMAN else 0.0
        if marked and s < e:
            vmin = min(vmin, np.int64(b_idx[s]))
            vmax = max(vmax, np.int64(b_idx[e - 1]))
        for j in range(s, e):
            v = b_idx[j]
            if mode == PRODUCT or mode == COSINE:
                term = wu * b_val[j]
            elif mode == NEWMAN:
                term = fk
            else:
                term = wu / (wu + b_val[j])
            a[v] += term
            if dense:
                seen[v] = 1
            elif marked:
                bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
            else:
                # branch-free first-touch bookkeeping
                f = seen[v]
                tl[t] = v
                t += f == 0
                seen[v] = 1
    idx, val = (th.sc_idx, th.sc_val) if rule.top_k > 0 else (out.idx, out.val)
    if marked:
        return _emit_marked(a, bits, (vmin, vmax), u, rule, (idx, val), at, True)
    if dense or tune.sweep_ratio * t >= n - lo:
        t = 0
        for v in range(lo, n):
            tl[t] = v
            t += seen[v] != 0
    else:
        _order_touched(tl, t, th.bits)
    for q in range(t):
        v = tl[q]
        w = a[v]
        a[v] = 0.0
        seen[v] = 0
        at = _emit(v, w, _scaled(rule, w, u, v), u, rule, idx, val, at)
    return at


def _row(i, at, b, bt, rule, tune, th, out):
    """One output row (compiled only: :func:`_pick_row` picks the implementation)."""
    raise NotImplementedError("compiled by numba only")


@overload(_row, jit_options={"error_model": "numpy"})
def _pick_row(i, at, b, bt, rule, tune, th, out):
    # integer accumulators are the count family, float64 ones the weighted modes. Not inlined
    # into the caller: only a function compiled on its own gets its inline="always" helpers
    # inlined (an inlined overload would call them), and a call per row costs nothing.
    # error_model "numpy" (no zero-division checks), as in the parallel kernel itself.
    acc = th.types[th.fields.index("acc")]
    return _count_row if isinstance(acc.dtype, types.Integer) else _float_row


@njit(cache=True, nogil=True, error_model="numpy")
def _block(blk, b, bt, rule, tune, th, out):
    """The rows of block ``blk``, written from ``out.blk_cap[blk]`` on by thread scratch
    ``th`` (see :func:`project_chunk`)."""
    pos = out.blk_cap[blk]
    for i in range(out.blk_rows[blk], out.blk_rows[blk + 1]):
        # with top_k the row's candidates gather in th.sc_*, else it is emitted in place
        at = _row(i, 0 if rule.top_k > 0 else pos, b, bt, rule, tune, th, out)
        if rule.top_k > 0:
            at = pos + _heap_out(th.sc_idx, th.sc_val, at, out.idx, out.val, pos)
        out.row_cnt[i] = at - pos
        if rule.mirror > 0:
            # offered while the row is still in cache; the next row reuses its slots
            heaps = (th.m_idx, th.m_val, th.m_cnt, th.m_root)
            offer_row(out.row0 + i, out.idx, out.val, pos, at, heaps, rule.mirror)
            continue
        pos = at
    out.blk_cnt[blk] = pos - out.blk_cap[blk]


@njit(parallel=True, cache=True, nogil=True)
def project_chunk(b, bt, rule, tune, scratch, out):
    """Rows ``out.row0 + [out.blk_rows[0], out.blk_rows[-1])`` of ``H`` into ``out``.

    ``b`` is ``B`` (rows k, columns u), ``bt`` this rank's rows of ``B^T`` (from global row
    ``bt.row0`` on); the accumulator type of ``scratch`` picks the count-family or the float
    kernel (integer accumulators for modes 0-3, float64 for 4-6). Blocks are claimed
    dynamically by the threads (call under ``numba.parallel_chunksize(1)``).
    """
    # One call per block, compiled apart: inside a prange loop numba drops the stores made
    # through a named tuple's field (numba issues 7135, 10338). The index is cast: the
    # loop's type inference sees an int64, its parallel lowering a uint64, and each would
    # compile its own _block (4.1-5.3 s more of a first run).
    for blk in prange(out.blk_rows.size - 1):
        _block(np.int64(blk), b, bt, rule, tune, _mine(scratch, numba.get_thread_id()), out)


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
def transpose_cols(ptr, idx, c0, c1, out_dtype_like, pos_dtype_like):
    """Pattern of columns ``[c0, c1)`` of a CSR matrix as CSC: ``(indptr, row indices,
    positions)``.

    Rows come out ascending within each column (filled in row order), so no sort is needed;
    ``out_dtype_like`` (a 0-length array) gives the index dtype. ``positions[p]`` is where
    entry ``p`` sits in the CSR arrays (its value is ``data[positions[p]]``), recorded when
    ``pos_dtype_like`` is non-empty (its dtype is theirs), else an empty array.
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
    with_pos = pos_dtype_like.size > 0
    pos = np.empty(cnt[c1 - c0] if with_pos else 0, pos_dtype_like.dtype)
    fill = cnt[:-1].copy()
    for k in range(m):
        for j in range(ptr[k], ptr[k + 1]):
            c = idx[j]
            if c0 <= c < c1:
                f = fill[c - c0]
                out[f] = k
                if with_pos:
                    pos[f] = j
                fill[c - c0] = f + 1
    return cnt, out, pos


@njit(cache=True, nogil=True)
def axis_sums(ptr, idx, data, n, by_col, squares):
    """Entries and (with ``squares``) the sum of squared values of every column
    (``by_col``, ``n`` columns) or row of a CSR matrix: ``(int64 counts, float64 sums)``.

    Each sum adds ``float64(x) * float64(x)`` in storage order, as
    ``np.bincount(ids, weights=data.astype(float64) ** 2)`` does, so the bits are the same;
    one pass without the temporaries (a 64-bit copy of the indices: page faults cost more
    than the counting on this VM). Without ``squares`` the sums are a 1-entry placeholder.
    """
    size = n if by_col else ptr.size - 1
    cnt = np.zeros(size, np.int64)
    sums = np.zeros(size if squares else 1, np.float64)
    for r in range(ptr.size - 1):
        for j in range(ptr[r], ptr[r + 1]):
            c = idx[j] if by_col else r
            cnt[c] += 1
            if squares:
                x = np.float64(data[j])
                sums[c] += x * x
    return cnt, sums


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


@njit(cache=True, inline="always")
def _offer(h_idx, h_val, h_cnt, h_root, k, x, v, w):
    """Offer column ``v`` of weight ``w`` to row ``x``'s heap ``h_*[x * k:]`` of at most ``k``.

    ``h_root[x]`` is the weight of the heap's root once it is full (``-inf`` before): an
    entry strictly below it is refused by that one comparison, without touching the heap,
    whose rows are far apart in memory. Equal weights go on to the heap (the column decides).
    """
    if w < h_root[x]:
        return
    m = _heap_push(h_idx, h_val, x * k, h_cnt[x], k, v, w)
    h_cnt[x] = m
    if m == k:
        h_root[x] = h_val[x * k]


@njit(cache=True, inline="always")
def offer_row(u, idx, val, lo, hi, heaps, k):
    """Top-k from the upper triangle: offer every entry ``(u, v)`` of row ``u``'s upper part
    (``idx/val[lo:hi]``) to row ``u``'s heap as column ``v`` and to row ``v``'s as column
    ``u`` (the weightings are symmetric: ``H[v, u]`` is the same bits).

    ``heaps`` = ``(idx, val, cnt, root)`` of the calling thread: ``n * k``, ``n * k``, ``n``
    and ``n`` entries (root weights, ``-inf`` while a heap is not full). Each thread keeps the
    top ``k`` of the entries it saw; their union holds the top ``k`` of every row
    (:func:`merge_heaps`).
    """
    h_idx, h_val, h_cnt, h_root = heaps
    for j in range(lo, hi):
        v = idx[j]
        w = val[j]
        _offer(h_idx, h_val, h_cnt, h_root, k, u, v, w)
        if v != u:
            _offer(h_idx, h_val, h_cnt, h_root, k, v, u, w)


@njit(cache=True, nogil=True)
def _merge_row(r, s_idx, s_val, s_cnt, k, o_idx, o_val, order):
    """Row ``r``'s top ``k`` of the candidates of every source into ``o_*[r * k:]``; with
    ``order`` they are then put in column order. Returns how many."""
    base = r * k
    m = 0
    for s in range(s_cnt.shape[0]):
        for j in range(base, base + s_cnt[s, r]):
            m = _heap_push(o_idx, o_val, base, m, k, s_idx[s, j], s_val[s, j])
    if order and m > 1:
        perm = np.argsort(o_idx[base : base + m])
        ci = o_idx[base : base + m][perm]
        cv = o_val[base : base + m][perm]
        o_idx[base : base + m] = ci
        o_val[base : base + m] = cv
    return m


@njit(parallel=True, cache=True, nogil=True)
def merge_heaps(s_idx, s_val, s_cnt, k, o_idx, o_val, o_cnt, order):
    """Per row ``r``, the top ``k`` (weight, then smaller column) of the candidate lists
    ``s_*[s, r * k : r * k + s_cnt[s, r]]`` of every source ``s`` (threads or ranks) into
    ``o_*[r * k:]`` and ``o_cnt[r]``; ``order``: in column order. The top ``k`` of a union is
    the top ``k`` of the parts' top ``k``s, whatever the split: the same rows at any rank
    and thread count."""
    for r in prange(o_cnt.size):  # the index cast as in project_chunk: one _merge_row
        o_cnt[r] = _merge_row(np.int64(r), s_idx, s_val, s_cnt, k, o_idx, o_val, order)
