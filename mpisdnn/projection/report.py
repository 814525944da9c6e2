"""The ``kind="project"`` JSON report and rank 0's short summary."""

from __future__ import annotations

from ..reporting import SCHEMA
from ..reporting.schema import communication_line
from ..system import format_size

__all__ = ["project_report", "project_summary"]


def project_report(result, run: dict, problem: dict, read_seconds: float, output=None, *,
                   read_phases=None, wall=None, communication=None) -> dict:  # fmt: skip
    """The full JSON report of one projection (same on every rank; rank 0 writes it), in
    one place: ``read_phases`` (the read's parts), ``wall`` (seconds from the options to the
    closed output, the command's clock) and ``communication``
    (:func:`mpisdnn.parallel.communication_section`) where the caller measured them."""
    ranks = dict(result.ranks)
    seconds = dict(result.seconds)
    if wall is not None:
        seconds["wall"] = wall
    compute = max(ranks["compute_seconds"]) if ranks["compute_seconds"] else 0.0
    write = max(ranks["write_seconds"]) if ranks["write_seconds"] else 0.0
    report = {
        "schema": SCHEMA,
        "kind": "project",
        "run": run,
        "problem": dict(problem, flops=result.extra["flops"], nodes=result.shape[0]),
        "options": result.options,
        "result": {
            "shape": list(result.shape),
            "nnz": result.nnz,
            "stored_nnz": result.extra.get("stored_nnz", result.nnz),
            "nnz_with_self_loops": result.nnz_with_self_loops,
            "nnz_without_self_loops": result.nnz_without_self_loops,
            "self_loops": result.diagonal,
            "index_dtype": result.index_dtype,
            "value_dtype": result.value_dtype,
            "output": output,
            "chunks_written": int(sum(ranks["chunks"])),
        },
        "phases": {
            "read_seconds": read_seconds,
            "kernel_load_seconds": seconds.get("kernel_load", 0.0),
            "plan_seconds": seconds["plan"],
            "compute_seconds": compute,
            "write_seconds": write,
            # "wall" (the CLI's) spans kernel load, plan, compute and write
            "total_seconds": read_seconds
            + seconds.get(
                "wall", seconds.get("kernel_load", 0.0) + seconds["plan"] + compute + write
            ),
        },
        "ranks": ranks,
        "threads_per_rank": result.threads,
        "memory": {
            "bound_per_rank_bytes": result.options["memory_per_rank"],
            "scratch_bytes": result.extra["scratch_bytes"],
            "peak_rss_bytes_max": max(ranks["peak_rss_bytes"]),
        },
    }
    if read_phases is not None:
        report["phases"]["read"] = read_phases
    report["communication"] = communication
    return report


def project_summary(report: dict) -> str:
    """A few human lines for rank 0's stdout."""
    p, o, r, ph, rk = (
        report["problem"],
        report["options"],
        report["result"],
        report["phases"],
        report["ranks"],
    )
    extra = []
    if o.get("min_weight") is not None:
        extra.append(f"min-weight={o['min_weight']}")
    if o.get("top_k") is not None:
        extra.append(f"top-k={o['top_k']}")
    out = r["output"] or "nowhere (no --output)"
    if p.get("index_base") and r["output"] and str(r["output"]).lower().endswith((".h5", ".hdf5")):
        out += f" (0-based indices: the input's id is index + {p['index_base']}, attr index_base)"
    return "\n".join(
        [
            f"mpisdnn project: {p['input']} ({p['rows']} x {p['cols']}, {p['nnz']} edges) "
            f"onto={o['onto']} weight={o['weight']} triangle={o['triangle']} "
            f"self-loops={o['self_loops']} {' '.join(extra)}".rstrip()
            + f" ranks={report['run']['ranks']} threads/rank={report['threads_per_rank']}",
            f"  H: {r['shape'][0]} x {r['shape'][1]}, nnz {r['nnz']} (with self-loops "
            f"{r['nnz_with_self_loops']}, without {r['nnz_without_self_loops']}), "
            f"{r['chunks_written']} chunks -> {out}"
            + (
                f" (symmetric storage: {r['stored_nnz']} entries v >= u)"
                if o.get("storage") == "symmetric"
                else ""
            ),
            f"  read {ph['read_seconds']:.3f} s"
            + (" (" + ", ".join(f"{k} {v:.3f}" for k, v in ph["read"].items()) + ")"
               if ph.get("read") else "")
            + f" | plan {ph['plan_seconds']:.3f} s | compute "
            f"{ph['compute_seconds']:.3f} s | write {ph['write_seconds']:.3f} s",
            f"  work imbalance {rk['work_imbalance']:.3f} (max/mean over {len(rk['work'])} ranks)"
            f", peak RSS/rank {format_size(report['memory']['peak_rss_bytes_max'])} "
            f"(bound {format_size(report['memory']['bound_per_rank_bytes'])} + input)",
            *filter(None, [communication_line(report)]),
        ]
    )
