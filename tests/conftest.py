import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt


# SIGTERM (a CI time limit, ``kill``) ends the test run like Ctrl-C: pytest then tears the
# fixtures down, which stop the Slurm clusters and virtual-cluster jobs they started (issue
# 42 item 13: a killed run left ranks, slurmctld, slurmd and a job running).
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    try:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    except ValueError:  # not the main thread
        pass
SHARED = ROOT.parent / "shared" / "data" / "graphchallenge"


def same_csr(x, y) -> bool:
    """Bit-identical CSR matrices: shape, row pointers, column indices and values."""
    return (
        x.shape == y.shape
        and np.array_equal(x.indptr, y.indptr)
        and np.array_equal(x.indices, y.indices)
        and np.array_equal(x.data, y.data)
    )


def scipy_count(a, keep=False):
    """Plain scipy shared-neighbour counts ``PᵀP`` of ``a``'s pattern (int64, sorted), with
    the diagonal kept or dropped: the reference of the ``count`` projection."""
    pattern = (sp.csr_matrix(a) != 0).astype(np.int64)
    h = (pattern.T @ pattern).tocsr()
    if not keep:
        h.setdiag(0)
        h.eliminate_zeros()
    h.sort_indices()
    return h


def random_network(neurons, layers, seed, density=0.05, negative=True, scale=0.3):
    """Random layers with mixed-sign weights (so cancellations and negative sums happen)."""
    from mpisdnn import Network

    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(layers):
        w = sp.random(neurons, neurons, density=density, random_state=rng, dtype=np.float32)
        w.data = (w.data * scale).astype(np.float32)
        if negative:
            w.data[rng.random(w.nnz) < 0.3] *= -1
        mats.append(sp.csr_matrix(w))
    bias = rng.uniform(-0.3, 0.0, (layers, neurons)).astype(np.float32)
    return Network(mats, bias, neurons)


def random_inputs(rows, neurons, seed, density=0.1):
    rng = np.random.default_rng(seed)
    y = sp.random(rows, neurons, density=density, random_state=rng, dtype=np.float32).tocsr()
    y.data[:] = 1.0
    return y


@pytest.fixture(scope="session")
def official_dir(tmp_path_factory):
    """The official N=1024 network unpacked from ../shared (skips when absent)."""
    tar = SHARED / "neuron1024.tar.gz"
    if not tar.exists():
        pytest.skip(f"official data not present at {SHARED} (only on the developers' machines)")
    out = tmp_path_factory.mktemp("official")
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    return out / "neuron1024"


def mpiexec():
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpiexec on PATH")
    return exe


def run_cli(args, ranks=1, timeout=120, cwd=None, isolated=False):
    """Run ``mpisdnn ARGS`` on RANKS ranks; returns a :class:`subprocess.CompletedProcess`.

    Several ranks, a ``cwd`` or ``isolated=True``: ``mpiexec -n RANKS python -m mpisdnn``.
    One rank: :func:`mpisdnn.cli.main` on ``COMM_SELF`` in this process, its stdout and
    stderr captured (:func:`run_here`). The suite starts about 600 processes, about 0.9 s of
    CPU each for the imports and the kernels' cache loads, and CI has two cores: the
    in-process run skips both. A test that needs a process of its own (signals, exit
    codes set outside ``main``, peak RSS, the first-compile notice, the environment of a
    fresh process) passes ``isolated=True``.
    """
    if ranks == 1 and cwd is None and not isolated:
        return run_here(args, timeout)
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpisdnn", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_mpiexec_environ())  # fmt: skip


