"""``mpisdnn project``: graph projection H = A^T A or A A^T (see mpisdnn.projection)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("project", help="graph projection H = A^T A (or A A^T)")
    p.set_defaults(run=run)


def run(args, comm) -> int:
    from ..errors import UsageError

    raise UsageError("project is not implemented yet")
