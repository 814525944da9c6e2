"""The fused CPU backend (tiles, layer groups, chunking) against the reference, bit for bit.

Serial tests vary everything that must not change a result (chunk size, threads, group
length, batching, N not a multiple of the 16 lanes or of the 64-feature padding); the
``mpi`` tests run the challenge-shaped data at whatever world size pytest-mpi was started
with and compare with one rank and with the reference backend.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import backends
from mpisdnn.backends.cpu import Rows, chunk_bounds
from mpisdnn.partition import balanced_blocks
from mpisdnn.sdnn.reference import reference_inference
from mpisdnn.weights import InMemoryStore, WeightStore

from .conftest import random_inputs, random_network, run_infer, self_comm, world


def _same(a, b):
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    return a.shape == b.shape and (a != b).nnz == 0


@pytest.fixture(scope="module")
def challenge():
    """Challenge-shaped data: sums land within rounding of the ReLU threshold."""
    from mpisdnn.generate import digit_images, radixnet

    net = radixnet(1024, 20, seed=2)
    y0 = digit_images(700, 1024, seed=3)
    return net, y0, reference_inference(y0, net)


@pytest.mark.parametrize(
    "options, max_group",
    [
        ({"threads": 1}, 32),
        ({"threads": 2, "chunk_tiles": 1}, 32),
        ({"threads": 2, "chunk_tiles": 3}, 1),
        ({"threads": 2}, 5),
        ({"threads": 1, "output_reserve": 5000}, 4),  # many batches per group
        ({"threads": 2, "output_reserve": 5000, "push_density": 0.5}, 4),  # push, batched
        ({"threads": 2, "push_density": 2.0}, 32),  # every row pushed through every layer
    ],
)
def test_challenge_bit_identical(challenge, options, max_group):
    net, y0, ref = challenge
    res = run_infer(net, y0, self_comm(), backend="cpu", **options, max_group=max_group)
    assert _same(res.y_local, ref)
    want = np.flatnonzero(np.diff(ref.indptr)) + 1
    assert res.categories.tolist() == want.tolist()
    assert res.layer_nnz[-1] == ref.nnz


@pytest.mark.parametrize("neurons", [5, 16, 40, 100, 130])
@pytest.mark.parametrize("negative", [True, False])
def test_odd_sizes_and_cancellations(neurons, negative):
    # N below 16, not a multiple of 16 or of the 64-feature padding; negative weights make
    # exact cancellations (no bias there) and rows that die mid-group.
    net = random_network(neurons, 7, seed=neurons, density=0.2, negative=negative)
    y0 = random_inputs(53, neurons, seed=neurons + 1, density=0.3)
    ref = reference_inference(y0, net)
    for max_group in (1, 3, 32):
        res = run_infer(net, y0, self_comm(), backend="cpu", max_group=max_group)
        assert _same(res.y_local, ref)
    # The same through the push kernel: no residue sets and one bias per neuron, so rows are
    # written through the bitmap.
    for push in (0.3, 2.0):
        res = run_infer(net, y0, self_comm(), backend="cpu", push_density=push)
        assert _same(res.y_local, ref)


def test_push_residue_sets_with_a_bias_per_neuron():
    """A radix-net (residue sets) whose bias differs per neuron: the push kernel's residue
    writer applies each member's own bias, and members of one set live or die apart."""
    from mpisdnn import Network
    from mpisdnn.generate import digit_images, radixnet

    base = radixnet(1024, 10, seed=7)
    rng = np.random.default_rng(8)
    bias = rng.uniform(-0.45, -0.2, base.bias.shape).astype(np.float32)
    net = Network(base.layers, bias, base.neurons)
    y0 = digit_images(300, 1024, seed=9)
    ref = reference_inference(y0, net)
    assert 0 < np.count_nonzero(np.diff(ref.indptr)) < 300
    per_layer = [reference_inference(y0, net, k).nnz for k in range(1, 11)]
    for push in (0.5, 2.0):
        res = run_infer(net, y0, self_comm(), backend="cpu", push_density=push, max_group=4)
        assert _same(res.y_local, ref)
        assert list(res.layer_nnz) == per_layer


