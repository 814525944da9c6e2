"""SIGTERM handled like SIGINT, the watchdog, checkpoints on SIGTERM (issue 31).

``kill``, ``scancel`` and Slurm's time limit send SIGTERM: exit 143 with the one line
``mpisdnn: terminated``, temporaries removed, the previous output intact; with
``--checkpoint`` a checkpoint at the next layer-group boundary first. A rank blocked inside an
MPI call cannot run a Python handler: the watchdog thread ends it. docs/reliability.md §5.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpisdnn.formats import write_inputs, write_network
from mpisdnn.generate import digit_images, radixnet

from .test_reliability import (
    _descendants,
    _interrupted_lines,
    _loading_numpy,
    _rank_pid,
    _start,
    _wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _ends(proc, timeout=90) -> str:
    """Wait for the job; a hung one is killed (with its ranks) and the test fails."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the job did not end within {timeout} s of the signal")
    return err


def _all_lines(stderr: str) -> list[str]:
    """Every line the job printed on stderr: the promise is one line, not one line of ours
    (issue 42 item 11: MPICH's ``Abort(143) on node 0 …`` line came after it at 2 ranks)."""
    _interrupted_lines(stderr)  # no traceback
    return [ln for ln in stderr.splitlines() if ln.strip()]


def _terminated(proc) -> None:
    """SIGTERM to the launcher (what scancel does): exit 143, the one line."""
    proc.send_signal(signal.SIGTERM)
    err = _ends(proc)
    assert proc.returncode == 143, err
    assert _all_lines(err) == ["mpisdnn: terminated"], err


@linux_only
def test_sigterm_while_numpy_loads_exits_143_with_one_line(tmp_path):
    proc = _start(["generate", "network", "--layers", "2", "-o", tmp_path / "n.h5"])
    assert _wait_for(lambda: _loading_numpy(proc.pid) or proc.poll() is not None)
    _terminated(proc)
    assert list(tmp_path.iterdir()) == []


@linux_only
@pytest.mark.parametrize("ranks", [1, 2])
def test_sigterm_while_writing_keeps_the_previous_output(tmp_path, ranks):
    """Was: exit 15 (-15), no line, the writer's temporary file left (sweep G7, G8)."""
    out = tmp_path / "n.h5"
    write_network(out, radixnet(1024, 2))
    before = out.read_bytes()
    argv = ["generate", "network", "--neurons", "1024", "--layers", "3000", "-o", out]
    proc = _start(argv, ranks)

    def writing():
        return any(p.name.startswith(".n.h5.tmp") for p in tmp_path.iterdir())

    if not _wait_for(lambda: writing() or proc.poll() is not None) or proc.poll() is not None:
        proc.communicate()
        pytest.skip("the write finished before the test saw its temporary file")
    _terminated(proc)
    assert [p.name for p in tmp_path.iterdir()] == ["n.h5"]
    if out.read_bytes() != before:  # the signal landed after the rename: complete, not mixed
        from mpisdnn.formats import read_network

        assert len(read_network(out)) == 3000


@linux_only
@pytest.mark.parametrize("ranks", [2])
def test_sigterm_while_converting_leaves_no_temporary(tmp_path, ranks):
    """Issue 42 item 10: 1 of 15 SIGTERMs of ``mpiexec -n 2 mpisdnn convert network`` left
    ``.x.h5.tmp-...`` (rank 1 aborted while rank 0, the writer, sat in a collective). Every
    rank now knows the temporary and removes it; the job ends 143 with one line."""
    from mpisdnn.formats.tsv import write_triples

    src = tmp_path / "neuron1024"
    src.mkdir()
    for k, w in enumerate(radixnet(1024, 48, seed=3).layers):
        write_triples(src / f"n1024-l{k + 1}.tsv", w)
    out = tmp_path / "x.h5"
    proc = _start(["convert", "network", src, "-o", out], ranks)

    def writing():
        return any(p.name.startswith(".x.h5.tmp") for p in tmp_path.iterdir())

    if not _wait_for(lambda: writing() or proc.poll() is not None) or proc.poll() is not None:
        proc.communicate()
        pytest.skip("the conversion finished before the test saw its temporary file")
    _terminated(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) in (["neuron1024"], ["neuron1024", "x.h5"])


