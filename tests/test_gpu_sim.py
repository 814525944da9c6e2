"""The ``gpu`` backend without a GPU: its real kernels under numba-cuda's CUDA simulator.

Run with ``NUMBA_ENABLE_CUDASIM=1 python -m pytest -m gpu_sim tests`` (``scripts/test.sh``
does). Without that variable the module is skipped: numba-cuda picks the simulator when it is
first imported, so it cannot be switched on inside an ordinary test run.

What this proves: the kernels' indexing (the simulator checks every access against the array
bounds), the fused group, the in-block repacking of dead rows, batching, weight streaming, the
engine and MPI paths, and bit-identical results against ``mpisdnn.reference_inference``. The
arithmetic is also checked compiled for the CPU at full size, and the PTX for a current GPU is
checked for FMA and float64 instructions. What it cannot show (races, occupancy, speed) is for
``tests/test_gpu.py`` on a real device (see docs/gpu.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from .conftest import ROOT, mpiexec, run_infer, self_comm, world
from .gpu_cases import bits, check_group, gpu_backend, mixed_network, prepared, ragged_inputs

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
if not SIM:
    pytest.skip(
        "CUDA simulator tests: run with NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh does)",
        allow_module_level=True,
    )

#: The device row hashes (``--dedup``) wrap around in uint64 by design; the simulator's numpy
#: warns every time.
pytestmark = [pytest.mark.gpu_sim,
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
#: The MPI test is an ``mpi`` test when pytest-mpi runs it (``--with-mpi``, under mpiexec);
#: in the serial simulator run it runs at one rank instead of being skipped.
MPI_MARK = pytest.mark.mpi if "--with-mpi" in sys.argv else pytest.mark.gpu_sim


def test_fused_group_rows_dying_mid_group_bit_identical():
    net = mixed_network(seed=2)
    y0 = ragged_inputs(48, 64, seed=2)
    st = check_group(gpu_backend(), net, y0, 0, 5)
    # The group really repacked: rows died between its layers, and fewer tiles followed.
    assert st["active"][0] > st["active"][-1] > 0
    assert st["tiles"][-1] < st["tiles"][0]


def test_all_rows_die_in_the_group():
    net = mixed_network(seed=0, layers=3)
    net.bias[1] = -50.0  # nothing survives layer 2
    y0 = ragged_inputs(40, 64, seed=0)
    st = check_group(gpu_backend(), net, y0, 0, 3)
    assert st["active"].tolist()[1:] == [0, 0] and st["tiles"][2] == 0


def test_empty_inputs_and_empty_rows():
    be = gpu_backend()
    net = mixed_network(seed=1, layers=2)
    out, keep, st = be.run_layers(
        be.to_device(sp.csr_matrix((0, 64), dtype=np.float32)), prepared(be, net), 0, 2
    )
    assert keep.size == 0 and be.to_host(out).shape == (0, 64) and st["active"].sum() == 0
    # Rows without entries stay empty whatever the bias sign (positive here).
    net.bias[:] = 0.25
    y0 = ragged_inputs(24, 64, seed=3, most=3)
    assert (y0.getnnz(axis=1) == 0).any()
    check_group(be, net, y0, 0, 2)


def test_n256_two_warps_of_columns():
    """N=256 with about 13 inputs per column: eight column batches per layer."""
    net = mixed_network(seed=13, neurons=256, layers=2, density=0.05)
    check_group(gpu_backend(shared_entries=512), net, ragged_inputs(20, 256, seed=13, most=40),
                0, 2)


def test_without_pruning_all_rows_are_kept():
    net, y0 = mixed_network(seed=3, layers=4), ragged_inputs(40, 64, seed=3)
    check_group(gpu_backend(), net, y0, 0, 4, prune=False)


def test_mixed_layer_forms_and_weights_read_from_global_memory():
    """Column pointers, per-weight values, one-value layers, N > 64, and column batches too
    big for the shared-memory stage (read straight from global memory)."""
    from mpisdnn import Network

    rng = np.random.default_rng(5)
    n = 72
    base = mixed_network(seed=5, neurons=n, layers=3, density=0.1)
    # Layer 1: every column holds 4 weights of one value (the official networks' form).
    rows = np.concatenate([np.sort(rng.choice(n, 4, replace=False)) for _ in range(n)])
    w1 = sp.csc_matrix((np.full(4 * n, 0.4, np.float32), rows, np.arange(n + 1) * 4), (n, n))
    net = Network([base.layers[0], w1.tocsr(), base.layers[2]], base.bias, n)
    y0 = ragged_inputs(24, n, seed=5, most=20)
    longest = max(int(np.diff(sp.csc_matrix(w).indptr).max()) for w in net.layers)
    assert longest > 8  # with an 8-entry stage, the longer columns are read from global memory
    for shared in (2048, 8):
        check_group(gpu_backend(shared_entries=shared), net, y0, 0, 3)


def test_row_batches_and_streamed_weights_through_the_engine():
    """Rows in several batches and weights streamed in two slots, groups of 1-2 layers."""
    from mpisdnn import InferOptions, infer, reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net = mixed_network(seed=4, layers=4)
    y0 = ragged_inputs(90, 64, seed=4)
    be = gpu_backend(batch_rows=64, weight_bytes=0, max_group=2)
    opts = InferOptions(backend="gpu", first_group=1, max_group=2)
    res = infer(net, y0, self_comm(), options=opts, backend=be)
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref))
    assert res.backend["name"] == "gpu" and res.backend["group_launches"] >= 3
    # Weights came through the two slots, the later groups' copied ahead of time.
    assert res.backend["weights"] == "streamed" and res.backend["weight_prefetches"] >= 1
    assert len(res.groups) >= 3


def test_take_rows_and_round_trip_across_batches():
    be = gpu_backend(batch_rows=64)
    y0 = ragged_inputs(150, 64, seed=6)
    dev = be.to_device(y0)
    assert len(dev.parts) == 3
    assert np.array_equal(bits(be.to_host(dev)), bits(y0))
    rows = np.array([0, 5, 63, 64, 100, 149])
    assert np.array_equal(bits(be.to_host(be.take_rows(dev, rows))), bits(y0[rows]))
    np.testing.assert_array_equal(be.row_nnz(dev), y0.getnnz(axis=1))
    np.testing.assert_array_equal(be.categories(dev), np.flatnonzero(y0.getnnz(axis=1)) + 1)


@pytest.mark.parametrize("seed", [7, 8])
def test_engine_gpu_matches_reference_and_cpu(seed):
    from mpisdnn import reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net = mixed_network(seed=seed, layers=4)
    y0 = ragged_inputs(40, 64, seed=seed)
    res = run_infer(net, y0, backend="gpu", comm=self_comm())
    cpu = run_infer(net, y0, backend="cpu", comm=self_comm())
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref))
    assert np.array_equal(bits(res.y_local), bits(cpu.y_local))
    assert res.layer_active_rows == cpu.layer_active_rows
    assert res.layer_nnz == cpu.layer_nnz


def test_tsv_archive_read_in_compact_form_on_the_gpu_backend(tmp_path):
    """A TSV network as ``infer`` reads it (``read_network_compact``: the parsed layers in a
    ``CompactStore``, no CSR) on the gpu backend: bit-identical to the scipy reference of
    the same store and to the cpu backend."""
    from mpisdnn import reference_inference
    from mpisdnn.formats.archive_write import network_archive
    from mpisdnn.formats.network_read import read_network_compact

    net = mixed_network(seed=9, layers=4)
    path = tmp_path / "neuron64.tar.gz"
    with network_archive(path, 64, threads=1) as out:
        for k in (3, 1, 4, 2):  # archive order is not layer order
            out.add(k, net.layers[k - 1])
    store = read_network_compact(self_comm(), path, bias=-0.2)
    assert type(store).__name__ == "CompactStore" and len(store) == 4
    y0 = ragged_inputs(40, 64, seed=9)
    res = run_infer(store, y0, backend="gpu", comm=self_comm())
    cpu = run_infer(store, y0, backend="cpu", comm=self_comm())
    ref = reference_inference(y0, store)
    assert ref.nnz and np.array_equal(bits(res.y_local), bits(ref))
    assert np.array_equal(bits(res.y_local), bits(cpu.y_local))


def test_split_layers_for_few_rows_bit_identical():
    """Small batches run layer by layer with each chunk's columns split over blocks: rows that
    die stay where they are as zero rows, survivors and per-layer statistics still match.

    Small on purpose (two 32-row chunks, two column slices, three layers): the simulator runs
    every GPU thread in Python, and this test once cost minutes of CI."""
    net = mixed_network(seed=2, neurons=96, layers=3)
    y0 = ragged_inputs(48, 96, seed=2)
    st = check_group(gpu_backend(split_rows=10**6, chunk_rows=32), net, y0, 0, 3, prune=True)
    assert st["active"][0] > st["active"][-1] > 0
    # Mixed, without pruning: one full batch through the group kernel, the last, small one split.
    be = gpu_backend(batch_rows=32, split_rows=16, chunk_rows=32)
    check_group(be, net, y0, 0, 3, prune=False)
    assert be.counters["split_launches"] == 3  # the 16-row batch, one launch per layer


def test_split_layers_when_every_row_dies_and_through_the_engine():
    from mpisdnn import InferOptions, infer, reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net = mixed_network(seed=0, layers=3)
    net.bias[1] = -50.0
    st = check_group(gpu_backend(split_rows=10**6), net, ragged_inputs(40, 64, seed=0), 0, 3)
    assert st["active"].tolist()[1:] == [0, 0]
    net = mixed_network(seed=4, layers=4)
    y0 = ragged_inputs(90, 64, seed=4)
    be = gpu_backend(batch_rows=64, weight_bytes=0, max_group=2, split_rows=10**6)
    opts = InferOptions(backend="gpu", first_group=1, max_group=2)
    res = infer(net, y0, self_comm(), options=opts, backend=be)
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref))
    assert res.backend["split_launches"] >= 4


def test_per_layer_interface():
    from mpisdnn import reference_layer

    be = gpu_backend()
    net = mixed_network(seed=9, layers=1)
    y0 = ragged_inputs(30, 64, seed=9)
    got = be.to_host(be.layer(be.to_device(y0), net.layers[0], net.bias[0], net.ymax))
    assert np.array_equal(bits(got), bits(reference_layer(y0, net.layers[0], net.bias[0])))


def test_device_mapping_by_node_rank():
    from mpisdnn.backends.gpu import device_for
    from mpisdnn.errors import BackendError

    assert [device_for(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [device_for(r, 3, 1, gpus_per_rank=0) for r in range(3)] == [0, 0, 0]
    with pytest.raises(BackendError, match="3 ranks on this node but 2 GPU"):
        device_for(2, 3, 2)
    with pytest.raises(BackendError, match="no CUDA device"):
        device_for(0, 1, 0)
    # Row batches: one dense buffer stays below 2**31 values even for huge N.
    be = gpu_backend(batch_rows=10**9)
    for n in (1024, 65536, 1 << 20):
        rows = be.batch_rows(n)
        assert rows % be.chunk == 0 and 0 < rows * n < 2**31
    d = gpu_backend().describe()
    assert d["arrays"] == "simulator" and "kernel_seconds" in d and "device_name" in d


# -- (b) the kernels' arithmetic compiled for the CPU, at full size ----------------------------


def _cpu_layers(y0, net, fused=False):
    """All layers with the kernels' column sum and activation compiled for the CPU (or, with
    ``fused``, the same loop with a fused multiply-add, for the control)."""
    from numba import njit

    from mpisdnn.backends._cuda_arith import make

    column_sum, activate = make("cpu")

    @njit
    def layer(y, n, rows, vals, cp, bias, ymax, out):
        for r in range(y.size // n):
            for c in range(n):
                z = column_sum(y, r * n, 1, rows, 0, vals, 0, cp[c], cp[c + 1],
                               np.float32(0), True)
                out[r * n + c] = activate(z, bias[c], ymax)

    @njit
    def layer_fma(y, n, rows, vals, cp, bias, ymax, out):
        for r in range(y.size // n):
            for c in range(n):
                z = np.float32(0)
                for p in range(cp[c], cp[c + 1]):
                    # product exact in float64, one rounding for multiply and add together
                    z = np.float32(np.float64(z) + np.float64(y[r * n + rows[p]]) * vals[p])
                out[r * n + c] = activate(z, bias[c], ymax)

    n = net.neurons
    y = y0.toarray().ravel()
    for k in range(len(net.layers)):
        csc = sp.csc_matrix(net.layers[k])
        out = np.empty_like(y)
        (layer_fma if fused else layer)(
            y, n, csc.indices.astype(np.uint16), csc.data.astype(np.float32),
            csc.indptr.astype(np.int64), net.bias[k], np.float32(net.ymax), out,
        )
        y = out
    return y


def test_kernel_arithmetic_on_cpu_at_official_size():
    """The kernels' column sum and activation (the very functions, compiled for the CPU) on
    N=1024 networks of the official form (32 weights per column, bias -0.3): weights 1/16
    (the official value), then weights near 1/16 that are not powers of two, where a fused
    multiply-add is shown to change the result and the kernels' arithmetic is not."""
    from mpisdnn import Network, reference_inference

    rng = np.random.default_rng(11)
    n, nl, rows = 1024, 4, 300
    idx = [
        np.concatenate([np.sort(rng.choice(n, 32, replace=False)) for _ in range(n)])
        for _ in range(nl)
    ]
    # Row densities from 0.2 to 0.4: rows die at different layers, many sums sit near 0.3.
    dens = rng.uniform(0.2, 0.4, (rows, 1))
    y0 = sp.csr_matrix((rng.random((rows, n)) < dens).astype(np.float32))
    for official in (True, False):
        mats = []
        for k in range(nl):
            vals = (np.full(32 * n, 0.0625, np.float32) if official
                    else rng.uniform(0.055, 0.07, 32 * n).astype(np.float32))
            mats.append(sp.csc_matrix((vals, idx[k], np.arange(n + 1) * 32), (n, n)).tocsr())
        net = Network(mats, np.full((nl, n), -0.3, np.float32), n)
        ref = reference_inference(y0, net).toarray()
        alive = np.count_nonzero(ref.any(axis=1))
        assert 0 < alive < rows
        got = _cpu_layers(y0, net)
        assert np.array_equal(got.view(np.int32), ref.ravel().view(np.int32))
        if not official:
            fused = _cpu_layers(y0, net, fused=True)
            assert not np.array_equal(fused.view(np.int32), ref.ravel().view(np.int32))


