"""SIGINT and SIGTERM handling of the command line: one line and exit code 128 + signal
(130 for Ctrl-C, 143 for ``kill``, ``scancel`` or a Slurm time limit), at any moment.

Two handlers, switched by the entry point and :func:`mpisdnn.cli.main`:

- while the command starts (imports, MPI initialisation) nothing needs cleaning up, so
  :func:`exit_now` ends the process at once; after it finished (MPI_Finalize, interpreter
  teardown) both signals are ignored;
- while the command runs, :func:`raise_interrupt` raises ``KeyboardInterrupt`` so ``finally``
  blocks remove temporary files, and :func:`mpisdnn.parallel.abort_on_error` ends the job.
  Inside :func:`deferred_termination` (``infer --checkpoint``) SIGTERM instead asks for a
  checkpoint at the next layer-group boundary.

Python runs a handler only between bytecodes of the main thread, so a rank blocked inside an
MPI call or a kernel would never end (this is what made hydra hang at start-up when SIGTERM
was first handled, docs/sweep.md G7). The entry point therefore starts a watchdog
(:func:`start_watchdog`): a thread woken through :func:`signal.set_wakeup_fd` that removes
the registered temporary files and ends the process a few seconds after the signal if the
main thread has not; and it initialises MPI with the GIL released (:func:`init_mpi`), which
mpi4py's own ``MPI_Init`` does not, so that the watchdog can run while a rank waits there.

This module imports only the standard library: it must load before numpy and scipy do.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

__all__ = [
    "INTERRUPTED",
    "TERMINATED",
    "HANDLED",
    "exit_code",
    "message",
    "launcher_rank",
    "exit_now",
    "exit_if_requested",
    "report_interrupt",
    "mark_reported",
    "install_exit_now",
    "ignore_interrupts",
    "interruptible",
    "interrupted",
    "deferred_termination",
    "note_termination",
    "termination_deferred",
    "start_watchdog",
    "init_mpi",
    "temporary",
    "track",
    "untrack",
    "remove_temporaries",
]

#: Exit code of a run ended by SIGINT (128 + 2, what shells report for Ctrl-C).
INTERRUPTED = 130
#: Exit code of a run ended by SIGTERM (128 + 15: ``kill``, ``scancel``, a Slurm time limit).
TERMINATED = 143
#: The signals handled; any other keeps Python's default.
HANDLED = (signal.SIGINT, signal.SIGTERM)

#: After SIGINT (SIGTERM), how long a rank other than 0 waits for rank 0's word that it speaks
#: for the job before it prints the line itself (rank 0 may be stuck in an MPI call, waiting
#: for this rank).
RANK0_WORD_SECONDS = 5.0
#: How long a rank that got rank 0's word waits for rank 0's abort before aborting itself.
RANK0_ABORT_SECONDS = 30.0
#: Tag of rank 0's word (no receive in mpisdnn uses a wildcard tag).
INTERRUPT_TAG = 32111

#: Delay before a ``KeyboardInterrupt`` that a callback swallowed is delivered again (long
#: enough for the callback to be over, short beside :data:`RANK0_WORD_SECONDS`).
REDELIVER_SECONDS = 0.05

#: Seconds after a signal before the watchdog ends a process whose main thread has not: during
#: start-up (a signalled rank joins MPI_Init before it aborts the job, so that a rank that got
#: no signal does not wait there forever; under load the others may need seconds to get
#: there, and a rank never gets there only if it died first), while a command runs (past
#: the ranks' agreement, :data:`RANK0_WORD_SECONDS`), and while a SIGTERM
#: waits for the checkpoint at the next layer-group boundary (inside Slurm's default 30 s
#: ``KillWait``).
#: ``remove``: when the registered temporaries go (:func:`track`), before rank 0 stops waiting
#: for the others' clean-up (:data:`mpisdnn.parallel.CLEANUP_SECONDS`).
WATCHDOG_SECONDS = {"start": 20.0, "run": 12.0, "deferred": 25.0, "remove": 4.0}

# Rank variables the common launchers set before MPI is initialised (MPICH's hydra, Open MPI,
# PMIx, Slurm).
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

_state = {
    "interrupted": False,
    "signum": signal.SIGINT,
    "reported": False,
    "phase": "start",
    "defer": None,  # inside deferred_termination: what SIGTERM calls instead of raising
    "deferred": False,  # a SIGTERM was deferred
    "exit_requested": False,  # a signal before MPI_Init: exit once this rank has joined it
    "mpi_started": False,  # the entry point has initialised MPI (exit_if_requested)
}
#: Temporary files and directories this process is writing (removed by the watchdog).
_temporaries: set = set()
_lock = threading.Lock()


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 when started alone)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def exit_code() -> int:
    """128 + the last handled signal (130 when none was)."""
    return 128 + int(_state["signum"])


def message() -> str:
    """``interrupted`` (SIGINT) or ``terminated`` (SIGTERM): the word of the one line."""
    return "terminated" if _state["signum"] == signal.SIGTERM else "interrupted"


def exit_now(signum=None, frame=None) -> None:
    """End the process with exit code 128 + signal; rank 0 prints ``mpisdnn: interrupted``
    (``terminated`` for SIGTERM).

    ``os._exit`` skips the teardown of half-imported modules and of MPI, which is what made
    the launcher report a segfault for a Ctrl-C during start-up.

    In a job of several ranks, before MPI runs, rank 0 prints at once but the exit waits
    until this rank has joined ``MPI_Init`` (:func:`exit_if_requested`): a rank that got no
    signal waits there for this one, and only the abort ends it. Joining ``MPI_Init`` from
    the handler instead failed now and then (the handler runs inside an import, where
    mpi4py cannot be imported), and the rank that got no signal waited forever (the soak
    test hung so). Past ``MPI_Init``, a rank other than 0 waits for rank 0's word (as a
    running command's ranks do, :func:`mpisdnn.parallel.abort_on_error`) and prints the
    line itself when none comes: rank 0 may have started the command already and wait for
    this rank in its first collective, where it cannot speak (a job of the CI's soak test,
    under load, ended with 143 and no line).
    """
    if signum is not None:
        _state["signum"] = signum
    world = _world()
    if launcher_rank() == 0:
        report_interrupt()
    if world is None and _launcher_size() > 1 and not _state["mpi_started"]:
        _state["exit_requested"] = True  # the watchdog ends this rank should MPI_Init hang
        return
    _remove_temporaries()
    # mpisdnn.parallel holds the MPI calls; loaded by the command line before MPI_Init (this
    # module imports only the standard library, and a handler must not import)
    parallel = sys.modules.get(f"{__package__}.parallel") if world is not None else None
    if parallel is not None and launcher_rank() != 0:
        try:
            spoken = parallel.await_rank0_word(world)
        except Exception:  # noqa: BLE001 - speak for the job, as with no word
            spoken = False
        if spoken:
            time.sleep(RANK0_ABORT_SECONDS)  # rank 0 ends the job meanwhile
        else:
            report_interrupt(here=True)
    if parallel is not None and launcher_rank() == 0:
        # rank 0 has spoken: the ranks still starting wait for the abort instead of speaking
        _state["word"] = parallel.send_rank0_word(world)
    _end_job(exit_code())


def exit_if_requested() -> None:
    """After :func:`init_mpi` (the entry point): end the process if a signal came before."""
    _state["mpi_started"] = True
    if _state["exit_requested"]:
        exit_now()


def _world():
    """``MPI.COMM_WORLD`` once MPI runs with more than one rank, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            world = mpi.COMM_WORLD
            return world if world.Get_size() > 1 else None
    except Exception:  # noqa: BLE001 - as if MPI were not running
        pass
    return None


