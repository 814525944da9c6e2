"""Exception tree.

Every error a user can cause maps to :class:`MpisdnnError`; its message names the file and the
line or dataset, so the CLI can print it as one line and exit with its ``exit_code`` (2 for
all of them today: see "Exit codes" in the README and docs/reliability.md).
"""

__all__ = [
    "MpisdnnError",
    "InputError",
    "ShapeError",
    "BackendError",
    "UsageError",
    "DiskFullError",
    "shown",
    "one_line",
]


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


class DiskFullError(MpisdnnError):
    """A write failed for lack of space (ENOSPC, EDQUOT, EFBIG); the message names the file.

    Not an :class:`InputError`: the inputs are fine and the same run succeeds with room on
    the disk. Exit code 2 like every error a user can mend; ``errno`` keeps the cause.
    """

    def __init__(self, errno_, message, path):
        super().__init__(f"{path}: {message}")
        self.errno = errno_


def shown(value) -> str:
    """``value`` as an error message shows it to a user: ``3``, ``-1.0``, ``nan``, ``"32"``,
    ``nothing``; never a Python repr (``np.int64(3)``, ``None``, ``b'x'``)."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        value = item()  # a numpy scalar or 0-d array
    if value is None:
        return "nothing"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = '"' + one_line(value).replace('"', '\\"') + '"'
        return text if len(text) <= 60 else text[:57] + '..."'
    if isinstance(value, (bool, int, float)):
        return str(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(int(n) for n in shape)}"
    return f"a {type(value).__name__}"


def one_line(text: str) -> str:
    """``text`` as one line: each character that is not printable (a newline, a tab, a
    control byte from a damaged file's attribute) as its escape, ``\\n``, ``\\x1f``. The
    error line a user gets is one line whatever it quotes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))  # fmt: skip
