"""Results that must be exact, against the independent oracle of ``tests/matlab_ref.py``.

Three kinds of wrong result that other tests let through (issue 32):

* a sum that lands exactly on the ReLU threshold (``Y W + b == 0``) must give no entry at all,
  not an explicit zero, in every kernel path: tiles, the push kernel's residue writer (one
  bias and a bias per neuron) and its bitmap writer, and the gpu kernels under the simulator.
  Weights of 1/16 and biases that are multiples of 1/16 make such sums exact and frequent;
  every test first checks that the oracle really has them;
* a ceiling ``ymax`` other than 32, with sums above it, in every backend and kernel path;
* categories and the final Y at 1, 2 and 3 ranks, on rows whose survivors sit on every rank
  behind rows that died (a category taken from a local or a pruned row position is wrong
  there), also when rows are re-balanced and when the layers run in stages.

Results are compared as CSR arrays (row pointers, columns, value bits), so an explicit zero or
a row out of place fails, where ``(a != b).nnz == 0`` would not see it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import Network
from mpisdnn.partition import balanced_blocks

from .conftest import random_network, run_infer, self_comm, world
from .matlab_ref import categories, matlab_inference

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


# -- problems --------------------------------------------------------------------------------


def _csr(dense) -> sp.csr_matrix:
    m = sp.csr_matrix(np.asarray(dense, np.float32))
    m.sort_indices()
    return m


def assert_exact(got, want):
    """Same shape, row pointers, columns and value bits; no explicit zero stored."""
    got = sp.csr_matrix(got, dtype=np.float32, copy=True)
    got.sort_indices()
    want = _csr(want) if not sp.issparse(want) else sp.csr_matrix(want)
    assert got.shape == want.shape
    assert not (got.data == 0).any(), f"{int((got.data == 0).sum())} explicit zeros stored"
    np.testing.assert_array_equal(np.diff(got.indptr), np.diff(want.indptr))
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data.view(np.uint32), want.data.view(np.uint32))


def oracle(y0, net):
    """Final Y (dense) and nnz after every layer, from the dense MATLAB oracle."""
    y, nnz = sp.csr_matrix(y0).toarray(), []
    for w, b in zip(net.layers, net.bias):
        y = matlab_inference(y, [w], [b], net.ymax)
        nnz.append(int(np.count_nonzero(y)))
    return y, nnz


def threshold_hits(y0, net) -> int:
    """Sums ``Y W`` (of the oracle's inputs to each layer) that are non-zero but land exactly
    on the threshold once the bias is added: the entries a ``>= 0`` test would keep."""
    y, hits = sp.csr_matrix(y0).toarray(), 0
    for w, b in zip(net.layers, net.bias):
        z = matlab_inference(y, [w], [np.zeros_like(b)], np.inf)  # Y W, ReLU'd, unclipped
        # matlab_inference ReLUs: a negative sum cannot hit a negative bias's threshold anyway.
        hits += int(((z != 0) & (z + b[None, :] == 0)).sum())
        y = matlab_inference(y, [w], [b], net.ymax)
    return hits


def sixteenths(neurons, layers, seed, density=0.2):
    """Random network (no residue sets: the push kernel's bitmap writer) whose weights are
    +-1/16 and biases multiples of 1/16, so sums hit the threshold exactly."""
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(layers):
        w = sp.random(neurons, neurons, density=density, random_state=rng, dtype=np.float32)
        w.data[:] = np.float32(1 / 16)
        w.data[rng.random(w.nnz) < 0.2] *= -1
        mats.append(sp.csr_matrix(w))
    bias = -rng.integers(1, 4, (layers, neurons)).astype(np.float32) / 16
    return Network(mats, bias, neurons)


def paired(neurons, layers, seed):
    """:func:`sixteenths` with every column doubled (``2k`` and ``2k + 1`` equal): column sets
    of two members that are not residue classes (the bitmap writer), whose biases differ, so
    an active set holds members whose own sum stays at or below zero."""
    net = sixteenths(neurons // 2, layers, seed)
    twice = np.repeat(np.arange(neurons // 2), 2)
    mats = [sp.csr_matrix(sp.csr_matrix(w[twice])[:, twice]) for w in net.layers]
    bias = -np.random.default_rng(seed).integers(1, 4, (layers, neurons)).astype(np.float32) / 16
    return Network(mats, bias, neurons)


def radix(layers, bias, seed=3, neurons=256, ymax=32.0):
    """A radix-net (weights 1/16, columns in residue sets) with ``bias`` (a number or a
    ``(layers, neurons)`` array) and ``ymax``."""
    from mpisdnn.generate import radixnet

    base = radixnet(neurons, layers, seed=seed, bias=-0.25)
    b = np.broadcast_to(np.asarray(bias, np.float32), base.bias.shape).copy()
    return Network(base.layers, b, neurons, ymax=ymax)


def ones(rows, neurons, seed, density, value=1.0):
    rng = np.random.default_rng(seed)
    y = sp.random(rows, neurons, density=density, random_state=rng, dtype=np.float32).tocsr()
    y.data[:] = value
    return y


#: Kernel paths of the cpu backend: ``push_density`` 0 is tiles only, 2.0 pushes every row
#: through every layer, 0.3 pushes rows while they are sparse and finishes them in tiles.
CPU_PATHS = {"tiles": 0.0, "push": 2.0, "mixed": 0.3}


def _nets_on_threshold():
    rng = np.random.default_rng(5)
    per_neuron = -rng.integers(3, 6, (6, 256)).astype(np.float32) / 16
    return {
        # residue sets, one bias: the residue writer's shared activation
        "radix-one-bias": (radix(6, -0.25), ones(60, 256, 1, 0.22)),
        # residue sets, a bias per neuron: the residue writer's per-member activation
        "radix-per-neuron": (radix(6, per_neuron), ones(60, 256, 2, 0.22)),
        # no sets: the bitmap writer (and tiles of single columns)
        "random": (sixteenths(200, 6, seed=7), ones(60, 200, 3, 0.2)),
        # sets of two members with their own biases: the bitmap writer's per-member zeros
        "random-pairs": (
            paired(200, 6, seed=8),
            sp.vstack([ones(30, 200, 4, 0.3), ones(30, 200, 5, 0.05)]).tocsr(),
        ),
    }


@pytest.fixture(scope="module")
def on_threshold():
    return _nets_on_threshold()


# -- sums exactly on the threshold --------------------------------------------------------


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("case", ["radix-one-bias", "radix-per-neuron", "random", "random-pairs"])
def test_sum_exactly_on_threshold_stores_nothing(on_threshold, case, path):
    net, y0 = on_threshold[case]
    want, nnz = oracle(y0, net)
    assert threshold_hits(y0, net) > 20  # the case really exercises the threshold
    assert 0 < np.count_nonzero(want.any(axis=1)) < y0.shape[0]
    res = run_infer(net, y0, backend="cpu", push_density=CPU_PATHS[path], max_group=3)
    assert_exact(res.y_local, want)
    assert res.layer_nnz == nnz
    assert res.categories.tolist() == categories(want).tolist()


@pytest.mark.parametrize("case", ["radix-one-bias", "random"])
def test_reference_on_threshold(on_threshold, case):
    from mpisdnn import reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net, y0 = on_threshold[case]
    want, _ = oracle(y0, net)
    ref = reference_inference(y0, net)
    assert_exact(ref, want)
    res = run_infer(net, y0, backend="reference")
    assert_exact(res.y_local, want)
    # The truth files are written with categories_of (1-based, shifted by the block's row).
    assert categories_of(ref).tolist() == categories(want).tolist()
    assert categories_of(ref[30:], 30).tolist() == [c for c in categories(want) if c > 30]


# -- a ceiling other than 32 ---------------------------------------------------------------


def _nets_with_ymax(ymax):
    rng = np.random.default_rng(11)
    per_neuron = -rng.integers(0, 4, (4, 256)).astype(np.float32) / 16
    big = sixteenths(200, 4, seed=12, density=0.3)
    big.ymax = ymax
    return {
        "radix-one-bias": (radix(4, -0.25, ymax=ymax), ones(40, 256, 4, 0.4, value=6.0)),
        "radix-per-neuron": (radix(4, per_neuron, ymax=ymax), ones(40, 256, 5, 0.4, value=6.0)),
        "random": (big, ones(40, 200, 6, 0.4, value=6.0)),
    }


@pytest.fixture(scope="module", params=[2.75, 40.0], ids=["ymax2.75", "ymax40"])
def with_ymax(request):
    ymax = request.param
    cases = _nets_with_ymax(ymax)
    for net, y0 in cases.values():
        want, _ = oracle(y0, net)
        # Entries at the ceiling, and (for 40) values above the challenge's 32.
        assert (want == np.float32(ymax)).sum() > 50
        assert ymax < 32 or (want > 32).sum() > 50
    return ymax, cases


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("case", ["radix-one-bias", "radix-per-neuron", "random"])
def test_cpu_ymax_other_than_32(with_ymax, case, path):
    _, cases = with_ymax
    net, y0 = cases[case]
    want, nnz = oracle(y0, net)
    res = run_infer(net, y0, backend="cpu", push_density=CPU_PATHS[path], max_group=2)
    assert_exact(res.y_local, want)
    assert res.layer_nnz == nnz


@pytest.mark.parametrize("case", ["radix-one-bias", "random"])
def test_reference_ymax_other_than_32(with_ymax, case):
    from mpisdnn import reference_inference, reference_layer

    ymax, cases = with_ymax
    net, y0 = cases[case]
    want, _ = oracle(y0, net)
    assert_exact(reference_inference(y0, net), want)
    assert_exact(run_infer(net, y0, backend="reference").y_local, want)
    one = matlab_inference(y0, net.layers[:1], net.bias[:1], ymax)
    assert_exact(reference_layer(y0, net.layers[0], net.bias[0], ymax), one)


def test_ymax_survives_an_hdf5_round_trip(tmp_path):
    """A network file's ``ymax`` reaches the kernels (v1 file, read whole and streamed)."""
    from mpisdnn.formats import hdf5

    net, y0 = _nets_with_ymax(2.75)["random"]
    want, _ = oracle(y0, net)
    path = tmp_path / "net.h5"
    hdf5.write_network(path, net)
    back = hdf5.read_network(path)
    assert back.ymax == 2.75
    assert_exact(run_infer(back, y0, backend="cpu").y_local, want)
    streamed = run_infer(path_store(path), y0, backend="cpu", weight_memory=1)
    assert_exact(streamed.y_local, want)


def path_store(path):
    from mpisdnn.sdnn.streaming import Hdf5LayerSource

    return Hdf5LayerSource(path)


# -- the gpu kernels under the CUDA simulator -----------------------------------------------


@pytest.mark.gpu_sim
@pytest.mark.parametrize(
    "what, case", [("threshold", "radix-one-bias"), ("threshold", "random"), ("ymax", "random")]
)
def test_gpu_kernels_threshold_and_ymax(what, case):
    if not SIM:
        pytest.skip("gpu kernels: run with NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh does)")
    if what == "threshold":
        net, y0 = _nets_on_threshold()[case]
    else:
        net, y0 = _nets_with_ymax(2.75)[case]
    # Small: the simulator runs every GPU thread in Python.
    net = Network(net.layers[:2], net.bias[:2], net.neurons, ymax=net.ymax)
    y0 = y0[:12]
    want, nnz = oracle(y0, net)
    assert what != "threshold" or threshold_hits(y0, net) > 20
    assert what != "ymax" or (want == np.float32(net.ymax)).sum() > 20
    res = run_infer(net, y0, backend="gpu", gpus_per_rank=0, max_group=2)
    assert_exact(res.y_local, want)
    assert res.layer_nnz == nnz


@pytest.mark.gpu_sim
def test_gpu_positive_bias_only_where_the_sum_is_non_zero():
    """A positive bias revives nothing: not a column no input reaches, not a sum that cancels
    to exactly zero (mutant gpu-bias-on-zero of scripts/mutation.py: the negative biases of
    every other test hide it, since ReLU clears ``0 + b < 0`` anyway)."""
    if not SIM:
        pytest.skip("gpu kernels: run with NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh does)")
    w = np.zeros((4, 4), np.float32)
    w[0, 0], w[1, 0], w[0, 1], w[1, 1] = 0.5, -0.5, 0.25, 0.25  # column 0 cancels
    net = Network([sp.csr_matrix(w)], np.full((1, 4), 0.75, np.float32), 4)
    y0 = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 0, 1, 0]], np.float32))
    want, nnz = oracle(y0, net)
    assert want.tolist() == [[0, 1.25, 0, 0], [0, 0, 0, 0]]  # columns 0, 2, 3 stay empty
    res = run_infer(net, y0, backend="gpu", gpus_per_rank=0)
    assert_exact(res.y_local, want)
    assert res.layer_nnz == nnz