def test_saturated_rows_stay_dense():
    # Rows that saturate at ymax in every neuron: the dense regime must be exact and fast.
    from mpisdnn.generate import radixnet

    net = radixnet(1024, 12, seed=4, bias=0.0)
    y0 = sp.csr_matrix(np.full((37, 1024), 2.0, np.float32))
    res = run_infer(net, y0, self_comm(), backend="cpu")
    ref = reference_inference(y0, net)
    assert _same(res.y_local, ref)
    assert res.layer_active_rows == [37] * 12
    assert res.y_local.nnz == 37 * 1024 and res.y_local.data.max() == 32.0


def test_no_prune_keeps_rows_and_results():
    net = random_network(64, 6, seed=5)
    y0 = random_inputs(40, 64, seed=6)
    pruned = run_infer(net, y0, self_comm(), backend="cpu")
    kept = run_infer(net, y0, self_comm(), backend="cpu", prune=False)
    assert _same(pruned.y_local, kept.y_local)
    assert pruned.layer_nnz == kept.layer_nnz
    assert pruned.layer_active_rows == kept.layer_active_rows


def test_empty_rows_and_empty_input():
    net = random_network(48, 3, seed=7, negative=False)
    y0 = random_inputs(20, 48, seed=8).tolil()
    y0[[0, 5, 19], :] = 0
    y0 = y0.tocsr()
    res = run_infer(net, y0, self_comm(), backend="cpu")
    assert _same(res.y_local, reference_inference(y0, net))
    empty = run_infer(net, sp.csr_matrix((0, 48), dtype=np.float32), self_comm(), backend="cpu")
    assert empty.y_local.shape == (0, 48) and empty.categories.size == 0


def test_rows_representation():
    # Unsorted indices and duplicates are canonicalised; canonical input is used in place.
    m = sp.csr_matrix(
        (np.array([1, 2, 3, 4], np.float32), np.array([3, 1, 1, 0]), np.array([0, 3, 4])),
        shape=(2, 5),
    )
    rows = Rows.from_csr(m)
    assert rows.to_csr().toarray().tolist() == [[0, 5, 0, 1, 0], [4, 0, 0, 0, 0]]
    canon = sp.csr_matrix(np.eye(3, dtype=np.float32))
    assert Rows.from_csr(canon).data is canon.data or np.shares_memory(
        Rows.from_csr(canon).data, canon.data
    )
    sub = rows.take([1])
    assert sub.shape == (1, 5) and sub.to_csr().toarray().tolist() == [[4, 0, 0, 0, 0]]


