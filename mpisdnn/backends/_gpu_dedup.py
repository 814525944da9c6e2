"""Identical rows found on the gpu backend's device: hashes, candidate pairs compared bit for bit.

Only two hashes and a count per row, then one byte per candidate pair, come back to the host
(the rows' values never do); a hash collision never merges two rows. Split from
:mod:`mpisdnn.backends.gpu`.
"""

from __future__ import annotations

import numpy as np

from ._gpu_device import ROW_THREADS


class _DeviceDedup:
    """The keys of the search of identical rows (:meth:`row_view`), computed on the device.
    A mixin of :class:`~mpisdnn.backends.gpu.GpuBackend`: it reads the backend's ``arrays``
    and ``k`` (the kernels) and launches through ``_go``."""

    def row_view(self, y):
        """Keys of the rows for the search of identical rows, found on the device: row ``i``
        is one entry whose index is the number of its class of byte-identical rows.

        Not the rows' values (the default's full download is what made ``--dedup`` cost more
        than it saved on a GPU, docs/gpu.md): two hashes and a count per row are computed on
        the device (:func:`~mpisdnn.backends._cuda_kernels` ``row_hashes``, 24 bytes a row
        come back), rows with equal hashes are compared with the first of them, bit for bit,
        on the device (``rows_differ``, one byte a pair), and a row that differs from its
        candidate keeps a class of its own (a collision never merges; it can only leave two
        equal rows apart, which is still exact). Equal keys are therefore exactly
        byte-identical rows (``+0`` and ``-0`` both count as no entry, as in the CSR form),
        which is all the search (:func:`mpisdnn.sdnn.dedup.find_duplicates`) compares."""
        rows = y.shape[0]
        cls = self.row_classes(y) if rows else np.zeros(0, np.int64)
        starts = np.arange(rows, dtype=np.int64)
        return (starts, np.ones(rows, np.int64), cls.astype(np.int32),
                np.ones(rows, np.float32))

    def _feature_slices(self, items, n):
        """Feature slices per launch of the per-row kernels: enough blocks to fill the device."""
        want = 4 * max(1, self.arrays.multiprocessors())
        slices = max(1, min(-(-want // max(1, items)), max(1, n // 256)))
        fs = -(-n // slices)
        return fs, -(-n // fs)

    def row_classes(self, y):
        """Class number of every row of ``y``: equal numbers iff byte-identical rows (see
        :meth:`row_view`). Two reads back whatever the batches: every batch's hashes in one
        buffer, every candidate pair's verdict in another."""
        arr, n = self.arrays, y.ncols
        total = y.shape[0]
        threads = 32 * (2 if self.k.simulated else 8)
        raw = arr.zeros(3 * total, np.uint64)  # h1 | h2 | non-zero counts, all batches
        buf = arr.for_kernel(raw)
        where, o = [], 0
        for pi, part in enumerate(y.parts):
            r = part.nrows
            tiles = -(-r // 32)
            fs, slices = self._feature_slices(tiles, n)
            self._go(self.k.row_hashes, (tiles, slices), threads, part.buf.view(np.uint32), r,
                     n, fs, buf[o : o + r], buf[total + o : total + o + r],
                     buf[2 * total + o : 2 * total + o + r].view(np.int64))
            where.append(np.stack([np.full(r, pi), np.arange(r)], axis=1))
            o += r
        h = arr.download(raw, 3 * total).reshape(3, total).T
        loc = np.concatenate(where).astype(np.int64)
        rows = h.shape[0]
        order = np.lexsort((np.arange(rows), h[:, 2], h[:, 1], h[:, 0]))
        hs_sorted = h[order]
        first = np.ones(rows, bool)
        first[1:] = (hs_sorted[1:] != hs_sorted[:-1]).any(axis=1)
        cand = np.empty(rows, np.int64)
        cand[order] = order[np.maximum.accumulate(np.where(first, np.arange(rows), 0))]
        todo = np.flatnonzero(cand != np.arange(rows))
        if todo.size:
            differ = self._rows_differ(y, loc[todo], loc[cand[todo]])
            cand[todo[differ]] = todo[differ]  # a collision: the row keeps its own class
        # Class numbers: the candidate's index (a row's own index when it leads its class).
        return cand

    def _rows_differ(self, y, a, b):
        """For pairs of rows at ``(part, row)`` positions ``a`` and ``b``: which differ (one
        launch per pair of batches, one read back for all)."""
        arr, n = self.arrays, y.ncols
        threads = 32 if self.k.simulated else ROW_THREADS
        raw = arr.zeros(a.shape[0], np.uint8)
        flags = arr.for_kernel(raw)
        # Pairs grouped by their two batches; each group's rows go up in one array.
        order = np.lexsort((b[:, 0], a[:, 0]))
        a, b = a[order], b[order]
        key = a[:, 0] * len(y.parts) + b[:, 0]
        cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
        rows = arr.for_kernel(arr.upload(np.concatenate([a[:, 1], b[:, 1]])))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            count = int(hi - lo)
            pa, pb = int(a[lo, 0]), int(b[lo, 0])
            blocks = -(-count // threads)
            fs, slices = self._feature_slices(blocks, n)
            self._go(self.k.rows_differ, (blocks, slices), threads,
                     y.parts[pa].buf.view(np.uint32), y.parts[pb].buf.view(np.uint32),
                     rows[lo:hi], rows[a.shape[0] + lo : a.shape[0] + hi], count, n, fs,
                     flags[lo:hi])
        out = np.empty(a.shape[0], bool)
        out[order] = arr.download(raw, a.shape[0]) != 0
        return out
