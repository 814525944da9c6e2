"""Bounds checked before anything is allocated or written: sizes that come from flags or
headers fail with one line instead of growing until the OOM killer or a full disk stops them;
and the checked reading of HDF5 attributes every layout shares.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np

from ..errors import InputError, UsageError

__all__ = [
    "memory_bound",
    "check_memory",
    "check_disk",
    "human_bytes",
    "plain_attr",
    "read_ymax",
    "hdf5_damage",
    "h5_object",
]

#: Share of the memory available now that one allocation may take.
MEMORY_SHARE = 0.8


def memory_bound() -> int:
    """Bytes one allocation may use: a share of the memory available on the node now."""
    try:
        import psutil

        return int(psutil.virtual_memory().available * MEMORY_SHARE)
    except ImportError:
        pass
    # psutil is only in the bench extra: MemAvailable counts the page cache the kernel can
    # drop (free pages alone refused 60,000 x 65536 inputs with 20 GiB available, 5 GiB free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * MEMORY_SHARE)
    except (OSError, ValueError, IndexError):
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages * MEMORY_SHARE)


def human_bytes(n: float) -> str:
    """``1.5 GiB`` style size."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check_memory(nbytes: float, what: str, bound=None) -> None:
    """Raise :class:`UsageError` when ``what`` would need more than ``bound`` bytes of memory."""
    bound = memory_bound() if bound is None else int(bound)
    if nbytes > bound:
        raise UsageError(
            f"{what} would need {human_bytes(nbytes)} of memory, more than the "
            f"{human_bytes(bound)} available"
        )


def check_disk(path, nbytes: float, what: str) -> None:
    """Raise :class:`UsageError` when ``what`` (about ``nbytes``) cannot fit beside ``path``."""
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    try:
        free = shutil.disk_usage(directory or ".").free
    except OSError:
        return
    if nbytes > free:
        raise UsageError(
            f"{path}: {what} needs about {human_bytes(nbytes)}, only {human_bytes(free)} free "
            f"there (no space left)"
        )


def plain_attr(v):
    """An HDF5 attribute as a plain Python value (bytes decoded, numpy scalars unwrapped)."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_ymax(path, f) -> float:
    """The file's ``ymax`` attribute (32 when absent), checked to be finite and positive."""
    from ..errors import shown

    v = f.attrs.get("ymax", 32.0)
    # A number, as layers and neurons must be integers: the text "32" is refused, not parsed
    arr = np.asarray(v)
    y = float(arr) if arr.shape == () and arr.dtype.kind in "iuf" else float("nan")
    if not np.isfinite(y) or y <= 0:
        raise InputError(f"{path}: attribute ymax must be a finite number > 0, found {shown(v)}")
    return y


def stat_or_error(path, missing: str, failed: str, follow: bool = True) -> os.stat_result:
    """``os.stat(path)`` (``os.lstat`` unless ``follow``), its failures as one line each.

    Raises
    ------
    InputError
        ``missing`` when ``path`` does not exist, ``failed`` followed by the reason for
        any other failure (no access, a loop of links).
    """
    try:
        return os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        raise InputError(missing) from None
    except OSError as exc:
        raise InputError(f"{failed}{exc.strerror or exc}") from None


@contextlib.contextmanager
def hdf5_damage(path):
    """Reading an HDF5 file's metadata inside: what the HDF5 library raises for a damaged
    file (h5py turns its errors into ``RuntimeError``, ``OSError`` or ``KeyError``: "unable
    to offset into local heap data block", "address of object past end of allocation") as
    one :class:`InputError` line naming ``path``, not an internal error. The checks inside
    raise their own lines, which pass through."""
    try:
        yield
    except (RuntimeError, OSError, KeyError) as exc:
        raise InputError(f"{path}: damaged HDF5 file (cut short or corrupt?): {exc}") from None


def h5_object(path, f, name, kind="dataset"):
    """``f[name]``, checked to be a dataset (``kind="group"``: a group): in a damaged file a
    name can lead to a named datatype or a group, whose missing ``shape`` or ``dtype`` was
    an internal error; one :class:`InputError` line naming it."""
    import h5py

    obj = f[name]
    if not isinstance(obj, h5py.Dataset if kind == "dataset" else h5py.Group):
        raise InputError(f"{path}: /{name} is not a {kind} (a damaged or foreign file?)")
    if kind == "dataset":
        try:  # a damaged type message: "Insufficient precision in available types"
            obj.dtype, obj.shape  # noqa: B018 - read here, where a failure has a name
        except (TypeError, ValueError) as exc:
            raise InputError(f"{path}: dataset /{name} has an unreadable type or shape (a "
                             f"damaged file?): {exc}") from None  # fmt: skip
    return obj
