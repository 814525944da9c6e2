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
