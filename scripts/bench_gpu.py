#!/usr/bin/env python
"""The gpu backend's benchmark table, with its peers measured in the same run.

Every configuration (``N x L``, 60,000 inputs) runs three contenders, each in its own process
(clean peak RSS and device memory), on the same files:

``gpu``   ``mpisdnn.infer(backend="gpu")``: the numba-cuda kernels on CuPy arrays.
``cupy``  what a user writes: the plain CuPy CSR loop (``Y @ W``, the bias where the product
          is non-zero, ReLU, clip at YMAX, zeros pruned; categories from the row sums).
          Under the simulator (no CuPy) the same code runs on scipy, so it is exercised.
``cpu``   ``mpisdnn.infer(backend="cpu")`` on ``--threads`` cores of the same machine.

Seconds are part 1 + part 2 (the timed loop and the categories), the minimum over
``--repeat`` runs after a warm-up; loading the files and uploading them to the device are
reported apart (``load_seconds``, ``upload_seconds``). Every run's categories are checked: against
the truth stored in the inputs file where there is one (N=1024 x 120: the reference computed
by ``mpisdnn generate inputs --network``), and against the other contenders.

Data is generated on the machine that runs this (``--prepare``), in parallel: networks with
``mpisdnn generate network`` (the official N=1024 network from ``--official TAR`` when given),
inputs with ``mpiexec -n CORES mpisdnn generate inputs`` (digit-like, calibrated to the
official survivor counts). No file travels with the repository.

A global deadline (``--deadline``, seconds since the epoch; ``scripts/gpu_check.sh`` sets
it) bounds the whole run: a step that cannot finish before it is skipped, and the table says
so. The CuPy loop is also capped (``--cupy-cap`` seconds per run): past the cap it stops
after the current layer and its rate is reported over the layers it did (marked partial).

    python scripts/bench_gpu.py --prepare --data /tmp/gpu-data &        # data, in background
    python scripts/bench_gpu.py --data /tmp/gpu-data --out results/     # the table
    python scripts/bench_gpu.py --sim --data /tmp/d --out /tmp/o        # simulator, tiny data
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
INPUTS = 60000
#: The 12 official configurations, most important first (issue 38's two targets lead).
CONFIGS = [
    (1024, 120), (65536, 120), (65536, 1920), (1024, 480), (1024, 1920), (4096, 120),
    (4096, 480), (4096, 1920), (16384, 120), (16384, 480), (16384, 1920), (65536, 480),
]
#: Published GPU entries in TE/s, 60,000 inputs (issue 38; SNICIT 2023 Table 3 and the PNNL
#: re-runs): SNICIT (1 RTX A6000, approximate), XY-2021 (1 RTX A6000), the 2020 champion (1
#: A100), the CuPy CSR loop (1 A100). None of them is exact.
PUBLISHED = {
    (1024, 120): {"snicit": 17.6, "xy2021": 15.8, "champion2020": 13.1, "cupy_a100": 0.30},
    (1024, 1920): {"snicit": 52.1, "xy2021": 26.4, "champion2020": 16.8},
    (4096, 1920): {"snicit": 169.0, "xy2021": 48.3},
    (16384, 1920): {"snicit": 337.0, "xy2021": 55.2, "champion2020": 13.0, "cupy_a100": 0.080},
    (65536, 120): {"snicit": 32.6, "xy2021": 27.0, "champion2020": 6.6},
    (65536, 1920): {"snicit": 351.0, "xy2021": 55.6, "champion2020": 7.7},
}
#: Issue 38's targets: (N, L) -> seconds at most.
TARGETS = {(1024, 120): 60000 * 1024 * 32 * 120 / 20e12, (65536, 1920): 0.6}
CONTENDERS = ("gpu", "cupy", "cpu")
#: Ablations of the gpu backend (``--contenders gpu,gpu-nosets,...``): each switches one
#: technique off, so one device run measures what each is worth.
GPU_ABLATIONS = {
    "gpu-nosets": ({"column_sets": False}, {}),  # every column summed on its own
    "gpu-notail": ({"tail_rows": 0}, {}),  # few rows: split kernel, one launch per layer
    "gpu-nosplit": ({"tail_rows": 0, "split_rows": 0}, {}),  # the group kernel only
    "gpu-nodedup": ({}, {"dedup": False}),  # identical rows computed every time
    # Layer groups up to 2048 layers (default 128): the long tail in fewer launches and
    # read-backs (1024 x 1920: 12 groups instead of 22, docs/gpu.md).
    "gpu-longgroups": ({}, {"max_group": 2048}),
}
#: Where each ablation runs by default (``name@NxL``; a bare name: the first configuration).
#: Not at 65536 x 1920: every process there loads an 8 GB network first (``--ablations
#: gpu-longgroups@65536x1920`` asks for it).
DEFAULT_ABLATIONS = ("gpu-nosets", "gpu-notail", "gpu-nosplit", "gpu-nodedup",
                     "gpu-longgroups@1024x1920")
#: The data job's marker: written when it has finished (or given up).
DONE = ".prepare-done"


def log(msg: str) -> None:
    print(f"[bench_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _mpisdnn(ranks: int, args: list, timeout: float) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python -m mpisdnn ARGS`` (one plain process without mpiexec)."""
    from mpisdnn.system import mpiexec_path
    exe = mpiexec_path()
    cmd = [sys.executable, "-m", "mpisdnn", *args]
    if exe and ranks > 1:
        cmd = [exe, "-n", str(ranks), *cmd]
        if "Open MPI" in _mpi_kind(exe):
            cmd[1:1] = ["--oversubscribe", "--bind-to", "none"]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)


