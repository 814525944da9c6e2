"""Write-to-temp-then-rename, so an interrupted or failed writer never leaves a file that looks
complete and never replaces a previous good output.

One rule for every output path: a regular file (or a new name) is written to a temporary
sibling and renamed; a path that is not a regular file (a character device such as
``/dev/null``, a FIFO, a terminal, a socket, or a name of an open descriptor such as
``/dev/stdout``) is never replaced: a text writer writes through it, a writer that must
read its file back or seek in it (HDF5) refuses it with one line (:func:`stream_kind`).

Temporary names carry the host name, the PID and a random token and are created with
``O_EXCL``: two writers whose PIDs collide (containers, two nodes on a shared file system)
never share one. A write that runs out of space becomes one :class:`OutputError` naming the
file and "no space left", raised before anything is renamed.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
import time
from contextlib import contextmanager

import numpy as np

from .._signals import temporary
from ..errors import MpisdnnError

__all__ = [
    "stream_kind",
    "refuse_stream",
    "atomic_path",
    "atomic_h5",
    "atomic_dir",
    "temp_name",
    "owned_name",
    "OutputError",
    "no_space",
    "check_size",
    "reserve",
    "output_error",
    "output_errors",
    "H5_LIBVER",
    "h5_attrs",
]

#: The HDF5 object formats every file is written in: those of HDF5 1.8 at least, whose
#: metadata (superblock, object headers, B-trees, heaps) carries checksums, so a damaged
#: byte is a read error naming the file; and none newer than HDF5 1.10's, so the files open
#: in every HDF5 from 1.10 on. With the library's default (the 1.0 formats, no checksums)
#: one flipped byte of a 22 KB network file made the library crash (SIGSEGV, 2 of the 21,896
#: one-byte damages) or loop for ever (3), and 19 more raised what h5py cannot name.
H5_LIBVER = ("v108", "v110")

#: errno values that mean the output does not fit (disk, quota, file size limit).
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def h5_attrs(attrs: dict) -> dict:
    """``attrs`` as written into a file: text as fixed-length UTF-8 bytes. h5py writes a
    ``str`` as a variable-length string, kept in the file's global heap, which has no checksum
    in any format: a damaged byte of its header made the HDF5 library loop for ever on the
    next read of the attribute. A fixed-length one lies in the object header (checksummed,
    :data:`H5_LIBVER`); it reads back as ``bytes``, which the readers decode."""
    return {k: np.bytes_(v.encode()) if isinstance(v, str) else v for k, v in attrs.items()}


class OutputError(MpisdnnError, OSError):
    """An output could not be written completely (exit code 2, previous output kept).

    Also an ``OSError`` carrying the original ``errno``/``strerror``, so callers that handle
    write failures as ``OSError`` keep working; ``str()`` is the one-line message.
    """

    def __init__(self, message: str, code=None, strerror=None):
        OSError.__init__(self, code, strerror)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _host() -> str:
    # The full host name, as mpisdnn.leftovers expects it to prove a writer dead.
    host = socket.gethostname() or "host"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host)


def temp_name(path, kind: str = "tmp") -> str:
    """A sibling of ``path`` that no other writer (host, PID, token) will pick."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    token = secrets.token_hex(4)
    base = os.path.basename(path.rstrip(os.sep))
    return os.path.join(directory, f".{base}.{kind}-{_host()}-{os.getpid()}-{token}")


def owned_name(path, middle: str, suffix: str = "", owner: str | None = None) -> str:
    """``D/.B.<middle>@HOST-PID<suffix>``: the sibling of ``path`` (``D/B``) that a collective
    writer (the projection sinks) uses for a temporary or a rank's part.

    The owner tag (:func:`mpisdnn.leftovers.owner_tag`, this process's unless ``owner``
    names another rank's) lets a later run prove the file a leftover of a dead process
    (:func:`mpisdnn.leftovers.remove_stale_tagged`); ``middle`` carries the run's token and
    rank where several ranks write.
    """
    from ..leftovers import owner_tag

    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory, f".{base}.{middle}{owner or owner_tag()}{suffix}")


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, or an h5py error wrapping one) means the disk is full."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    text = str(exc).lower()
    return any(
        key in text
        for key in ("no space left", "errno = 28", "disk quota", "file too large", "errno = 27")
    )


def output_error(path, exc) -> OutputError:
    """The one-line :class:`OutputError` for a failed write of ``path``."""
    code = getattr(exc, "errno", None)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = getattr(exc, "strerror", None) or first
    if no_space(exc):
        return OutputError(
            f"{path}: no space left on device (previous file, if any, kept)",
            code or errno.ENOSPC,
            reason,
        )
    message = f"{path}: cannot write: {reason} (previous file, if any, kept)"
    return OutputError(message, code, reason)


def check_size(tmp, expected: int) -> None:
    """Raise ``OSError(ENOSPC)`` when ``tmp`` holds fewer than ``expected`` bytes.

    A full disk can make a library drop writes silently; a short file is the symptom.
    """
    size = os.path.getsize(tmp)
    if size < expected:
        raise OSError(errno.ENOSPC, f"file is {size} bytes, expected at least {expected}")


