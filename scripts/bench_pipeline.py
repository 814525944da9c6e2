#!/usr/bin/env python
"""Pipeline stages and checkpoints: what they cost against a plain ``--stages 1`` run.

Runs ``mpiexec -n R mpisdnn infer ... --stages S`` for every ``R:S`` pair given (with and
without pruning), then a checkpointing run per ``--checkpoint-every`` value, reads each run's
JSON report and prints one table: part 1 (layers), part 2, rate, its ratio to ``--stages 1``
at the same rank count (the pair run just before), the stage layers (and the time of the
re-plan after the first micro-batch), per-stage busy time, bubble fraction, bytes sent between
stages, weight bytes per rank, peak RSS per rank, and for checkpoints their count, size and
time as a share of part 1. ``--repeat N`` runs the pairs N times in turn (ratios between runs
taken seconds apart are what counts on a shared machine). Another checkout's code is timed
with ``PYTHONPATH=/path/to/checkout`` (the ranks inherit it).

    python scripts/bench_pipeline.py --network neuron1024/ --inputs images.h5 \\
        --pairs 2:1 2:2 3:1 3:3 4:1 4:2 --json pipeline.json

``--inputs`` must carry its truth (an HDF5 file from ``mpisdnn generate inputs``) or go with
``--truth``; every run must PASS. The load average is recorded with each run: on a shared
machine the ratios between runs taken minutes apart are what counts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

# This script's own imports come from this tree; the ranks it starts run the mpisdnn that
# PYTHONPATH names (another checkout's, to time it), which need not have what these import.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sdnn import mpisdnn_infer  # noqa: E402  (the sibling script's runner)

from mpisdnn.system import load_average_text


def _infer(args, ranks: int, extra: list[str]) -> dict:
    common = ["--layers", str(args.layers), "--backend", args.backend, "--threads", "1"]
    if args.truth:
        common += ["--truth", args.truth]
    load = load_average_text()
    t0 = time.perf_counter()
    proc, rep = mpisdnn_infer(ranks, args.network, args.inputs, common + extra)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or rep is None:
        raise SystemExit(
            f"bench_pipeline: {' '.join(proc.args)} exited {proc.returncode}:\n"
            f"{proc.stderr.strip()}"
        )
    if rep["check"].get("status") != "PASS":
        raise SystemExit(f"bench_pipeline: {' '.join(extra)}: {rep['check']}")
    return {
        "ranks": ranks,
        "args": extra,
        "load": load,
        "wall_seconds": wall,
        "part1_seconds": rep["phases"]["part1_seconds"],
        "part2_seconds": rep["phases"]["part2_seconds"],
        "peak_rss_bytes": max(rep["ranks"].get("peak_rss_bytes") or [0]),
        "rate_ge_s": rep["phases"]["rate_edges_per_second"] / 1e9,
        "pipeline": rep.get("pipeline"),
        "checkpoint": rep.get("checkpoint"),
    }


def _row(r: dict, base: dict | None) -> str:
    p = r["pipeline"] or {}
    busy = ",".join(f"{b:.3f}" for b in p.get("stage_busy_seconds", [])) or "-"
    bubble = f"{p['bubble_fraction']:.3f}" if p else "-"
    sent = f"{sum(p['rank_bytes_sent']) / 2**20:.1f}" if p else "-"
    weights = f"{max(p['rank_weight_bytes']) / 2**20:.1f}" if p else "-"
    ratio = f"{r['rate_ge_s'] / base['rate_ge_s']:.2f}" if base else "-"
    split = ",".join(f"{a}-{b}" for a, b in p.get("stage_layers", [])) or "-"
    if p.get("head_layers"):
        split = "head {}-{} + {}".format(*p["head_layers"], split)
    if p.get("split", {}).get("by") == "work":
        split += f" ({p['split']['seconds'] * 1e3:.0f} ms)"
    return (
        f"| {r['ranks']} | {' '.join(r['args']) or '-'} | {r['load']} | "
        f"{r['part1_seconds']:.3f} | {r['part2_seconds']:.4f} | {r['rate_ge_s']:.1f} | {ratio} | "
        f"{split} | {busy} | {bubble} | {sent} | {weights} | {r['peak_rss_bytes'] / 2**20:.0f} |"
    )


def _targets(runs: list[dict]) -> None:
    """One TARGET line per staged configuration: its part 1 over the ``--stages 1`` run at
    the same rank count taken just before it (``x_part1``), median (min-max) over the
    repeats; issue 26 asks for at most 1.3x on pruned networks."""
    ratios: dict = {}
    for r in runs:
        if "x_part1" in r:
            ratios.setdefault((r["ranks"], " ".join(r["args"])), []).append(r["x_part1"])
    for (ranks, opts), got in ratios.items():
        got = sorted(got)
        med = got[len(got) // 2]
        verdict = "met" if med <= 1.3 else "NOT met"
        print(f"TARGET {ranks} ranks {opts}: part 1 {med:.2f}x --stages 1 "
              f"({got[0]:.2f}-{got[-1]:.2f}, {len(got)} runs; target <= 1.3x: {verdict})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--truth")
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument(
        "--pairs",
        nargs="+",
        default=["2:1", "2:2", "3:1", "3:3", "4:1", "4:2"],
        help="RANKS:STAGES pairs, or RANKS:STAGES:HEAD to set --stage-head (0: no head)",
    )
    ap.add_argument("--no-prune-too", action="store_true", help="repeat every pair with --no-prune")
    ap.add_argument(
        "--checkpoint-every",
        nargs="*",
        type=float,
        default=[],
        help="seconds; one 2-rank --stages 1 checkpointing run per value",
    )
    ap.add_argument("--repeat", type=int, default=1, help="run the list of pairs this often")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_pipeline-"))
    runs: list[dict] = []
    try:
        variants = [[]] + ([["--no-prune"]] if args.no_prune_too else [])
        lines = [
            "| ranks | options | load | part 1 s | part 2 s | rate GE/s | x stages 1 | stage "
            "layers (re-plan) | stage busy s | bubble | sent MiB | weights/rank MiB | peak RSS "
            "MiB |",
            "|" + "---|" * 13,
        ]
        for variant in variants * args.repeat:
            base: dict[int, dict] = {}
            for pair in args.pairs:
                ranks, stages, *head = (int(x) for x in pair.split(":"))
                extra = variant + ([] if stages == 1 else ["--stages", str(stages)])
                extra += ["--stage-head", str(head[0])] if head else []
                r = _infer(args, ranks, extra)
                runs.append(r)
                if stages == 1:
                    base[ranks] = r
                elif ranks in base:
                    r["x_part1"] = r["part1_seconds"] / base[ranks]["part1_seconds"]
                lines.append(_row(r, None if stages == 1 else base.get(ranks)))
                print(lines[-1], flush=True)
        ck_lines = [
            "| checkpoint every s | load | checkpoints | next layer:MiB | seconds in "
            "checkpoints | part 1 s | share |",
            "|" + "---|" * 7,
        ]
        for every in args.checkpoint_every:
            ck = work / "ck"
            shutil.rmtree(ck, ignore_errors=True)
            r = _infer(args, 2, ["--checkpoint", str(ck), "--checkpoint-every", str(every)])
            runs.append(r)
            c = r["checkpoint"] or {}
            saved = c.get("saved", [])
            sizes = ",".join(f"{s['next_layer']}:{s['bytes'] / 2**20:.2f}" for s in saved)
            spent = float(c.get("seconds", 0.0))
            ck_lines.append(
                f"| {every:g} | {r['load']} | {c.get('count', 0)} | {sizes} | "
                f"{spent:.3f} | {r['part1_seconds']:.3f} | "
                f"{spent / r['part1_seconds']:.1%} |"
            )
            print(ck_lines[-1], flush=True)
        print("\n".join(lines))
        _targets(runs)
        if args.checkpoint_every:
            print("\n".join(ck_lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
