"""Fused CPU backend: one numba pass per layer (multiply, bias, ReLU, clip, compaction).

SuiteSparse:GraphBLAS and scipy need four passes per layer (mxm, bias, select, min); the
non-multiply passes dominate at these sparsities, so fusing them is the main win.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ..errors import BackendError
from .base import Backend

#: Scratch entries per batch; bounds temporary memory to ~8 bytes x this per rank.
SCRATCH_ENTRIES = 1 << 23


class CpuBackend(Backend):
    """Numba backend. ``threads`` sets numba's thread count (default: all cores / local ranks)."""

    name = "cpu"

    def __init__(self, threads=None, scratch_entries=SCRATCH_ENTRIES, **_):
        try:
            import numba

            from . import _kernels
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            raise BackendError(f"backend 'cpu' needs numba: {exc}") from None
        self._k = _kernels
        if threads:
            numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
        self.threads = numba.get_num_threads()
        self.scratch_entries = int(scratch_entries)

    def describe(self):
        return {"name": self.name, "threads": self.threads}

    def to_device(self, mat):
        m = sp.csr_matrix(mat, dtype=np.float32, copy=True)
        m.sort_indices()  # the canonical summation order (see sdnn.reference)
        return sp.csr_matrix(
            (
                m.data.astype(np.float32, copy=False),
                m.indices.astype(np.int32, copy=False),
                m.indptr.astype(np.int64, copy=False),
            ),
            shape=m.shape,
        )

    def to_host(self, mat):
        return mat

    def row_nnz(self, y):
        return np.diff(y.indptr).astype(np.int64)

    def take_rows(self, y, rows):
        rows = np.asarray(rows, dtype=np.int64)
        lens = np.diff(y.indptr)[rows]
        indptr = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        take = _ranges(y.indptr[rows], lens)
        return sp.csr_matrix((y.data[take], y.indices[take], indptr), shape=(rows.size, y.shape[1]))

    def layer(self, y, w, bias, ymax):
        n = w.shape[1]
        yp = y.indptr.astype(np.int64, copy=False)
        yi = y.indices.astype(np.int32, copy=False)
        yd = y.data.astype(np.float32, copy=False)
        wp, wi, wd = w.indptr, w.indices, w.data
        bias = np.ascontiguousarray(bias, dtype=np.float32)
        nrows = y.shape[0]
        if nrows == 0:
            return sp.csr_matrix((0, n), dtype=np.float32)
        ub = self._k.row_bounds(yp, yi, wp, n)
        cum = np.concatenate(([0], np.cumsum(ub)))
        counts = np.empty(nrows, np.int64)
        parts_i, parts_d = [], []
        r0 = 0
        while r0 < nrows:
            # Largest batch whose scratch fits the bound (at least one row).
            r1 = int(np.searchsorted(cum, cum[r0] + self.scratch_entries, side="right")) - 1
            r1 = min(max(r1, r0 + 1), nrows)
            off = cum[r0:r1] - cum[r0]
            size = int(cum[r1] - cum[r0])
            oi = np.empty(size, np.int32)
            od = np.empty(size, np.float32)
            cnt = counts[r0:r1]
            chunks = _chunks(cum[r0 : r1 + 1] - cum[r0], r0, 8 * self.threads)
            self._k.fused_rows(
                yp,
                yi,
                yd,
                wp,
                wi,
                wd,
                bias,
                np.float32(ymax),
                n,
                r0,
                r1,
                chunks,
                off,
                oi,
                od,
                cnt,
            )
            local_ptr = np.concatenate(([0], np.cumsum(cnt))).astype(np.int64)
            ri = np.empty(int(local_ptr[-1]), np.int32)
            rd = np.empty(int(local_ptr[-1]), np.float32)
            self._k.compact(off, oi, od, cnt, local_ptr, ri, rd)
            parts_i.append(ri)
            parts_d.append(rd)
            r0 = r1
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        indices = parts_i[0] if len(parts_i) == 1 else np.concatenate(parts_i)
        data = parts_d[0] if len(parts_d) == 1 else np.concatenate(parts_d)
        return sp.csr_matrix((data, indices, indptr), shape=(nrows, n))


def _chunks(local_cum, r0, nchunks):
    """Row boundaries (absolute) splitting a batch into ``nchunks`` parts of similar work."""
    total = local_cum[-1]
    nrows = local_cum.size - 1
    if total <= 0:
        return np.array([r0, r0 + nrows], dtype=np.int64)
    targets = total * np.arange(nchunks + 1) / nchunks
    b = np.searchsorted(local_cum, targets, side="left")
    b[0], b[-1] = 0, nrows
    return np.unique(b).astype(np.int64) + r0


def _ranges(starts, lens):
    """Concatenation of ``arange(s, s + l)`` for each pair (vectorised)."""
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    nonempty = lens > 0
    starts = np.asarray(starts, dtype=np.int64)[nonempty]
    lens = lens[nonempty]
    ends = np.cumsum(lens)
    out = np.ones(total, dtype=np.int64)
    out[0] = starts[0]
    out[ends[:-1]] = starts[1:] - (starts[:-1] + lens[:-1]) + 1
    return np.cumsum(out)


def default_threads(local_ranks: int) -> int:
    """Cores per rank on this node (at least 1): avoids oversubscribing when ranks share a node."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, local_ranks))