_FALLOC_FL_KEEP_SIZE = 1
_fallocate = None


def reserve(path, nbytes) -> None:
    """Allocate disk blocks for the first ``nbytes`` of ``path`` without changing its size.

    HDF5 cannot survive a full disk (it crashes in a later flush), so writers reserve the
    space a write will need first: a full disk then fails here, as one clean ``OSError``,
    before HDF5 writes anything. A no-op where ``fallocate`` is not available.
    """
    global _fallocate
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        limit = -1
    if 0 <= limit < nbytes and limit != getattr(resource, "RLIM_INFINITY", -1):
        # fallocate(KEEP_SIZE) ignores the file size limit; the write would not
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    if _fallocate is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            _fallocate = (fn, ctypes)
        except (OSError, AttributeError):
            _fallocate = False
    if not _fallocate or nbytes <= 0:
        return
    fn, ctypes = _fallocate
    fd = os.open(path, os.O_WRONLY)
    try:
        if fn(fd, _FALLOC_FL_KEEP_SIZE, 0, int(nbytes)) != 0:
            err = ctypes.get_errno()
            if err in _NO_SPACE:
                raise OSError(err, os.strerror(err))
            # EOPNOTSUPP, ENOSYS, ...: the file system cannot reserve; write unprotected
    finally:
        os.close(fd)


#: ``/proc/PID/fd/N`` (and ``self``, ``thread-self``, a task's): a name of an open descriptor,
#: which ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` lead to.
_DESCRIPTOR = None


def _names_descriptor(path) -> bool:
    """Whether ``path``, link by link, leads to ``/proc/*/fd/N`` (``/dev/stdout``): written
    by name, a rename would replace the link (as root: ``/dev/stdout`` itself)."""
    import re

    global _DESCRIPTOR
    if _DESCRIPTOR is None:
        _DESCRIPTOR = re.compile(r"^/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/fd/\d+$")
    current = os.path.abspath(os.fspath(path))
    for _ in range(40):  # the kernel's own limit on links followed
        head, tail = os.path.split(current)
        current = os.path.join(os.path.realpath(head), tail)
        if _DESCRIPTOR.match(current):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    return False


#: Linux's major device numbers of terminals (tty, console, pseudo-terminals).
_TERMINAL_MAJORS = {4, 5, *range(136, 144)}


def stream_kind(path) -> str | None:
    """What ``path`` is when it is not a regular file to be replaced: ``"character device"``,
    ``"FIFO"``, ``"socket"``, ``"block device"``, ``"terminal"`` or ``"open descriptor"``
    (``/dev/stdout`` and the like, whatever they lead to); ``None`` for a regular file, a
    directory or a name that does not exist yet."""
    import stat

    path = os.fspath(path)
    try:
        st = os.stat(path)
        mode = st.st_mode
    except OSError:
        mode = None
    try:
        if _names_descriptor(path):
            return "open descriptor"
    except OSError:
        pass
    if mode is None or stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISCHR(mode):
        # Told by the device number (opening a device to ask could act on it: a tape rewinds)
        major = os.major(st.st_rdev)
        return "terminal" if major in _TERMINAL_MAJORS else "character device"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "block device" if stat.S_ISBLK(mode) else "special file"


def refuse_stream(path, what: str = "this output") -> None:
    """Raise :class:`OutputError` when ``path`` is not a regular file (:func:`stream_kind`):
    for writers that cannot write through one (HDF5 seeks and reads its file back)."""
    kind = stream_kind(path)
    if kind is not None:
        raise OutputError(
            f"{path}: not a regular file ({_a(kind)}); {what} is HDF5, which cannot be written "
            f"through it and never replaces it: give a file name"
        )


def _a(kind: str) -> str:
    """``a FIFO``, ``an open descriptor``."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path, verify=None, through=None):
    """Yield a fresh temporary sibling path; rename it onto ``path`` only if all went well.

    The temporary file exists (empty, created with ``O_EXCL``) when the block starts; the
    block may overwrite it. After the block the file is synced (so deferred write errors
    surface here) and ``verify(tmp)`` runs, when given, before the rename. On any error the
    temporary file is removed and ``path`` is left as it was; an ``OSError`` becomes one
    :class:`OutputError` line naming ``path``.

    A ``path`` that is not a regular file (:func:`stream_kind`: ``/dev/null``, a FIFO,
    ``/dev/stdout``) is never replaced: with ``through`` true the block gets ``path``
    itself and writes through it (nothing is synced, verified or renamed), otherwise
    :func:`refuse_stream` refuses it. ``through`` defaults to true for a writer without
    ``verify`` (text, written once from the start), false for one with (it reads back).
    """
    path = os.fspath(path)
    if stream_kind(path) is not None:
        if not (verify is None if through is None else through):
            refuse_stream(path)
        with output_errors(path):
            yield path
        return
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = temp_name(path)
    except OSError as exc:
        raise output_error(path, exc) from None
    # The file is created inside the try: a Ctrl-C right after it exists (when a watcher sees
    # it) must still remove it. Owned from just before: a name of this host and process.
    owned = True
    try:
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as exc:
            owned = False
            raise output_error(path, exc) from None
        with output_errors(path), temporary(tmp):
            yield tmp
            os.truncate(tmp, os.path.getsize(tmp))  # frees blocks reserved past the end
            _fsync(tmp)
            if verify is not None:
                verify(tmp)
            os.replace(tmp, path)
    finally:
        if owned:
            _discard(tmp)


def _discard(tmp) -> None:
    """Remove ``tmp`` if it exists, even when a Ctrl-C lands meanwhile (it is raised after)."""
    interrupted = False
    while True:
        try:
            if os.path.lexists(tmp):
                os.remove(tmp)
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt


@contextmanager
def output_errors(path):
    """Inside the block, a failed write becomes one :class:`OutputError` naming ``path``."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise output_error(path, exc) from None
    except RuntimeError as exc:  # h5py reports some failed flushes this way
        if no_space(exc):
            raise output_error(path, exc) from None
        raise


