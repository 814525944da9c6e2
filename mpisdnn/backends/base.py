"""The backend interface: everything the inference engine calls, declared in one place.

A backend owns one representation of the activations ``Y`` (scipy CSR, tiles in numba
buffers, device arrays) and of the weights. The engine only ever calls the methods declared
here; it never knows about numba or CUDA, and a backend never knows about ranks, stages or
where the weights came from (:class:`~mpisdnn.weights.WeightStore`).

To add a backend: subclass :class:`Backend`, implement the abstract methods (a per-layer
backend needs only those; :meth:`Backend.run_layers` then steps one layer at a time), and
register it in :mod:`mpisdnn.backends`. A fused backend overrides :meth:`run_layers` and sets
``fuses_layers = True``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

__all__ = ["Backend", "PreparedLayers", "GroupStats", "STAT_KEYS"]


@dataclass
class PreparedLayers:
    """Weights in a backend's own form, layer ``k`` of the store at ``weights[k]``."""

    weights: list
    bias: list
    ymax: float
    neurons: int

    def __len__(self) -> int:
        return len(self.weights)


#: Per-layer statistics of a :meth:`Backend.run_layers` call: ``active`` rows, ``nnz`` and
#: ``tiles`` computed (rows the cpu backend pushed count as the tiles they would fill; 0 for
#: backends without tiles), and ``rows`` alive, each an int64 array of the group's length.
#: With row ``weights`` a row counts ``weights[i]`` times in ``active`` and ``nnz`` (the
#: inputs a deduplicated row stands for) and once in ``tiles`` and ``rows`` (the work done);
#: without, ``rows`` equals ``active``.
GroupStats = dict

#: The keys of :data:`GroupStats`, in the column order of the backends' statistics arrays.
STAT_KEYS = ("active", "nnz", "tiles", "rows")


def empty_stats(nlayers: int) -> GroupStats:
    return {key: np.zeros(nlayers, np.int64) for key in STAT_KEYS}


