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
from ..network import YMAX, Network, as_csr32

__all__ = ["base_layer", "radixnet", "radixnet_layers", "KRON_WIDTH"]

#: Kronecker width of the official networks (every weight is 1/16, 32 nnz per row).
KRON_WIDTH = 16


def _check_n(neurons: int) -> int:
    m = neurons // KRON_WIDTH
    if neurons % KRON_WIDTH or m < 2 or m & (m - 1):
        raise UsageError(f"neurons must be 16 x a power of two >= 32, got {neurons}")
    return m


def _check_memory(neurons: int, layers: int, whole: bool) -> None:
    """Refuse a network whose layer (``whole``: every layer, as CSR) would not fit the
    memory available now, before any of it is allocated (one line, exit 2; was the OOM
    killer at ``--neurons 1073741824``, after 15 GB)."""
    from ..formats._validate import check_memory
    from ..weights import index_dtype

    isz = np.dtype(index_dtype(neurons)).itemsize
    # a layer's 32 inputs per neuron, and the row maps, sorts and tiles that build it
    per_layer = neurons * (2 * KRON_WIDTH * isz + 56)
    if whole:  # CSR: 32 entries of index + value per row, and the row pointers
        per_layer = neurons * (2 * KRON_WIDTH * (isz + 4) + 8)
    check_memory(float(per_layer) * (layers if whole else 1), f"a {neurons}-neuron network")


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


def _column_rows(rho: np.ndarray, m: int, shift: int, neurons: int, dtype) -> np.ndarray:
    """Input neurons of every output neuron of a layer, column by column, ascending.

    Row ``r`` of the layer is base row ``p = rho[r]``; base row ``p`` has its ones in the
    columns ``c`` with ``c mod M`` equal to ``p`` or ``p - shift``. So column ``c`` (with
    ``q = c mod M``) holds exactly the rows mapped to ``q`` and to ``q + shift``: 16 each.
    """
    groups = np.argsort(rho, kind="stable").reshape(m, KRON_WIDTH)  # rows of each base row
    q = np.arange(m)
    per_q = np.sort(np.concatenate([groups[q], groups[(q + shift) % m]], axis=1), axis=1)
    return np.tile(per_q.astype(dtype), (neurons // m, 1)).ravel()


def radixnet_layers(neurons: int, layers: int, seed: int = 0, bias=None):
    """Yield the layers of :func:`radixnet` one by one as column-wise :class:`CompactLayer`.

    Same network, same seed semantics, but built straight in compact form and one layer at a
    time, so memory stays at one layer whatever the depth (N=65536: 4 MiB per layer).
    """
    from ..weights import CompactLayer, index_dtype

    m = _check_n(neurons)
    if layers < 1:
        raise UsageError(f"layers must be >= 1, got {layers}")
    _check_memory(neurons, layers, whole=False)
    depth = int(np.log2(m))
    if bias is None:
        bias = DEFAULT_BIAS.get(neurons, -0.3)
    bias_row = np.full(neurons, bias, dtype=np.float32)
    bias_row.flags.writeable = False
    dtype = index_dtype(neurons)
    value = float(np.float32(1.0) * np.float32(1.0 / KRON_WIDTH))
    rng = np.random.default_rng(seed)
    rho = np.arange(neurons) % m  # block 0: row r is base row r mod M
    for layer in range(layers):
        block, k = divmod(layer, depth)
        if k == 0 and block > 0:
            rho = _row_map(neurons, rng)
        yield CompactLayer(
            neurons=neurons,
            rows=_column_rows(rho, m, 2**k, neurons, dtype),
            colptr=None,
            per_col=2 * KRON_WIDTH,
            values=None,
            value=value,
            bias=bias_row,
        )


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
    _check_memory(neurons, layers, whole=True)
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
