"""GPU backend: the cpu backend's fused tile design as numba-cuda kernels, exact by construction.

* **Exact.** Every output is summed over its weight column in ascending input order with
  separately rounded float32 multiplies and adds (``_cuda_arith``: libdevice ``__fmul_rn`` /
  ``__fadd_rn``, which the compiler may not fuse into FMA), so results are bit-identical to
  ``sdnn.reference`` and to the cpu backend. ``tests/test_gpu_sim.py`` checks the PTX.
* **Fused and on the device.** One kernel launch runs a whole layer group; each thread block
  keeps its chunk of rows for all the group's layers and repacks dead rows out after every
  layer (``_cuda_kernels``). Between groups the host reads one buffer back (the group's
  statistics and a byte per row, alive or not: the group's only wait on the device), then
  survivors are regrouped into full chunks on the device (``_gpu_groups``).
* **Rows.** Batches of dense feature-major chunks on the device (``_gpu_rows``); identical
  rows are found there too, from hashes compared bit for bit (``_gpu_dedup``).
* **Weights.** Resident on the device when they fit (the 1024 to 4096 neuron networks), else
  streamed: a group's layers are copied host -> device on a second stream into one of two
  slots while the previous group runs in the other (``_gpu_network``).
* **Arrays.** CuPy (memory pool, streams) when present; numba device arrays otherwise,
  which is also how the same class runs under the CUDA simulator in CI (``_cuda_arrays``).
* **Devices.** One rank per GPU by node-local rank; more ranks on a node than GPUs is an
  error unless ``gpus_per_rank=0`` (ranks share devices round-robin); the mapping and the
  launch knobs are in ``_gpu_device``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import BackendError
from ._gpu_dedup import _DeviceDedup
from ._gpu_device import BATCH_SHARE as BATCH_SHARE
from ._gpu_device import (
    CHUNK_ROWS,
    ROW_THREADS,
    SIM_CHUNK_ROWS,
    SIM_WARPS,
    WARPS,
    GpuLaunch,
    device_for,
    tail_rows_for,
)
from ._gpu_groups import STAT_FIELDS as STAT_FIELDS
from ._gpu_groups import _LayerGroups
from ._gpu_network import GpuNetwork, column_sets
from ._gpu_rows import DeviceRows, _RowBatches
from .base import Backend

__all__ = [
    "GpuBackend", "GpuLaunch", "DeviceRows", "GpuNetwork", "device_for", "tail_rows_for",
    "column_sets", "CHUNK_ROWS",
]


class GpuBackend(_LayerGroups, _DeviceDedup, _RowBatches, Backend):
    """Fused CUDA kernels (numba-cuda) on CuPy or numba device arrays.

    Its steps come from three mixins: the rows on the device (``_gpu_rows._RowBatches``),
    the search of identical rows (``_gpu_dedup._DeviceDedup``) and the layer groups
    (``_gpu_groups._LayerGroups``); the device, the sizes, the weights, the warm-up and the
    figures are here."""

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

    def row_work(self, y):
        """A row costs one tile slot per layer whatever its density (as in the cpu backend)."""
        return np.ones(y.shape[0], dtype=np.int64)

    def ideal_tiles(self, nrows: int) -> int:
        return int(-(-int(nrows) // 32))

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
