"""A helper process beside this one (:mod:`mpisdnn._aside`): what a one-rank first run of
``mpisdnn project`` compiles the projection's kernels in while it compiles the reader's.

The risks: a helper that runs something else than asked (or in another package, whose
kernels are keyed to other files), one that takes itself for an MPI rank, one that outlives
its parent, and a command that starts it where it only costs (a warm cache, no spare core,
several ranks)."""

import os
import subprocess
import sys
import time

import pytest

import mpisdnn
from mpisdnn import _aside
from mpisdnn.cli import main
from mpisdnn.projection.options import ProjectionOptions


def _gone(pid, seconds):
    """Whether process ``pid`` has ended (or is a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_helper_runs_the_function_with_its_arguments(tmp_path):
    made = tmp_path / "made" / "here"
    helper = _aside.start("os:makedirs", str(made), 0o755)
    assert helper is not None
    assert helper.wait(60) == 0
    assert made.is_dir()


def test_helper_that_raises_exits_non_zero(tmp_path):
    helper = _aside.start("os:rmdir", str(tmp_path / "not-there"))
    assert helper.wait(60) != 0


def test_helper_environment_has_no_launcher_variables_and_this_package_first():
    env = _aside.helper_environ({"PMI_FD": "7", "PMI_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                                 "HYDRA_CONTROL_FD": "9", "PMIX_RANK": "1", "HOME": "/h",
                                 "NUMBA_CACHE_DIR": "/c", "PYTHONPATH": "/x"})  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(mpisdnn.__file__)))
    assert env == {"HOME": "/h", "NUMBA_CACHE_DIR": "/c", "PYTHONPATH": root + os.pathsep + "/x"}
    assert _aside.helper_environ({})["PYTHONPATH"] == root


def test_close_ends_a_running_helper_at_once():
    helper = _aside.start("time:sleep", 120)
    t0 = time.monotonic()
    helper.close()
    assert time.monotonic() - t0 < 10
    assert helper.proc.returncode is not None and helper.proc.returncode != 0
    helper.close()  # idempotent


def test_helper_ends_when_its_parent_dies():
    """A parent ended without closing it (a kill, ``os._exit``) leaves no helper behind."""
    code = ("import os, sys; from mpisdnn import _aside; h = _aside.start('time:sleep', 120); "
            "print(h.proc.pid, flush=True); os._exit(0)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=_aside.helper_environ(), check=True)  # fmt: skip
    assert _gone(int(out.stdout.split()[0]), 15)


def test_projection_warm_up_runs_in_a_helper():
    """The target the command names exists and takes the pickled options (a warm cache in
    the test session: the helper only loads the kernels)."""
    opts = ProjectionOptions(weight="count", onto="rows")
    helper = _aside.start("mpisdnn.projection.core:warm_up", opts)
    assert helper.wait(300) == 0


def _edges(path):
    path.write_text("".join(f"{r}\t{c}\n" for r in range(6) for c in range(r % 3, 4)))
    return path


@pytest.mark.parametrize("cached, spare, started", [(False, 1, True), (True, 1, False),
                                                    (False, 0, False)])  # fmt: skip
def test_one_rank_project_starts_the_helper_on_a_first_run_only(tmp_path, monkeypatch, cached,
                                                                 spare, started):  # fmt: skip
    from mpisdnn.projection import core

    calls = []

    class Fake:
        def close(self):
            calls.append("closed")

    def fake_start(target, *args):
        calls.append((target, args))
        return Fake()

    monkeypatch.setattr(_aside, "start", fake_start)
    monkeypatch.setattr(_aside, "spare_cpus", lambda: spare)
    monkeypatch.setattr(core, "kernels_cached", lambda: cached)
    out = tmp_path / "h.tsv"
    args = ["project", str(_edges(tmp_path / "g.tsv")), "--weight", "jaccard", "--onto",
            "rows", "-o", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert out.stat().st_size > 0
    if not started:
        assert calls == []
        return
    (target, (opts,)), closed = calls
    assert target == "mpisdnn.projection.core:warm_up" and closed == "closed"
    assert (opts.weight, opts.onto) == ("jaccard", "rows")
    assert core.warms_up(opts)


def test_one_rank_project_closes_the_helper_when_the_read_fails(tmp_path, monkeypatch):
    from mpisdnn.projection import core

    closed = []

    class Fake:
        def close(self):
            closed.append(True)

    monkeypatch.setattr(_aside, "start", lambda *a: Fake())
    monkeypatch.setattr(_aside, "spare_cpus", lambda: 1)
    monkeypatch.setattr(core, "kernels_cached", lambda: False)
    bad = tmp_path / "g.tsv"
    bad.write_text("1\t2\n3\n")
    assert main(["project", str(bad), "-o", str(tmp_path / "h.tsv"), "--quiet"]) != 0
    assert closed == [True]
