"""The challenge's MATLAB semantics in plain scipy: the yardstick every backend is tested against.

MATLAB reference (per layer)::

    Z = Y * W;  Z(Z ~= 0) = Z(Z ~= 0) + b;  Z(Z < 0) = 0;  Z(Z > YMAX) = YMAX;  Y = Z

The bias is added only where ``Y*W`` is numerically non-zero, so an exact cancellation gets no
bias and an empty row stays empty whatever the bias sign.

Arithmetic is float32 and every sum runs over the input neurons in ascending order (rows kept
with sorted column indices). That order is part of the definition: with weights of 1/16 and a
bias like -0.3, some sums land within rounding of the ReLU threshold, and only a fixed order
makes every backend (and every rank count) agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._checks import check_int, check_layer_args, check_reference_args
from ..network import as_csr32

__all__ = ["reference_layer", "reference_inference", "categories_of"]


def reference_layer(y, w, bias, ymax=32.0) -> sp.csr_matrix:
    """One layer ``min(max(Y W + b, 0), ymax)`` with the bias only on non-zeros of ``Y W``
    (both in float32 CSR with repeats summed first, :func:`~mpisdnn.network.as_csr32`: a
    float64 ``W`` made the product float64)."""
    check_layer_args(y, w, bias, ymax)
    return _activate(as_csr32(y) @ as_csr32(w), bias, ymax)


def _activate(product, bias, ymax) -> sp.csr_matrix:
    """The layer's rule on ``Z = Y W``: bias where ``Z`` is non-zero, ReLU, clip."""
    z = sp.csr_matrix(product, dtype=np.float32)
    z.sort_indices()
    z.eliminate_zeros()
    bias = np.asarray(bias, dtype=np.float32)
    if bias.ndim == 0:
        z.data += bias
    else:
        z.data += bias[z.indices]
    np.clip(z.data, 0, np.float32(ymax), out=z.data)
    z.eliminate_zeros()
    return z


def reference_inference(y0, network, layers=None) -> sp.csr_matrix:
    """Run all (or the first ``layers``) layers of ``network`` on ``y0`` with scipy.

    ``network`` is a :class:`~mpisdnn.network.Network` or any
    :class:`~mpisdnn.weights.WeightStore` (e.g. a memory-mapped v2 file). A store's layer
    is column-wise, so its arrays are ``W^T`` in CSR as they lie, and ``Y W`` is
    computed as ``(W^T Y^T)^T``: the same sums in the same
    order, bit for bit (each output ``(i, c)`` adds ``Y[i, j] W[j, c]`` over ascending ``j``
    either way, and a product of two floats does not depend on their order), without
    converting each layer to CSR (37-290 ms a layer at N=65536, most of the challenge's
    sampled-row check of 65536 x 1920).
    """
    from ..weights import WeightStore

    check_reference_args(y0, network, layers)
    y = as_csr32(y0)
    count = len(network) if layers is None else layers
    for k in range(count):
        if isinstance(network, WeightStore):
            layer = network.layer(k)
            y = _activate(_store_product(layer.transpose_csr(), y), layer.bias, network.ymax)
        else:
            y = reference_layer(y, network.layers[k], network.bias[k], network.ymax)
    return y


#: Share of ``Y``'s entries that are non-zero above which a store's layer is applied as a
#: dense mat-vec (``W^T`` times ``Y^T`` as columns: one pass over the weights) rather than a
#: sparse product (whose cost follows ``Y``'s entries). Surviving rows at N=65536 are dense.
_DENSE_SHARE = 0.25


def _store_product(wt, y):
    """``Y W`` from ``W^T`` in CSR, bit for bit the sparse product's: every output adds
    ``Y[i, j] W[j, c]`` over ascending ``j`` in float32 either way; the dense mat-vec also
    adds the zero terms, and ``x + 0 = x`` (a sum never is -0: it starts at +0, and an exact
    cancellation rounds to +0), so only the cost differs. Only ``Y``'s non-empty rows are
    multiplied (an empty row stays empty)."""
    rows, n = y.shape
    live = np.flatnonzero(np.diff(y.indptr))
    if live.size == 0:
        return sp.csr_matrix((rows, n), dtype=np.float32)
    sub = y[live]
    if sub.nnz > _DENSE_SHARE * live.size * n:
        zt = wt @ sub.T.toarray()
    else:
        zt = wt @ sub.T.tocsr()
    z = sp.csr_matrix(zt.T, dtype=np.float32)
    if live.size == rows:
        return z
    indptr = np.zeros(rows + 1, dtype=np.int64)
    indptr[live + 1] = np.diff(z.indptr)
    return sp.csr_matrix((z.data, z.indices, np.cumsum(indptr)), shape=(rows, n))


def categories_of(y, row_offset: int = 0) -> np.ndarray:
    """1-based indices of rows with a non-zero sum (the challenge's categories)."""
    row_offset = check_int("row_offset", row_offset, low=0)  # -1 named a row 0
    y = sp.csr_matrix(y)
    sums = np.asarray(y.sum(axis=1)).ravel()
    return np.flatnonzero(sums != 0).astype(np.int64) + row_offset + 1
