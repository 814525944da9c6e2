"""Networks larger than memory and bounded activations: weight blocks streamed from HDF5
and row batches must not change a single bit of the result, at any rank count."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import UsageError
from mpisdnn.partition import balanced_blocks
from mpisdnn.sdnn.options import InferOptions
from mpisdnn.sdnn.streaming import (
    Hdf5LayerSource,
    StreamingStore,
    estimated_weight_bytes,
    plan_blocks,
)
from mpisdnn.weights import InMemoryStore

from .conftest import random_inputs, random_network, run_infer, self_comm, world
from .matlab_ref import categories, scipy_inference

#: Budgets far below one layer pair / one row: one layer per block, one row per batch.
ONE_LAYER = 1
ONE_ROW = 1


def test_plan_blocks_cover_layers_in_order():
    assert plan_blocks(0, 100, 10) == []
    assert plan_blocks(7, 100, None) == [(0, 7)]
    assert plan_blocks(7, 100, 700) == [(0, 7)]
    # Two blocks (computed + read ahead) must fit: 1000 // 200 = 5 layers per block.
    assert plan_blocks(12, 100, 1000) == [(0, 5), (5, 10), (10, 12)]
    assert plan_blocks(3, 100, 1) == [(0, 1), (1, 2), (2, 3)]


def test_estimate_grows_with_edges_and_layers():
    small = estimated_weight_bytes(1000, 2, 64, lambda nnz, n: 8 * nnz)
    assert small > 2 * 6 * 500
    assert estimated_weight_bytes(2000, 2, 64, lambda nnz, n: 8 * nnz) > small
    assert estimated_weight_bytes(0, 0, 64, lambda nnz, n: 0) == 0


@pytest.mark.parametrize("name", ["weight_memory", "memory_per_rank"])
@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_memory_options_validated(name, bad):
    with pytest.raises(UsageError, match=name):
        InferOptions(**{name: bad})


def _h5_network(tmp_path, net):
    from mpisdnn.formats import write_network

    path = tmp_path / "net.h5"
    write_network(path, net)
    return path


@pytest.mark.parametrize("read_bytes", [1, 8 * 96 * 96 * 3, 1 << 30])
def test_streaming_store_gives_the_file_layers(tmp_path, monkeypatch, read_bytes):
    from mpisdnn.sdnn import streaming

    # One layer per HDF5 slice, a few, or the whole block at once: the same layers.
    monkeypatch.setattr(streaming, "READ_BYTES", read_bytes)
    net = random_network(96, 7, seed=21)
    store = StreamingStore(Hdf5LayerSource(_h5_network(tmp_path, net)))
    ref = InMemoryStore(net)
    assert len(store) == 7 and store.edges == net.edges and store.neurons == 96
    store.prefetch(0, 3)
    store.prefetch(3, 7)
    for k in range(7):
        got, want = store.layer(k), ref.layer(k)
        assert (got.to_csr() != want.to_csr()).nnz == 0
        np.testing.assert_array_equal(got.bias, want.bias)
    store.release(0, 7)
    stats = store.statistics()
    store.close()
    assert stats["blocks_read"] == 2 and stats["peak_held_bytes"] > 0
    assert 0.0 <= stats["overlap"] <= 1.0
    # A layer that was never announced is still served (read on the spot).
    assert (store.layer(5).to_csr() != ref.layer(5).to_csr()).nnz == 0


def test_streaming_store_rejects_too_many_layers(tmp_path):
    from mpisdnn.errors import ShapeError

    path = _h5_network(tmp_path, random_network(32, 2, seed=1))
    with pytest.raises(ShapeError, match="asked for 5 layers"):
        Hdf5LayerSource(path, layers=5)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_blocks_and_batches_are_bit_identical_serial(backend, tmp_path):
    net = random_network(128, 9, seed=31, density=0.06)
    y0 = random_inputs(101, 128, seed=32, density=0.12)
    base = run_infer(net, y0, backend=backend)
    expected = scipy_inference(y0, net.layers, net.bias)
    assert base.categories.tolist() == categories(expected).tolist()
    assert base.memory["blocks"] == [[0, 9]]
    streamed = StreamingStore(Hdf5LayerSource(_h5_network(tmp_path, net)))
    runs = {
        "blocks": run_infer(net, y0, backend=backend, weight_memory=ONE_LAYER),
        "batches": run_infer(net, y0, backend=backend, memory_per_rank=ONE_ROW * 16 * 128 * 7),
        "streamed": run_infer(
            streamed, y0, backend=backend, weight_memory=ONE_LAYER, memory_per_rank=4096 * 8
        ),
    }
    streamed.close()
    assert len(runs["blocks"].memory["blocks"]) == 9
    assert runs["batches"].memory["batch_rows"] == 7
    assert max(runs["batches"].memory["rank_max_batches"]) == 15
    assert streamed.statistics()["blocks_read"] == 9
    for res in runs.values():
        assert (res.y_local != base.y_local).nnz == 0
        assert res.y_local.shape == base.y_local.shape
        assert res.categories.tolist() == base.categories.tolist()
        assert res.layer_nnz == base.layer_nnz


def _split(y0, comm):
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    return int(off[comm.rank]), int(off[comm.rank + 1])


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_blocks_and_batches_match_one_rank(backend, tmp_path_factory):
    comm = world()
    net = random_network(96, 8, seed=41, density=0.07)
    y0 = random_inputs(29 * comm.size + 5, 96, seed=42, density=0.15)
    serial = run_infer(net, y0, self_comm(), backend=backend)
    path = None
    if comm.rank == 0:
        path = _h5_network(tmp_path_factory.mktemp("bignet"), net)
    path = comm.bcast(path)
    r0, r1 = _split(y0, comm)
    for opts in (
        {"weight_memory": ONE_LAYER},
        {"memory_per_rank": 16 * 96 * 4},
        {"weight_memory": 3 * 10**5, "memory_per_rank": 16 * 96 * 3, "rebalance_threshold": 1.01},
    ):
        store = StreamingStore(Hdf5LayerSource(path))
        res = run_infer(
            store, y0[r0:r1], comm, row_offset=r0, g_rows=y0.shape[0], backend=backend, **opts
        )
        store.close()
        y = sp.vstack(comm.allgather(res.y_local), format="csr")
        assert (y != serial.y_local).nnz == 0, opts
        assert res.categories.tolist() == serial.categories.tolist()
        assert res.layer_nnz == serial.layer_nnz
