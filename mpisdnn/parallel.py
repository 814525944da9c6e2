"""The one home for MPI plumbing: communicators, error agreement, reductions, big arrays.

Library code never touches ``MPI.COMM_WORLD`` at import time; every entry point takes ``comm``
and resolves it once with :func:`get_comm`. What lives here and nowhere else:

- error agreement: :func:`agree`, :func:`agree_root`, :func:`agree_error` (a failure on one rank
  becomes one :class:`AgreedError` on all, reported once by rank 0), :func:`abort_on_error`;
- reductions by name (:func:`allreduce`, :func:`mpi_op`: ``"sum"``, ``"max"``, ``"min"``,
  ``"bor"``), for Python values and numpy arrays alike;
- small Python objects: :func:`allgather`, :func:`bcast`, :func:`gather`; per-rank counts
  (:func:`alltoall_array`); :func:`barrier`; prefix sums (:func:`exscan`);
- raw arrays point to point (:func:`send_array`, :func:`isend_array`, :func:`recv_array`),
  in-place reductions (:func:`allreduce_in_place`), the node split (:func:`split_shared`,
  :func:`split_color`) and arrays every rank of a node maps (:func:`node_shared_array`);
- array collectives of any size: :func:`allgather_array`, :func:`bcast_array`,
  :func:`gather_arrays`, :func:`alltoallv_array`; MPI counts and displacements are C ints,
  so these send in pieces below ``MAX_COUNT`` elements where a message would pass 2**31;
- communication accounting: :func:`counting` wraps a communicator so that every MPI call
  through it (these wrappers' and any direct ``comm.X``) is counted per phase, the one its
  caller entered with :func:`phase` (one of :data:`PHASE_NAMES`);
  :func:`communication_section` is the reports' ``communication`` section.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np

# The communication accounting lives in its own module; its public names are this module's.
from ._accounting import PHASE_NAMES, Accounting, communication_section, counting, phase
from ._node import SHARED_DIR, node_shared_array, split_color, split_shared
from ._signals import (
    CLEANED_TAG,
    INTERRUPT_TAG,
    RANK0_ABORT_SECONDS,
    RANK0_WORD_SECONDS,
    exit_code,
    mark_reported,
    message,
    remove_temporaries,
    silence_stderr,
)
from .errors import MpisdnnError, one_line

__all__ = [
    "get_comm",
    "agree",
    "agree_earliest",
    "agree_root",
    "AgreedError",
    "log",
    "agree_error",
    "allreduce",
    "allgather",
    "bcast",
    "gather",
    "barrier",
    "idle_barrier",
    "idle_wait",
    "alltoall_array",
    "mpi_op",
    "allgather_array",
    "bcast_array",
    "gather_arrays",
    "alltoallv_array",
    "abort_on_error",
    "counting",
    "phase",
    "Accounting",
    "communication_section",
    "PHASE_NAMES",
    "SerialComm",
    "exscan",
    "allreduce_in_place",
    "send_array",
    "isend_array",
    "recv_array",
    "split_shared",
    "split_color",
    "node_shared_array",
    "SHARED_DIR",
]


#: Pause between printing the failure and ``MPI_Abort`` (lets the launcher forward it).
ABORT_GRACE_SECONDS = 0.5
#: After SIGINT (SIGTERM), how long rank 0 waits for the other ranks' clean-up before it ends
#: the job (below the watchdog's ``WATCHDOG_SECONDS["run"]``).
CLEANUP_SECONDS = 8.0
#: Tags of rank 0's word and of the other ranks' "cleaned up" (no receive in mpisdnn uses a
#: wildcard tag).
_INTERRUPT_TAG = INTERRUPT_TAG
_CLEANED_TAG = CLEANED_TAG  # also sent by the watchdog for a blocked main thread
#: Tag of :func:`gather_arrays`' point-to-point pieces.
_GATHER_TAG = 7
#: Most elements one message, count or displacement may hold: MPI counts are C ints. Tests
#: lower it to send small arrays in many pieces.
MAX_COUNT = 2**31 - 1
#: Bytes of one piece of :func:`bcast_array` / :func:`gather_arrays` (well below 2**31).
PIECE_BYTES = 1 << 30


def get_comm(comm=None):
    """Return ``comm`` or, when ``None``, ``MPI.COMM_WORLD`` (imported lazily)."""
    if comm is not None:
        return comm
    from mpi4py import MPI

    return MPI.COMM_WORLD


class SerialComm:
    """The one-rank communicator of the library, for serial use without MPI: the few
    methods the wrappers here call on it (objects only; no array collectives).
    ``mpisdnn.projection.SerialComm`` is this class."""

    rank = 0
    size = 1

    def allgather(self, obj):
        return [obj]

    def gather(self, obj, root=0):
        return [obj]

    def bcast(self, obj, root=0):
        return obj

    def allreduce(self, obj, op=None):
        return obj

    def Barrier(self):  # noqa: N802 - mpi4py's name
        pass

    def Free(self):  # noqa: N802 - mpi4py's name; its own node communicator (split_shared)
        pass

    barrier = Barrier


class AgreedError(MpisdnnError):
    """An error every rank knows about; rank 0 reports it once and all ranks exit cleanly."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def agree(comm, fn, *args, **kwargs):
    """Run ``fn`` on every rank and make a failure on any rank a failure on all of them.

    This is how loading and validation avoid hangs: when one rank cannot read its part, the
    others would otherwise wait forever in the next collective. All ranks raise the same
    :class:`AgreedError` carrying the first failing rank's message, so only rank 0 prints it.
    """
    try:
        result = fn(*args, **kwargs)
        failure = None
    except MpisdnnError as exc:
        result = None
        failure = (str(exc), getattr(exc, "exit_code", 2))
    except (OSError, ValueError, KeyError, MemoryError) as exc:
        result = None
        failure = (failure_text(exc), 2)
    failures = comm.allgather(failure)
    failed = [(rank, item) for rank, item in enumerate(failures) if item is not None]
    if failed:
        rank, (message, code) = failed[0]
        if len(failed) < comm.size:
            message = f"(rank {rank}) {message}"
        raise AgreedError(message, code)
    return result