# -- (c) PTX for a current GPU: no FMA, no float64 -----------------------------------------------


def test_ptx_has_no_fma_and_no_float64():
    """Compile the real kernels to PTX for sm_90 (H100; libNVVM from the nvcc wheel, no
    driver) in a process without the simulator, and read the instructions."""
    code = (
        "from mpisdnn.backends._cuda_kernels import ptx, resources\n"
        "import json\n"
        "found = {f'{cc}': ptx(cc) for cc in [(9, 0)]}\n"
        "print(json.dumps({'ptx': found, 'ptxas': resources(found['(9, 0)'])}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    found = got["ptx"]
    assert set(found) == {"(9, 0)"}
    _check_resources(got["ptxas"])
    for cc, kernels in found.items():
        assert "group" in kernels, cc
        for name, text in kernels.items():
            lines = [ln.strip() for ln in text.splitlines()]
            body = [ln for ln in lines if ln and not ln.startswith(("//", "."))]
            assert body, (cc, name)
            assert not [ln for ln in body if ln.startswith("fma") or " fma." in ln], (cc, name)
            assert not [ln for ln in body if ".f64" in ln], (cc, name)
        group = kernels["group"]
        # The hot loop's arithmetic is there, separately rounded.
        assert "mul.rn.f32" in group and "add.rn.f32" in group


def _check_resources(report):
    """``ptxas -v`` per kernel (sm_90): no spills, no stack frame, and registers that keep at
    least half the resident warps the recorded budget allows (docs/gpu.md has the table)."""
    from mpisdnn.backends._cuda_kernels import _SIGNATURES, REGISTER_BUDGET, warps_per_sm

    assert set(report) == set(_SIGNATURES) == set(REGISTER_BUDGET)
    lines = []
    for name, r in report.items():
        lines.append(f"{name:12s} {r['registers']:4d} registers  {r['shared']:6d} B shared  "
                     f"{r['warps_per_sm']:3d} warps/SM  spills {r['spill_stores']}/"
                     f"{r['spill_loads']} B  (budget {REGISTER_BUDGET[name]})")
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (name, r)
        assert r["stack_frame"] == 0, (name, r)
        assert 2 * r["warps_per_sm"] >= warps_per_sm(REGISTER_BUDGET[name]), (name, r)
        if r["registers"] > REGISTER_BUDGET[name]:
            print(f"note: {name} uses {r['registers']} registers, over its budget")
    print("ptxas -v, sm_90:\n" + "\n".join(lines))


# -- MPI: 1 to 3 ranks ---------------------------------------------------------------------------


@MPI_MARK
def test_mpi_ranks_match_serial_with_rebalancing():
    """Every rank runs the simulated GPU backend on its block (ranks share the one simulated
    device); categories and each rank's rows match the serial reference bit for bit."""
    from mpisdnn import reference_inference
    from mpisdnn.sdnn.reference import categories_of

    comm = world()
    net = mixed_network(seed=12, layers=3)
    rows = 12 * comm.size
    y0 = ragged_inputs(rows, 64, seed=12, most=20)
    # Live rows on rank 0, mostly empty rows elsewhere: re-balancing has something to move.
    order = np.argsort(-y0.getnnz(axis=1), kind="stable")
    y0 = sp.csr_matrix(y0[order])
    empty = np.arange(rows) >= 12
    empty[12::4] = False
    y0 = sp.csr_matrix(sp.diags((~empty).astype(np.float32)) @ y0)
    y0.eliminate_zeros()
    bounds = np.linspace(0, rows, comm.size + 1).astype(int)
    r0, r1 = bounds[comm.rank], bounds[comm.rank + 1]
    res = run_infer(net, y0[r0:r1], comm, backend="gpu", row_offset=r0, g_rows=rows,
                    gpus_per_rank=0, rebalance_threshold=1.01, first_group=1, max_group=2)
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref[r0:r1]))
    if comm.size > 1:  # rows really moved between the simulated devices
        assert res.rebalances and res.rebalances[0]["rows_moved"] > 0


