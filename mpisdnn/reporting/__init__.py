"""Run reports and figures: one library package, no command-line code.

=================  ===========================================================================
:mod:`.schema`     the JSON layout's version, run metadata (:func:`run_info`), atomic writing
:mod:`.infer`      the report of one inference run and its rank-0 summary
:mod:`.pipeline`   the stage flow's sections (``pipeline``, ``dedup``), from gathered lists
:mod:`.load`       reading and validating reports of every kind (``infer``, ``project``)
:mod:`.tables`     scaling rows (speedup, efficiency) and Markdown tables
:mod:`.plots`      figures (matplotlib, imported only when a figure is drawn)
:mod:`.summary`    read + table + figure: what ``mpisdnn report`` runs
=================  ===========================================================================

Projection reports are built by :mod:`mpisdnn.projection.report` with the same schema and
read here like inference reports.
"""

from .infer import infer_report, infer_summary, rank_section
from .load import load_report
from .schema import KINDS, SCHEMA, run_info, versions, write_json
from .summary import summarise_reports
from .tables import format_table, group_key, group_label, project_seconds, scaling_rows

__all__ = [
    "KINDS",
    "SCHEMA",
    "format_table",
    "group_key",
    "group_label",
    "infer_report",
    "infer_summary",
    "load_report",
    "project_seconds",
    "rank_section",
    "run_info",
    "scaling_rows",
    "summarise_reports",
    "versions",
    "write_json",
]
