#!/usr/bin/env python
"""Big networks end to end: generated N x L radix-nets, streamed weights, bounded memory.

For every ``--neurons`` value this script

1. writes a generated network (the same layers as ``mpisdnn generate network``, written
   layer by layer so generation never holds the whole network) and generated digit inputs
   under ``--workdir`` (deleted afterwards unless ``--keep``);
2. runs ``mpiexec -n RANKS mpisdnn infer --weight-memory W --categories-out ...`` while a
   sampler polls every rank's PSS and RSS (``/proc/PID/smaps_rollup`` via psutil): the
   peak of the ranks' *summed* PSS counts a page shared by the ranks once;
3. checks the categories of a sample of rows against the ``reference`` backend (plain
   scipy), run in this process on the sampled rows only, weights streamed the same way;
4. with ``--dedup both`` (the default), runs every problem with ``--dedup off`` and ``--dedup
   on`` side by side (``--repeat`` times each, alternating) and records both and their
   ratio: the categories must be the same, and the deduplicated run's checks (live rows,
   distinct rows, seconds) are kept.

    python scripts/bench_bignet.py --neurons 4096 16384 --layers 1920 --inputs 60000 \\
        --json bignet.json

Numbers on a shared 2-core machine are noisy: the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from mpisdnn.system import load_average_text


def write_network_streamed(path: Path, neurons: int, layers: int, seed: int) -> dict:
    """The layers of ``mpisdnn.generate.radixnet(neurons, layers, seed)`` in the v1 HDF5
    layout, written one layer at a time (the in-memory generator would need all of them)."""
    import h5py

    from mpisdnn.formats.hdf5 import _COMPRESSION, NETWORK_FORMAT, VERSION
    from mpisdnn.generate.radixnet import DEFAULT_BIAS, KRON_WIDTH, YMAX, radixnet_layers

    # every layer of a radix-net has 2 * KRON_WIDTH weights per column
    nnz = np.full(layers, 2 * KRON_WIDTH * neurons, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(nnz)))
    total = int(offsets[-1])
    bias = DEFAULT_BIAS.get(neurons, -0.3)
    chunk = max(1, min(1 << 20, total))
    t0 = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update(
            format=NETWORK_FORMAT,
            version=VERSION,
            neurons=neurons,
            layers=layers,
            ymax=float(YMAX),
            source=f"bench_bignet radixnet N={neurons} L={layers} seed={seed}",
        )
        g = f.create_group("layers")
        ptr = g.create_dataset(
            "indptr", (layers, neurons + 1), np.int64, chunks=(1, neurons + 1), **_COMPRESSION
        )
        g.create_dataset("offsets", data=offsets)
        ind = g.create_dataset("indices", (total,), np.int32, chunks=(chunk,), **_COMPRESSION)
        dat = g.create_dataset("data", (total,), np.float32, chunks=(chunk,), **_COMPRESSION)
        for layer, compact in enumerate(radixnet_layers(neurons, layers, seed)):
            w = compact.to_csr()
            w.sort_indices()
            ptr[layer] = w.indptr
            ind[offsets[layer] : offsets[layer + 1]] = w.indices
            dat[offsets[layer] : offsets[layer + 1]] = w.data
        f.create_dataset(
            "bias",
            data=np.full((layers, neurons), bias, np.float32),
            chunks=(1, neurons),
            **_COMPRESSION,
        )
    os.replace(tmp, path)
    return {"seconds": time.perf_counter() - t0, "edges": total, "file_bytes": path.stat().st_size}


def write_inputs(path: Path, neurons: int, count: int, seed: int) -> dict:
    from mpisdnn.formats import write_inputs as write
    from mpisdnn.generate import digit_images

    t0 = time.perf_counter()
    y0 = digit_images(count, neurons, seed=seed)
    write(path, y0, source=f"bench_bignet digits N={neurons} count={count} seed={seed}")
    return {"seconds": time.perf_counter() - t0, "nnz": int(y0.nnz)}


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return "python" in fh.read()
    except OSError:
        return False


class Sampler(threading.Thread):
    """Polls the PSS/RSS of every python process under ``pid`` (the ranks) until stopped."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak_pss_sum = 0
        self.peak_rss_max = 0
        self.peak_rss_sum = 0

    def run(self):
        from mpisdnn.system import process_tree, pss_bytes, rss_bytes

        while not self.stop.is_set():
            pss, rss = [], []
            for p in process_tree(self.pid)[1:]:  # the ranks (and mpiexec's helpers)
                q, r = pss_bytes(p), rss_bytes(p)
                if q is not None and r is not None and _is_python(p):
                    pss.append(q)
                    rss.append(r)
            if pss:
                self.peak_pss_sum = max(self.peak_pss_sum, sum(pss))
                self.peak_rss_sum = max(self.peak_rss_sum, sum(rss))
                self.peak_rss_max = max(self.peak_rss_max, max(rss))
            self.stop.wait(self.interval)