def agree_earliest(comm, fn, *args, **kwargs):
    """:func:`agree` for ranks that read consecutive parts of one file: the lowest failing
    rank's error (the earliest in the file) is raised on every rank without a ``(rank k)``
    prefix, since its ``file:line`` already says where."""
    try:
        result, failure = fn(*args, **kwargs), None
    except MpisdnnError as exc:
        result, failure = None, (str(exc), getattr(exc, "exit_code", 2))
    except (OSError, MemoryError) as exc:
        result, failure = None, (f"{type(exc).__name__}: {exc}", 2)
    failures = [f for f in allgather(comm, failure) if f is not None]
    if failures:
        raise AgreedError(*failures[0])
    return result


def agree_root(comm, fn, *args, root=0, idle=False, **kwargs):
    """Run ``fn`` on ``root`` only; every rank gets its result or raises the same error.

    For work only one rank should do (reading a small file, drawing a figure, generating a
    network): a failure is reported once, without the ``(rank k)`` prefix :func:`agree`
    adds to partial failures, because here only one rank could fail. ``idle=True``, for
    long work: the other ranks wait without spinning (:func:`idle_barrier`), so the root's
    threads keep the node's cores. The result is broadcast (pickled): keep it small.
    """
    result, failure = None, None
    if comm.rank == root:
        try:
            result = fn(*args, **kwargs)
        except MpisdnnError as exc:
            failure = (str(exc), getattr(exc, "exit_code", 2))
        except (OSError, ValueError, KeyError, MemoryError) as exc:
            failure = (failure_text(exc), 2)
    if idle:
        idle_barrier(comm)
    result, failure = comm.bcast((result, failure), root=root)
    if failure is not None:
        raise AgreedError(*failure)
    return result


def failure_text(exc: BaseException) -> str:
    """The one line for an error no check foresaw: an OS error as ``FILE: reason`` (not
    ``OSError: [Errno 30] ...``), memory as ``not enough memory``; others keep their class
    name (a message that still shows one asks for a check before the failing call)."""
    if isinstance(exc, OSError) and exc.strerror:
        name = exc.filename
        return f"{name}: {exc.strerror}" if name is not None else exc.strerror
    if isinstance(exc, MemoryError):
        return f"not enough memory ({exc})" if str(exc) else "not enough memory"
    return f"{type(exc).__name__}: {exc}"


