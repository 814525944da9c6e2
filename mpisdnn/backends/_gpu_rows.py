"""Rows of Y on the gpu backend's device: batches of dense feature-major chunks, to and from CSR.

:class:`DeviceRows` is a list of batches (:class:`_Part`, one dense buffer each); the mixin
:class:`_RowBatches` sizes the batches and moves rows between host CSR and the device, two
reads back at most whatever the batches. Split from :mod:`mpisdnn.backends.gpu`, which
re-exports :class:`DeviceRows`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._gpu_device import BATCH_SHARE


class _Part:
    """One batch of rows: ``nrows`` rows packed in dense feature-major chunks."""

    __slots__ = ("buf", "nrows")

    def __init__(self, buf, nrows):
        self.buf = buf
        self.nrows = int(nrows)


class DeviceRows:
    """Rows of Y on the device, as a list of row batches (:class:`_Part`)."""

    def __init__(self, parts, ncols):
        self.parts = [p for p in parts if p.nrows > 0]
        self.ncols = int(ncols)

    @property
    def shape(self):
        return (sum(p.nrows for p in self.parts), self.ncols)


class _RowBatches:
    """The gpu backend's rows on the device: batch sizes, row buffers, host CSR to and from
    :class:`DeviceRows`, row counts and row gathers. A mixin of
    :class:`~mpisdnn.backends.gpu.GpuBackend`: it reads the backend's ``arrays``, ``k`` (the
    kernels), ``chunk``, ``_batch_rows`` and launches through ``_launch_rows``."""

    def batch_rows(self, n: int) -> int:
        """Rows per batch (a multiple of the chunk): the two dense buffers of a batch use at
        most ``BATCH_SHARE`` of the free memory, and one buffer holds fewer than 2**31 values,
        so any per-batch offset also fits int32 (the kernels compute in int64 regardless)."""
        if self._batch_rows:
            rows = int(self._batch_rows)
        else:
            free, _ = self.arrays.mem_info()
            free = free or (1 << 30)
            rows = int(BATCH_SHARE * free) // (2 * 4 * max(1, n))
        rows = min(rows, np.iinfo(np.int32).max // max(1, n))
        return max(self.chunk, rows // self.chunk * self.chunk)

    def _buffer(self, nrows, n, zero=False):
        """A dense row buffer, as the kernels take it (a numba view: every launch that
        passes it skips numba's conversion of a CuPy array; only kernels touch it)."""
        chunks = -(-int(nrows) // self.chunk)
        buf = self.arrays.for_kernel(self.arrays.empty(chunks * self.chunk * n, np.float32))
        if zero:
            self._launch_rows(self.k.fill_zero, buf.size, buf)
        return buf

    def to_device(self, mat):
        if isinstance(mat, DeviceRows):
            return mat
        m = sp.csr_matrix(mat)
        if not (m.dtype == np.float32 and m.has_canonical_format):
            m = sp.csr_matrix(m, dtype=np.float32, copy=True)
            m.sum_duplicates()
        n = m.shape[1]
        step = self.batch_rows(n)
        parts = []
        for r0 in range(0, m.shape[0], step):
            r1 = min(m.shape[0], r0 + step)
            lo, hi = int(m.indptr[r0]), int(m.indptr[r1])
            buf = self._buffer(r1 - r0, n, zero=True)
            if hi > lo:
                indptr = self.arrays.upload(m.indptr[r0 : r1 + 1].astype(np.int64) - lo)
                indices = self.arrays.upload(m.indices[lo:hi].astype(np.int32))
                data = self.arrays.upload(m.data[lo:hi].astype(np.float32))
                self._launch_rows(
                    self.k.scatter_csr, r1 - r0, indptr, indices, data, r1 - r0, n, buf
                )
            parts.append(_Part(buf, r1 - r0))
        return DeviceRows(parts, n)

    def to_host(self, y, consume=False):
        """Host CSR of the rows: two reads back whatever the batches (every row's count of
        non-zeros, then every index and value, in one buffer each)."""
        if not isinstance(y, DeviceRows):
            return sp.csr_matrix(y)
        arr, n, shape = self.arrays, y.ncols, y.shape
        indptr = np.zeros(shape[0] + 1, np.int64)
        np.cumsum(self.row_nnz(y), out=indptr[1:])
        nnz = int(indptr[-1])
        ids, data = np.zeros(0, np.int32), np.zeros(0, np.float32)
        if nnz:
            raw = arr.empty(2 * nnz, np.uint32)  # indices, then values (4 bytes each)
            buf = arr.for_kernel(raw)
            o = 0
            for part in y.parts:
                lo, hi = int(indptr[o]), int(indptr[o + part.nrows])
                if hi > lo:
                    ip = arr.upload(indptr[o : o + part.nrows + 1] - lo)
                    self._launch_rows(self.k.to_csr, part.nrows, part.buf, part.nrows, n, ip,
                                      buf[lo:hi].view(np.int32),
                                      buf[nnz + lo : nnz + hi].view(np.float32))
                o += part.nrows
            host = arr.download(raw, 2 * nnz)
            ids, data = host[:nnz].view(np.int32), host[nnz:].view(np.float32)
        if consume:
            y.parts = []
        return sp.csr_matrix((data, ids, indptr), shape=shape)

    def row_nnz(self, y):
        """Non-zeros of every row, counted on the device: one read back for all batches."""
        if not y.parts:
            return np.zeros(0, np.int64)
        arr, total = self.arrays, y.shape[0]
        raw = arr.empty(total, np.int64)
        counts = arr.for_kernel(raw)
        o = 0
        for part in y.parts:
            self._launch_rows(self.k.row_counts, part.nrows, part.buf, part.nrows, y.ncols,
                              counts[o : o + part.nrows])
            o += part.nrows
        return arr.download(raw, total).astype(np.int64)

    def activation_bytes(self, y, nnz=None):
        """What the rows hold on the device: their dense chunks, 4 bytes per value (known on
        the host: no kernel, no read back, unlike :meth:`row_nnz`)."""
        if not isinstance(y, DeviceRows):
            return super().activation_bytes(y, nnz)
        return 4 * sum(int(p.buf.size) for p in y.parts)

    def take_rows(self, y, rows):
        rows = np.asarray(rows, dtype=np.int64)
        n = y.ncols
        starts = np.cumsum([0] + [p.nrows for p in y.parts])
        step = self.batch_rows(n)
        parts = []
        for o0 in range(0, rows.size, step):
            sel = rows[o0 : o0 + step]
            out = self._buffer(sel.size, n)
            for pi, part in enumerate(y.parts):
                lo, hi = np.searchsorted(sel, [starts[pi], starts[pi + 1]])
                if hi > lo:
                    pos = self.arrays.upload(sel[lo:hi] - starts[pi])
                    self._launch_rows(
                        self.k.gather_rows, hi - lo, part.buf, pos, hi - lo, int(lo), n, out
                    )
            parts.append(_Part(out, sel.size))
        return DeviceRows(parts, n)
