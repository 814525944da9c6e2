"""RadiX-Net networks with the structure of the official Graph Challenge files.

Checked against the official N=1024 files: layer k (k = 1..log2(N/16)) of the first block is
``kron(ones(16, 16), I_M + roll(I_M, -2**(k-1), axis=1)) / 16`` with ``M = N/16``. Layers come
in blocks of ``log2(M)``; block ``b`` reuses the base layers with every row ``r`` replaced by
base row ``rho_b(r)``, where ``rho_b`` is a seeded random map using every residue class mod M
exactly 16 times (block 0 is unmapped).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError
from ..formats.tsv import DEFAULT_BIAS
from ..sdnn.network import YMAX, Network, as_csr32

__all__ = ["base_layer", "radixnet", "KRON_WIDTH"]

#: Kronecker width of the official networks (every weight is 1/16, 32 nnz per row).
KRON_WIDTH = 16


def _check_n(neurons: int) -> int:
    m = neurons // KRON_WIDTH
    if neurons % KRON_WIDTH or m < 2 or m & (m - 1):
        raise UsageError(f"neurons must be 16 x a power of two >= 32, got {neurons}")
    return m


def base_layer(neurons: int, k: int) -> sp.csr_matrix:
    """Base layer ``k`` (1-based, ``1 <= k <= log2(N/16)``) as float32 CSR."""
    m = _check_n(neurons)
    depth = int(np.log2(m))
    if not 1 <= k <= depth:
        raise UsageError(f"base layer k must be in 1..{depth} for N={neurons}, got {k}")
    shift = 2 ** (k - 1)
    a = np.arange(m)
    # I + roll(I, -s, axis=1): row a has ones at columns a and (a - s) mod m.
    rows = np.concatenate([a, a])
    cols = np.concatenate([a, (a - shift) % m])
    b = sp.coo_matrix((np.ones(2 * m, dtype=np.float32), (rows, cols)), shape=(m, m))
    w = sp.kron(np.ones((KRON_WIDTH, KRON_WIDTH), dtype=np.float32), b, format="csr")
    return as_csr32(w * np.float32(1.0 / KRON_WIDTH))


def _row_map(neurons: int, rng) -> np.ndarray:
    m = neurons // KRON_WIDTH
    return rng.permutation(np.repeat(np.arange(m), KRON_WIDTH))


def radixnet(neurons: int, layers: int, seed: int = 0, bias=None) -> Network:
    """Generate an ``N``-neuron, ``L``-layer network shaped like the official ones.

    Parameters
    ----------
    neurons : int
        16 x a power of two (1024, 4096, 16384, 65536 are the official sizes).
    layers : int
    seed : int
        Seed of the row maps of blocks 1, 2, ... (block 0 never depends on it).
    bias : float, optional
        Default: the official bias for N (-0.3, -0.35, -0.4, -0.45), else -0.3.
    """
    m = _check_n(neurons)
    if layers < 1:
        raise UsageError(f"layers must be >= 1, got {layers}")
    depth = int(np.log2(m))
    base = [base_layer(neurons, k) for k in range(1, depth + 1)]
    rng = np.random.default_rng(seed)
    mats = []
    rho = None
    for layer in range(layers):
        block, k = divmod(layer, depth)
        if k == 0:
            rho = None if block == 0 else _row_map(neurons, rng)
        w = base[k] if rho is None else as_csr32(base[k][rho])
        mats.append(w)
    if bias is None:
        bias = DEFAULT_BIAS.get(neurons, -0.3)
    return Network(
        mats,
        np.full((layers, neurons), bias, dtype=np.float32),
        neurons,
        total_layers=layers,
        ymax=YMAX,
        source=f"mpisdnn generate network --neurons {neurons} --layers {layers} --seed {seed}",
    )
