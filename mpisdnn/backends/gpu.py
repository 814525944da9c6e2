"""GPU backend: the cpu backend's fused tile design as numba-cuda kernels, exact by construction.

* **Exact.** Every output is summed over its weight column in ascending input order with
  separately rounded float32 multiplies and adds (``_cuda_arith``: libdevice ``__fmul_rn`` /
  ``__fadd_rn``, which the compiler may not fuse into FMA), so results are bit-identical to
  ``sdnn.reference`` and to the cpu backend. ``tests/test_gpu_sim.py`` checks the PTX.
* **Fused and on the device.** One kernel launch runs a whole layer group; each thread block
  keeps its chunk of rows for all the group's layers and repacks dead rows out after every
  layer (``_cuda_kernels``). Between groups the host reads one buffer back (the group's
  statistics and a byte per row, alive or not: the group's only wait on the device), then
  survivors are regrouped into full chunks on the device.
* **Weights.** Resident on the device when they fit (the 1024 to 4096 neuron networks), else
  streamed: a group's layers are copied host -> device on a second stream into one of two
  slots while the previous group runs in the other (``_gpu_network``).
* **Arrays.** CuPy (memory pool, streams) when present; numba device arrays otherwise,
  which is also how the same class runs under the CUDA simulator in CI (``_cuda_arrays``).
* **Devices.** One rank per GPU by node-local rank; more ranks on a node than GPUs is an
  error unless ``gpus_per_rank=0`` (ranks share devices round-robin).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..errors import BackendError, UsageError
from ._gpu_network import GpuNetwork, column_sets
from .base import STAT_KEYS, Backend

__all__ = [
    "GpuBackend", "GpuLaunch", "DeviceRows", "GpuNetwork", "device_for", "tail_rows_for",
    "column_sets", "CHUNK_ROWS",
]

#: Rows per chunk (one thread block's rows for a whole layer group): 2 tiles of 32 rows.
#: 64 rather than 128: twice the blocks once few rows live (0.11 s against 0.17 s for the
#: official N=1024 x 120 with 60,000 inputs on an H200, docs/gpu.md).
CHUNK_ROWS = 64
#: Warps per thread block on a GPU (each warp computes one output column at a time).
WARPS = 8
#: Under the simulator every thread is a Python thread: small chunks and blocks keep CI fast.
SIM_CHUNK_ROWS = 64
SIM_WARPS = 2
#: Share of free device memory one batch of rows may use for its two buffers.
BATCH_SHARE = 0.25
#: Threads per block of the small per-row kernels.
ROW_THREADS = 128
#: Columns of the per-layer statistics (``_cuda_kernels.STAT_FIELDS``, kept equal by a test).
STAT_FIELDS = len(STAT_KEYS)


def device_for(local_rank: int, local_ranks: int, devices: int, gpus_per_rank: int = 1) -> int:
    """The device of the ``local_rank``-th of ``local_ranks`` ranks on a node (pure).

    Raises
    ------
    BackendError
        No device, or more ranks than devices on the node while ``gpus_per_rank`` is not 0.
    """
    if devices < 1:
        raise BackendError("backend 'gpu': no CUDA device visible on this node")
    if gpus_per_rank and local_ranks > devices:
        raise BackendError(
            f"backend 'gpu': {local_ranks} ranks on this node but {devices} GPU(s); start at "
            f"most {devices} rank(s) per node, or share devices (--share-gpus, gpus_per_rank=0)"
        )
    return int(local_rank) % int(devices)


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


def tail_rows_for(n: int, sms: int, l2_bytes: int, chunk: int) -> int:
    """The default :meth:`GpuBackend.tail_limit` (pure): at least ``sms`` rows, more while
    the batch takes at most a third of the L2, never more than ``chunk * sms``."""
    fit = int(l2_bytes) // 3 // (4 * max(1, int(n)))
    return int(min(max(sms, fit), max(sms, int(chunk) * sms)))


@dataclass(frozen=True)
class GpuLaunch:
    """Launch-shape knobs of the gpu backend; ``None`` takes the default (for the device, or
    for the CUDA simulator).

    Attributes
    ----------
    chunk_rows : rows per chunk, a multiple of 32 (one thread block owns one chunk).
    warps : warps per block.
    batch_rows : rows per batch (default: by free device memory, ``BATCH_SHARE``).
    weight_bytes : device bytes for the weights of a group (default: a quarter of the free
        memory; 0: every group's weights streamed).
    shared_entries : weight entries a block stages in shared memory at once.
    split_rows : batches up to this many rows run the split-layer kernel (0: never).
    tail_rows : batches up to this many rows run the tail kernel (one block per row through
        the whole group; 0: never). Checked before ``split_rows``.
    column_sets : sum each set of equal columns once (default); ``False`` is the ablation.
    """

    chunk_rows: int | None = None
    warps: int | None = None
    batch_rows: int | None = None
    weight_bytes: int | None = None
    shared_entries: int | None = None
    split_rows: int | None = None
    tail_rows: int | None = None
    column_sets: bool = True

    def __post_init__(self):
        for name in ("chunk_rows", "warps", "batch_rows", "shared_entries"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or value < 1):
                raise UsageError(f"gpu {name} must be a positive integer, got {value!r}")
        for name in ("weight_bytes", "split_rows", "tail_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or value < 0):
                raise UsageError(f"gpu {name} must be an integer >= 0, got {value!r}")


class GpuBackend(Backend):
    """Fused CUDA kernels (numba-cuda) on CuPy or numba device arrays."""

    name = "gpu"
    fuses_layers = True

    def __init__(self, device=0, prefer_cupy=True, mapping=None, max_group=32, **launch):
        """``launch``: the :class:`GpuLaunch` knobs (tests and benchmarks set them; runs
        build the backend through :meth:`from_options`)."""
        launch = GpuLaunch(**launch)
        try:
            from . import _cuda_kernels
            from ._cuda_arith import simulated
            from ._cuda_arrays import make_arrays
        except ImportError as exc:
            raise BackendError(
                f"backend 'gpu' needs numba-cuda (pip install 'mpisdnn[gpu]'): {exc}"
            ) from None
        sim = simulated()
        self.chunk = int(launch.chunk_rows or (SIM_CHUNK_ROWS if sim else CHUNK_ROWS))
        self.warps = int(launch.warps or (SIM_WARPS if sim else WARPS))
        try:
            self.k = _cuda_kernels.kernels(
                self.chunk, int(launch.shared_entries or _cuda_kernels.SHARED_ENTRIES)
            )
            self.arrays = make_arrays(int(device), prefer_cupy)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - any CUDA start-up failure is one message
            raise BackendError(
                f"backend 'gpu': CUDA unusable ({type(exc).__name__}: {exc})"
            ) from None
        self.device = int(device)
        self.mapping = mapping or {}
        self._batch_rows = launch.batch_rows
        self._weight_bytes = launch.weight_bytes
        self._timers = []
        self._shapes = {}  # (kernel, index type, threads asked) -> (specialised, threads)
        #: Launches per kernel name since the warm-up (:meth:`describe`).
        self.kernel_launches = {}
        self._ones = None  # (device int64 ones, size): the weights of rows counted once
        self.kernel_seconds = 0.0
        self.launches = 0
        #: Longest layer group the engine may ask for: the span one weight slot holds.
        self.max_group = int(max_group)
        #: Batches of at most this many rows run layer by layer with the columns split over
        #: blocks (``_cuda_kernels``' split kernel): one block per chunk would leave most
        #: multiprocessors idle. Default: a chunk per multiprocessor; 0 turns it off (and is
        #: the default under the simulator, whose tests ask for it explicitly).
        split_rows = launch.split_rows
        if split_rows is None:
            split_rows = 0 if sim else self.chunk * self.arrays.multiprocessors()
        self.split_rows = int(split_rows)
        #: Batches of at most ``tail_limit(N)`` rows run the tail kernel: one block per row
        #: through the whole group in one launch (``tail_rows``; default :meth:`tail_limit`;
        #: 0 under the simulator unless asked, as ``split_rows``).
        self._tail_rows = launch.tail_rows if launch.tail_rows is not None else (0 if sim
                                                                                  else None)
        self.column_sets = bool(launch.column_sets)
        self.counters = {"weights": None, "weight_loads": 0, "weight_prefetches": 0}

    @classmethod
    def from_options(cls, options, comm):
        from ..system import local_ranks, node_rank
        from ._cuda_arrays import device_count

        local, lrank = local_ranks(comm), node_rank(comm)
        count = device_count()
        dev = device_for(lrank, local, count, options.gpus_per_rank)
        mapping = {"node_rank": lrank, "local_ranks": local, "devices": count}
        return cls(dev, mapping=mapping, max_group=options.max_group)

    # -- sizes -------------------------------------------------------------------------------
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

    def tail_limit(self, n: int) -> int:
        """Most rows of a batch the tail kernel takes at ``n`` neurons.

        Its blocks read a row's features at the chunk's stride, one 32-byte sector per
        4-byte value (8x the bytes of the coalesced split kernel), which is cheap while the
        batch's rows stay in L2 and dear once they stream from memory; in exchange it runs a
        whole layer group in one launch where the split kernel launches once per layer (tens
        of microseconds each from Python). Default: at least a row per multiprocessor, more
        while the batch takes at most a third of the L2 (N=1024 on an H100: 4,096 rows; at
        N=65536: the 132-row floor), never more than ``split_rows`` would take."""
        if self._tail_rows is not None:
            return int(self._tail_rows)
        return tail_rows_for(n, self.arrays.multiprocessors(), self.arrays.l2_bytes(), self.chunk)

    def weight_budget(self) -> int:
        if self._weight_bytes is not None:
            return int(self._weight_bytes)
        free, _ = self.arrays.mem_info()
        return int(0.25 * free) if free else 1 << 30

    def _buffer(self, nrows, n, zero=False):
        """A dense row buffer, as the kernels take it (a numba view: every launch that
        passes it skips numba's conversion of a CuPy array; only kernels touch it)."""
        chunks = -(-int(nrows) // self.chunk)
        buf = self.arrays.for_kernel(self.arrays.empty(chunks * self.chunk * n, np.float32))
        if zero:
            self._launch_rows(self.k.fill_zero, buf.size, buf)
        return buf

    def _launch_rows(self, kernel, nrows, *args):
        threads = 32 if self.k.simulated else ROW_THREADS
        blocks = max(1, min(-(-int(nrows) // threads), 4096 if not self.k.simulated else 4))
        self._go(kernel, blocks, threads, *args)

    def _go(self, kernel, grid, threads, *args):
        """Launch ``kernel`` on the backend's stream, counted by name (:meth:`describe`'s
        ``kernel_launches``: what one device run reports beside its time)."""
        kernel[grid, threads, self.arrays.launch_stream](*args)
        name = kernel.py_func.__name__
        self.kernel_launches[name] = self.kernel_launches.get(name, 0) + 1

    # -- representation ------------------------------------------------------------------
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

    def row_work(self, y):
        """A row costs one tile slot per layer whatever its density (as in the cpu backend)."""
        return np.ones(y.shape[0], dtype=np.int64)

    def ideal_tiles(self, nrows: int) -> int:
        return int(-(-int(nrows) // 32))

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

    # -- weights -------------------------------------------------------------------------------
    def prepare_layer(self, layer):
        return layer

    def prepare_network(self, store):
        return GpuNetwork(self, store, self._weight_bytes)

    def warmup(self, net):
        """Compile every kernel on a one-row problem (kept out of the timings)."""
        if len(net) == 0:
            return
        n = net.neurons
        tiny = sp.csr_matrix((np.ones(1, np.float32), ([0], [0])), shape=(1, n))
        split, tail = self.split_rows, self._tail_rows
        try:
            # Every kernel that is on: the group kernel (split and tail off), the split one,
            # the tail one.
            for rows in sorted({(0, 0), (split, 0), (0, self.tail_limit(n))}):
                self.split_rows, self._tail_rows = rows
                out, _, _ = self.run_layers(self.to_device(tiny), net, 0, 1, True)
                self.to_host(out)
        finally:
            self.split_rows, self._tail_rows = split, tail
        self.to_host(self.take_rows(self.to_device(tiny), np.zeros(1, np.int64)))
        self.synchronize()
        self._timers.clear()
        self.kernel_seconds = 0.0
        self.launches = 0
        self.kernel_launches = {}
        self.arrays.reads = 0
        self.counters.update(weight_loads=0, weight_prefetches=0)
        self.counters.pop("split_launches", None)
        self.counters.pop("tail_launches", None)

    # -- compute -------------------------------------------------------------------------------
    def layer(self, y, w, bias, ymax):
        """One layer through the fused path (the engine uses :meth:`run_layers`)."""
        from ..network import Network
        from ..weights import InMemoryStore

        w = sp.csr_matrix(w, dtype=np.float32)
        n = w.shape[1]
        b = np.broadcast_to(np.asarray(bias, np.float32), (n,)).reshape(1, n).copy()
        store = InMemoryStore(Network([w], b, n, ymax=ymax))
        out, _, _ = self.run_layers(self.to_device(y), self.prepare_network(store), 0, 1, False)
        return out

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

    def categories(self, y, row_offset: int = 0) -> np.ndarray:
        """1-based global indices of rows with a non-zero sum, reduced on the device
        (values are >= 0 after ReLU, so a row's sum is non-zero iff it has a non-zero)."""
        counts = self.row_nnz(y) if y.parts else np.zeros(0, np.int64)
        return np.flatnonzero(counts > 0).astype(np.int64) + row_offset + 1

    def synchronize(self):
        self.arrays.synchronize()
        for start, end in self._timers:
            self.kernel_seconds += self.arrays.elapsed(start, end)
        self._timers.clear()

    def describe(self):
        self.synchronize()
        free, total = self.arrays.mem_info()
        return {
            "name": self.name,
            "device": self.device,
            "device_name": self.arrays.device_name(),
            "memory_bytes": total,
            "arrays": self.arrays.kind,
            "chunk_rows": self.chunk,
            "split_rows": self.split_rows,
            "tail_rows": self._tail_rows,
            "column_sets": self.column_sets,
            "threads_per_block": 32 * self.warps,  # asked for; threads_launched: what ran
            "kernel_seconds": float(self.kernel_seconds),
            "group_launches": int(self.launches),
            # Since the warm-up: every kernel launch by name, and every read back to the host
            # (each a host wait on the device; docs/gpu.md counts them per layer group).
            "kernel_launches": dict(sorted(self.kernel_launches.items())),
            "host_reads": int(self.arrays.reads),
            **self.counters,
            **{f"mapping_{k}": v for k, v in self.mapping.items()},
        }


def _stats(st):
    st = np.asarray(st, dtype=np.int64).reshape(-1, STAT_FIELDS)
    return {key: st[:, i].copy() for i, key in enumerate(STAT_KEYS)}
