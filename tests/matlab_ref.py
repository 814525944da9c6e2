"""An independent implementation of the challenge's MATLAB semantics, for tests only.

Written from the MATLAB reference, not from mpisdnn's code: dense numpy for the arithmetic,
so it shares nothing with the package's scipy or numba paths except float32.
"""

import numpy as np
import scipy.sparse as sp


def matlab_layer_dense(y, w, bias, ymax=32.0):
    """``Z = Y*W; Z(Z~=0) += b; Z(Z<0) = 0; Z(Z>YMAX) = YMAX`` on dense float32 arrays."""
    y = np.asarray(y, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    z = np.zeros((y.shape[0], w.shape[1]), dtype=np.float32)
    for r in range(y.shape[0]):
        for j in np.flatnonzero(y[r]):
            z[r] += y[r, j] * w[j]
    nz = z != 0
    b = np.broadcast_to(np.asarray(bias, dtype=np.float32), z.shape)
    z[nz] = z[nz] + b[nz]
    z[z < 0] = 0
    z[z > ymax] = np.float32(ymax)
    return z


def matlab_inference(y0, layers, biases, ymax=32.0):
    """All layers with :func:`matlab_layer_dense`; returns the dense final Y."""
    y = sp.csr_matrix(y0).toarray().astype(np.float32)
    for w, b in zip(layers, biases):
        y = matlab_layer_dense(y, sp.csr_matrix(w).toarray(), b, ymax)
    return y


def scipy_inference(y0, layers, biases, ymax=32.0):
    """Plain scipy version for sizes where dense is too big (MATLAB semantics).

    Sums run over input neurons in ascending order, like the dense version above.
    """
    y = sp.csr_matrix(y0, dtype=np.float32)
    for w, b in zip(layers, biases):
        y.sort_indices()
        z = (y @ sp.csr_matrix(w, dtype=np.float32)).tocoo()
        keep = z.data != 0
        rows, cols, vals = z.row[keep], z.col[keep], z.data[keep]
        vals = vals + np.asarray(b, dtype=np.float32)[cols]
        vals = np.minimum(np.maximum(vals, np.float32(0)), np.float32(ymax))
        alive = vals != 0
        y = sp.csr_matrix(
            (vals[alive], (rows[alive], cols[alive])), shape=z.shape, dtype=np.float32
        )
    return y


def categories(y):
    """1-based rows with a non-zero sum."""
    sums = np.asarray(sp.csr_matrix(y).sum(axis=1)).ravel()
    return np.flatnonzero(sums != 0) + 1
