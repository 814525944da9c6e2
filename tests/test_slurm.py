"""The sbatch scripts in ``slurm/``, submitted to a real single-node Slurm with ``sbatch --wait``.

A session fixture starts Slurm from the distribution's packages (``scripts/slurm_start.sh``:
munge, slurmctld, slurmd; about 2 s once installed) and stops it at the end. Every script
that runs without a GPU is submitted on tiny generated data and must exit 0, leave
``status`` = ``FINISHED 0`` and a JSON report that PASSes against the truth; a broken input
must end the job with the input-error code and ``FAILED 2``.

Where Slurm cannot be set up (not root, no apt-get) the tests skip and say why; in CI
(``CI=true``) a root machine whose set-up fails is a test failure, not a skip.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import ROOT, run_cli

SLURM_DIR = ROOT / "slurm"
#: Small enough for a 2-core CI machine, big enough that some rows die and some survive.
TINY = ["--neurons", "1024", "--layers", "8", "--count", "500", "--seed", "3"]
#: Resources of every test job: the whole 2-core test node.
JOB = ["--ntasks=2", "--cpus-per-task=1", "--time=10"]
# One cluster per test session: under pytest-xdist every Slurm test goes to the same worker.
pytestmark = pytest.mark.xdist_group("slurm")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cannot_set_up() -> str | None:
    """Why this machine cannot run a Slurm of its own, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "Slurm tests need Linux"
    if os.geteuid() != 0:
        return "Slurm tests need root (they install and start slurmctld, slurmd and munge)"
    have = all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "munged"))
    if not have and not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    return None


def _free_port_pair() -> int:
    """A port P with P and P+1 free (slurmctld, slurmd), so parallel sessions do not clash."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65000:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    return 6817


def _job_env(extra=None) -> dict:
    """The environment jobs inherit: this interpreter's venv (MPISDNN_VENV), no CI noise."""
    env = dict(os.environ)
    prefix = Path(sys.prefix)
    if (prefix / "bin" / "activate").exists() and sys.prefix != sys.base_prefix:
        env["MPISDNN_VENV"] = str(prefix)
    else:
        env["MPISDNN_VENV"] = "none"
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for key in list(env):
        # Variables of an enclosing MPI job or allocation would confuse the ones in the job.
        if key.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_CVAR_", "OMPI_COMM_WORLD")):
            del env[key]
    env.update(extra or {})
    return env


class Cluster:
    def __init__(self, state: Path, port: int, setup_seconds: float):
        self.state = state
        self.port = port
        self.setup_seconds = setup_seconds
        self.env = _job_env({"SLURM_CONF": str(state / "slurm.conf")})

    def sbatch(self, script, args=(), sbatch_args=(), env=None, tmp=None, timeout=300):
        """``sbatch --wait`` SCRIPT ARGS from the repository root; returns (proc, log text)."""
        log = Path(tmp) / f"{Path(script).stem}-%j.out"
        cmd = [
            "sbatch",
            "--wait",
            "--parsable",
            f"--output={log}",
            *JOB,
            *sbatch_args,
            str(script),
            *map(str, args),
        ]
        start = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                cwd=ROOT,
                env=dict(self.env, **(env or {})),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            subprocess.run(["scancel", "--user", "root"], env=self.env, check=False)
            pytest.fail(f"{script} did not finish in {timeout} s")
        job = proc.stdout.strip().split(";")[0]
        text = Path(str(log).replace("%j", job)).read_text() if job.isdigit() else ""
        proc.seconds = time.monotonic() - start
        return proc, text


#: Where each test process names the Slurm state directories it started, so that the next
#: one can stop the clusters of a process that died (killed, interrupted) before its
#: fixtures stopped them (issue 42 item 13: a killed run left slurmctld, slurmd and a job).
REGISTRY = Path(tempfile.gettempdir()) / "mpisdnn-test-clusters"