@pytest.mark.parametrize("nrows", [0, 1, 15, 16, 17, 500, 5000, 100000])
@pytest.mark.parametrize("threads", [1, 2, 8])
def test_chunk_bounds(nrows, threads):
    b = chunk_bounds(nrows, threads, 16)
    assert b[0] == 0 and b[-1] == nrows and np.all(np.diff(b) > 0)
    sizes = np.diff(b)
    assert sizes.max(initial=0) <= 256
    if nrows:
        # chunks start on tile boundaries, and few rows still give every thread a chunk
        assert np.all(b[:-1] % 16 == 0)
        assert sizes.size >= min(threads, (nrows + 15) // 16)


def test_layer_interface_matches_reference():
    net = random_network(70, 1, seed=9)
    y = random_inputs(30, 70, seed=10)
    be = backends.get("cpu")
    out = be.to_host(be.layer(be.to_device(y), be.to_device(net.layers[0]), net.bias[0], 32.0))
    assert _same(out, reference_inference(y, net))


# ----------------------------------------------------------------------------- MPI


def _split_run(net, y0, comm, backend="cpu", **kw):
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    res = run_infer(net, y0[r0:r1], comm, row_offset=r0, g_rows=y0.shape[0], backend=backend, **kw)
    return res, sp.vstack(comm.allgather(res.y_local), format="csr")


@pytest.mark.mpi
@pytest.mark.parametrize("max_group, push", [(1, None), (32, None), (4, 0.5)])
def test_mpi_challenge_matches_reference(challenge, max_group, push):
    net, y0, ref = challenge
    comm = world()
    res, y = _split_run(net, y0, comm, max_group=max_group, push_density=push)
    assert _same(y, ref)
    ref_res, ref_y = _split_run(net, y0, comm, backend="reference")
    assert _same(ref_y, ref)
    assert res.categories.tolist() == ref_res.categories.tolist()
    assert res.layer_nnz == ref_res.layer_nnz
    assert res.layer_active_rows == ref_res.layer_active_rows


@pytest.mark.mpi
def test_mpi_shared_column_sets(challenge, monkeypatch):
    """With the column-set search split over the ranks (forced at N=1024), every rank holds
    the sets it would have found alone, and the run stays bit-identical, also when one rank
    has no rows (it still takes part in every exchange)."""
    from mpisdnn.backends import cpu
    from mpisdnn.backends._kernels import column_sets

    monkeypatch.setattr(cpu, "SHARED_SETS_NEURONS", 0)
    net, y0, ref = challenge
    comm = world()
    pn = cpu.CpuBackend(threads=1).prepare_network(InMemoryStore(net))
    pn.sets_over(2, 9, comm)
    assert sorted(pn._derived) == list(range(2, 9))
    for k in range(2, 9):
        w = sp.csc_matrix(net.layers[k])
        w.sort_indices()
        want = column_sets(w.indices.astype(np.uint16), w.indptr, 0, w.data, net.neurons)
        assert all(np.array_equal(a, b) for a, b in zip(pn._derived[k]["sets"], want))
    for max_group in (1, 32):
        _, y = _split_run(net, y0, comm, max_group=max_group)
        assert _same(y, ref)
    # all rows on the last rank
    mine = y0 if comm.rank == comm.size - 1 else y0[:0]
    res = run_infer(net, mine, comm, g_rows=y0.shape[0], backend="cpu", max_group=4)
    assert _same(sp.vstack(comm.allgather(res.y_local), format="csr"), ref)


def test_consumed_input_is_released_without_changing_results(challenge, monkeypatch):
    # Force every group's (backend-owned) input to be freed launch by launch.
    from mpisdnn.backends import cpu

    monkeypatch.setattr(cpu, "RELEASE_BYTES", 0)
    net, y0, ref = challenge
    for max_group in (1, 3):
        res = run_infer(net, y0, self_comm(), backend="cpu", max_group=max_group)
        assert _same(res.y_local, ref)


def test_to_host_consume_releases_the_source():
    be = backends.get("cpu")
    net = random_network(50, 2, seed=11, negative=False)
    y0 = random_inputs(90, 50, seed=12, density=0.4)
    pn = be.prepare_network(InMemoryStore(net))
    out, keep, _ = be.run_layers(be.to_device(y0), pn, 0, 2)
    copied = be.to_host(out)
    released = be.to_host(out, consume=True)
    assert _same(copied, released)
    assert _same(released, reference_inference(y0, net)[keep])


# ------------------------------------------------------- compact layers and kernel paths


class _ListStore(WeightStore):
    """Compact layers given as they are (what a mapped HDF5 v2 store hands out)."""

    def __init__(self, layers, neurons, ymax=32.0):
        self._layers, self.neurons, self.ymax = list(layers), neurons, ymax
        self.total_layers = len(self._layers)

    def __len__(self):
        return len(self._layers)

    def layer(self, k):
        return self._layers[k]

    @property
    def edges(self):
        return sum(lay.nnz for lay in self._layers)


def _mapped(arr, path):
    """A read-only ``np.memmap`` holding ``arr`` (as the v2 reader maps datasets)."""
    if arr is None:
        return None
    arr = np.ascontiguousarray(arr)
    arr.tofile(path)
    return np.memmap(path, dtype=arr.dtype, mode="r", shape=arr.shape)


def _reform(layer, form, tmp):
    """``layer`` in one of the storage forms the cpu backend must read in place."""
    from dataclasses import replace

    if form == "uint32":
        return replace(layer, rows=layer.rows.astype(np.uint32))
    if form == "int32":
        return replace(layer, rows=layer.rows.astype(np.int32))
    if form == "colptr":  # pointers even where every column has the same count
        return replace(layer, colptr=layer.colptr_array(), per_col=0)
    if form == "values":  # a weight per entry even where all are equal
        return replace(layer, values=layer.values_array(), value=0.0)
    if form == "mmap":
        key = len(list(tmp.iterdir()))  # a fresh name per layer: files are mapped, not copied
        return replace(
            layer,
            rows=_mapped(layer.rows, tmp / f"r{key}"),
            colptr=_mapped(layer.colptr, tmp / f"c{key}"),
            values=_mapped(layer.values, tmp / f"v{key}"),
        )
    return layer


@pytest.fixture(scope="module")
def small_nets():
    """A radix-net (fixed 32 per column, one weight: sets of 16 share a sum) and a random
    network with mixed-sign weights and ragged columns (sets of one), with their inputs."""
    from mpisdnn.generate import radixnet

    radix = radixnet(256, 10, seed=3, bias=-0.25)
    rand = random_network(200, 6, seed=13, density=0.06)
    return {
        "radix": (radix, random_inputs(70, 256, seed=4, density=0.3)),
        "random": (rand, random_inputs(70, 200, seed=14, density=0.25)),
    }


@pytest.mark.parametrize("form", ["compact", "uint32", "int32", "colptr", "values", "mmap"])
@pytest.mark.parametrize(
    "kernel",
    [
        {},
        {"share_sets": False},  # every column summed on its own
        {"sparse_density": 2.0},  # every layer through the push kernel
        {"sparse_density": 0.3},  # push while sparse, then tiles
        {"chunk_bytes": 1, "chunk_tiles": 4},  # blocked: one tile per chunk
    ],
    ids=["tiles", "unshared", "push", "mixed", "blocked"],
)
@pytest.mark.parametrize("name", ["radix", "random"])
def test_every_kernel_path_and_layer_form_is_bit_identical(
    small_nets, name, form, kernel, tmp_path
):
    from mpisdnn import InferOptions, infer
    from mpisdnn.backends.cpu import CpuBackend
    from mpisdnn.weights import CompactLayer

    net, y0 = small_nets[name]
    ref = reference_inference(y0, net)
    layers = [CompactLayer.from_matrix(w, b) for w, b in zip(net.layers, net.bias)]
    if name == "radix":
        assert layers[0].colptr is None and layers[0].values is None
        assert layers[0].rows.dtype == np.uint16
    store = _ListStore([_reform(lay, form, tmp_path) for lay in layers], net.neurons)
    be = CpuBackend(threads=2, **kernel)
    res = infer(store, y0, self_comm(), options=InferOptions(max_group=3), backend=be)
    assert _same(res.y_local, ref)
    assert res.layer_nnz[-1] == ref.nnz


def test_column_sets_against_a_dictionary():
    from mpisdnn.backends._kernels import column_sets

    rng = np.random.default_rng(21)
    n = 300
    base = sp.random(n, 40, density=0.1, random_state=rng, dtype=np.float32).tocsc()
    # Columns drawn from 40 patterns (some empty), then one entry of a few copies perturbed
    # in value only, and one in position only: those must not join their pattern's set.
    pick = rng.integers(0, 40, n)
    w = sp.csc_matrix(base[:, pick])
    w.sort_indices()
    for c in (3, 50):
        if w.indptr[c + 1] > w.indptr[c]:
            w.data[w.indptr[c]] += 1.0
    rows = w.indices.astype(np.uint16)
    for values in (w.data, None):
        _check_sets(column_sets(rows, w.indptr, 0, values, n), rows, w.indptr, values)


def _check_sets(got_sets, rows, indptr, values):
    """``column_sets``' partition equals the one a dictionary of exact columns gives."""
    reps, sptr, scols = got_sets
    groups = {}
    for c in range(indptr.size - 1):
        s, e = indptr[c], indptr[c + 1]
        vals = () if values is None else tuple(values[s:e])
        groups.setdefault((tuple(rows[s:e]), vals), []).append(c)
    got = [scols[sptr[q] : sptr[q + 1]].tolist() for q in range(reps.size)]
    want = sorted(groups.values(), key=lambda g: g[0])
    assert got == want  # same partition, sets ordered by their smallest column
    assert reps.tolist() == [g[0] for g in want]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32])
