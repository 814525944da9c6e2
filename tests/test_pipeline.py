"""Pipeline stages (``infer --stages S``): the final Y is bit-identical to ``--stages 1``.

Rank counts other than the pytest-mpi world's are started as ``mpiexec -n K`` subprocesses
running a small driver (written to a temporary file), one job per rank count for all the
cases at that count: for each, it loads its stage's layer slice from HDF5, runs
:func:`run_pipeline` and :func:`infer` on the same rows, and compares both with plain scipy
(:func:`reference_inference`) on rank 0.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mpisdnn.errors import UsageError
from mpisdnn.partition import default_batch_rows, head_layers, stage_layers, stage_layout

from .conftest import ROOT, mpiexec, run_cli, run_cli_batch

DRIVER = textwrap.dedent(
    """
    import sys, json
    import numpy as np, scipy.sparse as sp
    from mpi4py import MPI
    sys.path.insert(0, {root!r})
    from tests.conftest import random_network, random_inputs
    from mpisdnn import InferOptions, infer, reference_inference, categories_of
    from mpisdnn.formats import hdf5
    from mpisdnn.partition import balanced_blocks
    from mpisdnn.sdnn.pipeline import (
        load_stage_head, load_stage_network, run_pipeline, stage_slicer)

    comm = MPI.COMM_WORLD


    def run(stages, backend, case, batch, path, head):
        layers, n, rows = 6, 64, 90
        net = random_network(n, layers, seed=11, density=0.1, scale=0.6)
        if case == "die":
            # Every row dies in layer 3: the later stages get only empty batches.
            net.bias[2][:] = -1000.0
        y0 = random_inputs(rows, n, seed=12)
        if head:
            # Inputs repeated, and checks for identical rows from layer 1: the head merges rows,
            # and its merges must reach the stages.
            y0 = sp.vstack([y0, y0[::3]], format="csr")
            rows = y0.shape[0]
        if comm.rank == 0:
            hdf5.write_network(path, net, version=1 if case == "budget" else 2)
        comm.Barrier()
        off = balanced_blocks(np.diff(y0.indptr), comm.size)
        r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
        # "budget": weights streamed in one-layer blocks, rows in small batches, re-balancing.
        bounds = dict(weight_memory=12000, memory_per_rank=4096, rebalance_threshold=1.01)
        opts = InferOptions(backend=backend, first_group=1 if head else 8,
                            **(bounds if case == "budget" else {{}}))
        stage_net, k0, k1, total = load_stage_network(
            comm, path, stages, first_layer=head, weight_memory=opts.weight_memory)
        assert len(stage_net) == k1 - k0 and total == layers
        # The first ``head`` layers data-parallel on every rank, before the stages.
        head_net = (load_stage_head(comm, path, total, 0, head, weight_memory=opts.weight_memory)
                    if head else None)
        # Stages balanced by the work of the first batch ("moved": to fixed, uneven bounds;
        # "budget": stage 0 moved to fixed bounds of 2 or 3 layers, so its streamed blocks are
        # known whatever the pilot batch's timings; "die": the even split kept, so the last
        # stage gets only empty batches).
        reslice = stage_slicer(path, total, weight_memory=opts.weight_memory, first=head)
        reslice = None if case == "die" else reslice
        bounds = {{"moved": [0] + list(range(1, stages)) + [layers],
                  "budget": [head, layers - 1 if head else 2, layers]}}.get(case)
        res = run_pipeline(stage_net, y0[r0:r1], comm, stages=stages, k0=k0, k1=k1,
                           total_layers=total, row_offset=r0, g_rows=rows, batch_rows=batch,
                           options=opts, reslice=reslice, stage_bounds=bounds,
                           head_store=head_net, head_first=0)
        one = infer(net, y0[r0:r1], comm, row_offset=r0, g_rows=rows, options=opts)
        same = (res.y_local.shape == one.y_local.shape
                and np.array_equal(res.y_local.indptr, one.y_local.indptr)
                and np.array_equal(res.y_local.indices, one.y_local.indices)
                and np.array_equal(res.y_local.data.view(np.uint32),
                                   one.y_local.data.view(np.uint32)))
        blocks = comm.gather(res.y_local, root=0)
        flags = comm.gather(same, root=0)
        if comm.rank == 0:
            ref = reference_inference(y0, net)
            got = sp.vstack(blocks, format="csr")
            diff = abs(got - ref)
            out = {{
                "same_as_stages_1": all(flags),
                "max_diff_vs_scipy": float(diff.max()) if diff.nnz else 0.0,
                "nnz": [int(got.nnz), int(ref.nnz)],
                "categories_ok": bool(np.array_equal(res.categories, categories_of(ref))),
                "cats": int(res.categories.size),
                "active": res.layer_active_rows,
                "ref_active": [int((np.diff(reference_inference(y0, net, k).indptr) > 0).sum())
                               for k in range(1, layers + 1)],
                "pipeline": res.pipeline,
                "memory": res.memory,
                "store": type(stage_net).__name__,
                "head_store": type(head_net).__name__,
                "rebalances": len(res.rebalances),
                "edges": [res.edges, int(sum(layer.nnz for layer in net.layers))],
                "checks": res.dedup["checks"],
            }}
            return out


    for key, args in json.load(open(sys.argv[1])):
        out = run(*args)
        if comm.rank == 0:
            print("RESULT " + json.dumps([key, out]), flush=True)
    """
)


_IDENTICAL = [(2, 2, "reference"), (2, 2, "cpu"), (3, 3, "reference"), (4, 2, "reference"),
              (6, 3, "reference")]  # fmt: skip
_HEADED = [(2, 2, "reference", "mixed", 2), (4, 2, "cpu", "budget", 2),
           (3, 3, "reference", "die", 4)]  # fmt: skip

#: Every driver run of the tests below: (ranks, stages, backend, case, batch rows, head layers).
_RUNS = [
    *[(r, st, b, "mixed", 7, 0) for r, st, b in _IDENTICAL],
    (3, 3, "reference", "moved", 7, 0),
    (4, 2, "reference", "moved", 7, 0),
    (3, 3, "reference", "die", 7, 0),
    (2, 2, "reference", "budget", 30, 0),
    *[(r, st, b, case, 7, head) for r, st, b, case, head in _HEADED],
]


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """The driver's result for each run of ``_RUNS``: the runs at one rank count share one
    ``mpiexec`` job (each with its own network file), so the ranks start 4 times, not 12."""
    d = tmp_path_factory.mktemp("pipeline")
    script = d / "driver.py"
    script.write_text(DRIVER.format(root=str(ROOT)))
    results = {}
    for ranks in sorted({run[0] for run in _RUNS}):
        todo = [[list(run), [*run[1:4], run[4], str(d / f"net-{k}.h5"), run[5]]]
                for k, run in enumerate(_RUNS) if run[0] == ranks]  # fmt: skip
        (d / f"runs-{ranks}.json").write_text(json.dumps(todo))
        cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(script),
               str(d / f"runs-{ranks}.json")]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = [json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert len(lines) == len(todo), proc.stdout + proc.stderr
        results.update({tuple(key): out for key, out in lines})
    return results


def _drive(driven, ranks, stages, backend="reference", case="mixed", batch=7, head=0):
    return driven[(ranks, stages, backend, case, batch, head)]


@pytest.mark.xdist_group("pipeline-driver")  # one worker runs the driver's jobs
@pytest.mark.parametrize("ranks,stages,backend", _IDENTICAL)
def test_pipeline_bit_identical_to_one_stage(driven, ranks, stages, backend):
    out = _drive(driven, ranks, stages, backend)
    assert out["same_as_stages_1"], out
    assert out["max_diff_vs_scipy"] == 0.0 and out["nnz"][0] == out["nnz"][1]
    assert out["categories_ok"] and out["cats"] > 0
    # Rows die inside the micro-batches (the count of live rows falls) and some survive.
    assert out["active"] == out["ref_active"]
    assert out["active"][-1] < out["active"][0] and out["active"][-1] > 0
    pipe = out["pipeline"]
    assert pipe["stages"] == stages and pipe["data_groups"] == ranks // stages
    assert min(pipe["batches_per_group"]) >= 2  # several micro-batches really flowed
    # Every stage but the last sent something; the last sends nothing.
    for rank, sent in enumerate(pipe["rank_bytes_sent"]):
        assert (sent > 0) == (rank % stages != stages - 1)
    assert all(b > 0 for b in pipe["rank_weight_bytes"])
    assert 0.0 <= pipe["bubble_fraction"] < 1.0


@pytest.mark.xdist_group("pipeline-driver")
@pytest.mark.parametrize("ranks,stages", [(3, 3), (4, 2)])
def test_pipeline_stages_moved_after_the_first_batch(driven, ranks, stages):
    """After the first micro-batch every stage but the last moves to one layer (the last
    takes the rest): the rows of the first batch ran on the even split, the others on the
    new one, and Y is still bit-identical; identical rows stay merged across the hand-offs."""
    out = _drive(driven, ranks, stages, case="moved")
    assert out["same_as_stages_1"], out
    assert out["max_diff_vs_scipy"] == 0.0 and out["categories_ok"] and out["cats"] > 0
    assert out["active"] == out["ref_active"]
    pipe = out["pipeline"]
    want = [[s, s + 1] for s in range(stages - 1)] + [[stages - 1, 6]]
    assert pipe["stage_layers"] == want and pipe["split"]["by"] == "work"
    assert min(pipe["batches_per_group"]) >= 3
    assert pipe["rank_weight_bytes"][stages - 1] > pipe["rank_weight_bytes"][0]


@pytest.mark.xdist_group("pipeline-driver")
def test_pipeline_when_every_row_dies_in_a_stage(driven):
    out = _drive(driven, 3, 3, case="die")
    assert out["same_as_stages_1"], out
    assert out["cats"] == 0 and out["categories_ok"] and out["nnz"] == [0, 0]
    assert out["active"][2:] == [0, 0, 0, 0] and out["active"] == out["ref_active"]
    # The last stage got only empty batches and did no work.
    assert out["pipeline"]["rank_busy_seconds"][2] == 0.0


@pytest.mark.xdist_group("pipeline-driver")
def test_pipeline_within_weight_and_row_budgets(driven):
    """Stages honour --weight-memory (a v1 slice streamed in blocks) and --memory-per-rank
    (row batches inside each micro-batch)."""
    out = _drive(driven, 2, 2, case="budget", batch=30)
    assert out["same_as_stages_1"], out
    assert out["max_diff_vs_scipy"] == 0.0 and out["categories_ok"]
    assert out["active"] == out["ref_active"]
    assert out["store"] == "StreamingStore"
    assert out["pipeline"]["split"]["by"] == "work"  # a v1 slice read again when it moves
    mem = out["memory"]
    # Stage 0 moved to layers 0-1 (bounds fixed by the driver): one block per layer.
    assert out["pipeline"]["stage_layers"] == [[0, 2], [2, 6]]
    assert mem["blocks"] == [[0, 1], [1, 2]] and mem["batch_rows"] is not None
    assert max(mem["rank_max_batches"]) > 1


@pytest.mark.xdist_group("pipeline-driver")
@pytest.mark.parametrize("ranks,stages,backend,case,head", _HEADED)
def test_pipeline_with_a_data_parallel_head(driven, ranks, stages, backend, case, head):
    """The first layers run data-parallel on every rank (re-balancing and checks for
    identical rows over all ranks), then the survivors go through the stages: Y is
    bit-identical to ``--stages 1`` and to scipy, the per-layer counts to the reference.
    "budget": the head streamed from a v1 file in blocks, rows in batches; "die": every row
    dies in the head, the stages get only empty batches."""
    out = _drive(driven, ranks, stages, backend, case=case, head=head)
    assert out["same_as_stages_1"], out
    assert out["max_diff_vs_scipy"] == 0.0 and out["nnz"][0] == out["nnz"][1]
    assert out["categories_ok"] and out["active"] == out["ref_active"]
    assert out["edges"][0] == out["edges"][1]  # the head's edges are counted once
    pipe = out["pipeline"]
    assert pipe["head_layers"] == [0, head] and pipe["head_seconds"] > 0
    assert pipe["stage_layers"][0][0] == head and pipe["stage_layers"][-1][1] == 6
    if case == "die":
        assert out["cats"] == 0 and out["active"][2:] == [0, 0, 0, 0]
    else:
        assert out["cats"] > 0 and out["checks"][0]["after_layer"] == 1
    if case == "mixed":
        # The head merged the repeated inputs (and the stages expanded them back; with
        # "budget"'s small row batches the copies sit in other batches and stay apart).
        assert out["checks"][0]["distinct_rows"] < out["checks"][0]["live_rows"]
    if case == "budget":
        assert out["head_store"] == "StreamingStore" and out["rebalances"] > 0
        # Stage 0 moved to layers 2-4 (bounds fixed by the driver): one block per layer.
        assert pipe["stage_layers"] == [[2, 5], [5, 6]]
        assert out["memory"]["blocks"] == [[0, 1], [1, 2], [2, 3]]


@pytest.mark.parametrize(
    "stages,first,total,asked,want",
    [(1, 0, 120, None, 0), (2, 0, 120, None, 30), (3, 0, 120, None, 20), (2, 0, 1920, None, 64),
     (2, 10, 20, None, 2), (4, 0, 6, None, 0), (2, 0, 120, 0, 0), (2, 0, 120, 120, 120),
     (1, 0, 120, 5, 0)],
)  # fmt: skip
def test_head_layers(stages, first, total, asked, want):
    assert head_layers(stages, first, total, asked) == want


@pytest.mark.parametrize("asked", [-1, 121, 2.5, True])
def test_head_layers_refuses(asked):
    with pytest.raises(UsageError, match="--stage-head"):
        head_layers(2, 0, 120, asked)


def test_stage_layout_refuses_ranks_not_a_multiple():
    assert stage_layout(6, 3) == 2
    with pytest.raises(UsageError, match="multiple of 4"):
        stage_layout(6, 4)


@pytest.mark.parametrize("stop,stages", [(120, 2), (120, 7), (5, 3), (2, 3)])
def test_stage_layers_cover_every_layer_once(stop, stages):
    got = [stage_layers(s, stages, 0, stop) for s in range(stages)]
    flat = [k for k0, k1 in got for k in range(k0, k1)]
    assert flat == list(range(stop))
    sizes = [k1 - k0 for k0, k1 in got]
    assert max(sizes) - min(sizes) <= 1


def test_default_batch_rows():
    assert default_batch_rows(60000, 2) == 3750
    assert default_batch_rows(1000, 2) == 256
    assert default_batch_rows(10, 3) == 10
    assert default_batch_rows(0, 3) == 1


def test_cli_stages_pass_and_refusal(tmp_path):
    net, inputs = tmp_path / "n.h5", tmp_path / "in.h5"
    gen = ["generate", "network", "--neurons", "1024", "--layers", "4", "--seed", "2", "-o", net]
    assert run_cli(gen).returncode == 0
    r = run_cli(["generate", "inputs", "--count", "200", "--seed", "2", "--network", net,
                 "-o", inputs])  # fmt: skip
    assert r.returncode == 0, r.stderr
    rep, rep0 = tmp_path / "r.json", tmp_path / "r0.json"
    base = ["infer", "--network", net, "--inputs", inputs]
    args = ["--stages", "2", "--batch-rows", "40", "--backend", "reference"]
    # the runs at two ranks share one MPI job (run_cli_batch): the default head, no head, and
    # two refusals
    head, plain, bad_head, bad_ck = run_cli_batch([
        [*base, *args, "--report", rep],
        [*base, *args, "--report", rep0, "--stage-head", "0"],
        [*base, "--stages", "2", "--stage-head", "5"],
        [*base, "--stages", "2", "--checkpoint", tmp_path / "ck"],
    ], ranks=2)  # fmt: skip
    # The default head: one layer of four (at most half a stage's even share) on every rank.
    assert head.returncode == 0 and "PASS" in head.stdout, head.stdout + head.stderr
    assert "head layers 1-1 on every rank" in head.stdout
    pipe = json.loads(rep.read_text())["pipeline"]
    assert pipe["head_layers"] == [0, 1] and pipe["stage_layers"][0][0] == 1
    # No head: the plain pipeline.
    assert plain.returncode == 0 and "PASS" in plain.stdout, plain.stdout + plain.stderr
    report = json.loads(rep0.read_text())
    pipe = report["pipeline"]
    assert pipe["head_layers"] is None
    # Split by the work measured on the first batch: contiguous, every layer once.
    (a, b), (c, d) = pipe["stage_layers"]
    assert a == 0 and b == c and d == 4 and 0 < b < 4 and pipe["split"]["by"] == "work"
    assert pipe["batches_per_group"] == [5, 5]
    assert len(pipe["stage_busy_seconds"]) == 2
    bad = run_cli([*base, "--stages", "2"], ranks=3)
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert bad.returncode == 2 and len(errors) == 1 and "multiple of 2" in errors[0], bad.stderr
    assert "Traceback" not in bad.stderr
    errors = [ln for ln in bad_head.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert bad_head.returncode == 2 and len(errors) == 1, bad_head.stderr
    assert "--stage-head" in errors[0], bad_head.stderr
    assert bad_ck.returncode == 2 and "--checkpoint works with --stages 1 only" in bad_ck.stderr
    assert np.isfinite(report["phases"]["rate_edges_per_second"])


def test_cli_stages_take_the_official_archive(tmp_path):
    """``--stages 2`` with ``--network neuron{N}.tar.gz``: the slices come through the one
    source dispatch of :mod:`mpisdnn.sdnn.load` (archive, directory and HDF5 alike), and
    the categories are those of the HDF5 network the layers were written from."""
    import tarfile

    net, inputs, d = tmp_path / "n.h5", tmp_path / "in.h5", tmp_path / "neuron1024"
    gen = ["generate", "network", "--neurons", "1024", "--layers", "4", "--seed", "5",
           "-o", net, "--tsv-dir", d]  # fmt: skip
    assert run_cli(gen).returncode == 0
    r = run_cli(["generate", "inputs", "--count", "120", "--seed", "5", "--network", net,
                 "-o", inputs])  # fmt: skip
    assert r.returncode == 0, r.stderr
    archive = tmp_path / "neuron1024.tar.gz"
    with tarfile.open(archive, "w:gz") as t:  # members out of layer order, as published
        for k in (3, 1, 4, 2):
            t.add(d / f"n1024-l{k}.tsv", arcname=f"neuron1024/n1024-l{k}.tsv")
    digests = {}
    sources = (net, archive, d)
    runs = [["infer", "--network", source, "--inputs", inputs, "--stages", "2", "--batch-rows",
             "30", "--report", tmp_path / f"{source.name}.json", "--quiet"]
            for source in sources]  # fmt: skip
    for source, r in zip(sources, run_cli_batch(runs, ranks=2)):
        rep = tmp_path / f"{source.name}.json"
        assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
        report = json.loads(rep.read_text())
        assert report["pipeline"]["stages"] == 2
        digests[source.name] = report["categories"]["sha1"]
    assert len(set(digests.values())) == 1, digests


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_world_in_one_stage_per_rank(backend):
    """Under pytest-mpi (any world size): as many stages as ranks, tiny batches."""
    import scipy.sparse as sp

    from mpisdnn.partition import balanced_blocks
    from mpisdnn.sdnn.pipeline import run_pipeline

    from .conftest import random_inputs, random_network, run_infer, world

    comm = world()
    layers = max(comm.size, 4)
    net = random_network(64, layers, seed=11, density=0.1, scale=0.6)
    y0 = random_inputs(70, 64, seed=12)
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    k0, k1 = stage_layers(comm.rank, comm.size, 0, layers)
    from mpisdnn import InferOptions, Network

    stage = Network(net.layers[k0:k1], net.bias[k0:k1], 64, total_layers=layers, layer_start=k0)
    res = run_pipeline(
        stage, y0[r0:r1], comm, stages=comm.size, k0=k0, k1=k1, total_layers=layers,
        row_offset=r0, g_rows=70, batch_rows=9, options=InferOptions(backend=backend),
    )  # fmt: skip
    one = run_infer(net, y0[r0:r1], comm, backend=backend, row_offset=r0, g_rows=70)
    assert (res.y_local != one.y_local).nnz == 0
    assert res.categories.tolist() == one.categories.tolist()
    assert res.layer_nnz == one.layer_nnz
    full = sp.vstack(comm.allgather(res.y_local), format="csr")
    assert full.shape == y0.shape


def test_cli_flags_of_staged_and_shared_gpu_runs():
    """``--stage-head`` reaches the plan, ``--share-gpus`` the options (gpus_per_rank 0:
    ranks share a node's GPUs; the sharing itself: tests/test_gpu_sim.py)."""
    from mpisdnn.cli import build_parser
    from mpisdnn.commands.infer import plan_from_args

    base = ["infer", "--network", "n.h5", "--inputs", "i.h5"]
    plan = plan_from_args(build_parser().parse_args(base))
    assert plan.stage_head is None and plan.options.gpus_per_rank == 1
    staged_gpu = ["--stages", "2", "--stage-head", "7", "--backend", "gpu", "--share-gpus"]
    plan = plan_from_args(build_parser().parse_args([*base, *staged_gpu]))
    assert plan.stage_head == 7 and plan.options.gpus_per_rank == 0


@pytest.fixture(scope="module")
def staged_problem(tmp_path_factory):
    """A 1024-neuron, 10-layer network (v2, and the same as v1) and 1,200 inputs with their
    truth, plus the final Y of a plain 1-rank run (the reference of the staged runs)."""
    from mpisdnn.formats import hdf5

    d = tmp_path_factory.mktemp("staged")
    net, inputs = d / "n.h5", d / "in.h5"
    gen = ["generate", "network", "--neurons", "1024", "--layers", "10", "--seed", "3", "-o", net]
    assert run_cli(gen).returncode == 0
    r = run_cli(["generate", "inputs", "--count", "1200", "--seed", "3", "--network", net,
                 "-o", inputs])  # fmt: skip
    assert r.returncode == 0, r.stderr
    v1 = d / "n1.h5"
    hdf5.write_network(v1, hdf5.read_network(net), version=1)
    y1 = d / "y1.h5"
    r = run_cli(["infer", "--network", net, "--inputs", inputs, "--backend", "reference",
                 "--quiet", "--output-y", y1])  # fmt: skip
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    return {"dir": d, "net": net, "v1": v1, "inputs": inputs, "y": hdf5.read_inputs(y1)[0]}


def _same_y(path, want) -> bool:
    from mpisdnn.formats import hdf5

    got = hdf5.read_inputs(path)[0]
    return (got != want).nnz == 0 and got.shape == want.shape


@pytest.mark.parametrize(
    "ranks,stages,network,head",
    [(4, 2, "net", "0"), (4, 2, "v1", "2"), (6, 3, "v1", "0")],
)  # fmt: skip
def test_cli_stages_with_several_batches_hand_rows_back_home(
    staged_problem, ranks, stages, network, head
):
    """Issue 42 item 6: at 4 and 6 ranks (several data groups) with many micro-batches and
    re-balancing, the last stages hand rows back in whatever order the batches and merged
    rows left them (was ``ValueError: destinations must be non-decreasing`` in
    ``RowBlock.home``, exit 3); v2 and streamed v1 networks; Y equals the 1-rank run's."""
    p = staged_problem
    y = p["dir"] / f"y-{ranks}-{stages}-{network}-{head}.h5"
    r = run_cli(["infer", "--network", p[network], "--inputs", p["inputs"], "--stages", stages,
                 "--stage-head", head, "--batch-rows", "60", "--backend", "reference",
                 "--quiet", "--output-y", y, *(["--weight-memory", "300K"] if network == "v1"
                                                 else [])],
                ranks=ranks, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert _same_y(y, p["y"])


def test_cli_resume_into_stages_at_four_ranks(staged_problem):
    """Issue 42 item 6 with ``--resume``: a 2-rank checkpoint (asked for by a ``DIR/STOP``
    file, exit 75) resumed at 4 ranks with ``--stages 2`` and many micro-batches."""
    p = staged_problem
    ck = p["dir"] / "ck"
    ck.mkdir()
    (ck / "STOP").write_text("")
    r = run_cli(["infer", "--network", p["net"], "--inputs", p["inputs"], "--checkpoint", ck,
                 "--checkpoint-every", "0", "--max-group", "2", "--quiet"], ranks=2)  # fmt: skip
    assert r.returncode == 75, r.stdout + r.stderr
    y = p["dir"] / "y-resumed.h5"
    r = run_cli(["infer", "--resume", ck, "--stages", "2", "--stage-head", "0", "--batch-rows",
                 "50", "--backend", "reference", "--quiet", "--output-y", y],
                ranks=4, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    assert "resuming from" in r.stdout and _same_y(y, p["y"])
