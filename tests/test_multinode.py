"""Multi-node paths on a virtual cluster: 2x2, 3x1 and 4x1 nodes on one machine.

Each virtual node is a hydra proxy in its own UTS namespace (``tests/vcluster``), so MPI and
mpisdnn see separate hosts; some tests also give each node a private ``/tmp``. Data shared
by the nodes (the "shared file system") lives outside ``/tmp`` (``/var/tmp``), because a
private ``/tmp`` hides the host's. Each test names the node-local logic it guards: replacing
that logic by the global one (ranks of the job instead of ranks of the node, rank 0's host
instead of each host's) makes it fail.

Where the virtual cluster cannot be set up (not root, no unshare) the tests skip and say
why; in CI (``CI=true``) that is a failure, as for the Slurm tests.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from . import vcluster
from .conftest import random_inputs, random_network, run_cli

LAYERS, N, ROWS = 30, 64, 200
# The virtual cluster's tests share one xdist worker: each job is 3-4 processes on 2 cores.
pytestmark = pytest.mark.xdist_group("vcluster")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def shared():
    """A directory every virtual node sees (outside ``/tmp``), with a network and inputs."""
    why = vcluster.cannot_run()
    if why:
        if _in_ci():
            pytest.fail(why)
        pytest.skip(why)
    from mpisdnn import categories_of, reference_inference
    from mpisdnn.formats import hdf5

    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    d = Path(tempfile.mkdtemp(prefix="mpisdnn-vcluster-", dir=base))
    net = random_network(N, LAYERS, seed=21, density=0.15, scale=0.6)
    y0 = random_inputs(ROWS, N, seed=22)
    ref = reference_inference(y0, net)
    assert 0 < categories_of(ref).size < ROWS  # some rows die, some survive
    hdf5.write_network(d / "net.h5", net)
    hdf5.write_inputs(d / "in.h5", y0, categories_of(ref))
    # the truth after 2 layers, for the CUDA simulator (slow even on 64 neurons)
    hdf5.write_inputs(d / "in2.h5", y0, categories_of(reference_inference(y0, net, 2)))
    yield d, ref
    shutil.rmtree(d, ignore_errors=True)


def _infer(d, *extra):
    return ["infer", "--network", d / "net.h5", "--inputs", d / "in.h5", "--quiet", *extra]


def _ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _same_y(path, ref) -> bool:
    from mpisdnn.formats import hdf5

    y = hdf5.read_inputs(path)[0]
    return (
        np.array_equal(y.indptr, ref.indptr)
        and np.array_equal(y.indices, ref.indices)
        and np.array_equal(y.data.view(np.uint32), ref.data.view(np.uint32))
    )


def test_infer_2x2_pass_and_bit_identical_to_scipy(shared):
    d, ref = shared
    out = d / "2x2"
    out.mkdir()
    r = _ok(vcluster.mpisdnn("2x2", _infer(d, "--output-y", out / "y.h5",
                                           "--report", out / "r.json")))  # fmt: skip
    assert "PASS" in r.stdout
    report = json.loads((out / "r.json").read_text())
    assert report["run"]["rank_hosts"] == ["vnode0", "vnode0", "vnode1", "vnode1"]
    assert _same_y(out / "y.h5", ref)
    comm = report["communication"]
    assert sum(b > 0 for b in comm["rank_bytes"]) >= 2, comm
    assert comm["bytes"] == sum(comm["rank_bytes"]) > 0
    assert "communication" in r.stdout


def test_threads_and_weight_memory_are_per_node_4x1(shared):
    """One rank per node: each rank gets the node's cores and the node's weight share.

    Guards ``local_ranks`` in the cpu backend's default threads and in the default
    ``--weight-memory``: counted over the job (4 ranks) they would be a quarter.
    """
    from mpisdnn.sdnn.streaming import WEIGHT_SHARE
    from mpisdnn.system import available_memory, cores

    d, _ = shared
    out = d / "4x1"
    out.mkdir()
    _ok(vcluster.mpisdnn("4x1", _infer(d, "--report", out / "r.json")))
    avail = available_memory()
    report = json.loads((out / "r.json").read_text())
    assert sorted(set(report["run"]["rank_hosts"])) == [f"vnode{k}" for k in range(4)]
    assert report["backend"]["threads"] == cores()  # the whole node, not cores // 4
    # The default is WEIGHT_SHARE of the node's available memory for its one rank; other
    # users of this machine move the available memory a little between the two readings,
    # never by the factor 4 a job-wide count would make.
    share = report["memory"]["weight_memory_bytes"] / avail
    assert 0.6 * WEIGHT_SHARE < share < 1.5 * WEIGHT_SHARE, share


def test_stages_on_different_nodes(shared):
    """``--stages 2`` with rank r on vnode(r % 2): every stage hand-off crosses nodes."""
    d, ref = shared
    out = d / "stages"
    out.mkdir()
    # 2 nodes, 4 ranks placed round-robin: stage r % 2 lives on vnode(r % 2).
    r = _ok(vcluster.mpisdnn("2x1", _infer(d, "--stages", "2", "--batch-rows", "16",
                                           "--output-y", out / "y.h5", "--report",
                                           out / "r.json"), ranks=4))  # fmt: skip
    assert "PASS" in r.stdout
    report = json.loads((out / "r.json").read_text())
    hosts = report["run"]["rank_hosts"]
    assert hosts == ["vnode0", "vnode1", "vnode0", "vnode1"]
    assert _same_y(out / "y.h5", ref)
    # The accounting's stage hand-off sends are the bytes the pipeline itself says it sent.
    handoff = report["communication"]["phases"]["stage_handoff"]
    assert handoff["send_bytes"] == sum(report["pipeline"]["rank_bytes_sent"]) > 0


def test_checkpoint_on_2_nodes_resumes_on_1_and_3(shared):
    """Checkpoints written by ranks on two hosts (host-tagged temporary names, one manifest)
    resume at 1 rank on this host and on 3 virtual nodes, with the same Y."""
    d, ref = shared
    ck = d / "ck"
    ck.mkdir()
    (ck / "STOP").touch()  # checkpoint at the first layer boundary and stop (exit 75)
    args = _infer(d, "--backend", "reference", "--checkpoint", ck, "--checkpoint-every", "1e-6")
    r = vcluster.mpisdnn("2x1", args)
    assert r.returncode == 75, r.stdout + r.stderr
    done = sorted(p for p in ck.glob("ckpt-*") if (p / "manifest.json").exists())
    manifest = json.loads((done[-1] / "manifest.json").read_text())
    assert manifest["written_ranks"] == 2 and 0 < manifest["next_layer"] < LAYERS
    snapshot = d / "ck-copy"
    shutil.copytree(ck, snapshot)
    one = run_cli(["infer", "--resume", ck, "--output-y", d / "y1.h5"], ranks=1)
    assert one.returncode == 0 and "PASS" in one.stdout, one.stdout + one.stderr
    assert _same_y(d / "y1.h5", ref)
    three = _ok(vcluster.mpisdnn("3x1", ["infer", "--resume", snapshot,
                                         "--output-y", d / "y3.h5"]))  # fmt: skip
    assert "PASS" in three.stdout
    assert _same_y(d / "y3.h5", ref)


def test_sigkill_of_one_rank_ends_the_job_within_5_s(shared):
    """A rank killed on vnode1 (a node failure): the launcher ends every rank on every node
    within 5 s, exits non-zero and names the node; no Python traceback from the others."""
    d, _ = shared
    # A checkpoint at every layer boundary keeps the small problem running long enough.
    args = _infer(d, "--backend", "reference", "--checkpoint", d / "ck-kill",
                  "--checkpoint-every", "1e-6")  # fmt: skip
    proc = vcluster.start("2x2", [sys.executable, "-m", "mpisdnn", *map(str, args)])
    try:
        deadline = time.monotonic() + 120
        ranks = {}
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = vcluster.ranks_of(proc.pid)
            if len(ranks) == 4 and any((d / "ck-kill").glob("ckpt-*/manifest.json")):
                break
            time.sleep(0.05)
        assert len(ranks) == 4 and proc.poll() is None, "the job ended before the kill"
        os.kill(ranks[3], signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=30)
        ended = time.monotonic() - killed
    finally:
        if proc.returncode is None:
            vcluster.stop(proc)
    assert ended < 5, f"the job took {ended:.1f} s to end"
    assert proc.returncode != 0

    # The launcher has killed the ranks on both nodes, or does within the 5 s.
    def alive():
        return [pid for pid in ranks.values() if Path(f"/proc/{pid}").exists()]

    while time.monotonic() - killed < 5 and alive():
        time.sleep(0.05)
    # hydra's banner (on stdout) names the node of the killed rank
    assert "RUNNING AT vnode1" in out and "Traceback" not in out + err, out + err
    assert not alive(), f"ranks {alive()} outlived the job by 5 s"


def test_gpu_device_by_node_local_rank_2x1(shared):
    """The gpu backend (CUDA simulator: one device per node) picks its device by the rank's
    index on its node: two nodes with one rank each both use device 0. Counted over the job,
    2 ranks would not fit 1 device and the run would stop with an error."""
    d, _ = shared
    out = d / "gpu"
    out.mkdir()
    args = ["infer", "--network", d / "net.h5", "--inputs", d / "in2.h5", "--layers", "2",
            "--backend", "gpu", "--quiet", "--report", out / "r.json"]  # fmt: skip
    r = _ok(vcluster.mpisdnn("2x1", args, extra_env={"NUMBA_ENABLE_CUDASIM": "1"}))
    assert "PASS" in r.stdout
    backend = json.loads((out / "r.json").read_text())["backend"]
    assert backend["name"] == "gpu" and backend["device"] == 0
    assert (backend["mapping_node_rank"], backend["mapping_local_ranks"]) == (0, 1), backend


def test_leftovers_are_judged_by_their_own_host(shared):
    """A temporary file tagged ``@vnode1-PID`` with that PID dead: only a rank on vnode1 may
    call it provably stale; on vnode0 the PID proves nothing (guards the host check in
    ``mpisdnn.leftovers``). ``clean`` on 2 nodes reports it once per node."""
    d, _ = shared
    out = d / "clean"
    out.mkdir()
    dead = _dead_pid()
    leftover = out / f".h.h5.tmp@vnode1-{dead}"
    leftover.write_bytes(b"x" * 100)
    # On vnode0 alone: kept (young, and its owner is on another host).
    r = _ok(vcluster.mpisdnn("1x1", ["clean", out / "h.h5", "--yes"]))
    assert leftover.exists(), r.stdout
    assert "kept" in r.stdout
    # On vnode0 and vnode1: vnode1's rank proves its owner dead and removes it.
    r = _ok(vcluster.mpisdnn("2x1", ["clean", out / "h.h5", "--yes"]))
    assert not leftover.exists(), r.stdout
    assert "[vnode1]" in r.stdout and "[vnode0]" in r.stdout, r.stdout


def test_clean_private_tmp_on_every_node(shared, tmp_path_factory):
    """Leftovers in each node's private ``/tmp``: ``clean`` on 3 nodes finds and removes
    every node's own, not only rank 0's."""
    d, _ = shared
    private = Path(tempfile.mkdtemp(prefix="vtmp-", dir=d))
    dead = _dead_pid()
    files = []
    for k in range(3):
        node_tmp = private / f"vnode{k}"
        node_tmp.mkdir()
        f = node_tmp / f".out.h5.tmp-vnode{k}-{dead}-abcd"
        f.write_bytes(b"y" * 10)
        files.append(f)
    r = _ok(vcluster.mpisdnn("3x1", ["clean", "/tmp/out.h5", "--yes"], private_tmp=private))
    assert [f.exists() for f in files] == [False, False, False], r.stdout
    for k in range(3):
        assert f"[vnode{k}] removed 1 file(s)" in r.stdout, r.stdout


def test_project_3x1_equals_scipy(shared):
    """``project`` on 3 nodes: count weighting equal to scipy's; threads and the default
    memory bound follow the node's ranks (1 here), not the job's (3)."""
    import scipy.sparse as sp

    from mpisdnn.projection import read_projection, write_graph
    from mpisdnn.system import available_memory, cores

    from .conftest import scipy_count

    d, _ = shared
    rng = np.random.default_rng(5)
    a = sp.random(300, 120, density=0.05, random_state=rng, format="csr")
    write_graph(d / "g.mtx", a)
    _ok(vcluster.mpisdnn("3x1", ["project", d / "g.mtx", "--weight", "count",
                                 "-o", d / "h.h5", "--report", d / "p.json"]))  # fmt: skip
    got = read_projection(d / "h.h5")
    want = scipy_count(a)
    assert (got != want).nnz == 0
    report = json.loads((d / "p.json").read_text())
    assert sorted(set(report["run"]["rank_hosts"])) == ["vnode0", "vnode1", "vnode2"]
    assert report["threads_per_rank"] == cores()
    assert sum(b > 0 for b in report["communication"]["rank_bytes"]) >= 2
    bound = report["memory"]["bound_per_rank_bytes"] / available_memory()
    assert 0.3 < bound < 0.75, bound  # half the node's memory for its one rank, not a sixth


def _dead_pid() -> int:
    """A PID that no process has now (a short-lived child's, reaped)."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_jobs_of_a_dead_test_process_are_ended(tmp_path):
    """Issue 42 item 13: a killed test run left its ranks running. Every job carries its test
    process's tag; the next start ends the jobs whose test process is gone, never another
    live session's."""
    import subprocess

    dead = _dead_pid()
    orphan = subprocess.Popen(["sleep", "300"], env=dict(os.environ,
                              VCLUSTER_OWNER=f"{dead}:1"))  # fmt: skip
    mine = subprocess.Popen(["sleep", "300"], env=dict(os.environ,
                            VCLUSTER_OWNER=vcluster._owner_tag(os.getpid())))  # fmt: skip
    try:
        killed = vcluster.end_stale_jobs()
        orphan.wait(timeout=10)
        assert orphan.pid in killed and mine.pid not in killed
        assert mine.poll() is None
    finally:
        for p in (orphan, mine):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_vnode_names_that_resolve_to_this_machine_still_make_their_own_nodes(shared, tmp_path):
    """Issue 42 item 13: where ``vnode1`` resolves to this machine (an ``/etc/hosts`` entry
    left by another virtual cluster), hydra started that node's proxy itself, without the
    launcher: ``rank_hosts == ['vnode0', 'vnode0', 'vm', 'vm']``. Run here under an
    ``/etc/hosts`` naming vnode0 and vnode1 as 127.0.0.1: every rank still reports its node."""
    import subprocess

    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + "\n127.0.0.1 vnode0 vnode1\n")
    probe = [sys.executable, "-c", "import os, socket; "
             "os.write(1, ('HOST=' + socket.gethostname() + ';').encode())"]  # fmt: skip
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
           *vcluster.command("2x2", probe)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=vcluster.env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    import re

    got = sorted(re.findall(r"HOST=([^;]*);", r.stdout))
    assert got == ["vnode0", "vnode0", "vnode1", "vnode1"], r.stdout
