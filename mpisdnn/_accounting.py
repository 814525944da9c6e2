"""Communication accounting: calls and bytes per phase, for the reports' ``communication``
section. Owned by :mod:`mpisdnn.parallel`, which re-exports its public names
(:func:`counting`, :func:`phase`, :data:`PHASE_NAMES`, :class:`Accounting`,
:func:`communication_section`); nothing here makes an MPI call of its own but the one
gather of :func:`communication_section`.
"""

from __future__ import annotations

import time
from contextlib import ContextDecorator

import numpy as np

__all__ = ["counting", "phase", "Accounting", "communication_section", "PHASE_NAMES"]

# --- communication accounting ------------------------------------------------------------------
#
# Every MPI call a command makes goes through one communicator it got from :func:`counting`
# (``cli.main`` wraps the job's communicator once). The wrapper counts, per phase, the calls
# that send (collectives and point-to-point sends) and the bytes this rank contributes to them.
# The phase is the innermost :func:`phase` the caller entered; a call made outside any phase
# counts as ``"other"``. Phases are entered where the work is decided (a flow's set-up, a
# loader, the hand-off), never guessed from the module that happens to make the call: a
# wrapper such as :func:`agree` serves every phase. Sub-communicators (``Split``,
# ``Split_type``) count into the same counter.


#: The report's communication phases, in report order (:func:`phase` refuses any other name:
#: a misspelt phase would hide its calls). ``"other"`` is where calls outside every phase go.
PHASE_NAMES = (
    "setup",  # a command's checks and plan, a flow's set-up before its timed part
    "load",  # reading networks, inputs, truth, graphs, a stage's slice
    "partition",  # planning who gets what
    "layers",  # the layer loop's own decisions: group lengths, checks for identical rows
    "rebalance",  # moving rows between ranks for balance (and home again)
    "stage_handoff",  # micro-batches and rows handed between pipeline stages
    "checkpoint",  # writing and reading checkpoints
    "gather",  # categories, results and statistics after the timed part
    "projection_exchange",  # a projection's exchange and its collective writers
)
#: Collective operations (every rank calls them; bytes are what this rank puts in).
_COLLECTIVES = frozenset(
    "barrier Barrier bcast Bcast allgather Allgather Allgatherv gather Gather Gatherv scatter "
    "Scatter Scatterv allreduce Allreduce reduce Reduce alltoall Alltoall Alltoallv Alltoallw "
    "scan Scan exscan Exscan Reduce_scatter Reduce_scatter_block Iallreduce Ibarrier Ibcast "
    "Iallgather Iallgatherv Ialltoallv Igatherv Split Split_type".split()
)
#: Point-to-point sends (receives and probes are not counted: their sender counts the bytes).
_SENDS = frozenset(
    "send isend ssend issend Send Isend Ssend Issend Rsend Bsend sendrecv Sendrecv".split()
)
#: Operations whose send buffer only the root reads.
_ROOTED = frozenset("bcast Bcast Ibcast scatter Scatter Scatterv".split())

_phase_stack: list = []


