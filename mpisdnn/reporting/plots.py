"""Figures from JSON run reports, for papers and for reading a run at a glance.

matplotlib is imported only here, only when a figure is asked for, and through
:class:`matplotlib.figure.Figure` (the Agg renderer, no pyplot, no display and no global
backend state), so batch jobs and MPI ranks never need a display.

* one inference run: (a) nnz of Y after each layer with the fill ratio nnz / (inputs x N) on
  the right axis, (b) rows still active, (c) time per layer, (d) layer-loop time per rank
  (load imbalance), like Figure 3 of the GraphBLAST sparse-DNN paper;
* several inference runs: strong scaling, (a) challenge rate against ranks with the ideal
  line, (b) parallel efficiency, (c) where the time goes;
* projection runs: per-rank time and work, or their scaling.
"""

from __future__ import annotations

import math
import os
import statistics

from ..errors import InputError, UsageError
from .tables import group_key, group_label, project_seconds

__all__ = ["plot_reports", "plot_infer_run", "plot_scaling", "plot_project", "plot_challenge"]

#: Okabe-Ito colours: distinguishable with colour-vision deficiency and in grey print.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")

#: Two-column paper width in inches; text stays legible when the figure is shrunk to it.
WIDTH = 7.2

_RC = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.5,
    "lines.markersize": 4,
    "figure.titlesize": 10.5,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.04,
}


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            "plots need matplotlib: pip install 'mpisdnn[plot]' (the table needs nothing)"
        ) from None
    return matplotlib, Figure


def plot_reports(reports, output, title=None, dpi=200) -> str:
    """Draw the figure that fits ``reports`` (validated dicts) and save it to ``output``.

    The format follows the extension (.png, .pdf, .svg). Writing goes through a temporary
    name in the same directory, so a failed plot never leaves a half-written figure.

    Returns
    -------
    str
        The path written.
    """
    ext = os.path.splitext(os.fspath(output))[1].lower().lstrip(".")
    if ext not in ("png", "pdf", "svg"):
        raise UsageError(f"{output}: figure format must be .png, .pdf or .svg")
    matplotlib, _ = _matplotlib()
    kinds = {r["kind"] for r in reports}
    if len(kinds) > 1:
        raise UsageError("cannot mix inference and projection reports in one figure")
    with matplotlib.rc_context(_RC):
        if kinds == {"project"}:
            fig = plot_project(reports, title)
        elif len(reports) == 1:
            fig = plot_infer_run(reports[0], title)
        else:
            fig = plot_scaling(reports, title)
        from ..formats._atomic import atomic_path

        with atomic_path(output) as tmp:
            fig.savefig(tmp, dpi=dpi, format=ext)
    return os.fspath(output)


def _new_figure(rows, cols, height):
    _, Figure = _matplotlib()
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _compact(value: float) -> str:
    """1500 -> 1.5k, 2e6 -> 2M, 0.25 -> 0.25: tick labels without mathtext exponents."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _log_ticks(axis, which="y"):
    """Plain labels on a log axis: every decade, plus 2x and 5x when the range is short."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = axis.yaxis if which == "y" else axis.xaxis
    lo, hi = axis.get_ylim() if which == "y" else axis.get_xlim()
    decades = math.log10(max(hi, 1e-300) / max(lo, 1e-300)) if lo > 0 and hi > 0 else 99
    if decades < 1:
        subs = tuple(float(k) for k in range(1, 10))  # a short range needs every digit
    elif decades < 3:
        subs = (1.0, 2.0, 5.0)
    else:
        subs = (1.0,)
    target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_major_formatter(FuncFormatter(lambda v, _: _compact(v)))
    target.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _legend_below(fig, axis):
    """One legend under the whole figure: long series labels would cover the data."""
    handles, labels = axis.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=1)


def _gev(rate) -> float:
    return rate / 1e9


