"""``mpisdnn report``: summary tables and plots from JSON run reports.

One inference report gives the per-layer picture (nnz and fill ratio, active rows, time per
layer, time per rank); several give a strong-scaling figure (rate against ranks with the
ideal line, parallel efficiency, time breakdown). Projection reports give their per-rank
work and time. Every file is validated first: a file that is not JSON, not an mpisdnn report
or from a newer schema is named in one error line (exit 2). The work is done by
:mod:`mpisdnn.reporting`; this module only parses arguments.
"""

from __future__ import annotations

from ..parallel import agree_root, log
from ._common import _needs, add_needs

#: PNG resolution when --dpi is not given.
DEFAULT_DPI = 200

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Summarise JSON run reports (from --report) as a table and, with -o, a "
    "figure: one inference run gives per-layer nnz / fill ratio, active rows, time per "
    "layer and time per rank; several runs of one problem give a strong-scaling plot."
)


def add_arguments(p) -> None:
    p.add_argument("reports", nargs="+", metavar="RUN.json", help="JSON reports to summarise")
    p.add_argument(
        "-o",
        "--output",
        metavar="FIG",
        help="write a figure (.png, .pdf or .svg; needs matplotlib)",
    )
    p.add_argument("--table", metavar="FILE", help="also write the summary table (Markdown)")
    p.add_argument("--title", help="figure title (default: derived from the reports)")
    p.add_argument("--dpi", type=int, default=DEFAULT_DPI,
                   help=f"PNG resolution (default {DEFAULT_DPI})")  # fmt: skip
    p.set_defaults(run=run)
    figure = "-o FIG (they shape the figure)"
    add_needs(p, (
        _needs("--title", "title", figure, lambda a: a.output is not None,
               example=("--title", "T")),
        _needs("--dpi", "dpi", figure, lambda a: a.output is not None,
               given=lambda v: v != DEFAULT_DPI, example=("--dpi", "100")),
    ))  # fmt: skip


def run(args, comm) -> int:
    from ..paths import check_paths
    from ..reporting import summarise_reports

    def work():
        inputs = {f"RUN.json #{k + 1}": path for k, path in enumerate(args.reports)}
        check_paths(inputs, {"-o": args.output, "--table": args.table})
        return summarise_reports(
            args.reports, table=args.table, figure=args.output, title=args.title, dpi=args.dpi
        )

    # Reading a few JSON files and drawing is rank 0's job; errors are still reported once.
    table, written = agree_root(comm, work)
    log(comm, table)
    if written:
        log(comm, f"wrote {written}")
    return 0
