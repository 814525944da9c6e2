"""Where the engine gets its weights from: one interface, whatever holds the layers.

The engine asks a :class:`WeightStore` for layer ``k`` as a :class:`CompactLayer` and never
knows whether the layer lives in a Python list, is memory-mapped from an HDF5 v2 file (shared
by the ranks of a node through the page cache) or is streamed group by group. Layers are kept
column-wise (for every *output* neuron its input neurons, ascending): that is the order in
which the pull kernels sum, and the order of the challenge's canonical summation.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .errors import ShapeError

__all__ = [
    "CompactLayer",
    "WeightStore",
    "InMemoryStore",
    "SlicedStore",
    "HeldStore",
    "CompactStore",
    "as_store",
    "index_dtype",
]


@dataclass(frozen=True)
class CompactLayer:
    """One ``N x N`` weight layer in compact column-wise form, plus its bias.

    Attributes
    ----------
    neurons : int
    rows : ndarray of uint16, uint32 or int32
        Input neuron of every weight, column by column, ascending within a column.
    colptr : ndarray of int64, shape (N + 1,), or None
        Column pointers; ``None`` when every column holds exactly ``per_col`` weights
        (the official networks hold 32 per row and per column).
    per_col : int
        Weights per column when ``colptr`` is ``None`` (else 0).
    values : ndarray of float32, or None
        Weight of every entry of ``rows``; ``None`` when all weights equal ``value``.
    value : float
        The single weight value when ``values`` is ``None``.
    bias : ndarray of float32, shape (N,)
    """

    neurons: int
    rows: np.ndarray
    colptr: np.ndarray | None
    per_col: int
    values: np.ndarray | None
    value: float
    bias: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    def colptr_array(self) -> np.ndarray:
        """Column pointers (int64), built when the layer stores a fixed count per column."""
        if self.colptr is not None:
            return np.asarray(self.colptr, dtype=np.int64)
        return np.arange(self.neurons + 1, dtype=np.int64) * int(self.per_col)

    def values_array(self) -> np.ndarray:
        """One float32 weight per entry (expanded when the layer stores one value)."""
        if self.values is not None:
            return np.asarray(self.values, dtype=np.float32)
        return np.full(self.nnz, np.float32(self.value), dtype=np.float32)

    def to_csc(self) -> sp.csc_matrix:
        """The layer as a scipy CSC matrix ``W`` (``W[j, c]``: input ``j`` to output ``c``)."""
        n = self.neurons
        rows = np.asarray(self.rows).astype(np.int32, copy=False)
        return sp.csc_matrix((self.values_array(), rows, self.colptr_array()), shape=(n, n))

    def to_csr(self) -> sp.csr_matrix:
        """The layer as scipy CSR with sorted indices (what :class:`Network` holds)."""
        m = self.to_csc().tocsr()
        m.sort_indices()
        return m

    def transpose_csr(self) -> sp.csr_matrix:
        """``W^T`` as scipy CSR, straight from the column-wise arrays (no conversion:
        the columns of ``W`` are the rows of its transpose, ascending within each)."""
        n = self.neurons
        rows = np.asarray(self.rows).astype(np.int32, copy=False)
        return sp.csr_matrix((self.values_array(), rows, self.colptr_array()), shape=(n, n))

    @classmethod
    def from_matrix(cls, w, bias) -> CompactLayer:
        """Compact form of any scipy matrix (duplicates summed, fixed count and value found)."""
        csc = sp.csc_matrix(w, dtype=np.float32, copy=True)
        csc.sum_duplicates()
        n = csc.shape[0]
        if csc.shape != (n, n):
            raise ShapeError(f"weight layer has shape {csc.shape}, expected square")
        counts = np.diff(csc.indptr)
        fixed = counts.size > 0 and bool(np.all(counts == counts[0]))
        data = csc.data.astype(np.float32, copy=False)
        uniform = same_bits(data)
        return cls(
            neurons=n,
            rows=csc.indices.astype(index_dtype(n), copy=False),
            colptr=None if fixed else csc.indptr.astype(np.int64),
            per_col=int(counts[0]) if fixed else 0,
            values=None if uniform else data,
            value=float(data[0]) if uniform else 0.0,
            bias=np.asarray(bias, dtype=np.float32).reshape(n),
        )


def same_bits(values) -> bool:
    """Whether every float32 of ``values`` (at least one) has the first one's bits: one
    value stands for them all. Bits, not ``==``: ``-0.0 == 0.0``, and a layer of ``0``
    and ``-0`` weights kept as one ``-0.0`` would not be the file's."""
    v = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    return v.size > 0 and bool((v == v[0]).all())


def index_dtype(neurons: int):
    """Smallest unsigned type that holds neuron indices ``0 .. neurons - 1``."""
    if neurons <= 1 << 16:
        return np.uint16
    if neurons <= 1 << 32:
        return np.uint32
    return np.int64


