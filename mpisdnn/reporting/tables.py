"""Summary tables of run reports: scaling rows (speedup, efficiency) and Markdown tables.

Runs belong to one scaling curve when :func:`group_key` matches: the same problem, backend
and threads per rank (inference), or the same input, projection options and threads
(projection). Inference speedup is the ratio of challenge rates, projection speedup the
ratio of total times.
"""

from __future__ import annotations

import json
import os

__all__ = ["group_key", "group_label", "project_seconds", "scaling_rows", "format_table"]


def _threads(rep) -> int | None:
    return (rep.get("backend") or {}).get("threads") or rep.get("threads_per_rank")


def group_key(rep) -> tuple:
    """Runs that belong on one scaling curve: same problem, backend and threads per rank."""
    if rep["kind"] == "infer":
        p = rep["problem"]
        return (
            "infer",
            p.get("neurons"),
            p.get("layers"),
            p.get("inputs"),
            (rep.get("backend") or {}).get("name"),
            _threads(rep),
        )
    # Same input, same projection (onto, weighting, ...) and threads per rank: one curve.
    # The memory budget is not part of the problem (its default depends on the rank count).
    options = {k: v for k, v in (rep.get("options") or {}).items() if k not in ("memory_per_rank",)}
    return (
        "project",
        json.dumps(rep.get("problem"), sort_keys=True, default=str),
        json.dumps(options, sort_keys=True, default=str),
        rep.get("threads_per_rank"),
    )


def group_label(key) -> str:
    """The legend text of a :func:`group_key` (``N=1024, L=120, 60000 inputs, cpu``)."""
    if key[0] == "infer":
        _, n, layers, inputs, backend, threads = key
        t = f", {threads} thr/rank" if threads else ""
        return f"N={n}, L={layers}, {inputs} inputs, {backend}{t}"
    return "projection"  # plots label projection series from the reports themselves


def project_seconds(rep) -> float | None:
    """Total time of a projection run: ``phases.total_seconds`` or the sum of the phases."""
    phases = rep.get("phases") or {}
    if isinstance(phases.get("total_seconds"), (int, float)):
        return float(phases["total_seconds"])
    parts = [v for k, v in phases.items() if k.endswith("_seconds") and isinstance(v, (int, float))]
    return float(sum(parts)) if parts else None


def scaling_rows(reports) -> list[dict]:
    """One row per report with speedup and efficiency against the group's fewest-rank run.

    Inference speedup is the ratio of challenge rates; projection speedup the ratio of total
    times. Rows are ordered by group, then ranks.
    """
    rows = []
    for rep in reports:
        ranks = int(rep["run"].get("ranks", 0) or 0)
        row = {
            "file": os.path.basename(rep["_path"]),
            "kind": rep["kind"],
            "group": group_key(rep),
            "ranks": ranks,
            "threads": _threads(rep),
            "status": (rep.get("check") or {}).get("status", "-"),
        }
        if rep["kind"] == "infer":
            ph = rep["phases"]
            row.update(
                backend=(rep.get("backend") or {}).get("name", "?"),
                load=ph.get("load_seconds"),
                part1=ph.get("part1_seconds"),
                part2=ph.get("part2_seconds"),
                rate=ph.get("rate_edges_per_second"),
                imbalance=rep["ranks"].get("imbalance"),
            )
            row["perf"] = row["rate"]
        else:
            row["seconds"] = project_seconds(rep)
            row["perf"] = 1.0 / row["seconds"] if row["seconds"] else None
        rows.append(row)
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    for members in groups.values():
        base = min(members, key=lambda r: r["ranks"])
        for row in members:
            if row["perf"] and base["perf"] and base["ranks"]:
                row["speedup"] = row["perf"] / base["perf"]
                row["efficiency"] = row["speedup"] * base["ranks"] / row["ranks"]
            else:
                row["speedup"] = row["efficiency"] = None
    order = {key: i for i, key in enumerate(groups)}
    rows.sort(key=lambda r: (order[r["group"]], r["ranks"]))
    return rows


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _infer_cells(r) -> list:
    return [
        r["file"], r["ranks"], _fmt(r["threads"], "d"), r["backend"], _fmt(r["load"], ".3f"),
        _fmt(r["part1"], ".3f"), _fmt(r["part2"], ".4f"),
        _fmt(r["rate"] and r["rate"] / 1e9, ".3f"), _fmt(r["speedup"], ".2f"),
        _pct(r["efficiency"]), _fmt(r["imbalance"], ".3f"), r["status"],
    ]  # fmt: skip


def _project_cells(r) -> list:
    return [
        r["file"], r["ranks"], _fmt(r["threads"], "d"), _fmt(r["seconds"], ".3f"),
        _fmt(r["speedup"], ".2f"), _pct(r["efficiency"]),
    ]  # fmt: skip


#: One table per report kind, in this order: (kind, header line, cells of a row).
_TABLES = (
    (
        "infer",
        "| report | ranks | threads | backend | load s | part 1 s | part 2 s | rate GE/s "
        "| speedup | efficiency | imbalance | check |",
        _infer_cells,
    ),
    ("project", "| report | ranks | threads | time s | speedup | efficiency |", _project_cells),
)


def format_table(rows) -> str:
    """A Markdown pipe table (readable as plain text in a batch log)."""
    lines = []
    for kind, head, cells in _TABLES:
        chosen = [r for r in rows if r["kind"] == kind]
        if not chosen:
            continue
        if lines:
            lines.append("")
        lines += [head, _rule(head)]
        lines += ["| " + " | ".join(map(str, cells(r))) + " |" for r in chosen]
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _rule(head: str) -> str:
    return "|" + "---|" * (head.count("|") - 1)
