#!/usr/bin/env python
"""Reading graphs and whole projections, side by side with scipy, pandas, graphblas (issue 40).

On the MovieLens-20M shape (``generate bipartite --preset movielens-20m --seed 1``, written
once as ``.mtx``, ``.tsv`` and ``.csv`` into ``--data``), in one run, each contender in a
fresh process:

* **read**: ``mpiexec -n RANKS mpisdnn project FILE`` (the report's ``phases.read_seconds``,
  the slowest rank, and its ``parse``/``exchange``/``build`` phases) against
  ``scipy.io.mmread`` of the ``.mtx`` (fast_matrix_market with ``--threads`` threads, set
  explicitly since its default is every CPU of the machine; also with 1 thread, and with
  ``.tocsr()``, the CSR that mpisdnn builds) and ``pandas.read_csv`` of the TSV/CSV (C
  engine), timed inside their processes; with ``--baseline DIR``, also the mpisdnn of another
  checkout (the code before a change), interleaved rep by rep;
* **whole wall**: the wall time of ``mpiexec -n RANKS mpisdnn project ml20m.mtx --weight
  count`` (start-up, read, plan, compute; no output) against a process that runs
  ``scipy.io.mmread`` + ``A.T @ A`` (and python-graphblas' ``plus_times``, when installed),
  each measured from outside (interpreter start included for all).

networkx is not run at this size (``bipartite.weighted_projected_graph`` builds Python
dicts: hours at 20 M edges); the test suite compares against it on small graphs.

Prints a table, the load average, peak RSS, and ``TARGET`` lines (read ≤ mmread; whole wall
≥ 4× faster than mmread + A.T @ A). Re-measure on a quiet machine with::

    .venv/bin/python scripts/bench_projection_read.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PEER = r"""
import sys, time, resource, json
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if kind in ("mmread", "mmread-csr"):
    import scipy.io
    import scipy.io._fast_matrix_market as fmm
    fmm.PARALLELISM = int(sys.argv[3])  # 0 would be every CPU of the machine: say how many
    a = scipy.io.mmread(path)
    if kind == "mmread-csr":
        a = a.tocsr()
elif kind == "pandas":
    import pandas as pd
    a = pd.read_csv(path, sep=sys.argv[3], header=None, comment="%")
elif kind in ("scipy-ata", "graphblas-ata"):
    import scipy.io
    a = scipy.io.mmread(path).tocsr()
    a.data[:] = 1
    if kind == "scipy-ata":
        h = a.T.tocsr() @ a
    else:
        import numpy as np
        import graphblas as gb
        gb.ss.config["nthreads"] = int(sys.argv[3])
        g = gb.Matrix.from_csr(a.indptr, a.indices, np.ones(a.nnz, np.int32), ncols=a.shape[1])
        h = g.T.mxm(g, gb.semiring.plus_pair[gb.dtypes.INT32]).new()
print("RESULT " + json.dumps({"seconds": time.perf_counter() - t,
      "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def make(data: Path) -> dict:
    from mpisdnn.generate.graphs import MOVIELENS_20M, bipartite_powerlaw
    from mpisdnn.projection import Graph, write_graph

    files = {k: data / f"ml20m.{k}" for k in ("mtx", "tsv", "csv")}
    if not all(f.exists() for f in files.values()):
        data.mkdir(parents=True, exist_ok=True)
        g = Graph(bipartite_powerlaw(**MOVIELENS_20M, seed=1, weights="rating"), True, "ml20m")
        for fmt, f in files.items():
            write_graph(f, g, fmt, index_base=1)
    return files


def peer(kind, path, *extra, threads=2) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEER, kind, str(path), *map(str, extra)],
                       capture_output=True, text=True, env=env)  # fmt: skip
    wall = time.perf_counter() - t
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]), wall=wall)
    return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}


