"""Compiled kernels on disk: where numba keeps them, one compiler per cache at a time, and
how long compiling or loading them took.

numba compiles a ``cache=True`` kernel once and saves it; every later process loads it
(milliseconds). Three things around that are the command line's business:

- **Where** (:func:`configure_cache_dir`, before numba is imported). numba writes into
  ``__pycache__`` beside the package when it may, else into the user's cache. A read-only
  install with an unwritable home would leave numba nowhere to write (it then raises), so
  the command line points ``NUMBA_CACHE_DIR`` at ``$XDG_CACHE_HOME/mpisdnn/numba``
  (``~/.cache/mpisdnn/numba``) or, failing that, a per-user directory under the temporary
  directory. A ``NUMBA_CACHE_DIR`` the user set is kept.
- **One compiler per kernel at a time** (:func:`install`). The ranks of a first run all miss
  the cache at the same kernels. Each miss takes an exclusive lock on the kernel's own lock
  file beside its cache index and looks again once it holds it: the first rank compiles and
  saves, the others then load what it saved. Without it every rank compiled every kernel,
  which costs ranks x the CPU (on a node with more ranks than cores, that much more wall),
  and concurrent saves of one index could drop each other's entries. The lock is ``flock``
  (released by the kernel if a rank dies) and only taken on a miss; where it cannot be
  taken, ranks compile as before. One lock per kernel, not one per cache: ranks that reach
  different kernels compile them at once (:func:`in_turn`).
- **Different kernels on different ranks** (:func:`in_turn`): a warm-up of independent
  steps, each rank starting at another one, so a first run's ranks compile the long
  kernels side by side instead of one after the other. A run of one rank gets the same
  from a helper process (:mod:`mpisdnn._aside`) that takes the first steps while the run
  takes them from the last (:func:`helped_turns`).
- **Saying so** (:func:`install` with ``announce``): the first miss prints one line
  (``compiling kernels (first run after install, ~N s)...``), and :func:`statistics` gives
  the seconds spent compiling or loading kernels, for the reports' wall-time accounting and
  the closing line of :func:`mpisdnn.cli.main`.

This module imports only the standard library until :func:`install` runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import threading
import time

__all__ = [
    "COMPILE_ESTIMATE_SECONDS",
    "cache_dir",
    "configure_cache_dir",
    "install",
    "statistics",
    "reset_statistics",
    "done_line",
    "preload",
    "in_turn",
    "helped_turns",
    "has_cache_index",
]

#: Rough seconds of one core to compile the kernels a command uses, for the notice (measured
#: on the 2-core development VM, idle: ``infer`` on the cpu backend compiles the TSV parser,
#: the tile and pull kernels and their helpers).
COMPILE_ESTIMATE_SECONDS = {"infer": 30, "challenge": 40, "project": 30, "convert": 10,
                            "generate": 10}  # fmt: skip
#: The packages whose modules hold ``cache=True`` kernels (numba's in-tree cache is the
#: ``__pycache__`` beside each).
_KERNEL_DIRS = ("backends", "formats", "projection", "sdnn")
_LOCK_NAME = "mpisdnn-compile.lock"

_state = threading.local()
_stats = {"compile_seconds": 0.0, "compile_cpu_seconds": 0.0, "load_seconds": 0.0,
          "compiled": 0, "waited": 0, "loaded": 0, "lock_wait_seconds": 0.0}  # fmt: skip
_config = {"announce": False, "estimate": None, "announced": False, "installed": False,
           "stream": None, "helped": False}  # fmt: skip


def _writable_dir(path: str) -> bool:
    """True when files can be created in ``path`` (created if missing)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mpisdnn-probe-"):
            pass
        return True
    except OSError:
        return False


def _in_tree_writable(package: str) -> bool:
    for sub in _KERNEL_DIRS:
        d = os.path.join(package, sub)
        cache = os.path.join(d, "__pycache__")
        if not os.path.isdir(d):
            continue
        if not _writable_dir(cache if os.path.isdir(cache) or os.access(d, os.W_OK) else d):
            return False
    return True


def _user_cache_dirs(environ) -> list:
    out = []
    xdg = environ.get("XDG_CACHE_HOME")
    home = os.path.expanduser("~")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(home, ".cache")
    out.append(os.path.join(base, "mpisdnn", "numba"))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    out.append(os.path.join(tempfile.gettempdir(), f"mpisdnn-numba-{uid}"))
    return out


def configure_cache_dir(environ=None, package=None) -> str | None:
    """Choose where numba keeps compiled kernels; call before numba is imported.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read and set (default ``os.environ``).
    package : str, optional
        The mpisdnn package directory (default: this module's).

    Returns
    -------
    str or None
        The directory now in ``NUMBA_CACHE_DIR`` (``None``: numba's own in-tree cache beside
        the package, which is writable).
    """
    environ = os.environ if environ is None else environ
    if environ.get("NUMBA_CACHE_DIR"):
        return environ["NUMBA_CACHE_DIR"]
    package = package or os.path.dirname(os.path.abspath(__file__))
    if _in_tree_writable(package):
        return None
    for cand in _user_cache_dirs(environ):
        if _writable_dir(cand):
            environ["NUMBA_CACHE_DIR"] = cand
            return cand
    return None  # nowhere writable: numba runs the kernels uncached (see _tolerate)


