"""Facts about this process and node: ranks per node, default threads, memory use.

One helper per job, shared by inference, projection, reports and benchmarks.
"""

from __future__ import annotations

import os
import resource
import sys

__all__ = [
    "node_comm",
    "local_ranks",
    "node_rank",
    "cores",
    "default_threads",
    "peak_rss_bytes",
    "pss_bytes",
]


def node_comm(comm):
    """The ranks of ``comm`` that share this node (``MPI_COMM_TYPE_SHARED``)."""
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED)


def _rank_and_size_on_node(comm) -> tuple[int, int]:
    node = node_comm(comm)
    try:
        return node.rank, node.size
    finally:
        node.Free()


def local_ranks(comm) -> int:
    """Number of ranks of ``comm`` sharing this node."""
    return _rank_and_size_on_node(comm)[1]


def node_rank(comm) -> int:
    """This rank's index among the ranks of ``comm`` on its node (for device mapping)."""
    return _rank_and_size_on_node(comm)[0]


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def default_threads(local: int) -> int:
    """Cores per rank on this node (at least 1): ranks sharing a node never oversubscribe."""
    return max(1, cores() // max(1, int(local)))


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def pss_bytes(pid: int | None = None) -> int | None:
    """Proportional set size (shared pages split between their users), or ``None``.

    PSS counts a memory-mapped file shared by the ranks of a node once in total, where RSS
    counts it once per rank. Linux only (``/proc/PID/smaps_rollup``).
    """
    path = f"/proc/{pid or 'self'}/smaps_rollup"
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
