#!/usr/bin/env python
"""``mpisdnn convert network`` side by side with its peers, in one run.

    python scripts/bench_convert.py SRC [SRC ...] [--ranks 1 2] [--old-src DIR] [--repeat 2]

Each SRC is a ``neuron{N}/`` directory or a ``neuron{N}.tar.gz``. For every SRC and rank
count: the wall of ``mpiexec -n R mpisdnn convert network SRC -o OUT`` (MB/s of layer text,
start-up included and the command's own figure), each rank's peak RSS, and the output's
bytes compared across rank counts (must be identical). Peers in the same run: ``gzip -dc``
and ``pigz -dc`` of an archive to ``/dev/null``, and the same command from an older tree
(``--old-src``, e.g. a checkout of main 6f7f4c8; directories only: it read no archives).
The load average is printed: re-measure the figures on a quiet machine.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def _text_bytes(src) -> int:
    if os.path.isdir(src):
        return sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    import tarfile

    with tarfile.open(src) as tf:
        return sum(m.size for m in tf.getmembers() if m.isfile())


def _run(cmd, env=None):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return wall, proc


def _convert(src, out, ranks, pythonpath=None):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = ["mpiexec", "-n", str(ranks), "/usr/bin/time", "-f", "RSS %M"]
    cmd += [sys.executable, "-m", "mpisdnn", "convert", "network", src, "-o", out]
    if not pythonpath:
        cmd += ["--progress", "0"]
    wall, proc = _run(cmd, env)
    rss = [int(x) * 1024 for x in re.findall(r"RSS (\d+)", proc.stderr)]
    own = re.search(r"in ([0-9.]+) s \(([0-9]+) MB/s", proc.stdout)
    return wall, rss, (float(own.group(1)) if own else None)


def main(argv=None) -> None:
    from mpisdnn.system import load_average_text

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--old-src", help="source tree of an older mpisdnn (PYTHONPATH)")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench_convert.")
    print(f"load: {load_average_text()}")
    try:
        for src in args.sources:
            text = _text_bytes(src)
            print(f"\n{src}: {text / 1e6:.0f} MB of layer text")
            if not os.path.isdir(src):
                for tool in ("gzip", "pigz"):
                    exe = shutil.which(tool)
                    if exe:
                        best = min(
                            _run(["sh", "-c", f"{exe} -dc '{src}' > /dev/null"])[0]
                            for _ in range(args.repeat)
                        )
                        print(f"  {tool + ' -dc':22s} {best:7.2f} s  {text / best / 1e6:6.0f} MB/s")
            outs = {}
            for ranks in args.ranks:
                for label, tree in (("mpisdnn", None), ("old", args.old_src)):
                    if label == "old" and (tree is None or not os.path.isdir(src)):
                        continue
                    out = os.path.join(work, f"{label}{ranks}.h5")
                    runs = [_convert(src, out, ranks, tree) for _ in range(args.repeat)]
                    wall, rss, own = min(runs, key=lambda r: r[0])
                    own_text = f" (own {own:.2f} s, {text / own / 1e6:5.0f} MB/s)" if own else ""
                    print(
                        f"  {label:7s} {ranks} rank{'s' if ranks > 1 else ' '}      "
                        f"{wall:7.2f} s  {text / wall / 1e6:6.0f} MB/s wall{own_text}  "
                        f"peak RSS {max(rss) / 2**20:.0f} MiB"
                    )
                    if label == "mpisdnn":
                        outs[ranks] = out
            first = outs[args.ranks[0]]
            same = all(filecmp.cmp(first, o, shallow=False) for o in outs.values())
            print(f"  outputs byte-identical at ranks {sorted(outs)}: {same}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load: {load_average_text()}")
    print("re-measure on a quiet machine: python scripts/bench_convert.py neuron65536.tar.gz "
          "neuron65536/ --ranks 1 2 --old-src <main checkout>")


if __name__ == "__main__":
    main()
