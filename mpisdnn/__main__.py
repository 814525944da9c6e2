"""``python -m mpisdnn`` is the same as the ``mpisdnn`` command.

Nothing heavy is imported before the SIGINT handler is installed (see :mod:`mpisdnn._signals`):
a Ctrl-C while numpy, scipy or the MPI library load ends the process with one line and exit
code 130 instead of a ``KeyboardInterrupt`` traceback and a launcher reporting a segfault.
"""

import sys

from ._signals import (
    INTERRUPTED,
    exit_now,
    ignore_interrupts,
    install_exit_now,
    interrupted,
    report_interrupt,
)


def console_main() -> None:
    """Entry point of the ``mpisdnn`` console script and of ``python -m mpisdnn``."""
    install_exit_now()
    try:
        from .cli import main

        code = main()
    except KeyboardInterrupt:  # raised between the command's own handling and the next line
        exit_now()
    # Every output is written by now. A SIGINT during MPI_Finalize and interpreter teardown is
    # ignored: ending one rank here would leave the others spinning in MPI_Finalize forever.
    ignore_interrupts()
    if interrupted() and code != INTERRUPTED:  # some library code swallowed the interrupt
        report_interrupt()
        code = INTERRUPTED
    sys.exit(code)


if __name__ == "__main__":
    console_main()