def cache_dir() -> str:
    """Where compiled kernels are kept now (for messages)."""
    d = os.environ.get("NUMBA_CACHE_DIR")
    if d:
        return d
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "*", "__pycache__")


def _lock_path(cache=None) -> str | None:
    """The lock file of the kernel whose numba cache is ``cache`` (a
    ``numba.core.caching.Cache``): beside its index, named after it; the cache's one lock
    file where numba's object does not say where its index is."""
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    if isinstance(index, str):
        d = os.path.dirname(index)
        if _writable_dir(d):
            return os.path.join(d, f"{os.path.basename(index)}.{_LOCK_NAME}")
    d = os.environ.get("NUMBA_CACHE_DIR")
    if d:
        return os.path.join(d, _LOCK_NAME) if _writable_dir(d) else None
    pkg = os.path.dirname(os.path.abspath(__file__))
    cache = os.path.join(pkg, "backends", "__pycache__")
    return os.path.join(cache, _LOCK_NAME) if _writable_dir(cache) else None


@contextlib.contextmanager
def _nothing():
    yield


class _FileLock:
    """An exclusive ``flock`` on the cache's lock file; a no-op where none can be taken."""

    def __init__(self, path):
        self.path, self.fd = path, None

    def acquire(self) -> None:
        if self.path is None:
            return
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (OSError, ImportError):
            self.release()

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)  # closing the descriptor releases the flock
            except OSError:
                pass
            self.fd = None


def _depth() -> int:
    return getattr(_state, "depth", 0)


def _announce() -> None:
    if _config["announced"] or not _config["announce"]:
        return
    _config["announced"] = True
    est = _config["estimate"]
    about = f", ~{est} s" if est else ""
    stream = _config["stream"] or sys.stdout
    print(f"mpisdnn: compiling kernels (first run after install{about})...", file=stream,
          flush=True)  # fmt: skip


def install(announce: bool = False, estimate: float | None = None, stream=None) -> None:
    """Time every kernel compile and cache load, serialise compiles on the cache's lock file,
    and let a kernel run when its cache cannot be written (idempotent).

    Parameters
    ----------
    announce : bool
        Print the one "compiling kernels" line at this process's first cache miss (the
        command line passes ``comm.rank == 0``).
    estimate : float, optional
        Seconds the notice says compiling takes.
    stream : file-like, optional
        Where the notice goes (default ``sys.stdout``).
    """
    _config.update(announce=bool(announce), estimate=estimate, stream=stream)
    if _config["installed"]:
        return
    _config["installed"] = True
    from numba.core import caching, dispatcher

    from .system import tolerate_full_numba_cache

    tolerate_full_numba_cache()
    compile_ = dispatcher.Dispatcher.compile
    load = caching.Cache.load_overload

    def compile_timed(self, sig):
        depth = _depth()
        if depth:
            return compile_(self, sig)
        _state.depth, _state.missed, _state.lock = 1, False, None
        misses = getattr(self, "_cache_misses", None)
        before = sum(misses.values()) if misses is not None else 0
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return compile_(self, sig)
        finally:
            spent = time.perf_counter() - t0
            lock, _state.lock, _state.depth = _state.lock, None, 0
            if lock is not None:
                lock.release()
            if misses is not None and sum(misses.values()) > before:
                _stats["compile_seconds"] += spent  # compiled here
                _stats["compile_cpu_seconds"] += time.thread_time() - c0
                _stats["compiled"] += 1
            elif _state.missed:  # another process compiled it while this one waited
                _stats["compile_seconds"] += spent
                _stats["waited"] += 1
            else:
                _stats["load_seconds"] += spent
                _stats["loaded"] += 1

    def load_or_wait(self, sig, target_context):
        found = load(self, sig, target_context)
        if found is not None or _depth() != 1 or getattr(_state, "lock", None) is not None:
            if found is None and _depth() == 1:
                _state.missed = True
            return found
        # A miss at the top: wait for whoever compiles now, then look again (either way the
        # time is this job's compiling).
        _state.missed = True
        _announce()
        lock = _FileLock(_lock_path(self))
        t0 = time.perf_counter()
        lock.acquire()
        _stats["lock_wait_seconds"] += time.perf_counter() - t0
        found = load(self, sig, target_context)
        if found is not None:
            lock.release()
            return found
        _state.lock = lock  # released when the compile ends
        return None

    dispatcher.Dispatcher.compile = compile_timed
    caching.Cache.load_overload = load_or_wait


