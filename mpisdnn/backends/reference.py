"""Plain scipy backend: the MATLAB semantics, used as the reference in tests and benchmarks."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..sdnn.reference import reference_layer
from .base import Backend


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self, **_):
        pass

    def to_device(self, mat):
        m = sp.csr_matrix(mat, dtype=np.float32, copy=True)
        m.sort_indices()
        return m

    def to_host(self, mat):
        return mat

    def layer(self, y, w, bias, ymax):
        return reference_layer(y, w, bias, ymax)

    def row_nnz(self, y):
        return np.diff(y.indptr).astype(np.int64)

    def take_rows(self, y, rows):
        return y[rows]
