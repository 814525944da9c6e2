"""Top-k rows of a symmetric weighting from the upper triangle (half the kernel's work).

For a symmetric weighting ``H[u, v] == H[v, u]`` bit for bit (every weighting but ``hive``:
the sums run over the same ``k`` in the same ascending order, and the formulas that finish
them are symmetric in ``u`` and ``v``), so the upper-triangle kernel computes every entry
once and each one can be offered to both of its rows: to row ``u`` as column ``v`` and to
row ``v`` as column ``u`` (the kernel does it as each row is emitted, while the row is in
cache: ``_kernels.offer_row``). Every thread keeps a bounded heap of ``k`` entries per row of
the whole matrix (the rows of the other ranks included); at the end the threads' heaps are
merged per row, sent to the rank that owns the row, merged again and written in column
order.

The top ``k`` under a strict total order (weight, then the smaller column) of a union is the
top ``k`` of the parts' top ``k``s, so the rows are the fused kernel's rows, the same bytes at
every rank, thread and chunk count. The price is memory: ``(threads + 3) x n x k`` heap
entries per rank, on top of ``memory_per_rank``; the driver takes this path only when asked
(``ProjectionOptions.top_k_upper``).
"""

from __future__ import annotations

import time

import numpy as np

from . import _kernels as K

__all__ = ["UpperTopK"]

#: Entries handed to the sink at a time (bounds the text writers' formatting buffers).
_PIECE = 1 << 20


class UpperTopK:
    """An upper-triangle projection's per-row top-``k`` heaps, filled by the kernel.

    ``holder`` is a list holding the kernel's :class:`~._kernels.Scratch`, whose ``m_*``
    heaps it fills (``Rule.mirror = k``): :func:`mpisdnn.projection._chunks._run_chunks` keeps
    nothing of a chunk (``offered``), and :meth:`write` then empties the list (the
    per-thread arrays go once the heaps are merged, before the exchange), produces this
    rank's rows and streams them to the real sink.
    """

    #: The kernel has offered every entry already: a chunk leaves nothing to write.
    offered = True

    def __init__(self, holder, sink):
        scratch = holder[0]
        self._holder = holder
        self.heaps = (scratch.m_idx, scratch.m_val, scratch.m_cnt, scratch.m_root)
        self.n = scratch.m_cnt.shape[1]
        self.k = scratch.m_idx.shape[1] // max(self.n, 1)
        self.sink = sink

    def abort(self) -> None:
        self.sink.abort()

    def write(self, comm, offsets) -> tuple[int, float, float]:
        """Merge the heaps, exchange them with the rows' owners (``offsets``: every rank's
        first row) and write this rank's rows to the sink (collective).

        Returns ``(entries written, merge seconds, write seconds)``.
        """
        t0 = time.perf_counter()
        r0, r1 = int(offsets[comm.rank]), int(offsets[comm.rank + 1])
        h_idx, h_val, h_cnt, _ = self.heaps
        self.heaps = None
        self._holder.clear()
        n, k = self.n, self.k
        serial = comm.size == 1
        o_idx, o_val = np.empty(n * k, h_idx.dtype), np.empty(n * k, h_val.dtype)
        o_cnt = np.zeros(n, np.int64)
        # one rank: the threads' heaps give the rows directly (in column order)
        K.merge_heaps(h_idx, h_val, h_cnt, k, o_idx, o_val, o_cnt, serial)
        del h_idx, h_val, h_cnt
        if not serial:
            o_idx, o_val, o_cnt = self._exchange(comm, offsets, o_idx, o_val, o_cnt)
        rows = r1 - r0
        keep = np.arange(k) < o_cnt[:rows, None]
        idx = o_idx[: rows * k].reshape(rows, k)[keep]
        val = o_val[: rows * k].reshape(rows, k)[keep]
        counts = o_cnt[:rows]
        t1 = time.perf_counter()
        # whole rows, about _PIECE entries at a time
        ends = np.concatenate(([0], np.cumsum(counts)))
        lo = 0
        while lo < rows:
            hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] + _PIECE, side="right")) - 1)
            hi = min(hi, rows)
            a, b = int(ends[lo]), int(ends[hi])
            self.sink.write(r0 + lo, counts[lo:hi], idx[a:b], val[a:b])
            lo = hi
        return int(idx.size), t1 - t0, time.perf_counter() - t1

    def _exchange(self, comm, offsets, o_idx, o_val, o_cnt):
        """Send every row's candidates to its owner; merge what arrives, in column order."""
        from ..parallel import alltoallv_array

        k = self.k
        r0, r1 = int(offsets[comm.rank]), int(offsets[comm.rank + 1])
        rows = r1 - r0
        row_split = np.diff(np.asarray(offsets, dtype=np.int64))
        keep = np.arange(k) < o_cnt[:, None]
        s_idx = o_idx.reshape(-1, k)[keep]  # row-major: grouped by row, so by owner
        s_val = o_val.reshape(-1, k)[keep]
        ends = np.concatenate(([0], np.cumsum(o_cnt)))
        per_rank = ends[np.asarray(offsets, dtype=np.int64)]
        send = np.diff(per_rank)
        cnt = alltoallv_array(comm, o_cnt, row_split, np.full(comm.size, rows, np.int64))
        cnt = cnt.reshape(comm.size, rows)
        recv = cnt.sum(axis=1)
        r_idx = alltoallv_array(comm, s_idx, send, recv)
        r_val = alltoallv_array(comm, s_val, send, recv)
        del s_idx, s_val, o_idx, o_val
        # back into fixed slots (source, row, k): the merge reads candidates by row
        d_idx = np.empty((comm.size, rows, k), r_idx.dtype)
        d_val = np.empty((comm.size, rows, k), r_val.dtype)
        slots = np.arange(k) < cnt[..., None]
        d_idx[slots] = r_idx
        d_val[slots] = r_val
        m_idx, m_val = np.empty(rows * k, r_idx.dtype), np.empty(rows * k, r_val.dtype)
        m_cnt = np.zeros(rows, np.int64)
        K.merge_heaps(
            d_idx.reshape(comm.size, rows * k),
            d_val.reshape(comm.size, rows * k),
            cnt,
            k,
            m_idx,
            m_val,
            m_cnt,
            True,
        )
        return m_idx, m_val, m_cnt