def agree_error(comm, exc: BaseException | None) -> None:
    """Raise ``exc`` as one :class:`AgreedError` on every rank (collective; ``None``: no error).

    Every rank calls it; ranks without an error pass ``None``. When only some ranks pass one,
    the message names the first of them (as :func:`agree` does).
    """
    agree(comm, _raise_if, exc)


def _raise_if(exc):
    if exc is not None:
        raise exc


def mpi_op(name: str):
    """The MPI reduction ``name``: ``"sum"``, ``"max"``, ``"min"`` or ``"bor"`` (mpi4py lazily)."""
    from mpi4py import MPI

    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "bor": MPI.BOR}[name]


def allreduce(comm, value, op: str = "sum"):
    """Reduce ``value`` over all ranks with the reduction named ``op``; every rank gets it.

    A numpy array is reduced element-wise as a buffer (``Allreduce``) into a new array of its
    dtype; any other value (int, float, tuple of them) goes pickled (``allreduce``).
    """
    if isinstance(value, np.ndarray):
        local = np.ascontiguousarray(value)
        out = np.empty_like(local)
        comm.Allreduce(local, out, op=mpi_op(op))
        return out
    return comm.allreduce(value, op=mpi_op(op))


def allgather(comm, value) -> list:
    """Every rank's ``value`` (pickled: keep it small), in rank order, on every rank."""
    return comm.allgather(value)


def bcast(comm, value, root: int = 0):
    """``root``'s ``value`` (pickled: keep it small) on every rank."""
    return comm.bcast(value, root=root)


def gather(comm, value, root: int = 0):
    """Every rank's ``value`` (pickled: keep it small) in rank order on ``root``; ``None``
    on the other ranks."""
    return comm.gather(value, root=root)


def alltoall_array(comm, send: np.ndarray) -> np.ndarray:
    """Element ``j`` of ``send`` to rank ``j`` (one element per rank: counts, sizes); returns
    what every rank sent this one, in rank order (``Alltoall``)."""
    send = np.ascontiguousarray(send)
    out = np.empty_like(send)
    comm.Alltoall(send, out)
    return out


def barrier(comm) -> None:
    """Wait until every rank of ``comm`` has reached this call."""
    comm.Barrier()


#: Longest sleep, in seconds, between two looks of :func:`idle_wait` (the first is 0.1 ms).
IDLE_SLEEP_MAX = 0.01


def idle_wait(request, most: float = IDLE_SLEEP_MAX) -> None:
    """Wait for the non-blocking ``request`` without spinning: look, sleep, look again, the
    sleeps doubling from 0.1 ms to ``most`` seconds.

    MPI's blocking calls poll a core at 100 % while they wait. Where ranks share cores (as
    many ranks as cores, more ranks than cores, a loaded node), a rank waiting for another
    that works alone takes the core the worker's own threads need: two ranks on two cores,
    rank 0 reading a ``neuron65536.tar.gz`` of 120 layers while rank 1 waited in the
    broadcast, took 35.5 s against 26 s at one rank, its inflating thread at half a core.
    """
    delay = 1e-4
    while not request.Test():
        time.sleep(delay)
        delay = min(most, 2 * delay)


def idle_barrier(comm) -> None:
    """:func:`barrier` whose waiting ranks sleep (:func:`idle_wait`): for the ranks that
    wait while one rank works alone."""
    if comm.size > 1:
        idle_wait(comm.Ibarrier())


def log(comm, *args, file=None, **kwargs) -> None:
    """Print on rank 0 only (flushes, so batch logs interleave sensibly)."""
    if comm.rank == 0:
        print(*args, file=file or sys.stdout, flush=True, **kwargs)


def allgather_array(comm, local: np.ndarray) -> np.ndarray:
    """Concatenate 1-D arrays from all ranks in rank order, on every rank (``Allgatherv``)."""
    local = np.ascontiguousarray(local)
    counts = np.array(comm.allgather(int(local.size)), dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=local.dtype)
    if counts.max(initial=0) > MAX_COUNT or out.size > MAX_COUNT:
        # MPI counts are C ints; fall back to pickled chunks for huge vectors.
        return np.concatenate(comm.allgather(local)) if comm.size > 1 else local.copy()
    displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
    comm.Allgatherv(local, [out, counts, displs, _mpi_type(local.dtype)])
    return out