@MPI_MARK
def test_mpi_more_ranks_on_a_node_than_gpus():
    """One clear error on every rank when the node's ranks outnumber its GPUs (the simulator
    shows one), unless ``gpus_per_rank=0`` shares the device."""
    from mpisdnn import backends
    from mpisdnn.errors import BackendError

    comm = world()
    shared = backends.get("gpu", comm, gpus_per_rank=0)
    assert shared.describe()["device"] == 0
    if comm.size == 1:
        assert backends.get("gpu", comm).describe()["mapping_local_ranks"] == 1
        return
    with pytest.raises(BackendError) as err:
        backends.get("gpu", comm)
    assert str(err.value) == (
        f"backend 'gpu': {comm.size} ranks on this node but 1 GPU(s); start at most 1 "
        "rank(s) per node, or share devices (--share-gpus, gpus_per_rank=0)"
    )


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_under_simulator_at_2_and_3_ranks(ranks):
    """The two MPI tests above at 2 and 3 ranks (pytest-mpi under mpiexec, simulator on)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "pytest",
           "--with-mpi", "-p", "no:cacheprovider", "-q", "-m", "mpi and gpu_sim",
           f"{ROOT}/tests/test_gpu_sim.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout


# -- column sets: one sum per set of equal columns, written to every member ---------------------


def test_column_sets_strided_listed_and_official_forms_bit_identical():
    """Strided sets, listed sets with empty columns, and the official form (fixed count, one
    value), each member with its own bias; through the group kernel, the split kernel and
    the staged and global-memory weight paths."""
    from mpisdnn.backends.gpu import column_sets
    from mpisdnn.weights import InMemoryStore

    from .gpu_cases import set_network

    net = set_network(seed=21)
    store = InMemoryStore(net)
    forms = [column_sets(store.layer(k), 64) for k in range(3)]
    assert [f[0] for f in forms] == [16, 0, 16]  # strided, listed, strided
    assert forms[1][1].size < 64 // 2  # listed: far fewer sets than columns
    y0 = ragged_inputs(40, 64, seed=21, most=30)
    st = check_group(gpu_backend(), net, y0, 0, 4)
    assert st["active"][0] > st["active"][-1] > 0
    check_group(gpu_backend(shared_entries=4), net, y0, 0, 4)  # weights from global memory
    check_group(gpu_backend(split_rows=10**6, chunk_rows=32), net, y0, 0, 4, prune=False)


def test_column_sets_pack_one_column_per_set():
    """A radix-net layer stores N/16 columns on the device (1/16 of the weights)."""
    from mpisdnn.generate import radixnet
    from mpisdnn.weights import InMemoryStore

    net = radixnet(512, 2, seed=3)
    be = gpu_backend()
    pn = be.prepare_network(InMemoryStore(net))
    assert pn.nsets == [32, 32] and [s[0] for s in pn.sets] == [32, 32]
    assert pn.weight_bytes < 2 * (512 * 32 * 2 // 16 + 4 * 512 + 64)


# -- identical rows found on the device -----------------------------------------------------------



def test_row_classes_on_device_match_the_host_search():
    """Row keys from the device (hashes, then a bit-for-bit check of equal hashes) merge
    exactly the rows the host search merges: repeated rows, rows one bit apart, ``-0`` and
    ``+0`` (no entry either way), empty rows, rows in several batches."""
    from mpisdnn.sdnn.dedup import find_duplicates

    rng = np.random.default_rng(31)
    base = ragged_inputs(12, 96, seed=31, most=20).toarray()
    base[:, 5] = rng.uniform(0.5, 2.0, 12)
    pick = rng.integers(0, 12, 80)
    dense = base[pick].astype(np.float32)
    dense[3] = dense[4]  # equal rows
    dense[7] = dense[4]
    dense[7, 5] = np.nextafter(dense[7, 5], np.float32(3))  # one bit apart
    dense[9, :] = 0.0  # empty rows
    dense[10, :] = 0.0
    y = sp.csr_matrix(dense)
    y.data[:] = y.data  # values kept; now a row whose stored entry is -0.0:
    zero = sp.csr_matrix(dense[11:12])
    negz = sp.csr_matrix((np.array([-0.0], np.float32), ([0], [2])), shape=(1, 96))
    y = sp.vstack([y, negz, zero]).tocsr()  # row 80 has -0.0 where row 81 has nothing
    y.sort_indices()
    for kw in ({}, {"batch_rows": 64}):
        be = gpu_backend(**kw)
        dev = be.to_device(y)
        gid = np.arange(y.shape[0])
        got = find_duplicates(be.row_view(dev), gid)
        host = be.to_host(dev)
        want = find_duplicates(host, gid)
        np.testing.assert_array_equal(got, want)
        assert got[7] == 7 and got[3] == 3 and got[4] == 3 and got[10] == 9
        assert got[80] == 9  # -0.0 only: an empty row


def test_rows_differ_catches_equal_hashes_of_different_rows():
    """The bit-for-bit check is what makes merges exact: forced candidate pairs of different
    rows are told apart, equal ones are not."""
    be = gpu_backend(batch_rows=32, chunk_rows=32)
    y = ragged_inputs(40, 64, seed=32, most=20)
    dense = y.toarray()
    dense[1] = dense[0]
    dev = be.to_device(sp.csr_matrix(dense))
    a = np.array([[0, 1], [0, 2], [1, 3], [0, 5]])  # (batch, row): rows 1, 2, 35, 5
    b = np.array([[0, 0], [0, 0], [0, 3], [1, 5]])  # rows 0, 0, 3, 37
    differ = be._rows_differ(dev, a, b)
    want = [not np.array_equal(dense[r], dense[s]) for r, s in [(1, 0), (2, 0), (35, 3), (5, 37)]]
    np.testing.assert_array_equal(differ, want)
    assert not differ[0] and differ[1]


def test_engine_dedup_on_device_bit_identical():
    """``--dedup`` through the engine with the device keys: repeated inputs merge, results
    and per-layer statistics equal the reference and the cpu backend's."""
    from mpisdnn import InferOptions, infer, reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net = mixed_network(seed=33, layers=4)
    base = ragged_inputs(10, 64, seed=33, most=30)
    y0 = sp.csr_matrix(base[np.random.default_rng(33).integers(0, 10, 48)])
    opts = InferOptions(backend="gpu", first_group=1, max_group=2, dedup=True)
    res = infer(net, y0, self_comm(), options=opts, backend=gpu_backend())
    cpu = infer(net, y0, self_comm(), options=opts.replace(backend="cpu"))
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref))
    assert res.layer_nnz == cpu.layer_nnz and res.layer_active_rows == cpu.layer_active_rows
    assert res.dedup["checks"] and res.dedup["checks"][0]["distinct_rows"] <= 10


