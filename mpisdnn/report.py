"""Compatibility name for :mod:`mpisdnn.reporting` (kept while modules outside it import it).

New code imports :mod:`mpisdnn.reporting`.
"""

from .reporting import SCHEMA, infer_report, infer_summary, run_info, versions, write_json

__all__ = ["SCHEMA", "run_info", "versions", "write_json", "infer_report", "infer_summary"]
