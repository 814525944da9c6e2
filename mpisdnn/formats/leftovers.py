"""Names that say who wrote a file, and the safe removal of what crashed writers left behind.

Temporary and part files of the projection writers end in ``@<host>-<pid>`` (before the
extension for parts). A file is provably a leftover when its host is this host and no process
with its PID is alive: then no running writer can still own it, and a rerun removes it.
Files of other hosts, or of live processes, are never touched.
"""

from __future__ import annotations

import os
import re

__all__ = ["owner_tag", "is_stale", "remove_stale"]

_TAG = re.compile(r"@(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)(?:\.|$)")


def owner_tag() -> str:
    """``@<host>-<pid>`` of this process (hostname dots kept, other characters replaced)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename) or "host"
    return f"@{host}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(name: str) -> bool:
    """True when ``name`` carries this host's tag and its process is gone."""
    m = _TAG.search(name)
    if m is None:
        return False
    host = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename) or "host"
    return m["host"] == host and not _alive(int(m["pid"]))


def remove_stale(directory, prefix: str, keep=()) -> list:
    """Remove the regular files in ``directory`` starting with ``prefix`` that are stale.

    Returns the names removed. Errors (a file already gone, no permission) are ignored: this
    is housekeeping, never a reason to fail a run.
    """
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for name in entries:
        if not name.startswith(prefix) or name in keep or not is_stale(name):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.remove(path)
                removed.append(name)
        except OSError:
            pass
    return removed