# -- the tail kernel: one block per row through the whole group ----------------------------------


def test_tail_kernel_bit_identical_rows_dying_and_kept():
    """Few rows through a group in one launch, one block per row: column sets of every form,
    rows dying mid-group (pruned at the end, not repacked), no pruning, odd and even group
    lengths (the result's buffer alternates), statistics equal to the reference's."""
    from .gpu_cases import set_network

    net = set_network(seed=51, layers=5)
    y0 = ragged_inputs(6, 64, seed=51, most=30)
    for k1 in (4, 5):
        be = gpu_backend(tail_rows=64)
        st = check_group(be, net, y0, 0, k1)
        assert be.counters["tail_launches"] == 1
        assert st["active"][0] > 0
    check_group(gpu_backend(tail_rows=64), net, y0, 0, 3, prune=False)
    dead = mixed_network(seed=0, layers=3)
    dead.bias[1] = -50.0  # every row dies in layer 2
    st = check_group(gpu_backend(tail_rows=64), dead, ragged_inputs(5, 64, seed=0), 0, 3)
    assert st["active"].tolist()[1:] == [0, 0]


def test_tail_kernel_through_the_engine_with_dedup_and_streaming():
    from mpisdnn import InferOptions, infer, reference_inference
    from mpisdnn.sdnn.reference import categories_of

    net = mixed_network(seed=52, layers=5)
    base = ragged_inputs(4, 64, seed=52, most=30)
    y0 = sp.csr_matrix(base[np.random.default_rng(52).integers(0, 4, 12)])
    be = gpu_backend(tail_rows=16, weight_bytes=0, max_group=2)
    opts = InferOptions(backend="gpu", first_group=1, max_group=2, dedup=True)
    res = infer(net, y0, self_comm(), options=opts, backend=be)
    ref = reference_inference(y0, net)
    np.testing.assert_array_equal(res.categories, categories_of(ref))
    assert np.array_equal(bits(res.y_local), bits(ref))
    assert res.backend["tail_launches"] >= 3


