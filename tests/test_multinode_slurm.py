"""The sbatch scripts on a 2-node virtual Slurm (``scripts/slurm_start.sh --nodes 2``).

Two ``slurmd -N vnodeK``, each in its own UTS and mount namespace (hostname vnodeK, a
private ``/etc/hosts`` naming both), one slurmctld. A job with one task per node runs on two
hosts that MPI and mpisdnn see as two nodes: hydra's ``mpiexec`` in the batch script reads the
node list from Slurm and starts its proxy on the second node with ``srun``.
"""

import json
import os
import socket
import subprocess
import time

import pytest

from .test_slurm import (
    ROOT,
    SLURM_DIR,
    TINY,
    Cluster,
    _cannot_set_up,
    _in_ci,
    _status,
    register_cluster,
    stop_stale_clusters,
)

NODES = 2
# With test_slurm.py on one xdist worker: one cluster start at a time on a 2-core machine.
pytestmark = pytest.mark.xdist_group("slurm")


def _free_ports(count: int) -> int:
    """A port P with P .. P+count-1 free (slurmctld, then one slurmd per node)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count >= 65000:
            continue
        try:
            for k in range(1, count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + k))
        except OSError:
            continue
        return port
    return 6917


@pytest.fixture(scope="module")
def vslurm(tmp_path_factory):
    """A running 2-node virtual Slurm (started here, stopped at the end)."""
    why = _cannot_set_up() or (None if _have_unshare() else "no unshare (util-linux)")
    if why:
        pytest.skip(why)
    stop_stale_clusters()
    state = tmp_path_factory.mktemp("vslurm")
    entry = register_cluster(state)
    port = _free_ports(NODES + 1)
    start = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "scripts" / "slurm_start.sh"), "--nodes", str(NODES), str(state)],
        env=dict(os.environ, MPISDNN_SLURM_PORT=str(port)),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        message = f"could not start a {NODES}-node Slurm:\n{proc.stdout}{proc.stderr}"
        subprocess.run([str(ROOT / "scripts" / "slurm_stop.sh"), str(state)], check=False)
        entry.unlink(missing_ok=True)
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield Cluster(state, port, time.monotonic() - start)
    finally:
        subprocess.run([str(ROOT / "scripts" / "slurm_stop.sh"), str(state)],
                       capture_output=True, check=False, timeout=120)  # fmt: skip
        entry.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def vdata(tmp_path_factory):
    """Generated once by the first job, reused by the next."""
    return tmp_path_factory.mktemp("vslurm-data")


def _have_unshare() -> bool:
    from shutil import which

    return which("unshare") is not None


def test_slurm_sees_two_idle_nodes(vslurm):
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=vslurm.env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert sorted(proc.stdout.split()) == ["idle", "idle", "vnode0", "vnode1"], proc.stdout


#: srun --mpi=pmi2 across the two virtual nodes of one machine: in whole-suite runs on the
#: development VM its PMI-2 exchange arrived garbled ("mpi/pmi2: value not properly
#: terminated", then a UCX assertion and a hang), while the same test alone passes. Not
#: root-caused; srun with PMI-2 stays covered on one node (test_slurm.py), two nodes through
#: hydra above. MPISDNN_TEST_VSRUN=1 runs it.
VSRUN = pytest.mark.skipif(
    os.environ.get("MPISDNN_TEST_VSRUN") != "1",
    reason="srun PMI-2 on virtual nodes is flaky in whole-suite runs (MPISDNN_TEST_VSRUN=1)",
)


@pytest.mark.parametrize("launcher", ["mpiexec", pytest.param("srun", marks=VSRUN)])
def test_infer_cpu_on_two_nodes(vslurm, vdata, tmp_path, launcher):
    """infer-cpu.sbatch with one rank per node, through hydra (its proxies started by srun)
    and through ``srun --mpi=pmi2``: PASS, and the ranks on two distinct hosts."""
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", vdata, "--launcher", launcher, *TINY]
    proc, log = vslurm.sbatch(
        SLURM_DIR / "infer-cpu.sbatch", args, tmp=tmp_path,
        sbatch_args=[f"--nodes={NODES}", "--ntasks-per-node=1"],
    )  # fmt: skip
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    report = json.loads((out / "report.json").read_text())
    assert report["check"]["status"] == "PASS", report["check"]
    assert report["run"]["rank_hosts"] == ["vnode0", "vnode1"]
    info = json.loads((out / "versions.json").read_text())
    assert info["ranks"] == 2
