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

Set-up that does not depend on the machine's past (issue 42 item 13):

- hydra starts a host's proxy itself, without the launcher, when the name resolves to an
  address of this machine (a ``vnode1`` in ``/etc/hosts``, left by another virtual cluster,
  put that node's ranks on the real host): ``mpiexec`` runs in a private mount namespace
  whose ``/etc/hosts`` maps the vnode names to reserved addresses of no local interface;
  each proxy gets the machine's own file back (node.sh);
- a private ``/tmp`` keeps the paths the job needs (the venv, the repository, when they are
  under ``/tmp``: a clone there) visible (``VCLUSTER_KEEP``, node.sh);
- every job carries ``VCLUSTER_OWNER`` (this process): jobs of a test process that died
  (killed, interrupted) are ended when the next one starts, and this process ends its own
  at exit.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

NODE_SH = Path(__file__).resolve().parent / "node.sh"
ROOT = NODE_SH.parents[2]
#: Virtual node names that get a masked /etc/hosts entry (vnode0 .. vnodeK-1).
MAX_NODES = 64
_OWNER_VARIABLE = "VCLUSTER_OWNER"
_started: list = []
_state: dict = {}


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
    with ``ranks=4``: ranks 0 and 2 on vnode0, 1 and 3 on vnode1). ``mpiexec`` runs with
    the masked ``/etc/hosts`` (:func:`masked_hosts`), so every proxy goes through node.sh.
    """
    nodes, per_node = (int(x) for x in shape.split("x"))
    n = ranks or nodes * per_node
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$0" /etc/hosts && exec "$@"', masked_hosts(),
        mpiexec(), "-launcher", "ssh", "-launcher-exec", str(NODE_SH),
        "-hosts", ",".join(hosts(shape)), "-n", str(n), *map(str, argv),
    ]  # fmt: skip


def masked_hosts() -> str:
    """This machine's ``/etc/hosts`` without any vnode name, and ``vnodeK`` mapped to an
    address of the reserved block 240.0.0.0/4 that no interface of this machine has (a
    TEST-NET address is no good: sandboxes give them to their interfaces), in a file of this
    process (removed at exit)."""
    if "hosts" not in _state:
        vnode = re.compile(r"\bvnode\d+\b")
        try:
            with open("/etc/hosts") as fh:
                lines = [ln.rstrip("\n") for ln in fh if not vnode.search(ln)]
        except OSError:
            lines = ["127.0.0.1 localhost"]
        local = _local_addresses()
        free = (a for a in (f"240.0.{k // 250}.{k % 250 + 1}" for k in range(4 * MAX_NODES))
                if a not in local)  # fmt: skip
        for k in range(MAX_NODES):
            lines.append(f"{next(free)} vnode{k}")
        folder = tempfile.mkdtemp(prefix="vcluster-hosts-")
        path = os.path.join(folder, "hosts")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        atexit.register(shutil.rmtree, folder, True)
        _state["hosts"] = path
    return _state["hosts"]


def _local_addresses() -> set[str]:
    """IPv4 addresses of this machine's interfaces (``/proc/net/fib_trie``'s LOCAL hosts)."""
    found, last = set(), None
    try:
        with open("/proc/net/fib_trie") as fh:
            for line in fh:
                word = line.strip()
                if word.startswith("|--"):
                    last = word[3:].strip()
                elif "host LOCAL" in word and last:
                    found.add(last)
    except OSError:
        pass
    return found


def _kept_paths() -> list[str]:
    """Paths a job needs that a private ``/tmp`` would hide when they lie under ``/tmp``: the
    interpreter's environment, the repository, mpiexec's folder, ``PYTHONPATH``."""
    paths = [sys.prefix, sys.base_prefix, str(ROOT), os.path.dirname(mpiexec() or "")]
    paths += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    out = []
    for p in paths:
        for q in {p, os.path.realpath(p)} if p else ():
            if q.startswith("/tmp/") and q not in out:
                out.append(q)
    return out


def _owner_tag(pid: int) -> str | None:
    """``PID:START`` of a live process (its start time tells a reused PID apart)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return f"{pid}:{fh.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def end_stale_jobs() -> list[int]:
    """SIGKILL the processes of virtual-cluster jobs whose test process is gone (a killed or
    interrupted earlier run left them: ranks spinning, proxies). Returns their PIDs."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        tag = next((v[len(_OWNER_VARIABLE) + 1 :] for v in env
                    if v.startswith(_OWNER_VARIABLE.encode() + b"=")), None)  # fmt: skip
        if tag is None:
            continue
        pid = tag.decode(errors="replace").split(":")[0]
        if pid.isdigit() and _owner_tag(int(pid)) == tag.decode(errors="replace"):
            continue  # its test process still runs
        try:
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
        except OSError:
            pass
    return killed


def _end_own_jobs() -> None:
    for proc in _started:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def env(private_tmp=None, extra=None) -> dict:
    """Environment of a virtual-cluster job: no enclosing MPI job's variables, optional
    private ``/tmp`` per node under ``private_tmp``."""
    out = dict(os.environ)
    for key in list(out):
        if key.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_CVAR_", "VCLUSTER_")):
            del out[key]
    if private_tmp is not None:
        out["VCLUSTER_TMP"] = str(private_tmp)
        out["VCLUSTER_KEEP"] = ":".join(_kept_paths())
    out["VCLUSTER_HOSTS_MASKED"] = "1"
    out[_OWNER_VARIABLE] = _owner_tag(os.getpid()) or str(os.getpid())
    out.update(extra or {})
    return out


def start(shape, argv, private_tmp=None, ranks=None, extra_env=None) -> subprocess.Popen:
    """Start a job in the background, in its own session (so :func:`stop` ends all of it).

    Jobs that earlier test processes left running are ended first; this one ends when this
    process exits, whatever ends it (short of SIGKILL: then the next start ends it)."""
    if not _state.get("reaped"):
        end_stale_jobs()
        atexit.register(_end_own_jobs)
        _state["reaped"] = True
    proc = subprocess.Popen(
        command(shape, argv, ranks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(private_tmp, extra_env), start_new_session=True,
    )  # fmt: skip
    _started.append(proc)
    return proc


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
