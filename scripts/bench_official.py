#!/usr/bin/env python
"""The Graph Challenge table as a benchmark: ``mpisdnn challenge`` under ``mpiexec``, watched
from outside.

The work (finding the official files, converting once, generating what is missing, running
and checking every configuration, resuming, the table) is the ``mpisdnn challenge`` command
(:mod:`mpisdnn.sdnn.challenge`). This wrapper adds what only an outside observer can
measure: the whole ``mpiexec`` wall (start-up and exit included), the job's CPU seconds, the
peak of the summed PSS of all its processes (sampled every 0.25 s) and the load average, in
``OUT/bench.json``.

    python scripts/bench_official.py --official /data/graphchallenge --out results/official
    python scripts/bench_official.py --neurons 1024 --layers 120 480 --inputs 6000

The full one-sitting table (a quiet machine, ~30 GB of cache for N=65536 x 1920):

    python scripts/bench_official.py --official DATA_DIR --cache /big/disk/cache \\
        --out results/official --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mpisdnn.system import load_average_text, process_tree, pss_bytes  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--official", type=Path, help="folder with the official files (DATA_DIR)")
    p.add_argument("--neurons", type=int, nargs="+")
    p.add_argument("--layers", type=int, nargs="+")
    p.add_argument("--inputs", type=int, default=60000, help="generated inputs per N")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cache", type=Path, default=Path("data/official-cache"))
    p.add_argument("--out", type=Path, default=Path("results/official"))
    p.add_argument("--check-rows", type=int)
    p.add_argument("--full-check-edges", type=float)
    p.add_argument("--rerun", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    p.add_argument("--peers", action="store_true",
                   help="first time `pigz -dc` (or `gzip -dc`) of the official archives and "
                   ".gz inputs the run reads (the decompression peer of issue 41)")  # fmt: skip
    p.add_argument("--challenge-arg", action="append", default=[],
                   help="an extra flag for mpisdnn challenge, e.g. --threads=2")  # fmt: skip
    return p.parse_args(argv)


def challenge_command(a, data_dir) -> list:
    """The ``mpiexec -n R python -m mpisdnn challenge ...`` command line of the options."""
    from mpisdnn.system import mpiexec_path
    cmd = [mpiexec_path(), "-n", str(a.ranks), sys.executable, "-m", "mpisdnn", "challenge",
           str(data_dir), "--out", str(a.out), "--cache", str(a.cache), "--count",
           str(a.inputs), "--seed", str(a.seed), "--progress", "30"]  # fmt: skip
    for flag in ("neurons", "layers"):
        if getattr(a, flag):
            cmd += [f"--{flag}", *map(str, getattr(a, flag))]
    if a.check_rows:
        cmd += ["--check-rows", str(a.check_rows)]
    if a.full_check_edges is not None:
        cmd += ["--full-check-edges", repr(a.full_check_edges)]
    if a.rerun:
        cmd.append("--rerun")
    return cmd + list(a.challenge_arg)


class PssSampler:
    """Peak of the summed PSS of a process and all its descendants (``/proc``, Linux)."""

    def __init__(self, pid: int, every: float = 0.25):
        self.pid, self.every, self.peak = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            total = sum(pss_bytes(p) or 0 for p in process_tree(self.pid))
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _gz_sources(a, data) -> list:
    """The gzip files of DATA_DIR the run will read (archives and .gz inputs of its N's)."""
    from mpisdnn.sdnn.challenge import OFFICIAL_NEURONS
    from mpisdnn.sdnn.challenge_files import find_sources

    found = []
    for n in a.neurons or OFFICIAL_NEURONS:
        src = find_sources(data, n)
        for path in (src.network, src.inputs):
            if path and str(path).endswith(".gz"):
                found.append(Path(path))
    return found


def gzip_peers(paths) -> list:
    """``pigz -dc FILE`` (``gzip -dc`` where pigz is missing) of each file, read to the end:
    seconds and inflated MB/s. pigz inflates in one thread too, with reading, writing and
    checking in three others: the faster of the two peers."""
    import shutil

    tool = "pigz" if shutil.which("pigz") else "gzip"
    rows = []
    for path in paths:
        t = time.perf_counter()
        # the inflated bytes counted through a pipe (the peer writes nothing to disk)
        gz = subprocess.Popen([tool, "-dc", str(path)], stdout=subprocess.PIPE)
        total = 0
        while chunk := gz.stdout.read(1 << 22):
            total += len(chunk)
        if gz.wait() != 0:
            raise SystemExit(f"{tool} -dc {path} failed")
        dt = time.perf_counter() - t
        rows.append({"tool": tool, "file": str(path), "seconds": dt, "text_bytes": total,
                     "mb_s": total / dt / 1e6})  # fmt: skip
        print(f"[bench_official] peer {tool} -dc {path.name}: {dt:.1f} s, "
              f"{total / 1e9:.2f} GB of text, {total / dt / 1e6:.0f} MB/s", flush=True)
    return rows


def _tree_bytes(path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def main(argv=None) -> int:
    a = parse_args(argv)
    data = a.official
    if data is None:  # nothing official: everything generated
        data = Path(tempfile.mkdtemp(prefix="bench-official-empty-"))
    cmd = challenge_command(a, data)
    print(" ".join(cmd), flush=True)
    if a.dry_run:
        return 0
    peers = gzip_peers(_gz_sources(a, data)) if a.peers and a.official else []
    scratch0 = _tree_bytes(a.cache)
    load0 = load_average_text(3)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    sampler = PssSampler(proc.pid)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    bench = {
        "command": cmd,
        "exit_code": rc,
        "wall_seconds": wall,
        "cpu_seconds": ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime,
        "pss_peak_bytes": sampler.stop(),
        "load_average": f"{load0} before, {load_average_text(3)} after",
        "scratch_bytes": _tree_bytes(a.cache) - scratch0,
        "peers": peers,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench.json").write_text(json.dumps(bench, indent=1) + "\n")
    pss = bench["pss_peak_bytes"] / 2**30
    print(f"[bench_official] exit {rc}, whole mpiexec wall {wall:.1f} s, job CPU "
          f"{bench['cpu_seconds']:.0f} s, summed PSS peak {pss:.2f} GiB, load average "
          f"{bench['load_average']}, scratch written {bench['scratch_bytes'] / 2**30:.2f} GiB; "
          f"table in {a.out / 'challenge.md'}")  # fmt: skip
    if a.official is None:
        os.rmdir(data)
    return rc


if __name__ == "__main__":
    sys.exit(main())
