"""Rank-0 progress lines for long runs: layer k/L, active rows, rate so far, ETA
(:class:`Progress`), and a line every few seconds through a step that reports nothing
itself, such as loading (:class:`Heartbeat`)."""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["Progress", "Heartbeat", "format_duration"]


def format_duration(seconds: float) -> str:
    """``8.2 s``, ``3m07s`` or ``2h05m``: short enough for a progress line, exact enough."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Callable passed to the engine; prints at most every ``interval`` seconds on rank 0.

    On a terminal the line is rewritten in place; in batch logs (stdout not a TTY) each update
    is a plain line, so Slurm output files stay readable. Nothing is printed for a run that
    ends before the first interval (the summary says it all), and other ranks never print or
    communicate: the reporter costs one clock read per layer.

    Parameters
    ----------
    comm : mpi4py communicator
        Only its rank is used.
    inputs : int
        Global number of inputs (for the rate).
    edges_per_layer : float
        Mean DNN edges per layer (rate = inputs x edges of the layers done / seconds).
    interval : float
        Seconds between lines; 0 or less turns the reporter off (``--quiet``).
    stream : file-like, optional
        Default ``sys.stdout``.
    label : str
        What one step is called (``layer``).
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
        self._width = 0

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
            f"rate {rate / 1e9:.2f} GE/s  elapsed {format_duration(seconds)}  "
            f"ETA {format_duration(eta)}"
        )
        if self.tty:
            # Rewrite in place; pad over the rest of a longer previous line.
            pad = " " * max(0, self._width - len(line))
            self._width = len(line)
            self.stream.write("\r" + line + pad + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._printed = True


#: The shortest time between two heartbeat lines, whatever ``--progress`` asks for.
MIN_HEARTBEAT_SECONDS = 0.5


class Heartbeat:
    """A context manager that prints ``[progress] LABEL: STATUS  elapsed T`` on rank 0 every
    ``interval`` seconds while its block runs.

    For steps that cannot report through a callback (a read inside a library, a long
    write): a daemon thread wakes every ``interval`` and prints. Python runs it between the
    main thread's bytecodes and while the main thread waits in I/O or in code that releases
    the GIL, so a line may come late while one long compiled call holds the GIL, never
    early. Nothing is printed for a step shorter than ``interval``; other ranks start no
    thread.

    Parameters
    ----------
    comm : mpi4py communicator
        Only its rank is used.
    label : str
        What the step is (``loading network and inputs``).
    interval : float
        Seconds between lines (at least ``MIN_HEARTBEAT_SECONDS``); 0 or less: silent.
    stream : file-like, optional
        Default ``sys.stdout``.

    Examples
    --------
    >>> with Heartbeat(comm, "writing inputs", 10) as beat:   # doctest: +SKIP
    ...     for k, block in enumerate(blocks):
    ...         beat.say(f"block {k + 1}/{len(blocks)}")
    ...         write(block)
    """

    def __init__(self, comm, label: str, interval: float, stream=None):
        self.enabled = comm.rank == 0 and interval > 0
        # A timer thread waking every 1e-9 s (``--progress 1e-9`` asks for every layer's line)
        # would print hundreds of lines and take the GIL from the load it reports on.
        self.label, self.interval = label, max(float(interval), MIN_HEARTBEAT_SECONDS)
        self.stream = stream or sys.stdout
        self._status = ""
        self._stop = threading.Event()
        self._thread = None
        self._t0 = time.perf_counter()

    def __enter__(self):
        self._t0 = time.perf_counter()
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="mpisdnn-progress",
                                            daemon=True)  # fmt: skip
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def say(self, status: str) -> None:
        """What the step is doing now (``block 3/10``): shown on the next line printed."""
        self._status = status

    @property
    def status(self) -> str:
        """What the step is doing now, as last :meth:`say` told it."""
        return self._status

    def line(self) -> str:
        """The line printed now."""
        status = f": {self._status}" if self._status else ""
        elapsed = format_duration(time.perf_counter() - self._t0)
        return f"[progress] {self.label}{status}  elapsed {elapsed}"

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # stream closed under us: stop quietly
                return
