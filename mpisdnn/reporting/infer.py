"""The report of one inference run, and its human summary for rank 0's stdout."""

from __future__ import annotations

import hashlib

import numpy as np

from .schema import SCHEMA, communication_line

__all__ = ["infer_report", "infer_summary", "wall_line", "rank_section"]

#: The wall's parts as the summary names them, in its order.
_WALL_NAMES = (("startup", "start-up"), ("setup", "setup"), ("kernels", "kernels"),
               ("load", "load"), ("preparation", "preparation"), ("part1", "part 1"),
               ("part2", "part 2"), ("writing", "writing"), ("other", "other"))  # fmt: skip


def rank_section(comm, streaming=None) -> dict:
    """What every rank adds to the report (collective): its peak RSS and PSS (the
    benchmarks' memory check) and its weight streaming statistics (``None`` where not
    streamed)."""
    from ..parallel import allgather
    from ..system import peak_rss_bytes, pss_bytes

    return {
        "peak_rss_bytes": allgather(comm, peak_rss_bytes()),
        "pss_bytes": allgather(comm, pss_bytes()),
        "rank_streaming": allgather(comm, streaming),
    }


def infer_report(  # noqa: PLR0913 - the report's parts, each from its owner
    result,
    run: dict,
    load_seconds: float,
    check: dict | None,
    neurons: int,
    *,
    ranks: dict | None = None,
    inputs_read: dict | None = None,
    outputs: dict | None = None,
    communication: dict | None = None,
    wall: dict | None = None,
) -> dict:
    """The full JSON report of one inference run, assembled here and nowhere else.

    ``ranks`` (:func:`rank_section`), ``inputs_read`` (a TSV read's statistics),
    ``outputs`` (the files written), ``communication``
    (:func:`~mpisdnn.parallel.communication_section`) and ``wall`` (the wall time's parts)
    are what the command measured besides ``result``; the sections a result carries
    (``pipeline``, ``checkpoint``, ``resumed``) are copied when present, and the categories
    get a digest (runs compare without shipping the vector).
    """
    report = _result_sections(result, run, load_seconds, check, neurons)
    if inputs_read:
        report["phases"]["inputs_read"] = inputs_read
    if wall is not None:
        report["phases"]["wall"] = wall
    if ranks is not None:
        report["ranks"]["peak_rss_bytes"] = ranks["peak_rss_bytes"]
        report["ranks"]["pss_bytes"] = ranks["pss_bytes"]
        report["memory"]["rank_streaming"] = ranks["rank_streaming"]
    if outputs is not None:
        report["memory"]["outputs"] = outputs
    for key in ("pipeline", "checkpoint", "resumed"):
        if getattr(result, key, None) is not None:
            report[key] = getattr(result, key)
    if communication is not None:
        report["communication"] = communication
    report["categories"]["sha1"] = hashlib.sha1(
        np.asarray(result.categories, dtype=np.int64).tobytes()
    ).hexdigest()
    return report


def _result_sections(result, run, load_seconds, check, neurons) -> dict:
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
            # kernels compiled (or loaded) inside parts 1-2: a path the warm-up did not take
            "part_kernel_seconds": float(getattr(result, "timed_kernel_seconds", 0.0)),
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
        "memory": dict(getattr(result, "memory", {}) or {}),
        "dedup": dict(getattr(result, "dedup", {}) or {}),
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
        *_timed_kernels_line(ph),
        f"  rank time imbalance {rk['imbalance']:.3f} (max/mean over {len(rk['seconds'])} ranks)",
    ]
    wall = wall_line(ph.get("wall"))
    if wall:
        lines.append(wall)
    read = ph.get("inputs_read")
    if read:
        lines.append(
            f"  inputs TSV read in parallel: {read['bytes'] / 1e6:.0f} MB in "
            f"{read['seconds']:.2f} s ({read['mb_per_second']:.0f} MB/s)"
        )
    lines.extend(_memory_lines(report))
    lines.extend(_dedup_lines(report))
    comm_line = communication_line(report)
    if comm_line:
        lines.append(comm_line)
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


