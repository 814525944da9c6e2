"""The report of one inference run, and its human summary for rank 0's stdout."""

from __future__ import annotations

from .schema import SCHEMA

__all__ = ["infer_report", "infer_summary"]


def infer_report(result, run: dict, load_seconds: float, check: dict | None, neurons: int) -> dict:
    """The full JSON report of one inference run."""
    return {
        "schema": SCHEMA,
        "kind": "infer",
        "run": run,
        "problem": {
            "neurons": neurons,
            "layers": result.layers,
            "inputs": result.g_rows,
            "edges": result.edges,
        },
        "phases": {
            "load_seconds": load_seconds,
            "part1_seconds": result.part1,
            "part2_seconds": result.part2,
            "rate_edges_per_second": result.rate,
        },
        "layers": {
            "nnz": result.layer_nnz,
            "active_rows": result.layer_active_rows,
            "seconds": result.layer_seconds,
            "work_imbalance": getattr(result, "layer_imbalance", []),
            "groups": getattr(result, "groups", []),
        },
        "rebalance": {
            "threshold": getattr(result, "rebalance_threshold", 0.0),
            "events": getattr(result, "rebalances", []),
        },
        "ranks": {
            "seconds": result.rank_seconds,
            "rows": result.rank_rows,
            "nnz": result.rank_nnz,
            "imbalance": result.imbalance,
        },
        "backend": result.backend,
        "categories": {"count": int(result.categories.size)},
        "check": check,
    }


def infer_summary(report: dict) -> str:
    """A few human lines for rank 0's stdout."""
    p, ph, rk = report["problem"], report["phases"], report["ranks"]
    be = report["backend"]
    threads = f" threads/rank={be['threads']}" if "threads" in be else ""
    lines = [
        f"mpisdnn infer: N={p['neurons']} L={p['layers']} inputs={p['inputs']} "
        f"edges={p['edges']} ranks={report['run']['ranks']} backend={be['name']}{threads}",
        f"  load {ph['load_seconds']:.3f} s | part 1 (layers) {ph['part1_seconds']:.3f} s | "
        f"part 2 (categories) {ph['part2_seconds']:.4f} s",
        f"  rate {ph['rate_edges_per_second'] / 1e9:.3f} GE/s (inputs x edges / (part 1 + part 2))",
        f"  rank time imbalance {rk['imbalance']:.3f} (max/mean over {len(rk['seconds'])} ranks)",
    ]
    events = report.get("rebalance", {}).get("events", [])
    if events:
        lines.append(
            f"  rebalanced {len(events)}x: work imbalance "
            + ", ".join(f"{e['before']:.2f}->{e['after']:.2f}" for e in events[:5])
        )
    check = report.get("check")
    cats = report["categories"]["count"]
    if check is None:
        lines.append(f"  categories {cats} (no truth given: not checked)")
    else:
        lines.append(
            f"  categories {check['found']} found, truth {check['expected']}: {check['status']}"
            + (
                ""
                if check["status"] == "PASS"
                else f" (missing {check['missing']}, extra {check['extra']})"
            )
        )
    return "\n".join(lines)
