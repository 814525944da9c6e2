#!/usr/bin/env python
"""Signal soak test: SIGTERM / SIGINT at random moments of real MPI runs, counting hangs.

Each try starts ``mpiexec -n RANKS python -m mpisdnn CMD`` (a writer long enough to be
caught mid-write), waits a random delay, sends the signal and waits for the job to end:

- half the delays fall in the first ``--startup`` seconds, where the ranks import numpy and
  meet in ``MPI_Init`` (the race that made hydra hang when SIGTERM was first handled,
  docs/sweep.md G7); the rest anywhere up to ``--max-delay`` (loading, computing, writing);
- the signal goes to mpiexec (which forwards it, as ``scancel`` and Slurm do to the step),
  to the whole process group (a terminal's Ctrl-C) or to one rank only (``--targets``).

A try is *clean* when the job ends within ``--timeout`` seconds with 128 + signal and
exactly the one line ``mpisdnn: terminated`` (``interrupted``), or with 0 when the run
finished before the signal, no traceback, and no file left but the output. A job still
running after the timeout is a *hang* (then killed with SIGKILL). A signal that finds a
rank without mpisdnn's handlers (its interpreter still starting, read from
``/proc/PID/status`` just before the signal) is *before start*: the default action ends
that rank, and no line can be printed.

    python scripts/soak_signals.py --tries 100 --ranks 2 --json soak.json
    python scripts/soak_signals.py --tries 20 --load 2      # two busy-looping processes too

The CI version is ``tests/test_reliability_signals.py::test_signal_soak_short``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from mpisdnn.system import load_average, mpiexec_path

LINES = {signal.SIGTERM: "mpisdnn: terminated", signal.SIGINT: "mpisdnn: interrupted"}




def command(kind: str, out: Path, layers: int, graph: Path | None = None) -> list[str]:
    """The mpisdnn command line a try runs (``out`` is its output)."""
    if kind == "project":
        return ["project", str(graph), "-o", str(out), "--quiet"]
    return ["generate", "network", "--neurons", "1024", "--layers", str(layers), "-o", str(out)]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def _rank_pids(launcher: int) -> list[int]:
    pids = []
    for pid in _descendants(launcher):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if b"PMI_RANK=" in fh.read():
                    pids.append(pid)
        except OSError:
            pass
    return pids


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (``SigCgt`` in
    ``/proc/PID/status``); False when the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _armed(proc: subprocess.Popen, ranks: int) -> bool:
    """Whether every rank of the job runs mpisdnn's signal handlers yet.

    SIGTERM is the mark: Python itself catches only SIGINT, and mpisdnn installs both at
    once before anything heavy is imported (``mpisdnn.__main__``). A rank that has no handler
    when the signal comes dies of it, whatever the run then does; the try is "before start".
    """
    pids = [proc.pid] if ranks == 1 else _rank_pids(proc.pid)
    return len(pids) == ranks and all(_catches(pid, signal.SIGTERM) for pid in pids)


def one_try(
    rng: random.Random, args, workdir: Path, signum: int, target: str, delay: float
) -> dict:
    """Run one job, signal it after ``delay`` seconds, judge how it ended."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    out = workdir / "out.h5"
    cmd = [sys.executable, "-m", "mpisdnn", *command(args.command, out, args.layers, args.graph)]
    if args.ranks > 1:
        cmd = [mpiexec_path(), "-n", str(args.ranks), *cmd]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    time.sleep(delay)
    sent = proc.poll() is None
    # Looked at just before the signal: a handler installed in between makes rank 0 print
    # its line, and the try is then judged as any other.
    armed = sent and _armed(proc, args.ranks)
    if sent:
        if target == "group":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)
        elif target == "rank":
            ranks = _rank_pids(proc.pid)
            victim = rng.choice(ranks) if ranks else proc.pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signum)
        else:
            proc.send_signal(signum)
    hang = False
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        hang = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    took = time.monotonic() - t0
    lines = [ln for ln in err.splitlines() if ln.startswith("mpisdnn")]
    left = sorted(p.name for p in workdir.iterdir() if p.name != "out.h5")
    code = proc.returncode
    early = sent and not armed and not lines and not left
    if hang:
        verdict = "hang"
    elif early and code != 0:
        # a rank's interpreter was still starting (it had no mpisdnn handler yet): Python's
        # own reaction (the signal's default action, or a KeyboardInterrupt traceback). Was a
        # time limit (0.5 s), which a loaded CI machine passed: rank 0 still starting at 0.87 s
        # died silently of SIGTERM, and the try was judged "other"
        verdict = "before start"
    elif "Traceback" in err:
        verdict = "traceback"
    elif left and target == "rank":
        # only one rank was signalled: the others never learn of it before the job's abort,
        # so their temporaries stay for the next run or `mpisdnn clean` (their owner is dead)
        verdict = "left (one rank signalled)"
    elif left:
        verdict = "left files"
    elif code == 0 and not lines:
        verdict = "finished first"
    elif code == 128 + signum and lines == [LINES[signum]]:
        verdict = "clean"
    elif code == 128 + signum and not lines and target == "rank":
        verdict = "clean"  # a rank other than 0 was signalled and ended the job quietly
    else:
        verdict = "other"
    return {
        "signal": signal.Signals(signum).name, "target": target, "delay": round(delay, 3),
        "sent": sent, "exit": code, "lines": lines, "left": left, "seconds": round(took, 2),
        "armed": armed, "verdict": verdict,
        "stderr_tail": err.splitlines()[-6:] if verdict in ("other", "traceback", "hang") else [],
    }  # fmt: skip


