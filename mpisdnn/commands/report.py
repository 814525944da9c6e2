"""``mpisdnn report``: plots from JSON run reports."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="plot JSON run reports")
    p.set_defaults(run=run)


def run(args, comm) -> int:
    from ..errors import UsageError

    raise UsageError("report is not implemented yet")
