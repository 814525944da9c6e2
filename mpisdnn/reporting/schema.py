"""The JSON run report: its schema version, run metadata and atomic writing.

Every report (``infer --report``, ``project --report``) is one JSON object with ``schema``
(``mpisdnn.report/N``), ``kind`` (``infer`` or ``project``) and a ``run`` section from
:func:`run_info`. Readers accept every version up to :data:`SCHEMA` (:mod:`.load`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys

from ..errors import MpisdnnError
from ..formats._atomic import atomic_path
from ..parallel import allgather

__all__ = [
    "SCHEMA",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "KINDS",
    "run_info",
    "versions",
    "write_json",
    "communication_line",
]

#: Version of the JSON report layout; bump on incompatible changes.
SCHEMA = "mpisdnn.report/1"
#: The name part of :data:`SCHEMA` and the newest version this code reads and writes.
SCHEMA_NAME, SCHEMA_VERSION = SCHEMA.split("/")[0], int(SCHEMA.split("/")[1])

#: Report kinds: one per command that writes reports.
KINDS = ("infer", "project")


def versions() -> dict:
    """Versions of mpisdnn, Python and the numerical stack (missing packages are ``None``)."""
    from .. import __version__

    out = {"mpisdnn": __version__, "python": platform.python_version()}
    for name in ("numpy", "scipy", "h5py", "mpi4py", "numba", "cupy"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception:  # noqa: BLE001 - optional packages
            out[name] = None
    try:
        from mpi4py import MPI

        out["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
        out["mpi_standard"] = "{}.{}".format(*MPI.Get_version())
    except Exception:  # noqa: BLE001
        out["mpi_library"] = None
    return out


def run_info(comm, argv=None, **extra) -> dict:
    """Command line, ranks, hosts and versions (collective: gathers host names)."""
    hosts = allgather(comm, socket.gethostname())
    info = {
        "command": " ".join(argv if argv is not None else sys.argv),
        "ranks": comm.size,
        "hosts": sorted(set(hosts)),
        # which rank ran where: stages, node-local ranks and per-node memory are read from it
        "rank_hosts": hosts,
        "platform": platform.platform(),
        "versions": versions(),
        "env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "SLURM_JOB_ID", "SLURM_NTASKS")
            if k in os.environ
        },
    }
    info.update(extra)
    return info


def communication_line(report: dict) -> str | None:
    """The summary's line on what the ranks sent (the report's ``communication`` section).

    None when the report has no such section (a library call without counting) or one rank.
    """
    c = report.get("communication")
    if not c or len(c.get("rank_bytes", ())) < 2:
        return None
    top = sorted(c["phases"].items(), key=lambda kv: -kv[1]["bytes"])[:3]
    parts = ", ".join(f"{name} {_mb(v['bytes'])}" for name, v in top if v["bytes"])
    return (
        f"  communication {_mb(c['bytes'])} in {c['calls']} calls over all ranks "
        f"(largest rank {_mb(c['max_rank_bytes'])})" + (f": {parts}" if parts else "")
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def write_json(path, obj) -> None:
    """Write JSON via a temp name + rename so a killed job never leaves half a report.

    Raises
    ------
    MpisdnnError
        The report could not be written (full disk, file size limit, I/O error): one line
        naming the file; the previous report at ``path`` is left as it was.
    """
    # Serialise first: a report that is not JSON-able is a bug, not a disk problem.
    text = json.dumps(obj, indent=2, sort_keys=False, default=_default) + "\n"
    try:
        # close() flushes: a short write (ENOSPC, EFBIG) raises here, before the rename.
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise MpisdnnError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def _default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
