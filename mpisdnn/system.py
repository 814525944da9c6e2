"""Facts about this process and node: ranks per node, default threads, memory use, page
advice for large buffers (:func:`populate`, :func:`small_pages`).

One helper per job, shared by inference, projection, reports and benchmarks.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import resource
import sys
import time

from .errors import UsageError

__all__ = [
    "parse_size",
    "format_size",
    "available_memory",
    "node_comm",
    "local_ranks",
    "node_rank",
    "cores",
    "default_threads",
    "peak_rss_bytes",
    "pss_bytes",
    "load_average",
    "load_average_text",
    "populate",
    "small_pages",
    "release",
    "process_start_time",
    "mpiexec_path",
]


def node_comm(comm):
    """The ranks of ``comm`` that share this node (``MPI_COMM_TYPE_SHARED``)."""
    from .parallel import split_shared

    return split_shared(comm)


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
    return _proc_kib(f"/proc/{pid or 'self'}/smaps_rollup", "Pss:")


def rss_bytes(pid: int | None = None) -> int | None:
    """Resident set size now (``VmRSS``), or ``None``. Linux only (``/proc/PID/status``)."""
    return _proc_kib(f"/proc/{pid or 'self'}/status", "VmRSS:")


def process_start_time(pid: int | None = None) -> float | None:
    """When the process started (seconds since the epoch, like ``time.time()``), or ``None``.

    Read from ``/proc/PID/stat`` (start time in clock ticks since boot) against the boot
    clock, so the interpreter's own start-up and every import before mpisdnn's first line
    are counted (a timestamp taken in ``__main__`` would miss them). Linux only; resolution
    one clock tick (10 ms).
    """
    try:
        with open(f"/proc/{pid or 'self'}/stat") as fh:
            stat = fh.read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        now = time.time()
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return now - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


_LOADAVG = "/proc/loadavg"


def mpiexec_path() -> str:
    """The ``mpiexec`` beside this Python (a virtual environment's, whose MPICH matches its
    mpi4py), else the one on ``PATH``, else the bare name (for benchmarks and tests that
    start MPI jobs)."""
    import shutil

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or "mpiexec"


def load_average() -> tuple[float, float, float]:
    """The system's 1-, 5- and 15-minute load averages (NaN where they are unknown).

    The benchmarks print it next to their timings: above the number of cores the machine is
    shared and timings are noisy.

    Returns
    -------
    tuple of float
        ``(one, five, fifteen)``: on Linux the numbers ``/proc/loadavg`` shows (two decimals),
        elsewhere ``os.getloadavg()``; three NaNs where neither can tell (so ``[0]`` is always
        a float, and JSON reports keep their shape).
    """
    # /proc/loadavg first: os.getloadavg() on Linux goes through sysinfo(2), whose raw
    # fractions can round one hundredth away from what the kernel prints.
    try:
        with open(_LOADAVG) as fh:
            one, five, fifteen = (float(x) for x in fh.read().split()[:3])
        return one, five, fifteen
    except (OSError, ValueError):
        pass
    try:
        one, five, fifteen = os.getloadavg()
    except (OSError, AttributeError):
        return math.nan, math.nan, math.nan
    return float(one), float(five), float(fifteen)


def load_average_text(count: int = 1) -> str:
    """The first ``count`` load averages as ``/proc/loadavg`` writes them.

    Parameters
    ----------
    count : int
        1 (the 1-minute average, ``"0.52"``) to 3 (``"0.52 0.60 0.71"``).

    Returns
    -------
    str
        The averages with two decimals, separated by single spaces; ``"?"`` where they are
        unknown (see :func:`load_average`).
    """
    if not 1 <= count <= 3:
        raise ValueError(f"count must be 1, 2 or 3, not {count}")
    load = load_average()[:count]
    if any(math.isnan(x) for x in load):
        return "?"
    return " ".join(f"{x:.2f}" for x in load)


def _proc_kib(path: str, key: str) -> int | None:
    """Bytes of the first ``key  N kB`` line of a ``/proc`` file, or ``None`` (no such file,
    process gone, not Linux)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_tree(pid: int) -> list:
    """``pid`` and all its descendants (Linux ``/proc``; ``[pid]`` elsewhere): the ranks of an
    ``mpiexec`` job, for the benchmarks' memory samplers."""
    children: dict = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for d in entries:
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text) -> int:
    """``"64M"``, ``"2G"``, ``"1.5g"``, ``"500000"`` (bytes) -> bytes."""
    if isinstance(text, numbers.Integral):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise UsageError(f"memory size must look like 64M, 2G or 500000, got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return int(value)


def format_size(nbytes: float) -> str:
    """Bytes as ``512B``, ``1.5K``, ``64.0M``, ``2.0G`` (binary units, one decimal)."""
    for unit in ("B", "K", "M", "G", "T"):
        if abs(nbytes) < 1024 or unit == "T":
            return f"{nbytes:.0f}{unit}" if unit == "B" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024
    return f"{nbytes:.1f}T"  # pragma: no cover


def available_memory() -> int:
    """``MemAvailable`` from /proc/meminfo (bytes), or total physical memory as a fallback."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 << 30


def tolerate_full_numba_cache() -> None:
    """Let a compiled kernel run when numba cannot save it to its on-disk cache.

    numba writes each new kernel to ``__pycache__`` (or ``NUMBA_CACHE_DIR``) and raises
    when that write fails, so a full disk (or a file size limit) where the package lives
    ended a command with a traceback before any output was written. The cache only saves
    start-up time: a kernel that cannot be saved is used from memory, as numba itself does
    on Windows for ``EACCES``. Other errors still raise. Idempotent.
    """
    import errno

    from numba.core import caching

    if getattr(caching.Cache.save_overload, "_mpisdnn_tolerant", False):
        return
    save = caching.Cache.save_overload
    full = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

    def save_overload(self, sig, data):
        try:
            save(self, sig, data)
        except OSError as exc:
            if exc.errno not in full:
                raise

    save_overload._mpisdnn_tolerant = True
    caching.Cache.save_overload = save_overload


_MADV_DONTNEED = 4
_MADV_NOHUGEPAGE = 15
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_libc = None


def _madvise(arr, start: int, count, advice: int) -> None:
    """``madvise`` on the pages under ``arr[start:start+count]``; best effort (no-op where the
    call or the advice is unavailable)."""
    global _libc
    if count is None:
        count = arr.size - start
    if count <= 0 or not arr.flags.c_contiguous or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        page = 4096
        lo = arr.ctypes.data + start * arr.itemsize
        hi = lo + count * arr.itemsize
        lo = lo & ~(page - 1)
        _libc.madvise(lo, (hi - lo + page - 1) & ~(page - 1), advice)
    except (OSError, AttributeError, ValueError):  # pragma: no cover - best effort
        pass


def populate(arr, start: int = 0, count=None) -> None:
    """Fault in ``arr[start:start+count]`` with one ``madvise(MADV_POPULATE_WRITE)``.

    Page faults taken one by one inside the kernel cost several times more than one bulk
    populate on some virtual machines (first touch of memory the host has not backed yet).
    """
    _madvise(arr, start, count, _MADV_POPULATE_WRITE)


def release(arr, start: int = 0) -> None:
    """Hand the whole pages under ``arr[start:]`` back to the kernel (``MADV_DONTNEED``: an
    anonymous private map reads zeros there afterwards); best effort. The page holding
    ``arr[start - 1]`` is kept."""
    if start >= arr.size or not arr.flags.c_contiguous or not sys.platform.startswith("linux"):
        return
    page = 4096
    lo = (arr.ctypes.data + start * arr.itemsize + page - 1) & ~(page - 1)
    hi = (arr.ctypes.data + arr.size * arr.itemsize) & ~(page - 1)
    if hi > lo:
        base = (lo - arr.ctypes.data) // arr.itemsize
        _madvise(arr, base, (hi - lo) // arr.itemsize, _MADV_DONTNEED)


def small_pages(arr) -> None:
    """Ask for 4 KiB pages under ``arr`` (numpy asks for transparent huge pages above 4 MiB).

    On virtual machines that hand freed memory back to the host (free page reporting), a
    first-touched huge page costs the host a 2 MiB allocation: measured here, populating
    2 GiB of such memory took 7-8.7 s with huge pages and 0.7 s without (0.37 vs 0.19 s when
    the memory was recently used). Large results are written once, so small pages are the
    steady choice.
    """
    _madvise(arr, 0, None, _MADV_NOHUGEPAGE)