def _problem(tmp_path, rows=1500):
    net, y0 = tmp_path / "n.h5", tmp_path / "in.h5"
    write_network(net, radixnet(1024, 120, seed=1))
    write_inputs(y0, digit_images(rows, 1024, seed=2))
    return net, y0


@linux_only
def test_sigterm_with_checkpoint_writes_one_then_exits_143_and_resume_is_exact(tmp_path):
    """Slurm's time limit without ``--signal``: SIGTERM, then SIGKILL after KillWait (30 s).
    Was: exit 15 and no checkpoint at all; now a checkpoint at the next boundary, 143."""
    from mpi4py import MPI

    from mpisdnn.cli import main
    from mpisdnn.formats import read_categories

    net, y0 = _problem(tmp_path)
    ck = tmp_path / "ck"
    argv = ["infer", "--network", net, "--inputs", y0, "--backend", "reference", "--quiet"]
    # a checkpoint at every boundary: the first one shows the layer loop runs
    proc = _start([*argv, "--checkpoint", ck, "--checkpoint-every", "0.000001"], ranks=2)
    started = _wait_for(lambda: any(ck.glob("ckpt-*")) or proc.poll() is not None)
    if not started or proc.poll() is not None:
        proc.communicate()
        pytest.skip("the run ended before the test could signal it")
    proc.send_signal(signal.SIGTERM)
    err = _ends(proc)
    assert proc.returncode == 143, err
    lines = _all_lines(err)
    assert len(lines) == 1 and lines[0].startswith("mpisdnn: terminated: stopped on request")
    assert f"--resume {ck}" in lines[0], lines
    assert not (ck / "STOP").exists()
    # the resume (one rank, the cpu backend) gives the categories of an uninterrupted run
    got, want = tmp_path / "resumed.tsv", tmp_path / "whole.tsv"
    assert main(["infer", "--resume", str(ck), "--quiet", "--categories-out", str(got)],
                MPI.COMM_SELF) == 0  # fmt: skip
    whole = ["infer", "--network", str(net), "--inputs", str(y0), "--quiet"]
    assert main([*whole, "--categories-out", str(want)], MPI.COMM_SELF) == 0
    assert np.array_equal(read_categories(got), read_categories(want))
    assert read_categories(want).size > 0


@linux_only
def test_rank_blocked_in_an_mpi_call_still_ends(tmp_path):
    """Rank 0 is stopped, so rank 1 waits for it inside a collective, where Python cannot run
    a signal handler; a signal to rank 1 must still end the job (the watchdog), not hang.
    Rank 1 alone would have ended it after ``RANK0_WORD_SECONDS``; the watchdog needs longer,
    which shows that it was the watchdog."""
    from mpisdnn._signals import WATCHDOG_SECONDS

    net, y0 = _problem(tmp_path, rows=3000)
    ck = tmp_path / "ck"
    argv = ["infer", "--network", net, "--inputs", y0, "--backend", "reference", "--quiet"]
    proc = _start([*argv, "--checkpoint", ck, "--checkpoint-every", "0.000001"], ranks=2)
    started = _wait_for(lambda: any(ck.glob("ckpt-*")) or proc.poll() is not None)
    rank0, rank1 = _rank_pid(proc.pid, 0), _rank_pid(proc.pid, 1)
    if not started or proc.poll() is not None or rank0 is None or rank1 is None:
        proc.communicate()
        pytest.skip("the run ended before the test could signal it")
    os.kill(rank0, signal.SIGSTOP)
    try:
        # every boundary writes a checkpoint with rank 0: none for 2 s, rank 1 is blocked
        assert _wait_for(lambda: _unchanged_for(ck, 2.0), timeout=60)
        t0 = time.monotonic()
        os.kill(rank1, signal.SIGINT)  # SIGTERM would wait for a checkpoint (deferred)
        err = _ends(proc, timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank0, signal.SIGCONT)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 >= WATCHDOG_SECONDS["run"] - 1, err  # the watchdog ended it
    assert "Traceback" not in err


