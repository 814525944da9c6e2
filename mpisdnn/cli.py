"""One CLI: ``mpisdnn infer|project|convert|generate|info|report|clean|challenge``.

Every sub-command is a function ``run(args, comm)`` in :mod:`mpisdnn.commands`, so tests call
them directly as well as through ``mpiexec``. Exit codes: 0 success, 1 result FAIL against the
truth, 2 usage or input error, 130 interrupted (SIGINT), 143 terminated (SIGTERM: kill, scancel,
a Slurm time limit), anything else a crash (3 for an internal error). docs/reliability.md lists
the promises behind these codes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
import warnings

from . import __version__, kernel_cache
from ._signals import interruptible
from .commands._common import resolve_args
from .parallel import abort_on_error, agree, counting, get_comm, phase

__all__ = ["main", "build_parser", "COMMANDS"]

#: The commands that compile numba kernels (the others need not import numba).
_COMPILING = ("infer", "project", "convert", "generate", "challenge")

#: Sub-command modules in :mod:`mpisdnn.commands` and the line ``--help`` gives each, in the
#: order it lists them. A module gives its own ``DESCRIPTION``, ``add_arguments(parser)`` and
#: ``run(args, comm)``.
COMMANDS = {
    "infer": "sparse DNN inference (Graph Challenge) with a truth check",
    "project": "graph projection H = A^T A (or A A^T)",
    "convert": "convert official TSV files to HDF5",
    "generate": "generate networks, inputs or graphs",
    "info": "versions, MPI, ranks/hosts, threads, backends, GPUs",
    "report": "summary table and plots from JSON run reports",
    "clean": "list or remove leftovers of killed runs next to an output",
    "challenge": "the Graph Challenge table from the official files, in one command",
}


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line plus a pointer to ``--help``.

    argparse prints the whole usage block first (6-12 lines for the sub-commands), which buries
    the one line that says what is wrong; sub-parsers inherit this class.
    """

    def error(self, message):
        from .errors import one_line

        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered.

    With ``argv``, only the command it names has its module imported and its arguments
    added (the others are listed by name and summary): importing every command's module
    took 0.3-0.5 s of each rank's start-up. Without, all are complete.
    """
    chosen = _chosen_command(argv)
    parser = OneLineParser(
        prog="mpisdnn",
        description="MPI-parallel sparse DNN inference (Graph Challenge) and graph projection.",
        epilog="Exit codes: 0 ok, 1 FAIL against truth, 2 usage/input error, 3 internal error, "
        "130 interrupted (SIGINT), 143 terminated (SIGTERM).",
    )
    parser.add_argument("--version", action="version", version=f"mpisdnn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, summary in COMMANDS.items():
        if chosen is not None and name != chosen:
            sub.add_parser(name, help=summary, description=summary)
            continue
        module = importlib.import_module(f".commands.{name}", __package__)
        module.add_arguments(sub.add_parser(name, help=summary, description=module.DESCRIPTION))
    return parser


def _chosen_command(argv):
    """The command ``argv`` names (its first word that is one), or ``None`` (``argv`` not
    given, or naming none: the full parser then gives argparse's own errors)."""
    if argv is None:
        return None
    return next((a for a in argv if a in COMMANDS), None)


def main(argv=None, comm=None) -> int:
    """Parse ``argv`` on every rank, run the command, return the exit code.

    Only rank 0 prints usage errors and ``--help``; every rank exits with the same code.
    """
    # every MPI call of the command is counted per phase for its report's communication section
    comm = counting(get_comm(comm))
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    quiet = comm.rank != 0
    sink = io.StringIO()
    try:
        with _silenced(quiet, sink):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        return _code(exc)
    try:
        with abort_on_error(comm), interruptible(), _quiet_casts():
            # flags without effect refused, defaults that hang on other flags filled: once,
            # before the command, one line from rank 0
            with phase("setup"):
                agree(comm, resolve_args, args)
            if args.command in _COMPILING:
                _watch_kernels(comm, args.command)
            code = int(args.run(args, comm) or 0)
            if args.command in _COMPILING and comm.rank == 0:
                line = kernel_cache.done_line()
                if line:
                    print(line, flush=True)
            return code
    except SystemExit as exc:  # an error every rank agreed on: already reported by rank 0
        return _code(exc)


def _watch_kernels(comm, command) -> None:
    """Time kernel compiles and cache loads for the report, announce a first compile (rank 0)
    and let one rank at a time compile (:mod:`mpisdnn.kernel_cache`)."""
    kernel_cache.install(
        announce=comm.rank == 0, estimate=kernel_cache.COMPILE_ESTIMATE_SECONDS.get(command)
    )
    kernel_cache.reset_statistics()


@contextlib.contextmanager
def _quiet_casts():
    """Hide numpy's cast warnings (NaN or huge floats cast to integers).

    The validation that follows such a cast reports the bad dataset in one line; the warning,
    printed first, would only bury it.
    """
    with warnings.catch_warnings():
        for what in ("invalid value", "overflow"):
            warnings.filterwarnings(
                "ignore", message=f"{what} encountered in cast", category=RuntimeWarning
            )
        yield


@contextlib.contextmanager
def _silenced(quiet, sink):
    if not quiet:
        yield
        return
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 2

