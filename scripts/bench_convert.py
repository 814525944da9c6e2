#!/usr/bin/env python
"""``mpisdnn convert network`` side by side with its peers, in one run; one TARGET line per
target of issue 41.

Re-measure on a quiet machine (the lead), from the repository root::

    python scripts/bench_convert.py make /tmp/bc --neurons 16384 --layers 120 --tar
    python scripts/bench_convert.py run /tmp/bc/neuron16384 /tmp/bc/neuron16384.tar.gz \\
        /work/shared/data/graphchallenge/neuron1024.tar.gz --ranks 1 2 3
    rm -r /tmp/bc

``make`` writes an official-format network (``n{N}-l{k}.tsv``, ``row<TAB>col<TAB>6.250000e-02``
in column order, as published; 16384 x 120 is 1.49 GB of text) with ``mpisdnn generate
network --tsv-dir``, and with ``--tar`` its ``neuron{N}.tar.gz`` (``tar | pigz``).

``run`` takes sources (a ``neuron{N}/`` directory or a ``neuron{N}.tar.gz``) and, for each
rank count, times ``mpiexec -n R mpisdnn convert network SRC -o OUT``: the whole wall
(start-up, imports and kernel load included), the command's own figure (the conversion
alone: the steady-state rate), each rank's CPU seconds and peak RSS; the outputs of one
source must be byte-identical at every rank count. Peers in the same run: ``cat > /dev/null``
and ``wc -l`` of the same text (the I/O floor; directories), ``gzip -dc`` and ``pigz -dc``
to ``/dev/null`` (archives). The load average is printed before and after.

TARGET lines (issue 41, `convert network`): >= 600 MB/s of text at 2 ranks (the command's
own figure, on the largest directory source), <= 1 GiB peak RSS per rank, byte-identical
output at every rank count measured.
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

GIB = 1 << 30


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


def _convert(src, out, ranks):
    from mpisdnn.system import mpiexec_path
    cmd = [mpiexec_path(), "-n", str(ranks), "/usr/bin/time", "-f", "RSS %M CPU %U %S"]
    cmd += [sys.executable, "-m", "mpisdnn", "convert", "network", src, "-o", out]
    cmd += ["--progress", "0"]
    wall, proc = _run(cmd)
    per_rank = re.findall(r"RSS (\d+) CPU ([0-9.]+) ([0-9.]+)", proc.stderr)
    rss = [int(r) * 1024 for r, _, _ in per_rank]
    cpu = [float(u) + float(s) for _, u, s in per_rank]
    own = re.search(r"in ([0-9.]+) s \(([0-9]+) MB/s", proc.stdout)
    return {"wall": wall, "rss": rss, "cpu": cpu, "own": float(own.group(1)) if own else None}


def _peers(src, text, repeat):
    rows = []
    if os.path.isdir(src):
        files = " ".join(f"'{os.path.join(src, f)}'" for f in sorted(os.listdir(src)))
        tools = [("cat > /dev/null", f"cat {files} > /dev/null"), ("wc -l", f"wc -l {files}")]
    else:
        tools = [
            (f"{t} -dc > /dev/null", f"{shutil.which(t)} -dc '{src}' > /dev/null")
            for t in ("gzip", "pigz")
            if shutil.which(t)
        ]
    for label, line in tools:
        best = min(_run(["sh", "-c", line])[0] for _ in range(repeat))
        rows.append((label, best))
        print(f"  peer {label:26s} {best:7.2f} s  {text / best / 1e6:7.0f} MB/s")
    return rows


def run(args) -> None:
    from mpisdnn.system import load_average_text

    work = tempfile.mkdtemp(prefix="bench_convert.")
    print(f"load: {load_average_text()}")
    targets = {}
    try:
        for src in args.sources:
            text = _text_bytes(src)
            kind = "directory" if os.path.isdir(src) else "archive"
            print(f"\n{src} ({kind}): {text / 1e6:.0f} MB of layer text")
            _peers(src, text, args.repeat)
            outs = {}
            for ranks in args.ranks:
                out = os.path.join(work, f"r{ranks}.h5")
                got = min((_convert(src, out, ranks) for _ in range(args.repeat)),
                          key=lambda g: g["wall"])  # fmt: skip
                own = got["own"]
                cpu = max(got["cpu"]) if got["cpu"] else float("nan")
                print(
                    f"  convert {ranks} rank{'s' if ranks > 1 else ' '}  "
                    f"whole {got['wall']:6.2f} s "
                    f"{text / got['wall'] / 1e6:6.0f} MB/s | own {own:6.2f} s "
                    f"{text / own / 1e6:6.0f} MB/s | CPU/rank max {cpu:5.2f} s "
                    f"({text / cpu / 1e6:5.0f} MB/s) | peak RSS/rank "
                    f"{max(got['rss']) / 2**20:5.0f} MiB",
                    flush=True,
                )
                outs[ranks] = out
                targets.setdefault("rss", []).append((max(got["rss"]), src, ranks))
                if ranks == 2:
                    targets.setdefault("rate", []).append((text / own / 1e6, src, kind, got))
            files = list(outs.values())
            same = all(filecmp.cmp(files[0], f, shallow=False) for f in files[1:])
            print(f"  outputs byte-identical at ranks {list(args.ranks)}: {same}")
            targets.setdefault("same", []).append((same, src))
            for f in files:
                os.unlink(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload: {load_average_text()}")
    _targets(targets)


def _targets(t) -> None:
    rates = t.get("rate", [])
    dirs = [r for r in rates if r[2] == "directory"] or rates
    if dirs:
        best = max(dirs, key=lambda r: _text_bytes(r[1]))
        mb, src = best[0], best[1]
        print(
            f"TARGET convert network 2 ranks >= 600 MB/s of text: "
            f"{'reached' if mb >= 600 else 'NOT reached'} ({mb:.0f} MB/s, command's own figure, "
            f"{src}; whole mpiexec {_text_bytes(src) / best[3]['wall'] / 1e6:.0f} MB/s)"
        )
        for mb, src, kind, _ in rates:
            if src != best[1]:
                print(f"  (2 ranks, {kind} {src}: {mb:.0f} MB/s)")
    else:
        print("TARGET convert network 2 ranks >= 600 MB/s of text: not measured (add --ranks 2)")
    if t.get("rss"):
        peak, src, ranks = max(t["rss"])
        print(
            f"TARGET convert network peak RSS <= 1 GiB per rank: "
            f"{'reached' if peak <= GIB else 'NOT reached'} (max {peak / 2**20:.0f} MiB, "
            f"{src} at {ranks} ranks)"
        )
    if t.get("same"):
        ok = all(s for s, _ in t["same"])
        bad = [src for s, src in t["same"] if not s]
        print(
            f"TARGET convert network byte-identical at every rank count: "
            f"{'reached' if ok else 'NOT reached ' + str(bad)}"
        )


def make(args) -> None:
    os.makedirs(args.dir, exist_ok=True)
    name = f"neuron{args.neurons}"
    tsv_dir = os.path.join(args.dir, name)
    h5 = os.path.join(args.dir, f"{name}.h5")
    cmd = [sys.executable, "-m", "mpisdnn", "generate", "network", "-o", h5, "--tsv-dir",
           tsv_dir, "--neurons", str(args.neurons), "--layers", str(args.layers)]  # fmt: skip
    subprocess.run(cmd, check=True)
    os.unlink(h5)
    if args.tar:
        tool = shutil.which("pigz") or shutil.which("gzip")
        line = f"tar -C '{args.dir}' -cf - {name} | '{tool}' > '{tsv_dir}.tar.gz'"
        subprocess.run(["sh", "-c", line], check=True)
    print(f"{tsv_dir}: {_text_bytes(tsv_dir) / 1e6:.0f} MB of text")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--neurons", type=int, default=16384)
    m.add_argument("--layers", type=int, default=120)
    m.add_argument("--tar", action="store_true", help="also write neuron{N}.tar.gz")
    r = sub.add_parser("run")
    r.add_argument("sources", nargs="+")
    r.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    {"make": make, "run": run}[args.cmd](args)


if __name__ == "__main__":
    main()
