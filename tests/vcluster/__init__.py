"""A virtual multi-node cluster on one machine, for the multi-node tests.

MPICH's hydra starts one proxy per host through a launcher; :file:`node.sh` is that launcher:
it runs the proxy of virtual node ``vnodeK`` in its own UTS namespace (``unshare --uts``),
so ``gethostname()``, ``MPI_Get_processor_name`` and ``MPI_Comm_split_type(SHARED)`` see K
separate nodes, and, when asked, in a private mount namespace whose ``/tmp`` is
``TMP/vnodeK`` (node-local files are then really node-local). Everything lives in the
proxies' namespaces: the host's hostname and ``/tmp`` are never touched, and the namespaces
end with the job.

The shape ``"2x2"`` means 2 nodes with 2 ranks each (ranks 0-1 on vnode0, 2-3 on vnode1).
Needs Linux, root (``unshare``) and hydra (the ``mpich`` wheel's ``mpiexec``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

NODE_SH = Path(__file__).resolve().parent / "node.sh"


def cannot_run() -> str | None:
    """Why this machine cannot run a virtual cluster, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the virtual cluster needs Linux namespaces"
    if os.geteuid() != 0:
        return "the virtual cluster needs root (unshare --uts, mount)"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux) on PATH"
    exe = mpiexec()
    if exe is None or shutil.which("hydra_pmi_proxy", path=os.path.dirname(exe)) is None:
        return "no MPICH hydra mpiexec next to this Python (the mpich wheel)"
    probe = subprocess.run(
        ["unshare", "--uts", "--mount", "sh", "-c", "hostname vnode-probe && hostname"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0 or probe.stdout.strip() != "vnode-probe":
        return f"unshare --uts --mount does not work here: {probe.stderr.strip()}"
    return None


def mpiexec() -> str | None:
    """This interpreter's hydra ``mpiexec`` (the venv's), or the first on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=here) or shutil.which("mpiexec")


def hosts(shape: str) -> list[str]:
    """``"3x1"`` -> ``["vnode0:1", "vnode1:1", "vnode2:1"]`` (nodes x ranks per node)."""
    nodes, per_node = (int(x) for x in shape.split("x"))
    return [f"vnode{k}:{per_node}" for k in range(nodes)]


def command(shape: str, argv, ranks: int | None = None) -> list[str]:
    """The ``mpiexec`` command line running ``argv`` on the virtual nodes of ``shape``.

    With ``ranks`` larger than the slots, hydra fills the hosts round-robin again (``2x1``
    with ``ranks=4``: ranks 0 and 2 on vnode0, 1 and 3 on vnode1).
    """
    nodes, per_node = (int(x) for x in shape.split("x"))
    n = ranks or nodes * per_node
    return [
        mpiexec(), "-launcher", "ssh", "-launcher-exec", str(NODE_SH),
        "-hosts", ",".join(hosts(shape)), "-n", str(n), *map(str, argv),
    ]  # fmt: skip


def env(private_tmp=None, extra=None) -> dict:
    """Environment of a virtual-cluster job: no enclosing MPI job's variables, optional
    private ``/tmp`` per node under ``private_tmp``."""
    out = dict(os.environ)
    for key in list(out):
        if key.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_CVAR_", "VCLUSTER_")):
            del out[key]
    if private_tmp is not None:
        out["VCLUSTER_TMP"] = str(private_tmp)
    out.update(extra or {})
    return out


def start(shape, argv, private_tmp=None, ranks=None, extra_env=None) -> subprocess.Popen:
    """Start a job in the background, in its own session (so :func:`stop` ends all of it)."""
    return subprocess.Popen(
        command(shape, argv, ranks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(private_tmp, extra_env), start_new_session=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the job's whole session (mpiexec, proxies, ranks) and reap mpiexec."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def run(shape, argv, private_tmp=None, ranks=None, extra_env=None, timeout=180):
    """Run a job to its end; returns the CompletedProcess (the job is killed on timeout)."""
    proc = start(shape, argv, private_tmp, ranks, extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    finally:
        if proc.returncode is None:
            stop(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def mpisdnn(shape, argv, **kwargs):
    """``python -m mpisdnn ARGV`` on the virtual nodes of ``shape``."""
    return run(shape, [sys.executable, "-m", "mpisdnn", *map(str, argv)], **kwargs)


def ranks_of(root_pid: int) -> dict[int, int]:
    """``{rank: pid}`` of the MPI ranks started under ``root_pid`` (``PMI_RANK`` of each)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = {}, [root_pid]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environ = dict(
                        item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item
                    )
            except OSError:
                continue
            if b"PMI_RANK" in environ and Path(f"/proc/{pid}/exe").resolve().name.startswith(
                "python"
            ):
                found[int(environ[b"PMI_RANK"])] = pid
    return found
