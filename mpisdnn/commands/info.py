"""``mpisdnn info``: versions, MPI library, ranks and hosts, threads, backends, GPUs.

Run it under the same launcher as the real job (``mpiexec -n 4 mpisdnn info``, or
``srun --mpi=pmi2 mpisdnn info``): it then shows what the job will see, and a launcher that
starts independent singletons instead of one MPI job shows up as several ``ranks 1`` outputs.
The sbatch scripts save its ``--json`` output as ``versions.json`` next to every result.
"""

from __future__ import annotations

import json
import os

__all__ = ["DESCRIPTION", "add_arguments", "run", "gather_info"]

DESCRIPTION = (
    "Show versions, the MPI library, ranks per host, threads, backends and "
    "GPUs as this job sees them (collective: run it under your MPI launcher)."
)


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def gather_info(comm) -> dict:
    """Everything ``mpisdnn info`` shows (collective; the result is complete on rank 0)."""
    import socket

    from ..backends import available
    from ..parallel import gather
    from ..reporting import run_info
    from ..system import local_ranks

    info = run_info(comm, [])
    info.pop("command", None)
    info["mpi"] = _mpi_info()
    host = socket.gethostname()
    per_rank = gather(
        comm,
        {
            "host": host,
            "cores": _cores(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        },
    )
    nlocal = local_ranks(comm)
    if comm.rank == 0:
        by_host = {}
        for rank, item in enumerate(per_rank):
            entry = by_host.setdefault(
                item["host"], {"ranks": [], "cores_visible": item["cores"], "cuda_visible": []}
            )
            entry["ranks"].append(rank)
            entry["cuda_visible"].append(item["cuda_visible_devices"])
        info["ranks_per_host"] = {
            h: {
                "ranks": len(e["ranks"]),
                "first_rank": e["ranks"][0],
                "cores_visible": e["cores_visible"],
                "CUDA_VISIBLE_DEVICES": sorted({v for v in e["cuda_visible"] if v is not None}),
            }
            for h, e in by_host.items()
        }
    info["threads"] = _thread_info(nlocal)
    info["backends"] = {
        name: {"available": ok is True, "reason": None if ok is True else str(ok)}
        for name, ok in available().items()
    }
    info["gpu"] = _gpu_info()
    info["optional"] = optional_packages()
    info["slurm"] = {
        k: os.environ[k]
        for k in (
            "SLURM_JOB_ID",
            "SLURM_JOB_NUM_NODES",
            "SLURM_JOB_NODELIST",
            "SLURM_CPUS_PER_TASK",
            "SLURM_MEM_PER_CPU",
            "SLURM_MEM_PER_NODE",
        )
        if k in os.environ
    }
    return info


#: Every optional package and what it enables (``mpisdnn info`` lists them all, installed or
#: not): (distribution names to look for, the feature, how to install).
OPTIONAL = (
    (("pyarrow",), "Parquet projection outputs (-o H.parquet), Graph.from_edges(pyarrow "
     "Table), the faster parse of challenge TSV files", "pip install 'mpisdnn[parquet]'"),
    (("pandas",), "Graph.from_edges(DataFrame), project_matrix(DataFrame), "
     "ProjectionResult.to_pandas()", "pip install pandas"),
    (("matplotlib",), "figures of 'mpisdnn report RUN.json -o fig.png'",
     "pip install 'mpisdnn[plot]'"),
    (("hdf5plugin",), "--compress zstd|blosc2 for HDF5 outputs (and reading them)",
     "pip install 'mpisdnn[compress]'"),
    (("cupy-cuda12x", "cupy-cuda13x", "cupy"), "the gpu backend's device arrays",
     "pip install 'mpisdnn[gpu]'"),
    (("numba-cuda",), "the gpu backend's kernels (and the CUDA simulator tests)",
     "pip install 'mpisdnn[gpu]'"),
    (("python-graphblas",), "SuiteSparse:GraphBLAS peer in scripts/bench_*.py",
     "pip install 'mpisdnn[bench]'"),
    (("psutil",), "peak memory of the benchmarks' peers", "pip install 'mpisdnn[bench]'"),
    (("networkx",), "the test suite's projection reference", "pip install 'mpisdnn[test]'"),
    (("duckdb",), "reading Parquet outputs with SQL (docs; not needed by mpisdnn)",
     "pip install duckdb"),
)  # fmt: skip


def optional_packages() -> list:
    """``[{name, version or None, feature, install}]`` for every optional package, by
    distribution metadata (nothing is imported: cupy alone takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for names, feature, install in OPTIONAL:
        found = None
        for name in names:
            try:
                found = (name, version(name))
                break
            except PackageNotFoundError:
                continue
        name, ver = found if found else (names[0], None)
        out.append({"name": name, "version": ver, "feature": feature, "install": install})
    return out


def _thread_info(nlocal: int) -> dict:
    from ..system import default_threads

    out = {
        "cores_visible": _cores(),
        "local_ranks": nlocal,
        "default_threads_per_rank": default_threads(nlocal),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS"),
    }
    try:
        import numba

        out["numba_max_threads"] = int(numba.config.NUMBA_NUM_THREADS)
        out["numba_threading_layer"] = numba.config.THREADING_LAYER
    except ImportError:
        out["numba_max_threads"] = None
    return out


def _mpi_info() -> dict:
    from mpi4py import MPI

    vendor, version = MPI.get_vendor()
    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return {
        "vendor": vendor,
        "vendor_version": ".".join(map(str, version)),
        "library": " ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
        "standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "library_path": _libmpi_path(),
        "cuda_aware": _cuda_aware(),
    }


def _libmpi_path() -> str | None:
    """The MPI shared library this process loaded (tells a wheel from the site's MPI)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libmpi" in line and "/" in line}
    except OSError:
        return None
    # libmpi_mpifh / libmpi_cxx are bindings; the C library is the one we want.
    core = sorted(p for p in paths if os.path.basename(p).startswith("libmpi.so"))
    return (core or sorted(paths) or [None])[0]


def _cuda_aware() -> str:
    """Ask the MPI library itself (MPIX extensions of Open MPI and MPICH) whether it can send
    from GPU memory; "unknown" when it has no such query."""
    import ctypes

    path = _libmpi_path()
    if path is None:
        return "unknown (MPI library not found)"
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return "unknown"
    try:
        if hasattr(lib, "MPIX_Query_cuda_support"):
            return "yes" if lib.MPIX_Query_cuda_support() else "no"
        if hasattr(lib, "MPIX_GPU_query_support"):
            flag = ctypes.c_int(0)
            lib.MPIX_GPU_query_support(0, ctypes.byref(flag))  # 0 = MPIX_GPU_SUPPORT_CUDA
            return "yes" if flag.value else "no"
    except Exception:  # noqa: BLE001 - a vendor extension misbehaving is not our error
        return "unknown"
    return "unknown (no MPIX_Query_cuda_support)"


def _gpu_info() -> dict:
    out = {"cupy": None, "devices": 0, "names": []}
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - optional
        out["reason"] = f"cupy not importable: {type(exc).__name__}"
        return out
    out["cupy"] = cupy.__version__
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        out["devices"] = count
        out["names"] = [
            cupy.cuda.runtime.getDeviceProperties(i)["name"].decode(errors="replace")
            for i in range(count)
        ]
        out["cuda_runtime"] = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        out["reason"] = f"no usable CUDA device ({type(exc).__name__}: {exc})"
    return out


def format_text(info: dict) -> str:
    """The human-readable form of :func:`gather_info`'s result."""
    v, m, t, g = info["versions"], info["mpi"], info["threads"], info["gpu"]
    lines = [f"mpisdnn {v['mpisdnn']}  Python {v['python']}  ({info['platform']})"]
    for name in ("numpy", "scipy", "h5py", "mpi4py", "numba", "cupy"):
        lines.append(f"  {name:8s} {v.get(name) or 'not installed'}")
    lines.append(
        f"MPI: {m['vendor']} {m['vendor_version']} (MPI {m['standard']}, thread level "
        f"{m['thread_level']})"
    )
    lines.append(f"  library  {m['library']}")
    lines.append(f"  loaded   {m['library_path'] or '?'}")
    lines.append(f"  CUDA-aware: {m['cuda_aware']}")
    hosts = info.get("ranks_per_host", {})
    lines.append(f"ranks {info['ranks']} on {len(hosts)} host(s):")
    for host, e in hosts.items():
        lines.append(
            f"  {host}: {e['ranks']} rank(s) from rank {e['first_rank']}, "
            f"{e['cores_visible']} cores visible"
        )
    lines.append(
        f"threads: {t['default_threads_per_rank']} per rank by default "
        f"({t['cores_visible']} cores / {t['local_ranks']} ranks on rank 0's node); "
        f"numba max {t.get('numba_max_threads')}, OMP_NUM_THREADS={t['OMP_NUM_THREADS']}, "
        f"NUMBA_NUM_THREADS={t['NUMBA_NUM_THREADS']}"
    )
    for name, b in info["backends"].items():
        state = "available" if b["available"] else f"unavailable ({b['reason']})"
        lines.append(f"backend {name:9s} {state}")
    if g["cupy"]:
        names = ", ".join(g["names"]) or g.get("reason", "none")
        lines.append(f"GPUs: {g['devices']} ({names}); CuPy {g['cupy']}")
    else:
        lines.append(f"GPUs: none usable ({g.get('reason', 'no cupy')})")
    for host, e in hosts.items():
        if e["CUDA_VISIBLE_DEVICES"]:
            cvd = " | ".join(e["CUDA_VISIBLE_DEVICES"])
            lines.append(f"  {host}: CUDA_VISIBLE_DEVICES {cvd}")
    lines.append("optional packages (feature: install):")
    for item in info.get("optional", []):
        state = item["version"] or "not installed"
        tail = "" if item["version"] else f"  [{item['install']}]"
        lines.append(f"  {item['name']:17s} {state:14s} {item['feature']}{tail}")
    if info.get("slurm"):
        lines.append("slurm: " + " ".join(f"{k}={v}" for k, v in info["slurm"].items()))
    return "\n".join(lines)


def run(args, comm) -> int:
    from ..parallel import phase

    with phase("setup"):
        info = gather_info(comm)
    if comm.rank != 0:
        return 0
    if args.json:
        print(json.dumps(info, indent=2, default=str), flush=True)
    else:
        print(format_text(info), flush=True)
    return 0