def _launcher_size() -> int:
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def _end_job(code: int) -> None:
    """Exit with ``code``; once MPI runs with other ranks, end them too (``MPI_Abort``).

    The launcher (hydra) does not end the other ranks when one exits with a code, and they
    would wait for it forever in their next collective (seen in the soak test when only one
    rank got the signal). A thread exits anyway should the abort itself get stuck.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            if mpi.COMM_WORLD.Get_size() > 1:
                fallback = threading.Timer(5.0, os._exit, (code,))
                fallback.daemon = True
                fallback.start()
                sys.stdout.flush()
                silence_stderr()
                mpi.COMM_WORLD.Abort(code)
    except Exception:  # noqa: BLE001 - ending the process is all that is left to do
        pass
    os._exit(code)


def silence_stderr() -> None:
    """Point file descriptor 2 at ``/dev/null`` just before ``MPI_Abort``.

    The job's one line is out by then (flushed); MPICH's ``MPI_Abort`` would add its own
    ``Abort(143) on node 0 (rank 0 in comm 0): application called MPI_Abort(...)`` line, a
    second line the user was promised not to get (issue 42, item 11).
    """
    try:
        sys.stderr.flush()
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)
    except (OSError, ValueError):  # no stderr, or closed: nothing to silence
        pass


def report_interrupt(here: bool = False) -> None:
    """Print the one line on rank 0, or on this rank when ``here`` (a rank that speaks for
    the job: rank 0 could not); once (``os.write``: safe inside a signal handler)."""
    if (here or launcher_rank() == 0) and not _state["reported"]:
        _state["reported"] = True
        os.write(2, f"mpisdnn: {message()}\n".encode())


def mark_reported() -> None:
    """The job's line was printed (by :func:`mpisdnn.parallel.abort_on_error`)."""
    _state["reported"] = True