def test_tail_rows_default_rule():
    """The tail kernel takes a batch while it sits in a third of the L2 (H100: 132 SMs,
    50 MB): thousands of rows at N=1024, one per multiprocessor at N=65536."""
    from mpisdnn.backends.gpu import tail_rows_for

    l2 = 50 * 2**20
    assert tail_rows_for(1024, 132, l2, 64) == l2 // 3 // 4096
    assert tail_rows_for(65536, 132, l2, 64) == 132
    assert tail_rows_for(64, 132, l2, 64) == 64 * 132  # never past the split kernel's share
    assert tail_rows_for(1024, 1, 0, 64) == 1


def test_uniform_bias_stored_once_per_layer():
    """A layer with one bias for every neuron (the challenge's) stores it once (step 0);
    layers with per-neuron biases keep theirs; results bit-identical either way."""
    from .gpu_cases import set_network

    net = set_network(seed=61, layers=3)
    net.bias[0] = np.float32(-0.3)  # uniform
    net.bias[2] = np.float32(-0.25)
    be = gpu_backend(tail_rows=64)
    pn = prepared(be, net)
    host = pn._pack(0, 3)
    assert host["lt"][:, 11].tolist() == [0, 1, 0]
    assert host["bias"].size == 1 + 64 + 1 and host["lt"][:, 6].tolist() == [0, 1, 65]
    y0 = ragged_inputs(8, 64, seed=61, most=30)
    check_group(be, net, y0, 0, 3)
    check_group(gpu_backend(), net, y0, 0, 3)