def _mpiexec_environ():
    """This process's environment, with what Open MPI needs to start as root."""
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run_cli_batch(runs, ranks, timeout=300):
    """Run each command line of ``runs`` in turn in one ``mpiexec -n RANKS`` job
    (:mod:`tests._cli_batch`); returns one CompletedProcess per run, in order.

    For tests that run several jobs at one rank count: the ranks start once. A job that
    does not finish every run fails the calling test with its output.
    """
    import json
    import tempfile

    argvs = [[str(a) for a in args] for args in runs]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(argvs, f)
    try:
        cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "tests._cli_batch", f.name]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=_mpiexec_environ())  # fmt: skip
    finally:
        os.unlink(f.name)
    lines = [json.loads(x[6:]) for x in proc.stdout.splitlines() if x.startswith("BATCH ")]
    assert proc.returncode == 0 and len(lines) == len(argvs), proc.stdout + proc.stderr
    return [subprocess.CompletedProcess(a, x["code"], x["stdout"], x["stderr"])
            for a, x in zip(argvs, lines)]  # fmt: skip


def run_here(args, timeout=120):
    """:func:`mpisdnn.cli.main` on ``COMM_SELF`` in this process, as :func:`run_cli` gives it:
    a CompletedProcess with the exit code and what the command printed
    (:func:`tests._cli_batch.run_captured`, which also restores ``os.environ``).

    A run still going after ``timeout`` seconds ends this test process with every thread's
    traceback on stderr (:func:`faulthandler.dump_traceback_later`): the worker's crash fails
    the test, where a hang would stop the suite.
    """
    import faulthandler

    from ._cli_batch import run_captured

    argv = [str(a) for a in args]
    if timeout:
        faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        code, out, err = run_captured(argv, self_comm())
    finally:
        if timeout:
            faulthandler.cancel_dump_traceback_later()
    return subprocess.CompletedProcess(argv, code, out, err)


def world():
    """``MPI.COMM_WORLD`` (imported lazily so serial collection needs no MPI start-up)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def self_comm():
    """``MPI.COMM_SELF``: a one-rank communicator for serial runs inside an MPI test."""
    from mpi4py import MPI

    return MPI.COMM_SELF


def run_infer(net, y, comm=None, backend="cpu", row_offset=0, g_rows=None, **options):
    """``mpisdnn.infer`` with :class:`InferOptions` built from keyword arguments."""
    from mpisdnn import InferOptions, infer

    opts = InferOptions(backend=backend, **options)
    comm = self_comm() if comm is None else comm
    return infer(net, y, comm, row_offset=row_offset, g_rows=g_rows, options=opts)


# --- every error message a test provokes, checked for Python reprs (issue 42 item 12) -------
# In this process MpisdnnError remembers its instances; in every Python process a test starts
# (mpiexec jobs, subprocesses, Slurm jobs) tests/_messages/sitecustomize.py does the same and
# writes the messages to the file $MPISDNN_TEST_MESSAGE_LOG names, one file per test. After
# each test its messages must show no numpy scalar repr, no None, no [Errno N], no bare
# Python exception name: those are what a user would read on the error line.
from ._messages import record as _record  # noqa: E402

_MESSAGES = ROOT / "tests" / "_messages"
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_MESSAGES), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)
_record.install()


@pytest.fixture(autouse=True)
def _messages_without_python_reprs(request, tmp_path_factory):
    """Fail a test whose run created an mpisdnn error message with a Python repr."""
    log = tmp_path_factory.getbasetemp() / "messages" / f"{abs(hash(request.node.nodeid))}.log"
    log.parent.mkdir(exist_ok=True)
    before = len(_record.created)
    old = os.environ.get(_record.LOG_VARIABLE)
    os.environ[_record.LOG_VARIABLE] = str(log)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_record.LOG_VARIABLE, None)
        else:
            os.environ[_record.LOG_VARIABLE] = old
    lines = _record.messages(_record.created[before:])
    del _record.created[before:]
    if log.exists():
        lines += log.read_text(encoding="utf-8", errors="replace").splitlines()
    bad = _record.offenders(lines)
    if bad and not request.node.get_closest_marker("raw_messages"):
        pytest.fail("error messages with a Python repr or a raw exception:\n" + "\n".join(bad))
