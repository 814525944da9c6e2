"""The projection's chunk loop: the kernel's scratch, chunks into the sink, the writer's overlap.

:func:`_allocate` makes the per-thread scratch once; :func:`_run_chunks` walks this rank's
rows chunk by chunk (each chunk's rows cut into blocks of equal work, claimed by the threads)
and hands each chunk to the sink, in place where the sink stages it; :func:`_compute_into`
adds the upper-triangle top-k's merge; :func:`_write_times` moves the time the loop waited
for the writer thread from compute to write. Split from :mod:`mpisdnn.projection.core`.
"""

from __future__ import annotations

import time

import numpy as np

from ..partition import balanced_blocks
from .plan import BLOCKS_PER_THREAD, ProjectionPlan


def _allocate(pl: ProjectionPlan):
    """The allocate step: the kernel's per-thread :class:`~._kernels.Scratch` (accumulators,
    bitmaps, touched lists, float-mode flags, top-k selection, and with ``mirror = k`` the
    per-thread top-k heaps of every row that the upper-triangle top-k fills)."""
    from ._kernels import Scratch

    nthreads, n, flags, top_k, mirror = (
        pl.threads, pl.shape[1], not pl.counting, pl.kernel_top_k, pl.heap_k
    )  # fmt: skip
    acc_dtype, idx_dtype, val_dtype = pl.acc_dtype, pl.idx_dtype, pl.val_dtype
    acc = np.zeros((nthreads, n), dtype=acc_dtype)
    bits = np.zeros((nthreads, n // 64 + 1), dtype=np.uint64)
    # +1: the branch-free kernel stores every visited column at tl[t] before counting it
    tls = np.empty((nthreads, n + 1), dtype=idx_dtype)
    seens = np.zeros((nthreads, n if flags else 1), dtype=np.uint8)
    kk = min(n, int(top_k)) if top_k else 1  # the row's bounded heap
    sc_idx = np.empty((nthreads, kk), dtype=idx_dtype)
    sc_val = np.empty((nthreads, kk), dtype=val_dtype)
    rows = n if mirror else 1
    heaps = (
        np.empty((nthreads, rows * max(mirror, 1)), dtype=idx_dtype),
        np.empty((nthreads, rows * max(mirror, 1)), dtype=val_dtype),
        np.zeros((nthreads, rows), dtype=np.int64),
        np.full((nthreads, rows), -np.inf),
    )
    return Scratch(acc, bits, tls, seens, sc_idx, sc_val, *heaps)


def _tuning(opts):
    """The kernel-path ratios: the options' where given, else the kernels' defaults."""
    from . import _kernels as K

    def pick(value, default):
        return float(value if value is not None else default)

    return K.Tuning(
        pick(opts.dense_ratio, K.DENSE_RATIO),
        pick(opts.sweep_ratio, K.SWEEP_RATIO),
        pick(opts.mark_ratio, K.MARK_RATIO),
    )


def _compute_into(comm, sink, heaps, pl: ProjectionPlan, local_work, run_chunk):
    """Run the plan's chunks into ``sink``; with ``heaps`` (upper-triangle top-k: a list
    holding the kernel's :class:`~._kernels.Scratch`, whose heaps it fills) through
    :class:`~.topk.UpperTopK`, merged over the ranks and written at the end. Returns
    ``(entries, compute s, write s)``."""
    if heaps is None:
        return _run_chunks(pl, local_work, sink, run_chunk)
    from .topk import UpperTopK

    target = UpperTopK(heaps, sink)
    _, t_compute, t_write = _run_chunks(pl, local_work, target, run_chunk)
    try:
        nnz_local, t_merge, t_out = target.write(comm, pl.offsets)
    except BaseException:
        sink.abort()
        raise
    return nnz_local, t_compute + t_merge, t_write + t_out


def _run_chunks(pl: ProjectionPlan, local_work, sink, run_chunk):
    """The run step: every chunk of this rank's rows through the kernel into the sink.

    Returns ``(entries, compute_seconds, write_seconds)``; the sink is aborted on any error.
    """
    from ..system import populate, small_pages
    from . import _kernels as K

    chunks, max_cap, nthreads, r0 = pl.chunks, pl.max_cap, pl.threads, pl.rows[0]
    idx_dtype, val_dtype = pl.idx_dtype, pl.val_dtype
    cum_ub = np.concatenate(([0], np.cumsum(pl.bounds)))
    out_idx = out_val = None
    nnz_local = 0
    t_compute = t_write = 0.0
    try:
        for c0, c1 in zip(chunks[:-1].tolist(), chunks[1:].tolist()):
            tc = time.perf_counter()
            nrows = c1 - c0
            nb = max(1, min(nrows, nthreads * BLOCKS_PER_THREAD))
            blk = balanced_blocks(local_work[c0:c1] + 1, nb)
            # one spare slot per block for the branch-free emit (see _kernels.Chunk)
            blk_cap = cum_ub[c0 + blk] - cum_ub[c0] + np.arange(nb + 1)
            if out_idx is None:
                out_idx = np.empty(max_cap, dtype=idx_dtype)
                out_val = np.empty(max_cap, dtype=val_dtype)
                small_pages(out_idx)
                small_pages(out_val)
                populate(out_idx)
                populate(out_val)
            row_cnt = np.zeros(nrows, dtype=np.int64)
            blk_cnt = np.zeros(nb, dtype=np.int64)
            run_chunk(r0 + c0, local_work[c0:c1], blk, blk_cap, out_idx, out_val, row_cnt, blk_cnt)
            if sink.offered:
                # the kernel offered the entries to the rows' top-k heaps (.topk); none kept
                k = 0
                t_compute += time.perf_counter() - tc
            elif sink.staged:
                # blocks go straight from the work buffer to their final place (memory, or a
                # staging buffer that a writer thread empties while the next chunk computes)
                sink.append_blocks(row_cnt, out_idx, out_val, blk_cap, blk_cnt)
                k = int(blk_cnt.sum())
                t_compute += time.perf_counter() - tc
            else:
                k = int(K.compact(out_idx, out_val, blk_cap, blk_cnt))
                tw = time.perf_counter()
                t_compute += tw - tc
                sink.write(r0 + c0, row_cnt, out_idx[:k], out_val[:k])
                t_write += time.perf_counter() - tw
            nnz_local += k
    except BaseException:
        sink.abort()
        raise
    return nnz_local, t_compute, t_write


def _write_times(sink, t_compute, t_write, t_finish, written_bytes):
    """Compute and write seconds, and the writer thread's figures for the report.

    A writer thread's busy time overlaps the computation; the time the loop waited for a
    free buffer does not, so it moves from compute to write.
    """
    t_thread = float(sink.write_seconds) if sink.staged else 0.0
    t_wait = float(sink.wait_seconds)
    figures = {
        "write_thread_seconds": t_thread,
        "write_wait_seconds": t_wait,
        "finish_seconds": t_finish,
        "overlap_seconds": max(0.0, t_thread - t_wait - (t_finish if t_thread else 0.0)),
        "written_bytes": int(written_bytes),
    }
    return t_compute - t_wait, t_write + t_wait, figures
