"""Exact deduplication of live rows (``--dedup``): byte-identical rows only, results unchanged.

Serial tests, and MPI tests (marked) that run at 2 and 3 ranks.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import Network
from mpisdnn.errors import UsageError
from mpisdnn.partition import balanced_blocks
from mpisdnn.sdnn import dedup
from mpisdnn.sdnn.options import InferOptions

from .conftest import random_inputs, random_network, run_infer, same_csr, self_comm, world
from .matlab_ref import categories, scipy_inference


def _fused(backend, **knobs):
    """``knobs`` (layer-group sizes) for a backend that fuses layers, nothing for the
    reference, which runs one layer at a time and refuses them as having no effect."""
    if backend == "reference":
        return {}
    return {k: v for k, v in knobs.items() if v is not None}


def dup_problem(rows=120, neurons=64, layers=20, seed=0):
    """Mixed-sign layers, then positive ones that drive the survivors to the same saturated
    rows; a quarter of the inputs repeated (identical from layer 0)."""
    rng = np.random.default_rng(seed)
    mixed = random_network(neurons, 4, seed, density=0.1, scale=0.6)
    mats = list(mixed.layers)
    for _ in range(layers - 4):
        w = sp.random(neurons, neurons, density=0.08, random_state=rng, dtype=np.float32)
        w.data = (w.data * 3).astype(np.float32)
        mats.append(sp.csr_matrix(w))
    bias = np.concatenate([mixed.bias, np.full((layers - 4, neurons), -0.1, np.float32)])
    y = random_inputs(rows, neurons, seed + 1, density=0.08)
    return Network(mats, bias, neurons), sp.vstack([y, y[: rows // 4]]).tocsr()


def reference_counts(y0, net):
    """Live rows and non-zeros after every layer, plain scipy."""
    y, active, nnz = sp.csr_matrix(y0), [], []
    for w, b in zip(net.layers, net.bias):
        y = scipy_inference(y, [w], [b])
        active.append(int((np.diff(y.indptr) > 0).sum()))
        nnz.append(int(y.nnz))
    return y, active, nnz


# ------------------------------------------------------------------------- the grouping


def test_rows_one_float_bit_apart_are_never_merged():
    one = np.float32(1.5)
    nxt = np.nextafter(one, np.float32(2))  # one bit higher
    m = sp.csr_matrix(
        np.array(
            [[one, 0, 2], [nxt, 0, 2], [one, 0, 2], [0, one, 2], [one, 0, 2]], dtype=np.float32
        )
    )
    gid = np.array([7, 3, 9, 4, 5])
    # Every row gets the same hash: only the byte comparison can keep them apart.
    rep = dedup.find_duplicates(m, gid, hashes=np.zeros(5, np.uint64))
    # Rows 0, 2, 4 are equal; row 4 has the smallest id of them; rows 1 and 3 differ.
    assert rep.tolist() == [4, 1, 4, 3, 4]
    assert dedup.find_duplicates(m, gid).tolist() == [4, 1, 4, 3, 4]


def test_negative_zero_and_row_length_keep_rows_apart():
    m = sp.csr_matrix(
        (
            np.array([0.0, -0.0, 1.0, 1.0, 1.0], np.float32),
            np.array([0, 0, 1, 1, 2], np.int32),
            np.array([0, 1, 2, 3, 5]),
        ),
        shape=(4, 3),
    )
    assert dedup.find_duplicates(m, np.arange(4), hashes=np.zeros(4, np.uint64)).tolist() == [
        0,
        1,
        2,
        3,
    ]


def test_option_is_validated():
    assert InferOptions().dedup is True
    with pytest.raises(UsageError, match="dedup must be True or False"):
        InferOptions(dedup="on")


def _one_bit_apart():
    """Rows 0 and 1 differ in one float bit of one input; the first layer copies its input
    (identity weights, no bias), and positive layers without clipping follow."""
    net = random_network(32, 3, seed=4, density=0.3, negative=False, scale=0.2)
    net.layers[0] = sp.identity(32, dtype=np.float32, format="csr")
    net.bias[:] = 0
    y0 = random_inputs(6, 32, seed=5, density=0.3).toarray()
    y0[1] = y0[0]
    j = np.flatnonzero(y0[0])[0]
    y0[1, j] = np.nextafter(y0[0, j], np.float32(2))
    return net, sp.csr_matrix(y0)


def test_a_merge_of_rows_one_bit_apart_is_caught(monkeypatch):
    """A grouping that ignored the last bit would merge rows 0 and 1: the final Y differs,
    so the on/off comparisons of this file fail for it; the real grouping keeps them."""
    net, y0 = _one_bit_apart()
    kw = dict(backend="reference", first_group=1)
    off = run_infer(net, y0, dedup=False, **kw)
    assert same_csr(run_infer(net, y0, dedup=True, **kw).y_local, off.y_local)
    real = dedup.find_duplicates

    cleared = []

    def last_bit_blind(mat, gid, hashes=None):
        starts, lens, indices, bits = dedup._arrays(mat)  # CSR or a backend's row view
        blind = bits & ~np.uint32(1)
        cleared.append(np.count_nonzero(blind != bits))
        return real((starts, lens, indices, blind.view(np.float32)), gid)

    monkeypatch.setattr(dedup, "find_duplicates", last_bit_blind)
    bad = run_infer(net, y0, dedup=True, **kw)
    assert cleared[1] == 1  # the check at layer 1 (after the warm-up) saw one bit apart
    assert bad.dedup["checks"][0]["distinct_rows"] < bad.dedup["checks"][0]["rows_before"]
    assert not same_csr(off.y_local, bad.y_local)


# ------------------------------------------------------------------------- serial runs


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize(
    "extra",
    [{}, {"memory_per_rank": 4096 * 16}, {"weight_memory": 60_000}],
    ids=["plain", "batches", "streamed"],
)
def test_on_and_off_are_bit_identical(backend, extra):
    net, y0 = dup_problem()
    expected, active, nnz = reference_counts(y0, net)
    # --max-group only where the backend fuses layers (the reference runs one at a time and
    # refuses it as a flag with no effect)
    kw = dict(backend=backend, first_group=2, **_fused(backend, max_group=4), **extra)
    off = run_infer(net, y0, dedup=False, **kw)
    on = run_infer(net, y0, dedup=True, **kw)
    assert same_csr(on.y_local, off.y_local)
    assert on.categories.tolist() == off.categories.tolist() == categories(expected).tolist()
    # Counts weigh every kept row by the inputs it stands for.
    assert on.layer_active_rows == off.layer_active_rows == active
    assert on.layer_nnz == off.layer_nnz == nnz
    checks = on.dedup["checks"]
    assert checks and min(c["distinct_rows"] for c in checks) < 10 < checks[-1]["live_rows"]
    assert off.dedup["checks"] == []
    if "memory_per_rank" in extra:
        assert max(on.memory["rank_max_batches"]) > 1
    if "weight_memory" in extra:
        assert len(on.memory["blocks"]) > 1


def test_distinct_rows_cost_few_checks():
    """Rows that stay distinct: the checks space out (the gap doubles)."""
    net = random_network(64, 40, seed=5, density=0.1, scale=0.7)
    net.bias[:] = 0
    y0 = random_inputs(60, 64, seed=6)
    res = run_infer(net, y0, backend="reference", dedup=True)
    checks = res.dedup["checks"]
    assert [c["after_layer"] for c in checks] == [8, 16, 32]  # then 64 > 40 layers
    assert all(c["distinct_rows"] == c["live_rows"] == 60 for c in checks)


# ------------------------------------------------------------------------- MPI runs


def _split_run(net, y0, comm, **kw):
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    res = run_infer(net, y0[r0:r1], comm, row_offset=r0, g_rows=y0.shape[0], **kw)
    assert res.y_local.shape[0] == r1 - r0
    return res, sp.vstack(comm.allgather(res.y_local), format="csr")


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize(
    "extra",
    [
        {"rebalance_threshold": 1.05, "max_group": 1},
        {"memory_per_rank": 4096 * 16, "weight_memory": 60_000},
    ],
    ids=["rebalance", "batches-streamed"],
)
def test_ranks_on_and_off_match_serial(backend, extra):
    comm = world()
    net, y0 = dup_problem()
    # Dying rows first: an nnz-balanced split leaves rank 0 idle, so rows move.
    y0 = sp.vstack([random_inputs(40, 64, seed=9, density=0.01), y0]).tocsr()
    serial = run_infer(net, y0, self_comm(), backend="reference", dedup=False)
    extra = dict(extra)
    kw = dict(backend=backend, first_group=2,
              **_fused(backend, max_group=extra.pop("max_group", None)), **extra)  # fmt: skip
    on, y_on = _split_run(net, y0, comm, dedup=True, **kw)
    off, y_off = _split_run(net, y0, comm, dedup=False, **kw)
    assert same_csr(y_on, y_off) and same_csr(y_on, serial.y_local)
    assert on.categories.tolist() == off.categories.tolist() == serial.categories.tolist()
    assert on.layer_active_rows == serial.layer_active_rows
    assert on.layer_nnz == serial.layer_nnz
    assert min(c["distinct_rows"] for c in on.dedup["checks"]) < 10
    if comm.size > 1 and "rebalance_threshold" in extra:
        assert on.rebalances


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_stages_on_and_off_match_serial(backend):
    """One pipeline stage per rank, micro-batches of 40 rows: rows merge within a batch."""
    from mpisdnn.sdnn.pipeline import run_pipeline, stage_layers

    comm = world()
    net, y0 = dup_problem()
    rows, layers = y0.shape[0], len(net.layers)
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    k0, k1 = stage_layers(comm.rank, comm.size, 0, layers)
    stage = Network(net.layers[k0:k1], net.bias[k0:k1], 64, total_layers=layers, layer_start=k0)
    serial = run_infer(net, y0, self_comm(), backend="reference", dedup=False)
    got = {}
    for dd in (True, False):
        opts = InferOptions(backend=backend, dedup=dd, first_group=2,
                            **_fused(backend, max_group=4))  # fmt: skip
        res = run_pipeline(
            stage, y0[r0:r1], comm, stages=comm.size, k0=k0, k1=k1, total_layers=layers,
            row_offset=r0, g_rows=rows, batch_rows=40, options=opts,
        )  # fmt: skip
        got[dd] = res, sp.vstack(comm.allgather(res.y_local), format="csr")
    (on, y_on), (off_, y_off) = got[True], got[False]
    assert same_csr(y_on, y_off) and same_csr(y_on, serial.y_local)
    assert on.categories.tolist() == off_.categories.tolist() == serial.categories.tolist()
    assert on.layer_active_rows == serial.layer_active_rows
    assert on.layer_nnz == serial.layer_nnz
    checks = on.dedup["checks"]
    # Some check found many live inputs standing for a few distinct rows (micro-batches at
    # several stages: the last check may see only a small batch).
    assert any(c["distinct_rows"] < 10 < c["live_rows"] for c in checks)
    assert off_.dedup["checks"] == []


# ------------------------------------------------------------------------- checkpoints


def test_checkpoint_written_with_one_setting_resumes_with_the_other(tmp_path):
    """A checkpoint holds every live input (kept rows expanded), so it resumes exactly with
    dedup on or off, at another rank count."""
    import json

    from mpisdnn import categories_of, reference_inference
    from mpisdnn.formats import hdf5

    from .conftest import run_cli

    net, y0 = dup_problem()
    ref = reference_inference(y0, net)
    hdf5.write_network(tmp_path / "net.h5", net)
    hdf5.write_inputs(tmp_path / "in.h5", y0, categories_of(ref))
    base = ["infer", "--network", tmp_path / "net.h5", "--inputs", tmp_path / "in.h5", "--quiet"]
    for mode, other in (("on", "off"), ("off", "on")):
        ck = tmp_path / f"ck-{mode}"
        # cpu: a boundary after layer 8 (first group; the first check merged rows there) and,
        # with dedup on, one after 16 (the next check); the newest checkpoint is taken.
        r = run_cli([*base, "--backend", "cpu", "--dedup", mode, "--checkpoint", ck,
                     "--checkpoint-every", "0.000001"], ranks=2)  # fmt: skip
        assert r.returncode == 0, r.stderr
        newest = sorted(p for p in ck.glob("ckpt-*") if (p / "manifest.json").exists())[-1]
        manifest = json.loads((newest / "manifest.json").read_text())
        nxt = manifest["next_layer"]
        assert nxt == (16 if mode == "on" else 8)
        saved = np.concatenate([np.load(newest / f["name"])["gid"] for f in manifest["files"]])
        mid = reference_inference(y0, net, nxt)
        # Every live input is in the checkpoint, merged or not.
        assert np.array_equal(np.sort(saved), np.flatnonzero(np.diff(mid.indptr) > 0))
        out = tmp_path / f"y-{mode}-{other}.h5"
        r = run_cli(["infer", "--resume", ck, "--backend", "reference", "--dedup", other,
                     "--output-y", out, "--report", tmp_path / "r.json"], ranks=3)  # fmt: skip
        assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
        assert json.loads((tmp_path / "r.json").read_text())["resumed"]["next_layer"] == nxt
        got, _ = hdf5.read_inputs(out)
        assert same_csr(got, ref)


@pytest.mark.gpu_sim
def test_gpu_on_and_off_are_bit_identical():
    """The gpu backend (CUDA simulator): kept rows go to the host for the check and back."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        pytest.skip("CUDA simulator test: run with NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh does)")
    net, y0 = dup_problem(rows=40, neurons=32, layers=10)
    kw = dict(backend="gpu", gpus_per_rank=0, first_group=2, max_group=4)
    off = run_infer(net, y0, dedup=False, **kw)
    on = run_infer(net, y0, dedup=True, **kw)
    assert same_csr(on.y_local, off.y_local)
    assert on.layer_active_rows == off.layer_active_rows and on.layer_nnz == off.layer_nnz
    assert min(c["distinct_rows"] for c in on.dedup["checks"]) < on.dedup["checks"][0]["live_rows"]


