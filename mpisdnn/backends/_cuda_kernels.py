"""CUDA kernels of the ``gpu`` backend (numba-cuda; the same source runs in the simulator).

Layout of the activations (:class:`~mpisdnn.backends.gpu.DeviceRows`): rows are packed into
*chunks* of ``chunk`` rows (a multiple of 32), each chunk a dense, **feature-major** block of
``N x chunk`` float32 values: entry ``(row s of chunk c, feature j)`` lives at
``c * chunk * N + j * chunk + s``. Why feature-major: one warp computes one output column for
32 consecutive rows, lane = row, so the 32 loads of ``y[rows, j]`` for one weight are one
aligned 128-byte line and the weight itself (index and value) is the same for every lane (a
shared-memory broadcast). A chunk's block stays in L1/L2 while the block sweeps the columns.

One thread block owns one chunk for a whole *layer group* (up to 32 layers): rows never
interact, so no grid-wide synchronisation and no host round trip is needed inside a group.
After every layer the block repacks its surviving rows to the front of the chunk (stable, so
row order is kept); dead rows then cost nothing in later layers of the group. Weights of a
batch of columns are staged through shared memory; per-layer statistics (active rows,
non-zeros, tiles of 32 rows) are reduced in shared memory and added to global counters once
per block and layer.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

# Module level (not inside the factories): the simulator swaps the ``cuda`` global of kernels
# and device functions, which is this module's.
from numba import cuda, float32, int32, int64, uint32, uint64

from ._cuda_arith import make, simulated

__all__ = ["kernels", "SHARED_ENTRIES", "STAT_FIELDS", "LAYER_FIELDS"]

#: Weight entries (index + value) one block stages in shared memory at once (16 KiB).
SHARED_ENTRIES = 2048
#: Columns of the per-layer statistics array.
STAT_FIELDS = 4

# Device functions pass the kernel's arrays in three groups, as tuples (they inline, so the
# tuples cost nothing): ``net = (n, wi, wv, wcp, lt, lv, bias, ymax, mp, mc)``, the group's
# layers (``mp``/``mc``: the member columns of each column set, :func:`members_of`);
# ``rows = (cur, nxt, base, nact)``, one chunk's input and output buffers, the chunk's offset
# in both and its active rows; ``shared = (sh_i, sh_v, flag, misc)``, the block's shared
# memory (staged weights, a flag per row, counters). ``lay`` is one layer's row of the tables
# (:func:`layer_of`).
_dev = cuda.jit(device=True)


@functools.cache
def kernels(chunk: int, shared_entries: int = SHARED_ENTRIES):
    """The kernels for chunks of ``chunk`` rows (a multiple of 32) staging at most
    ``shared_entries`` weights per column batch, as a namespace (compiled on first launch)."""
    if chunk % 32 or chunk < 32:
        raise ValueError(f"chunk rows must be a positive multiple of 32, got {chunk}")
    ch, sh = int(chunk), int(shared_entries)
    arith = make("cuda")
    layer_step = _layer_step(ch, sh, *arith)
    return SimpleNamespace(
        chunk=ch,
        shared_entries=sh,
        group=_group_kernel(ch, sh, layer_step),
        layer=_split_layer_kernel(ch, *arith),
        tail=_tail_kernel(ch, *arith),
        simulated=simulated(),
        **_layout_kernels(ch),
    )


@_dev
def colstart(wcp, coff, fixed, c):
    """First entry of column ``c`` of a layer (``fixed >= 0``: every column holds that many)."""
    if fixed >= 0:
        return int64(c) * fixed
    return int64(wcp[coff + c])


@_dev
def warp_lane():
    """``(lane, warp, warps)``: one warp per output column, lane = row of a 32-row tile; the
    block's warps take every ``warps``-th column from their own."""
    return cuda.threadIdx.x % 32, cuda.threadIdx.x // 32, cuda.blockDim.x // 32