def _mpi_kind(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


# ----------------------------------------------------------------------------- data
def files(data: Path, n: int, nl: int) -> dict:
    """Where the network and the inputs of ``N x L`` live under ``data``."""
    # The scipy reference truth is cheap at N=1024 (16 ranks: seconds); elsewhere the runs
    # are checked against each other (the cpu backend is checked against scipy in CI).
    truth = n == 1024 and nl <= 120
    return {
        "network": data / f"net{n}-l{nl}.h5",
        "inputs": data / (f"in{n}-l{nl}-truth.h5" if truth else f"in{n}.h5"),
    }


def sim_profile(args) -> None:
    """Tiny data for the CUDA simulator: N=1024 (the generators' smallest), few inputs and
    layers; the same steps otherwise."""
    args.inputs = min(args.inputs, 6)
    args.configs = args.configs or "1024x3"
    args.repeat = 1
    args.threads = min(args.threads, 2)
    args.ranks = min(args.ranks, 2)
    if args.ablations is None:
        args.ablations = ""  # the simulator's kernels are slow: each ablation costs seconds


def parse_configs(text: str | None) -> list:
    if not text:
        return list(CONFIGS)
    out = []
    for item in text.split(","):
        n, nl = item.lower().split("x")
        out.append((int(n), int(nl)))
    return out


def prepare_one(args, n: int, nl: int, deadline: float) -> dict:
    """The network and inputs of one configuration (kept when already there)."""
    f = files(Path(args.data), n, nl)
    t0 = time.perf_counter()
    out = {"neurons": n, "layers": nl}
    left = max(1.0, deadline - time.time())
    if not f["network"].exists():
        tar = Path(args.official) if args.official else None
        if n == 1024 and tar is not None and tar.exists():
            with tempfile.TemporaryDirectory(dir=args.data) as tmp:
                with tarfile.open(tar) as t:
                    t.extractall(tmp, filter="data")
                src = Path(tmp) / "neuron1024"
                p = _mpisdnn(min(args.ranks, 8), ["convert", "network", str(src), "-o",
                                                  str(f["network"]), "--layers", str(nl)], left)
            out["network_source"] = f"official neuron1024.tar.gz, first {nl} layers"
        else:
            p = _mpisdnn(1, ["generate", "network", "--neurons", str(n), "--layers", str(nl),
                             "--seed", "1", "-o", str(f["network"])], left)
            out["network_source"] = f"mpisdnn generate network --neurons {n} --layers {nl} --seed 1"
        if p.returncode != 0:
            raise RuntimeError(f"network {n}x{nl}: {p.stderr.strip()[-2000:]}")
    if not f["inputs"].exists():
        cmd = ["generate", "inputs", "--neurons", str(n), "--count", str(args.inputs),
               "--seed", "1", "-o", str(f["inputs"])]
        if "truth" in f["inputs"].name:
            cmd += ["--network", str(f["network"])]
        p = _mpisdnn(args.ranks, cmd, max(1.0, deadline - time.time()))
        if p.returncode != 0:
            raise RuntimeError(f"inputs {n}: {p.stderr.strip()[-2000:]}")
    out["seconds"] = time.perf_counter() - t0
    return out


def prepare(args, configs, deadline: float) -> list:
    """Every configuration's data, the main three first; stops at the deadline. Writes the
    marker ``DONE`` at the end (the table waits for a configuration's files until then)."""
    Path(args.data).mkdir(parents=True, exist_ok=True)
    marker = Path(args.data) / DONE
    marker.unlink(missing_ok=True)
    try:
        return _prepare(args, configs, deadline)
    finally:
        marker.touch()


def _wait_for(f: dict, data: Path, deadline: float) -> bool:
    """Wait until the files of ``f`` exist, the data job has finished, or the deadline."""
    while not all(p.exists() for p in f.values()):
        if (data / DONE).exists() or time.time() > deadline - 10:
            return False
        time.sleep(0.5)
    return True


def _prepare(args, configs, deadline: float) -> list:
    done = []
    for n, nl in configs:
        if time.time() > deadline:
            log(f"prepare: deadline reached before {n}x{nl}")
            break
        try:
            done.append(prepare_one(args, n, nl, deadline))
            log(f"prepared {n}x{nl} in {done[-1]['seconds']:.1f} s")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"prepare {n}x{nl} failed: {exc}")
            done.append({"neurons": n, "layers": nl, "error": str(exc)[-500:]})
    return done