def _load(n: int) -> list[subprocess.Popen]:
    """``n`` busy-looping processes (extra load beside whatever the machine runs)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]


def main(argv=None) -> int:
    """Run the soak; exit 1 when any try hung or ended uncleanly."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tries", type=int, default=100)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--signals", default="TERM,INT", help="comma-separated: TERM, INT")
    p.add_argument("--targets", default="mpiexec,group,rank")
    p.add_argument("--command", choices=["network", "project"], default="network")
    p.add_argument("--layers", type=int, default=600, help="layers of the generated network")
    p.add_argument("--scale", type=int, default=14, help="R-MAT scale of the projected graph")
    p.add_argument("--startup", type=float, default=1.5, help="seconds counted as start-up")
    p.add_argument("--max-delay", type=float, default=6.0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a try hangs")
    p.add_argument("--load", type=int, default=0, help="extra busy-looping processes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write every try and the totals here")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    signums = [getattr(signal, f"SIG{s.strip()}") for s in args.signals.split(",")]
    targets = [t.strip() for t in args.targets.split(",")]
    loaders = _load(args.load)
    tries = []
    load_before = load_average()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            args.graph = Path(tmp) / "g.h5"
            if args.command == "project":
                subprocess.run(
                    [sys.executable, "-m", "mpisdnn", "generate", "rmat", "--scale",
                     str(args.scale), "-o", str(args.graph)], check=True,
                )  # fmt: skip
            for i in range(args.tries):
                signum, target = rng.choice(signums), rng.choice(targets)
                top = args.startup if i % 2 == 0 else args.max_delay
                delay = rng.uniform(0.0, top)
                r = one_try(rng, args, Path(tmp) / "w", signum, target, delay)
                tries.append(r)
                print(
                    f"{i + 1:4d} {r['signal']:4s} {r['target']:7s} {delay:5.2f}s -> exit "
                    f"{r['exit']} in {r['seconds']:5.1f}s {r['verdict']} {r['stderr_tail']}",
                    flush=True,
                )
    finally:
        for proc in loaders:
            proc.kill()
            proc.wait()
    totals = Counter(r["verdict"] for r in tries)
    summary = {
        "tries": len(tries), "ranks": args.ranks, "command": args.command,
        "verdicts": dict(totals), "load_average": [load_before, load_average()[0]],
        "max_seconds": max((r["seconds"] for r in tries), default=0),
    }  # fmt: skip
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "tries": tries}, indent=1))
    bad = sum(
        n
        for v, n in totals.items()
        if v not in ("clean", "finished first", "before start", "left (one rank signalled)")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