def raise_interrupt(signum, frame) -> None:
    """Run-time handler: remember the signal and raise ``KeyboardInterrupt``.

    A SIGTERM inside :func:`deferred_termination` calls its callback instead (a checkpoint at
    the next boundary, then exit 143).
    """
    if signum == signal.SIGTERM and _state["defer"] is not None:
        _state["signum"] = signum
        _state["deferred"] = True
        _state["defer"]()
        return
    _state["interrupted"] = True
    _state["signum"] = signum
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether SIGINT or SIGTERM arrived while the command ran (even if code swallowed it)."""
    return _state["interrupted"]


def note_termination() -> None:
    """A deferred SIGTERM reached some rank of the job (agreed at a checkpoint boundary):
    this rank ends as terminated too (:func:`termination_deferred`, exit 143), so that every
    rank exits with one code."""
    _state["signum"] = signal.SIGTERM
    _state["deferred"] = True


def termination_deferred() -> bool:
    """Whether a SIGTERM arrived inside :func:`deferred_termination`."""
    return _state["deferred"]


def install_exit_now() -> None:
    """Make SIGINT and SIGTERM end the process at once (start-up)."""
    _state["phase"] = "start"
    _install(exit_now)


def ignore_interrupts() -> None:
    """Ignore SIGINT and SIGTERM (after the command, while MPI finalizes)."""
    _state["phase"] = "end"
    _install(signal.SIG_IGN)


@contextmanager
def interruptible():
    """While the block runs, SIGINT and SIGTERM raise ``KeyboardInterrupt`` (clean-up runs,
    then 130 or 143).

    Only the handler the entry point installed is replaced, so a program that calls
    :func:`mpisdnn.cli.main` itself keeps its own handling. A ``KeyboardInterrupt`` that lands
    in a garbage-collector or weakref callback cannot propagate; Python would print it as
    "Exception ignored": it is silenced and delivered again a moment later (and, should
    something swallow it for good, raised when the block ends), so the interrupt is handled
    where every other one is (:func:`mpisdnn.parallel.abort_on_error`: one line for the job).
    After the block both signals are ignored: the outputs are written, and ending one rank
    during MPI_Finalize would leave the others spinning there.
    """
    if signal.getsignal(signal.SIGINT) is not exit_now:
        yield
        return
    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)
            return
        # Waiting for the block's end is not enough: the command may run for minutes (h5py's
        # weakref callbacks catch many a Ctrl-C during a write), and another rank still
        # starting up then exits alone, before any rank said why (seen under load). Raising
        # inside this hook would only be printed, so another thread delivers the signal again
        # once the callback is over.
        timer = threading.Timer(REDELIVER_SECONDS, _thread.interrupt_main, (int(_state["signum"]),))
        timer.daemon = True
        timer.start()

    sys.unraisablehook = hook
    _state["interrupted"] = False
    _state["phase"] = "run"
    _install(raise_interrupt)
    try:
        yield
        if _state["interrupted"]:  # swallowed on the way (a callback, a library's handler)
            raise KeyboardInterrupt
    finally:
        ignore_interrupts()
        sys.unraisablehook = previous_hook


@contextmanager
def deferred_termination(callback):
    """While the block runs, SIGTERM calls ``callback()`` instead of interrupting.

    ``infer --checkpoint`` asks this way for a checkpoint at the next layer-group boundary
    (as SIGUSR1 and ``DIR/STOP`` do); the watchdog then waits
    ``WATCHDOG_SECONDS["deferred"]`` before it ends a rank that never gets there. SIGINT
    still interrupts at once.
    """
    _state["defer"], _state["deferred"] = callback, False
    try:
        yield
    finally:
        _state["defer"] = None


def track(*paths) -> None:
    """Register temporary files or directories being written (removed by the watchdog).

    The main thread's ``finally`` blocks remove temporaries; this registry is for the ranks
    whose main thread cannot run them in time (blocked in MPI or a kernel while another rank
    ends the job): the watchdog removes them ``WATCHDOG_SECONDS["remove"]`` after SIGINT or
    SIGTERM if the main thread has not (the output is abandoned anyway; a rename that comes
    after fails, a completed one stands).
    """
    with _lock:
        _temporaries.update(os.path.abspath(os.fspath(p)) for p in paths if p)


def untrack(*paths) -> None:
    """The paths are renamed, removed or part of a finished output: no longer temporary."""
    with _lock:
        _temporaries.difference_update(os.path.abspath(os.fspath(p)) for p in paths if p)


@contextmanager
def temporary(path):
    """:func:`track` ``path`` while the block runs."""
    track(path)
    try:
        yield path
    finally:
        untrack(path)


def remove_temporaries() -> None:
    """Remove every registered temporary (:func:`track`): the outputs are abandoned."""
    _remove_temporaries()


def _remove_temporaries() -> None:
    import shutil

    with _lock:
        paths = list(_temporaries)
    for path in paths:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                os.remove(path)
        except OSError:
            pass


def start_watchdog() -> bool:
    """Start the watchdog thread (the entry point, main thread only); False when it cannot.

    The C-level signal handler writes the signal number to a pipe even while the main thread
    is blocked; the thread reads it, waits ``WATCHDOG_SECONDS[phase]`` and, unless the
    process ended meanwhile, removes the registered temporaries, prints the line (rank 0,
    once) and exits with 128 + signal. Signals ignored after the command (SIG_IGN) never
    reach it.
    """
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread, or no pipe: the handlers still work
        return False
    thread = threading.Thread(target=_watch, args=(r,), name="mpisdnn-watchdog", daemon=True)
    thread.start()
    return True


def _watch(fd) -> None:
    deadline = remove_at = None
    while True:
        try:
            if deadline is None:
                got = os.read(fd, 64)
            else:
                got = _read_until(fd, min(deadline, remove_at or deadline))
        except OSError:
            return
        now = time.monotonic()
        if remove_at is not None and now >= remove_at:
            remove_at = None
            if _state["phase"] != "end":
                _remove_temporaries()  # the main thread is still busy: see track()
                _tell_rank0_cleaned()
        if deadline is not None and now >= deadline:  # the main thread did not end it
            _fire()
            return
        if deadline is None and any(b in HANDLED for b in got or b""):
            signum = next(b for b in got if b in HANDLED)
            if _state["phase"] == "end":
                continue
            deferred = _state["defer"] is not None and signum == signal.SIGTERM
            if not deferred:
                _state["signum"] = signum
                remove_at = now + WATCHDOG_SECONDS["remove"]
            phase = "deferred" if deferred else _state["phase"]
            deadline = now + WATCHDOG_SECONDS.get(phase, WATCHDOG_SECONDS["run"])


def _read_until(fd, deadline):
    """Bytes from ``fd``, or ``b""`` once ``deadline`` passed with nothing to read."""
    import select

    left = deadline - time.monotonic()
    if left <= 0:
        return b""
    ready, _, _ = select.select([fd], [], [], left)
    return os.read(fd, 64) if ready else b""


#: Tag of a rank's "my temporaries are removed" to rank 0 (:func:`mpisdnn.parallel._interrupted`).
CLEANED_TAG = 32112


def _tell_rank0_cleaned() -> None:
    """Say "cleaned up" to rank 0 for a main thread blocked in MPI, so that rank 0 need not
    wait its whole ``CLEANUP_SECONDS`` for this rank (MPI_THREAD_MULTIPLE only)."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
            return
        world = mpi.COMM_WORLD
        if world.Get_rank() == 0 or mpi.Query_thread() != mpi.THREAD_MULTIPLE:
            return
        _state["cleaned_request"] = world.issend(None, dest=0, tag=CLEANED_TAG)
    except Exception:  # noqa: BLE001 - rank 0 then waits its full time
        pass


