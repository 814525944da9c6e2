"""Problems and checks shared by the simulator tests (test_gpu_sim) and the device tests
(test_gpu): the same cases, bit-identical to ``mpisdnn.reference_inference``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .conftest import random_network


def mixed_network(seed, neurons=64, layers=5, density=0.1):
    """Mixed-sign weights, biases <= -0.3: rows die at different layers."""
    net = random_network(neurons, layers, seed=seed, density=density, scale=1.0)
    net.bias[:] -= 0.3
    return net


def ragged_inputs(rows, neurons, seed, most=12):
    """Rows with 0 to ``most`` ones (empty and thin rows die early, thick ones survive)."""
    rng = np.random.default_rng(seed)
    r, c = [], []
    for i, d in enumerate(rng.integers(0, most, rows)):
        r += [i] * int(d)
        c += rng.choice(neurons, int(d), replace=False).tolist()
    return sp.csr_matrix(
        (np.ones(len(r), np.float32), (r, c)), shape=(rows, neurons), dtype=np.float32
    )


def reference_layers(net, y0, k0, k1):
    """Reference output after every layer of ``[k0, k1)`` (independent scipy implementation)."""
    from mpisdnn import Network, reference_inference

    out, y = [], y0
    for k in range(k0, k1):
        one = Network(net.layers[k : k + 1], net.bias[k : k + 1], net.neurons, ymax=net.ymax)
        y = reference_inference(y, one)
        out.append(y)
    return out


def bits(a):
    return np.asarray(sp.csr_matrix(a).toarray(), dtype=np.float32).view(np.int32)


def gpu_backend(**kw):
    from mpisdnn.backends.gpu import GpuBackend

    return GpuBackend(0, **kw)


def prepared(be, net):
    from mpisdnn.weights import InMemoryStore

    return be.prepare_network(InMemoryStore(net))


def check_group(be, net, y0, k0, k1, prune=True, y_in=None):
    ref = reference_layers(net, y0, k0, k1)
    dev = be.to_device(y0 if y_in is None else y_in)
    out, keep, st = be.run_layers(dev, prepared(be, net), k0, k1, prune)
    final = ref[-1]
    alive = np.flatnonzero(final.getnnz(axis=1))
    if prune:
        np.testing.assert_array_equal(keep, alive)
        assert np.array_equal(bits(be.to_host(out)), bits(final[keep]))
    else:
        np.testing.assert_array_equal(keep, np.arange(y0.shape[0]))
        assert np.array_equal(bits(be.to_host(out)), bits(final))
    np.testing.assert_array_equal(st["active"], [int((r.getnnz(axis=1) > 0).sum()) for r in ref])
    np.testing.assert_array_equal(st["nnz"], [r.nnz for r in ref])
    return st


def set_network(seed, neurons=64, layers=4, per=6):
    """Layers whose output columns come in *column sets* (equal inputs and weights), as in a
    radix-net, so the kernels sum each set once and write every member with its own bias:
    strided sets ``{q + i d}`` with per-entry values (mixed signs), listed (non-strided) sets
    with empty columns among them, and the official form (a fixed count per column, one
    weight value). Biases differ per column, so members of a set differ after the bias."""
    from mpisdnn import Network

    rng = np.random.default_rng(seed)
    n = neurons
    mats = []
    for k in range(layers):
        form = k % 3
        if form == 1:  # listed sets: columns copy one of a few leaders, some stay empty
            leaders = rng.choice(n, n // 5, replace=False)
            src = rng.choice(leaders, n)
            src[rng.random(n) < 0.15] = -1
        else:  # strided: column c copies column c mod d
            d = n // 4
            src = np.arange(n) % d
        base = {}
        rows, cols, vals = [], [], []
        for c in range(n):
            if src[c] < 0:
                continue
            if src[c] not in base:
                r = np.sort(rng.choice(n, per, replace=False))
                v = (np.full(per, 0.25, np.float32) if form == 2
                     else rng.uniform(-0.4, 0.9, per).astype(np.float32))
                base[src[c]] = (r, v)
            r, v = base[src[c]]
            rows += r.tolist()
            cols += [c] * per
            vals += v.tolist()
        mats.append(sp.csr_matrix((np.asarray(vals, np.float32), (rows, cols)), shape=(n, n)))
    bias = rng.uniform(-0.45, -0.05, (layers, n)).astype(np.float32)
    return Network(mats, bias, n)
