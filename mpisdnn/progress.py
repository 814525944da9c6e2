"""Rank-0 progress lines for long runs: layer k/L, active rows, rate so far, ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    """Callable passed to the engine; prints at most every ``interval`` seconds on rank 0.

    On a terminal the line is rewritten in place; in batch logs (stdout not a TTY) each update
    is a plain line, so Slurm output files stay readable.
    """

    def __init__(
        self,
        comm,
        inputs: int,
        edges_per_layer: float,
        interval: float = 5.0,
        stream=None,
        label: str = "layer",
    ):
        self.enabled = comm.rank == 0 and interval > 0
        self.interval = float(interval)
        self.inputs = inputs
        self.edges_per_layer = edges_per_layer
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label = label
        self._last = time.perf_counter()
        self._printed = False

    def __call__(self, done: int, total: int, active: int, seconds: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < self.interval and done < total:
            return
        if done == total and not self._printed:
            return  # short run: the summary says it all
        self._last = now
        rate = self.inputs * self.edges_per_layer * done / seconds if seconds > 0 else 0.0
        eta = seconds / done * (total - done) if done else 0.0
        line = (
            f"[progress] {self.label} {done}/{total}  active rows (rank 0) {active}  "
            f"rate {rate / 1e9:.2f} GE/s  elapsed {seconds:.1f} s  ETA {eta:.1f} s"
        )
        if self.tty:
            end = "\n" if done == total else ""
            self.stream.write("\r" + line + end)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._printed = True
