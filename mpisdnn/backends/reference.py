"""Plain scipy backend: the MATLAB semantics, used as the reference in tests and benchmarks."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..sdnn.reference import reference_layer
from .base import Backend


class ReferenceBackend(Backend):
    """One scipy product and three element-wise passes per layer (:func:`reference_layer`)."""

    name = "reference"

    @classmethod
    def from_options(cls, options, comm):
        return cls()

    def to_device(self, mat):
        m = sp.csr_matrix(mat, dtype=np.float32, copy=True)
        m.sort_indices()
        return m

    def to_host(self, y, consume=False):
        return y

    def prepare_layer(self, layer):
        return layer.to_csr()

    def layer(self, y, w, bias, ymax):
        return reference_layer(y, w, bias, ymax)

    def row_nnz(self, y):
        return np.diff(y.indptr).astype(np.int64)

    def take_rows(self, y, rows):
        return y[rows]
