"""Checkpoint / resume: a killed run continues at another rank count and backend, exactly.

The runs are ``mpiexec`` subprocesses: the checkpointed run is killed with SIGKILL once its
first checkpoint is complete, and the resumed run must give the categories and per-layer
counts of an uninterrupted run; a driver compares the resumed final Y bit for bit with plain
scipy (:func:`reference_inference`).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mpisdnn.formats import hdf5

from .conftest import ROOT, mpiexec, random_inputs, random_network, run_cli

LAYERS, N, ROWS = 30, 64, 200


@pytest.fixture()
def problem(tmp_path):
    """A mixed-sign network (rows die along the way, some survive) and inputs with truth."""
    from mpisdnn import categories_of, reference_inference

    net = random_network(N, LAYERS, seed=21, density=0.15, scale=0.6)
    y0 = random_inputs(ROWS, N, seed=22)
    ref = reference_inference(y0, net)
    assert 0 < categories_of(ref).size < ROWS
    hdf5.write_network(tmp_path / "net.h5", net)
    hdf5.write_inputs(tmp_path / "in.h5", y0, categories_of(ref))
    return tmp_path, net, y0, ref


def _cmd(ranks, args):
    return [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpisdnn", *map(str, args)]


def _complete(ck: Path):
    return sorted(p for p in ck.glob("ckpt-*") if (p / "manifest.json").exists())


def _run_and_kill(tmp, args, ranks=2, timeout=120):
    """Start ``infer ARGS``; SIGKILL the whole job once a checkpoint is complete."""
    ck = tmp / "ck"
    proc = subprocess.Popen(
        _cmd(ranks, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not _complete(ck):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode != 0, "the run ended before it could be killed"
    # A rank the launcher started outside the killed group could go on writing checkpoints
    # (seen once in CI: the resumed run started a layer later than the newest checkpoint
    # listed here), so kill every process of this job by its checkpoint path and wait for
    # them to be gone before the test looks at the files.
    _kill_by_argument(str(ck), timeout=30)
    return ck


def _kill_by_argument(arg, timeout):
    """SIGKILL every process whose command line has ``arg``; wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if arg.encode() in argv:
                alive.append(int(d.name))
                try:
                    os.kill(int(d.name), signal.SIGKILL)
                except OSError:
                    pass
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} outlived SIGKILL"
        time.sleep(0.05)


RESUME_DRIVER = textwrap.dedent(
    """
    import sys, argparse, json
    import numpy as np, scipy.sparse as sp
    from mpi4py import MPI
    sys.path.insert(0, {root!r})
    from mpisdnn.commands.infer import plan_from_args
    from mpisdnn.cli import build_parser
    from mpisdnn import backends, reference_inference
    from mpisdnn.formats import hdf5
    from mpisdnn.sdnn import session

    comm = MPI.COMM_WORLD
    args = build_parser().parse_args(["infer", *sys.argv[1:]])
    plan = plan_from_args(args)
    be = backends.create(plan.options, comm)
    with session.locked(comm, plan):
        plan, loaded = session.load(comm, plan, be)
        res = session.run(comm, plan, loaded, be)
    blocks = comm.gather(res.y_local, root=0)
    if comm.rank == 0:
        net = hdf5.read_network(plan.network)
        y0 = hdf5.read_inputs(plan.inputs)[0]
        ref = reference_inference(y0, net)
        got = sp.vstack(blocks, format="csr")
        same = (np.array_equal(got.indptr, ref.indptr) and
                np.array_equal(got.indices, ref.indices) and
                np.array_equal(got.data.view(np.uint32), ref.data.view(np.uint32)))
        print("RESULT " + json.dumps({{"bit_identical": bool(same),
                                       "resumed": res.resumed}}))
    """
)


def _resume_driver(tmp, ranks, args):
    script = tmp / "resume_driver.py"
    script.write_text(RESUME_DRIVER.format(root=str(ROOT)))
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(script), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(line) == 1, proc.stdout + proc.stderr
    return json.loads(line[0][7:])


