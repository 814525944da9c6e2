"""Where the wall time of a command went, from the moment its first process started.

A command makes one :class:`WallClock` when it starts running, marks the end of each of its
steps (:meth:`WallClock.mark`), and asks for :meth:`WallClock.parts` when it reports. The
parts add up to the wall by construction (``other`` is what no step claims), so a report
shows where every second went: the interpreter and imports before the command ran
(``startup``), kernel compiles and cache loads wherever they happened (``kernels``), and the
command's own steps with the kernel time taken out of them.
"""

from __future__ import annotations

import time

from .system import process_start_time

__all__ = ["WallClock", "PART_ORDER", "kernel_seconds"]

#: The parts of an ``infer`` wall, in the order the summary prints them.
PART_ORDER = ("startup", "setup", "kernels", "load", "preparation", "part1", "part2",
              "writing", "other")  # fmt: skip


def kernel_seconds() -> float:
    """Seconds this process spent compiling or loading kernels so far (0 without numba's
    hook installed)."""
    from .kernel_cache import statistics

    return statistics()["seconds"]


class WallClock:
    """The steps of one command on this rank, timed from the job's start.

    Parameters
    ----------
    comm : mpi4py communicator
        The job's ranks: the job starts when its earliest process did (one ``allreduce``).
    """

    def __init__(self, comm):
        from .parallel import allreduce

        now = time.time()
        self.entered = time.perf_counter()
        started = process_start_time() or now
        self.job_start = allreduce(comm, started, "min")
        self.startup = max(0.0, now - self.job_start)
        self._last = self.entered
        self._k_last = kernel_seconds()
        self._k_first = self._k_last
        self.steps: dict = {}

    def mark(self, name: str) -> None:
        """End the step ``name`` (it began at the previous mark, or when the clock was made);
        its seconds and the kernel seconds inside it are kept."""
        now, k = time.perf_counter(), kernel_seconds()
        sec, ks = self.steps.get(name, (0.0, 0.0))
        self.steps[name] = (sec + now - self._last, ks + k - self._k_last)
        self._last, self._k_last = now, k

    def elapsed(self) -> float:
        """Seconds since the job started."""
        return self.startup + time.perf_counter() - self.entered

    def parts(self, load: float = 0.0, part1: float = 0.0, part2: float = 0.0,
              timed_kernels: float = 0.0) -> dict:  # fmt: skip
        """The wall so far and its parts (the report's ``phases.wall``).

        ``load``, ``part1`` and ``part2`` are the run's own agreed timings (they end on
        barriers, so rank 0's intervals contain them). Kernel time is taken out of the step
        it happened in and reported as ``kernels``; ``preparation`` is the rest of the run
        step outside parts 1 and 2 (weights prepared for the backend, rows moved home).
        ``timed_kernels``: kernel seconds inside parts 1 and 2 (which contain them, so they
        are not counted again as ``kernels``; the parts then still add up to the wall).
        """
        from .kernel_cache import statistics

        wall = self.elapsed()
        k_all = kernel_seconds() - self._k_first
        timed = min(max(0.0, timed_kernels), k_all)  # the ranks' most: at most this rank's
        k_total = k_all - timed
        step = {name: sec - ks for name, (sec, ks) in self.steps.items()}
        if "run" in step:  # the run step's kernels were taken out: put back those of the parts
            step["run"] += timed
        k_load = self.steps.get("load", (0.0, 0.0))[1]
        parts = {
            "startup": self.startup,
            "setup": step.get("setup", 0.0),
            "kernels": k_total,
            "load": max(0.0, load - k_load) if "load" in step else 0.0,
            "preparation": max(0.0, step["run"] - part1 - part2) if "run" in step else 0.0,
            "part1": part1,
            "part2": part2,
            "writing": step.get("writing", 0.0),
        }
        parts["other"] = wall - sum(parts.values())
        st = statistics()
        keys = ("compile_seconds", "compile_cpu_seconds", "load_seconds", "compiled", "waited",
                "loaded", "lock_wait_seconds", "cache_dir")  # fmt: skip
        kernels = {k: st[k] for k in keys}
        return {"seconds": wall, "job_start": self.job_start, "parts": parts, "kernels": kernels}
