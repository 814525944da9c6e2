#!/usr/bin/env python
"""Storage benchmarks: TSV parse rate, and memory-mapped v2 weights against reading them.

    python scripts/bench_formats.py parse DIR [--files 120]        # MB/s, old vs new parser
    mpiexec -n 2 python scripts/bench_formats.py weights NET.h5 --layers 480 --mode mmap
    mpiexec -n 2 python scripts/bench_formats.py weights NET.h5 --layers 480 --mode read

``parse`` reports wall and CPU MB/s (CPU MB/s is what a rank gets on an idle core; the wall
figure depends on the machine's load, printed with it). ``weights`` opens layers ``[0, L)``
on every rank, touches every byte once (as a layer loop does), and reports the time and the
ranks' summed RSS and PSS: ``mmap`` maps the v2 datasets (shared page cache), ``read`` copies
them into private arrays with h5py.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

from mpisdnn.system import load_average_text


def parse(args) -> None:
    import numpy as np

    from mpisdnn.formats import tsv

    files = sorted(glob.glob(os.path.join(args.dir, "*.tsv")))[: args.files]
    total = sum(os.path.getsize(f) for f in files)

    def old(path):  # the parser before pyarrow: np.fromstring + vectorised checks
        text = tsv._read_bytes(path)
        table = tsv._fast_parse(text, 3)
        return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]

    out = {"files": len(files), "mb": total / 1e6, "load_before": load_average_text()}
    for name, fn in (("old", old), ("new", lambda p: tsv.read_triples(p, 1 << 20, 1 << 20))):
        w0, c0 = time.perf_counter(), time.process_time()
        for f in files:
            fn(f)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        out[name] = {"wall_mb_s": total / wall / 1e6, "cpu_mb_s": total / cpu / 1e6}
    out["load_after"] = load_average_text()
    print(json.dumps(out, indent=1))


def weights(args) -> None:
    from mpi4py import MPI

    from mpisdnn.formats.network_v2 import map_layers
    from mpisdnn.system import pss_bytes

    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    checksum = 0
    if args.mode == "mmap":
        _, layers = map_layers(args.network, 0, args.layers, validate=False)
        for layer in layers:
            checksum += int(layer.rows.sum(dtype="uint64"))
    else:
        import h5py

        layers = []
        with h5py.File(args.network, "r") as f:
            for k in range(args.layers):
                rows = f[f"layers/{k + 1:06d}/rows"][()]
                checksum += int(rows.sum(dtype="uint64"))
                layers.append(rows)
    comm.Barrier()
    seconds = time.perf_counter() - t0
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    pss = pss_bytes() or 0
    sums = comm.gather((rss, pss, checksum), root=0)
    if comm.rank == 0:
        assert len({s[2] for s in sums}) == 1
        print(
            json.dumps(
                {
                    "mode": args.mode,
                    "ranks": comm.size,
                    "layers": args.layers,
                    "seconds": round(seconds, 2),
                    "sum_rss_gib": round(sum(s[0] for s in sums) / 2**30, 2),
                    "sum_pss_gib": round(sum(s[1] for s in sums) / 2**30, 2),
                    "load": load_average_text(),
                }
            )
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("parse")
    a.add_argument("dir")
    a.add_argument("--files", type=int, default=120)
    a.set_defaults(run=parse)
    b = sub.add_parser("weights")
    b.add_argument("network")
    b.add_argument("--layers", type=int, default=480)
    b.add_argument("--mode", choices=("mmap", "read"), default="mmap")
    b.set_defaults(run=weights)
    args = p.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
