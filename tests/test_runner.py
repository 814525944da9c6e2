"""The slice runner's result (:class:`~mpisdnn.sdnn.runner.RunnerStats`): read-only copies,
and a moved runner going on from the statistics of the one it replaces."""

import time

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import Network, backends
from mpisdnn.sdnn.options import InferOptions
from mpisdnn.sdnn.runner import RowBlock, SliceRunner
from mpisdnn.weights import as_store

from .conftest import self_comm


def _problem(rows=40, neurons=32, layers=5, seed=1):
    rng = np.random.default_rng(seed)
    w = sp.random(neurons, neurons, density=0.2, random_state=seed, dtype=np.float32)
    w.data[:] = 0.25
    net = Network([sp.csr_matrix(w)] * layers, np.full((layers, neurons), -0.1), neurons)
    y = sp.csr_matrix((rng.random((rows, neurons)) < 0.3).astype(np.float32))
    return net, y


def _run(store, y, first=0, total=None, carried=None):
    comm = self_comm()
    opts = InferOptions(backend="reference", weight_memory=1 << 30)
    be = backends.create(opts, comm)
    runner = SliceRunner(comm, be, store, opts, first=first, total=total, carried=carried)
    rows = RowBlock.of(comm, y)
    parts = runner.begin(rows, rows.id_end(comm))
    parts = runner.run_all(parts, time.perf_counter())
    return runner, runner.gather_host(parts)


def test_runner_stats_are_read_only_copies():
    net, y = _problem()
    runner, _ = _run(as_store(net), y)
    stats = runner.stats()
    for name in ("l_nnz", "l_active", "l_work", "l_sec"):
        arr = getattr(stats, name)
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 1
    with pytest.raises(AttributeError):  # frozen
        stats.threshold = 1.0
    assert stats.l_nnz.sum() > 0 and stats.t_local > 0
    # a copy: the runner's own arrays are not shared
    assert not np.shares_memory(stats.l_nnz, runner.stats().l_nnz)


def test_a_carried_runner_adds_to_the_statistics_it_replaces():
    net, y = _problem()
    store = as_store(net)
    whole, (y_all, _) = _run(store, y)
    # layers [0, 2) then [2, 5) on the rows the first part left: the second runner goes
    # on from the first's statistics, as a moved stage does
    first, (y_mid, gid) = _run(as_store(net).slice(0, 2), y, total=5)
    second, (y_end, _) = _run(
        as_store(net).slice(2, 5), y_mid, first=2, total=5, carried=first.stats()
    )
    assert (y_end != y_all[gid]).nnz == 0
    a, b = whole.stats(), second.stats()
    assert np.array_equal(a.l_nnz, b.l_nnz) and np.array_equal(a.l_active, b.l_active)
    assert [g[0] for g in b.groups][:1] == [0]  # the first runner's groups come first