def run_infer(args, net: Path, inputs: Path, cats: Path, report: Path, dedup="on") -> dict:
    from mpisdnn.system import mpiexec_path
    exe = mpiexec_path()
    cmd = [
        exe, "-n", str(args.ranks), sys.executable, "-m", "mpisdnn", "infer",
        "--network", str(net), "--inputs", str(inputs), "--layers", str(args.layers),
        "--weight-memory", args.weight_memory,
        "--categories-out", str(cats), "--report", str(report), "--progress", "60",
        "--dedup", dedup,
    ]  # fmt: skip
    if args.memory_per_rank:
        cmd += ["--memory-per-rank", args.memory_per_rank]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    t0 = time.perf_counter()
    # Progress lines go to a file as they come: a long run can be followed with ``tail -f``.
    log = report.with_suffix(".out")
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.PIPE, text=True, env=env)
        sampler = Sampler(proc.pid)
        sampler.start()
        _, err = proc.communicate()
    wall = time.perf_counter() - t0
    out = log.read_text()
    sampler.stop.set()
    sampler.join()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    rep = json.loads(report.read_text())
    ph, mem, rk = rep["phases"], rep["memory"], rep["ranks"]
    streams = [s for s in mem.get("rank_streaming") or [] if s]
    return {
        "command": " ".join(cmd),
        "stdout": out,
        "wall_seconds": wall,
        "load_seconds": ph["load_seconds"],
        "part1_seconds": ph["part1_seconds"],
        "part2_seconds": ph["part2_seconds"],
        "rate_edges_per_second": ph["rate_edges_per_second"],
        "edges": rep["problem"]["edges"],
        "inputs": rep["problem"]["inputs"],
        "categories": rep["categories"]["count"],
        "blocks": len(mem["blocks"]),
        "weight_memory_bytes": mem["weight_memory_bytes"],
        "weight_bytes_estimate": mem["weight_bytes_estimate"],
        "prepare_first_seconds": mem["prepare_first_seconds"],
        "prepare_in_loop_seconds": mem["prepare_in_loop_seconds"],
        "read_seconds_max": max((s["read_seconds"] for s in streams), default=0.0),
        "wait_seconds_max": max((s["wait_seconds"] for s in streams), default=0.0),
        "overlap_min": min((s["overlap"] for s in streams), default=None),
        "held_weight_bytes_max": max((s["peak_held_bytes"] for s in streams), default=0),
        "activation_peak_bytes": mem["rank_activation_peak_bytes"],
        "rank_peak_rss_bytes": rk.get("peak_rss_bytes"),
        "rank_end_pss_bytes": rk.get("pss_bytes"),
        "sampled_peak_pss_sum_bytes": sampler.peak_pss_sum,
        "sampled_peak_rss_sum_bytes": sampler.peak_rss_sum,
        "sampled_peak_rss_max_bytes": sampler.peak_rss_max,
        "dedup": rep.get("dedup"),
        "categories_sha1": _sha1(cats),
    }


def _sha1(path: Path) -> str:
    import hashlib

    return hashlib.sha1(path.read_bytes()).hexdigest() if path.exists() else ""


def run_off_on(args, net: Path, inp: Path, work: Path, tag: str) -> dict:
    """``--dedup off`` and ``on`` alternately, ``--repeat`` times each; the best of each."""
    runs = {"off": [], "on": []}
    modes = ["off", "on"] if args.dedup == "both" else [args.dedup]
    for _ in range(args.repeat):
        for mode in modes:
            r = run_infer(args, net, inp, work / f"{tag}-{mode}.cats", work / f"{tag}-{mode}.json",
                          mode)  # fmt: skip
            runs[mode].append(r)
            print(
                f"[{tag}] dedup {mode}: part 1 {r['part1_seconds']:.3f} s, "
                f"part 2 {r['part2_seconds']:.4f} s, categories {r['categories']}",
                flush=True,
            )
    out = {m: min(rs, key=lambda r: r["part1_seconds"]) for m, rs in runs.items() if rs}
    out["part1_all"] = {m: [r["part1_seconds"] for r in rs] for m, rs in runs.items() if rs}
    if len(modes) == 2:
        off, on = out["off"], out["on"]
        out["same_categories"] = off["categories_sha1"] == on["categories_sha1"]
        out["part1_ratio_off_on"] = off["part1_seconds"] / max(on["part1_seconds"], 1e-9)
        print(
            f"[{tag}] part 1 off/on = {out['part1_ratio_off_on']:.2f}x, "
            f"same categories: {out['same_categories']}",
            flush=True,
        )
    return out


