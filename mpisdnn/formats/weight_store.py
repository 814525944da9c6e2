"""A :class:`~mpisdnn.weights.WeightStore` backed by a network HDF5 file.

Version 2 files are memory-mapped: every rank maps the same file read-only, so the ranks of a
node share one copy of the weights in the page cache (a rank's PSS counts its share only).
Version 1 files are chunked and compressed and cannot be mapped; their layers are read into
memory once, as before.
"""

from __future__ import annotations

import mmap
import os

from ..errors import ShapeError
from ..weights import CompactLayer, InMemoryStore, WeightStore

__all__ = ["HDF5WeightStore", "open_weight_store"]

_PAGE = mmap.PAGESIZE


class HDF5WeightStore(WeightStore):
    """Layers ``[layer_start, layer_stop)`` of a v2 network file, mapped from the file.

    Parameters
    ----------
    path : path-like
    layers : int, optional
        Use the first ``layers`` layers of the file (the network's depth for this run).
    layer_start, layer_stop : int
        Global layer range this store holds (a pipeline stage's share).
    validate : bool
        Check indices, order and values of every mapped layer once, at open.
    """

    def __init__(self, path, layers=None, layer_start=0, layer_stop=None, validate=True):
        from .network_v2 import map_layers

        self.path = os.fspath(path)
        if layer_stop is None and layers is not None:
            layer_stop = layers
        info, self._layers = map_layers(self.path, layer_start, layer_stop, validate=validate)
        total = info["layers"] if layers is None else int(layers)
        if not 0 < total <= info["layers"] or len(self._layers) + layer_start > total:
            raise ShapeError(
                f"{self.path}: asked for {total} layers, the file has {info['layers']}"
            )
        self._map = info["map"]
        self._bytes = int(info["weight_bytes"])
        self.neurons = int(info["neurons"])
        self.ymax = float(info["ymax"])
        self.layer_start = int(layer_start)
        self.total_layers = total
        self.source = str(info["source"])

    def __len__(self) -> int:
        return len(self._layers)

    def layer(self, k: int) -> CompactLayer:
        if not 0 <= k < len(self._layers):
            raise IndexError(f"layer {k} outside a store of {len(self._layers)} layers")
        return self._layers[k]

    @property
    def edges(self) -> int:
        return int(sum(layer.nnz for layer in self._layers))

    def weight_bytes(self) -> int:
        return self._bytes

    def describe(self) -> dict:
        return {"kind": "hdf5-mmap", "weight_bytes": self._bytes, "path": self.path}

    def prefetch(self, k0: int, k1: int) -> None:
        """Ask the kernel to read layers ``[k0, k1)`` ahead (``MADV_WILLNEED``)."""
        self._advise(k0, k1, getattr(mmap, "MADV_WILLNEED", None))

    def release(self, k0: int, k1: int) -> None:
        """Drop this process's mapping of layers ``[k0, k1)`` (the page cache keeps them)."""
        self._advise(k0, k1, getattr(mmap, "MADV_DONTNEED", None))

    def _advise(self, k0, k1, advice) -> None:
        raw = getattr(self._map, "_mmap", None)
        if advice is None or raw is None or not hasattr(raw, "madvise"):
            return
        base = self._map.ctypes.data
        for layer in self._layers[max(k0, 0) : k1]:
            for arr in (layer.rows, layer.colptr, layer.values, layer.bias):
                if arr is None or arr.size == 0 or getattr(arr, "base", None) is None:
                    continue
                start = arr.ctypes.data - base
                if not 0 <= start < len(raw):
                    continue  # not a view of the file (a shared uniform bias)
                lo = start - start % _PAGE
                raw.madvise(advice, lo, min(len(raw) - lo, start + arr.nbytes - lo))


def open_weight_store(path, layers=None, layer_start=0, layer_stop=None) -> WeightStore:
    """The weights of a network file as a store: mapped for v2, read into memory for v1."""
    from .hdf5 import network_version, read_network

    path = os.fspath(path)
    if network_version(path) == 2:
        return HDF5WeightStore(path, layers, layer_start, layer_stop)
    return InMemoryStore(read_network(path, layers, layer_start, layer_stop))