def test_sigkill_then_resume_elsewhere_is_exact(problem):
    tmp, net, y0, ref = problem
    base = ["infer", "--network", tmp / "net.h5", "--inputs", tmp / "in.h5", "--quiet"]
    full = run_cli([*base, "--backend", "reference", "--report", tmp / "full.json"], ranks=2)
    assert full.returncode == 0, full.stderr
    ck = _run_and_kill(
        tmp, [*base, "--backend", "reference", "--checkpoint", tmp / "ck",
              "--checkpoint-every", "0.000001"],
    )  # fmt: skip
    done = _complete(ck)
    assert done, "no checkpoint was written before the kill"
    assert not (ck / done[-1].name / "rank-00002.npz").exists()
    manifest = json.loads((done[-1] / "manifest.json").read_text())
    nxt = manifest["next_layer"]
    assert 0 < nxt < LAYERS and manifest["written_ranks"] == 2
    # The live rows saved are exactly scipy's rows after layer `nxt`.
    from mpisdnn import reference_inference

    mid = reference_inference(y0, net, nxt)
    live = np.flatnonzero(np.diff(mid.indptr) > 0)
    saved = np.concatenate([np.load(done[-1] / f["name"])["gid"] for f in manifest["files"]])
    np.testing.assert_array_equal(np.sort(saved), live)

    snapshot = tmp / "ck-copy"
    shutil.copytree(ck, snapshot)
    r = run_cli(["infer", "--resume", ck, "--backend", "cpu", "--report", tmp / "res.json"],
                ranks=3)  # fmt: skip
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    a, b = json.loads((tmp / "full.json").read_text()), json.loads((tmp / "res.json").read_text())
    assert a["categories"]["sha1"] == b["categories"]["sha1"]
    assert b["resumed"]["next_layer"] == nxt and b["resumed"]["checkpoint"].endswith(done[-1].name)
    assert b["layers"]["nnz"][nxt:] == a["layers"]["nnz"][nxt:]
    assert b["run"]["ranks"] == 3 and b["backend"]["name"] == "cpu"
    # The final Y itself, bit for bit, resumed at 1 rank with the reference backend and
    # at 3 ranks in 3 pipeline stages.
    cases = ((1, ["--backend", "reference"]), (3, ["--stages", "3", "--backend", "cpu"]))
    for ranks, extra in cases:
        got = _resume_driver(tmp, ranks, ["--resume", snapshot, *extra])
        assert got["bit_identical"] and got["resumed"]["next_layer"] == nxt, got


def _checkpoint_every_layer(tmp):
    """A 2-rank reference run that checkpoints at every boundary into ``tmp/ck``."""
    ck = tmp / "ck"
    base = ["infer", "--network", tmp / "net.h5", "--inputs", tmp / "in.h5", "--quiet"]
    r = run_cli([*base, "--backend", "reference", "--checkpoint", ck, "--checkpoint-every",
                 "0.000001"], ranks=2)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return ck


def test_damaged_newest_falls_back_then_fails(problem):
    tmp = problem[0]
    ck = _checkpoint_every_layer(tmp)
    done = _complete(ck)
    assert len(done) == 2  # the newest and the one before it are kept
    newest = done[-1] / "rank-00001.npz"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))
    r = run_cli(["infer", "--resume", ck, "--report", tmp / "r.json"], ranks=2)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    assert "warning" in r.stderr and done[-1].name in r.stderr and "damaged" in r.stderr
    report = json.loads((tmp / "r.json").read_text())
    assert report["resumed"]["checkpoint"].endswith(done[-2].name)
    assert report["resumed"]["skipped_damaged"]
    (done[-2] / "manifest.json").write_text("{not json")
    r = run_cli(["infer", "--resume", ck], ranks=2)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert r.returncode == 2 and len(errors) == 1 and "every checkpoint is damaged" in errors[0]
    assert "Traceback" not in r.stderr


def test_resume_against_changed_or_other_network(problem):
    tmp = problem[0]
    ck = _checkpoint_every_layer(tmp)
    other = tmp / "other.h5"
    hdf5.write_network(other, random_network(N, LAYERS, seed=99, density=0.1, scale=0.6))
    r = run_cli(["infer", "--resume", ck, "--network", other], ranks=2)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "is not the network the checkpoint was made with" in errors[0]
    # The recorded network file itself changed in place.
    shutil.copy(other, tmp / "net.h5")
    r = run_cli(["infer", "--resume", ck], ranks=3)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "network" in errors[0] and "changed since the checkpoint" in errors[0]
    r = run_cli(["infer", "--resume", tmp / "nowhere"], ranks=1)
    assert r.returncode == 2 and "no such checkpoint directory" in r.stderr