def _plural(n, word) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _run_title(rep) -> str:
    p, ph = rep["problem"], rep["phases"]
    be = rep.get("backend") or {}
    ranks = rep["run"].get("ranks", "?")
    threads = be.get("threads")
    cores = _plural(ranks, "rank") + (f" × {_plural(threads, 'thread')}" if threads else "")
    check = (rep.get("check") or {}).get("status", "not checked")
    return (
        f"Sparse DNN inference: N={p['neurons']}, L={p['layers']}, {p['inputs']:,} inputs, "
        f"{cores} ({be.get('name', '?')}), {_gev(ph['rate_edges_per_second']):.3g} GE/s, "
        f"{check}"
    )


def plot_infer_run(rep, title=None):
    """Per-layer and per-rank picture of one inference run (2 x 2 panels)."""
    p, layers, ranks = rep["problem"], rep["layers"], rep["ranks"]
    nnz = list(layers.get("nnz") or [])
    active = list(layers.get("active_rows") or [])
    secs = list(layers.get("seconds") or [])
    rank_secs = list(ranks.get("seconds") or [])
    if not nnz or not secs:
        raise InputError(f"{rep['_path']}: no per-layer data to plot (0 layers?)")
    inputs, neurons = int(p["inputs"]), int(p["neurons"])
    y0_nnz = sum(ranks.get("nnz") or []) or None
    fig, ax = _new_figure(2, 2, 5.4)
    (a, b), (c, d) = ax

    # (a) nnz with the fill ratio as a second scale of the same curve (no second line to
    # confuse with the first). Layer 0 is the input Y0 when the report has its nnz.
    xs = list(range(1, len(nnz) + 1))
    if y0_nnz:
        xs, nnz_plot = [0, *xs], [y0_nnz, *nnz]
    else:
        nnz_plot = nnz
    mark = "o" if len(xs) <= 40 else None
    a.plot(xs, [max(v, 0.5) for v in nnz_plot], color=PALETTE[0], marker=mark)
    a.set_yscale("log")
    a.set_xlabel("layer (0 = input)" if y0_nnz else "layer")
    a.set_ylabel("non-zeros of Y")
    a.set_title("(a) Non-zeros after each layer")
    full = max(inputs * neurons, 1)
    sec = a.secondary_yaxis(
        "right", functions=(lambda v: 100.0 * v / full, lambda f: f * full / 100.0)
    )
    sec.set_ylabel("fill ratio nnz / (inputs × N) [%]")
    _log_ticks(a)
    _log_ticks(sec)

    # (b) rows still alive: what pruning saves.
    ax_rows = list(range(1, len(active) + 1))
    b.plot(ax_rows, active, color=PALETTE[2], marker=mark)
    b.axhline(inputs, color="0.4", linestyle="--", linewidth=1)
    # A label on the line instead of a legend box, which would hide part of the curve.
    b.annotate(
        f"all {inputs:,} inputs",
        (1.0, inputs),
        xycoords=("axes fraction", "data"),
        xytext=(-2, 3),
        textcoords="offset points",
        ha="right",
        va="bottom",
        fontsize=8,
        color="0.3",
    )
    b.set_ylim(0, inputs * 1.12 if inputs else 1)
    b.set_xlabel("layer")
    b.set_ylabel("rows with a non-zero")
    b.set_title("(b) Active rows")

    # (c) time per layer (slowest rank), in ms.
    ms = [1e3 * s for s in secs]
    if len(ms) <= 60:
        c.bar(range(1, len(ms) + 1), ms, width=0.85, color=PALETTE[1])
    else:
        # Hundreds of 1-px bars alias into stripes; a filled step curve reads the same.
        c.stairs(ms, [k + 0.5 for k in range(len(ms) + 1)], fill=True, color=PALETTE[1])
        c.set_ylim(bottom=0)
    c.set_xlabel("layer")
    c.set_ylabel("time per layer [ms]")
    part1 = rep["phases"].get("part1_seconds")
    total = f", part 1 = {part1:.3g} s" if part1 is not None else ""
    c.set_title(f"(c) Time per layer (slowest rank{total})")
    c.margins(x=0.01)

    _rank_time_panel(d, ranks, rank_secs)
    for axis in (a, b, c):
        if len(xs) <= 16:
            axis.set_xticks(range(0 if axis is a and y0_nnz else 1, len(nnz) + 1))
    fig.suptitle(title or _run_title(rep))
    return fig