def check_sample(net: Path, inputs: Path, cats: Path, sample: int, seed: int) -> dict:
    """Reference backend (plain scipy) on ``sample`` rows: same category decision?"""
    from mpi4py import MPI

    from mpisdnn.formats import read_categories, read_inputs
    from mpisdnn.sdnn.engine import infer
    from mpisdnn.sdnn.options import InferOptions
    from mpisdnn.sdnn.streaming import Hdf5LayerSource, StreamingStore

    y0, _ = read_inputs(inputs)
    found = set(read_categories(cats).tolist())
    rng = np.random.default_rng(seed)
    # Half found categories, half random rows: both kinds of answer get checked.
    cat_rows = np.array(sorted(found), dtype=np.int64) - 1
    picks = rng.choice(cat_rows, min(sample // 2, cat_rows.size), replace=False)
    rest = rng.choice(y0.shape[0], sample - picks.size, replace=False)
    rows = np.unique(np.concatenate([picks, rest]))
    from mpisdnn.formats.hdf5 import network_version

    if network_version(net) == 2:  # mapped: the pages stay in the shared page cache
        from mpisdnn.formats import open_weight_store

        store = open_weight_store(net)
    else:
        store = StreamingStore(Hdf5LayerSource(net))
    t0 = time.perf_counter()
    opts = InferOptions(backend="reference", weight_memory=256 << 20, rebalance_threshold=0)
    res = infer(store, y0[rows], MPI.COMM_SELF, options=opts)
    getattr(store, "close", lambda: None)()
    ref = set((rows[res.categories - 1] + 1).tolist())
    mine = {int(r) + 1 for r in rows if int(r) + 1 in found}
    return {
        "rows": int(rows.size),
        "reference_categories": len(ref),
        "agree": ref == mine,
        "mismatches": sorted(ref ^ mine)[:20],
        "seconds": time.perf_counter() - t0,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--neurons", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--layers", type=int, default=1920)
    p.add_argument("--inputs", type=int, default=60000)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--weight-memory", default="1G", help="--weight-memory of the runs")
    p.add_argument("--memory-per-rank", help="--memory-per-rank of the runs")
    p.add_argument("--sample", type=int, default=60, help="rows checked against reference")
    p.add_argument(
        "--dedup",
        choices=("both", "on", "off"),
        default="both",
        help="run --dedup off and on side by side (default), or one of them",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per --dedup setting (best kept)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default="/work/scratch/bignet")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--reuse", action="store_true", help="use generated files already there")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--network-file", help="run this network (one --neurons value; kept)")
    p.add_argument("--inputs-file", help="run these inputs (HDF5 or official TSV; kept)")
    p.add_argument(
        "--check-inputs",
        help="the same inputs as HDF5, for the sample check (default: --inputs-file)",
    )
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for n in args.neurons:
        tag = f"n{n}-l{args.layers}"
        net, inp = work / f"{tag}.h5", work / f"in{n}-{args.inputs}.h5"
        given = bool(args.network_file)
        if given:
            net, inp = Path(args.network_file), Path(args.inputs_file)
        res = {"neurons": n, "layers": args.layers, "loadavg_before": load_average_text(3)}
        try:
            if given:
                res["generate"] = {"given": str(net), "inputs": str(inp)}
            elif args.reuse and net.exists():
                res["generate"] = {"reused": str(net)}
            else:
                res["generate"] = write_network_streamed(net, n, args.layers, args.seed)
            if given:
                pass
            elif args.reuse and inp.exists():
                res["generate_inputs"] = {"reused": str(inp)}
            else:
                res["generate_inputs"] = write_inputs(inp, n, args.inputs, args.seed)
            print(f"[{tag}] generated: {res['generate']}", flush=True)
            res["dedup"] = run_off_on(args, net, inp, work, tag)
            main_mode = "on" if args.dedup == "both" else args.dedup
            res["run"] = res["dedup"][main_mode]
            print(f"[{tag}] run: { {k: v for k, v in res['run'].items() if k != 'stdout'} }")
            print(res["run"]["stdout"], flush=True)
            check_inp = Path(args.check_inputs) if args.check_inputs else inp
            cats = work / f"{tag}-{main_mode}.cats"
            res["check"] = check_sample(net, check_inp, cats, args.sample, args.seed)
            print(f"[{tag}] sample check: {res['check']}", flush=True)
        finally:
            res["loadavg_after"] = load_average_text(3)
            if not args.keep and not given:
                for f in (net, inp):
                    f.unlink(missing_ok=True)
        results.append(res)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    ok = all(r.get("check", {}).get("agree") for r in results)
    ok = ok and all(r.get("dedup", {}).get("same_categories", True) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