# ------------------------------------------------------------------------- weighted counts


def _weighted_case(layers=6):
    """Rows that die at different layers, each with its own weight (1 to 5,000)."""
    net = random_network(64, layers, seed=11, density=0.1, scale=0.7)
    net.bias[:] -= 0.1
    y0 = random_inputs(70, 64, seed=12, density=0.08)
    w = np.random.default_rng(13).integers(1, 5000, y0.shape[0])
    return net, y0, w


def _weighted_reference(net, y0, w):
    """Per layer: the inputs alive and their non-zeros (each row ``w[i]`` times), plain scipy."""
    y, act, nnz, rows = sp.csr_matrix(y0), [], [], []
    for lw, b in zip(net.layers, net.bias):
        y = scipy_inference(y, [lw], [b])
        counts = np.diff(y.indptr)
        act.append(int(w[counts > 0].sum()))
        nnz.append(int((w * counts).sum()))
        rows.append(int((counts > 0).sum()))
    return y, act, nnz, rows


def check_weighted_layers(be, net, y0, w):
    """One call with all rows, whatever their weights: the outputs, ``rows`` and ``tiles``
    are those of the call without weights, ``active`` and ``nnz`` count every input."""
    from mpisdnn.weights import InMemoryStore

    prepared = be.prepare_network(InMemoryStore(net))
    ref, act, nnz, rows = _weighted_reference(net, y0, w)
    plain = be.run_layers(be.to_device(y0), prepared, 0, len(net.layers))
    out, keep, st = be.run_layers(be.to_device(y0), prepared, 0, len(net.layers), weights=w)
    assert np.array_equal(keep, np.flatnonzero(np.diff(ref.indptr)))
    assert same_csr(be.to_host(out), ref[keep]) and same_csr(be.to_host(plain[0]), ref[keep])
    assert st["active"].tolist() == act and st["nnz"].tolist() == nnz
    assert st["rows"].tolist() == rows == plain[2]["rows"].tolist() == plain[2]["active"].tolist()
    assert st["tiles"].tolist() == plain[2]["tiles"].tolist()