# -- host waits and launches per layer group (issue 38: few round trips, few launches) ----------


class _DeviceTraffic:
    """Counts, independently of the backend's own counters, what the runner's timed loop
    (:meth:`SliceRunner.run`) asks of the simulated device: reads back to the host
    (``copy_to_host``: each one waits for the stream) and kernel launches by name."""

    def __init__(self, monkeypatch):
        from numba.cuda.simulator import kernel as fake_kernel
        from numba.cuda.simulator.cudadrv import devicearray

        from mpisdnn.sdnn import runner

        self.reads, self.launches, self.on = 0, {}, False
        self.backend = None
        call, copy, run = (fake_kernel.FakeCUDAKernel.__call__,
                           devicearray.FakeCUDAArray.copy_to_host, runner.SliceRunner.run)
        me = self

        def counted_call(kern, *args):
            if me.on and not (kern._device or fake_kernel._kernel_context):
                me.launches[kern.fn.__name__] = me.launches.get(kern.fn.__name__, 0) + 1
            return call(kern, *args)

        def counted_copy(arr, *args, **kw):
            me.reads += me.on
            return copy(arr, *args, **kw)

        def counted_run(loop, *args, **kw):
            me.on, me.backend = True, loop._be
            me.own = (loop._be.arrays.reads, dict(loop._be.kernel_launches))
            try:
                return run(loop, *args, **kw)
            finally:
                me.on = False
                reads, launches = me.own
                me.own = (loop._be.arrays.reads - reads,
                          {k: v - launches.get(k, 0) for k, v in loop._be.kernel_launches.items()
                           if v - launches.get(k, 0)})

        monkeypatch.setattr(fake_kernel.FakeCUDAKernel, "__call__", counted_call)
        monkeypatch.setattr(devicearray.FakeCUDAArray, "copy_to_host", counted_copy)
        monkeypatch.setattr(runner.SliceRunner, "run", counted_run)


