"""CuPy backend: cuSPARSE SpGEMM, then bias/ReLU/clip/drop on the result's value array.

One rank per GPU; rank ``r`` uses device ``r % device_count`` (node-local numbering is what
``CUDA_VISIBLE_DEVICES`` and Slurm's ``--gpus-per-task`` give each rank).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import BackendError
from .base import Backend


class GpuBackend(Backend):
    name = "gpu"

    def __init__(self, rank=0):
        try:
            import cupy as cp
            import cupyx.scipy.sparse as csp
        except ImportError as exc:
            raise BackendError(
                f"backend 'gpu' needs CuPy (pip install 'mpisdnn[gpu]'): {exc}"
            ) from None
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - any CUDA failure means no usable GPU
            raise BackendError(f"backend 'gpu': no usable CUDA device ({exc})") from None
        if count < 1:
            raise BackendError("backend 'gpu': no CUDA device visible")
        self.device = int(rank) % count
        cp.cuda.Device(self.device).use()
        self.cp, self.csp = cp, csp

    @classmethod
    def from_options(cls, options, comm):
        from ..system import node_rank

        return cls(node_rank(comm))

    def prepare_layer(self, layer):
        return self.to_device(layer.to_csr())

    def describe(self):
        return {"name": self.name, "device": self.device}

    def to_device(self, mat):
        m = sp.csr_matrix(mat, dtype=np.float32)
        return self.csp.csr_matrix(
            (
                self.cp.asarray(m.data),
                self.cp.asarray(m.indices.astype(np.int32)),
                self.cp.asarray(m.indptr.astype(np.int32)),
            ),
            shape=m.shape,
        )

    def to_host(self, mat, consume=False):
        return sp.csr_matrix((mat.data.get(), mat.indices.get(), mat.indptr.get()), shape=mat.shape)

    def layer(self, y, w, bias, ymax):
        cp = self.cp
        z = y @ w
        z.eliminate_zeros()
        if not hasattr(self, "_bias_cache") or self._bias_cache[0] is not bias:
            self._bias_cache = (bias, cp.asarray(bias, dtype=cp.float32))
        b = self._bias_cache[1]
        z.data += b[z.indices]
        cp.clip(z.data, 0, np.float32(ymax), out=z.data)
        z.eliminate_zeros()
        return z

    def row_nnz(self, y):
        return cp_diff(self.cp, y.indptr)

    def take_rows(self, y, rows):
        return y[self.cp.asarray(rows)]

    def synchronize(self):
        self.cp.cuda.get_current_stream().synchronize()


def cp_diff(cp, indptr):
    return cp.diff(indptr).get().astype(np.int64)
