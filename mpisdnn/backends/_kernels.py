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

W is read in the compact column-wise form of a weight store (:func:`pull_sets`), and columns
with the same inputs and weights (a radix-net's 16 outputs per residue class) are summed once
per *set* (:func:`column_sets`).

Sparse rows go through the push kernel instead (:func:`push_group`), one row at a time
through several layers: a row's state then stays in the thread's L1/L2 where a 16-row tile
(4 MiB at N=65536) streams from L3. It is exact too (the tile sum minus its ``+0`` terms).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import overload

from .._sort_kernels import argsort_small, heapsort
from ._simd import LANES, vactivate, vcompress, vcount, vmuladd, vstore, vzero

#: One spare slot every ``2**PAD_SHIFT`` features of a tile (see the module docstring).
PAD_SHIFT = 6
#: And one more every ``2**PAD2_SHIFT``: at N=65536 the 16 copies of a radix-net residue are
#: 4096 features apart, which the first padding alone maps to one L1 set (16 lines in a
#: 12-way set); the second spreads them over 16 sets.
PAD2_SHIFT = 12
#: Smallest N at which a radix-net's tiles are laid out by residue (:func:`tile_layout`).
ROTATE_NEURONS = 4096


def tile_layout(n: int, rot: int = 0) -> tuple:
    """How feature ``j`` maps to its slot of a tile.

    ``rot = 0``, the padded layout ``(0,)``: slot ``j`` plus the padding above.
    ``rot = r > 0`` (``n`` a power of two), ``(lowmask, r, lowbits)``: the index bits are
    rotated by ``r``, slot ``(j mod n/2^r) * 2^r + j div (n/2^r)``, with no padding. A
    radix-net's column set is ``{q + i n/2^r}`` with ``2^r`` members, fed by the members of
    one or two other sets, so this layout makes every set's inputs and outputs contiguous runs
    of ``2^r`` slots (a few streams per set instead of 48 strided lines). Any layout gives
    the same bits: it only decides where a value is kept. The two layouts are tuples of
    different lengths, so numba compiles each into its own kernel (no run-time switch in
    the inner loop).
    """
    if rot <= 0:
        return (np.uint64(0),)
    low = int(n).bit_length() - 1 - int(rot)
    if n & (n - 1) or low < 4:
        raise ValueError(f"a rotated tile layout needs a power of two >= 2^(rot+4), got {n}")
    return (np.uint64((1 << low) - 1), np.uint64(rot), np.uint64(low))


def layout_for_sets(n: int, sptr, scols) -> tuple:
    """The tile layout for a layer whose :func:`column_sets` are ``(sptr, scols)``.

    Rotated by ``r`` when ``n >= ROTATE_NEURONS`` is a power of two and the first set's
    members are ``{i n/2^r}``, ``4 <= 2^r <= n/16`` of them (a radix-net); padded otherwise.
    """
    n = int(n)
    first = np.asarray(scols[sptr[0] : sptr[1]], np.int64) if len(sptr) > 1 else scols[:0]
    m = first.size
    radix = n >= ROTATE_NEURONS and not n & (n - 1) and m >= 4 and not m & (m - 1)
    radix = radix and n // m >= 16 and len(sptr) - 1 == n // m
    if radix and np.array_equal(first, np.arange(m, dtype=np.int64) * (n // m)):
        return tile_layout(n, m.bit_length() - 1)
    return tile_layout(n)


def padded(n: int, lay: tuple | None = None) -> int:
    """Slots per lane of a tile for ``n`` features: ``pos(n - 1) + 1``."""
    if n <= 0:
        return 0
    if lay is not None and len(lay) == 3:
        return n
    return n + ((n - 1) >> PAD_SHIFT) + ((n - 1) >> PAD2_SHIFT)


def _uslot(j, lay):  # pragma: no cover - typed by the overload below
    raise NotImplementedError


@overload(_uslot, inline="always")
def _uslot_impl(j, lay):
    if lay.count == 3:

        def rotated(j, lay):
            u = np.uint64(j)
            return ((u & lay[0]) << lay[1]) | (u >> lay[2])

        return rotated

    def padded_slot(j, lay):
        u = np.uint64(j)
        return u + (u >> np.uint64(PAD_SHIFT)) + (u >> np.uint64(PAD2_SHIFT))

    return padded_slot


def _slots(n, lay):  # pragma: no cover - typed by the overload below
    raise NotImplementedError


@overload(_slots, inline="always")
def _slots_impl(n, lay):
    """Slots per lane (:func:`padded`) and ``LANES`` x the slots between features ``c`` and
    ``c + 1`` inside an aligned group of 16 (the stride of :func:`vcompress`)."""
    if lay.count == 3:
        return lambda n, lay: (n, np.int64(LANES) << np.int64(lay[1]))
    return lambda n, lay: (n + ((n - 1) >> PAD_SHIFT) + ((n - 1) >> PAD2_SHIFT), np.int64(LANES))


@njit(cache=True, inline="always")
def _pos(c, lay):
    return np.int64(_uslot(c, lay)) * LANES


@njit(cache=True, inline="always")
def _upos(j, lay):
    """``pos(j) * LANES`` of an input neuron read from W's (unsigned) row indices.

    Computed inline from the compact ``uint16``/``uint32`` indices instead of storing an
    ``int32`` copy of every layer: a few integer operations per 16-lane multiply-add, and
    no private per-rank copy of a (possibly memory-mapped, node-shared) layer.
    """
    return _uslot(j, lay) * np.uint64(LANES)


@njit(cache=True, inline="always")
def _span(c, cp, per_col):
    """Entries ``[s, e)`` of column ``c``: fixed ``per_col`` or column pointers ``cp``."""
    if per_col > 0:
        s = np.uint64(c) * np.uint64(per_col)
        return s, s + np.uint64(per_col)
    return np.uint64(cp[c]), np.uint64(cp[c + 1])


@njit(cache=True, inline="always")
def _spans4(reps, q, cp, per_col):
    """Entries ``[s, e)`` of the representatives of sets ``q .. q + 3`` and how many entries
    all four have (summed side by side: four independent add chains)."""
    s0, e0 = _span(reps[q], cp, per_col)
    s1, e1 = _span(reps[q + 1], cp, per_col)
    s2, e2 = _span(reps[q + 2], cp, per_col)
    s3, e3 = _span(reps[q + 3], cp, per_col)
    return s0, e0, s1, e1, s2, e2, s3, e3, min(min(e0 - s0, e1 - s1), min(e2 - s2, e3 - s3))


@njit(cache=True, inline="always")
def _emit(dst, db, acc, p0, p1, scols, bias, top, cnt, lay):
    """Activate and store one column sum for every output column of a set."""
    for i in range(p0, p1):
        c = scols[i]
        o = vactivate(acc, bias[c], top)
        vstore(dst, db + _pos(c, lay), o)
        cnt = vcount(cnt, o)
    return cnt


@njit(cache=True, boundscheck=False)
def pull_sets(src, sb, dst, db, rows, cp, per_col, cd, w, reps, sptr, scols, bias, top, lay):
    """One layer for one tile: ``dst`` tile at ``db`` from ``src`` tile at ``sb``.

    W is read in its compact column-wise form: input neurons ``rows`` (any unsigned width;
    the slot offset is computed inline), entries of column ``c`` given by ``cp`` or by a
    fixed ``per_col`` (``per_col > 0``), weights ``cd`` or, when ``cd`` is empty, the single
    weight ``w``. Columns come in *sets* (:func:`column_sets`): set ``q`` is summed once over
    the inputs of its representative column ``reps[q]`` and that sum is activated with each
    member column's own bias (columns ``scols[sptr[q]:sptr[q + 1]]``). Members have the same
    inputs and the same weights, so every member's ascending sum is exactly the same number.
    Four sets are summed at a time: four independent add chains hide the add latency.
    Returns the number of non-zeros per lane (float32 vector).
    """
    cnt = vzero()
    sb = np.uint64(sb)
    nsets = reps.size
    uniform = cd.size == 0
    q = 0
    while q + 4 <= nsets:
        s0, e0, s1, e1, s2, e2, s3, e3, m = _spans4(reps, q, cp, per_col)
        a0 = vzero()
        a1 = vzero()
        a2 = vzero()
        a3 = vzero()
        if uniform:
            for t in range(m):
                a0 = vmuladd(a0, src, sb + _upos(rows[s0 + t], lay), w)
                a1 = vmuladd(a1, src, sb + _upos(rows[s1 + t], lay), w)
                a2 = vmuladd(a2, src, sb + _upos(rows[s2 + t], lay), w)
                a3 = vmuladd(a3, src, sb + _upos(rows[s3 + t], lay), w)
            for kk in range(s0 + m, e0):
                a0 = vmuladd(a0, src, sb + _upos(rows[kk], lay), w)
            for kk in range(s1 + m, e1):
                a1 = vmuladd(a1, src, sb + _upos(rows[kk], lay), w)
            for kk in range(s2 + m, e2):
                a2 = vmuladd(a2, src, sb + _upos(rows[kk], lay), w)
            for kk in range(s3 + m, e3):
                a3 = vmuladd(a3, src, sb + _upos(rows[kk], lay), w)
        else:
            for t in range(m):
                a0 = vmuladd(a0, src, sb + _upos(rows[s0 + t], lay), cd[s0 + t])
                a1 = vmuladd(a1, src, sb + _upos(rows[s1 + t], lay), cd[s1 + t])
                a2 = vmuladd(a2, src, sb + _upos(rows[s2 + t], lay), cd[s2 + t])
                a3 = vmuladd(a3, src, sb + _upos(rows[s3 + t], lay), cd[s3 + t])
            for kk in range(s0 + m, e0):
                a0 = vmuladd(a0, src, sb + _upos(rows[kk], lay), cd[kk])
            for kk in range(s1 + m, e1):
                a1 = vmuladd(a1, src, sb + _upos(rows[kk], lay), cd[kk])
            for kk in range(s2 + m, e2):
                a2 = vmuladd(a2, src, sb + _upos(rows[kk], lay), cd[kk])
            for kk in range(s3 + m, e3):
                a3 = vmuladd(a3, src, sb + _upos(rows[kk], lay), cd[kk])
        cnt = _emit(dst, db, a0, sptr[q], sptr[q + 1], scols, bias, top, cnt, lay)
        cnt = _emit(dst, db, a1, sptr[q + 1], sptr[q + 2], scols, bias, top, cnt, lay)
        cnt = _emit(dst, db, a2, sptr[q + 2], sptr[q + 3], scols, bias, top, cnt, lay)
        cnt = _emit(dst, db, a3, sptr[q + 3], sptr[q + 4], scols, bias, top, cnt, lay)
        q += 4
    while q < nsets:
        s0, e0 = _span(reps[q], cp, per_col)
        a0 = vzero()
        if uniform:
            for kk in range(s0, e0):
                a0 = vmuladd(a0, src, sb + _upos(rows[kk], lay), w)
        else:
            for kk in range(s0, e0):
                a0 = vmuladd(a0, src, sb + _upos(rows[kk], lay), cd[kk])
        cnt = _emit(dst, db, a0, sptr[q], sptr[q + 1], scols, bias, top, cnt, lay)
        q += 1
    return cnt


def column_sets(rows, colptr, per_col, values, n, share=True):
    """Group W's columns into sets that have the same inputs and the same weights.

    Radix-nets connect 16 output neurons to exactly the same 32 inputs with the same weight,
    so one sum serves all 16 (:func:`pull_sets`). Sets are ordered by their smallest column,
    which keeps the inputs of consecutive sets close in the tile. Columns are grouped by a
    hash of (inputs, weights) and checked exactly, so a collision only costs sharing. O(nnz)
    work and O(N) memory per layer; a prepared network keeps them across layer groups and
    micro-batches while they fit ``DERIVED_BYTES`` (:mod:`mpisdnn.backends._cpu_prepare`).

    Returns ``(reps, sptr, scols)``: a representative column per set, set pointers, and the
    member columns of all sets (ascending within a set). ``share=False`` puts every column in
    a set of its own (the ablation without sharing).
    """
    n = int(n)
    if not share:
        cols = np.arange(n, dtype=np.int32)
        return cols, np.arange(n + 1, dtype=np.int32), cols
    cp = np.zeros(0, np.int64) if colptr is None else np.asarray(colptr, np.int64)
    if values is None:
        bits = np.zeros(0, np.uint32)
    else:
        bits = np.asarray(values, np.float32).view(np.uint32)
    rows = np.asarray(rows)
    per_col = int(per_col)
    width = per_col * rows.itemsize
    if per_col > 0 and not bits.size and width % 8 == 0 and rows.flags.c_contiguous:
        # Columns of a fixed width compare (and hash) as 8-byte words: equal words are equal
        # indices, so the sets are the same, in 4x fewer steps for uint16 indices.
        rows, per_col = rows.view(np.uint64), width // 8
    # One array type whatever the layer's source: numba compiles a read-only array (a
    # mapped file's) apart from a writable one (a layer in memory, the empty defaults), and a
    # compile inside the timed loop was what a warm-up on a writable layer left behind
    rows, cp, bits = read_only(rows), read_only(cp), read_only(bits)
    if per_col > 0:
        d = _stride_of_sets(rows, np.int64(per_col), bits, np.int64(n))
        if d > 0:  # what the search below finds, in one pass
            return strided_sets(d, n)
    return _group_sets(rows, cp, np.int64(per_col), bits, n)


def read_only(arr):
    """A read-only view of ``arr`` as a plain ndarray (no copy): what the kernels take, so
    that a layer in memory and a mapped one (read-only) give numba one array type, and a
    typed list holds one."""
    v = arr.view(np.ndarray) if isinstance(arr, np.ndarray) else np.asarray(arr)
    v = v.view()
    v.flags.writeable = False
    return v


def strided_sets(d: int, n: int):
    """The :func:`column_sets` ``(reps, sptr, scols)`` of the sets ``{q, q + d, q + 2d, ...}``,
    ``q < d`` (``d`` divides ``n``)."""
    q = np.arange(d, dtype=np.int32)
    scols = (q[:, None] + np.arange(0, n, d, dtype=np.int32)[None, :]).reshape(-1)
    return q, np.arange(0, n + 1, n // d, dtype=np.int32), scols


@njit(cache=True, boundscheck=False)
def _stride_of_sets(rows, per_col, bits, n):
    """``d`` when the columns' sets are exactly ``{q + i d}`` (a radix-net's layout), else 0.

    Column ``d`` is the first equal to column 0, every column ``c >= d`` equals column
    ``c - d``, ``d`` divides ``n``, and columns ``0 .. d - 1`` are pairwise different (their
    hashes are: equal hashes send the layer to the full search). One pass over the layer's
    indices with no table: at N=65536 7x faster than the search (0.4 against 2.8 ms a layer),
    which the ranks repeat for every layer they run.
    """
    cp = np.zeros(0, np.int64)
    d = 0
    for c in range(1, n):
        if _equal_fixed(0, c, rows, per_col, bits):
            d = c
            break
    if d == 0 or n % d != 0 or d < 2:
        return 0
    for c in range(d, n):
        if not _equal_fixed(c - d, c, rows, per_col, bits):
            return 0
    h = np.empty(d, np.uint64)
    for c in range(d):
        h[c] = _column_hash(c, rows, cp, per_col, bits)
    heapsort(h)
    for i in range(1, d):
        if h[i] == h[i - 1]:
            return 0
    return d


@njit(cache=True, inline="always")
def _column_hash(c, rows, cp, per_col, bits):
    # A sum of independently mixed terms: no dependency chain, so it vectorises (the exact
    # check makes any hash correct; this one only has to separate the radix-net's sets).
    mul = np.uint64(0x9E3779B97F4A7C15)
    s, e = _span(c, cp, per_col)
    x = (e - s + np.uint64(1)) * mul
    if bits.size:
        for t in range(s, e):
            v = (np.uint64(rows[t]) << np.uint64(32)) | np.uint64(bits[t])
            x += (v + np.uint64(1)) * mul ^ (v >> np.uint64(7))
    else:
        for t in range(s, e):
            v = np.uint64(rows[t]) + np.uint64(1)
            x += v * mul ^ (v << np.uint64(17))
    return x ^ (x >> np.uint64(29))


@njit(cache=True, boundscheck=False, inline="always")
def _equal_fixed(a, b, rows, per_col, bits):
    """Whether columns ``a`` and ``b`` of fixed width ``per_col > 0`` hold the same indices
    (and weight bits)."""
    # XOR in the arrays' own types, branch-free: 7x faster at N=65536 than the int64 casts
    # of the general case below (2.3 against 0.33 ms a layer).
    sa, sb = np.int64(a) * per_col, np.int64(b) * per_col
    diff = rows[sa] ^ rows[sb]
    for t in range(1, per_col):
        diff |= rows[sa + t] ^ rows[sb + t]
    same = diff == 0
    if bits.size:
        dbits = bits[sa] ^ bits[sb]
        for t in range(1, per_col):
            dbits |= bits[sa + t] ^ bits[sb + t]
        same = same and dbits == 0
    return same


@njit(cache=True, boundscheck=False, inline="always")
def _equal_spans(a, b, rows, cp, per_col, bits):
    """Whether columns ``a`` and ``b`` hold the same indices (and weight bits)."""
    if per_col > 0:
        return _equal_fixed(a, b, rows, per_col, bits)
    # Branch-free over the span, in int64 (numba mixes ``_span``'s uint64 with int64 through
    # float64).
    sa, sb, m = np.int64(cp[a]), np.int64(cp[b]), np.int64(cp[a + 1] - cp[a])
    if np.int64(cp[b + 1] - cp[b]) != m:
        return False
    diff = 0
    for t in range(m):
        diff |= np.int64(rows[sa + t]) ^ np.int64(rows[sb + t])
    if bits.size:
        for t in range(m):
            diff |= np.int64(bits[sa + t]) ^ np.int64(bits[sb + t])
    return diff == 0


@njit(cache=True, boundscheck=False)
def _rehash(t_hash, t_col, size):
    """The leaders of an open-addressing table moved into one of ``size`` slots."""
    mask = np.uint64(size - 1)
    n_hash = np.zeros(size, np.uint64)
    n_col = np.full(size, -1, np.int32)
    for i in range(t_col.size):
        if t_col[i] >= 0:
            slot = t_hash[i] & mask
            while n_col[slot] >= 0:
                slot = (slot + np.uint64(1)) & mask
            n_col[slot] = t_col[i]
            n_hash[slot] = t_hash[i]
    return n_hash, n_col


@njit(cache=True, boundscheck=False)
def _group_sets(rows, cp, per_col, bits, n):
    # One pass over the columns in ascending order with an open-addressing table of set
    # leaders: a column joins the leader it equals exactly, or becomes a new leader (sets
    # are therefore numbered by their smallest column). No sort.
    # Fast path: members of a set tend to sit at a fixed distance (a radix-net's sets are
    # {q, q + N/16, q + 2N/16, ...}), so column c is first compared with column c - d, d
    # the distance of the last join. Equal columns are in one set (sets are classes of
    # exactly equal columns), so only leaders and misses are hashed.
    # The table holds leaders only and grows with them: a table sized for N unique columns
    # costs more in fresh pages than the whole pass when sets are large.
    size = 1024
    mask = np.uint64(size - 1)
    t_hash = np.zeros(size, np.uint64)
    t_col = np.full(size, -1, np.int32)
    set_of = np.empty(n, np.int32)
    reps = np.empty(n, np.int32)
    last = np.empty(n, np.int32)
    nsets = 0
    d = 0
    for c in range(n):
        if 0 < d <= c:
            if _equal_spans(c - d, c, rows, cp, per_col, bits):
                q = set_of[c - d]
                set_of[c] = q
                last[q] = c
                continue
        if 2 * (nsets + 1) > size:
            size *= 2
            t_hash, t_col = _rehash(t_hash, t_col, size)
            mask = np.uint64(size - 1)
        h = _column_hash(c, rows, cp, per_col, bits)
        slot = h & mask
        while True:
            lead = t_col[slot]
            if lead < 0:
                t_col[slot] = c
                t_hash[slot] = h
                set_of[c] = nsets
                reps[nsets] = c
                last[nsets] = c
                nsets += 1
                break
            if t_hash[slot] == h and _equal_spans(lead, c, rows, cp, per_col, bits):
                q = set_of[lead]
                set_of[c] = q
                d = c - last[q]
                last[q] = c
                break
            slot = (slot + np.uint64(1)) & mask
    sptr = np.zeros(nsets + 1, np.int32)
    for c in range(n):
        sptr[set_of[c] + 1] += 1
    for q in range(nsets):
        sptr[q + 1] += sptr[q]
    fill = sptr[:-1].copy()
    scols = np.empty(n, np.int32)
    for c in range(n):
        q = set_of[c]
        scols[fill[q]] = c
        fill[q] += 1
    return reps[:nsets].copy(), sptr, scols


@njit(cache=True, inline="always")
def _layer(group, k):
    """Layer ``k`` of a group (the tuple :func:`tile_group` and :func:`pull_rows` take):
    ``(rows, cp, per_col, cd, w, reps, sptr, scols, bias)``, W in compact column-wise form
    (:func:`pull_sets`: row indices, column pointers (empty when ``per_col > 0``), weights
    (empty when all equal ``w``)), its :func:`column_sets` and its bias row."""
    rows_l, cp_l, per_col, cd_l, wv, reps_l, sptr_l, scols_l, bias = group
    return (
        rows_l[k],
        cp_l[k],
        per_col[k],
        cd_l[k],
        wv[k],
        reps_l[k],
        sptr_l[k],
        scols_l[k],
        bias[k],
    )


@njit(parallel=True, cache=True, boundscheck=False)
def tile_group(
    ys,
    yl,
    yi,
    yd,
    chunk_bounds,
    group,
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
    lay,
    rw,
):
    """Layers ``0 .. len(group[0]) - 1`` of a group for every chunk of rows, each chunk staying
    in its thread's tiles.

    Parameters
    ----------
    ys, yl, yi, yd : row starts, row lengths, column indices, values of the input rows.
    chunk_bounds : int64, chunk ``c`` is input rows ``[chunk_bounds[c], chunk_bounds[c+1])``.
    group : the layers, ``(rows_l, cp_l, per_col, cd_l, wv, reps_l, sptr_l, scols_l, bias)``
        (``PreparedNetwork.group``); layer ``k`` is :func:`_layer` ``(group, k)``.
        ``prune``: drop rows that died and repack the tiles.
    buf : float32 (threads, 2, tiles * slots * LANES) scratch; ping-pong tile buffers.
    out_base : int64 per chunk, where its output rows start in ``oi``/``od`` (room for
        ``rows * n`` entries; pages never written are never touched).
    out_start, out_len : int64 per input row; rows that died get length 0.
    stats : int64 (chunks, layers, 4): rows alive, non-zeros, tiles computed and rows alive
        again per layer; a row counts ``rw[row]`` times in the first two (the inputs a
        deduplicated row stands for), once in the last.
    lay : the :func:`tile_layout` (``buf`` holds ``padded(n, lay)`` slots per lane and tile).
    rw : int64 per input row, its weight in the statistics (empty: 1 for every row).

    Rows never interact, so the result of a row is independent of the chunking, the thread
    count and the rank count (bit for bit).
    """
    nchunks = chunk_bounds.size - 1
    nl = len(group[0])
    top = np.float32(ymax)
    slots, step = _slots(n, lay)
    tsz = slots * LANES
    weighted = rw.size > 0
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
            out_len[r0 + i] = 0
            lane_row[i] = r0 + i
        _load_tiles(a, tsz, n, r0, nr, ys, yl, yi, yd, lay)
        live = ntile
        for layer in range(nl):
            rows, cp, pc, cd, w, reps, sptr, scols, bl = _layer(group, layer)
            for t in range(live):
                tb = t * tsz
                cnt_t = pull_sets(
                    a, tb, b, tb, rows, cp, pc, cd, w, reps, sptr, scols, bl, top, lay
                )
                vstore(cnt, t * LANES, cnt_t)
            a, b = b, a
            alive = 0
            walive = 0
            nnz = 0
            for i in range(live * LANES):
                if cnt[i] > 0:
                    wt = rw[lane_row[i]] if weighted else np.int64(1)
                    alive += 1
                    walive += wt
                    nnz += wt * np.int64(cnt[i])
            stats[c, layer, 0] = walive
            stats[c, layer, 1] = nnz
            stats[c, layer, 2] = live
            stats[c, layer, 3] = alive
            if prune and alive <= (live - 1) * LANES:
                live = _repack(a, tsz, n, live, lane_row, cnt, lay)
                if live == 0:
                    break
        # Surviving rows, in row order, packed at the start of the chunk's output slot.
        _store_rows(
            a, tsz, step, n, live, lane_row, cnt, out_base[c], oi, od, out_start, out_len, lay
        )


#: Features per block when rows are moved between CSR and tiles: the block's lines (64 B
#: each, 16 lanes) stay in L1/L2 while all 16 rows of a tile read or write them, instead of
#: every row sweeping the whole tile (4 MiB at N=65536) on its own.
_BLOCK = 2048


@njit(cache=True, boundscheck=False)
def _load_tiles(a, tsz, n, r0, nr, ys, yl, yi, yd, lay):
    """Scatter input rows ``r0 .. r0 + nr`` into their (zeroed) lanes, a feature block at a
    time for all lanes of a tile. Any index order is loaded (the last block takes whatever
    is left); ascending rows make each block one pass."""
    cur = np.empty(LANES, np.int64)
    for t in range((nr + LANES - 1) // LANES):
        lanes = min(LANES, nr - t * LANES)
        for ln in range(lanes):
            cur[ln] = ys[r0 + t * LANES + ln]
        for lo in range(0, n, _BLOCK):
            hi = lo + _BLOCK if lo + _BLOCK < n else n + 1
            for ln in range(lanes):
                r = r0 + t * LANES + ln
                end = ys[r] + yl[r]
                base = t * tsz + ln
                jj = cur[ln]
                while jj < end and yi[jj] < hi:
                    a[base + _pos(yi[jj], lay)] = yd[jj]
                    jj += 1
                cur[ln] = jj


@njit(cache=True, boundscheck=False)
def _store_rows(a, tsz, step, n, live, lane_row, cnt, pos, oi, od, out_start, out_len, lay):
    """Append the live lanes to CSR in row order from ``pos``: each row's place comes from
    its non-zero count ``cnt`` (exact below 2**24 features; counted again above), then
    16 features at a time for all lanes of a tile, so a block's lines are read once."""
    nl = live * LANES
    k = np.empty(nl, np.int64)
    for i in range(nl):
        k[i] = np.int64(cnt[i])
        if n >= 1 << 24 and k[i] > 0:  # float32 counts are no longer exact: count again
            base = (i // LANES) * tsz + i % LANES
            k[i] = 0
            for col in range(n):
                k[i] += 1 if a[base + _pos(col, lay)] != 0.0 else 0
    wpos = np.zeros(nl, np.int64)
    order = argsort_small(lane_row[:nl])  # numba's argsort: ~2 s more to compile
    for i in order:
        r = lane_row[i]
        if r < 0:
            continue
        out_start[r] = pos
        wpos[i] = pos
        out_len[r] = k[i]
        pos += k[i]
    for t in range(live):
        tb = t * tsz
        for c0 in range(0, n - LANES + 1, LANES):
            p0 = tb + _pos(c0, lay)
            for ln in range(LANES):
                i = t * LANES + ln
                if k[i] > 0:
                    wpos[i] += vcompress(a, p0 + ln, step, oi, od, wpos[i], c0)
        for col in range(n - n % LANES, n):  # N not a multiple of 16
            p = tb + _pos(col, lay)
            for ln in range(LANES):
                i = t * LANES + ln
                v = a[p + ln]
                if k[i] > 0 and v != 0.0:
                    oi[wpos[i]] = col
                    od[wpos[i]] = v
                    wpos[i] += 1


@njit(cache=True, boundscheck=False)
def _repack(a, tsz, n, live, lane_row, cnt, lay):
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
                p = _pos(col, lay)
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


def push_plan(reps, sptr, scols, rows, colptr, per_col, values, value, bias, n):
    """What :func:`push_group` needs of one layer.

    Returns ``(shape, gptr, gset, gw, smax)``. Input neuron ``j`` feeds the column sets
    ``gset[gptr[g]:gptr[g + 1]]`` with weights ``gw[...]``, ``g = j & gmask``; ``smax[q]`` is
    the largest bias of set ``q``'s members. ``shape`` is int64 ``(gmask, fan, residue,
    uniform)``:

    * ``gmask``: inputs are grouped by residue when every input ``j`` feeds the same sets as
      ``j mod M`` (``M`` = sets, a power of two: a radix-net, 4,096 groups of 2 sets at
      N=65536, 48 KiB that stay in L1), else all ones and there is one list per input;
    * ``fan``: the number of sets every group feeds when it is the same for all (a loop of
      known length is ~2x faster than one bounded by ``gptr``), else 0;
    * ``residue``: ``M`` when set ``q``'s members are ``q, q + M, q + 2M, ...`` (a radix-net),
      so a row is written ``M`` columns at a time in ascending order without sorting, else 0;
    * ``uniform``: 1 when every column has the same bias.

    Only the sets' representatives are transposed, never the whole layer.
    """
    cp = np.zeros(0, np.int64) if colptr is None else np.asarray(colptr, np.int64)
    cd = np.zeros(0, np.float32) if values is None else np.asarray(values, np.float32)
    # read-only views whatever the source (see column_sets): one compiled specialisation
    reps, rows, cp, cd = (read_only(a) for a in (reps, rows, cp, cd))
    jptr, jset, jw = _transpose_sets(
        reps, rows, cp, np.int64(per_col), cd, np.float32(value), np.int64(n)
    )
    bias = read_only(np.ascontiguousarray(bias, np.float32))  # a shared bias: a broadcast
    smax = _set_max(sptr, scols, bias)
    m = int(reps.size)
    gmask = -1
    if 0 < m < n and not m & (m - 1) and n % m == 0 and _residue_grouped(jptr, jset, jw, m):
        gmask = m - 1
        e = jptr[m]
        jptr, jset, jw = jptr[: m + 1].copy(), jset[:e].copy(), jw[:e].copy()
    counts = np.diff(jptr)
    fan = int(counts[0]) if counts.size and np.all(counts == counts[0]) else 0
    residue = 0
    if 0 < m and n % m == 0 and sptr.size == m + 1:
        members = np.asarray(scols, np.int64).reshape(-1)
        if members.size == n and np.all(np.diff(np.asarray(sptr)) == n // m):
            expect = np.arange(m)[:, None] + np.arange(n // m)[None, :] * m
            residue = m if np.array_equal(members.reshape(m, n // m), expect) else 0
    uniform = int(bias.size > 0 and bool(np.all(bias == bias[0])))
    shape = np.array([gmask, fan, residue, uniform], np.int64)
    return shape, jptr, jset, jw, smax


def push_scratch(threads: int, n: int) -> tuple:
    """Zeroed per-thread scratch of :func:`push_group` for layers of ``n`` neurons (and so
    at most ``n`` column sets: they split the columns): ``(fbuf, ibuf, wbuf)``."""
    width = n + 1
    return (
        np.zeros((threads, 4, width), np.float32),
        np.zeros((threads, 2, width), np.int32),
        np.zeros((threads, (n + 63) // 64), np.uint64),
    )


@njit(cache=True, boundscheck=False)
def _transpose_sets(reps, rows, cp, per_col, cd, value, n):
    """For every input neuron, the sets it feeds (ascending) and the weights."""
    nsets = reps.size
    jptr = np.zeros(n + 1, np.int64)
    for q in range(nsets):
        s, e = _span(reps[q], cp, per_col)
        for t in range(s, e):
            jptr[np.int64(rows[t]) + 1] += 1
    for j in range(n):
        jptr[j + 1] += jptr[j]
    fill = jptr[:-1].copy()
    jset = np.empty(jptr[n], np.int32)
    jw = np.empty(jptr[n], np.float32)
    for q in range(nsets):
        s, e = _span(reps[q], cp, per_col)
        for t in range(s, e):
            j = np.int64(rows[t])
            jset[fill[j]] = q
            jw[fill[j]] = value if cd.size == 0 else cd[t]
            fill[j] += 1
    return jptr, jset, jw


@njit(cache=True, boundscheck=False)
def _set_max(sptr, scols, bias):
    m = sptr.size - 1
    out = np.empty(max(m, 0), np.float32)
    for q in range(m):
        b = bias[scols[sptr[q]]]
        for i in range(sptr[q] + 1, sptr[q + 1]):
            b = max(b, bias[scols[i]])
        out[q] = b
    return out


@njit(cache=True, boundscheck=False)
def _residue_grouped(jptr, jset, jw, m):
    """Whether every input ``j`` feeds exactly the sets (and weights) of ``j mod m``."""
    n = jptr.size - 1
    for j in range(m, n):
        g = j % m
        if jptr[j + 1] - jptr[j] != jptr[g + 1] - jptr[g]:
            return False
        for t in range(jptr[j + 1] - jptr[j]):
            a = jptr[j] + t
            b = jptr[g] + t
            if jset[a] != jset[b] or jw[a] != jw[b]:
                return False
    return True


@njit(inline="always")
def _activate(z, b, top):
    """``min(max(z + b, 0), top)`` of one non-zero sum (the tile kernel's ``vactivate``)."""
    o = z + b
    o = o if o > 0 else np.float32(0.0)
    return o if o < top else top


@njit(inline="always")
def _push_sums(ai, ad, cnt, acc, gm, fan, gptr, gset, gw):
    """Push the row's ``cnt`` non-zeros ``(ai, ad)``, in ascending column order, into the
    sums ``acc`` of the column sets they feed (:func:`push_plan`: ``fan`` sets per input
    group, or ``gptr`` ranges where the fan-out varies)."""
    if fan == 2:
        for t in range(cnt):
            e = np.uint64(2) * (np.uint64(ai[t]) & gm)
            v = ad[t]
            q0 = np.uint64(gset[e])
            q1 = np.uint64(gset[e + np.uint64(1)])
            acc[q0] = acc[q0] + v * gw[e]
            acc[q1] = acc[q1] + v * gw[e + np.uint64(1)]
    elif fan > 0:
        f = np.uint64(fan)
        for t in range(cnt):
            e = f * (np.uint64(ai[t]) & gm)
            v = ad[t]
            for _ in range(fan):
                q = np.uint64(gset[e])
                acc[q] = acc[q] + v * gw[e]
                e += np.uint64(1)
    else:
        for t in range(cnt):
            g = np.uint64(ai[t]) & gm
            v = ad[t]
            e = np.uint64(gptr[g])
            e1 = np.uint64(gptr[g + np.uint64(1)])
            while e < e1:
                q = np.uint64(gset[e])
                acc[q] = acc[q] + v * gw[e]
                e += np.uint64(1)


@njit(inline="always")
def _active_sets(acc, smax, nsets, actq, actz):
    """List the sets whose sum is non-zero and can activate (``sum + smax > 0``), ascending,
    in ``actq``/``actz``; every sum goes back to zero. Returns how many."""
    na = 0
    for q in range(nsets):
        z = acc[q]
        acc[q] = 0.0
        if z != 0 and z + smax[q] > 0:
            actq[na] = q
            actz[na] = z
            na += 1
    return na


@njit(inline="always")
def _write_members(actq, actz, na, m, uniform, sptr, scols, bl, top, n, ai, ad, bd, bits):
    """The next layer's row ``(ai, ad)`` in ascending column order from the ``na`` active
    sets: ``m`` columns apart for a residue layer (one value per set where the bias is
    ``uniform``), else through the row's bitmap ``bits`` and values ``bd`` (left cleared).
    Returns its non-zeros."""
    cnt = 0
    if m > 0 and uniform:
        # Residue sets, one bias: every member of an active set has the same value.
        b = bl[0]
        for a in range(na):
            o = actz[a] + b
            actz[a] = o if o < top else top
        for i in range(n // m):
            base = i * m
            for a in range(na):
                ai[cnt + a] = actq[a] + base
                ad[cnt + a] = actz[a]
            cnt += na
    elif m > 0:
        for i in range(n // m):
            base = i * m
            for a in range(na):
                c = actq[a] + base
                o = _activate(actz[a], bl[c], top)
                ai[cnt] = c
                ad[cnt] = o
                cnt += 1 if o != 0 else 0
    else:
        for a in range(na):
            q = actq[a]
            z = actz[a]
            for i in range(sptr[q], sptr[q + 1]):
                c = np.int64(scols[i])
                o = _activate(z, bl[c], top)
                if o != 0:
                    bd[c] = o
                    bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
        for w in range((n + 63) >> 6):
            x = bits[w]
            if x:
                bits[w] = 0
                while x:
                    c = (w << 6) + np.int64(trailing_zeros(x))
                    ai[cnt] = c
                    ad[cnt] = bd[c]
                    x &= x - np.uint64(1)
                    cnt += 1
    return cnt


@njit(parallel=True, cache=True, boundscheck=False)
def push_group(
    ys,
    yl,
    yi,
    yd,
    shape,
    gptr_l,
    gset_l,
    gw_l,
    smax_l,
    sptr_l,
    scols_l,
    bias,
    top,
    n,
    limit,
    scratch,
    oi,
    od,
    out_base,
    out_len,
    stop,
    stats,
    rw,
):
    """Layers ``0 .. len(gptr_l) - 1`` of a group for sparse rows, row by row ("push").

    A row stays in its thread's scratch and goes from layer to layer while it has fewer
    than ``limit`` non-zeros: each non-zero ``y[j]`` is pushed, in ascending ``j``, into the
    sums of the column sets it feeds (:func:`push_plan`; one float32 per set, 16 KiB at
    N=65536). A set's sum therefore gets exactly the canonical ascending sequence of
    non-zero terms: the tile kernel's sum without its ``+0`` terms (bit-identical). Sets
    whose sum is non-zero and can activate (``sum + smax > 0``) are listed, and their
    members written in ascending column order: ``M`` columns apart for a residue layer, else
    through a bitmap of the row. Per row and layer this costs ``O(nnz(y) x sets per input +
    sets + nnz(out))`` (plus ``N/64`` for the bitmap), against the tile's ``O(nnz(W) / 16)``
    whatever the row's density, and the row's state stays in L1/L2 instead of a 16-row tile
    (4 MiB at N=65536) in L3.

    Parameters
    ----------
    ys, yl, yi, yd : row starts, lengths, column indices, values of the input rows.
    shape : int64 (layers, 4); ``gptr_l, gset_l, gw_l, smax_l``: per layer, its
        :func:`push_plan`.
    sptr_l, scols_l : per layer, its :func:`column_sets` pointers and members.
    bias : float32 (layers, n).  ``limit``: a row with this many non-zeros stops pushing.
    scratch : ``(fbuf, ibuf, wbuf)`` per thread (:func:`push_scratch`): float32 (threads,
        4, >= n + 1), int32 (threads, 2, same), and a uint64 (threads, >= n / 64)
        bitmap, all zero between rows.
    oi, od, out_base : where row ``r``'s state is written (room for ``n`` entries).
    out_len, stop : per row, its non-zeros and the layer it stopped before (a row that
        died, or went through every layer, gets ``len(gptr_l)``; a row whose indices are
        not strictly ascending stops at 0 and is written as it came).
    stats : int64 (threads, layers, 4): rows alive and non-zeros after each layer, each row
        counted ``rw[r]`` times (empty ``rw``: once), rows pushed through it, and rows alive
        counted once.
    rw : int64 per row, its weight in the first two statistics (empty: 1 for every row).
    """
    nl = len(gptr_l)
    fbuf, ibuf, wbuf = scratch
    weighted = rw.size > 0
    for r in prange(ys.size):
        wt = rw[r] if weighted else np.int64(1)
        tid = numba.get_thread_id()
        acc = fbuf[tid, 0]
        ad = fbuf[tid, 1]
        bd = fbuf[tid, 2]
        actz = fbuf[tid, 3]
        actq = ibuf[tid, 0]
        ai = ibuf[tid, 1]
        bits = wbuf[tid]
        s0 = ys[r]
        cnt = yl[r]
        ok = True
        prev = -1
        for t in range(cnt):
            j = yi[s0 + t]
            ok = ok and j > prev
            prev = j
            ai[t] = j
            ad[t] = yd[s0 + t]
        layer = 0
        while ok and layer < nl and 0 < cnt < limit:
            sptr = sptr_l[layer]
            _push_sums(
                ai,
                ad,
                cnt,
                acc,
                np.uint64(shape[layer, 0]),
                shape[layer, 1],
                gptr_l[layer],
                gset_l[layer],
                gw_l[layer],
            )
            na = _active_sets(acc, smax_l[layer], sptr.size - 1, actq, actz)
            cnt = _write_members(
                actq,
                actz,
                na,
                shape[layer, 2],
                shape[layer, 3],
                sptr,
                scols_l[layer],
                bias[layer],
                top,
                n,
                ai,
                ad,
                bd,
                bits,
            )
            stats[tid, layer, 0] += wt if cnt > 0 else 0
            stats[tid, layer, 1] += wt * cnt
            stats[tid, layer, 2] += 1
            stats[tid, layer, 3] += 1 if cnt > 0 else 0
            layer += 1
        base = out_base[r]
        for t in range(cnt):
            oi[base + t] = ai[t]
            od[base + t] = ad[t]
        out_len[r] = cnt
        stop[r] = nl if cnt == 0 or layer == nl else layer


@njit(cache=True, boundscheck=False, inline="always")
def _row_sum_from(z, a, rows, cd, w, s, e):
    """``z`` plus the terms ``[s, e)`` of a column over the dense row ``a``, in order."""
    if cd.size == 0:
        for kk in range(s, e):
            z = z + a[np.int64(rows[kk])] * w
    else:
        for kk in range(s, e):
            z = z + a[np.int64(rows[kk])] * cd[kk]
    return z


@njit(cache=True, boundscheck=False, inline="always")
def _row_emit(b, z, p0, p1, scols, bias, top):
    """Activate one set's sum into its member columns of ``b``; returns the non-zeros."""
    cnt = 0
    for i in range(p0, p1):
        c = scols[i]
        o = _activate(z, bias[c], top) if z != 0 else np.float32(0.0)
        b[c] = o
        cnt += 1 if o != 0 else 0
    return cnt


@njit(parallel=True, cache=True, boundscheck=False)
def pull_rows(
    ys,
    yl,
    yi,
    yd,
    group,
    ymax,
    n,
    prune,
    buf,
    oi,
    od,
    out_base,
    out_len,
    stats,
    rw,
):
    """Layers ``0 .. len(group[0]) - 1`` of a group for a few rows, one dense row at a time:
    the tile kernel (:func:`pull_sets`) with one lane instead of 16.

    A tile of one or two rows streams 16 lanes (8 MiB of ping-pong tiles at N=65536) for
    one or two useful ones, and the push kernel needs a transposed plan per layer (as much
    time as the layer itself for a few rows). Here a row's two ``n``-float buffers stay in
    L2 and the layer is read as the tiles read it (set representatives' columns, no plan).
    Every output column is the same ascending sum as in the tile, ``+0`` terms included:
    the same bits.

    Parameters are those of :func:`tile_group` (``rw``: statistics weights, empty for 1)
    except ``buf``: float32 (threads, 2, >= n) scratch, and ``out_base``: where row ``r``'s
    output starts in ``oi``/``od`` (room for ``n`` entries). ``stats`` is int64 (threads,
    layers, 4): weighted rows alive and non-zeros, rows computed, rows alive.
    """
    nl = len(group[0])
    top = np.float32(ymax)
    weighted = rw.size > 0
    for r in prange(ys.size):
        tid = numba.get_thread_id()
        a = buf[tid, 0]
        b = buf[tid, 1]
        for j in range(n):
            a[j] = 0.0
        s0 = ys[r]
        for t in range(yl[r]):
            a[yi[s0 + t]] = yd[s0 + t]
        wt = rw[r] if weighted else np.int64(1)
        for layer in range(nl):
            rows, cp, pc, cd, w, reps, sptr, scols, bl = _layer(group, layer)
            cnt = 0
            nsets = reps.size
            q = 0
            while q + 4 <= nsets:
                # Four sets at a time: four independent add chains hide the add latency
                # (each is still its own column's ascending sum).
                s0, e0, s1, e1, s2, e2, s3, e3, m = _spans4(reps, q, cp, pc)
                z0 = z1 = z2 = z3 = np.float32(0.0)
                if cd.size == 0:
                    for t in range(m):
                        z0 = z0 + a[np.int64(rows[s0 + t])] * w
                        z1 = z1 + a[np.int64(rows[s1 + t])] * w
                        z2 = z2 + a[np.int64(rows[s2 + t])] * w
                        z3 = z3 + a[np.int64(rows[s3 + t])] * w
                else:
                    for t in range(m):
                        z0 = z0 + a[np.int64(rows[s0 + t])] * cd[s0 + t]
                        z1 = z1 + a[np.int64(rows[s1 + t])] * cd[s1 + t]
                        z2 = z2 + a[np.int64(rows[s2 + t])] * cd[s2 + t]
                        z3 = z3 + a[np.int64(rows[s3 + t])] * cd[s3 + t]
                z0 = _row_sum_from(z0, a, rows, cd, w, s0 + m, e0)
                z1 = _row_sum_from(z1, a, rows, cd, w, s1 + m, e1)
                z2 = _row_sum_from(z2, a, rows, cd, w, s2 + m, e2)
                z3 = _row_sum_from(z3, a, rows, cd, w, s3 + m, e3)
                cnt += _row_emit(b, z0, sptr[q], sptr[q + 1], scols, bl, top)
                cnt += _row_emit(b, z1, sptr[q + 1], sptr[q + 2], scols, bl, top)
                cnt += _row_emit(b, z2, sptr[q + 2], sptr[q + 3], scols, bl, top)
                cnt += _row_emit(b, z3, sptr[q + 3], sptr[q + 4], scols, bl, top)
                q += 4
            while q < nsets:
                s0, e0 = _span(reps[q], cp, pc)
                z0 = _row_sum_from(np.float32(0.0), a, rows, cd, w, s0, e0)
                cnt += _row_emit(b, z0, sptr[q], sptr[q + 1], scols, bl, top)
                q += 1
            a, b = b, a
            stats[tid, layer, 0] += wt if cnt > 0 else 0
            stats[tid, layer, 1] += wt * cnt
            stats[tid, layer, 2] += 1
            stats[tid, layer, 3] += 1 if cnt > 0 else 0
            if cnt == 0 and prune:
                break  # a dead row stays dead: nothing left to compute or count
        base = out_base[r]
        k = 0
        for j in range(n):
            v = a[j]
            if v != 0:
                oi[base + k] = j
                od[base + k] = v
                k += 1
        out_len[r] = k
