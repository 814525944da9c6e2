"""The backend interface shared by the CPU, reference and GPU paths."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class Backend:
    """One fused layer on backend-native arrays, plus host<->device transfers.

    Subclasses implement :meth:`to_device`, :meth:`to_host`, :meth:`layer`, :meth:`row_nnz`
    and :meth:`take_rows`. The engine only ever calls these.
    """

    name = "base"

    def prepare_network(self, network):
        """Convert every weight layer once; returns a list of backend layers."""
        return [self.to_device(w) for w in network.layers]

    def to_device(self, mat: sp.csr_matrix):
        raise NotImplementedError

    def to_host(self, mat) -> sp.csr_matrix:
        raise NotImplementedError

    def layer(self, y, w, bias: np.ndarray, ymax: float):
        """``min(max(Y W + b, 0), ymax)``, bias only where ``Y W != 0``, zeros dropped."""
        raise NotImplementedError

    def row_nnz(self, y) -> np.ndarray:
        """Host int64 array of stored entries per row."""
        raise NotImplementedError

    def nnz(self, y) -> int:
        return int(self.row_nnz(y).sum())

    def take_rows(self, y, rows: np.ndarray):
        """Sub-matrix of the given (sorted, host) row indices."""
        raise NotImplementedError

    def warmup(self, w, bias, ymax) -> None:
        """Compile or initialise whatever the first layer call would (kept out of timings)."""
        n = w.shape[0]
        tiny = sp.csr_matrix(
            (np.ones(1, np.float32), (np.zeros(1, int), np.zeros(1, int))), shape=(1, n)
        )
        self.layer(self.to_device(tiny), w, bias, ymax)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for queued device work (so timers measure it)."""

    def describe(self) -> dict:
        return {"name": self.name}
