"""``mpisdnn report``: summary tables and plots from JSON run reports.

One inference report gives the per-layer picture (nnz and fill ratio, active rows, time per
layer, time per rank); several give a strong-scaling figure (rate against ranks with the
ideal line, parallel efficiency, time breakdown). Projection reports give their per-rank
work and time. Every file is validated first: a file that is not JSON, not an mpisdnn report
or from a newer schema is named in one error line (exit 2).
"""

from __future__ import annotations

import json
import os

from ..errors import InputError, UsageError
from ..parallel import agree_root, log

__all__ = ["add_parser", "run", "load_report", "scaling_rows", "format_table"]

#: Report kinds this command understands.
KINDS = ("infer", "project")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="summary table and plots from JSON run reports",
        description="Summarise JSON run reports (from --report) as a table and, with -o, a "
        "figure: one inference run gives per-layer nnz / fill ratio, active rows, time per "
        "layer and time per rank; several runs of one problem give a strong-scaling plot.",
    )
    p.add_argument("reports", nargs="+", metavar="RUN.json", help="JSON reports to summarise")
    p.add_argument(
        "-o",
        "--output",
        metavar="FIG",
        help="write a figure (.png, .pdf or .svg; needs matplotlib)",
    )
    p.add_argument("--table", metavar="FILE", help="also write the summary table (Markdown)")
    p.add_argument("--title", help="figure title (default: derived from the reports)")
    p.add_argument("--dpi", type=int, default=200, help="PNG resolution (default 200)")
    p.set_defaults(run=run)


def load_report(path) -> dict:
    """Read and validate one JSON report.

    Raises
    ------
    InputError
        The file is missing, not JSON, not an mpisdnn report, of an unknown kind, written by
        a newer schema, or lacks a section the plots need. The message names the file.
    """
    from ..report import SCHEMA

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise InputError(f"{path}: report not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a JSON report ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    schema = obj.get("schema") if isinstance(obj, dict) else None
    name, _, version = str(schema).partition("/")
    if not isinstance(schema, str) or name != SCHEMA.split("/")[0]:
        raise InputError(
            f'{path}: not an mpisdnn run report (no "schema": "{SCHEMA}"; write one with '
            f"mpisdnn infer --report)"
        )
    ours = int(SCHEMA.split("/")[1])
    if not version.isdigit() or int(version) > ours:
        raise InputError(
            f"{path}: report schema {schema!r} is newer than this mpisdnn reads ({SCHEMA}); "
            f"upgrade mpisdnn"
        )
    kind = obj.get("kind")
    if kind not in KINDS:
        raise InputError(f"{path}: unknown report kind {kind!r} (expected one of {KINDS})")
    needed = ("run", "problem", "phases", "layers", "ranks") if kind == "infer" else ("run",)
    missing = [key for key in needed if not isinstance(obj.get(key), dict)]
    if missing:
        raise InputError(f"{path}: {kind} report lacks section(s) {', '.join(missing)}")
    obj["_path"] = path
    return obj


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


def format_table(rows) -> str:
    """A Markdown pipe table (readable as plain text in a batch log)."""
    infer = [r for r in rows if r["kind"] == "infer"]
    lines = []
    if infer:
        head = (
            "| report | ranks | threads | backend | load s | part 1 s | part 2 s | rate GE/s "
            "| speedup | efficiency | imbalance | check |"
        )
        lines += [head, _rule(head)]
        for r in infer:
            lines.append(
                f"| {r['file']} | {r['ranks']} | {_fmt(r['threads'], 'd')} | {r['backend']} "
                f"| {_fmt(r['load'], '.3f')} | {_fmt(r['part1'], '.3f')} "
                f"| {_fmt(r['part2'], '.4f')} | {_fmt(r['rate'] and r['rate'] / 1e9, '.3f')} "
                f"| {_fmt(r['speedup'], '.2f')} | {_pct(r['efficiency'])} "
                f"| {_fmt(r['imbalance'], '.3f')} | {r['status']} |"
            )
    proj = [r for r in rows if r["kind"] == "project"]
    if proj:
        if lines:
            lines.append("")
        head = "| report | ranks | threads | time s | speedup | efficiency |"
        lines += [head, _rule(head)]
        for r in proj:
            lines.append(
                f"| {r['file']} | {r['ranks']} | {_fmt(r['threads'], 'd')} "
                f"| {_fmt(r['seconds'], '.3f')} "
                f"| {_fmt(r['speedup'], '.2f')} "
                f"| {_pct(r['efficiency'])} |"
            )
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _rule(head: str) -> str:
    return "|" + "---|" * (head.count("|") - 1)


def run(args, comm) -> int:
    def work():
        if args.dpi < 50 or args.dpi > 1200:
            raise UsageError(f"--dpi {args.dpi}: expected 50..1200")
        reports = [load_report(p) for p in args.reports]
        kinds = {r["kind"] for r in reports}
        if len(kinds) > 1:
            raise UsageError("cannot mix inference and projection reports in one summary")
        table = format_table(scaling_rows(reports))
        if args.table:
            from ..formats._atomic import atomic_path

            with atomic_path(args.table) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                fh.write(table + "\n")
        written = None
        if args.output:
            from .. import plots

            written = plots.plot_reports(reports, args.output, title=args.title, dpi=args.dpi)
        return table, written

    # Reading a few JSON files and drawing is rank 0's job; errors are still reported once.
    table, written = agree_root(comm, work)
    log(comm, table)
    if written:
        log(comm, f"wrote {written}")
    return 0