def _rank_time_panel(d, ranks, rank_secs):
    """(d) per-rank layer-loop time against the mean: the imbalance."""
    if rank_secs:
        mean = statistics.fmean(rank_secs)
        d.bar(
            range(len(rank_secs)),
            rank_secs,
            width=0.8 if len(rank_secs) <= 64 else 1.0,
            color=PALETTE[5],
        )
        d.axhline(mean, color="0.2", linestyle="--", linewidth=1, label=f"mean {mean:.3g} s")
        # Headroom above the bars for the legend.
        d.set_ylim(0, 1.2 * max(rank_secs))
        d.legend(loc="upper left", ncols=1)
        imb = ranks.get("imbalance") or (max(rank_secs) / mean if mean > 0 else 1.0)
        d.set_title(f"(d) Time per rank (max/mean = {imb:.3f})")
        if len(rank_secs) <= 16:
            d.set_xticks(range(len(rank_secs)))
    else:
        d.set_title("(d) Time per rank (not in the report)")
    d.set_xlabel("MPI rank")
    d.set_ylabel("layer-loop time [s]")


def _groups(reports):
    """Scaling series: {group label: {ranks: [reports]}} in first-seen order."""

    out = {}
    for rep in reports:
        series = out.setdefault(group_label(group_key(rep)), {})
        series.setdefault(int(rep["run"]["ranks"]), []).append(rep)
    return out


def _rank_axis(axis, ranks):
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_locator(FixedLocator(sorted(ranks)))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.xaxis.set_major_formatter(ScalarFormatter())
    axis.set_xlabel("MPI ranks")
    if len(ranks) == 1:
        (r,) = ranks
        axis.set_xlim(r / 1.5, r * 1.5)


def _ideal_line(axis, ranks, values, color, label=None):
    """The dashed ideal-scaling line of one series."""
    axis.plot(ranks, values, linestyle="--", color=color, alpha=0.6, linewidth=1, label=label)


def _log_scaling_panel(fig, axis, ranks, legend_loc):
    """A measured-against-ideal panel: log y over log2 ranks. The legend goes inside at
    ``legend_loc``, or (``None``: several series with long labels) under the figure."""
    axis.set_yscale("log")
    _rank_axis(axis, ranks)
    _log_ticks(axis)
    if legend_loc is not None:
        axis.legend(loc=legend_loc)
    else:
        _legend_below(fig, axis)