class WeightStore(abc.ABC):
    """The layers of a network (or a slice of it), one :class:`CompactLayer` at a time.

    ``layer(k)`` takes a *local* index ``0 <= k < len(store)``; global layer numbers are
    ``layer_start + k``. Stores that stream from disk use :meth:`prefetch` as a hint that
    layers ``[k0, k1)`` come next and :meth:`release` to say they will not be used again.
    """

    neurons: int
    ymax: float
    layer_start: int = 0
    total_layers: int | None = None
    source: str = ""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def layer(self, k: int) -> CompactLayer:
        """Layer ``k`` (local index) in compact form."""

    @property
    @abc.abstractmethod
    def edges(self) -> int:
        """Total number of weights (DNN edges) in the layers held."""

    def prefetch(self, k0: int, k1: int) -> None:  # noqa: B027 - optional hook
        """Hint: layers ``[k0, k1)`` are needed next (streaming stores start reading them)."""

    def release(self, k0: int, k1: int) -> None:  # noqa: B027 - optional hook
        """Layers ``[k0, k1)`` will not be used again (streaming stores drop them)."""

    def weight_bytes(self) -> int:
        """Bytes of weights this store holds or maps (for reports)."""
        return 0

    def describe(self) -> dict:
        return {"kind": type(self).__name__, "weight_bytes": int(self.weight_bytes())}

    def slice(self, k0: int, k1: int) -> WeightStore:
        """Layers ``[k0, k1)`` of this store (local indices) as a store of their own."""
        return SlicedStore(self, k0, k1)

    def to_network(self):
        """All layers as a :class:`~mpisdnn.network.Network` of scipy CSR matrices."""
        from .network import Network

        n = len(self)
        return Network(
            [self.layer(k).to_csr() for k in range(n)],
            np.stack([self.layer(k).bias for k in range(n)]) if n else np.zeros((0, self.neurons)),
            self.neurons,
            total_layers=self.total_layers,
            layer_start=self.layer_start,
            ymax=self.ymax,
            source=self.source,
        )


class InMemoryStore(WeightStore):
    """Layers held in memory, built from a :class:`~mpisdnn.network.Network`.

    Layers are converted to compact form when first asked for and kept, so a run pays the
    conversion once.
    """

    def __init__(self, network):
        self._network = network
        self._layers: dict[int, CompactLayer] = {}
        self.neurons = int(network.neurons)
        self.ymax = float(network.ymax)
        self.layer_start = int(network.layer_start)
        self.total_layers = network.total_layers
        self.source = network.source

    def __len__(self) -> int:
        return len(self._network.layers)

    def layer(self, k: int) -> CompactLayer:
        got = self._layers.get(k)
        if got is None:
            got = CompactLayer.from_matrix(self._network.layers[k], self._network.bias[k])
            self._layers[k] = got
        return got

    @property
    def edges(self) -> int:
        return int(self._network.edges)

    def weight_bytes(self) -> int:
        return int(sum(w.data.nbytes + w.indices.nbytes for w in self._network.layers))

    def to_network(self):
        return self._network


class SlicedStore(WeightStore):
    """A contiguous range of another store's layers (a pipeline stage's share)."""

    def __init__(self, parent: WeightStore, k0: int, k1: int):
        if not 0 <= k0 <= k1 <= len(parent):
            raise ShapeError(f"layer slice [{k0}, {k1}) outside a store of {len(parent)} layers")
        self._parent, self._k0, self._k1 = parent, int(k0), int(k1)
        self.neurons = parent.neurons
        self.ymax = parent.ymax
        self.layer_start = parent.layer_start + self._k0
        self.total_layers = parent.total_layers
        self.source = parent.source

    def __len__(self) -> int:
        return self._k1 - self._k0

    def layer(self, k: int) -> CompactLayer:
        if not 0 <= k < len(self):
            raise IndexError(f"layer {k} outside a slice of {len(self)} layers")
        return self._parent.layer(self._k0 + k)

    @property
    def edges(self) -> int:
        return int(sum(self.layer(k).nnz for k in range(len(self))))

    def prefetch(self, k0: int, k1: int) -> None:
        self._parent.prefetch(self._k0 + k0, self._k0 + k1)

    def release(self, k0: int, k1: int) -> None:
        self._parent.release(self._k0 + k0, self._k0 + k1)


class _ListStore(WeightStore):
    """A store whose layers are a list held in memory (``self._layers``)."""

    _layers: list

    def __len__(self) -> int:
        return len(self._layers)

    def layer(self, k: int) -> CompactLayer:
        return self._layers[k]

    @property
    def edges(self) -> int:
        return int(sum(layer.nnz for layer in self._layers))


class HeldStore(_ListStore):
    """The layers of another store, fetched once and held (references, not copies).

    What a lazily preparing backend keeps for a block: a mapped layer stays a view of the
    shared map, a streamed layer stays valid after its store released the block.
    """

    def __init__(self, parent: WeightStore):
        self._layers = [parent.layer(k) for k in range(len(parent))]
        self.neurons = parent.neurons
        self.ymax = parent.ymax
        self.layer_start = parent.layer_start
        self.total_layers = parent.total_layers
        self.source = parent.source


class CompactStore(_ListStore):
    """Layers held in memory in compact form, as parsed (a TSV network read by
    :func:`~mpisdnn.formats.network_read.read_network_compact`): no CSR copy.

    Parameters
    ----------
    layers : sequence of CompactLayer
    neurons : int
    ymax : float
    layer_start : int
        Global index of ``layers[0]``.
    total_layers : int, optional
        Depth of the whole network (default: ``layer_start + len(layers)``).
    source : str
        Provenance.
    """

    def __init__(self, layers, neurons: int, ymax: float, layer_start: int = 0,
                 total_layers: int | None = None, source: str = ""):  # fmt: skip
        self._layers = list(layers)
        self.neurons = int(neurons)
        self.ymax = float(ymax)
        self.layer_start = int(layer_start)
        self.total_layers = (self.layer_start + len(self._layers) if total_layers is None
                             else int(total_layers))  # fmt: skip
        self.source = str(source)

    def weight_bytes(self) -> int:
        arrays = [(w.rows, w.colptr, w.values) for w in self._layers]
        return int(sum(a.nbytes for group in arrays for a in group if a is not None))


def as_store(network) -> WeightStore:
    """A :class:`WeightStore` for ``network`` (a store is returned as is)."""
    if isinstance(network, WeightStore):
        return network
    return InMemoryStore(network)