def test_column_sets_of_radix_net_layers(dtype):
    """Radix-net sets are strided ({q, q + N/16, ...}): the distance fast path and the word
    compare of fixed-width columns give the dictionary's sets, also when a member is
    perturbed (it leaves the stride mid-way) and with explicit column pointers."""
    from mpisdnn.backends._kernels import column_sets
    from mpisdnn.generate import radixnet

    net = radixnet(1024, 3, seed=4)
    for w in net.layers:
        w = sp.csc_matrix(w)
        w.sort_indices()
        per_col = int(np.diff(w.indptr)[0])
        assert (np.diff(w.indptr) == per_col).all()
        rows = w.indices.astype(dtype)
        sets = column_sets(rows, None, per_col, None, 1024)
        assert sets[0].size < 1024 / 8  # really shared
        _check_sets(sets, rows, w.indptr, None)
        _check_sets(column_sets(rows, w.indptr, 0, None, 1024), rows, w.indptr, None)
        moved = rows.copy()
        moved[700 * per_col + 3] = (int(moved[700 * per_col + 3]) + 1) % 1024
        moved[700 * per_col : 701 * per_col].sort()
        _check_sets(column_sets(moved, None, per_col, None, 1024), moved, w.indptr, None)
        vals = np.full(rows.size, 0.0625, np.float32)
        vals[300 * per_col] = 0.125
        _check_sets(column_sets(rows, None, per_col, vals, 1024), rows, w.indptr, vals)


