#!/usr/bin/env python
"""``mpisdnn infer --network SRC`` with TSV layers (a ``neuron{N}/`` directory or a
``neuron{N}.tar.gz``): the network's load, the whole run and each rank's peak RSS, side by
side with older source trees and with ``convert network`` of the same source (the peer),
interleaved in one run. The categories must be the same bytes for every tree and rank count.

Re-measure on a quiet machine (the lead), from the repository root::

    python scripts/bench_network_read.py make /tmp/bn --neurons 65536 --layers 120
    mkdir -p /tmp/bn/old && git archive 25a98cf | tar -x -C /tmp/bn/old   # rank 0 parsed
    python scripts/bench_network_read.py run /tmp/bn/neuron65536.tar.gz \\
        --inputs /tmp/bn/inputs.tsv --ranks 1 2 --old-src old=/tmp/bn/old --rounds 2
    rm -r /tmp/bn

``make`` writes the archive in the official format with its members in reverse layer order
(the official archives are in no order either; layer 1 last is the worst case for a reader
that looks for it) and 2,000 generated inputs as TSV. ``run`` times, for every round, rank
count and tree, ``mpiexec -n R python -m mpisdnn infer --network SRC --inputs IN`` (warm:
one untimed run per tree first) and prints the wall seen from outside, the report's load
and each rank's peak RSS; then ``mpiexec -n R mpisdnn convert network SRC`` (the peer: the
same parse, written to a v2 file instead of held).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mpisdnn.system import load_average_text  # noqa: E402


def make(args) -> None:
    from mpisdnn.formats.archive_write import network_archive
    from mpisdnn.generate.radixnet import radixnet_layers

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    layers = list(radixnet_layers(args.neurons, args.layers, seed=1))
    path = out / f"neuron{args.neurons}.tar.gz"
    with network_archive(path, args.neurons) as arc:
        for k in range(args.layers, 0, -1):
            arc.add(k, layers[k - 1].to_csc())
    gen = [sys.executable, "-m", "mpisdnn", "generate", "inputs", "--neurons",
           str(args.neurons), "--count", str(args.count), "--seed", "2", "-o",
           str(out / "inputs.h5"), "--tsv", str(out / "inputs.tsv"), "--quiet"]  # fmt: skip
    subprocess.run(gen, check=True, cwd=ROOT)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) and {out / 'inputs.tsv'}")


def _infer(tree: Path, src, inputs, ranks: int, tmp: Path) -> dict:
    report, cats = tmp / "r.json", tmp / "c.tsv"
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "mpisdnn", "infer", "--network",
           str(src), "--inputs", str(inputs), "--quiet", "--report", str(report),
           "--categories-out", str(cats)]  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr}")
    r = json.loads(report.read_text())
    return {"wall": wall, "load": r["phases"]["load_seconds"],
            "rss": max(r["ranks"]["peak_rss_bytes"]),
            "categories": hashlib.md5(cats.read_bytes()).hexdigest()}  # fmt: skip


def _convert(src, ranks: int, tmp: Path) -> float:
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "mpisdnn", "convert", "network",
           str(src), "-o", str(tmp / "net.h5"), "--quiet"]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def run(args) -> None:
    trees = [("new", ROOT)] + [(n, Path(d)) for n, d in (s.split("=", 1) for s in args.old_src)]
    print(f"load: {load_average_text()}")
    seen = set()
    with tempfile.TemporaryDirectory(prefix="bench-netread-") as t:
        tmp = Path(t)
        for _, tree in trees:  # warm: kernels cached, the archive in the page cache
            _infer(tree, args.source, args.inputs, args.ranks[0], tmp)
        for rnd in range(args.rounds):
            for ranks in args.ranks:
                for name, tree in trees:
                    m = _infer(tree, args.source, args.inputs, ranks, tmp)
                    seen.add(m["categories"])
                    print(f"  round {rnd + 1} {name:5s} {ranks} rank(s): wall {m['wall']:6.2f} s"
                          f" | load {m['load']:6.2f} s | peak RSS {m['rss'] / 2**30:.2f}"
                          f" GiB/rank | categories {m['categories'][:8]}")  # fmt: skip
                peer = _convert(args.source, ranks, tmp)
                os.remove(tmp / "net.h5")
                print(f"  round {rnd + 1} peer  {ranks} rank(s): convert network {peer:6.2f} s")
    print(f"load: {load_average_text()}")
    if len(seen) != 1:
        raise SystemExit(f"the categories differ between trees or rank counts: {sorted(seen)}")
    print("categories: the same bytes for every tree and rank count")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--neurons", type=int, default=65536)
    m.add_argument("--layers", type=int, default=120)
    m.add_argument("--count", type=int, default=2000)
    r = sub.add_parser("run")
    r.add_argument("source", help="a neuron{N}/ directory or neuron{N}.tar.gz")
    r.add_argument("--inputs", required=True)
    r.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--old-src", action="append", default=[], metavar="NAME=DIR",
                   help="another source tree, run beside (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    make(args) if args.cmd == "make" else run(args)


if __name__ == "__main__":
    main()
