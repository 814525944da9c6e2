#!/usr/bin/env python
"""The Graph Challenge table in one command: N x L configurations, 60,000 inputs read from TSV.

For each configuration (default the official 12: N = 1024, 4096, 16384, 65536 x L = 120, 480,
1920) this script

1. takes the official files from ``--official DIR`` when they are there (``neuron{N}/`` with at
   least L layer files, ``sparse-images-{N}.tsv``, ``neuron{N}-l{L}-categories.tsv``), else
   generates once into ``--cache`` (default ``data/official-cache``): a seeded radix-net with
   ``mpisdnn generate network`` (one 1920-layer v2 file per N serves every L: ``infer --layers
   L`` takes the first L layers) and 60,000 digit inputs in the official TSV format with
   ``mpisdnn generate inputs --tsv`` (calibrated to the official survivor counts); official
   TSV layers are converted once to a v2 file in the cache;
2. runs ``mpiexec -n RANKS mpisdnn infer --inputs X.tsv --categories-out ...`` (inputs read from
   the TSV, the way a participant receives them) while a sampler sums the PSS of the job's
   processes every 0.25 s;
3. checks the categories against the official truth when the inputs are official and the truth
   file is there, else against an independent check: the ``reference`` backend (plain scipy, a
   separate ``mpisdnn infer --backend reference`` job) on every row where that is affordable
   (inputs x edges <= ``--full-check-edges``), otherwise on a seeded sample of the claimed
   categories and of the other rows (the sampled rows are regenerated from the seed, not read
   back from the run);
4. optionally runs the configuration again with ``--dedup off`` (the ablation column) when the
   first run's part 1 took at most ``--ablation-seconds``;
5. writes ``OUT/runs/N{N}-L{L}.json`` per configuration (a finished one is not rerun: delete its
   file, or pass ``--rerun``), then ``OUT/official.md``, ``OUT/official.json`` and
   ``OUT/official.png`` (edges/s per configuration, log scale, with the published anchors).

Temporary files (categories, reports, sampled inputs) live in ``OUT/tmp`` and are removed after
each configuration; ``--drop-cache`` also removes the generated cache files at the end.

    python scripts/bench_official.py --cache /work/wt/data-cache --out results/official
    python scripts/bench_official.py --neurons 1024 --layers 120 480 --inputs 6000

Numbers on a shared machine are noisy: the load average is recorded with every run.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mpisdnn.system import load_average

NEURONS = (1024, 4096, 16384, 65536)
LAYERS = (120, 480, 1920)
#: Published figures: (N, L) -> list of (who, seconds, what the seconds cover). Sources and
#: hardware in docs/performance.md ("The official table").
ANCHORS = {
    (1024, 120): [("2020 champion, 1 A100", None, 13.1e12, "compute")],
    (65536, 1920): [
        ("SNICIT 2023, 1 RTX A6000", 0.689, None, "GPU kernels"),
        ("XY-2021, 1 RTX A6000", 4.35, None, "GPU kernels"),
        ("2020 champion, 1 A100", 31.3, None, "compute (I/O 45.5 s more)"),
        ("Mofrad 2020, 896 cores", 51.0, None, "compute"),
    ],
}
RUN_KEYS = (
    "status",
    "load_s",
    "part1_s",
    "part2_s",
    "wall_s",
    "rate",
    "categories",
    "distinct",
    "pss_peak",
)


@dataclass(frozen=True)
class Options:
    """Validated command line (see ``--help``)."""

    neurons: tuple
    layers: tuple
    inputs: int = 60000
    ranks: int = 2
    seed: int = 1
    cache: Path = Path("data/official-cache")
    out: Path = Path("results/official")
    official: Path | None = None
    check_rows: int = 32
    check_budget: float = 1e10
    full_check_edges: float = 3e11
    ablation_seconds: float = 5.0
    rerun: bool = False
    report_only: bool = False
    keep: bool = False
    drop_cache: bool = False
    infer_args: tuple = field(default_factory=tuple)

    def __post_init__(self):
        for n in self.neurons:
            if n < 1024 or int(round(n**0.5)) ** 2 != n:
                raise ValueError(f"--neurons: {n} is not an official-style size (1024, 4096, ...)")
        if not self.layers or min(self.layers) < 1:
            raise ValueError("--layers must be >= 1")
        if self.inputs < 1 or self.ranks < 1 or self.check_rows < 2:
            raise ValueError("--inputs and --ranks must be >= 1, --check-rows >= 2")


def parse_args(argv=None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--neurons", type=int, nargs="+", default=list(NEURONS))
    p.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    p.add_argument("--inputs", type=int, default=60000, help="inputs per N (default 60000)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seed", type=int, default=1, help="generated networks and inputs")
    p.add_argument("--cache", type=Path, default=Path("data/official-cache"))
    p.add_argument("--out", type=Path, default=Path("results/official"))
    p.add_argument("--official", type=Path, help="directory with the official files")
    p.add_argument("--check-rows", type=int, default=32, help="sampled rows per check")
    p.add_argument(
        "--check-budget",
        type=float,
        default=1e10,
        help="edge visits of the reference on surviving sampled rows (limits them)",
    )
    p.add_argument("--full-check-edges", type=float, default=3e11)
    p.add_argument("--ablation-seconds", type=float, default=5.0, help="0 = no ablation")
    p.add_argument("--rerun", action="store_true", help="rerun finished configurations")
    p.add_argument(
        "--report-only", action="store_true", help="tables from the finished results, no runs"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary files")
    p.add_argument("--drop-cache", action="store_true", help="delete generated files at the end")
    p.add_argument("--infer-arg", action="append", default=[], help="extra infer argument")
    a = p.parse_args(argv)
    try:
        return Options(
            neurons=tuple(a.neurons),
            layers=tuple(sorted(set(a.layers))),
            inputs=a.inputs,
            ranks=a.ranks,
            seed=a.seed,
            cache=a.cache,
            out=a.out,
            official=a.official,
            check_rows=a.check_rows,
            check_budget=a.check_budget,
            full_check_edges=a.full_check_edges,
            ablation_seconds=a.ablation_seconds,
            rerun=a.rerun,
            report_only=a.report_only,
            keep=a.keep,
            drop_cache=a.drop_cache,
            infer_args=tuple(a.infer_arg),
        )
    except ValueError as exc:
        p.error(str(exc))


# ---------------------------------------------------------------------------------- commands
def mpisdnn(*args, ranks=1, log=None) -> float:
    """Run ``mpisdnn ARGS`` (under ``mpiexec -n ranks`` when ranks > 1); wall seconds."""
    cmd = [sys.executable, "-m", "mpisdnn", *map(str, args)]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        log.write(res.stdout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-2000:]}")
    return time.perf_counter() - t0


def say(msg: str) -> None:
    print(f"[bench_official {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------- data (cache)
def _layer_files(d: Path, n: int) -> int:
    """Number of consecutive official layer files ``n{N}-l{k}.tsv`` in ``d`` from k = 1."""
    k = 0
    while (d / f"n{n}-l{k + 1}.tsv").is_file():
        k += 1
    return k


def network_for(o: Options, n: int, l: int) -> tuple:
    """(v2 network path, source) for N x L: official layers (converted once) or generated."""
    o.cache.mkdir(parents=True, exist_ok=True)
    if o.official is not None:
        d = o.official / f"neuron{n}"
        have = _layer_files(d, n) if d.is_dir() else 0
        if have >= l:
            path = o.cache / f"official-net{n}x{have}.h5"
            if not path.exists():
                say(f"converting the official {d} ({have} layers) -> {path}")
                mpisdnn("convert", "network", d, "-o", path, "--layers", have, ranks=o.ranks)
            return path, "official"
    for cand in sorted(glob.glob(str(o.cache / f"net{n}x*-s{o.seed}.h5"))):
        depth = int(Path(cand).name.split("x")[1].split("-")[0])
        if depth >= l:
            return Path(cand), f"generated (seed {o.seed})"
    depth = max(max(o.layers), l)
    path = o.cache / f"net{n}x{depth}-s{o.seed}.h5"
    say(f"generating {path}")
    mpisdnn("generate", "network", "--neurons", n, "--layers", depth, "--seed", o.seed, "-o", path)
    return path, f"generated (seed {o.seed})"


def inputs_for(o: Options, n: int) -> tuple:
    """(inputs TSV path, official?): the official images file or generated calibrated ones."""
    if o.official is not None:
        path = o.official / f"sparse-images-{n}.tsv"
        if path.is_file():
            return path, True
    path = o.cache / f"images{n}-{o.inputs}-s{o.seed}.tsv"
    if not path.exists():
        say(f"generating {o.inputs} inputs -> {path}")
        mpisdnn(
            "generate", "inputs", "--neurons", n, "--count", o.inputs, "--seed", o.seed,
            "--tsv", path,
        )  # fmt: skip
    return path, False


def generated_files(o: Options) -> list:
    """Files this script generates into the cache (for ``--drop-cache``)."""
    pats = [f"net*x*-s{o.seed}.h5", f"images*-{o.inputs}-s{o.seed}.tsv", "official-net*.h5"]
    return sorted({Path(p) for pat in pats for p in glob.glob(str(o.cache / pat))})


# ----------------------------------------------------------------------------------- running
class PssSampler:
    """Peak of the summed PSS of a process and all its descendants (``/proc``, Linux)."""

    def __init__(self, pid: int, every: float = 0.25):
        self.pid, self.every, self.peak = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from mpisdnn.system import process_tree, pss_bytes

        while not self._stop.is_set():
            total = sum(pss_bytes(p) or 0 for p in process_tree(self.pid))
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_infer(o: Options, net: Path, inputs: Path, l: int, tmp: Path, dedup=None) -> dict:
    """One timed ``mpiexec -n RANKS mpisdnn infer`` from the TSV; its figures and categories."""
    report, cats = tmp / "report.json", tmp / "categories.tsv"
    extra = list(o.infer_args) + ([f"--dedup={dedup}"] if dedup else [])
    cmd = [sys.executable, "-m", "mpisdnn", "infer"]
    if o.ranks > 1:
        cmd = ["mpiexec", "-n", str(o.ranks), *cmd]
    cmd += ["--network", str(net), "--inputs", str(inputs), "--layers", str(l)]
    cmd += ["--categories-out", str(cats), "--report", str(report), "--progress", "30", *extra]
    load0 = load_average()[0]
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = PssSampler(proc.pid)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[progress]"):
            print("    " + line.rstrip(), flush=True)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0
    pss = sampler.stop()
    text = "".join(lines)
    if rc != 0 or not report.exists():
        return {"status": f"ERROR (exit {rc})", "wall_s": wall, "log": text[-3000:]}
    r = json.loads(report.read_text())
    ph = r["phases"]
    checks = (r.get("dedup") or {}).get("checks") or []
    from mpisdnn.formats.tsv import read_categories

    found = np.asarray(read_categories(cats), dtype=np.int64) if cats.stat().st_size else []
    return {
        "status": "ran",
        "load_s": ph["load_seconds"],
        "part1_s": ph["part1_seconds"],
        "part2_s": ph["part2_seconds"],
        "wall_s": wall,
        "cpu_s": cpu,
        "read_s": (ph.get("inputs_read") or {}).get("seconds"),
        "rate": ph["rate_edges_per_second"],
        "edges": r["problem"]["edges"],
        "rows": r["problem"]["inputs"],
        "categories": int(np.size(found)),
        "distinct": min((c["distinct_rows"] for c in checks), default=None),
        "pss_peak": pss,
        "pss_ranks_end": sum(r["ranks"].get("pss_bytes") or [0]),
        "load_before": load0,
        "load_after": load_average()[0],
        "found": np.asarray(found, dtype=np.int64),
        "summary": "\n".join(x for x in lines if not x.startswith("[progress]"))[-1500:],
    }


def _children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for descendants: ``mpiexec``, its
    proxies and the ranks (each waits for its own children, so the ranks' time is in it).
    On a loaded machine, CPU seconds / ranks is what the wall would be with the cores free."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ------------------------------------------------------------------------------------ checks
def sample_rows(found, rows: int, n: int, l: int, o: Options) -> np.ndarray:
    """0-based rows to check: claimed categories (as many as the budget allows) and others."""
    rng = np.random.default_rng(o.seed * 1000003 + n + l)
    cats = np.asarray(found, dtype=np.int64) - 1
    # a surviving row costs about N x 32 edge visits per layer in the reference
    pos = int(min(o.check_rows // 2, max(1, o.check_budget // (n * 32 * l)), cats.size))
    others = np.setdiff1d(np.arange(rows, dtype=np.int64), cats)
    neg = min(o.check_rows - pos, others.size)
    pick = [rng.choice(cats, pos, replace=False), rng.choice(others, neg, replace=False)]
    return np.unique(np.concatenate(pick))


def sample_inputs(inputs: Path, official: bool, rows: np.ndarray, n: int, o: Options):
    """The sampled rows as CSR: regenerated from the seed (generated sets) or read from the
    official TSV."""
    import scipy.sparse as sp

    if official:
        from mpisdnn.formats.tsv import read_images_tsv

        return sp.csr_matrix(read_images_tsv(inputs, n))[rows]
    from mpisdnn.generate import digit_rows

    return digit_rows(rows, n, o.seed)


def reference_here(network, layers: int, y) -> np.ndarray:
    """1-based categories of ``y`` by :func:`mpisdnn.reference_inference` in this process
    (small problems: the first ``layers`` layers are held as scipy CSR)."""
    from mpi4py import MPI

    import mpisdnn as m
    from mpisdnn.sdnn.load import load_network
    from mpisdnn.sdnn.reference import categories_of

    net = load_network(MPI.COMM_SELF, str(network), layers)
    step = max(1, 2**26 // net.neurons)  # rows are independent: blocks bound the memory
    found = [categories_of(m.reference_inference(y[i : i + step], net), i)
             for i in range(0, y.shape[0], step)]  # fmt: skip
    return np.concatenate(found or [np.zeros(0, np.int64)])


def check(o: Options, cfg: dict, found, tmp: Path) -> dict:
    """PASS/FAIL of ``found`` (1-based categories of the run) against an independent answer."""
    from mpisdnn.formats import write_inputs
    from mpisdnn.formats.tsv import read_categories

    found = np.unique(np.asarray(found, dtype=np.int64))
    if cfg.get("truth"):
        truth = np.asarray(read_categories(cfg["truth"]), dtype=np.int64)
        ok = np.array_equal(np.unique(truth), found)
        return {"check": "official truth", "checked_rows": cfg["rows"], "pass": bool(ok)}
    full = cfg["rows"] * cfg["edges"] <= o.full_check_edges
    if full:
        rows = np.arange(cfg["rows"], dtype=np.int64)
    else:
        rows = sample_rows(found, cfg["rows"], cfg["n"], cfg["l"], o)
    y = sample_inputs(Path(cfg["inputs"]), cfg["official_inputs"], rows, cfg["n"], o)
    t0 = time.perf_counter()
    if full:
        ref = reference_here(cfg["network"], cfg["l"], y)
    else:
        sample, cats = tmp / "sample.h5", tmp / "reference-categories.tsv"
        write_inputs(sample, y, source="bench_official sample")
        mpisdnn(
            "infer", "--backend", "reference", "--network", cfg["network"], "--inputs", sample,
            "--layers", cfg["l"], "--categories-out", cats, "--quiet", ranks=o.ranks,
        )  # fmt: skip
        ref = read_categories(cats) if cats.stat().st_size else []
    t = time.perf_counter() - t0
    expect = rows[np.asarray(ref, dtype=np.int64) - 1] + 1
    claimed = np.intersect1d(found, rows + 1)
    ok = np.array_equal(np.unique(expect), claimed)
    return {
        "check": "reference, all rows" if full else "reference, sampled rows",
        "checked_rows": int(rows.size),
        "checked_categories": int(claimed.size),
        "check_seconds": t,
        "pass": bool(ok),
    }


# ---------------------------------------------------------------------------------- the matrix
def result_path(o: Options, n: int, l: int) -> Path:
    return o.out / "runs" / f"N{n}-L{l}.json"


def run_config(o: Options, n: int, l: int) -> dict:
    """Prepare, run, check (and ablate) one configuration; its result row."""
    net, net_src = network_for(o, n, l)
    inputs, official_inputs = inputs_for(o, n)
    truth = None
    if official_inputs and o.official is not None:
        t = o.official / f"neuron{n}-l{l}-categories.tsv"
        truth = str(t) if t.is_file() else None
    tmp = o.out / "tmp" / f"N{n}-L{l}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        run = run_infer(o, net, inputs, l, tmp)
        row = {"n": n, "l": l, "network": str(net), "network_source": net_src}
        row.update(inputs=str(inputs), official_inputs=official_inputs, truth=truth)
        row["ranks"] = o.ranks
        found = run.pop("found", [])
        row.update(run)
        if run["status"] != "ran":
            return row
        row.update(check(o, row, found, tmp))
        row["status"] = "PASS" if row["pass"] else "FAIL"
        if 0 < row["part1_s"] <= o.ablation_seconds and "--dedup" in _infer_help():
            off = run_infer(o, net, inputs, l, tmp, dedup="off")
            same = np.array_equal(off.pop("found", []), found)
            row["dedup_off"] = {k: off.get(k) for k in ("part1_s", "wall_s", "rate", "pss_peak")}
            row["dedup_off"]["same_categories"] = bool(same)
        return row
    finally:
        if not o.keep:
            shutil.rmtree(tmp, ignore_errors=True)


_HELP: list = []


def _infer_help() -> str:
    if not _HELP:
        res = subprocess.run(
            [sys.executable, "-m", "mpisdnn", "infer", "--help"], capture_output=True, text=True
        )
        _HELP.append(res.stdout)
    return _HELP[0]


def run_matrix(o: Options) -> list:
    """Every configuration, skipping finished ones; the rows in table order."""
    configs = [(n, l) for n in o.neurons for l in o.layers]
    (o.out / "runs").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (n, l) in enumerate(configs, 1):
        path = result_path(o, n, l)
        if o.report_only:
            if path.exists():
                rows.append(json.loads(path.read_text()))
            continue
        if path.exists() and not o.rerun:
            row = json.loads(path.read_text())
            if row.get("inputs_count") == o.inputs and row.get("status") == "PASS":
                say(f"[{i}/{len(configs)}] N={n} L={l}: done before ({path}), skipped")
                rows.append(row)
                continue
        say(f"[{i}/{len(configs)}] N={n} L={l}: running ({o.inputs} inputs, {o.ranks} ranks)")
        row = run_config(o, n, l)
        row["inputs_count"] = o.inputs
        path.write_text(json.dumps(row, indent=1, default=_jsonable))
        say(f"[{i}/{len(configs)}] N={n} L={l}: {_one_line(row)}")
        rows.append(row)
    return rows


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (Path,)):
        return str(x)
    raise TypeError(type(x))


def _one_line(r: dict) -> str:
    if r["status"] not in ("PASS", "FAIL"):
        return f"{r['status']}\n{r.get('log', '')}"
    return (
        f"{r['status']} ({r['check']}, {r['checked_rows']} rows)  load {r['load_s']:.1f} s  "
        f"part 1 {r['part1_s']:.2f} s  wall {r['wall_s']:.1f} s  "
        f"{r['rate'] / 1e12:.3f} TE/s  categories {r['categories']}  "
        f"PSS {r['pss_peak'] / 2**30:.2f} GiB"
    )


# ------------------------------------------------------------------------------------ output
def anchor_rows(n: int, l: int, inputs: int, edges: int) -> list:
    """The published figures for N x L as (who, rate in edges/s, what it covers)."""
    out = []
    for who, secs, rate, covers in ANCHORS.get((n, l), []):
        out.append((who, rate if rate else inputs * edges / secs, covers))
    return out


def markdown(rows: list, o: Options) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    head = (
        "| N | L | inputs | edges | load s | TSV read s | part 1 s | wall s | CPU s | TE/s "
        "| TE/s (wall) | categories | distinct | PSS GiB | dedup off: part 1 s | check | result | "
        "published (TE/s) |\n|" + "---|" * 18
    )
    out = [head]
    for r in rows:
        if r["status"] not in ("PASS", "FAIL"):
            out.append(f"| {r['n']} | {r['l']} |" + " |" * 14 + f" {r['status']} | |")
            continue
        total = r["rows"] * r["edges"]
        anchors = "; ".join(
            f"{who}: {rate / 1e12:.3g}" for who, rate, _ in anchor_rows(r["n"], r["l"], 60000,
                                                                          r["edges"])
        )  # fmt: skip
        off = r.get("dedup_off") or {}
        out.append(
            f"| {r['n']} | {r['l']} | {r['rows']:,} | {r['edges']:,} | {r['load_s']:.2f} "
            f"| {f(r.get('read_s'), '.1f')} | {r['part1_s']:.2f} | {r['wall_s']:.1f} "
            f"| {f(r.get('cpu_s'), '.0f')} | {r['rate'] / 1e12:.3f} "
            f"| {total / r['wall_s'] / 1e12:.3f} | {r['categories']:,} | {f(r['distinct'], ',')} "
            f"| {r['pss_peak'] / 2**30:.2f} | {f(off.get('part1_s'), '.2f')} "
            f"| {r['check']} ({r['checked_rows']:,} rows) | **{r['status']}** | {anchors or '–'} |"
        )
    meta = (
        f"\n{o.ranks} ranks; inputs read from TSV; TE/s = inputs x edges / (part 1 + part 2); "
        "TE/s (wall) = the same over the whole mpiexec wall, start-up and TSV reading included; "
        "TSV read = the parallel reader's part of load; CPU s = user + system seconds of the "
        "whole job (all ranks; on a loaded machine CPU s / ranks is the wall with free cores); "
        "PSS = peak of the job's summed PSS; distinct = fewest distinct live rows at a "
        "deduplication check.\n"
    )
    return "\n".join(out) + "\n" + meta


def figure(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] in ("PASS", "FAIL")]
    if not ok:
        return
    labels = [f"{r['n']}\n×{r['l']}" for r in ok]
    x = np.arange(len(ok))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(ok) + 2), 4.5))
    ax.bar(x - 0.2, [r["rate"] for r in ok], 0.4, label="mpisdnn, part 1 + 2")
    ax.bar(
        x + 0.2,
        [r["rows"] * r["edges"] / r["wall_s"] for r in ok],
        0.4,
        label="mpisdnn, whole mpiexec wall",
    )
    markers = iter("ovs^D*")
    seen: dict = {}
    for i, r in enumerate(ok):
        for who, rate, _ in anchor_rows(r["n"], r["l"], 60000, r["edges"]):
            m = seen.setdefault(who, next(markers, "x"))
            ax.plot([i], [rate], m, color="k", label=who if list(seen).count(who) else None)
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="best")
    ax.set_yscale("log")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("edges / s (inputs × edges / time)")
    ax.set_title("Graph Challenge configurations, 60,000 inputs (mpisdnn: 2 CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    o = parse_args(argv)
    o.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = run_matrix(o)
    md = markdown(rows, o)
    (o.out / "official.md").write_text(md)
    meta = {"options": {k: str(v) for k, v in asdict(o).items()}, "rows": rows}
    (o.out / "official.json").write_text(json.dumps(meta, indent=1, default=_jsonable))
    figure(rows, o.out / "official.png")
    shutil.rmtree(o.out / "tmp", ignore_errors=True)
    if o.drop_cache:
        for p in generated_files(o):
            p.unlink()
            say(f"removed {p}")
    print(md)
    bad = [r for r in rows if r["status"] != "PASS"]
    say(f"{len(rows) - len(bad)}/{len(rows)} PASS in {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