# ----------------------------------------------------------------------------- workers
def _device_memory():
    """``(pool high-water bytes, device bytes in use)`` where CuPy is present."""
    try:
        import cupy

        pool = cupy.get_default_memory_pool()
        free, total = cupy.cuda.runtime.memGetInfo()
        return int(pool.total_bytes()), int(total - free)
    except Exception:  # noqa: BLE001 - no CuPy or no device (simulator)
        return None, None


def _digest(cats) -> dict:
    cats = np.asarray(cats, np.int64)
    return {"count": int(cats.size), "sha1": hashlib.sha1(cats.tobytes()).hexdigest()}


def cupy_loop(net, y0, cap: float, xp_sparse=None):
    """The plain CSR loop a user writes, on CuPy (or on scipy where ``xp_sparse`` says so).

    Returns ``(seconds, categories, layers done, upload seconds)``: past ``cap`` seconds it
    stops after the current layer."""
    if xp_sparse is None:
        import cupy as xp
        import cupyx.scipy.sparse as xsp

        sync = xp.cuda.runtime.deviceSynchronize
    else:
        xp, xsp = np, xp_sparse

        def sync():
            return None

    t0 = time.perf_counter()
    ws = [xsp.csr_matrix(w) for w in net.layers]
    bs = [xp.asarray(np.asarray(b, np.float32)) for b in net.bias]
    y = xsp.csr_matrix(y0)
    ymax = np.float32(net.ymax)
    sync()
    upload = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = 0
    for w, b in zip(ws, bs):
        z = y @ w
        d = z.data
        # the bias only where the product is non-zero, then ReLU and the clip
        d = xp.where(d != 0, d + b[z.indices], d)
        z.data = xp.minimum(xp.maximum(d, np.float32(0)), ymax)
        z.eliminate_zeros()
        y = z
        done += 1
        if cap and time.perf_counter() - t0 > cap:
            sync()
            break
    sums = xp.asarray(y.sum(axis=1)).ravel()
    cats = xp.nonzero(sums)[0]
    cats = cats.get() if hasattr(cats, "get") else cats
    sync()
    return time.perf_counter() - t0, np.asarray(cats, np.int64) + 1, done, upload


