"""``mpisdnn info``: versions, MPI library, ranks and hosts, threads, backends, GPUs."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="versions, MPI, ranks/hosts, threads, backends, GPUs")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


def gather_info(comm) -> dict:
    """Everything ``mpisdnn info`` shows (collective)."""
    import os

    from ..backends import available
    from ..report import run_info

    info = run_info(comm, [])
    info.pop("command", None)
    info["threads"] = {
        "cores_visible": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS"),
    }
    info["backends"] = {k: (v is True, None if v is True else v) for k, v in available().items()}
    info["gpu"] = _gpu_info()
    return info


def _gpu_info() -> dict:
    out = {"cupy": False, "devices": 0, "cuda_aware_mpi": None}
    try:
        import cupy

        out["cupy"] = cupy.__version__
        out["devices"] = int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - optional
        pass
    try:
        from mpi4py import MPI

        lib = MPI.Get_library_version()
        if "Open MPI" in lib:
            out["cuda_aware_mpi"] = "see ompi_info --parsable --all | grep cuda_support"
        elif "MPICH" in lib:
            out["cuda_aware_mpi"] = "MPICH wheel: no (host buffers are used)"
    except Exception:  # noqa: BLE001
        pass
    return out


def run(args, comm) -> int:
    info = gather_info(comm)
    if comm.rank != 0:
        return 0
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    v = info["versions"]
    print(f"mpisdnn {v['mpisdnn']}  python {v['python']}  ({info['platform']})")
    for name in ("numpy", "scipy", "h5py", "mpi4py", "numba", "cupy"):
        print(f"  {name:8s} {v.get(name) or 'not installed'}")
    print(f"  MPI      {v.get('mpi_library')} (standard {v.get('mpi_standard')})")
    print(f"ranks {info['ranks']} on hosts {', '.join(info['hosts'])}")
    t = info["threads"]
    print(
        f"threads: {t['cores_visible']} cores visible; OMP_NUM_THREADS={t['OMP_NUM_THREADS']} "
        f"NUMBA_NUM_THREADS={t['NUMBA_NUM_THREADS']}"
    )
    for name, (ok, why) in info["backends"].items():
        print(f"backend {name:9s} {'available' if ok else 'unavailable: ' + str(why)}")
    g = info["gpu"]
    print(f"GPUs: cupy={g['cupy']} devices={g['devices']} cuda-aware MPI: {g['cuda_aware_mpi']}")
    return 0
