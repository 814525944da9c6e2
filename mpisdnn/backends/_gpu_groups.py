"""The gpu backend's layer-group driver: one launch per batch, one read back per group.

A batch runs the fused group kernel, the split-layer kernel (small batches, one launch per
layer) or the tail kernel (one block per row through the group); every batch's statistics and
alive flags share one device buffer, read back once, after which the survivors are regrouped
into full chunks on the device. Split from :mod:`mpisdnn.backends.gpu`, which re-exports
``STAT_FIELDS``.
"""

from __future__ import annotations

import numpy as np

from ._gpu_rows import DeviceRows, _Part
from .base import STAT_KEYS

#: Columns of the per-layer statistics (``_cuda_kernels.STAT_FIELDS``, kept equal by a test).
STAT_FIELDS = len(STAT_KEYS)


class _LayerGroups:
    """Layers ``[k0, k1)`` on the device (:meth:`run_layers`): kernel choice per batch, launch
    shapes, survivors and statistics. A mixin of :class:`~mpisdnn.backends.gpu.GpuBackend`: it
    reads the backend's ``arrays``, ``k`` (the kernels), ``chunk``, ``warps``, ``split_rows``,
    ``max_group``, ``counters``, ``tail_limit`` and the row buffers of :class:`_RowBatches`,
    and launches through ``_go`` and ``_launch_rows``."""

    def _launch_shape(self, name, args, want=None):
        """Kernel ``name`` compiled for ``args`` and the threads per block to launch it with.

        The compiled kernel's registers bound its block size (on an H200 the group kernel
        took at most 384 threads): asking for more fails the launch with
        ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``, so the block is cut to what the kernel allows
        (whole warps) and the cut is recorded (:meth:`describe`). Results do not depend on
        the block size (``want``: threads to ask for, default the backend's warps)."""
        want = int(want or 32 * self.warps)
        kernel = getattr(self.k, name)
        if self.k.simulated:
            return kernel, want
        # The specialisation is looked up once per argument kinds (numba's typing of 18
        # arguments costs host time at every lookup; these are cheap attribute reads).
        key = (name, want, *((type(a), getattr(a, "dtype", None), getattr(a, "ndim", 0))
                             for a in args))
        hit = self._shapes.get(key)
        if hit is not None:
            return hit
        kernel = kernel.specialize(*args)
        limit = int(kernel.get_max_threads_per_block())
        threads = min(want, max(32, limit // 32 * 32))
        self.counters[f"{name}_threads_limit"] = limit
        self.counters[f"{name}_threads_launched"] = threads
        self._shapes[key] = (kernel, threads)
        return kernel, threads

    def _split_layers(self, part, net, nl, weights, stats, rw, nsets, flags):
        """Layers ``0 .. nl-1`` of a small batch, one launch per layer, each chunk's column
        sets (at most ``nsets`` per layer) spread over enough blocks to fill the device.
        Returns the output buffer; ``flags`` (zeroed, ``nl x rows`` bytes) gets the rows left
        alive after each layer."""
        wi, wv, wcp, bias, lt, lv, mp, mc = weights
        arr, n, ymax = self.arrays, net.neurons, net.ymax
        nchunks = -(-part.nrows // self.chunk)
        want_blocks = 4 * max(1, arr.multiprocessors())
        nsets = max(1, int(nsets))
        slices = max(1, min(-(-want_blocks // nchunks), max(1, nsets // 32)))
        cs = -(-nsets // slices)
        slices = -(-nsets // cs)
        cur, nxt = part.buf, self._buffer(part.nrows, n)
        for li in range(nl):
            args = (cur, nxt, part.nrows, n, li, cs, wi, wv, wcp, lt, lv, bias,
                    np.float32(ymax), flags, stats, rw, mp, mc)
            kernel, threads = self._launch_shape("layer", args)
            self._go(kernel, (nchunks, slices), threads, *args)
            cur, nxt = nxt, cur
        self.counters["split_launches"] = self.counters.get("split_launches", 0) + nl
        return cur

    def _launch_group(self, part, net, nl, weights, prune, stats, rw, alive):
        """The fused group kernel on one batch; returns its output buffer (survivors packed
        first in their chunk; ``alive``, zeroed, gets a 1 for each)."""
        wi, wv, wcp, bias, lt, lv, mp, mc = weights
        n = net.neurons
        dst = self._buffer(part.nrows, n)
        args = (part.buf, dst, part.nrows, n, nl, wi, wv, wcp, lt, lv, bias,
                np.float32(net.ymax), bool(prune), alive, stats, rw, mp, mc)
        kernel, threads = self._launch_shape("group", args)
        nchunks = -(-part.nrows // self.chunk)
        self._go(kernel, nchunks, threads, *args)
        return dst

    def _tail_layers(self, part, net, nl, weights, stats, rw, alive):
        """The tail kernel on one batch (one block per row, the whole group in one launch);
        returns its output buffer (rows in place; ``alive``, zeroed, flags the survivors)."""
        wi, wv, wcp, bias, lt, lv, mp, mc = weights
        b0, b1 = self._buffer(part.nrows, net.neurons), self._buffer(part.nrows, net.neurons)
        args = (part.buf, b0, b1, part.nrows, net.neurons, nl, wi, wv, wcp, lt, lv, bias,
                np.float32(net.ymax), alive, stats, rw, mp, mc)
        # A row's sets over the block's threads: as many warps as the group's largest layer
        # has sets (at most 1024 threads), so small N leaves no warp idle at the barriers.
        sets = max(net.nsets[k] for k in range(len(net.nsets))) if net.nsets else 32
        want = 32 * (self.warps if self.k.simulated else min(32, -(-sets // 32)))
        kernel, threads = self._launch_shape("tail", args, want)
        self._go(kernel, part.nrows, threads, *args)
        self.counters["tail_launches"] = self.counters.get("tail_launches", 0) + 1
        return b0 if (nl - 1) % 2 == 0 else b1

    def _survivors(self, part, nl, flags, kind, extra, host_w=None):
        """This batch's surviving rows and where each sits in the kernel's output buffer,
        from its ``flags`` as read back (``kind``: ``group``, the kernel moved survivors
        first in their chunk; ``tail``, rows stayed in place; ``split``, one row of flags per
        layer, from which the host also counts the layers' statistics into ``extra``;
        ``host_w``: the rows' weights in those counts)."""
        if kind == "split":
            fl = flags.reshape(nl, part.nrows)
            rows = fl.sum(axis=1, dtype=np.int64)
            extra[:, 3] += rows
            extra[:, 0] += rows if host_w is None else (fl != 0).astype(np.int64) @ host_w
            full, rest = divmod(part.nrows, self.chunk)
            extra[:, 2] += full * (self.chunk // 32) + -(-rest // 32)
            keep = np.flatnonzero(fl[-1]).astype(np.int64)
            return keep, keep
        keep = np.flatnonzero(flags).astype(np.int64)
        if kind == "tail":
            return keep, keep
        # Survivors sit first in their chunk, in order: their packed positions.
        chunk = keep // self.chunk
        first = np.searchsorted(chunk, chunk)
        return keep, chunk * self.chunk + (np.arange(keep.size) - first)

    def _row_weights(self, weights, nrows):
        """Per-part views of the rows' statistics weights on the device, and on the host
        (``None`` when every row counts once: one cached array of ones serves every part)."""
        if weights is None or bool((np.asarray(weights) == 1).all()):
            if self._ones is None or self._ones[1] < nrows:
                size = max(nrows, 1)
                self._ones = (self.arrays.for_kernel(self.arrays.upload(np.ones(size, np.int64))),
                              size)
            return None, self._ones[0]
        w = np.ascontiguousarray(weights, np.int64)
        if w.size != nrows:
            raise ValueError(f"{w.size} row weights for {nrows} rows")
        return w, None

    def _kind(self, nrows, n):
        """The kernel a batch of ``nrows`` rows runs: ``tail``, ``split`` or ``group``."""
        if nrows <= self.tail_limit(n):
            return "tail"
        return "split" if nrows <= self.split_rows else "group"

    def run_layers(self, y, net, k0, k1, prune=True, consume=False, weights=None):
        """Layers ``[k0, k1)`` of ``net`` (a :class:`GpuNetwork`) on the rows of ``y``: one
        kernel launch per batch of rows (one per layer for a small batch, columns split over
        blocks), then **one** read back for the whole call: the statistics and every batch's
        alive flags share one device buffer (the only host wait of a layer group; the
        survivors' gather is queued after it without another). ``weights``: the inputs each
        row stands for, its weight in the active-row and non-zero counts."""
        arr = self.arrays
        n = net.neurons
        nl = k1 - k0
        y = self.to_device(y)
        if y.shape[0] == 0 or nl <= 0:
            empty = np.zeros((max(0, nl), STAT_FIELDS), np.int64)
            return DeviceRows([], n), np.zeros(0, np.int64), _stats(empty)
        host_w, ones = self._row_weights(weights, y.shape[0])
        weights = net.group(k0, k1, self.max_group)
        parts = y.parts
        if consume:
            y.parts = []
        kinds = [self._kind(part.nrows, n) for part in parts]
        # The report: int64 statistics (nl x STAT_FIELDS), then each batch's flags (a byte per
        # row, per layer for split batches), zeroed on the device in one go.
        sbytes = 8 * STAT_FIELDS * nl
        spans, at = [], sbytes
        for part, kind in zip(parts, kinds):
            size = part.nrows * (nl if kind == "split" else 1)
            spans.append((at, at + size))
            at += size
        raw = arr.zeros(at, np.uint8)
        report = arr.for_kernel(raw)
        stats = report[:sbytes].view(np.int64).reshape(nl, STAT_FIELDS)
        dsts, offset = [], 0
        for i, (part, kind) in enumerate(zip(parts, kinds)):
            pw = None if host_w is None else host_w[offset : offset + part.nrows]
            rw = ones if pw is None else arr.for_kernel(arr.upload(np.ascontiguousarray(pw)))
            flags = report[spans[i][0] : spans[i][1]]
            start, end = arr.event(), arr.event()
            arr.record(start, arr.stream)
            if kind == "tail":
                dst = self._tail_layers(part, net, nl, weights, stats, rw, flags)
            elif kind == "split":
                dst = self._split_layers(
                    part, net, nl, weights, stats, rw, max(net.nsets[k0:k1]), flags
                )
            else:
                dst = self._launch_group(part, net, nl, weights, prune, stats, rw, flags)
            arr.record(end, arr.stream)
            self._timers.append((start, end))
            self.launches += 1
            if i == 0:
                net.prefetch(k1, self.max_group)  # overlaps with this group's kernels
            if consume:
                parts[i] = None  # the input batch's memory returns to the pool
            dsts.append(dst)
            offset += part.nrows
        host = arr.download(raw, at)  # the one host wait
        stats_host = host[:sbytes].view(np.int64).reshape(nl, STAT_FIELDS).copy()
        batches = [(dst, kind, host[a:b]) for dst, kind, (a, b) in zip(dsts, kinds, spans)]
        dsts.clear()
        out_parts, keep, extra = self._regroup(batches, n, nl, prune, host_w)
        return DeviceRows(out_parts, n), keep, _stats(stats_host + extra)

    def _regroup(self, batches, n, nl, prune, host_w):
        """After the read back: each batch's survivors (``batches``: output buffer, kernel
        kind, flags as read) gathered into full chunks on the device (queued, no wait), their
        indices, and the split batches' statistics counted from their flags."""
        arr = self.arrays
        extra = np.zeros((nl, STAT_FIELDS), np.int64)
        out_parts, keeps, offset = [], [], 0
        for dst, kind, flags in batches:
            nrows = flags.size // (nl if kind == "split" else 1)
            pw = None if host_w is None else host_w[offset : offset + nrows]
            part = _Part(dst, nrows)
            keep, pos = self._survivors(part, nl, flags, kind, extra, pw)
            if not prune:
                out_parts.append(part)
                keeps.append(np.arange(nrows, dtype=np.int64) + offset)
            else:
                if keep.size == nrows:
                    out_parts.append(part)
                elif keep.size:
                    out = self._buffer(keep.size, n)
                    self._launch_rows(
                        self.k.gather_rows, keep.size, dst, arr.upload(pos), keep.size, 0, n, out
                    )
                    out_parts.append(_Part(out, keep.size))
                keeps.append(keep + offset)
            offset += nrows
        keep = np.concatenate(keeps) if keeps else np.zeros(0, np.int64)
        return out_parts, keep, extra


def _stats(st):
    st = np.asarray(st, dtype=np.int64).reshape(-1, STAT_FIELDS)
    return {key: st[:, i].copy() for i, key in enumerate(STAT_KEYS)}