def mpisdnn(path, ranks, threads, report: Path, fmt="auto", baseline=None) -> dict:
    from mpisdnn.system import mpiexec_path
    mpiexec = mpiexec_path()
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "mpisdnn", "project",
           str(path), "--format", fmt, "--self-loops", "keep", "--threads",
           str(max(1, threads // ranks)), "--quiet", "--report", str(report)]  # fmt: skip
    if fmt in ("tsv", "csv"):
        cmd += ["--index-base", "1"]
    env = dict(os.environ)
    if baseline:  # another checkout's mpisdnn (the code before a change), same environment
        env["PYTHONPATH"] = os.pathsep.join([str(baseline), env.get("PYTHONPATH", "")])
    t = time.perf_counter()
    # `python -m` puts the working directory first on sys.path: run a baseline from its own
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=baseline)
    wall = time.perf_counter() - t
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    rep = json.loads(report.read_text())
    ph = rep["phases"]
    return {
        "wall": wall,
        "read": ph["read_seconds"],
        "read_phases": ph.get("read", {}),
        "plan": ph["plan_seconds"] + ph.get("kernel_load_seconds", 0.0),
        "compute": ph["compute_seconds"],
        "rss": max(rep["ranks"]["peak_rss_bytes"]),
        "nnz": rep["result"]["nnz"],
    }


def med(runs, key):
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")


def main(argv=None) -> int:
    from mpisdnn.system import format_size, load_average_text

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "data" / "bench_projection"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads in all (2)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--skip-ata", action="store_true", help="skip the whole-wall comparison")
    p.add_argument("--json")
    p.add_argument("--baseline", help="a checkout of the code before a change, run "
                   "interleaved with this one (read phases and ratio)")
    p.add_argument("--formats", default="mtx,tsv,csv")
    args = p.parse_args(argv)
    files = make(Path(args.data))
    tmp = Path(args.data) / "reports"
    tmp.mkdir(exist_ok=True)
    print(f"# load average before: {load_average_text()}", flush=True)
    out = {"load_before": load_average_text()}
    mpisdnn(files["mtx"], args.ranks, args.threads, tmp / "warm.json")  # numba, page cache
    if args.baseline:
        mpisdnn(files["mtx"], args.ranks, args.threads, tmp / "warm.json",
                baseline=args.baseline)  # fmt: skip
    rows = []
    for fmt in args.formats.split(","):
        f = files[fmt]
        mine, old, mm, mm1, mmc, pdr = [], [], [], [], [], []
        for _ in range(args.reps):  # interleaved: each contender sees the same load
            mine.append(mpisdnn(f, args.ranks, args.threads, tmp / f"{fmt}.json", fmt))
            if args.baseline:
                old.append(mpisdnn(f, args.ranks, args.threads, tmp / f"{fmt}-old.json", fmt,
                                   baseline=args.baseline))  # fmt: skip
            mm.append(peer("mmread", files["mtx"], args.threads, threads=args.threads))
            mm1.append(peer("mmread", files["mtx"], 1, threads=1))
            mmc.append(peer("mmread-csr", files["mtx"], args.threads, threads=args.threads))
            if fmt != "mtx":
                pdr.append(peer("pandas", f, "\t" if fmt == "tsv" else ","))
        rows.append((fmt, mine, mm, pdr))
        r = med(mine, "read")
        ph = {k: statistics.median(x["read_phases"].get(k, 0.0) for x in mine)
              for k in mine[0].get("read_phases", {})}  # fmt: skip
        print(f"read {fmt}: mpisdnn -n {args.ranks} {r:.2f} s "
              f"({', '.join(f'{k} {v:.2f}' for k, v in ph.items())})"
              + (f" | before the change {med(old, 'read'):.2f} s" if old else "")
              + f" | scipy.io.mmread(.mtx) {args.threads} threads {med(mm, 'seconds'):.2f} s, "
              f"1 thread {med(mm1, 'seconds'):.2f} s, + .tocsr() {med(mmc, 'seconds'):.2f} s"
              + (f" | pandas.read_csv {med(pdr, 'seconds'):.2f} s" if pdr else "")
              + f" | peak RSS/rank {format_size(med(mine, 'rss'))}", flush=True)  # fmt: skip
        each = [m["seconds"] / x["read"] for m, x in zip(mm, mine)
                if "read" in x and "seconds" in m]  # fmt: skip
        ratio = med(mm, "seconds") / r
        print(f"TARGET read {fmt} at {args.ranks} ranks <= mmread: {ratio:.2f}x "
              f"({'reached' if ratio >= 1 else 'not reached'}; per rep "
              f"{', '.join(f'{x:.2f}' for x in each)}; mmread+tocsr/mpisdnn "
              f"{med(mmc, 'seconds') / r:.2f}x)", flush=True)  # fmt: skip
        out[f"read_{fmt}"] = {"mpisdnn": mine, "baseline": old, "mmread": mm, "mmread_1": mm1,
                              "mmread_csr": mmc, "pandas": pdr}  # fmt: skip
    if not args.skip_ata:
        mine = rows[0][1]
        ata = [peer("scipy-ata", files["mtx"], threads=1) for _ in range(args.reps)]
        try:
            import graphblas  # noqa: F401

            gb = [peer("graphblas-ata", files["mtx"], args.threads, threads=args.threads)
                  for _ in range(args.reps)]  # fmt: skip
        except ImportError:
            gb = []
        w = med(mine, "wall")
        print(f"whole wall (.mtx): mpiexec -n {args.ranks} mpisdnn project {w:.2f} s (read "
              f"{med(mine, 'read'):.2f}, plan {med(mine, 'plan'):.2f}, compute "
              f"{med(mine, 'compute'):.2f}; peak RSS/rank {format_size(med(mine, 'rss'))}) | "
              f"scipy mmread + A.T@A {med(ata, 'wall'):.2f} s (RSS "
              f"{format_size(med(ata, 'rss'))})"
              + (f" | graphblas mmread + plus_pair {med(gb, 'wall'):.2f} s (RSS "
                 f"{format_size(med(gb, 'rss'))})" if gb else " | graphblas not installed"),
              flush=True)  # fmt: skip
        ratio = med(ata, "wall") / w
        print(f"TARGET whole wall >= 4x scipy mmread + A.T@A: {ratio:.2f}x "
              f"({'reached' if ratio >= 4 else 'not reached'})", flush=True)
        out["whole"] = {"mpisdnn": mine, "scipy": ata, "graphblas": gb}
    out["load_after"] = load_average_text()
    print(f"# load average after: {out['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