def plot_scaling(reports, title=None):
    """Strong scaling over several inference runs (1 x 3 panels)."""
    groups = _groups(reports)
    all_ranks = sorted({int(r["run"]["ranks"]) for r in reports})
    fig, ax = _new_figure(1, 3, 2.9)
    a, b, c = ax[0]
    all_eff = []
    for i, (label, series) in enumerate(groups.items()):
        color = PALETTE[i % len(PALETTE)]
        ranks = sorted(series)
        # Repeats at one rank count: every run as a dot, the line through the median.
        med = [
            statistics.median(_gev(r["phases"]["rate_edges_per_second"]) for r in series[k])
            for k in ranks
        ]
        for k in ranks:
            pts = [_gev(r["phases"]["rate_edges_per_second"]) for r in series[k]]
            if len(pts) > 1:
                a.plot([k] * len(pts), pts, ".", color=color, alpha=0.5)
        a.plot(ranks, med, marker="o", color=color, label=label if len(groups) > 1 else "measured")
        base_r, base = ranks[0], med[0]
        ideal = [base * k / base_r for k in ranks]
        _ideal_line(a, ranks, ideal, color, "ideal (linear)" if i == 0 else None)
        eff = [100.0 * m / (base * k / base_r) for m, k in zip(med, ranks)]
        all_eff += eff
        b.plot(ranks, eff, marker="o", color=color)
    _log_scaling_panel(fig, a, all_ranks, "upper left" if len(groups) == 1 else None)
    a.set_ylabel("rate [GE/s]  (inputs × edges / s)")
    a.set_title("(a) Challenge rate")
    _rank_axis(b, all_ranks)
    b.axhline(100, color="0.4", linestyle="--", linewidth=1)
    b.set_ylim(0, max([110.0] + [1.08 * e for e in all_eff]))
    b.set_ylabel("parallel efficiency [%]")
    b.set_title("(b) Efficiency vs fewest ranks")

    # (c) where the time goes, for the first series (the others are usually backends).
    label, series = next(iter(groups.items()))
    ranks = sorted(series)
    phases = (
        ("load_seconds", "load", "0.65"),
        ("part1_seconds", "part 1 (layers)", PALETTE[0]),
        ("part2_seconds", "part 2 (categories)", PALETTE[4]),
    )
    pos = range(len(ranks))
    bottom = [0.0] * len(ranks)
    for key, name, color in phases:
        vals = [statistics.median(r["phases"].get(key) or 0.0 for r in series[k]) for k in ranks]
        c.bar(
            pos,
            vals,
            bottom=bottom,
            width=0.65,
            color=color,
            label=name,
            alpha=0.55 if key == "load_seconds" else 1.0,
        )
        bottom = [x + v for x, v in zip(bottom, vals)]
    c.set_xticks(list(pos), [str(k) for k in ranks])
    c.set_xlabel("MPI ranks")
    c.set_ylabel("time [s]")
    c.set_title("(c) Time per phase" + (" (blue curve)" if len(groups) > 1 else ""))
    # Headroom above the tallest bar so the legend never covers a bar.
    c.set_ylim(0, 1.45 * max(bottom + [1e-9]))
    c.legend(loc="upper right")
    c.grid(axis="x", visible=False)
    if title is None:
        first = reports[0]
        p = first["problem"]
        title = f"Strong scaling, sparse DNN inference: N={p['neurons']}, L={p['layers']}, "
        title += f"{p['inputs']:,} inputs"
        if len(groups) == 1:
            be = first.get("backend") or {}
            threads = be.get("threads")
            title += f", {be.get('name', '?')}"
            title += f", {_plural(threads, 'thread')} per rank" if threads else ""
    fig.suptitle(title)
    return fig


def _per_rank_lists(rep) -> dict:
    """Numeric per-rank lists of a report's ``ranks`` section (one entry per rank)."""
    n = int(rep["run"].get("ranks", 0) or 0)
    out = {}
    for key, value in (rep.get("ranks") or {}).items():
        if (
            isinstance(value, list)
            and len(value) == n
            and n > 0
            and all(isinstance(v, (int, float)) for v in value)
        ):
            out[key] = value
    return out


#: Titles and axis labels of the per-rank lists projection reports carry.
_RANK_FIELDS = {
    "seconds": ("Time", "time [s]"),
    "compute_seconds": ("Compute time", "compute time [s]"),
    "write_seconds": ("Write time", "write time [s]"),
    "work": ("Work", "work [flops]"),
    "flops": ("Work", "work [flops]"),
    "nnz": ("Entries of H", "entries of H"),
    "peak_rss_bytes": ("Peak memory", "peak RSS [bytes]"),
    "rows": ("Rows", "rows"),
    "chunks": ("Output chunks", "chunks"),
}


