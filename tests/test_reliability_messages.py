"""The check of every error message the suite provokes (issue 42 item 12): no Python repr
(``np.int64(3)``, ``None``), no ``[Errno N]``, no bare exception name on a line a user reads.

tests/conftest.py fails any test whose run created such a message, in-process or in a job it
started (tests/_messages). These tests show the check itself catches them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from mpisdnn.errors import InputError, UsageError

from ._messages import record
from .conftest import ROOT, mpiexec


@pytest.mark.raw_messages
def test_in_process_errors_are_recorded_and_judged():
    before = len(record.created)
    UsageError("layers must be a positive integer, got np.int64(3)")
    InputError("x.h5: attribute ymax must be a number, found None")
    InputError("x.h5: 3 layers, 4 expected")
    got = record.messages(record.created[before:])
    assert len(got) == 3
    assert len(record.offenders(got)) == 2
    for text in ("OSError: [Errno 30] Read-only file system: 'LOCK'", "found np.float64(0.0)",
                 "FileExistsError: [Errno 17] File exists", "<class 'int'>"):  # fmt: skip
        assert record.offenders([f"InputError: {text}"]), text


def test_messages_of_jobs_are_recorded(tmp_path):
    """An ``mpiexec`` job's ranks write the messages they created to the test's file."""
    log = tmp_path / "m.log"
    env = dict(os.environ, MPISDNN_TEST_MESSAGE_LOG=str(log))
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpisdnn", "infer", "--network",
           tmp_path / "missing.h5", "--inputs", tmp_path / "x.h5"]  # fmt: skip
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = log.read_text().splitlines()
    assert any("missing.h5" in ln for ln in lines), lines
    assert record.offenders(lines) == []


def test_a_test_that_provokes_a_raw_message_fails(tmp_path):
    """The conftest fixture, run on a test that provokes ``found None`` in a subprocess and
    ``np.int64`` in-process: both tests fail, naming the message."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import _messages_without_python_reprs  # noqa: F401\n"
    )
    (tmp_path / "test_raw.py").write_text(textwrap.dedent("""
        import subprocess, sys
        from mpisdnn.errors import UsageError

        def test_in_process():
            UsageError("got np.int64(3)")

        def test_in_a_job():
            subprocess.run([sys.executable, "-c",
                            "from mpisdnn.errors import InputError; InputError('found None')"],
                           check=True)

        def test_clean():
            UsageError("--layers must be a positive integer, got 3")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ["PYTHONPATH"]]))
    env.pop(record.LOG_VARIABLE, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", str(tmp_path)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert r.returncode != 0 and "2 errors" in r.stdout, r.stdout + r.stderr
    assert "ERROR test_raw.py::test_in_process" in r.stdout
    assert "ERROR test_raw.py::test_in_a_job" in r.stdout and "test_clean -" not in r.stdout
    assert "got np.int64(3)" in r.stdout and "found None" in r.stdout, r.stdout