def test_mapped_layers_are_read_in_place_and_prepared_per_group(small_nets, tmp_path, monkeypatch):
    from mpisdnn.backends import _cpu_prepare
    from mpisdnn.backends.cpu import CpuBackend
    from mpisdnn.weights import CompactLayer

    net, y0 = small_nets["radix"]
    layers = [
        _reform(CompactLayer.from_matrix(w, b), "mmap", tmp_path)
        for w, b in zip(net.layers, net.bias)
    ]
    be = CpuBackend(threads=1)
    pn = be.prepare_network(_ListStore(layers, net.neurons))
    y = be.to_device(y0)
    out, keep, _ = be.run_layers(y, pn, 0, 4)
    group = pn.group(0, 4)
    for k in range(4):
        assert np.shares_memory(group[0][k], layers[k].rows)  # no private copy of W
    out, keep2, _ = be.run_layers(out, pn, 4, 6)
    assert sorted(pn._derived) == list(range(6))  # under the cap: kept for the next batch
    sets4 = pn.sets(4)
    out2, _, _ = be.run_layers(be.to_device(y0), pn, 0, 4)
    assert pn.sets(4) is sets4  # a second batch finds what the first derived
    assert _same(out2.to_csr(), reference_inference(y0, net.head(4))[keep])
    monkeypatch.setattr(_cpu_prepare, "DERIVED_BYTES", 0)
    pn.retain(4, 6)
    assert sorted(pn._derived) == [4, 5]  # past the cap: derived data of one group only
    assert _same(out.to_csr(), reference_inference(y0, net.head(6))[keep[keep2]])


def test_tile_layout_is_chosen_for_radix_nets_only():
    from mpisdnn.backends import _kernels
    from mpisdnn.backends._kernels import column_sets, layout_for_sets, tile_layout
    from mpisdnn.generate import radixnet

    def layout(w, n, share=True):
        csc = sp.csc_matrix(w)
        _, sptr, scols = column_sets(
            csc.indices.astype(np.uint32), csc.indptr, 0, csc.data, n, share
        )
        return layout_for_sets(n, sptr, scols)

    w = radixnet(4096, 1, seed=1).layers[0]
    assert layout(w, 4096) == tile_layout(4096, 4) == (255, 4, 8)
    assert layout(w, 4096, share=False) == tile_layout(4096) == (0,)  # sets of one
    perm = np.random.default_rng(1).permutation(4096)
    assert layout(w[perm][:, perm], 4096) == (0,)  # sets no longer {q + 256 i}
    assert layout(random_network(4096, 1, seed=2, density=0.01).layers[0], 4096) == (0,)
    small = radixnet(1024, 1, seed=1).layers[0]
    assert layout(small, 1024) == (0,)  # below ROTATE_NEURONS: the tiles fit L2 anyway
    assert _kernels.padded(4096, (255, 4, 8)) == 4096
    assert _kernels.padded(4096) == _kernels.padded(4096, (0,)) > 4096
    with pytest.raises(ValueError):
        tile_layout(4000, 4)