def _name(key: str) -> str:
    """Panel title of a per-rank list: ``compute_seconds`` -> ``Compute time``."""
    if key in _RANK_FIELDS:
        return _RANK_FIELDS[key][0]
    for suffix in ("_seconds", "_bytes"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    text = key.replace("_", " ")
    return text[:1].upper() + text[1:]


def _pretty(key: str) -> str:
    """Axis label with unit: ``write_seconds`` -> ``write [s]``."""
    if key in _RANK_FIELDS:
        return _RANK_FIELDS[key][1]
    if key.endswith("_seconds"):
        return key[: -len("_seconds")].replace("_", " ") + " [s]"
    if key.endswith("_bytes"):
        return key[: -len("_bytes")].replace("_", " ") + " [bytes]"
    return key.replace("_", " ")


def project_description(rep) -> str:
    """``H = AᵀA (count) of rmat.h5: 1,024 × 1,024, 12,038 edges``, from what the report has."""
    problem = rep.get("problem") or {}
    options = rep.get("options") or {}
    onto = options.get("onto", problem.get("onto"))
    weight = options.get("weight", problem.get("weight"))
    text = {"cols": "H = AᵀA", "rows": "H = AAᵀ"}.get(onto, "H")
    if weight:
        text += f" ({weight})"
    source = problem.get("input") or rep["run"].get("input")
    if source:
        text += f" of {os.path.basename(str(source))}"
    rows, cols, nnz = problem.get("rows"), problem.get("cols"), problem.get("nnz")
    if isinstance(rows, int) and isinstance(cols, int):
        text += f": {rows:,} × {cols:,}"
        if isinstance(nnz, int):
            text += f", {nnz:,} edges"
    return text


def plot_project(reports, title=None):
    """Projection runs: per-rank bars for one run, time and speedup against ranks for several."""
    if len(reports) > 1:
        return _plot_project_scaling(reports, title)
    rep = reports[0]
    lists = _per_rank_lists(rep)
    if not lists:
        raise InputError(
            f"{rep['_path']}: projection report has no per-rank data to plot (expected lists "
            f'with one number per rank under "ranks"); the table above has its totals'
        )
    # Time first, then the work that explains it, then memory; whatever else after.
    order = ("seconds", "compute_seconds", "work", "flops", "nnz", "peak_rss_bytes", "rows")
    keys = sorted(lists, key=lambda k: (order.index(k) if k in order else len(order), k))[:4]
    cols = len(keys) if len(keys) <= 2 else 2
    rows = 1 if len(keys) <= 2 else 2
    fig, ax = _new_figure(rows, cols, 2.9 * rows)
    flat = [x for row in ax for x in row]
    bound = (rep.get("memory") or {}).get("bound_per_rank_bytes")
    from matplotlib.ticker import FuncFormatter

    for i, (axis, key) in enumerate(zip(flat, keys)):
        vals = lists[key]
        axis.bar(
            range(len(vals)),
            vals,
            width=0.8 if len(vals) <= 64 else 1.0,
            color=PALETTE[i % len(PALETTE)],
        )
        mean = statistics.fmean(vals)
        unit = " s" if key.endswith("seconds") else ("B" if key.endswith("_bytes") else "")
        axis.axhline(
            mean, color="0.2", linestyle="--", linewidth=1, label=f"mean {_compact(mean)}{unit}"
        )
        imb = max(vals) / mean if mean > 0 else 1.0
        if key == "peak_rss_bytes" and isinstance(bound, (int, float)) and bound > 0:
            # The budget is usually far above the bars: name it rather than draw it.
            axis.plot([], [], " ", label=f"budget {_compact(bound)}B (--memory-per-rank)")
        axis.set_title(f"({chr(97 + i)}) {_name(key)} per rank (max/mean {imb:.3f})")
        axis.set_xlabel("MPI rank")
        axis.set_ylabel(_pretty(key))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _compact(v)))
        # Headroom above the bars for the legend (one more line for the budget).
        lines = len(axis.get_legend_handles_labels()[1])
        axis.set_ylim(0, (1.1 + 0.12 * lines) * max(max(vals), 1e-12))
        axis.legend(loc="upper left")
        if len(vals) <= 16:
            axis.set_xticks(range(len(vals)))
    for axis in flat[len(keys) :]:
        axis.set_visible(False)
    ranks = rep["run"].get("ranks")
    fig.suptitle(title or f"Graph projection {project_description(rep)}, {_plural(ranks, 'rank')}")
    return fig