def bcast_array(comm, arr, root: int = 0) -> np.ndarray:
    """Broadcast a 1-D numpy array from ``root`` (any size: raw bytes in ``PIECE_BYTES`` pieces).

    Only ``root``'s ``arr`` is read (the others may pass ``None``); every rank returns the array
    (``root`` its own).
    """
    meta = (arr.dtype.str, int(arr.size)) if comm.rank == root else None
    dtype, size = comm.bcast(meta, root=root)
    out = np.ascontiguousarray(arr) if comm.rank == root else np.empty(size, dtype=np.dtype(dtype))
    if size == 0:
        return out
    raw = out.view(np.uint8)
    for lo in range(0, raw.size, PIECE_BYTES):
        comm.Bcast(raw[lo : lo + PIECE_BYTES], root=root)
    return out


def gather_arrays(comm, arrays, root: int = 0):
    """Concatenate every rank's 1-D ``arrays`` on ``root`` in rank order (collective).

    Raw buffers in pieces of at most ``PIECE_BYTES``, so no message nears MPI's 2**31 count
    limit and nothing is pickled. ``root`` returns the list of concatenations (array ``j`` of
    every rank, one after another), the other ranks ``None``.
    """
    counts = comm.gather([int(a.size) for a in arrays], root=root)
    if comm.size == 1:
        return list(arrays)
    if comm.rank != root:
        for a in arrays:
            step = max(1, PIECE_BYTES // max(1, a.itemsize))
            for lo in range(0, a.size, step):
                comm.Send(np.ascontiguousarray(a[lo : lo + step]), dest=root, tag=_GATHER_TAG)
        return None
    out = [np.empty(sum(c[j] for c in counts), dtype=a.dtype) for j, a in enumerate(arrays)]
    pos = [0] * len(arrays)
    for src in range(comm.size):
        for j, a in enumerate(arrays):
            n, buf = counts[src][j], out[j]
            if src == root:
                buf[pos[j] : pos[j] + n] = a
                pos[j] += n
                continue
            step = max(1, PIECE_BYTES // max(1, a.itemsize))
            for lo in range(0, n, step):
                m = min(step, n - lo)
                comm.Recv(buf[pos[j] : pos[j] + m], source=src, tag=_GATHER_TAG)
                pos[j] += m
    return out


def alltoallv_array(
    comm, send: np.ndarray, send_counts, recv_counts, out=None, send_displs=None
) -> np.ndarray:
    """Exchange a 1-D array: the ``send_counts[j]`` elements after those for ranks ``< j`` go
    to rank ``j``; returns what every rank sent here, in rank order (collective).

    ``out``: a buffer of ``send``'s dtype to receive into (its first ``sum(recv_counts)``
    elements, returned as a view): a caller exchanging in rounds reuses one buffer rather
    than touching fresh memory each round. ``send_displs``: where rank ``j``'s elements
    start in ``send`` instead (int64; runs in any place, e.g. around the part a rank keeps:
    nothing is copied to make them adjacent).

    Counts are int64. Where a count, a displacement or a total passes ``MAX_COUNT`` (MPI's
    C ints), the exchange runs in rounds that each move at most ``MAX_COUNT // size`` elements
    per pair, so any size works; below that it is one ``Alltoallv`` on the buffers themselves.
    """
    send = np.ascontiguousarray(send)
    scount = np.asarray(send_counts, dtype=np.int64)
    rcount = np.asarray(recv_counts, dtype=np.int64)
    if send_displs is None:
        sdispl = np.concatenate(([0], np.cumsum(scount)[:-1])).astype(np.int64)
    else:
        sdispl = np.asarray(send_displs, dtype=np.int64)
    rdispl = np.concatenate(([0], np.cumsum(rcount)[:-1])).astype(np.int64)
    total = int(rcount.sum())
    if out is None or out.size < total or out.dtype != send.dtype:
        out = np.empty(total, dtype=send.dtype)
    out = out[:total]
    mpitype = _mpi_type(send.dtype)
    big = max(int((sdispl + scount).max(initial=0)), int(out.size)) > MAX_COUNT
    if not comm.allreduce(big, op=mpi_op("bor")):
        comm.Alltoallv([send, scount, sdispl, mpitype], [out, rcount, rdispl, mpitype])
        return out
    # Rounds: round r moves elements [r*step, (r+1)*step) of each pair's block through
    # contiguous staging buffers, whose counts and displacements then all fit C ints.
    step = max(1, MAX_COUNT // comm.size)
    widest = max(int(scount.max(initial=0)), int(rcount.max(initial=0)))
    rounds = comm.allreduce(-(-widest // step), op=mpi_op("max"))
    for r in range(rounds):
        lo = r * step
        s_n = np.clip(scount - lo, 0, step)
        r_n = np.clip(rcount - lo, 0, step)
        s_buf = np.concatenate([send[d + lo : d + lo + n] for d, n in zip(sdispl, s_n)])
        r_buf = np.empty(int(r_n.sum()), dtype=send.dtype)
        s_d = np.concatenate(([0], np.cumsum(s_n)[:-1]))
        r_d = np.concatenate(([0], np.cumsum(r_n)[:-1]))
        comm.Alltoallv([s_buf, s_n, s_d, mpitype], [r_buf, r_n, r_d, mpitype])
        for d, pos, n in zip(rdispl, r_d, r_n):
            out[d + lo : d + lo + n] = r_buf[pos : pos + n]
    return out


def _mpi_type(dtype):
    from mpi4py import MPI

    return MPI._typedict[np.dtype(dtype).char]


@contextmanager
def abort_on_error(comm, prog: str = "mpisdnn"):
    """Turn any uncaught exception on any rank into one message and a whole-job abort.

    :class:`AgreedError` is known to all ranks: rank 0 prints it, everyone exits with its code.
    Any other :class:`MpisdnnError` happened on this rank only: it prints one line and aborts the
    job (``MPI_Abort`` ends every rank within seconds instead of leaving them in a collective).
    Anything else is a crash: a traceback from the failing rank, then abort with code 3.
    """
    try:
        yield
    except AgreedError as exc:
        if comm.rank == 0:
            print(f"{prog}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except MpisdnnError as exc:
        where = f" [rank {comm.rank}/{comm.size}]" if comm.size > 1 else ""
        print(f"{prog}: error{where}: {one_line(exc)}", file=sys.stderr, flush=True)
        _abort(comm, getattr(exc, "exit_code", 2))
    except SystemExit:
        raise
    except KeyboardInterrupt:
        # The launcher forwards SIGINT (SIGTERM) to every rank: rank 0 speaks for all. The
        # ``finally`` blocks between here and the interrupted line have removed temp files.
        _interrupted(comm, prog)
    except BaseException:
        where = f" on rank {comm.rank}/{comm.size}" if comm.size > 1 else ""
        sys.stderr.write(f"{prog}: internal error{where}:\n{traceback.format_exc()}")
        sys.stderr.flush()
        _abort(comm, 3)


def _interrupted(comm, prog: str) -> None:
    """One ``interrupted`` (``terminated``) line for the whole job, then abort with 130 (143).

    Every rank has run its ``finally`` blocks (temporary files removed) when it gets here and
    tells rank 0 so (tag ``_CLEANED_TAG``). Rank 0 tells every other rank that it speaks (a
    message, not a timing guess: under load rank 0's abort can take longer than any fixed
    delay), prints, waits up to ``CLEANUP_SECONDS`` for the others' clean-up (a rank may still
    be inside a kernel when the signal comes; aborting at once left its part files behind),
    then aborts. Another rank prints only when rank 0's word has not come within
    ``RANK0_WORD_SECONDS``: rank 0 is stuck in an MPI call (waiting for this rank) or already
    past its command.
    """
    # what a ``finally`` block did not cover (a writer interrupted between its creation and
    # its block): the registered temporaries (seen in tests: both ranks' projection parts)
    remove_temporaries()
    if comm.rank == 0:
        _pending = send_rank0_word(comm)  # noqa: F841 - kept until the abort
        # the line first: a rank still starting up may end the job before the wait is over
        print(f"{prog}: {message()}", file=sys.stderr, flush=True)
        mark_reported()
        waiting = set(range(1, comm.size))
        deadline = time.monotonic() + CLEANUP_SECONDS
        while waiting and time.monotonic() < deadline:
            waiting = {r for r in waiting if not comm.Iprobe(source=r, tag=_CLEANED_TAG)}
            time.sleep(0.01)
        _abort(comm, exit_code())
        return
    if await_rank0_word(comm):
        time.sleep(RANK0_ABORT_SECONDS)  # rank 0 prints and ends the job meanwhile
        _abort(comm, exit_code())
        return
    print(f"{prog}: {message()}", file=sys.stderr, flush=True)
    mark_reported()
    _abort(comm, exit_code())


def send_rank0_word(comm) -> list:
    """Rank 0, interrupted: tell every other rank that it speaks for the job. Returns the
    requests, to keep referenced until the abort (empty eager messages: they complete
    locally)."""
    return [comm.isend(None, dest=r, tag=_INTERRUPT_TAG) for r in range(1, comm.size)]


#: "Cleaned up" messages of interrupted ranks, kept referenced until the process ends.
_CLEANED_SENT: list = []


def await_rank0_word(comm) -> bool:
    """A rank other than 0, interrupted (while the command runs, or during start-up past
    ``MPI_Init``, :func:`mpisdnn._signals.exit_now`): tell rank 0 that its clean-up is done,
    then wait up to ``RANK0_WORD_SECONDS`` for rank 0's word (:func:`send_rank0_word`).
    False when none came: rank 0 is stuck in an MPI call (waiting for this rank) or past its
    command, and this rank must speak for the job."""
    _CLEANED_SENT.append(comm.isend(None, dest=0, tag=_CLEANED_TAG))
    deadline = time.monotonic() + RANK0_WORD_SECONDS
    while time.monotonic() < deadline:
        if comm.Iprobe(source=0, tag=_INTERRUPT_TAG):
            return True
        time.sleep(0.01)
    return False


def _abort(comm, code: int) -> None:
    """End the whole job with ``code`` now.

    ``MPI_Abort`` makes the launcher (hydra's mpiexec, Open MPI's mpirun, srun) kill every rank
    and exit non-zero, instead of the others waiting forever in their next collective. With
    nothing else to kill (a one-process job) a plain ``SystemExit`` suffices, which also keeps
    ``main(argv, MPI.COMM_SELF)`` usable in-process (it returns the code).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if comm.size > 1 or _world_size() > 1:
        # The launcher forwards each rank's output asynchronously and stops forwarding once it
        # starts killing ranks; without a short grace period the one message that explains
        # the abort is sometimes lost (seen with MPICH's hydra on a loaded 2-core machine).
        time.sleep(ABORT_GRACE_SECONDS)
    if comm.size > 1:
        silence_stderr()  # this rank's line is out: no MPICH "Abort(N) on node" line after it
        comm.Abort(code)
        os._exit(code)  # not reached: Abort does not return
    world = _world_size()
    if world > 1:
        # A sub-communicator of size 1 inside a bigger job (e.g. COMM_SELF): the other
        # processes of the job may be waiting for this one, so the job still has to end.
        from mpi4py import MPI

        silence_stderr()
        MPI.COMM_WORLD.Abort(code)
        os._exit(code)
    raise SystemExit(code)


def _world_size() -> int:
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1
    except Exception:  # noqa: BLE001 - no MPI at all: nothing else to end
        return 1


# --- point-to-point, prefix sums, in-place reductions, node split (the readers and writers) ---


def exscan(comm, value, op: str = "sum"):
    """The reduction named ``op`` of the ``value`` of every rank below this one (pickled:
    keep it small); ``None`` on rank 0, as MPI leaves it undefined there (``exscan``)."""
    return comm.exscan(value, op=mpi_op(op))


def allreduce_in_place(comm, arr: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduce the contiguous array ``arr`` element-wise over all ranks into ``arr`` itself
    (``Allreduce`` with ``IN_PLACE``: no second array of its size); returns ``arr``."""
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, arr, op=mpi_op(op))
    return arr


def send_array(comm, arr: np.ndarray, dest: int, tag: int) -> None:
    """Send the contiguous array ``arr`` to rank ``dest`` as a raw buffer (``Send``; blocks
    until the buffer may be reused). The receiver knows its size and dtype."""
    comm.Send(arr, dest=dest, tag=tag)


def isend_array(comm, arr: np.ndarray, dest: int, tag: int):
    """Start sending the contiguous array ``arr`` to rank ``dest`` (``Isend``); returns the
    request, to ``Wait`` on before ``arr`` is changed or freed."""
    return comm.Isend(arr, dest=dest, tag=tag)


def recv_array(comm, buf: np.ndarray, source: int, tag: int) -> np.ndarray:
    """Receive into ``buf`` (its size and dtype are what ``source`` sends) from rank
    ``source`` with ``tag`` (``Recv``; never a wildcard); returns ``buf``."""
    comm.Recv(buf, source=source, tag=tag)
    return buf