_seen: dict = {}


def _unchanged_for(directory: Path, seconds: float) -> bool:
    names = sorted(p.name for p in directory.iterdir())
    now = time.monotonic()
    if _seen.get("names") != names:
        _seen.update(names=names, since=now)
    return now - _seen["since"] >= seconds


#: ``sitecustomize`` of the next tests: rank 1 only marks a file, then is slow (``SLOW_SECONDS``)
#: where ``SLOW_AT`` says, as a rank slowed down by load is: ``command``, in
#: ``cli.build_parser`` (past MPI_Init, before the command); ``mpi``, inside the import of
#: ``mpi4py.MPI`` (the entry point's ``init_mpi``, before MPI_Init).
_SLOW_RANK1 = """
import os, sys, time, importlib.abc, importlib.util

AT = os.environ["SLOW_AT"]
NAME = {"command": "mpisdnn.cli", "mpi": "mpi4py.MPI"}[AT]


def _slow():
    open(os.environ["SLOW_MARK"], "w").close()
    time.sleep(float(os.environ["SLOW_SECONDS"]))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # mpi4py has a finder of its own (MPI ABIs)
        loader = spec.loader
        if AT == "mpi":
            create = loader.create_module

            def create_module(spec):
                _slow()
                return create(spec)

            loader.create_module = create_module
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            build = module.build_parser

            def slow(*args, **kwargs):
                _slow()
                return build(*args, **kwargs)

            module.build_parser = slow

        loader.exec_module = exec_module
        return spec


if os.environ.get("PMI_RANK") == "1":
    sys.meta_path.insert(0, _Finder())
"""


def _start_slow_rank1(tmp_path, at, seconds):
    """``generate network`` at 2 ranks with rank 1 slowed (``_SLOW_RANK1``); returns the job
    once rank 1 is inside the slow part, and the output's path."""
    from .conftest import mpiexec

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_RANK1)
    mark = tmp_path / "rank1-slow"
    env = dict(os.environ, PYTHONPATH=f"{hook}{os.pathsep}{ROOT}", SLOW_MARK=str(mark),
               SLOW_AT=at, SLOW_SECONDS=str(seconds))  # fmt: skip
    env.pop("PYTHONWARNINGS", None)
    out = tmp_path / "n.h5"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpisdnn", "generate", "network",
           "--layers", "2", "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    assert _wait_for(lambda: mark.exists() or proc.poll() is not None, timeout=60)
    return proc, out


@linux_only
def test_sigterm_while_rank_0_waits_for_a_rank_still_starting_is_one_line(tmp_path):
    """Was (the CI's soak test, load 5.4): rank 0 had started the command and waited for rank
    1 in its first collective, where it cannot speak; rank 1, still starting, exited after
    a fixed 2 s and the job ended with 143 and no line. Rank 1 now waits for rank 0's word
    and, with none, prints the line itself."""
    proc, out = _start_slow_rank1(tmp_path, "command", 30)
    time.sleep(1.0)  # rank 0 reaches the command's first collective meanwhile
    assert proc.poll() is None
    _terminated(proc)
    assert not out.exists()