@_dev
def members_of(mp, moff, stride, n, c):
    """Column set ``c`` of a layer as ``(count, first)``: its member columns are
    :func:`member` ``0 .. count - 1``. A strided layer (``stride > 0``, a radix-net's sets
    ``{c, c + stride, c + 2 stride, ...}``) needs no table; otherwise ``mp`` (from ``moff``)
    points into the layer's member list."""
    if stride > 0:
        return n // stride, int64(0)
    return mp[moff + c + 1] - mp[moff + c], mp[moff + c]


@_dev
def member(mc, mcoff, first, stride, c, i):
    """Output column of member ``i`` of column set ``c`` (see :func:`members_of`)."""
    if stride > 0:
        return int64(c) + int64(i) * stride
    return int64(mc[mcoff + first + i])


@_dev
def keep(z, out, o, flag, f):
    """``out[o] = z``, and ``flag[f] = 1`` when ``z`` is non-zero (every writer writes 1: no
    race on the value); returns whether it is."""
    out[o] = z
    if z != float32(0):
        flag[f] = 1
        return True
    return False


#: Columns of the per-layer table ``lt`` (int64), in :func:`layer_of`'s order.
LAYER_FIELDS = 12


@_dev
def layer_of(lt, lv, li):
    """Layer ``li`` of the group as ``(eoff, voff, coff, fixed, hasval, cb, boff, wconst,
    nsets, stride, moff, mcoff, bstep)``: offsets of its indices, values, column starts; entries per
    column (or -1); whether it has values (else every weight is ``wconst``); sets per staged
    batch; offset of its bias; its column sets (the stored "columns" are one per set of
    output columns with the same inputs and weights: a radix-net has N/16), their member
    stride (0: listed) and the offsets of their member pointers and list; the bias step
    (0: one bias for the whole layer, as in the challenge's networks: it is stored once)."""
    return (
        lt[li, 0],
        lt[li, 1],
        lt[li, 2],
        lt[li, 3],
        lt[li, 4] != 0,
        lt[li, 5],
        lt[li, 6],
        lv[li],
        lt[li, 7],
        lt[li, 8],
        lt[li, 9],
        lt[li, 10],
        lt[li, 11],
    )


@_dev
def stage_batch(sh_i, sh_v, wi, wv, ioff, voff, count, hasval):
    """All threads copy ``count`` weights (from ``wi[ioff:]``, ``wv[voff:]``) to shared memory."""
    for q in range(cuda.threadIdx.x, count, cuda.blockDim.x):
        sh_i[q] = int32(wi[ioff + q])
        if hasval:
            sh_v[q] = wv[voff + q]