def _plot_project_scaling(reports, title):

    for rep in reports:
        if project_seconds(rep) is None:
            raise InputError(f"{rep['_path']}: projection report has no phase times to plot")
    groups = {}
    for rep in reports:
        groups.setdefault(group_key(rep), []).append(rep)
    fig, ax = _new_figure(1, 2, 2.9)
    a, b = ax[0]
    all_ranks = sorted({int(r["run"]["ranks"]) for r in reports})
    for i, members in enumerate(groups.values()):
        color = PALETTE[i % len(PALETTE)]
        by_ranks = {}
        for rep in members:
            by_ranks.setdefault(int(rep["run"]["ranks"]), []).append(project_seconds(rep))
        ranks = sorted(by_ranks)
        times = [statistics.median(by_ranks[k]) for k in ranks]
        label = project_description(members[0]) if len(groups) > 1 else "measured"
        a.plot(ranks, times, marker="o", color=color, label=label)
        ideal = [times[0] * ranks[0] / k for k in ranks]
        _ideal_line(a, ranks, ideal, color, "ideal" if i == 0 else None)
        b.plot(ranks, [times[0] / t for t in times], marker="o", color=color)
        _ideal_line(b, ranks, [k / ranks[0] for k in ranks], color)
    _log_scaling_panel(fig, a, all_ranks, "upper right" if len(groups) == 1 else None)
    a.set_ylabel("time [s]")
    a.set_title("(a) Projection time")
    _rank_axis(b, all_ranks)
    b.set_ylabel("speedup over fewest ranks")
    b.set_title("(b) Speedup (dashed: ideal)")
    if title is None:
        title = "Strong scaling, graph projection"
        if len(groups) == 1:
            title += f" {project_description(reports[0])}"
    fig.suptitle(title)
    return fig


def plot_challenge(rows: list, path, dpi: int = 150) -> str | None:
    """Edges/s per configuration on a log scale, the published rates as markers beside each
    bar (``mpisdnn challenge``'s figure); ``None`` when no configuration ran or matplotlib
    is missing."""
    from ..formats._atomic import atomic_path
    from .published import ENTRIES, published_rates

    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    ok = [r for r in rows if r["status"] in ("PASS", "FAIL")]
    if not ok:
        return None
    fig = Figure(figsize=(max(6.0, 0.75 * len(ok) + 2.5), 4.2))
    ax = fig.add_subplot()
    x = list(range(len(ok)))
    ax.bar(x, [r["rate"] for r in ok], 0.55, color="#0072B2",
           label="mpisdnn, part 1 + 2 (this machine)")  # fmt: skip
    markers = {"2020 champion": ("v", "#D55E00"), "XY-2021": ("s", "#009E73"),
               "SNICIT": ("^", "#CC79A7")}  # fmt: skip
    for who in ENTRIES:
        xs = [i for i, r in enumerate(ok) if published_rates(r["n"], r["l"])[who]]
        ys = [published_rates(ok[i]["n"], ok[i]["l"])[who] * 1e12 for i in xs]
        if xs:
            m, c = markers[who]
            ax.plot(xs, ys, m, color=c, linestyle="none", label=f"{who} (published, GPU)")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['n']}\n×{r['l']}" for r in ok], fontsize=8)
    ax.set_ylabel("edges / s (inputs × edges / time)")
    counts = sorted({r["rows"] for r in ok})
    inputs = ", ".join(f"{c:,}" for c in counts)
    ax.set_title(f"Graph Challenge configurations, {inputs} inputs", loc="left", fontsize=10)
    ax.legend(fontsize=7, loc="best", frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=os.path.splitext(os.fspath(path))[1].lstrip(".") or "png")
    return os.fspath(path)
