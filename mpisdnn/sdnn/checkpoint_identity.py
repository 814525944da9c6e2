"""Checkpoint directories that cannot be mixed up: the run's identity and an owner lock.

A checkpoint directory belongs to one run. ``DIR/RUN.json`` records that run's identity (the
network and inputs: path, size, SHA-256; the result-defining options: layers, bias, prune);
``DIR/LOCK`` names the process that uses the directory now (``host pid``). Before a run
writes checkpoints or resumes from them:

- :func:`check_target` refuses a ``--checkpoint`` path that is a file, cannot be written, or
  sits on a full file system (before any data is read);
- :func:`lock` refuses a directory in use by a live process (on this host; a lock of another
  host is refused as well, since its process cannot be checked: remove ``DIR/LOCK`` once that
  run is gone); a lock whose process is dead is taken over;
- :func:`check_identity` refuses a new run into a directory that holds another run's
  checkpoints (it would replace them, and ``--resume`` would then continue the wrong run).

The truth file is not part of the identity: it does not change the activations, and a
resume may check them against another truth. Rank 0 calls these (they touch one directory).
"""

from __future__ import annotations

import json
import os

from ..errors import UsageError
from ..formats._atomic import atomic_path
from ..paths import LOCK_FILE, RUN_FILE

__all__ = ["RUN_FILE", "LOCK_FILE", "check_target", "lock", "unlock", "check_identity"]

#: Below this many free bytes a checkpoint directory counts as full (a checkpoint of even a
#: small run needs more; refusing at once beats failing at the first checkpoint).
MIN_FREE_BYTES = 1 << 20
#: The identity entries compared (``truth`` is not: see the module docstring).
_FILES = ("network", "inputs")


def check_target(flag: str, path) -> None:
    """Refuse a checkpoint directory that is a file, not writable or on a full file system.

    Raises
    ------
    UsageError
        One line naming ``flag`` and ``path``.
    """
    from ..paths import check_writable

    path = os.fspath(path)
    check_writable(flag, path, directory=True)
    where = path
    while not os.path.isdir(where):
        up = os.path.dirname(os.path.abspath(where))
        if up == where:
            return
        where = up
    try:
        st = os.statvfs(where)
    except OSError:
        return
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
        raise UsageError(f"{flag} {path}: no space left on the file system of {where}")


def _this_host() -> str:
    return os.uname().nodename


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie, killed but not yet reaped, does not)."""
    from ..leftovers import _alive as alive

    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def lock(directory, flag: str = "--checkpoint", writes: bool = True) -> str:
    """Take ``DIR/LOCK`` for this process; returns its path (``""``: no lock taken).

    A resume that writes nothing (``writes`` false) may read a directory it cannot write
    (a read-only mount, an archive): it takes no lock there, since no run can write there.

    Raises
    ------
    UsageError
        Another live process (or a process of another host) holds the lock, or the
        directory cannot be created or written where the run must write.
    """
    import errno

    directory = os.path.abspath(os.fspath(directory))
    if flag == "--resume" and not os.path.isdir(directory):
        return ""  # nothing to lock: the resume reports the missing directory
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {directory}: cannot create it ({_reason(exc)})") from None
    path = os.path.join(directory, LOCK_FILE)
    me = f"{_this_host()} {os.getpid()}\n"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            host, pid = _owner(path)
            if host == _this_host() and pid is not None and not _alive(pid):
                try:
                    _remove(path)  # its process is gone (killed): take the directory over
                except OSError as exc:
                    if not writes:
                        return ""  # read-only: no run can write here either
                    raise UsageError(f"{flag} {directory}: cannot remove the dead run's "
                                     f"{path} ({_reason(exc)})") from None  # fmt: skip
                continue
            if host == _this_host() and pid == os.getpid():
                return path
            raise UsageError(
                f"{flag} {directory}: in use by another run (process {pid} on {host}, "
                f"{path}); wait for it, or remove {path} if that run is gone"
            ) from None
        except OSError as exc:
            if not writes and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return ""
            raise UsageError(
                f"{flag} {directory}: cannot take {path} ({_reason(exc)})"
                + ("; a run that writes checkpoints needs a writable directory" if writes else "")
            ) from None
        with os.fdopen(fd, "w") as fh:
            fh.write(me)
        return path
    raise UsageError(f"{flag} {directory}: cannot take {path} (another run took it meanwhile)")


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def unlock(directory) -> None:
    """Remove ``DIR/LOCK`` if this process holds it."""
    path = os.path.join(os.path.abspath(os.fspath(directory)), LOCK_FILE)
    host, pid = _owner(path)
    if host == _this_host() and pid == os.getpid():
        _remove(path)


def _owner(path) -> tuple[str | None, int | None]:
    try:
        with open(path) as fh:
            host, pid = fh.read().split()
        return host, int(pid)
    except (OSError, ValueError):
        return None, None


def _remove(path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _key(identity: dict) -> tuple:
    files = tuple((identity.get(k) or {}).get("sha256") for k in _FILES) + tuple(
        (identity.get(k) or {}).get("size") for k in _FILES
    )
    options = identity.get("options") or {}
    return files, options.get("layers"), options.get("bias"), bool(options.get("prune", True))


def describe(identity: dict) -> str:
    """A few words naming a run (its network, inputs and layers)."""
    net = (identity.get("network") or {}).get("path", "?")
    inputs = (identity.get("inputs") or {}).get("path", "?")
    layers = (identity.get("options") or {}).get("layers")
    return f"network {net}, inputs {inputs}, layers {layers if layers else 'all'}"


def recorded_identity(directory) -> dict | None:
    """The identity of the run that owns ``directory`` (``RUN.json``, else the newest
    complete checkpoint's manifest), or None for a directory without checkpoints."""
    directory = os.path.abspath(os.fspath(directory))
    try:
        with open(os.path.join(directory, RUN_FILE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        pass
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("ckpt-"))
    except OSError:
        return None
    for name in reversed(names):
        try:
            with open(os.path.join(directory, name, "manifest.json")) as fh:
                return json.load(fh)["identity"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def check_identity(directory, identity: dict, flag: str = "--checkpoint") -> None:
    """Refuse ``directory`` when it holds another run's checkpoints; else record ``identity``.

    Raises
    ------
    UsageError
        The recorded run differs (files or result-defining options).
    """
    directory = os.path.abspath(os.fspath(directory))
    recorded = recorded_identity(directory)
    if recorded is not None and _key(recorded) != _key(identity):
        raise UsageError(
            f"{flag} {directory}: holds the checkpoints of another run ({describe(recorded)}); "
            f"give another directory, or continue that run with --resume {directory}"
        )
    # Through the atomic writer: a full disk is one line naming RUN.json, and no temporary
    # file is left in the directory (issue 31 item 6).
    with atomic_path(os.path.join(directory, RUN_FILE)) as tmp, open(tmp, "w") as fh:
        json.dump(identity, fh, indent=1)