class Backend(abc.ABC):
    """One way of computing layers: representation, transfers and the layer step."""

    #: Name used by ``--backend`` and in reports.
    name: ClassVar[str] = "base"
    #: True when :meth:`run_layers` runs several layers in one pass (the engine then forms
    #: layer groups; otherwise it steps one layer at a time, with exact per-layer timings).
    fuses_layers: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options, comm) -> Backend:
        """Create the backend from :class:`~mpisdnn.sdnn.options.InferOptions` on ``comm``."""

    # -- representation ------------------------------------------------------------------
    @abc.abstractmethod
    def to_device(self, mat: sp.spmatrix):
        """Host CSR rows -> this backend's representation."""

    @abc.abstractmethod
    def to_host(self, y, consume: bool = False) -> sp.csr_matrix:
        """This backend's rows -> host CSR (``consume``: the caller drops ``y`` afterwards)."""

    @abc.abstractmethod
    def row_nnz(self, y) -> np.ndarray:
        """Host int64 array of stored entries per row."""

    @abc.abstractmethod
    def take_rows(self, y, rows: np.ndarray):
        """The rows at the given sorted host indices, in that order."""

    def row_view(self, y) -> tuple:
        """The rows on the host as ``(starts, lens, indices, data)``: row ``i`` is
        ``indices/data[starts[i] : starts[i] + lens[i]]``, indices ascending (what the
        search for identical rows reads). A host backend returns its own arrays, uncopied;
        this default copies through :meth:`to_host`."""
        m = sp.csr_matrix(self.to_host(y))
        m.sort_indices()
        indptr = np.asarray(m.indptr, np.int64)
        return indptr[:-1], np.diff(indptr), m.indices, m.data

    # -- weights ---------------------------------------------------------------------------
    @abc.abstractmethod
    def prepare_layer(self, layer):
        """A :class:`~mpisdnn.weights.CompactLayer` in this backend's weight form."""

    def prepare_network(self, store):
        """Every layer of a :class:`~mpisdnn.weights.WeightStore`, prepared once."""
        layers = [store.layer(k) for k in range(len(store))]
        return PreparedLayers(
            [self.prepare_layer(layer) for layer in layers],
            [layer.bias for layer in layers],
            float(store.ymax),
            int(store.neurons),
        )

    def prepare_group(self, store, k0: int, k1: int):
        """Layers ``[k0, k1)`` of ``store`` prepared on their own (local indices ``0 ..
        k1 - k0``): the engine's path when the weights do not fit ``weight_memory`` at once.
        """
        if (k0, k1) == (0, len(store)):
            return self.prepare_network(store)
        return self.prepare_network(store.slice(k0, k1))

    def share_preparation(self, net, k0: int, k1: int, comm) -> None:
        """Collective and optional: derive what layers ``[k0, k1)`` of ``net`` need before
        they run, the work split over ``comm``'s ranks (each rank then holds all of it).

        The engine calls it on every rank before every layer group. What a backend derives
        must not depend on which rank derived it. The default derives nothing here.
        """
        return None

    def prepared_bytes(self, nnz: int, neurons: int) -> int:
        """Estimated bytes of one prepared layer (CSR-like: index + value per weight)."""
        return 8 * int(nnz) + 20 * int(neurons)

    def activation_bytes(self, y, nnz=None) -> int:
        """Bytes the rows of ``y`` hold, for the engine's memory accounting; ``nnz``: their
        stored entries when the caller already knows them. Default: an index and a value per
        stored entry (:meth:`row_nnz` counts them when ``nnz`` is not given). A backend whose
        rows have another form (dense device buffers) says what it holds, without a pass
        over the rows."""
        return 8 * int(self.row_nnz(y).sum() if nnz is None else nnz)

    def activation_bytes_per_row(self, neurons: int) -> int:
        """Worst-case bytes one row of ``Y`` needs while a layer group runs on it: a dense
        row as sparse entries (index + value), once as input and once as output."""
        return 2 * 8 * int(neurons)

    # -- compute ---------------------------------------------------------------------------
    @abc.abstractmethod
    def layer(self, y, w, bias: np.ndarray, ymax: float):
        """``min(max(Y W + b, 0), ymax)``, bias only where ``Y W != 0``, zeros dropped."""

    def run_layers(  # noqa: PLR0913 - the one compute call: rows, layers and how to count
        self,
        y,
        net,
        k0: int,
        k1: int,
        prune: bool = True,
        consume: bool = False,
        weights=None,
    ):
        """Layers ``[k0, k1)`` of the prepared network ``net`` on the rows of ``y``.

        ``weights`` (int64 per row of ``y``, default all 1) is how many inputs each row
        stands for: a row counts that many times in the ``active`` and ``nnz`` statistics,
        so rows of any multiplicity run in one call and the counts stay exact.

        Returns ``(out, keep, stats)``: the rows still alive (all rows when ``prune`` is
        false) in input order, the index in ``y`` of each row of ``out``, and per-layer
        :data:`GroupStats`. This default steps one layer at a time through :meth:`layer`.
        """
        nl = k1 - k0
        stats = empty_stats(nl)
        keep = np.arange(self.row_nnz(y).size, dtype=np.int64)
        wt = None if weights is None else np.asarray(weights, np.int64)
        for i, k in enumerate(range(k0, k1)):
            y = self.layer(y, net.weights[k], net.bias[k], net.ymax)
            counts = self.row_nnz(y)
            if prune:
                alive = counts > 0
                n_alive = int(alive.sum())
                # Compacting costs a copy; only worth it once a good share of rows died.
                if n_alive < keep.size and (n_alive == 0 or 10 * n_alive < 9 * keep.size):
                    rows = np.flatnonzero(alive)
                    y = self.take_rows(y, rows)
                    keep = keep[rows]
                    counts = counts[rows]
            stats["rows"][i] = int((counts > 0).sum())
            if wt is None:
                stats["nnz"][i] = int(counts.sum())
                stats["active"][i] = stats["rows"][i]
            else:
                w = wt[keep]
                stats["nnz"][i] = int((w * counts).sum())
                stats["active"][i] = int(w[counts > 0].sum())
        return y, keep, stats

    def row_work(self, y) -> np.ndarray:
        """Cost of each row in the next layers (what re-balancing evens out)."""
        return self.row_nnz(y)

    def ideal_tiles(self, nrows: int) -> int:
        """Tiles one layer needs for ``nrows`` freshly grouped rows (0: no tiles)."""
        return 0

    def warmup(self, net) -> None:
        """Compile or initialise whatever the first layer call would (kept out of timings)."""
        if len(net) == 0:
            return
        n = net.neurons
        tiny = sp.csr_matrix(
            (np.ones(1, np.float32), (np.zeros(1, int), np.zeros(1, int))), shape=(1, n)
        )
        self.to_host(self.run_layers(self.to_device(tiny), net, 0, 1)[0])
        self.synchronize()

    def warmup_steps(self, net) -> list:
        """:meth:`warmup` as independent callables, in any order (the runner starts each
        rank at another one: :func:`mpisdnn.kernel_cache.in_turn`); by default one step."""
        return [lambda: self.warmup(net)]

    def synchronize(self) -> None:  # noqa: B027 - host backends have nothing to wait for
        """Wait for queued device work (so timers measure it)."""

    def describe(self) -> dict:
        """What the report records about this backend."""
        return {"name": self.name}
