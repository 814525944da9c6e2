"""SIGINT handling of the command line: exit code 130 with one line, at any moment.

Two handlers, switched by the entry point and :func:`mpisdnn.cli.main`:

- while the command starts (imports, MPI initialisation) and after it finished (MPI_Finalize,
  interpreter teardown) nothing needs cleaning up, so :func:`exit_now` ends the process at once;
- while the command runs, :func:`raise_interrupt` raises ``KeyboardInterrupt`` so ``finally``
  blocks remove temporary files, and :func:`mpisdnn.parallel.abort_on_error` ends the job.

This module imports only the standard library: it must load before numpy and scipy do.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

__all__ = [
    "INTERRUPTED",
    "launcher_rank",
    "exit_now",
    "report_interrupt",
    "install_exit_now",
    "ignore_interrupts",
    "interruptible",
    "interrupted",
]

#: Exit code of a run ended by SIGINT (128 + 2, what shells report for Ctrl-C).
INTERRUPTED = 130

#: How long a rank other than 0 waits before it exits during start-up or teardown, so rank
#: 0's line gets out first (the launcher forwards SIGINT to every rank and stops forwarding
#: output once one has exited). While a command runs, the ranks agree by a message instead
#: (:func:`mpisdnn.parallel.abort_on_error`).
QUIET_RANK_DELAY = 2.0

#: Delay before a ``KeyboardInterrupt`` that a callback swallowed is delivered again (long
#: enough for the callback to be over, short beside :data:`QUIET_RANK_DELAY`).
REDELIVER_SECONDS = 0.05

# Rank variables the common launchers set before MPI is initialised (MPICH's hydra, Open MPI,
# PMIx, Slurm).
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

_state = {"interrupted": False}


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 when started alone)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def exit_now(signum=None, frame=None) -> None:
    """End the process with exit code 130; rank 0 prints ``mpisdnn: interrupted``.

    ``os._exit`` skips the teardown of half-imported modules and of MPI, which is what made
    the launcher report a segfault for a Ctrl-C during start-up.
    """
    if launcher_rank() == 0:
        report_interrupt()
    else:
        time.sleep(QUIET_RANK_DELAY)
    os._exit(INTERRUPTED)


def report_interrupt() -> None:
    """Print the one line on rank 0 (``os.write``: safe inside a signal handler)."""
    if launcher_rank() == 0:
        os.write(2, b"mpisdnn: interrupted\n")


def raise_interrupt(signum, frame) -> None:
    """Run-time handler: remember the interrupt and raise ``KeyboardInterrupt``."""
    _state["interrupted"] = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether SIGINT arrived while the command ran (even if some code swallowed it)."""
    return _state["interrupted"]


def install_exit_now() -> None:
    """Make SIGINT end the process at once (start-up and teardown)."""
    _install(exit_now)


def ignore_interrupts() -> None:
    """Ignore SIGINT (after the command, while MPI finalizes)."""
    _install(signal.SIG_IGN)


@contextmanager
def interruptible():
    """While the block runs, SIGINT raises ``KeyboardInterrupt`` (clean-up runs, then 130).

    Only the handler the entry point installed is replaced, so a program that calls
    :func:`mpisdnn.cli.main` itself keeps its own handling. A ``KeyboardInterrupt`` that lands
    in a garbage-collector or weakref callback cannot propagate; Python would print it as
    "Exception ignored": it is silenced and delivered again a moment later (and, should
    something swallow it for good, raised when the block ends), so the interrupt is handled
    where every other one is (:func:`mpisdnn.parallel.abort_on_error`: one line for the job).
    After the block SIGINT is ignored: the outputs are written, and ending one rank during
    MPI_Finalize would leave the others spinning there.
    """
    if signal.getsignal(signal.SIGINT) is not exit_now:
        yield
        return
    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)
            return
        # Waiting for the block's end is not enough: the command may run for minutes (h5py's
        # weakref callbacks catch many a Ctrl-C during a write), and another rank still
        # starting up then exits alone, before any rank said why (seen under load). Raising
        # inside this hook would only be printed, so another thread delivers the signal again
        # once the callback is over.
        timer = threading.Timer(REDELIVER_SECONDS, _thread.interrupt_main, (signal.SIGINT,))
        timer.daemon = True
        timer.start()

    sys.unraisablehook = hook
    _state["interrupted"] = False
    _install(raise_interrupt)
    try:
        yield
        if _state["interrupted"]:  # swallowed on the way (a callback, a library's handler)
            raise KeyboardInterrupt
    finally:
        ignore_interrupts()
        sys.unraisablehook = previous_hook


def _install(handler) -> None:
    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: the embedding program owns signals
        pass