def _fire() -> None:
    if _state["phase"] == "end":  # the outputs are written; MPI_Finalize must not be cut
        return
    _remove_temporaries()
    report_interrupt()
    _end_job(exit_code())


def init_mpi() -> None:
    """Initialise MPI with the GIL released, so the watchdog runs while ``MPI_Init`` waits.

    mpi4py calls ``MPI_Init_thread`` from its module initialisation holding the GIL: a rank
    waiting there for a peer (all ranks meet in ``MPI_Init``) could not run any Python code,
    and a signal then left it waiting forever. ``ctypes`` releases the GIL around the call.
    mpi4py then finds MPI initialised; it is told to finalize it at exit and its error
    handlers (exceptions, not aborts) are set as its own start-up would. Any problem: mpi4py
    initialises MPI itself, as before.
    """
    try:
        import mpi4py
    except ImportError:
        return
    if "mpi4py.MPI" in sys.modules or mpi4py.rc.initialize is not True:
        return
    # mpi4py reads its options when its module loads: finalize must be asked for now (with
    # initialize off it would not finalize, and ranks leaving without MPI_Finalize made hydra
    # kill the others with SIGKILL now and then)
    finalize = mpi4py.rc.finalize
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = True if finalize is None else finalize
    try:
        from mpi4py import MPI
    finally:
        mpi4py.rc.initialize = True
        mpi4py.rc.finalize = finalize
    try:
        if not MPI.Is_initialized():
            import ctypes

            lib = ctypes.CDLL(_loaded_mpi_library())
            provided = ctypes.c_int(-1)
            level = ctypes.c_int(int(_THREAD_LEVELS[mpi4py.rc.thread_level](MPI)))
            if lib.MPI_Init_thread(None, None, level, ctypes.byref(provided)) != 0:
                raise OSError("MPI_Init_thread failed")
    except Exception:  # noqa: BLE001 - fall back to mpi4py's own initialisation
        if not MPI.Is_initialized():
            MPI.Init_thread(_THREAD_LEVELS[mpi4py.rc.thread_level](MPI))
    if mpi4py.rc.errors == "exception":
        for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
            comm.Set_errhandler(MPI.ERRORS_RETURN)


_THREAD_LEVELS = {
    "single": lambda MPI: MPI.THREAD_SINGLE,
    "funneled": lambda MPI: MPI.THREAD_FUNNELED,
    "serialized": lambda MPI: MPI.THREAD_SERIALIZED,
    "multiple": lambda MPI: MPI.THREAD_MULTIPLE,
}


def _loaded_mpi_library() -> str:
    """Path of the MPI library mpi4py loaded (``/proc/self/maps``; Linux)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            name = os.path.basename(path)
            if name.startswith(("libmpi.so", "libmpich.so", "libmpi_abi.so")):
                return path
    raise OSError("no MPI library mapped")


def _install(handler) -> None:
    try:
        for signum in HANDLED:
            signal.signal(signum, handler)
    except ValueError:  # not the main thread: the embedding program owns signals
        pass