@_dev
def close_layer(li, nact, prune, orig, flag, misc, stats, wts):
    """After a layer: thread 0 turns the flags of the ``nact`` rows into their new slots
    (``flag[s]`` = slot + 1, 0 for a dead row; a stable scan, so row order is kept), moves the
    original row numbers along when pruning, and adds the layer's statistics (a row counts
    as the inputs it stands for, ``wts``: see :func:`row_weight`)."""
    if cuda.threadIdx.x == 0:
        # Serial over <= chunk flags: cheap next to the layer, and trivially stable.
        cnt = 0
        active = int64(0)
        for s in range(nact):
            if flag[s] != 0:
                active += row_weight(wts, orig, s)
                flag[s] = cnt + 1
                if prune:
                    orig[cnt] = orig[s]
                cnt += 1
        misc[3] = cnt
        cuda.atomic.add(stats, (li, 0), active)
        cuda.atomic.add(stats, (li, 1), misc[1])
        cuda.atomic.add(stats, (li, 2), (nact + 31) // 32)
        cuda.atomic.add(stats, (li, 3), cnt)
    cuda.syncthreads()


@_dev
def row_weight(wts, orig, s):
    """How many inputs the row in slot ``s`` stands for: ``wts = (rw, r0)``, the weight of
    every row of the batch and the chunk's first row; ``orig[s]`` is the slot's row."""
    rw, r0 = wts
    return rw[r0 + int64(orig[s])]


def _layer_step(CH, SH, column_sum, activate):
    """The device function of one layer on one chunk, for chunks of ``CH`` rows and batches
    of at most ``SH`` staged weights."""

    @_dev
    def sweep_columns(rows, cols, staged, net, lay, shared, wts):
        """Column sets ``c0 .. c1`` of the layer (``cols = (c0, c1, q0)``; one warp per set,
        lane = row), each row's sum from shared memory when the batch is ``staged`` (its first
        entry is ``q0``), else from global memory, then written to every member column.
        Flags the active rows left non-zero; returns this thread's count of non-zeros, each
        weighted by its row's :func:`row_weight` (``wts = (rw, r0, orig)``)."""
        c0, c1, q0 = cols
        rw, r0, orig = wts
        cur, nxt, base, nact = rows
        n, wi, wv, wcp, lt, lv, bias, ymax, mp, mc = net
        eoff, voff, coff, fixed, hasval, cb, boff, wconst, nsets, stride, moff, mcoff, bstep = (
            lay
        )
        sh_i, sh_v, flag, misc = shared
        lane, warp, nwarps = warp_lane()
        nnz = 0
        for c in range(c0 + warp, c1, nwarps):
            p0 = colstart(wcp, coff, fixed, c)
            p1 = colstart(wcp, coff, fixed, c + 1)
            cnt, first = members_of(mp, moff, stride, n, c)
            # rows s = lane, lane + 32, ...: the last tile's spare lanes never run (their
            # slots hold no row, possibly never written: summing them multiplied garbage)
            for s in range(lane, nact, 32):
                if staged:
                    z = column_sum(
                        cur, base + s, CH, sh_i, 0, sh_v, 0, p0 - q0, p1 - q0, wconst, hasval
                    )
                else:  # a batch too big for shared memory: straight from global
                    z = column_sum(cur, base + s, CH, wi, eoff, wv, voff, p0, p1, wconst, hasval)
                # One sum, every member column of the set: same inputs and weights, so the
                # same rounding sequence; each member with its own bias.
                for i in range(cnt):
                    col = member(mc, mcoff, first, stride, c, i)
                    z1 = activate(z, bias[boff + col * bstep], ymax)
                    if keep(z1, nxt, base + col * CH + s, flag, s):
                        nnz += row_weight((rw, r0), orig, s)
        return nnz

    @_dev
    def layer_step(rows, li, net, shared, wts):
        """One layer of one chunk: ``nxt[:, :nact] = act(cur[:, :nact] W + b)``; flags the
        surviving rows and counts the layer's (weighted) non-zeros in ``misc[1]``."""
        cur, nxt, base, nact = rows
        n, wi, wv, wcp, lt, lv, bias, ymax, mp, mc = net
        sh_i, sh_v, flag, misc = shared
        for s in range(cuda.threadIdx.x, CH, cuda.blockDim.x):
            flag[s] = 0
        if cuda.threadIdx.x == 0:
            misc[1] = 0
        cuda.syncthreads()
        lay = layer_of(lt, lv, li)
        eoff, voff, coff, fixed, hasval, cb, boff, wconst, nsets, stride, moff, mcoff, bstep = (
            lay
        )
        nnz = int64(0)
        if (nact + 31) // 32 > 0:
            for c0 in range(0, nsets, cb):
                c1 = min(nsets, c0 + cb)
                q0 = colstart(wcp, coff, fixed, c0)
                q1 = colstart(wcp, coff, fixed, c1)
                staged = q1 - q0 <= SH
                if staged:
                    stage_batch(sh_i, sh_v, wi, wv, eoff + q0, voff + q0, q1 - q0, hasval)
                cuda.syncthreads()
                nnz += sweep_columns(rows, (c0, c1, q0), staged, net, lay, shared, wts)
                cuda.syncthreads()
        cuda.atomic.add(misc, 1, nnz)
        cuda.syncthreads()

    return layer_step


def _group_kernel(CH, SH, layer_step):
    """The fused kernel of a layer group, for chunks of ``CH`` rows."""

    @_dev
    def move_rows(frm, to, base, n, nact, flag, pack):
        """Rows ``0 .. nact`` of the chunk at ``base`` from ``frm`` to ``to``, all features;
        with ``pack`` only the flagged rows, each to its new slot ``flag[s] - 1``."""
        lane = cuda.threadIdx.x % 32
        nwarps = cuda.blockDim.x // 32
        ntiles = (nact + 31) // 32
        for j in range(cuda.threadIdx.x // 32, n, nwarps):
            jb = base + int64(j) * CH
            for t in range(ntiles):
                s = t * 32 + lane
                if s < nact:
                    if not pack:
                        to[jb + s] = frm[jb + s]
                    elif flag[s] != 0:
                        to[jb + flag[s] - 1] = frm[jb + s]

    # The launch interface: a kernel takes flat arrays and scalars.
    @cuda.jit
    def group(  # noqa: PLR0913
        src, dst, nrows, n, nl, wi, wv, wcp, lt, lv, bias, ymax, prune, alive, stats, rw, mp, mc
    ):
        """Layers ``0 .. nl-1`` of the tables ``lt``/``lv`` on every chunk; the result of each
        chunk ends in ``dst`` (survivors first), ``alive[row] = 1`` for surviving rows.
        ``rw[row]``: the inputs a row stands for, its weight in ``stats``' rows and non-zeros."""
        tid = cuda.threadIdx.x
        r0 = int64(cuda.blockIdx.x) * CH
        base = r0 * n
        # One per line: the simulator tells shared arrays apart by the line declaring them.
        orig = cuda.shared.array(CH, int32)
        flag = cuda.shared.array(CH, int32)
        # 0: active rows, 1: non-zeros of the layer, 2: 1 when the rows are in ``dst``,
        # 3: survivors of the layer
        misc = cuda.shared.array(4, int64)
        sh_i = cuda.shared.array(SH, int32)
        sh_v = cuda.shared.array(SH, float32)
        shared = (sh_i, sh_v, flag, misc)
        net = (n, wi, wv, wcp, lt, lv, bias, ymax, mp, mc)
        wts = (rw, r0, orig)
        for s in range(tid, CH, cuda.blockDim.x):
            orig[s] = s
        if tid == 0:
            misc[0] = min(int64(CH), nrows - r0)
            misc[2] = 0
        cuda.syncthreads()
        for li in range(nl):
            nact = misc[0]
            in_dst = misc[2]
            if in_dst == 0:
                layer_step((src, dst, base, nact), li, net, shared, wts)
            else:
                layer_step((dst, src, base, nact), li, net, shared, wts)
            close_layer(li, nact, prune, orig, flag, misc, stats, (rw, r0))
            cnt = misc[3]
            compact = prune and cnt < nact
            if compact:  # the layer wrote to the other buffer: move survivors back, packed
                if in_dst == 0:
                    move_rows(dst, src, base, n, nact, flag, True)
                else:
                    move_rows(src, dst, base, n, nact, flag, True)
            cuda.syncthreads()
            if tid == 0:
                if compact:
                    misc[0] = cnt
                else:
                    misc[2] = 1 - in_dst
            cuda.syncthreads()
        nact = misc[0]
        if misc[2] == 0 and nact > 0:
            move_rows(src, dst, base, n, nact, flag, False)
        if prune:
            for s in range(tid, nact, cuda.blockDim.x):
                alive[r0 + orig[s]] = 1

    return group


def _split_layer_kernel(CH, column_sum, activate):
    """One layer over chunks of ``CH`` rows with the columns split over ``blockIdx.y``: the
    kernel for few rows, where one block per chunk (the group kernel) would leave most of the
    device idle. Rows are not repacked: a dead row is a zero row, and a zero row stays zero
    (the bias is only added where the sum is non-zero), so computing it changes no result."""

    @cuda.jit
    def layer(  # noqa: PLR0913
        src, dst, nrows, n, li, cs, wi, wv, wcp, lt, lv, bias, ymax, flags, stats, rw, mp, mc
    ):
        """``dst = act(src W_li + b_li)`` for column sets ``[y * cs, (y + 1) * cs)`` of chunk
        ``x``; ``flags[li * nrows + row] = 1`` for every row left with a non-zero; a non-zero
        counts ``rw[row]`` times in ``stats`` (the inputs its row stands for)."""
        r0 = int64(cuda.blockIdx.x) * CH
        base = r0 * n
        nact = min(int64(CH), nrows - r0)
        lay = layer_of(lt, lv, li)
        eoff, voff, coff, fixed, hasval, cb, boff, wconst, nsets, stride, moff, mcoff, bstep = (
            lay
        )
        c0 = int64(cuda.blockIdx.y) * cs
        c1 = min(nsets, c0 + cs)
        lane, warp, nwarps = warp_lane()
        fbase = int64(li) * nrows + r0
        nnz = int64(0)
        for c in range(c0 + warp, c1, nwarps):
            p0 = colstart(wcp, coff, fixed, c)
            p1 = colstart(wcp, coff, fixed, c + 1)
            cnt, first = members_of(mp, moff, stride, n, c)
            for s in range(lane, nact, 32):
                z = column_sum(src, base + s, CH, wi, eoff, wv, voff, p0, p1, wconst, hasval)
                for i in range(cnt):
                    col = member(mc, mcoff, first, stride, c, i)
                    z1 = activate(z, bias[boff + col * bstep], ymax)
                    if keep(z1, dst, base + col * CH + s, flags, fbase + s):
                        nnz += rw[r0 + s]
        if nnz:
            cuda.atomic.add(stats, (li, 1), nnz)

    return layer


def _tail_kernel(CH, column_sum, activate):
    """Few rows through a whole layer group in one launch: one block per row, its threads
    over the row's column sets, a block barrier between layers. The kernel for the long tail
    of a deep network (a handful of distinct rows left after deduplication, 1,880 layers at
    65536 x 1920), where one launch per layer would cost launch latency and one warp per set
    (lane = row) would leave 31 of 32 lanes idle. Rows never interact, so no grid-wide
    synchronisation is needed; rows are not repacked (a dead row is a zero row and stays
    zero: the bias is only added to non-zero sums)."""

    @cuda.jit
    def tail(  # noqa: PLR0913
        src, b0, b1, nrows, n, nl, wi, wv, wcp, lt, lv, bias, ymax, alive, stats, rw, mp, mc
    ):
        """Layers ``0 .. nl-1`` on row ``blockIdx.x``: layer ``li`` reads ``src`` (``li = 0``)
        or the buffer the previous layer wrote, and writes ``b0`` (even ``li``) or ``b1``
        (odd), so the result is in ``b0`` or ``b1`` by the parity of ``nl - 1`` and ``src`` is
        never written. ``alive[row] = 1`` when the row ends non-zero; per-layer statistics
        as the other kernels (a row counts ``rw[row]`` times in active rows and non-zeros)."""
        row = int64(cuda.blockIdx.x)
        if row >= nrows:
            return
        c = row // CH
        base = c * CH * n + (row - c * CH)  # feature j of the row: base + j * CH
        cnt = cuda.shared.array(1, int64)
        w = rw[row]
        for li in range(nl):
            if li == 0:
                cur = src
            elif li % 2 == 1:
                cur = b0
            else:
                cur = b1
            nxt = b0 if li % 2 == 0 else b1
            if cuda.threadIdx.x == 0:
                cnt[0] = 0
            cuda.syncthreads()
            lay = layer_of(lt, lv, li)
            eoff, voff, coff, fixed, hasval, cb, boff, wconst, nsets, stride, moff, mcoff, bstep = (
            lay
        )
            k = int64(0)
            for cs in range(cuda.threadIdx.x, nsets, cuda.blockDim.x):
                p0 = colstart(wcp, coff, fixed, cs)
                p1 = colstart(wcp, coff, fixed, cs + 1)
                z = column_sum(cur, base, CH, wi, eoff, wv, voff, p0, p1, wconst, hasval)
                members, first = members_of(mp, moff, stride, n, cs)
                for i in range(members):
                    col = member(mc, mcoff, first, stride, cs, i)
                    z1 = activate(z, bias[boff + col * bstep], ymax)
                    nxt[base + col * CH] = z1
                    if z1 != float32(0):
                        k += 1
            if k:
                cuda.atomic.add(cnt, 0, k)
            cuda.syncthreads()  # the layer's writes before the next layer's reads
            if cuda.threadIdx.x == 0:
                kk = cnt[0]
                if kk > 0:
                    cuda.atomic.add(stats, (li, 0), w)
                    cuda.atomic.add(stats, (li, 1), kk * w)
                    cuda.atomic.add(stats, (li, 3), 1)
                if row % 32 == 0:  # tiles of 32 rows, as the other kernels count work
                    cuda.atomic.add(stats, (li, 2), 1)
                if li == nl - 1 and kk > 0:
                    alive[row] = 1
            cuda.syncthreads()

    return tail


def _layout_kernels(CH):
    """The kernels that fill, read and reorder chunked rows (``CH`` rows per chunk), by name."""

    @_dev
    def row_base(row, n):
        """Where feature 0 of ``row`` lives (feature ``j`` is ``CH * j`` further)."""
        c = row // CH
        return int64(c) * CH * n + (row - c * CH)

    @cuda.jit
    def fill_zero(a):
        for k in range(cuda.grid(1), a.size, cuda.gridsize(1)):
            a[k] = float32(0)

    @cuda.jit
    def scatter_csr(indptr, indices, data, nrows, n, out):
        """Dense chunks from CSR rows (duplicates must already be summed)."""
        for row in range(cuda.grid(1), nrows, cuda.gridsize(1)):
            base = row_base(row, n)
            for p in range(indptr[row], indptr[row + 1]):
                out[base + int64(indices[p]) * CH] = data[p]

    @cuda.jit
    def gather_rows(src, pos, nout, ooff, n, out):
        """Row ``ooff + i`` of ``out`` = the row of ``src`` at packed position ``pos[i]``."""
        for i in range(cuda.grid(1), nout, cuda.gridsize(1)):
            sb = row_base(pos[i], n)
            ob = row_base(ooff + i, n)
            for j in range(n):
                out[ob + int64(j) * CH] = src[sb + int64(j) * CH]

    @cuda.jit
    def row_counts(y, nrows, n, counts):
        """Non-zeros of every row (``counts[row]``); a row's sum is non-zero iff this is."""
        for row in range(cuda.grid(1), nrows, cuda.gridsize(1)):
            base = row_base(row, n)
            k = 0
            for j in range(n):
                if y[base + int64(j) * CH] != float32(0):
                    k += 1
            counts[row] = k

    @cuda.jit
    def to_csr(y, nrows, n, indptr, indices, data):
        """CSR rows (``indptr`` from the counts of :func:`row_counts`) from dense chunks."""
        for row in range(cuda.grid(1), nrows, cuda.gridsize(1)):
            base = row_base(row, n)
            p = indptr[row]
            for j in range(n):
                v = y[base + int64(j) * CH]
                if v != float32(0):
                    indices[p] = j
                    data[p] = v
                    p += 1

    return {
        **_dedup_kernels(CH, row_base),
        "fill_zero": fill_zero,
        "scatter_csr": scatter_csr,
        "gather_rows": gather_rows,
        "row_counts": row_counts,
        "to_csr": to_csr,
    }


def _dedup_kernels(CH, row_base):
    """The kernels that find identical rows on the device (``row_base``: where a row's
    feature 0 lives in its chunk)."""

    @cuda.jit
    def row_hashes(bits, nrows, n, fs, h1, h2, cnt):
        """Two hashes and the count of every row's non-zero entries, over features
        ``[y * fs, (y + 1) * fs)`` (``blockIdx.y``), added to ``h1``/``h2``/``cnt`` (zeroed by
        the caller). ``bits``: the rows' float32 buffer viewed as uint32. Each entry adds a mix
        of (bit pattern, feature), so the slices' sums combine in any order; ``+0`` and
        ``-0`` count as no entry (the CSR form drops both). Equal hashes are candidates only:
        :func:`rows_differ` checks them."""
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        nwarps = cuda.blockDim.x // 32
        row = int64(cuda.blockIdx.x) * 32 + lane
        if row >= nrows:
            return
        c0 = int64(cuda.blockIdx.y) * fs
        c1 = min(n, c0 + fs)
        base = row_base(row, n)
        k1 = uint64(0x9E3779B97F4A7C15)
        k2 = uint64(0xC2B2AE3D27D4EB4F)
        a1 = uint64(0)
        a2 = uint64(0)
        k = int64(0)
        for j in range(c0 + warp, c1, nwarps):
            b = bits[base + int64(j) * CH]
            if b & uint32(0x7FFFFFFF) != uint32(0):
                v = (uint64(b) << uint64(32)) | uint64(j)
                a1 += (v ^ (v >> uint64(29))) * k1
                w = v * k2
                a2 += w ^ (w >> uint64(31))
                k += 1
        if k:
            cuda.atomic.add(h1, row, a1)
            cuda.atomic.add(h2, row, a2)
            cuda.atomic.add(cnt, row, k)

    @cuda.jit
    def rows_differ(abits, bbits, pa, pb, npairs, n, fs, out):
        """``out[i] = 1`` when row ``pa[i]`` of ``abits`` and row ``pb[i]`` of ``bbits`` differ
        in a feature of ``[y * fs, (y + 1) * fs)`` (bit patterns; ``+0`` equals ``-0``).
        ``out`` is zeroed by the caller; every writer writes 1."""
        i = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        if i >= npairs:
            return
        c0 = int64(cuda.blockIdx.y) * fs
        c1 = min(n, c0 + fs)
        ra = row_base(pa[i], n)
        rb = row_base(pb[i], n)
        for j in range(c0, c1):
            a = abits[ra + int64(j) * CH]
            b = bbits[rb + int64(j) * CH]
            if a != b and (a | b) & uint32(0x7FFFFFFF) != uint32(0):
                out[i] = 1
                break

    return {"row_hashes": row_hashes, "rows_differ": rows_differ}


#: Argument types of every kernel as the backend launches them (for :func:`ptx`).
_SIGNATURES = {
    "group": "void(float32[::1], float32[::1], int64, int64, int64, {index}[::1], float32[::1], "
    "int64[::1], int64[:, ::1], float32[::1], float32[::1], float32, boolean, uint8[::1], "
    "int64[:, ::1], int64[::1], int64[::1], {index}[::1])",
    "layer": "void(float32[::1], float32[::1], int64, int64, int64, int64, {index}[::1], "
    "float32[::1], int64[::1], int64[:, ::1], float32[::1], float32[::1], float32, uint8[::1], "
    "int64[:, ::1], int64[::1], int64[::1], {index}[::1])",
    "tail": "void(float32[::1], float32[::1], float32[::1], int64, int64, int64, {index}[::1], "
    "float32[::1], int64[::1], int64[:, ::1], float32[::1], float32[::1], float32, uint8[::1], "
    "int64[:, ::1], int64[::1], int64[::1], {index}[::1])",
    "fill_zero": "void(float32[::1])",
    "scatter_csr": "void(int64[::1], int32[::1], float32[::1], int64, int64, float32[::1])",
    "gather_rows": "void(float32[::1], int64[::1], int64, int64, int64, float32[::1])",
    "row_counts": "void(float32[::1], int64, int64, int64[::1])",
    "to_csr": "void(float32[::1], int64, int64, int64[::1], int32[::1], float32[::1])",
    "row_hashes": "void(uint32[::1], int64, int64, int64, uint64[::1], uint64[::1], int64[::1])",
    "rows_differ": "void(uint32[::1], uint32[::1], int64[::1], int64[::1], int64, int64, int64, "
    "uint8[::1])",
}


def ptx(cc=(9, 0), chunk: int = 128, index: str = "uint16") -> dict:
    """PTX of every kernel for compute capability ``cc`` (needs libNVVM, not a driver).

    Used by the tests to prove that no instruction fuses a multiply and an add, and that no
    float64 arithmetic crept in (a float literal typed as float64 would promote the sums).
    """
    if simulated():
        raise RuntimeError("PTX cannot be compiled under the CUDA simulator")
    from numba.cuda import dispatcher

    class _Target:  # device functions ask the current device for its capability
        compute_capability = tuple(cc)

    ns = kernels(chunk)
    ask = dispatcher.get_current_device
    dispatcher.get_current_device = _Target
    try:
        out = {}
        for name, sig in _SIGNATURES.items():
            text, _ = cuda.compile_ptx(
                getattr(ns, name).py_func, sig.format(index=index), cc=tuple(cc)
            )
            out[name] = text
    finally:
        dispatcher.get_current_device = ask
    return out


#: Registers per kernel as ptxas 12.x reports them for sm_90 (``resources``), recorded when
#: each kernel last changed. ``tests/test_gpu_sim.py`` fails on any spill and on a count that
#: would halve the resident warps of a multiprocessor against this budget
#: (:func:`warps_per_sm`); a smaller change is reported, not failed.
REGISTER_BUDGET = {
    "group": 128,  # 16 warps per SM: 2 blocks of 8 warps (column sets, 2026-11-27)
    "layer": 80,  # 72 before the bias step
    "tail": 56,  # 1024 threads per block fit (57,344 registers); 54 with the bias step
    "fill_zero": 28,
    "scatter_csr": 40,
    "gather_rows": 32,
    "row_counts": 32,
    "to_csr": 32,
    "row_hashes": 32,
    "rows_differ": 26,
}


def warps_per_sm(registers: int, regs_per_sm: int = 65536, max_warps: int = 64) -> int:
    """Warps a Hopper multiprocessor can hold at ``registers`` per thread (registers are
    allocated per warp in units of 256, i.e. 8 per thread)."""
    per_warp = 32 * 8 * -(-max(1, int(registers)) // 8)
    return min(max_warps, regs_per_sm // per_warp)


def _ptxas_exe() -> str:
    """ptxas from the nvidia-cuda-nvcc wheel (the test extra), else from the PATH."""
    import shutil
    from pathlib import Path

    try:
        import nvidia.cuda_nvcc as nvcc

        exe = Path(list(nvcc.__path__)[0]) / "bin" / "ptxas"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    exe = shutil.which("ptxas")
    if exe is None:
        raise RuntimeError("ptxas not found (pip install nvidia-cuda-nvcc-cu12)")
    return exe


def resources(ptx_by_name: dict, cc=(9, 0)) -> dict:
    """``ptxas -v`` for every kernel's PTX: registers, spill stores and loads, stack frame
    and shared memory in bytes, and the warps per multiprocessor the registers allow."""
    import re
    import subprocess
    import tempfile

    exe = _ptxas_exe()
    arch = f"sm_{cc[0]}{cc[1]}"
    out = {}
    for name, text in ptx_by_name.items():
        with tempfile.TemporaryDirectory() as tmp:
            src = f"{tmp}/{name}.ptx"
            with open(src, "w") as fh:
                fh.write(text)
            proc = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", f"{tmp}/{name}.cubin"],
                                  capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed on {name}: {proc.stderr[-2000:]}")
        info = proc.stderr

        def num(pattern, text=info):
            m = re.search(pattern, text)
            return int(m.group(1)) if m else 0

        regs = num(r"Used (\d+) registers")
        out[name] = {
            "registers": regs,
            "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"),
            "stack_frame": num(r"(\d+) bytes stack frame"),
            "shared": num(r"(\d+) bytes smem"),
            "warps_per_sm": warps_per_sm(regs),
            "ptxas": exe,
        }
    return out
