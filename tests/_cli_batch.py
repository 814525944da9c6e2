"""Several ``mpisdnn`` command lines in one MPI job (:func:`tests.conftest.run_cli_batch`).

``mpiexec -n K python -m tests._cli_batch RUNS.json``: every rank runs each command line of
the JSON list in turn through :func:`mpisdnn.cli.main` on ``COMM_WORLD``, as the console entry
point does, with what each rank prints captured per command. Rank 0 then prints one line
``BATCH {"code": ..., "stdout": ..., "stderr": ...}`` per command: its own stdout, and the
stderr of every rank (rank 0's first), as ``mpiexec`` would show them.

Why: each rank of a job costs about 0.9 s of CPU to start (imports, MPI, the kernels' cache
loads), and CI has two cores. A test that runs the same kind of job several times at one
rank count (every weighting, every output format) pays that once.
"""

import contextlib
import io
import json
import os
import sys

from mpisdnn.kernel_cache import configure_cache_dir


def run_captured(argv, comm):
    """``mpisdnn.cli.main(argv, comm)`` with what this rank prints captured: ``(exit code,
    stdout, stderr)``. ``os.environ`` is restored afterwards (a command may set variables for
    its own process), so one run does not change the next. What ``tests.conftest.run_here``
    and the batch below both call."""
    from mpisdnn.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    environ = dict(os.environ)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv, comm)
    finally:
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
    return code, out.getvalue(), err.getvalue()


def main(path: str) -> int:
    configure_cache_dir()  # before numba is imported, as mpisdnn.__main__ does
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)
    for argv in runs:
        code, out, err = run_captured(argv, comm)
        errs = comm.gather(err, root=0)
        if comm.rank == 0:
            line = {"code": code, "stdout": out, "stderr": "".join(errs)}
            print("BATCH " + json.dumps(line), flush=True)
        comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
