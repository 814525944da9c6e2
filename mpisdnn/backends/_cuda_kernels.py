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

# Module level (not inside the factory): the simulator swaps the ``cuda`` global of kernels.
from numba import cuda, float32, int32, int64

from ._cuda_arith import make, simulated

__all__ = ["kernels", "SHARED_ENTRIES", "STAT_FIELDS"]

#: Weight entries (index + value) one block stages in shared memory at once (16 KiB).
SHARED_ENTRIES = 2048
#: Columns of the per-layer statistics array.
STAT_FIELDS = 3


@functools.cache
def kernels(chunk: int, shared_entries: int = SHARED_ENTRIES):
    """The kernels for chunks of ``chunk`` rows (a multiple of 32) staging at most
    ``shared_entries`` weights per column batch, as a namespace (compiled on first launch)."""
    if chunk % 32 or chunk < 32:
        raise ValueError(f"chunk rows must be a positive multiple of 32, got {chunk}")
    from types import SimpleNamespace

    column_sum, activate = make("cuda")
    CH = chunk
    SH = int(shared_entries)

    def colstart(wcp, coff, fixed, c):
        if fixed >= 0:
            return int64(c) * fixed
        return int64(wcp[coff + c])

    dev = cuda.jit(device=True)
    colstart = dev(colstart)

    def layer_step(cur, nxt, base, n, nact, li, wi, wv, wcp, lt, lv, bias, ymax, sh_i, sh_v,
                   flag, misc):
        """One layer of one chunk: ``nxt[:, :nact] = act(cur[:, :nact] W + b)``."""
        tid = cuda.threadIdx.x
        nthr = cuda.blockDim.x
        lane = tid % 32
        warp = tid // 32
        nwarps = nthr // 32
        for s in range(tid, CH, nthr):
            flag[s] = 0
        if tid == 0:
            misc[1] = 0
        cuda.syncthreads()
        ntiles = (nact + 31) // 32
        eoff = lt[li, 0]
        voff = lt[li, 1]
        coff = lt[li, 2]
        fixed = lt[li, 3]
        hasval = lt[li, 4] != 0
        cb = lt[li, 5]
        boff = lt[li, 6]
        wconst = lv[li]
        nnz_local = 0
        if ntiles > 0:
            for c0 in range(0, n, cb):
                c1 = min(n, c0 + cb)
                q0 = colstart(wcp, coff, fixed, c0)
                q1 = colstart(wcp, coff, fixed, c1)
                staged = q1 - q0 <= SH
                if staged:
                    for q in range(tid, q1 - q0, nthr):
                        sh_i[q] = int32(wi[eoff + q0 + q])
                        if hasval:
                            sh_v[q] = wv[voff + q0 + q]
                cuda.syncthreads()
                for c in range(c0 + warp, c1, nwarps):
                    p0 = colstart(wcp, coff, fixed, c)
                    p1 = colstart(wcp, coff, fixed, c + 1)
                    b = bias[boff + c]
                    obase = base + int64(c) * CH
                    for t in range(ntiles):
                        s = t * 32 + lane
                        if staged:
                            z = column_sum(
                                cur, base + s, CH, sh_i, 0, sh_v, 0, p0 - q0, p1 - q0, wconst,
                                hasval,
                            )
                        else:  # a batch too big for shared memory: straight from global
                            z = column_sum(
                                cur, base + s, CH, wi, eoff, wv, voff, p0, p1, wconst, hasval
                            )
                        z = activate(z, b, ymax)
                        nxt[obase + s] = z
                        if s < nact and z != float32(0):
                            flag[s] = 1
                            nnz_local += 1
                cuda.syncthreads()
        cuda.atomic.add(misc, 1, nnz_local)
        cuda.syncthreads()

    layer_step = dev(layer_step)

    @cuda.jit
    def group(src, dst, nrows, n, nl, wi, wv, wcp, lt, lv, bias, ymax, prune, alive, stats):
        """Layers ``0 .. nl-1`` of the tables ``lt``/``lv`` on every chunk; the result of each
        chunk ends in ``dst`` (survivors first), ``alive[row] = 1`` for surviving rows."""
        tid = cuda.threadIdx.x
        nthr = cuda.blockDim.x
        lane = tid % 32
        warp = tid // 32
        nwarps = nthr // 32
        chunk_id = cuda.blockIdx.x
        r0 = int64(chunk_id) * CH
        base = r0 * n
        orig = cuda.shared.array(CH, int32)
        flag = cuda.shared.array(CH, int32)
        # 0: active rows, 1: non-zeros of the layer, 2: 1 when the rows are in ``dst``,
        # 3: survivors of the layer
        misc = cuda.shared.array(4, int64)
        sh_i = cuda.shared.array(SH, int32)
        sh_v = cuda.shared.array(SH, float32)
        nr = min(int64(CH), nrows - r0)
        for s in range(tid, CH, nthr):
            orig[s] = s
        if tid == 0:
            misc[0] = nr
            misc[2] = 0
        cuda.syncthreads()
        for li in range(nl):
            nact = misc[0]
            in_dst = misc[2]
            if in_dst == 0:
                layer_step(src, dst, base, n, nact, li, wi, wv, wcp, lt, lv, bias, ymax,
                           sh_i, sh_v, flag, misc)
            else:
                layer_step(dst, src, base, n, nact, li, wi, wv, wcp, lt, lv, bias, ymax,
                           sh_i, sh_v, flag, misc)
            if tid == 0:
                # Serial stable scan over <= CH flags: new slots, and the rows they hold.
                cnt = 0
                for s in range(nact):
                    if flag[s] != 0:
                        flag[s] = cnt + 1  # 1-based new slot (0 stays "dead")
                        if prune:
                            orig[cnt] = orig[s]
                        cnt += 1
                misc[3] = cnt
                cuda.atomic.add(stats, (li, 0), cnt)
                cuda.atomic.add(stats, (li, 1), misc[1])
                cuda.atomic.add(stats, (li, 2), (nact + 31) // 32)
            cuda.syncthreads()
            cnt = misc[3]
            compact = prune and cnt < nact
            if compact:
                # The layer wrote to the other buffer; move survivors back, packed.
                ntiles = (nact + 31) // 32
                for j in range(warp, n, nwarps):
                    jb = base + int64(j) * CH
                    for t in range(ntiles):
                        s = t * 32 + lane
                        if s < nact and flag[s] != 0:
                            if in_dst == 0:
                                src[jb + flag[s] - 1] = dst[jb + s]
                            else:
                                dst[jb + flag[s] - 1] = src[jb + s]
            cuda.syncthreads()
            if tid == 0:
                if compact:
                    misc[0] = cnt
                else:
                    misc[2] = 1 - in_dst
            cuda.syncthreads()
        nact = misc[0]
        if misc[2] == 0 and nact > 0:
            ntiles = (nact + 31) // 32
            for j in range(warp, n, nwarps):
                jb = base + int64(j) * CH
                for t in range(ntiles):
                    s = t * 32 + lane
                    if s < nact:
                        dst[jb + s] = src[jb + s]
        if prune:
            for s in range(tid, nact, nthr):
                alive[r0 + orig[s]] = 1

    @cuda.jit
    def fill_zero(a):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        for k in range(i, a.size, stride):
            a[k] = float32(0)

    @cuda.jit
    def scatter_csr(indptr, indices, data, nrows, n, out):
        """Dense chunks from CSR rows (duplicates must already be summed)."""
        r = cuda.grid(1)
        stride = cuda.gridsize(1)
        for row in range(r, nrows, stride):
            c = row // CH
            s = row - c * CH
            base = int64(c) * CH * n + s
            for p in range(indptr[row], indptr[row + 1]):
                out[base + int64(indices[p]) * CH] = data[p]

    @cuda.jit
    def gather_rows(src, pos, nout, ooff, n, out):
        """Row ``ooff + i`` of ``out`` = the row of ``src`` at packed position ``pos[i]``."""
        i0 = cuda.grid(1)
        stride_r = cuda.gridsize(1)
        for i in range(i0, nout, stride_r):
            p = pos[i]
            sc = p // CH
            sb = sc * CH * n + (p - sc * CH)
            o = ooff + i
            oc = o // CH
            ob = int64(oc) * CH * n + (o - oc * CH)
            for j in range(n):
                out[ob + int64(j) * CH] = src[sb + int64(j) * CH]

    @cuda.jit
    def row_counts(y, nrows, n, counts):
        """Non-zeros of every row (``counts[row]``); a row's sum is non-zero iff this is."""
        r = cuda.grid(1)
        stride = cuda.gridsize(1)
        for row in range(r, nrows, stride):
            c = row // CH
            base = int64(c) * CH * n + (row - c * CH)
            k = 0
            for j in range(n):
                if y[base + int64(j) * CH] != float32(0):
                    k += 1
            counts[row] = k

    @cuda.jit
    def to_csr(y, nrows, n, indptr, indices, data):
        r = cuda.grid(1)
        stride = cuda.gridsize(1)
        for row in range(r, nrows, stride):
            c = row // CH
            base = int64(c) * CH * n + (row - c * CH)
            p = indptr[row]
            for j in range(n):
                v = y[base + int64(j) * CH]
                if v != float32(0):
                    indices[p] = j
                    data[p] = v
                    p += 1

    return SimpleNamespace(
        chunk=CH,
        shared_entries=SH,
        group=group,
        fill_zero=fill_zero,
        scatter_csr=scatter_csr,
        gather_rows=gather_rows,
        row_counts=row_counts,
        to_csr=to_csr,
        simulated=simulated(),
    )


#: Argument types of every kernel as the backend launches them (for :func:`ptx`).
_SIGNATURES = {
    "group": "void(float32[::1], float32[::1], int64, int64, int64, {index}[::1], float32[::1], "
    "int64[::1], int64[:, ::1], float32[::1], float32[::1], float32, boolean, uint8[::1], "
    "int64[:, ::1])",
    "fill_zero": "void(float32[::1])",
    "scatter_csr": "void(int64[::1], int32[::1], float32[::1], int64, int64, float32[::1])",
    "gather_rows": "void(float32[::1], int64[::1], int64, int64, int64, float32[::1])",
    "row_counts": "void(float32[::1], int64, int64, int64[::1])",
    "to_csr": "void(float32[::1], int64, int64, int64[::1], int32[::1], float32[::1])",
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