def in_turn(steps, rank: int) -> None:
    """Run the callables ``steps`` once each, starting at ``steps[rank % len(steps)]``.

    The steps must not depend on each other's order (a warm-up's compiles: each step calls
    some kernels on a tiny problem). On a first run the ranks of a node start at different
    steps, so they compile different kernels at once, each under its own lock
    (:func:`install`); a rank that reaches a kernel another rank is compiling waits for it
    and loads it (2 ranks, cpu backend, N >= 8192: the tile and pull kernels, 13 and 11 s
    of one core each, compile side by side). A warm run only loads, in any order. A process
    with a helper beside it that takes the first steps runs them backwards (:func:`helped_turns`).
    """
    steps = list(steps)
    if not steps:
        return
    if _config["helped"]:
        steps.reverse()  # a helper runs them from the first: this process from the last
    first = int(rank) % len(steps)
    for step in steps[first:] + steps[:first]:
        step()


def helped_turns(on: bool = True) -> None:
    """Run this process's :func:`in_turn` warm-ups from the last step back (``on``), or
    again from the rank's own step: a run of one rank whose helper process
    (:mod:`mpisdnn._aside`) runs the same warm-up from the first step, as rank 0 would,
    so the two compile different kernels at once and this process reaches the helper's
    first (longest) kernel last. The command turns it off again when its helper ends."""
    _config["helped"] = bool(on)


#: The modules imported by numba's lowering registries (``refresh``) that register
#: implementations of ``typeof``; tests/test_walltime.py checks the list.
TYPEOF_MODULES = ("numba.core.ccallback", "numba.experimental.function_type")


def _import_typeof_modules() -> None:
    """Import :data:`TYPEOF_MODULES` in the calling thread (under 1 ms)."""
    for name in TYPEOF_MODULES:
        importlib.import_module(name)


def preload() -> None:
    """Load numba's lowering registries in a background thread (idempotent).

    numba imports them at a process's first kernel compile or cache load: about 0.3 s of
    imports per rank (two thirds of loading 19 cached kernels). Started when a command
    begins reading its inputs, they load while the ranks mostly wait on files, MPI or code
    that releases the GIL (rank 0 parsing TSV layers, the others waiting for them).
    The compiler lock is held meanwhile, so a kernel needed sooner waits for it as it would
    have done the work itself.
    """
    if _config.get("preloading"):
        return
    _config["preloading"] = True
    # numba's typeof runs outside the compiler lock, at every kernel's first call: a
    # registration of a typeof implementation that the thread's imports made meanwhile broke
    # its lookup ("dictionary changed size during iteration", CI 2026-12-02). The modules
    # that register one are imported here, before the thread starts.
    _import_typeof_modules()

    def work():
        try:
            from numba.core.compiler_lock import global_compiler_lock
            from numba.core.registry import cpu_target

            with global_compiler_lock:
                cpu_target.target_context.refresh()
        except Exception:  # noqa: BLE001 - only an optimisation: the first compile does it
            pass

    threading.Thread(target=work, name="mpisdnn-numba-preload", daemon=True).start()


def has_cache_index(dispatcher) -> bool:
    """Whether numba has saved machine code of ``dispatcher`` (a ``cache=True`` kernel) in
    the cache: its index file exists, for whatever types. ``False`` where that cannot be
    told (numba's private layout differs): a caller then does the work a first run needs.
    Lets a warm-up that only pays on a first run be skipped on the later ones."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except Exception:  # noqa: BLE001 - numba internals: not knowing is "not cached"
        return False


def statistics() -> dict:
    """Seconds and counts of kernel compiles and cache loads in this process so far.

    ``compile_seconds`` (kernels compiled, waiting for another rank's compile included;
    ``compile_cpu_seconds``: the CPU time of this process's own compiles, what the wall
    would be on an idle core),
    ``load_seconds`` (kernels loaded from the cache), ``compiled`` (here), ``waited`` (for
    another process that compiled them, then loaded), ``loaded``, ``lock_wait_seconds``,
    ``seconds`` (all of it), ``cache_dir``.
    """
    out = dict(_stats)
    out["seconds"] = out["compile_seconds"] + out["load_seconds"]
    out["cache_dir"] = cache_dir()
    return out


def reset_statistics() -> None:
    """Zero the counters (tests; a long-lived process measuring one step)."""
    for key in _stats:
        _stats[key] = 0 if isinstance(_stats[key], int) else 0.0
    _config["announced"] = False


def done_line(stats: dict | None = None) -> str | None:
    """``mpisdnn: compiled N kernels in X s (cached in DIR ...)``, or ``None`` when nothing
    was compiled."""
    st = statistics() if stats is None else stats
    if not st["compiled"] and not st.get("waited"):
        return None
    other = f", {st['waited']} compiled by another rank" if st.get("waited") else ""
    return (
        f"mpisdnn: compiled {st['compiled']} kernels{other} in {st['compile_seconds']:.1f} s "
        f"(cached in {st['cache_dir']}; later runs load them)"
    )