@pytest.mark.parametrize(
    "backend,kw",
    [("cpu", {"threads": 2}), ("cpu", {"threads": 2, "sparse_density": 0.08}),
     ("cpu", {"threads": 2, "sparse_density": 2.0}), ("reference", {})],
    ids=["tiles", "push-then-tiles", "push", "reference"],
)  # fmt: skip
def test_run_layers_weights_count_every_input(backend, kw):
    from mpisdnn.backends.cpu import CpuBackend
    from mpisdnn.backends.reference import ReferenceBackend

    be = CpuBackend(**kw) if backend == "cpu" else ReferenceBackend()
    check_weighted_layers(be, *_weighted_case())


@pytest.mark.gpu_sim
@pytest.mark.parametrize("split_rows", [0, 10**6], ids=["group", "split"])
def test_gpu_run_layers_weights_count_every_input(split_rows):
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        pytest.skip("CUDA simulator test: run with NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh does)")
    from .gpu_cases import gpu_backend

    net, y0, w = _weighted_case(layers=3)
    check_weighted_layers(gpu_backend(split_rows=split_rows), net, y0[:12], w[:12])


def test_official_network_on_and_off_are_bit_identical(official_dir):
    """The official N=1024 x 120 network, 600 digit-like inputs (a fifth of them repeated):
    identical final Y and counts with dedup on and off, categories as plain scipy's."""
    from mpisdnn.formats.tsv import read_network_tsv
    from mpisdnn.generate import digit_images

    net = read_network_tsv(official_dir, layers=120)
    y0 = digit_images(500, 1024, seed=3)
    y0 = sp.vstack([y0, y0[::5]]).tocsr()
    ref = scipy_inference(y0, net.layers, net.bias)
    kw = dict(backend="cpu", threads=2)
    off = run_infer(net, y0, dedup=False, **kw)
    on = run_infer(net, y0, dedup=True, **kw)
    assert same_csr(on.y_local, off.y_local) and same_csr(on.y_local, ref)
    assert on.categories.tolist() == off.categories.tolist() == categories(ref).tolist()
    assert on.layer_active_rows == off.layer_active_rows
    assert on.layer_nnz == off.layer_nnz
    assert min(c["distinct_rows"] for c in on.dedup["checks"]) < on.dedup["checks"][0]["live_rows"]


def test_few_dense_rows_run_one_at_a_time_bit_identically(monkeypatch):
    """A call with a few dense rows runs them one row at a time (the deduplicated tail at
    large N): same bits and counts as plain scipy, weighted or not, also for a row that
    dies on the way (a dense row of zeros and a bias that kills everything)."""
    from mpisdnn.backends import cpu

    monkeypatch.setattr(cpu, "PUSH_NEURONS", 0)
    net, y0, w = _weighted_case()
    dense = sp.csr_matrix(np.where(y0[:3].toarray() > 0, 1.0, 0.5).astype(np.float32))
    dense[2] = -dense[2]  # negative inputs: rows die on the way (prune)
    be = cpu.CpuBackend(threads=1)
    assert 3 <= cpu.FEW_ROWS * be.threads
    calls = []
    for name in ("_tile_layers", "_push_group"):
        real = getattr(be, name)
        monkeypatch.setattr(be, name, lambda *a, _r=real, **k: calls.append(1) or _r(*a, **k))
    check_weighted_layers(be, net, dense, w[:3])
    assert not calls  # neither tiles nor the push kernel: one dense row at a time