def _process_tag(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return f"{pid}-{fh.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def stop_stale_clusters() -> list[str]:
    """Stop the Slurm clusters of test processes that are gone; returns their states."""
    stopped = []
    for entry in sorted(REGISTRY.glob("*.state")) if REGISTRY.is_dir() else []:
        tag = entry.name.split(".")[0]
        pid = tag.split("-")[0]
        if pid.isdigit() and _process_tag(int(pid)) == tag:
            continue  # that test session still runs
        state = entry.read_text().strip()
        if state and Path(state).is_dir():
            subprocess.run([str(ROOT / "scripts" / "slurm_stop.sh"), state],
                           capture_output=True, check=False, timeout=180)  # fmt: skip
            stopped.append(state)
        entry.unlink(missing_ok=True)
    return stopped


def register_cluster(state: Path) -> Path:
    """Name ``state`` as this process's cluster (removed by :func:`unregister_cluster`)."""
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    entry = REGISTRY / f"{_process_tag(os.getpid())}.{abs(hash(str(state)))}.state"
    entry.write_text(str(state))
    return entry


@pytest.fixture(scope="session")
def slurm(tmp_path_factory, request):
    """A running single-node Slurm for this session (started here, stopped at the end)."""
    why = _cannot_set_up()
    if why:
        pytest.skip(why)
    stop_stale_clusters()
    state = tmp_path_factory.mktemp("slurm")
    entry = register_cluster(state)
    port = _free_port_pair()
    start = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "scripts" / "slurm_start.sh"), str(state)],
        env=dict(os.environ, MPISDNN_SLURM_PORT=str(port)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        message = f"could not start Slurm (scripts/slurm_start.sh):\n{proc.stdout}{proc.stderr}"
        subprocess.run([str(ROOT / "scripts" / "slurm_stop.sh"), str(state)], check=False)
        entry.unlink(missing_ok=True)
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    # Say in the test log what the set-up cost (output capture would swallow a print).
    plugins = request.config.pluginmanager
    reporter, capman = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        what = "installed and started" if "installing" in proc.stdout else "started"
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"[slurm] {what} a single-node cluster in {seconds:.1f} s")
    try:
        yield Cluster(state, port, seconds)
    finally:
        subprocess.run(
            [str(ROOT / "scripts" / "slurm_stop.sh"), str(state)],
            capture_output=True,
            check=False,
            timeout=120,
        )
        entry.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Where the jobs generate their data; shared, so only the first job pays for it."""
    return tmp_path_factory.mktemp("slurm-data")


def _status(out: Path) -> str:
    return (out / "status").read_text().strip()


def _check_provenance(out: Path, ranks: int):
    for name in ("commands.sh", "config.env", "versions.json", "job.sbatch"):
        assert (out / name).is_file(), f"{name} missing in {out}"
    info = json.loads((out / "versions.json").read_text())
    assert info["ranks"] == ranks and info["versions"]["mpisdnn"]
    config = (out / "config.env").read_text()
    assert f"RANKS={ranks}" in config and "OMP_NUM_THREADS=1" in config
    assert "mpisdnn" in (out / "commands.sh").read_text()


def _passed(report_path: Path, ranks: int) -> dict:
    report = json.loads(report_path.read_text())
    assert report["schema"].startswith("mpisdnn.report/")
    assert report["check"]["status"] == "PASS", report["check"]
    assert report["run"]["ranks"] == ranks
    assert report["backend"].get("threads") == 1  # --threads from --cpus-per-task
    return report


def _cpu_scripts():
    """Every script in slurm/ that needs no GPU (its #SBATCH header asks for none)."""
    out = []
    for path in sorted(SLURM_DIR.glob("*.sbatch")):
        header = [ln for ln in path.read_text().splitlines() if ln.startswith("#SBATCH")]
        if not any(re.search(r"--(gpus|gres=gpu|gpus-per-\w+)", ln) for ln in header):
            out.append(path.name)
    return out


#: The CPU scripts this module submits; a new script in slurm/ must get a test here.
TESTED = {"infer-cpu.sbatch", "scaling.sbatch", "project.sbatch"}


def test_every_cpu_script_is_submitted():
    assert set(_cpu_scripts()) == TESTED, "add a test for each new CPU script in slurm/"


def test_scripts_are_strict_and_never_plain_srun():
    for path in SLURM_DIR.glob("*.sbatch"):
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n#SBATCH"), path.name
        assert "set -euo pipefail" in text, path.name
    common = (SLURM_DIR / "_common.sh").read_text()
    for line in common.splitlines():
        if re.match(r"\s*srun\b", line):
            assert "--mpi=" in line, f"plain srun for MPI in _common.sh: {line.strip()}"


@pytest.mark.parametrize("name", sorted(SLURM_DIR.glob("*.sbatch")), ids=lambda p: p.name)
def test_help_and_bad_option(name):
    ok = subprocess.run(["bash", str(name), "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--ranks" in ok.stdout
    bad = subprocess.run(["bash", str(name), "--frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option '--frobnicate'" in bad.stderr


def test_infer_cpu(slurm, data_dir, tmp_path):
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", data_dir, *TINY]
    proc, log = slurm.sbatch(SLURM_DIR / "infer-cpu.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    _passed(out / "report.json", 2)
    _check_provenance(out, 2)
    assert "launch 2 mpisdnn infer" in (out / "commands.sh").read_text()
    assert "PASS" in (out / "infer.log").read_text()
    assert log.count("mpisdnn infer: N=1024") == 1  # one summary: rank 0 only
    assert "\r" not in log  # batch logs stay line-oriented


def test_infer_cpu_in_stages(slurm, data_dir, tmp_path):
    """``-- --stages 2``: the script writes no checkpoints for a pipeline (mpisdnn refuses
    them there) and says so; the run PASSes in 2 stages."""
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", data_dir, *TINY, "--", "--stages", "2"]
    proc, log = slurm.sbatch(SLURM_DIR / "infer-cpu.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    report = _passed(out / "report.json", 2)
    assert report["pipeline"]["stages"] == 2
    assert "--stages 2: no checkpoints" in log
    assert "--checkpoint" not in (out / "commands.sh").read_text()


def test_infer_cpu_with_srun_pmi2(slurm, data_dir, tmp_path):
    """The srun launcher: one MPI job through Slurm's PMI-2, not two rank-0 singletons."""
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", data_dir, "--launcher", "srun", *TINY]
    proc, log = slurm.sbatch(SLURM_DIR / "infer-cpu.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    _passed(out / "report.json", 2)
    assert "srun --mpi=pmi2" in log or "launch 2" in log
    assert json.loads((out / "versions.json").read_text())["ranks"] == 2


def test_scaling(slurm, data_dir, tmp_path):
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", data_dir, *TINY]
    proc, log = slurm.sbatch(SLURM_DIR / "scaling.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    for ranks in (1, 2):
        _passed(out / f"scaling-n{ranks}.json", ranks)
    table = (out / "summary.md").read_text().splitlines()
    rows = [ln for ln in table if ln.startswith("| scaling-n")]
    assert len(rows) == 2 and all(ln.rstrip().endswith("PASS |") for ln in rows), table
    pytest.importorskip("matplotlib")
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _project_cli_ready() -> str | None:
    """None when ``mpisdnn project`` has the interface project.sbatch uses, else why not."""
    r = run_cli(["project", "--help"], ranks=1, timeout=60)
    flags = ("--onto", "--weight", "--memory-per-rank", "--report", "-o")
    missing = [f for f in flags if f not in r.stdout]
    if r.returncode != 0 or missing:
        return f"mpisdnn project lacks {', '.join(missing) or 'a working --help'} (not landed yet)"
    g = run_cli(["generate", "rmat", "--help"], ranks=1, timeout=60)
    if g.returncode != 0 or "--scale" not in g.stdout:
        return "mpisdnn generate rmat is not available yet"
    return None


def test_project(slurm, data_dir, tmp_path):
    why = _project_cli_ready()
    if why:
        pytest.skip(why)
    out = tmp_path / "out"
    args = ["--out", out, "--data-dir", data_dir, "--scale", "10", "--edge-factor", "8"]
    proc, log = slurm.sbatch(SLURM_DIR / "project.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 0, log + proc.stderr
    assert _status(out) == "FINISHED 0"
    _check_provenance(out, 2)
    report = json.loads((out / "report.json").read_text())
    assert report["schema"].startswith("mpisdnn.report/") and report["kind"] == "project"
    assert report["run"]["ranks"] == 2
    if report.get("check") is not None:
        assert report["check"]["status"] == "PASS", report["check"]
    assert (out / "projection.h5").is_file()


def test_failing_job_is_marked_failed(slurm, data_dir, tmp_path):
    """A broken input ends the job with the input-error code, FAILED 2 and one message."""
    bad = tmp_path / "bad-inputs.h5"
    r = run_cli(["generate", "network", "--neurons", "64", "--layers", "2", "-o", bad])
    assert r.returncode == 0, r.stderr
    net = run_cli(
        ["generate", "network", "--neurons", "64", "--layers", "2", "-o", tmp_path / "n.h5"]
    )
    assert net.returncode == 0
    out = tmp_path / "out"
    args = ["--out", out, "--network", tmp_path / "n.h5", "--inputs", bad]
    proc, log = slurm.sbatch(SLURM_DIR / "infer-cpu.sbatch", args, tmp=tmp_path)
    assert proc.returncode == 2, log
    assert _status(out) == "FAILED 2"
    errors = [ln for ln in log.splitlines() if ln.startswith("mpisdnn: error")]
    assert len(errors) == 1 and "not an mpisdnn.inputs file" in errors[0], log
    assert "FAILED with exit code 2" in log


def test_gpu_script_without_gpu_fails_cleanly(tmp_path):
    """infer-gpu.sbatch run as a plain script (no Slurm, no GPU): exit 2, FAILED 2, one line
    naming the problem. The scripts work outside Slurm too (defaults replace SLURM_*)."""
    from mpisdnn.backends import available

    if available().get("gpu") is True:
        pytest.skip("this machine has a usable GPU; the failure path cannot be shown")
    d = tmp_path / "data"
    r = run_cli(["generate", "network", "--neurons", "1024", "--layers", "3", "-o", d / "n.h5"])
    assert r.returncode == 0, r.stderr
    r = run_cli(
        [
            "generate",
            "inputs",
            "--neurons",
            "1024",
            "--count",
            "20",
            "--network",
            d / "n.h5",
            "-o",
            d / "in.h5",
        ]
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    env = _job_env()
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    proc = subprocess.run(
        [
            "bash",
            str(SLURM_DIR / "infer-gpu.sbatch"),
            "--out",
            str(out),
            "--ranks",
            "2",
            "--network",
            str(d / "n.h5"),
            "--inputs",
            str(d / "in.h5"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _status(out) == "FAILED 2"
    text = proc.stdout + proc.stderr
    assert "backend gpu unavailable" in text, text
    # Caught before the launch: no per-rank errors, no inference started.
    assert "mpisdnn: error" not in text and "mpisdnn infer" not in text, text


def _wait_for_status(out: Path, done, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        words = _status(out).split() if (out / "status").exists() else []
        if words and words[0] in done:
            return " ".join(words)
        time.sleep(0.2)
    return (out / "status").read_text().strip() if (out / "status").exists() else "(none)"


def test_infer_cpu_time_limit_checkpoints_and_requeues(slurm, data_dir, tmp_path):
    """The time-limit path: Slurm's ``--signal=B:USR1@T`` reaches the batch shell, the run
    checkpoints and stops (exit 75), the job requeues itself and the second run continues
    from the checkpoint to a PASS. The signal is sent the way Slurm sends it at the limit
    (``scancel --batch --signal=USR1``), as soon as the job runs, so the test does not wait
    for a real time limit."""
    header = (SLURM_DIR / "infer-cpu.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@" in header and "#SBATCH --requeue" in header
    out = tmp_path / "out"
    log = tmp_path / "infer-cpu-%j.out"
    # The reference backend steps layer by layer: a boundary (a chance to stop) per layer.
    args = ["--out", out, "--data-dir", data_dir, *TINY, "--", "--backend", "reference"]
    cmd = ["sbatch", "--parsable", f"--output={log}", *JOB,
           str(SLURM_DIR / "infer-cpu.sbatch"), *map(str, args)]  # fmt: skip
    sub = subprocess.run(cmd, cwd=ROOT, env=slurm.env, capture_output=True, text=True)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        assert _wait_for_status(out, {"RUNNING"}, 120) == "RUNNING"
        sig = subprocess.run(
            ["scancel", "--batch", "--signal=USR1", job], env=slurm.env, capture_output=True,
            text=True,
        )  # fmt: skip
        assert sig.returncode == 0, sig.stderr
        got = _wait_for_status(out, {"REQUEUED", "FINISHED", "FAILED", "STOPPED"}, 120)
        assert got == "REQUEUED 75", got
        # Slurm holds a requeued job back for a while (its begin time, and the job is still
        # completing when the status file says REQUEUED): keep moving its start to now until
        # the second run has begun, so the test never waits for Slurm's own delay.
        final = _wait_for_status(out, {"FINISHED", "FAILED", "STOPPED", "RUNNING"}, 1)
        deadline = time.monotonic() + 300
        while final.startswith("REQUEUED") and time.monotonic() < deadline:
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm.env,
                capture_output=True, text=True,
            )  # fmt: skip
            final = _wait_for_status(out, {"FINISHED", "FAILED", "STOPPED", "RUNNING"}, 2)
        final = _wait_for_status(out, {"FINISHED", "FAILED", "STOPPED"}, 300)
    finally:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True, check=False)
    text = Path(str(log).replace("%j", job)).read_text()
    assert final == "FINISHED 0", text
    assert "asking mpisdnn for a checkpoint" in text and "stopped on request" in text, text
    assert f"requeueing job {job}" in text and "continuing from the checkpoints" in text, text
    report = json.loads((out / "report.json").read_text())
    assert report["check"]["status"] == "PASS" and report["run"]["ranks"] == 2
    assert report["resumed"]["checkpoint"].startswith(str(out / "checkpoint"))
    assert 0 < report["resumed"]["next_layer"] < report["problem"]["layers"]
    assert not (out / "checkpoint" / "STOP").exists()
    commands = (out / "commands.sh").read_text()
    assert "--checkpoint" in commands and "--resume" in commands


def _job_rank_pid(job: str, rank: int) -> int | None:
    """PID of MPI rank ``rank`` (a Python process) of Slurm job ``job`` on this machine."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            exe = (d / "exe").resolve().name
        except OSError:
            continue
        if (
            exe.startswith("python")
            and f"SLURM_JOB_ID={job}".encode() in env
            and f"PMI_RANK={rank}".encode() in env
        ):
            return int(d.name)
    return None


def test_infer_cpu_sigterm_to_one_rank_is_one_exit_code(slurm, data_dir, tmp_path):
    """Issue 42 item 9: SIGTERM reaches one rank only (its node's slurmstepd, an admin's
    ``kill``): the run writes a checkpoint and every rank exits 143, so the job's status is
    ``TERMINATED 143`` (was ``FAILED 207``: hydra ORed rank 0's 75 with rank 1's 143, a code
    neither the script nor a user recognises)."""
    out = tmp_path / "out"
    log = tmp_path / "infer-cpu-%j.out"
    # Long enough to signal mid-run: a checkpoint at every layer of the reference backend.
    tiny = [a if a != "8" else "120" for a in TINY]
    args = ["--out", out, "--data-dir", data_dir, *tiny, "--checkpoint-every", "0.000001",
            "--", "--backend", "reference"]  # fmt: skip
    cmd = ["sbatch", "--parsable", f"--output={log}", *JOB,
           str(SLURM_DIR / "infer-cpu.sbatch"), *map(str, args)]  # fmt: skip
    env = dict(slurm.env, MPISDNN_REQUEUE="0")
    sub = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 240
        pid = None
        while time.monotonic() < deadline:
            done = list((out / "checkpoint").glob("ckpt-*/manifest.json"))
            pid = _job_rank_pid(job, 1) if done else None
            state = _status(out) if (out / "status").exists() else "RUNNING"
            if pid is not None or state.split()[0] != "RUNNING":
                break
            time.sleep(0.1)
        assert pid is not None, f"no rank 1 of job {job} while it ran: {_status(out)}"
        os.kill(pid, signal.SIGTERM)
        final = _wait_for_status(out, {"FINISHED", "FAILED", "STOPPED", "TERMINATED"}, 120)
    finally:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True, check=False)
    text = Path(str(log).replace("%j", job)).read_text()
    assert final == "TERMINATED 143", text
    lines = [ln for ln in text.splitlines() if ln.startswith("mpisdnn: ")]
    assert len(lines) == 1 and lines[0].startswith("mpisdnn: terminated: stopped on request")
    assert "Traceback" not in text


def test_a_cluster_left_by_a_dead_test_session_is_stopped(slurm, tmp_path):
    """Issue 42 item 13: a killed test run left slurmctld, slurmd and a job running, and the
    next run started beside them. A cluster registered by a test process that is gone is
    stopped (its job's processes too) when the next session starts its own."""
    state = tmp_path / "stale"
    port = _free_port_pair()
    r = subprocess.run([str(ROOT / "scripts" / "slurm_start.sh"), str(state)],
                       env=dict(os.environ, MPISDNN_SLURM_PORT=str(port)),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    pids = [int((state / name).read_text()) for name in ("slurmctld.pid", "slurmd.pid")]
    env = dict(slurm.env, SLURM_CONF=str(state / "slurm.conf"))
    job = subprocess.run(["sbatch", "--parsable", "--ntasks=1", "--wrap", "sleep 300",
                          f"--output={tmp_path}/job.out"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert job.returncode == 0, job.stderr
    child = subprocess.Popen(["sleep", "300"])  # a test process that will be gone
    child.kill()
    child.wait()
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    (REGISTRY / f"{child.pid}-1.stale.state").write_text(str(state))
    try:
        assert str(state) in stop_stale_clusters()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if Path(f"/proc/{p}").exists()]
        sleeper = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True)
        assert not [p for p in sleeper.stdout.split() if f"SLURM_CONF={state}".encode()
                    in Path(f"/proc/{p}/environ").read_bytes()]  # fmt: skip
    finally:
        subprocess.run([str(ROOT / "scripts" / "slurm_stop.sh"), str(state)],
                       capture_output=True, check=False, timeout=120)  # fmt: skip