@pytest.mark.parametrize(
    "kernel",
    [{}, {"chunk_bytes": 1, "chunk_tiles": 4}, {"rotate": False}],
    ids=["tiles", "blocked", "unrotated"],
)
def test_rotated_tile_layout_is_bit_identical(small_nets, kernel, monkeypatch):
    """The residue layout on the radix-net (threshold lowered to its 256 neurons), with rows
    dying inside groups (repacked lanes) and every output read back from rotated slots."""
    from mpisdnn import InferOptions, infer
    from mpisdnn.backends import _kernels
    from mpisdnn.backends.cpu import CpuBackend

    monkeypatch.setattr(_kernels, "ROTATE_NEURONS", 64)
    net, y0 = small_nets["radix"]
    ref = reference_inference(y0, net)
    be = CpuBackend(threads=2, **kernel)
    rotated = len(be.prepare_network(InMemoryStore(net)).layout(0)) == 3
    assert rotated == kernel.get("rotate", True)
    res = infer(net, y0, self_comm(), options=InferOptions(max_group=3), backend=be)
    assert _same(res.y_local, ref)
    assert res.layer_nnz[-1] == ref.nnz
    assert res.layer_active_rows[0] > res.layer_active_rows[-1] > 0  # rows died, some live


def test_rotated_layout_at_4096_neurons():
    from mpisdnn import InferOptions, infer
    from mpisdnn.backends.cpu import CpuBackend
    from mpisdnn.generate import digit_images, radixnet

    net = radixnet(4096, 4, seed=5, bias=-0.3)
    y0 = digit_images(40, 4096, seed=6)
    ref = reference_inference(y0, net)
    be = CpuBackend(threads=2)
    assert len(be.prepare_network(InMemoryStore(net)).layout(0)) == 3
    res = infer(net, y0, self_comm(), options=InferOptions(prune=False), backend=be)
    assert ref.nnz > 0 and _same(res.y_local, ref)


def test_next_group_length():
    from mpisdnn.sdnn.runner import _next_group

    def table(*ranks):  # (ideal tiles, tiles computed, rows lost) per rank
        return np.array([[i, t, 1.0, lost] for i, t, lost in ranks], dtype=float)

    assert _next_group(8, 128, table((10, 10, 5))) == 16  # full tiles, rows died: double
    assert _next_group(8, 128, table((10, 10, 0))) == 128  # no row died: the longest group
    assert _next_group(8, 32, table((10, 10, 0), (3, 3, 0))) == 32
    assert _next_group(8, 128, table((10, 10, 0), (3, 3, 1))) == 16  # one rank lost a row
    assert _next_group(8, 128, table((5, 10, 0))) == 4  # tiles half empty: halve
    assert _next_group(1, 128, table((5, 10, 3))) == 1
    assert _next_group(100, 128, table((10, 10, 2))) == 128


@pytest.mark.parametrize(
    "kernel",
    [{}, {"share_sets": False}, {"sparse_density": 2.0}, {"rotate": False}],
    ids=["tiles", "unshared", "push", "unrotated"],
)
@pytest.mark.parametrize("empty", [0, 1])
def test_layer_without_weights(small_nets, kernel, empty):
    """A layer with no weights at all (an empty TSV layer file) kills every row, exactly as
    the reference says; it used to be read as "column pointers given" with none given and
    crashed the process."""
    from mpisdnn import InferOptions, infer
    from mpisdnn.backends.cpu import CpuBackend
    from mpisdnn.network import Network

    net, y0 = small_nets["radix"]
    layers = list(net.layers[:3])
    layers[empty] = sp.csr_matrix(layers[empty].shape, dtype=np.float32)
    net = Network(layers, net.bias[:3], net.neurons, ymax=net.ymax)
    ref = reference_inference(y0, net)
    assert ref.nnz == 0
    be = CpuBackend(threads=2, **kernel)
    res = infer(net, y0, self_comm(), options=InferOptions(max_group=2), backend=be)
    assert _same(res.y_local, ref) and res.categories.size == 0


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), True, "0.5"])
def test_push_density_validated(bad):
    from mpisdnn import InferOptions
    from mpisdnn.errors import UsageError

    with pytest.raises(UsageError, match="push_density"):
        InferOptions(push_density=bad)