class _Phase(ContextDecorator):
    """The block (or decorated function) whose MPI calls count as phase ``name``."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _phase_stack.append(self.name)
        return self

    def __exit__(self, *exc):
        _phase_stack.pop()
        return False


def phase(name: str) -> _Phase:
    """Count the MPI calls made inside the block as phase ``name``, one of
    :data:`PHASE_NAMES` (the innermost block wins; outside every block: ``"other"``).

    A context manager, or a decorator of a function all of whose calls belong to one
    phase. Raises :class:`ValueError` for a name not in :data:`PHASE_NAMES`.
    """
    if name not in PHASE_NAMES:
        raise ValueError(f"unknown communication phase {name!r}: one of {', '.join(PHASE_NAMES)}")
    return _Phase(name)


class Accounting:
    """Calls and bytes per phase on this rank:
    ``{phase: [collectives, sends, collective bytes, sent bytes, seconds in the calls]}``."""

    def __init__(self):
        self.phases: dict[str, list[int]] = {}

    def add(self, name: str, op: str, nbytes: int, seconds: float = 0.0) -> None:
        row = self.phases.setdefault(name, [0, 0, 0, 0, 0.0])
        kind = 0 if op in _COLLECTIVES else 1
        row[kind] += 1
        row[2 + kind] += int(nbytes)
        row[4] += seconds


class _CountingComm:
    """A communicator that counts what it sends into an :class:`Accounting` (see above)."""

    def __init__(self, comm, accounting: Accounting):
        self._comm = comm
        self.accounting = accounting

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in _COLLECTIVES and name not in _SENDS:
            return attr

        def counted(*args, **kwargs):
            where = _phase_stack[-1] if _phase_stack else "other"
            nbytes = self._payload(name, args, kwargs)
            start = time.perf_counter()
            result = attr(*args, **kwargs)
            # time inside the call: transfer, and waiting for the slowest rank to arrive
            self.accounting.add(where, name, nbytes, time.perf_counter() - start)
            if name in ("Split", "Split_type") and result is not None:
                return _CountingComm(result, self.accounting)
            return result

        return counted

    def _payload(self, name: str, args, kwargs) -> int:
        if name in ("barrier", "Barrier", "Ibarrier", "Split", "Split_type"):
            return 0
        root = kwargs.get("root", args[1] if name in _ROOTED and len(args) > 1 else 0)
        if name in _ROOTED and self._comm.Get_rank() != root:
            return 0
        if not args or self._comm.Get_size() == 1:
            return 0  # nothing leaves a one-rank communicator
        buf = args[0]
        if name in ("Alltoallv", "Ialltoallv") and isinstance(buf, (list, tuple)) and len(buf) > 2:
            # the block a rank addresses to itself is copied, not sent
            counts = np.asarray(buf[1], dtype=np.int64)
            mine = int(counts[self._comm.Get_rank()]) if counts.size == self._comm.Get_size() else 0
            return (int(counts.sum()) - mine) * int(getattr(buf[0], "itemsize", 1))
        if name[0].isupper() and name not in _SENDS and _is_in_place(buf) and len(args) > 1:
            return _buffer_bytes(args[1]) // max(1, self._comm.Get_size())
        return _buffer_bytes(buf) if name[0].isupper() else _object_bytes(buf)


def _is_in_place(buf) -> bool:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover
        return False
    return buf is MPI.IN_PLACE


def _buffer_bytes(spec) -> int:
    """Bytes of an mpi4py buffer spec: an array, or ``[array, counts?, displs?, type]``."""
    if isinstance(spec, (list, tuple)) and spec:
        arr = spec[0]
        counts = spec[1] if len(spec) > 2 and not isinstance(spec[1], (int, np.integer)) else None
        if counts is not None and isinstance(counts, tuple) and len(counts) == 2:
            counts = counts[0]  # (counts, displs)
        if counts is not None and hasattr(arr, "itemsize"):
            return int(np.sum(np.asarray(counts, dtype=np.int64))) * int(arr.itemsize)
        spec = arr
    nbytes = getattr(spec, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    try:
        return memoryview(spec).nbytes
    except TypeError:
        return 0


def _object_bytes(obj) -> int:
    """Bytes of a pickled message (arrays by their buffers, without pickling them)."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)) and any(isinstance(x, np.ndarray) for x in obj):
        return sum(_object_bytes(x) for x in obj)
    import pickle

    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an unpicklable object fails in the MPI call itself
        return 0


def counting(comm):
    """``comm`` wrapped so that every MPI call through it is counted (idempotent)."""
    if isinstance(comm, _CountingComm):
        return comm
    return _CountingComm(comm, Accounting())


def communication_section(comm) -> dict | None:
    """The report's ``communication`` section (collective), or None when ``comm`` does not count.

    Per phase: calls (collectives + point-to-point sends) and bytes summed over ranks, and the
    largest single rank's, with the most seconds a rank spent inside the phase's calls
    (transfer plus waiting for the others); the totals; bytes per rank. Collected on the uncounted
    communicator, so the report's own gathering is not part of what it reports.
    """
    if not isinstance(comm, _CountingComm):
        return None
    mine = {k: list(v) for k, v in comm.accounting.phases.items()}
    everyone = comm._comm.allgather(mine)
    phases = {}
    for name in (*PHASE_NAMES, "other"):
        rows = [r.get(name, [0, 0, 0, 0, 0.0]) for r in everyone]
        if not any(any(row) for row in rows):
            continue
        phases[name] = {
            "calls": sum(r[0] + r[1] for r in rows),
            "collectives": sum(r[0] for r in rows),
            "sends": sum(r[1] for r in rows),
            "bytes": sum(r[2] + r[3] for r in rows),
            "send_bytes": sum(r[3] for r in rows),
            "max_rank_calls": max(r[0] + r[1] for r in rows),
            "max_rank_bytes": max(r[2] + r[3] for r in rows),
            "max_rank_seconds": max(r[4] for r in rows),
        }
    rank_bytes = [sum(row[2] + row[3] for row in r.values()) for r in everyone]
    rank_calls = [sum(row[0] + row[1] for row in r.values()) for r in everyone]
    return {
        "phases": phases,
        "calls": sum(rank_calls),
        "bytes": sum(rank_bytes),
        "max_rank_bytes": max(rank_bytes, default=0),
        "max_rank_calls": max(rank_calls, default=0),
        "rank_bytes": rank_bytes,
        "rank_calls": rank_calls,
    }
