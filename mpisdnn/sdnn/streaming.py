"""Networks larger than memory: layer blocks read ahead of the compute and released after use.

:class:`StreamingStore` wraps any :class:`~mpisdnn.weights.WeightStore` whose layers are
expensive to get (read and decoded from an HDF5 file by :class:`Hdf5LayerSource`). The engine
plans layer *blocks* that fit ``weight_memory`` (:func:`plan_blocks`), calls
:meth:`~StreamingStore.prefetch` for the next block before computing the current one, and
:meth:`~StreamingStore.release` once a block is prepared; a background thread reads the
prefetched block meanwhile. The engine never learns where the layers come from: any store
takes the same calls (an in-memory store ignores them).

Overlap is measured, not assumed: the reader records how long it spent reading, the engine
how long it waited for a layer that was not ready; ``overlap = 1 - wait / read``.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._checks import check_streamed_layer
from ..errors import ShapeError
from ..weights import CompactLayer, WeightStore

__all__ = [
    "StreamingStore",
    "Hdf5LayerSource",
    "plan_blocks",
    "default_weight_memory",
    "estimated_weight_bytes",
]

#: Share of the node's available memory the weights of its ranks may use by default (the
#: rest is for activations, the page cache and other users of the node).
WEIGHT_SHARE = 0.5
#: Most bytes of scipy CSR a reader builds at once (one HDF5 slice of layers).
READ_BYTES = 32 << 20


def default_weight_memory(comm) -> int:
    """A share of the node's available memory, divided by its ranks (collective).

    Every rank holds its own copy of the layers it prepares, so the share is split between
    the ranks of the node. Rank 0 decides and broadcasts: the layer blocks must be the same
    on every rank (the loop's per-group collectives follow them).
    """
    from ..parallel import bcast
    from ..system import available_memory, local_ranks

    local = local_ranks(comm)
    value = int(WEIGHT_SHARE * available_memory()) // max(1, local)
    return int(bcast(comm, max(1 << 20, value)))


def estimated_weight_bytes(edges: int, nlayers: int, neurons: int, prepared_bytes) -> int:
    """Bytes a rank needs to hold every layer at once: compact form plus prepared form.

    ``prepared_bytes(nnz, neurons)`` is the backend's estimate for one prepared layer.
    """
    if nlayers <= 0:
        return 0
    per_layer = -(-int(edges) // nlayers)
    compact = per_layer * 6 + 4 * neurons  # uint16/int32 index + float32 value, bias
    return nlayers * (compact + int(prepared_bytes(per_layer, neurons)))


def plan_blocks(nlayers: int, layer_bytes: int, budget: int | None) -> list[tuple[int, int]]:
    """Consecutive layer blocks ``[(k0, k1), ...]`` for a weight budget (pure).

    One block holds every layer when they fit ``budget``. Otherwise a block holds at most
    ``budget // (2 * layer_bytes)`` layers (at least one): the block being computed and the
    one being read ahead fit the budget together.
    """
    if nlayers <= 0:
        return []
    if budget is None or layer_bytes * nlayers <= budget:
        return [(0, nlayers)]
    size = max(1, int(budget) // max(1, 2 * int(layer_bytes)))
    return [(k, min(nlayers, k + size)) for k in range(0, nlayers, size)]


class Hdf5LayerSource(WeightStore):
    """The layers of an HDF5 network file, read on demand and never kept.

    Reading goes through :func:`mpisdnn.formats.read_network` (a layer slice), so every
    layout that reader understands works here.
    """

    def __init__(self, path, layers: int | None = None, layer_start=0, layer_stop=None):
        from ..formats import hdf5

        self.path = os.fspath(path)
        meta = hdf5.read_network_meta(self.path)
        nnz = np.asarray(meta["layer_nnz"], dtype=np.int64)
        total = nnz.size if layers is None else int(layers)
        if not 0 < total <= nnz.size:
            raise ShapeError(f"{self.path}: asked for {total} layers, the file has {nnz.size}")
        stop = total if layer_stop is None else int(layer_stop)
        if not 0 <= layer_start <= stop <= total:
            raise ShapeError(f"{self.path}: layer slice [{layer_start}, {stop}) of {total}")
        # A pipeline stage's share: store layer k is global layer layer_start + k.
        self._nnz = nnz[layer_start:stop]
        self.neurons = int(meta["neurons"])
        self.ymax = float(meta.get("ymax", 32.0))
        self.total_layers = total
        self.layer_start = int(layer_start)
        self.source = str(meta.get("source", self.path))

    def __len__(self) -> int:
        return int(self._nnz.size)

    @property
    def edges(self) -> int:
        return int(self._nnz.sum())

    def weight_bytes(self) -> int:
        return 0  # holds nothing

    def read_group(self, k0: int, k1: int) -> list[CompactLayer]:
        """Layers ``[k0, k1)`` in compact form, read in slices of about ``READ_BYTES``.

        Slices, not one read: the reader's scipy copies of a slice (8 bytes per weight,
        more while converting) would otherwise cost several times the compact block.
        """
        from ..formats import hdf5

        out = []
        k = k0
        while k < k1:
            stop = k + 1
            while stop < k1 and 8 * int(self._nnz[k : stop + 1].sum()) <= READ_BYTES:
                stop += 1
            net = hdf5.read_network(
                self.path,
                layers=self.total_layers,
                layer_start=self.layer_start + k,
                layer_stop=self.layer_start + stop,
            )
            out.extend(CompactLayer.from_matrix(w, b) for w, b in zip(net.layers, net.bias))
            for i in range(k, stop):  # not read twice: the overflow bound where it is read
                check_streamed_layer(out[i - k0], self.layer_start + i, self.ymax)
            del net
            k = stop
        return out

    def layer(self, k: int) -> CompactLayer:
        return self.read_group(k, k + 1)[0]


class StreamingStore(WeightStore):
    """Layers of ``source`` held only between :meth:`prefetch` and :meth:`release`.

    Parameters
    ----------
    source : WeightStore
        Where layers come from; ``source.read_group(k0, k1)`` is used when it exists (one
        read for a block), ``source.layer(k)`` otherwise.
    """

    def __init__(self, source: WeightStore):
        self._source = source
        self.neurons = source.neurons
        self.ymax = source.ymax
        self.layer_start = source.layer_start
        self.total_layers = source.total_layers
        self.source = source.source
        self._lock = threading.Lock()
        self._ready: dict[int, CompactLayer] = {}
        self._pending: dict[tuple[int, int], object] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpisdnn-prefetch")
        self.read_seconds = 0.0
        self.wait_seconds = 0.0
        self.blocks_read = 0
        self.bytes_read = 0
        self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self._source)

    @property
    def edges(self) -> int:
        return int(self._source.edges)

    # -- reading -------------------------------------------------------------------------
    def _read(self, k0: int, k1: int) -> None:
        t0 = time.perf_counter()
        if hasattr(self._source, "read_group"):
            layers = self._source.read_group(k0, k1)
        else:
            layers = [self._source.layer(k) for k in range(k0, k1)]
        with self._lock:
            for k, layer in zip(range(k0, k1), layers):
                self._ready[k] = layer
            self.read_seconds += time.perf_counter() - t0
            self.blocks_read += 1
            self.bytes_read += sum(_nbytes(layer) for layer in layers)
            self.peak_bytes = max(self.peak_bytes, self._held())

    def _held(self) -> int:
        return sum(_nbytes(layer) for layer in self._ready.values())

    def prefetch(self, k0: int, k1: int) -> None:
        """Start reading layers ``[k0, k1)`` in the background (returns at once)."""
        with self._lock:
            if all(k in self._ready for k in range(k0, k1)) or (k0, k1) in self._pending:
                return
            self._pending[(k0, k1)] = self._pool.submit(self._read, k0, k1)

    def release(self, k0: int, k1: int) -> None:
        """Drop layers ``[k0, k1)`` (their memory goes once the backend lets go of them)."""
        with self._lock:
            for k in range(k0, k1):
                self._ready.pop(k, None)

    def layer(self, k: int) -> CompactLayer:
        if not 0 <= k < len(self):
            raise IndexError(f"layer {k} outside a store of {len(self)} layers")
        with self._lock:
            got = self._ready.get(k)
            waiting = [(key, fut) for key, fut in self._pending.items() if key[0] <= k < key[1]]
        if got is not None:
            return got
        t0 = time.perf_counter()
        if waiting:
            key, fut = waiting[0]
            fut.result()  # re-raises a reader's error here, in the engine's thread
            with self._lock:
                self._pending.pop(key, None)
        else:  # not announced: read now, the engine waits for all of it
            self._read(k, k + 1)
        self.wait_seconds += time.perf_counter() - t0
        with self._lock:
            got = self._ready.get(k)
        if got is None:  # released while being read: read it again
            self._read(k, k + 1)
            with self._lock:
                got = self._ready[k]
        return got

    def close(self) -> None:
        """Stop the reader thread (pending reads finish first)."""
        self._pool.shutdown(wait=True)

    def weight_bytes(self) -> int:
        """Most bytes of compact layers held at once so far."""
        return int(self.peak_bytes)

    def statistics(self) -> dict:
        """Background reading against waiting: what the report's ``streaming`` holds."""
        read, wait = self.read_seconds, self.wait_seconds
        return {
            "blocks_read": int(self.blocks_read),
            "bytes_read": int(self.bytes_read),
            "peak_held_bytes": int(self.peak_bytes),
            "read_seconds": float(read),
            "wait_seconds": float(wait),
            "overlap": float(max(0.0, 1.0 - wait / read)) if read > 0 else 1.0,
        }

    def describe(self) -> dict:
        return {"kind": type(self).__name__, "weight_bytes": int(self.peak_bytes)}


def _nbytes(layer: CompactLayer) -> int:
    total = layer.rows.nbytes + layer.bias.nbytes
    if layer.colptr is not None:
        total += layer.colptr.nbytes
    if layer.values is not None:
        total += layer.values.nbytes
    return int(total)
