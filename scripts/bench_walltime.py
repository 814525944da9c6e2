#!/usr/bin/env python
"""Where the wall of a warm ``mpiexec -n R mpisdnn infer`` goes, side by side with another
install (e.g. the main branch's venv), runs interleaved so both see the same machine.

For each install and round it runs the same command, reads its JSON report and records the
wall seen from outside (``mpiexec`` to exit), load, part 1 and part 2, and, where the report
has it (``phases.wall``), the parts of the wall. It prints the median of each, and the
seconds outside load and parts 1-2: issue 41's target is <= 1 s at 2 ranks for 1024 x 120
with 60,000 TSV inputs, as the report shows.

    python scripts/bench_walltime.py --network data/bench/neuron1024 \\
        --inputs data/bench/sparse-images-1024.tsv --truth data/bench/truth.tsv \\
        --python /work/main/.venv/bin/python --python .venv/bin/python --rounds 5

A first, untimed run per install warms its kernel cache and the page cache. ``--cold DIR``
instead runs each install once with a fresh ``NUMBA_CACHE_DIR`` under DIR (first run after
install) and once warm, and prints the difference (target: <= 30 s more than warm).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mpisdnn.system import load_average_text  # noqa: E402


def run_once(py: str, args, report: Path, env=None) -> dict:
    cmd = ["mpiexec", "-n", str(args.ranks), py, "-m", "mpisdnn", "infer",
           "--network", args.network, "--inputs", args.inputs, "--report", str(report),
           "--quiet"]  # fmt: skip
    if args.truth:
        cmd += ["--truth", args.truth]
    # Run in the install's own checkout: ``python -m mpisdnn`` imports from the working
    # directory first.
    root = Path(py).absolute().parents[2]
    cwd = root if (root / "mpisdnn").is_dir() else None
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}{res.stderr}")
    r = json.loads(report.read_text())
    ph = r["phases"]
    row = {"outside_wall": wall, "load": ph["load_seconds"], "part1": ph["part1_seconds"],
           "part2": ph["part2_seconds"]}  # fmt: skip
    row["outside_rest"] = wall - row["load"] - row["part1"] - row["part2"]
    w = ph.get("wall")
    if w:
        row["report_wall"] = w["seconds"]
        row["report_rest"] = w["seconds"] - row["load"] - row["part1"] - row["part2"]
        for k, v in w["parts"].items():
            row[f"part:{k}"] = v
        row["compiled"] = w["kernels"]["compiled"]
    row["summary"] = res.stdout
    return row


def median_table(results: dict) -> str:
    keys = []
    for rows in results.values():
        for r in rows:
            keys += [k for k in r if k not in keys and k != "summary"]
    names = list(results)
    out = ["| seconds (median) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in keys:
        cells = []
        for n in names:
            vals = [r[k] for r in results[n] if k in r]
            cells.append(f"{statistics.median(vals):.3f}" if vals else "–")
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--network", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--truth")
    p.add_argument("--python", action="append", required=True, help="an install's python")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold", metavar="DIR", help="first-run-after-install measurement")
    p.add_argument("--out", type=Path, default=Path("results/walltime.json"))
    a = p.parse_args(argv)
    for name in ("network", "inputs", "truth"):
        if getattr(a, name):
            setattr(a, name, os.path.abspath(getattr(a, name)))
    tmp = Path(tempfile.mkdtemp(prefix="bench-walltime-"))
    results: dict = {py: [] for py in a.python}
    print(f"load average before: {load_average_text(3)}", flush=True)
    try:
        if a.cold:
            for py in a.python:
                cache = Path(a.cold) / f"numba-{abs(hash(py))}"
                shutil.rmtree(cache, ignore_errors=True)
                env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
                cold = run_once(py, a, tmp / "cold.json", env)
                warm = run_once(py, a, tmp / "warm.json", env)
                extra = cold["outside_wall"] - warm["outside_wall"]
                print(f"{py}: first run {cold['outside_wall']:.1f} s, warm "
                      f"{warm['outside_wall']:.1f} s: +{extra:.1f} s "
                      f"(load average {load_average_text()})", flush=True)  # fmt: skip
                print(cold["summary"])
                results[py] = [cold, warm]
        else:
            for py in a.python:
                run_once(py, a, tmp / "w.json")  # warm the kernel and page caches
            for i in range(a.rounds):
                for py in a.python:
                    results[py].append(run_once(py, a, tmp / f"r{i}.json"))
                print(f"round {i + 1}/{a.rounds} done (load average {load_average_text()})",
                      flush=True)  # fmt: skip
            print(median_table(results))
            last = results[a.python[-1]][-1]["summary"]
            print("\nlast summary of", a.python[-1], "\n" + last)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1))
    print(f"load average after: {load_average_text(3)}; wrote {a.out}")
    print("re-measure on a quiet machine: the same command (medians of 5+ rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