@linux_only
def test_sigint_to_one_rank_inside_its_mpi_import_does_not_hang(tmp_path):
    """Was (a soak try, load 3): SIGINT to rank 1 alone while its entry point imported
    mpi4py.MPI. The handler tried to join MPI_Init from inside that import, where mpi4py
    cannot be imported again, exited, and rank 0 waited in MPI_Init forever. Now rank 1 goes
    on, joins MPI_Init, then ends the job with the one line (rank 0 got no signal: no word)."""
    proc, out = _start_slow_rank1(tmp_path, "mpi", 3)
    rank1 = _rank_pid(proc.pid, 1)
    assert rank1 is not None and proc.poll() is None
    os.kill(rank1, signal.SIGINT)
    err = _ends(proc, timeout=40)
    assert proc.returncode == 130, err
    assert _all_lines(err) == ["mpisdnn: interrupted"], err
    assert not out.exists()


@linux_only
def test_signal_soak_short(tmp_path):
    """The soak script in small: SIGTERM / SIGINT at random moments, start-up included (the
    race that reverted the first SIGTERM handling: hydra hung). 0 hangs, every try clean."""
    import json

    out = tmp_path / "soak.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak_signals.py"), "--tries", "3",
         "--layers", "300", "--max-delay", "2.5", "--targets", "mpiexec,group", "--seed", "7",
         "--json", str(out)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    summary = json.loads(out.read_text())["summary"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hang" not in summary["verdicts"], summary


@linux_only
def test_interrupted_projection_leaves_nothing(tmp_path):
    """Was (sweep G5, issue 31 item 3): a 2-rank projection stopped by Ctrl-C or SIGTERM
    left the ranks' part temporaries (~920 MB at scale 16): rank 0 aborted the job while
    the other rank was still inside the kernel. Now every rank cleans up first."""
    from mpi4py import MPI

    from mpisdnn.cli import main

    graph = tmp_path / "g.h5"
    assert main(["generate", "rmat", "--scale", "14", "-o", str(graph)], MPI.COMM_SELF) == 0
    out = tmp_path / "p.h5"
    proc = _start(["project", graph, "-o", out, "--quiet"], ranks=2)
    parts = tmp_path / "p.h5.parts"

    def writing():
        return parts.is_dir() and len([p for p in parts.iterdir() if ".tmp" in p.name]) >= 2

    if not _wait_for(lambda: writing() or proc.poll() is not None) or proc.poll() is not None:
        proc.communicate()
        pytest.skip("the projection finished before the test saw its part files")
    _terminated(proc)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p != graph)
    assert left in ([], ["p.h5.parts"]), left


@linux_only
@pytest.mark.parametrize("ranks,signalled", [(2, 1), (3, 0)])
def test_sigterm_to_one_rank_of_a_checkpointed_run_is_one_exit_code(tmp_path, ranks, signalled):
    """Issue 42 item 9: SIGTERM to one rank only (a node's slurmstepd, ``kill`` of one PID).
    The checkpoint is written, and every rank exits 143: the launcher's code is 143 (was
    rank 0's 75 ORed with rank 1's 143 by hydra: 207, which no script recognises)."""
    from .test_reliability import _rank_pid

    net, y0 = _problem(tmp_path)
    ck = tmp_path / "ck"
    argv = ["infer", "--network", net, "--inputs", y0, "--backend", "reference", "--quiet",
            "--checkpoint", ck, "--checkpoint-every", "0.000001"]  # fmt: skip
    proc = _start(argv, ranks=ranks)
    started = _wait_for(lambda: any(ck.glob("ckpt-*")) or proc.poll() is not None)
    pid = _rank_pid(proc.pid, signalled)
    if not started or proc.poll() is not None or pid is None:
        proc.communicate()
        pytest.skip("the run ended before the test could signal it")
    os.kill(pid, signal.SIGTERM)
    err = _ends(proc)
    assert proc.returncode == 143, err
    lines = _all_lines(err)
    assert len(lines) == 1 and lines[0].startswith("mpisdnn: terminated: stopped on request")
    assert f"--resume {ck}" in lines[0], lines
    assert any(ck.glob("ckpt-*/manifest.json"))