#: Kernel seconds inside parts 1-2 that the summary points out (a cache load takes ~ms).
TIMED_KERNELS_NOTED = 0.05


def timed_kernels_note(seconds: float) -> str | None:
    """What to say when ``seconds`` of parts 1-2 went to kernel compiling (``None`` below
    :data:`TIMED_KERNELS_NOTED`)."""
    if seconds < TIMED_KERNELS_NOTED:
        return None
    return (
        f"{seconds:.2f} s of parts 1-2 went to compiling kernels the warm-up did not (a path "
        f"it does not take): the rate is low by that; a second run loads them"
    )


def _timed_kernels_line(phases: dict) -> list:
    note = timed_kernels_note(phases.get("part_kernel_seconds", 0.0))
    return [f"  warning: {note}"] if note else []


def _dedup_lines(report: dict) -> list:
    """One line: the first check that left the fewest distinct rows per live row."""
    checks = (report.get("dedup") or {}).get("checks") or []
    if not checks:
        return []
    best = min(
        checks, key=lambda c: (c["distinct_rows"] / max(1, c["live_rows"]), c["after_layer"])
    )
    spent = sum(c["seconds"] for c in checks)
    return [
        f"  {best['live_rows']:,} live rows -> {best['distinct_rows']:,} distinct after layer "
        f"{best['after_layer']} ({len(checks)} checks, {spent:.3f} s)"
    ]


def _memory_lines(report: dict) -> list:
    """Weight blocks, row batches and memory per rank (only what the run recorded)."""
    mem, rk = report.get("memory") or {}, report["ranks"]
    out = []
    blocks = mem.get("blocks") or []
    if len(blocks) > 1:
        line = (
            f"  weights streamed in {len(blocks)} blocks (budget "
            f"{mem['weight_memory_bytes'] / 2**30:.2f} GiB/rank); preparing in the loop "
            f"{mem['prepare_in_loop_seconds']:.2f} s"
        )
        streams = [s for s in mem.get("rank_streaming") or [] if s]
        if streams:
            read = max(s["read_seconds"] for s in streams)
            wait = max(s["wait_seconds"] for s in streams)
            line += f", read {read:.2f} s, waited {wait:.2f} s"
        out.append(line)
    batches = mem.get("rank_max_batches") or []
    if batches and max(batches) > 1:
        size = mem.get("batch_rows")
        # Without --memory-per-rank the parts are the backend's (e.g. as the rows were read).
        each = f" of {size} rows" if size else ""
        out.append(f"  rows in up to {max(batches)} batches{each} per rank")
    rss, pss = rk.get("peak_rss_bytes") or [], [p for p in rk.get("pss_bytes") or [] if p]
    act = mem.get("rank_activation_peak_bytes") or []
    if rss:
        line = f"  peak RSS max {max(rss) / 2**30:.2f} GiB/rank"
        if pss:
            line += f", PSS sum {sum(pss) / 2**30:.2f} GiB"
        if act:
            line += f", activations max {max(act) / 2**30:.2f} GiB/rank"
        out.append(line)
    return out


def wall_line(wall: dict | None) -> str | None:
    """``  wall 3.10 s = start-up 0.52 + setup 0.04 + kernels 0.21 + ...`` (the report's
    ``phases.wall``), with how the kernels came (compiled or loaded from the cache)."""
    if not wall:
        return None
    parts = wall["parts"]
    text = " + ".join(f"{name} {parts[key]:.2f}" for key, name in _WALL_NAMES if key in parts)
    k = wall.get("kernels") or {}
    how = ""
    if k.get("compiled") or k.get("waited"):
        made = k.get("compiled", 0) + k.get("waited", 0)
        how = f" (kernels: {made} compiled in {k['compile_seconds']:.1f} s)"
    elif k.get("loaded"):
        how = f" (kernels: {k['loaded']} loaded from the cache)"
    outside = wall["seconds"] - sum(parts.get(x, 0.0) for x in ("load", "part1", "part2"))
    return (
        f"  wall {wall['seconds']:.2f} s = {text} s{how}; outside load and parts 1-2: "
        f"{outside:.2f} s"
    )