# -- categories and final Y across ranks ----------------------------------------------------


def spread_problem():
    """90 rows whose survivors sit in every third of the rows, each behind rows that die
    (so no survivor's position among the survivors, or in its rank's block, is its row)."""
    net = random_network(64, 6, seed=11, density=0.1, scale=0.6)
    rng = np.random.default_rng(12)
    y = sp.random(90, 64, density=0.1, random_state=rng, dtype=np.float32).tocsr()
    y.data[:] = 1.0
    return net, y


def _check_spread(y0, want, bounds):
    alive = np.flatnonzero(want.any(axis=1))
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        mine = alive[(alive >= r0) & (alive < r1)]
        assert mine.size >= 2 and mine[0] > r0, (r0, r1, mine)  # a dead row comes first


def _blocks(y0, size):
    return balanced_blocks(np.diff(y0.indptr), size)


def check_run(comm, backend, **options):
    """Infer on ``comm`` from an nnz-balanced split; categories and every rank's block of the
    final Y must be the oracle's, bit for bit (and the oracle must spread survivors)."""
    net, y0 = spread_problem()
    want, nnz = oracle(y0, net)
    off = _blocks(y0, comm.size)
    _check_spread(y0, want, [0, 30, 60, 90])
    _check_spread(y0, want, off)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    res = run_infer(
        net, y0[r0:r1], comm, backend=backend, row_offset=r0, g_rows=y0.shape[0], **options
    )
    assert res.categories.tolist() == categories(want).tolist()
    assert_exact(res.y_local, want[r0:r1])
    assert res.layer_nnz == nnz
    return res