def launch_probe(net, calls: int = 30, warm: int = 3) -> dict:
    """Host microseconds of one layer group on one row (median of ``calls``, synchronised):
    the floor every group pays in launches and round trips, per kernel path."""
    import scipy.sparse as sp

    from mpisdnn.backends.gpu import GpuBackend
    from mpisdnn.network import Network
    from mpisdnn.weights import InMemoryStore

    one = Network(net.layers[:2], net.bias[:2], net.neurons, ymax=net.ymax)
    y = sp.csr_matrix((np.ones(1, np.float32), ([0], [0])), shape=(1, net.neurons))
    out = {}
    for path, knobs in (("tail", {"tail_rows": 1 << 20}), ("split", {"tail_rows": 0}),
                        ("group", {"tail_rows": 0, "split_rows": 0})):
        be = GpuBackend(0, **knobs)
        pn = be.prepare_network(InMemoryStore(one))
        dev = be.to_device(y)
        times = []
        for i in range(calls + warm):
            t0 = time.perf_counter()
            be.run_layers(dev, pn, 0, 2)
            be.synchronize()
            if i >= warm:
                times.append(time.perf_counter() - t0)
        out[f"{path}_group_call_us"] = 1e6 * float(np.median(times))
    return out


def graph_probe(calls: int = 30, layers: int = 8) -> dict:
    """Can numba launches on the backend's CuPy stream be captured in a CUDA graph, and what
    does a replay cost per layer against direct launches? The split kernel on one row of a
    generated N=1024 radix-net, ``layers`` launches per group (docs/gpu.md: graphs are not
    used; this is the device's answer). Device only; its own process (``--graph-probe``)."""
    import scipy.sparse as sp

    from mpisdnn.backends.gpu import STAT_FIELDS, GpuBackend
    from mpisdnn.generate import radixnet
    from mpisdnn.weights import InMemoryStore

    out = {"layers": layers}
    be = GpuBackend(0, tail_rows=0, split_rows=1 << 20)
    pn = be.prepare_network(InMemoryStore(radixnet(1024, layers, seed=0)))
    part = be.to_device(sp.csr_matrix(np.ones((1, 1024), np.float32))).parts[0]
    arr = be.arrays
    weights = pn.group(0, layers, be.max_group)
    sbytes = 8 * STAT_FIELDS * layers
    rep = arr.for_kernel(arr.zeros(sbytes + layers * part.nrows, np.uint8))
    stats = rep[:sbytes].view(np.int64).reshape(layers, STAT_FIELDS)
    _, ones = be._row_weights(None, 1)

    def launch():
        return be._split_layers(part, pn, layers, weights, stats, ones, max(pn.nsets),
                                rep[sbytes:])

    def timed(fn):
        fn()
        arr.stream.synchronize()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            arr.stream.synchronize()
            times.append(time.perf_counter() - t0)
        return 1e6 * float(np.median(times)) / layers

    out["direct_us_per_layer"] = timed(launch)
    try:
        keep = []  # the captured launches' buffers must outlive the graph
        arr.stream.begin_capture()
        try:
            keep.append(launch())
        finally:
            graph = arr.stream.end_capture()
        out["graph_replay_us_per_layer"] = timed(lambda: graph.launch(arr.stream))
        out["capture"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the answer is whether it works
        out["capture"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


def worker(args) -> dict:
    """One contender on one configuration, ``--repeat`` timed runs after a warm-up."""
    from mpi4py import MPI

    from mpisdnn.formats import read_inputs, read_network

    t0 = time.perf_counter()
    net = read_network(args.network, layers=args.layers)
    y0, truth = read_inputs(args.input_file)
    load = time.perf_counter() - t0
    out = {"contender": args.worker, "load_seconds": load, "runs": []}
    name = args.worker
    if name in ("gpu", "cpu") or name in GPU_ABLATIONS:
        from mpisdnn import InferOptions, infer

        knobs, extra = GPU_ABLATIONS.get(name, ({}, {}))
        backend = "cpu" if name == "cpu" else "gpu"
        opts = InferOptions(backend=backend, threads=args.threads if name == "cpu" else None,
                            **extra)

        def make():
            if not knobs:
                return None  # the engine builds it from the options
            from mpisdnn.backends.gpu import GpuBackend

            return GpuBackend(0, max_group=opts.max_group, **knobs)

        # Warm-up: compiles every kernel (the engine's own warm-up keeps compiling out of
        # part 1, but the first process-wide CUDA context and module loads are not). The
        # simulator compiles nothing.
        if not os.environ.get("NUMBA_ENABLE_CUDASIM"):
            infer(net, y0[: min(64, y0.shape[0])], MPI.COMM_SELF, options=opts, backend=make())
        for _ in range(args.repeat):
            w0 = time.perf_counter()
            res = infer(net, y0, MPI.COMM_SELF, options=opts, backend=make())
            wall = time.perf_counter() - w0
            sec = res.part1 + res.part2
            out["runs"].append({"seconds": sec, "wall_seconds": wall,
                                "upload_seconds": max(0.0, wall - sec)})
            cats = res.categories
        out["groups"] = len(res.groups)
        out["dedup_checks"] = len((res.dedup or {}).get("checks") or [])
        if backend == "gpu":
            out["device"] = res.backend
            if name == "gpu":
                sim = bool(os.environ.get("NUMBA_ENABLE_CUDASIM"))
                out["launch_probe"] = launch_probe(net, 1 if sim else 30, 0 if sim else 3)
        out["layers_done"] = args.layers
    elif name == "cupy":
        xsp = None
        try:
            import cupy  # noqa: F401
        except ImportError:
            import scipy.sparse as xsp  # the simulator's stand-in: same code on scipy

            out["on"] = "scipy (no CuPy here)"
        cupy_loop(net, y0[: min(64, y0.shape[0])], 0, xsp)  # warm-up
        for _ in range(args.repeat):
            sec, cats, done, upload = cupy_loop(net, y0, args.cap, xsp)
            out["runs"].append({"seconds": sec, "upload_seconds": upload, "layers_done": done})
            if done < args.layers:
                break  # capped: one partial run says enough
        out["layers_done"] = out["runs"][-1]["layers_done"]
    else:
        raise SystemExit(f"unknown contender {name}")
    pool, used = _device_memory() if name != "cpu" else (None, None)
    out.update(
        seconds=min(r["seconds"] for r in out["runs"]),
        categories=_digest(cats),
        truth=None if truth is None else _digest(truth),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        device_pool_bytes=pool,
        device_used_bytes=used,
        inputs=int(y0.shape[0]),
        edges=int(net.edges),
    )
    return out


def run_contender(args, name, n, nl, deadline) -> dict:
    f = files(Path(args.data), n, nl)
    left = deadline - time.time()
    row = {"contender": name, "neurons": n, "layers": nl}
    if left < 10:
        return {**row, "skipped": f"{left:.0f} s left before the deadline"}
    if not _wait_for(f, Path(args.data), deadline):
        return {**row, "skipped": "data not prepared (see prepare.log)"}
    left = deadline - time.time()
    cmd = [sys.executable, __file__, "--worker", name, "--network", str(f["network"]),
           "--input-file", str(f["inputs"]), "--layers", str(nl), "--repeat", str(args.repeat),
           "--threads", str(args.threads), "--cap", str(args.cupy_cap)]
    env = _env()
    if name == "cpu":
        env["NUMBA_NUM_THREADS"] = str(args.threads)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=left - 5)
    except subprocess.TimeoutExpired:
        return {**row, "skipped": f"timed out after {left - 5:.0f} s (the deadline)"}
    if p.returncode != 0:
        return {**row, "error": p.stderr.strip()[-2500:]}
    got = json.loads(p.stdout.strip().splitlines()[-1])
    got.update(row)
    edges = got["inputs"] * n * 32 * got["layers_done"]
    got["te_per_s"] = edges / got["seconds"] / 1e12
    return got


def check(rows: list) -> None:
    """Mark every row's categories: equal to the stored truth, and to the gpu/cpu runs."""
    by = {r["contender"]: r for r in rows if "categories" in r}
    ref = by.get("cpu") or by.get("gpu")
    for r in rows:
        if "categories" not in r:
            continue
        if r.get("layers_done", 0) < r["layers"]:
            r["check"] = "partial run: not checked"
        elif r.get("truth"):
            r["check"] = "PASS (truth)" if r["categories"] == r["truth"] else "FAIL (truth)"
        elif ref is not None and ref is not r:
            same = r["categories"] == ref["categories"]
            r["check"] = f"{'PASS' if same else 'FAIL'} (= {ref['contender']})"
        else:
            r["check"] = "reference for the others"


def table(results: list) -> str:
    head = (f"{'N x L':>12} {'contender':>11} {'seconds':>9} {'TE/s':>8} {'load s':>7} "
            f"{'dev MB':>7} {'RSS MB':>7} {'categories':>10}  check / published TE/s")
    lines = [head, "-" * len(head)]
    for r in results:
        nl = f"{r['neurons']}x{r['layers']}"
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or ("error: " + r["error"].splitlines()[-1][:80])
            lines.append(f"{nl:>12} {r['contender']:>11}  -- {why}")
            continue
        dev = r.get("device_pool_bytes")
        part = "" if r["layers_done"] >= r["layers"] else f" (partial {r['layers_done']} layers)"
        pub = PUBLISHED.get((r["neurons"], r["layers"]), {}) if r["contender"] == "gpu" else {}
        lines.append(
            f"{nl:>12} {r['contender']:>11} {r['seconds']:9.4f} {r['te_per_s']:8.2f} "
            f"{r['load_seconds']:7.1f} {(dev or 0) / 2**20:7.0f} "
            f"{r['peak_rss_bytes'] / 2**20:7.0f} {r['categories']['count']:>10}  "
            f"{r.get('check', '')}{part} {' '.join(f'{k}={v}' for k, v in pub.items())}"
        )
        dev_info = r.get("device") or {}
        if "host_reads" in dev_info:
            launches = dev_info.get("kernel_launches") or {}
            lines.append(f"{'':>12} last run: {r.get('groups', '?')} groups, "
                         f"{r.get('dedup_checks', '?')} dedup checks, "
                         f"{dev_info['host_reads']} reads back, {sum(launches.values())} "
                         "launches (" + ", ".join(f"{k} {v}" for k, v in launches.items())
                         + ")")
        probe = r.get("launch_probe")
        if probe:
            lines.append(f"{'':>12} one 2-layer group on 1 row (host us): " + ", ".join(
                f"{k.split('_')[0]} {v:.0f}" for k, v in probe.items()))
        target = TARGETS.get((r["neurons"], r["layers"]))
        if target and r["contender"] == "gpu" and not part:
            ok = "reached" if r["seconds"] <= target else "NOT reached"
            lines.append(f"{'':>12} target <= {target:.4f} s: {ok}")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _device_name() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return p.stdout.strip() or "no nvidia-smi output"
    except (OSError, subprocess.SubprocessError):
        return "no GPU (nvidia-smi not found)"


def plan(args, configs) -> list:
    """``((N, L), contender)`` steps in order: the contenders on the first three
    configurations (the targets), then ``--ablations`` on the first one, then the rest."""
    names = args.contenders.split(",")
    head, rest = configs[:3], configs[3:]
    steps = [(c, name) for c in head for name in names]
    for item in (args.ablations or "").split(","):
        name, _, where = item.partition("@")
        config = parse_configs(where)[0] if where else (configs[0] if configs else None)
        if name and config in configs:  # elsewhere: no data prepared
            steps.append((config, name))
    return steps + [(c, name) for c in rest for name in names]


def bench(args, configs, deadline) -> dict:
    from mpisdnn.system import load_average_text

    meta = {
        "schema": 1,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("MPISDNN_COMMIT") or _commit(),
        "device": _device_name(),
        "simulator": bool(args.sim),
        "host_cores": os.cpu_count(),
        "cpu_threads": args.threads,
        "inputs": args.inputs,
        "repeat": args.repeat,
        "cupy_cap_seconds": args.cupy_cap,
        "load_average_start": load_average_text(),
    }
    by_config = {}
    for (n, nl), name in plan(args, configs):
        rows = by_config.setdefault((n, nl), [])
        if time.time() > deadline - 10:
            rows.append({"contender": name, "neurons": n, "layers": nl,
                         "skipped": "global time budget spent"})
            continue
        log(f"{n}x{nl} {name} ...")
        rows.append(run_contender(args, name, n, nl, deadline))
        r = rows[-1]
        log(f"{n}x{nl} {name}: " + (f"{r['seconds']:.4f} s" if "seconds" in r
                                     else r.get("skipped") or "error"))
        check(rows)
        if args.out:
            _write(args, meta, [x for rs in by_config.values() for x in rs])
    results = [x for rs in by_config.values() for x in rs]
    meta["load_average_end"] = load_average_text()
    return {**meta, "results": results}


def _write(args, meta, results) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench_gpu.json.tmp"
    tmp.write_text(json.dumps({**meta, "results": results}, indent=1, default=str))
    tmp.replace(out / "bench_gpu.json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT / "data" / "gpu"), help="generated data here")
    p.add_argument("--out", help="write bench_gpu.json here")
    p.add_argument("--configs", help="e.g. 1024x120,65536x1920 (default: all 12, main first)")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help=f"of {', '.join(CONTENDERS + tuple(GPU_ABLATIONS))}")
    p.add_argument("--ablations", help="gpu ablations run after the first three "
                   "configurations, each on the first configuration or on the one it names "
                   f"(name@NxL; default {','.join(DEFAULT_ABLATIONS)}; none under --sim; "
                   "empty: none)")
    p.add_argument("--inputs", type=int, default=INPUTS)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cpu contender")
    p.add_argument("--ranks", type=int, default=os.cpu_count() or 1, help="for generating")
    p.add_argument("--cupy-cap", type=float, default=20.0, help="seconds per CuPy run")
    p.add_argument("--official", help="neuron1024.tar.gz (else N=1024 is generated)")
    p.add_argument("--deadline", type=float, help="seconds since the epoch (default: +420 s)")
    p.add_argument("--prepare", action="store_true", help="only generate the data")
    p.add_argument("--prepared-by", help="(gpu_check.sh) the data job runs beside this one")
    p.add_argument("--sim", action="store_true", help="CUDA simulator: tiny data")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--network", help=argparse.SUPPRESS)
    p.add_argument("--input-file", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--graph-probe", action="store_true",
                   help="(device) CUDA graph capture of the split kernel's launches, as JSON")
    args = p.parse_args(argv)
    if args.graph_probe:
        print(json.dumps(graph_probe()))
        return 0
    if args.worker:
        print(json.dumps(worker(args), default=str))
        return 0
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        sim_profile(args)
    if args.ablations is None:
        args.ablations = ",".join(DEFAULT_ABLATIONS)
    configs = parse_configs(args.configs)
    deadline = args.deadline or time.time() + 420
    if args.prepare:
        prepare(args, configs, deadline)
        return 0
    if not args.prepared_by:  # no data job beside this one: make the data first
        prepare(args, configs, deadline)
    res = bench(args, configs, deadline)
    text = table(res["results"])
    if args.out:
        _write(args, {k: v for k, v in res.items() if k != "results"}, res["results"])
    print(f"\n{res['device']}  commit {res['commit']}  {res['date']}  "
          f"load {res['load_average_start']} -> {res['load_average_end']}")
    print(text)
    bad = [r for r in res["results"] if "FAIL" in r.get("check", "") or "error" in r]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