def test_stop_file_checkpoints_and_exits_75(problem):
    """What the sbatch time-limit path uses: DIR/STOP asks for a checkpoint and a stop."""
    tmp = problem[0]
    ck = tmp / "ck"
    ck.mkdir()
    args = [
        "infer",
        "--network",
        tmp / "net.h5",
        "--inputs",
        tmp / "in.h5",
        "--quiet",
        "--backend",
        "reference",
        "--checkpoint",
        ck,
        "--checkpoint-every",
        "0.000001",
    ]
    proc = subprocess.Popen(_cmd(2, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not _complete(ck):
        time.sleep(0.02)
    (ck / "STOP").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out + err
    assert "stopped on request" in out and "--resume" in out
    last = json.loads((_complete(ck)[-1] / "manifest.json").read_text())["next_layer"]
    assert 0 < last < LAYERS
    r = run_cli(["infer", "--resume", ck, "--checkpoint-every", "0", "--progress", "1e-9"])
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    assert not (ck / "STOP").exists()
    # A resumed run shows its progress, from the layer after the checkpoint on.
    assert f"[progress] layer {last + 1}/{LAYERS} " in r.stdout, r.stdout
    assert f"[progress] layer {last}/{LAYERS} " not in r.stdout, r.stdout


def test_checkpointed_run_streams_a_v1_network_and_shows_progress(problem, capsys):
    """--checkpoint loads weights as every run does (a v1 file over --weight-memory is
    streamed in layer blocks) and prints progress lines; categories still PASS."""
    from mpi4py import MPI

    from mpisdnn.cli import main

    tmp, net = problem[0], problem[1]
    hdf5.write_network(tmp / "v1.h5", net, version=1)
    report = tmp / "r.json"
    code = main(
        ["infer", "--network", str(tmp / "v1.h5"), "--inputs", str(tmp / "in.h5"),
         "--backend", "reference", "--checkpoint", str(tmp / "ck"), "--checkpoint-every",
         "1e-9", "--weight-memory", "20000", "--progress", "1e-9", "--report", str(report)],
        MPI.COMM_SELF,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out, out
    assert f"[progress] layer {LAYERS}/{LAYERS} " in out and "checkpoints " in out, out
    rep = json.loads(report.read_text())
    assert rep["memory"]["rank_streaming"][0] is not None  # a StreamingStore's statistics
    assert len(rep["memory"]["blocks"]) > 1 and rep["checkpoint"]["count"] > 1


@pytest.mark.mpi
def test_saved_rows_read_back_at_this_world_size(tmp_path_factory):
    """Rows saved by every rank come back, re-partitioned, exactly (any world size)."""
    import scipy.sparse as sp

    from mpisdnn.sdnn.checkpoint import Checkpointer, choose_checkpoint, read_live_rows

    from .conftest import world

    comm = world()
    d = comm.bcast(str(tmp_path_factory.mktemp("ck")) if comm.rank == 0 else None, root=0)
    full = random_inputs(50, 32, seed=5, density=0.2)
    keep = np.flatnonzero(np.arange(50) % 3 != 1)  # some rows are dead
    mine = keep[keep % comm.size == comm.rank]  # any split; not even contiguous
    saver = Checkpointer(comm, d, 0, {"network": None}, 50, 6, 32)
    saver.save(full[mine], mine, 4)
    manifest, warnings = choose_checkpoint(comm, d)
    assert not warnings and manifest["next_layer"] == 4
    got = read_live_rows(comm, manifest)
    gids = comm.allgather(got["gid"])
    np.testing.assert_array_equal(np.concatenate(gids), keep)
    ys = sp.vstack(comm.allgather(got["y"]), format="csr")
    assert (ys != full[keep]).nnz == 0
    starts = comm.allgather((got["row_offset"], got["block_rows"]))
    assert starts[0][0] == 0 and sum(b for _, b in starts) == 50