@contextmanager
def atomic_h5(path, verify=None, reserve_bytes=0, **kwargs):
    """An ``h5py.File`` open for writing under a temporary name; renamed onto ``path`` when
    the block ends well and ``verify(tmp)`` passes.

    HDF5 buffers small raw-data writes and flushes them when objects close, where h5py can
    only print the failure ("Exception ignored") and a full disk then ends in a crash at exit.
    So the file is flushed explicitly inside the block (errors surface as exceptions), and on
    any failure the temporary file is truncated first, giving HDF5 room to close cleanly
    before the file is removed. ``reserve_bytes`` (the expected file size) is reserved on
    disk before HDF5 writes anything (:func:`reserve`).
    """
    import h5py

    refuse_stream(path)
    with atomic_path(path, verify, through=False) as tmp:
        f = h5py.File(tmp, "w", **{"libver": H5_LIBVER, **kwargs})
        try:
            reserve(tmp, reserve_bytes)
            yield f
            f.flush()
            f.close()
        except BaseException:
            abandon_h5(tmp, f)
            raise


def abandon_h5(tmp, f) -> None:
    """Close a failed HDF5 output quietly after freeing its space (see :func:`atomic_h5`)."""
    import sys

    hook = sys.unraisablehook
    sys.unraisablehook = lambda *_: None  # h5py reports failed closes from __dealloc__
    try:
        try:
            os.truncate(tmp, 0)
        except OSError:
            pass
        # The name goes before the slow close: a job killed meanwhile (an MPI abort from
        # another rank, the launcher after a Ctrl-C) then leaves no temporary file.
        _discard(tmp)
        try:
            f.close()
        except Exception:  # noqa: BLE001 - the first error is the one reported
            pass
        import gc

        gc.collect()
    finally:
        sys.unraisablehook = hook


def _remove_dead_dirs(path) -> None:
    """Remove temporary directories of ``path`` left by writers that are provably dead."""
    import re

    from ..leftovers import AUTO_MIN_AGE, _judge

    parent, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"^\.{re.escape(base)}\.(?:tmpdir|old)-(?P<owner>.+)$")
    now = time.time()
    for name in os.listdir(parent):
        m = pattern.match(name)
        full = os.path.join(parent, name)
        if m and os.path.isdir(full) and not os.path.islink(full):
            item = _judge(full, m.group("owner"), AUTO_MIN_AGE, now)
            if item is not None and item.stale:
                shutil.rmtree(full, ignore_errors=True)


@contextmanager
def atomic_dir(path, allowed=None):
    """Yield a fresh temporary directory; it replaces directory ``path`` as a whole at the end.

    ``path`` may be absent, empty, or hold only files for which ``allowed(name)`` is true
    (the outputs of an earlier run): anything else is refused before work starts, so no
    unrelated file is ever removed. Until the swap the old directory is untouched; a killed
    run leaves only a hidden temporary directory, never a set of files that looks complete.
    """
    path = os.fspath(path).rstrip(os.sep) or os.sep
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise OutputError(f"{path}: exists and is not a directory")
        foreign = [n for n in os.listdir(path) if allowed is None or not allowed(n)]
        if foreign:
            raise OutputError(
                f"{path}: holds files this command did not write (e.g. {foreign[0]!r}); "
                f"give an empty or new directory"
            )
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _remove_dead_dirs(path)
        tmp = temp_name(path, "tmpdir")
    except OSError as exc:
        raise output_error(path, exc) from None
    old = None
    owned = True  # as in atomic_path: created inside the try
    try:
        try:
            os.mkdir(tmp)
        except OSError:
            owned = False
            raise  # named below
        with temporary(tmp):
            yield tmp
        for name in os.listdir(tmp):
            _fsync(os.path.join(tmp, name))
        if os.path.lexists(path):
            old = temp_name(path, "old")
            os.rename(path, old)
        os.rename(tmp, path)
    except OSError as exc:
        if old is not None and not os.path.lexists(path):
            os.rename(old, path)
            old = None
        raise output_error(path, exc) from None
    finally:
        if owned and os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
