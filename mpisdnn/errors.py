"""Exception tree.

Every error a user can cause maps to :class:`MpisdnnError`; its message names the file and the
line or dataset, so the CLI can print it as one line and exit with code 2.
"""

__all__ = ["MpisdnnError", "InputError", "ShapeError", "BackendError", "UsageError"]


class MpisdnnError(Exception):
    """Base class of all errors raised on purpose by mpisdnn (exit code 2)."""

    exit_code = 2


class InputError(MpisdnnError):
    """A file is missing, malformed, truncated or of the wrong kind."""


class ShapeError(InputError):
    """Matrices or layers whose shapes do not fit together."""


class BackendError(MpisdnnError):
    """A backend was asked for that is unknown or cannot run here."""


class UsageError(MpisdnnError):
    """Command-line flags that contradict each other or are out of range."""