def check_rebalanced(comm, backend):
    net, y0 = spread_problem()
    want, nnz = oracle(y0, net)
    bounds = np.linspace(0, y0.shape[0], comm.size + 1).astype(int)
    _check_spread(y0, want, bounds)
    r0, r1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    res = run_infer(
        net, y0[r0:r1], comm, backend=backend, row_offset=r0, g_rows=y0.shape[0],
        rebalance_threshold=1.01, first_group=1,
        **({} if backend == "reference" else {"max_group": 1}),  # the reference: no groups
    )  # fmt: skip
    assert res.categories.tolist() == categories(want).tolist()
    assert_exact(res.y_local, want[r0:r1])
    assert res.layer_nnz == nnz
    if comm.size > 1:
        assert res.rebalances and sum(e["rows_moved"] for e in res.rebalances) > 0
    return res


def check_stages(comm, backend, stages):
    """``stages`` pipeline stages (1: every rank alone; ``comm.size``: one group)."""
    from mpisdnn import InferOptions
    from mpisdnn.sdnn.pipeline import run_pipeline, stage_layers

    net, y0 = spread_problem()
    want, nnz = oracle(y0, net)
    off = _blocks(y0, comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    layers = len(net)
    k0, k1 = stage_layers(comm.rank % stages, stages, 0, layers)
    stage = Network(net.layers[k0:k1], net.bias[k0:k1], 64, total_layers=layers, layer_start=k0)
    res = run_pipeline(
        stage, y0[r0:r1], comm, stages=stages, k0=k0, k1=k1, total_layers=layers,
        row_offset=r0, g_rows=y0.shape[0], batch_rows=7, options=InferOptions(backend=backend),
    )  # fmt: skip
    assert res.categories.tolist() == categories(want).tolist()
    assert_exact(res.y_local, want[r0:r1])
    assert res.layer_nnz == nnz


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_one_rank_categories_and_y_exact(backend):
    check_run(self_comm(), backend)
    check_run(self_comm(), backend, memory_per_rank=1)  # one row per batch
    check_rebalanced(self_comm(), backend)
    check_stages(self_comm(), backend, 1)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_ranks_categories_and_y_exact(backend):
    check_run(world(), backend)


@pytest.mark.mpi
def test_ranks_categories_and_y_exact_in_row_batches():
    check_run(world(), "cpu", memory_per_rank=1)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_ranks_categories_and_y_exact_after_rebalancing(backend):
    check_rebalanced(world(), backend)


@pytest.mark.mpi
@pytest.mark.parametrize("stages", ["one", "all"])
def test_ranks_categories_and_y_exact_in_stages(stages):
    comm = world()
    check_stages(comm, "cpu", 1 if stages == "one" else comm.size)


def _with_repeats(m, count, rng) -> sp.csr_matrix:
    """``m`` as a CSR that also holds ``count`` repeats of its stored entries, with other
    values, each after the entries of its row (scipy keeps them; MATLAB would sum them)."""
    m = sp.coo_matrix(m)
    extra = rng.integers(0, m.nnz, count)
    r = np.concatenate([m.row, m.row[extra]])
    c = np.concatenate([m.col, m.col[extra]])
    v = np.concatenate([m.data, rng.random(count).astype(np.float32)])
    o = np.argsort(r, kind="stable")
    ptr = np.searchsorted(r[o], np.arange(m.shape[0] + 1))
    return sp.csr_matrix((v[o], c[o], ptr), shape=m.shape)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_y0_with_repeated_columns_is_summed_like_matlab(backend):
    """A CSR ``Y0`` holding a column twice in a row (scipy allows it; MATLAB's ``sparse``
    sums repeats) gave the cpu backend one row and the reference another: both now sum the
    repeats first, in float32, and the caller's arrays stay as they were."""
    from mpisdnn import reference_inference

    net = random_network(64, 4, seed=11)
    rng = np.random.default_rng(5)
    y0 = _with_repeats(sp.random(40, 64, density=0.2, random_state=rng, dtype=np.float32),
                       60, rng)  # fmt: skip
    assert not y0.has_canonical_format
    kept = (y0.data.copy(), y0.indices.copy(), y0.indptr.copy())
    want = matlab_inference(y0, net.layers, net.bias, net.ymax)
    assert_exact(run_infer(net, y0, backend=backend).y_local, want)
    assert_exact(reference_inference(y0, net), want)
    assert all(np.array_equal(a, b) for a, b in zip(kept, (y0.data, y0.indices, y0.indptr)))
    # a case whose two products round apart from the product of the sum (0.7 w + 0.9 w):
    # the reference added the products and lost the bits the others kept
    layers = [sp.random(32, 32, density=0.2, format="csr", random_state=1, dtype=np.float32)
              for _ in range(3)]  # fmt: skip
    net = Network(layers, np.full((3, 32), -0.3, np.float32), 32)
    y0 = sp.csr_matrix((np.array([0.7, 0.9], np.float32), np.array([1, 1]),
                        np.array([0, 2] + [2] * 9)), shape=(10, 32))  # fmt: skip
    want = matlab_inference(y0, net.layers, net.bias, net.ymax)
    assert_exact(run_infer(net, y0, backend=backend).y_local, want)
    assert_exact(reference_inference(y0, net), want)


def test_a_network_layer_with_repeated_entries_is_summed_like_matlab():
    """A weight CSR holding a ``(row, column)`` twice: ``reference_inference`` (the
    independent check of ``challenge``) multiplied the repeats apart and disagreed with the
    backends and with MATLAB; ``Network.edges`` counted the repeats. The network now holds
    each layer with its repeats summed (the caller's matrix untouched)."""
    from mpisdnn import reference_inference

    rng = np.random.default_rng(3)
    layers = [_with_repeats(sp.random(32, 32, density=0.2, random_state=rng, dtype=np.float32),
                            30, rng) for _ in range(3)]  # fmt: skip
    given = [(w.data.copy(), w.indices.copy()) for w in layers]
    net = Network(layers, np.full((3, 32), -0.3, np.float32), 32)
    assert net.edges == sum(int(sp.csr_matrix(w.toarray()).nnz) for w in layers) < sum(
        w.nnz for w in layers)  # fmt: skip
    assert all(np.array_equal(d, w.data) and np.array_equal(i, w.indices)
               for (d, i), w in zip(given, layers))  # fmt: skip
    y0 = sp.random(20, 32, density=0.3, format="csr", random_state=rng, dtype=np.float32)
    want = matlab_inference(y0, layers, net.bias, net.ymax)
    assert_exact(reference_inference(y0, net), want)
    for backend in ("cpu", "reference"):
        assert_exact(run_infer(net, y0, backend=backend).y_local, want)