def test_push_density_default_follows_n():
    from mpisdnn.backends.cpu import PUSH_NEURONS, SPARSE_DENSITY, CpuBackend

    auto = CpuBackend(threads=1)
    assert auto.push_density(PUSH_NEURONS - 1) == 0.0
    assert auto.push_density(PUSH_NEURONS) == SPARSE_DENSITY > 0
    assert CpuBackend(threads=1, sparse_density=0).push_density(65536) == 0.0
    assert CpuBackend(threads=1, sparse_density=0.2).push_density(1024) == 0.2


def test_push_default_at_16384_matches_reference():
    """From 8,192 neurons sparse rows are pushed by default: a radix-net with residue sets
    (the fan-out-2 loop and the residue-order writer) against the scipy reference, with
    rows that turn dense and finish the group in tiles."""
    from mpisdnn.generate import digit_images, radixnet

    net = radixnet(16384, 6, seed=5)
    y0 = digit_images(40, 16384, seed=6)
    ref = reference_inference(y0, net)
    for density in (None, 0.2):
        res = run_infer(net, y0, self_comm(), threads=2, push_density=density, max_group=3)
        assert _same(res.y_local, ref)
        assert res.categories.tolist() == (np.flatnonzero(np.diff(ref.indptr)) + 1).tolist()


def test_written_out_sorts_equal_numpys():
    """``heapsort`` (of ``_stride_of_sets``' hashes) against ``np.sort``, repeats and the
    sizes where a heap's last level is full or not; ``argsort_small`` (of ``_store_rows``'
    lanes, dead ones -1) against ``np.argsort`` on distinct keys."""
    from mpisdnn._sort_kernels import argsort_small, heapsort

    rng = np.random.default_rng(4)
    for n in [0, 1, 2, 3, 7, 8, 9, 16, 100, 1023, 4096]:
        for high in (3, 2**63):
            a = rng.integers(0, high, n, dtype=np.uint64)
            want = np.sort(a)
            heapsort(a)
            assert np.array_equal(a, want), (n, high)
    for n in [0, 1, 16, 33, 256, 1000]:
        lanes = rng.permutation(np.arange(-n // 4, n)).astype(np.int64)[:n]
        lanes[lanes < 0] = -1  # dead lanes
        got = argsort_small(lanes)
        assert np.array_equal(lanes[got], np.sort(lanes))
        live = lanes >= 0
        assert np.array_equal(got[live[got]], np.argsort(lanes)[live[np.argsort(lanes)]])


@pytest.mark.parametrize("neurons", [64, 8192])
def test_warmup_calls_every_kernel_the_run_calls_in_its_types(monkeypatch, neurons):
    """What the runner's warm-up runs (``kernel_cache.in_turn`` of the backend's steps)
    calls each kernel in the types the timed loop then passes it, so nothing compiles
    inside the loop; and below ``PUSH_NEURONS``, where no call can take the pull kernel,
    the warm-up does not compile it (11 s of a first run)."""
    import numba

    from mpisdnn import kernel_cache
    from mpisdnn.backends import _kernels
    from mpisdnn.backends.cpu import PUSH_NEURONS

    calls = {"warm": {}, "run": {}}
    phase = ["run"]

    def spy(real, name):
        def call(*args):
            seen = calls[phase[0]].setdefault(name, set())
            seen.add(tuple(numba.typeof(a) for a in args))
            return real(*args)

        return call

    for name in ("tile_group", "pull_rows", "push_group", "gather_rows"):
        monkeypatch.setattr(_kernels, name, spy(getattr(_kernels, name), name))
    real_turn = kernel_cache.in_turn

    def in_turn(steps, rank):
        phase[0] = "warm"
        real_turn(steps, rank)
        phase[0] = "run"

    monkeypatch.setattr(kernel_cache, "in_turn", in_turn)
    net = random_network(neurons, 3, seed=2, density=4 / neurons)
    y = random_inputs(24, neurons, seed=3, density=8 / neurons)
    res = run_infer(net, y, threads=2)
    assert _same(res.y_local, reference_inference(y, net))
    warm, run = calls["warm"], calls["run"]
    assert run and all(run[k] <= warm.get(k, set()) for k in run), (run, warm)
    assert ("pull_rows" in warm) == (neurons >= PUSH_NEURONS)