#: Per layer group before (main 9cc6f55) and now, the same runs (this test's): reads back
#: 3 -> 1 (the runner's row_nnz for its memory accounting, the alive flags, the statistics:
#: now one buffer), launches 3 -> 2 (row_counts gone; the compute kernel, and the gather
#: only when rows died); a --dedup check 3 reads -> 1 (+1 when hashes collide: the
#: bit-for-bit check), and no row_nnz for weighted rows.
@pytest.mark.parametrize("path", ["group", "tail", "split", "tail-dedup"])
def test_one_read_back_per_layer_group(monkeypatch, path):
    from mpisdnn import InferOptions, infer, reference_inference

    traffic = _DeviceTraffic(monkeypatch)
    # the split path in one-warp blocks over 32-row chunks: the simulator runs every GPU
    # thread as a Python thread (270-330 s with the default shape, 35 s so; the launches
    # and reads counted do not depend on the shape)
    split = {"split_rows": 10**6, "chunk_rows": 32, "warps": 1}
    knobs = {"group": {}, "tail": {"tail_rows": 10**6}, "split": split,
             "tail-dedup": {"tail_rows": 10**6}}[path]
    dedup = path.endswith("dedup")
    if dedup:  # repeated inputs: the checks merge rows, later groups run weighted rows
        base = ragged_inputs(5, 64, seed=71, most=30)
        y0 = sp.csr_matrix(base[np.random.default_rng(71).integers(0, 5, 20)])
    else:
        y0 = ragged_inputs(40, 64, seed=71)
    net = mixed_network(seed=71, layers=5)
    opts = InferOptions(backend="gpu", first_group=1, max_group=4, dedup=dedup)
    res = infer(net, y0, self_comm(), options=opts, backend=gpu_backend(**knobs))
    assert np.array_equal(bits(res.y_local), bits(reference_inference(y0, net)))
    groups = len(res.groups)
    checks = len(res.dedup["checks"]) if dedup else 0
    assert groups >= 3 and (checks >= 2 or not dedup)
    compute = {"group": "group", "tail": "tail", "split": "layer", "tail-dedup": "tail"}[path]
    got = dict(traffic.launches)
    # One compute launch per group (per layer for the split kernel), whatever its length.
    assert got.pop(compute) == (5 if path == "split" else groups)
    # Only after a group where rows died, and for the rows a check keeps.
    assert got.pop("gather_rows", 0) <= groups + checks
    pairs = got.pop("rows_differ", 0)
    assert got.pop("row_hashes", 0) == checks
    assert got == {}, got  # no row_counts (the runner's row_nnz) or any other kernel
    assert traffic.reads == groups + checks + pairs
    # The backend's own counters (what a device run reports) agree.
    assert traffic.own == (traffic.reads, traffic.launches)
