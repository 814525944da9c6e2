"""Record every :class:`~mpisdnn.errors.MpisdnnError` a process creates (for the check of
tests/conftest.py: no Python repr, raw exception name or ``[Errno N]`` in a message a user
reads; issue 42 item 12)."""

from __future__ import annotations

import os
import re

LOG_VARIABLE = "MPISDNN_TEST_MESSAGE_LOG"

#: What a message a user reads must not contain: numpy scalar reprs (``np.int64(3)``),
#: ``None``, class reprs, an OS error's ``[Errno N]`` or a bare Python exception name.
RAW = re.compile(
    r"\bnp\.(?:u?int|float|bool|str|complex|bytes)\w*\(|\bnumpy\.\w+\(|\bNone\b|<class '"
    r"|\[Errno \d+\]|\b(?:OSError|FileExistsError|FileNotFoundError|PermissionError"
    r"|IsADirectoryError|NotADirectoryError|ValueError|KeyError|TypeError|IndexError"
    r"|MemoryError|RuntimeError|AttributeError|ZeroDivisionError|OverflowError)\b"
)

#: Errors this process created (kept alive until checked: they are few).
created: list = []
_installed = False


def install(at_exit: bool = False) -> None:
    """Make :class:`MpisdnnError` remember each instance; with ``at_exit`` write their
    messages to ``$MPISDNN_TEST_MESSAGE_LOG`` when the process exits."""
    global _installed
    if _installed:
        return
    from mpisdnn.errors import MpisdnnError

    def __new__(cls, *args, **kwargs):
        self = super(MpisdnnError, cls).__new__(cls, *args, **kwargs)
        created.append(self)
        return self

    MpisdnnError.__new__ = staticmethod(__new__)
    _installed = True
    if at_exit:
        import atexit

        atexit.register(_write, os.environ.get(LOG_VARIABLE))


def messages(errors) -> list[str]:
    """``"Class: message"`` of each error (its ``str``, as the command line prints it)."""
    out = []
    for exc in errors:
        try:
            out.append(f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - a half-built error: nothing a user reads
            continue
    return out


def _write(path) -> None:
    if not path or not created:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            for line in messages(created):
                fh.write(line.replace("\n", " | ") + "\n")
    except OSError:
        pass


def offenders(lines) -> list[str]:
    """The messages among ``lines`` that show a Python repr or a raw exception."""
    return sorted({ln for ln in lines if RAW.search(ln.split(": ", 1)[-1])})
