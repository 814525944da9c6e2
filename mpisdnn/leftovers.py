"""Find, and safely remove, the temporary files a killed run left next to its output.

Writers create their output under a temporary name and rename it when complete
(:mod:`mpisdnn.formats._atomic`, :mod:`mpisdnn.formats.projection`). A run that is killed
(``SIGKILL``, the OOM killer, a node failure) cannot remove those files; they can be large (a
projection part is as big as its share of the output). For an output ``D/B`` they are:

==========================================  ============================================
``D/.B.tmp-OWNER``, ``D/.B.tmp@OWNER``      any writer's temporary file
``D/.B.tmpdir-OWNER/``                      a ``--tsv-dir`` set being written
``D/.B.TOKEN[@OWNER].tmp``                  a text projection being assembled
``D/.B.TOKEN-rRANK[@OWNER].part``           one rank's share of a text projection
``D/B.parts/.NAME.h5.tmp-OWNER`` (or ``@``) one rank's HDF5 part being written
``D/B.parts/TOKEN-rRANK[@OWNER][.data].h5`` a finished part that the index ``B`` does not list
==========================================  ============================================

``OWNER`` is ``PID`` or ``HOST-PID[-TOKEN]`` (the projection writers tag files
``@HOST-PID``). A leftover is *stale*, and may be removed, when

- its owner names this host and that process is no longer alive (provably dead), or
- it names no owner on this host and has not been modified for ``min_age`` seconds (a live
  writer keeps touching its files; a part waiting for the index is renamed seconds before
  the index appears).

A file whose owner is alive is never removed. A PID without a host name proves nothing on a
shared file system (another node may run that PID), so such files fall under the age rule.

The projection writers tag their temporary and part names with :func:`owner_tag` instead
(``@HOST-PID``, before the extension for parts). Such a file is provably a leftover when its
host is this host and no process with its PID is alive; a rerun removes it
(:func:`remove_stale_tagged`). Files of other hosts, or of live processes, are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, replace

__all__ = [
    "Leftover",
    "find_leftovers",
    "find_leftovers_in",
    "remove_stale",
    "AUTO_MIN_AGE",
    "DEFAULT_MIN_AGE",
    "owner_tag",
    "is_stale",
    "remove_stale_tagged",
]

#: Age after which a command's rerun removes leftovers that name no live owner (one day:
#: a rerun must never delete a file that a slow concurrent run may still rename).
AUTO_MIN_AGE = 24 * 3600.0

#: Default age for ``mpisdnn clean`` (an hour; ``--min-age 0`` when no run writes the output).
DEFAULT_MIN_AGE = 3600.0

_OWNER = re.compile(r"^(?:(?P<host>.+)-)?(?P<pid>\d+)(?:-(?P<token>[0-9A-Za-z]+))?$")
_PART = re.compile(r"^[0-9A-Za-z]+-r\d+(?:@(?P<owner>[A-Za-z0-9._-]+-\d+))?(\.data)?\.h5$")
_TAG = re.compile(r"@(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)(?:\.|$)")


@dataclass(frozen=True)
class Leftover:
    """One temporary file (or empty parts directory) of an earlier run, as judged once (a
    caller that adds to the reason makes a new one)."""

    path: str
    size: int
    stale: bool
    reason: str


def _owner(suffix: str) -> tuple[str | None, int | None]:
    match = _OWNER.match(suffix)
    if not match:
        return None, None
    return match.group("host"), int(match.group("pid"))


def _host_names() -> set[str]:
    """The names writers put in temporary names for this host (node name, host name)."""
    return {os.uname().nodename, socket.gethostname(), _tag_host()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def _judge(path: str, owner: str | None, min_age: float, now: float) -> Leftover | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # removed meanwhile (by its own writer)
        return None
    size = _tree_size(path) if os.path.isdir(path) else st.st_size
    if owner is not None:
        host, pid = _owner(owner)
        if pid is not None and host in _host_names():
            if _alive(pid):
                return Leftover(path, size, False, f"in use: process {pid} is running")
            return Leftover(path, size, True, f"process {pid} on this host is gone")
    age = now - st.st_mtime
    if age >= min_age:
        return Leftover(path, size, True, f"unmodified for {_duration(age)}")
    return Leftover(path, size, False, f"modified {_duration(age)} ago: may be in use")


def _tree_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def _duration(seconds: float) -> str:
    from .progress import format_duration

    return format_duration(max(0.0, seconds))


def _index_parts(index: str) -> set[str] | None:
    """Part names the projection index lists; ``None`` if the index cannot be read."""
    try:
        import h5py

        with h5py.File(index, "r") as f:
            if "parts" not in f:
                return set()
            names = []
            for key in ("files", "data_files"):  # index parts, and data parts when separate
                if key in f["parts"]:
                    names += list(f["parts"][key][()])
    except Exception:  # noqa: BLE001 - missing, corrupt or not HDF5: nothing is referenced
        return None
    return {os.path.basename(n.decode() if isinstance(n, bytes) else str(n)) for n in names}


def find_leftovers(output, min_age: float = DEFAULT_MIN_AGE) -> list[Leftover]:
    """Every leftover of earlier runs writing ``output``, judged stale or not.

    Parameters
    ----------
    output : path-like
        The output file the runs were writing (it need not exist).
    min_age : float
        Seconds without modification after which a file naming no live owner is stale.
    """
    output = os.path.abspath(os.fspath(output))
    directory, base = os.path.split(output)
    now = time.time()
    quoted = re.escape(base)
    tag = r"(?:@(?P<owner>[A-Za-z0-9._-]+-\d+))?"  # text projection files: @HOST-PID
    beside = [
        re.compile(rf"^\.{quoted}\.tmp[-@](?P<owner>.+)$"),
        re.compile(rf"^\.{quoted}\.tmpdir-(?P<owner>.+)$"),
        re.compile(rf"^\.{quoted}\.[0-9A-Za-z]+{tag}\.tmp$"),
        re.compile(rf"^\.{quoted}\.[0-9A-Za-z]+-r\d+{tag}\.part$"),
    ]
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        for pattern in beside:
            match = pattern.match(name)
            if match:
                owner = match.group("owner")
                item = _judge(os.path.join(directory, name), owner, min_age, now)
                if item is not None:
                    found.append(item)
                break
    found += _parts_leftovers(output, min_age, now)
    return found


#: Temporary names of any output ``X`` (the ``beside`` patterns of :func:`find_leftovers`
#: without the output's name): what ``mpisdnn clean DIR`` looks for inside ``DIR``.
_ANY_TEMP = [
    re.compile(r"^\..+\.tmp[-@](?P<owner>[A-Za-z0-9._-]+)$"),
    re.compile(r"^\..+\.tmpdir-(?P<owner>[A-Za-z0-9._-]+)$"),
    re.compile(r"^\..+\.[0-9A-Za-z]+(?:@(?P<owner>[A-Za-z0-9._-]+-\d+))?\.tmp$"),
    re.compile(r"^\..+\.[0-9A-Za-z]+-r\d+(?:@(?P<owner>[A-Za-z0-9._-]+-\d+))?\.part$"),
]


def find_leftovers_in(directory, min_age: float = DEFAULT_MIN_AGE) -> list[Leftover]:
    """Every leftover of any output written into ``directory`` (``D/.X.tmp-OWNER`` and the
    other temporary names of :func:`find_leftovers`, whatever ``X`` is), judged stale or
    not: what ``mpisdnn clean DIR`` lists (it used to look only beside ``DIR``)."""
    directory = os.path.abspath(os.fspath(directory))
    now = time.time()
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for name in names:
        for pattern in _ANY_TEMP:
            match = pattern.match(name)
            if match:
                item = _judge(os.path.join(directory, name), match.group("owner"), min_age, now)
                if item is not None:
                    found.append(item)
                break
    return found


def _parts_leftovers(output: str, min_age: float, now: float) -> list[Leftover]:
    parts_dir = output + ".parts"
    if not os.path.isdir(parts_dir) or os.path.islink(parts_dir):
        return []
    listed = _index_parts(output) if os.path.exists(output) else set()
    temp = re.compile(r"^\..+\.h5\.tmp[-@](?P<owner>.+)$")
    found = []
    for name in sorted(os.listdir(parts_dir)):
        path = os.path.join(parts_dir, name)
        match = temp.match(name)
        if match:
            item = _judge(path, match.group("owner"), min_age, now)
        elif (part := _PART.match(name)) and listed is not None and name not in listed:
            item = _judge(path, part.group("owner"), min_age, now)
            if item is not None:
                item = replace(item, reason="not listed by the index; " + item.reason)
        else:
            continue
        if item is not None:
            found.append(item)
    return found


def remove_stale(output, min_age: float = DEFAULT_MIN_AGE) -> list[str]:
    """Remove the stale leftovers of ``output`` (and, for a directory, of the outputs in it:
    :func:`find_leftovers_in`); return the paths removed.

    An empty ``OUTPUT.parts`` directory that the output does not need is removed as well.
    Files that vanish meanwhile are skipped (their writer removed them).
    """
    removed = []
    items = find_leftovers(output, min_age)
    if os.path.isdir(output) and not os.path.islink(output):
        items += find_leftovers_in(output, min_age)
    for item in items:
        if not item.stale:
            continue
        try:
            if os.path.isdir(item.path) and not os.path.islink(item.path):
                shutil.rmtree(item.path)
            else:
                os.remove(item.path)
        except FileNotFoundError:
            continue
        removed.append(item.path)
    parts_dir = os.path.abspath(os.fspath(output)) + ".parts"
    if removed and os.path.isdir(parts_dir) and not os.listdir(parts_dir):
        try:
            os.rmdir(parts_dir)
        except OSError:  # a writer created a file meanwhile
            pass
    return removed


# --- owner-tagged names (``@HOST-PID``) of the projection writers ---------------------------


def _tag_host() -> str:
    """This host's node name as it appears in a tag (dots kept, other characters replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename) or "host"


def owner_tag() -> str:
    """``@<host>-<pid>`` of this process (hostname dots kept, other characters replaced)."""
    return f"@{_tag_host()}-{os.getpid()}"


def is_stale(name: str) -> bool:
    """True when ``name`` carries this host's tag and its process is gone."""
    m = _TAG.search(name)
    if m is None:
        return False
    return m["host"] == _tag_host() and not _alive(int(m["pid"]))


def remove_stale_tagged(directory, prefix: str, keep=()) -> list:
    """Remove the regular files in ``directory`` starting with ``prefix`` that are stale.

    Only names tagged by :func:`owner_tag` can be stale (:func:`is_stale`). Returns the names
    removed. Errors (a file already gone, no permission) are ignored: this is housekeeping,
    never a reason to fail a run.
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
