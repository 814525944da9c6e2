"""``python -m mpisdnn`` is the same as the ``mpisdnn`` command.

Nothing heavy is imported before the SIGINT and SIGTERM handlers and the watchdog are
installed (see :mod:`mpisdnn._signals`): a Ctrl-C (or ``kill``) while numpy, scipy or the MPI
library load ends the process with one line and exit code 130 (143) instead of a
``KeyboardInterrupt`` traceback and a launcher reporting a segfault or waiting forever.
"""

import sys

from ._signals import (
    exit_code,
    exit_if_requested,
    exit_now,
    ignore_interrupts,
    init_mpi,
    install_exit_now,
    interrupted,
    report_interrupt,
    start_watchdog,
)
from .kernel_cache import configure_cache_dir


def console_main() -> None:
    """Entry point of the ``mpisdnn`` console script and of ``python -m mpisdnn``."""
    install_exit_now()
    start_watchdog()
    # Before numba is imported (it reads NUMBA_CACHE_DIR once): kernels compiled by the first
    # run are kept where this user can write them.
    configure_cache_dir()
    try:
        from .cli import main

        init_mpi()
        exit_if_requested()  # a signal during start-up: this rank has joined MPI_Init now
        code = main()
    except KeyboardInterrupt:  # raised between the command's own handling and the next line
        exit_now()
    # Every output is written by now. A signal during MPI_Finalize and interpreter teardown is
    # ignored: ending one rank here would leave the others spinning in MPI_Finalize forever.
    ignore_interrupts()
    if interrupted() and code != exit_code():  # some library code swallowed the interrupt
        report_interrupt()
        code = exit_code()
    sys.exit(code)


if __name__ == "__main__":
    console_main()
