"""The stage flow's report sections, built from lists every rank already gathered.

Pure: the stage flow (:mod:`mpisdnn.sdnn.pipeline`) gathers each rank's figures once and
hands the lists here; nothing here communicates or knows of runners and stores.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dedup_section", "pipeline_section", "stage_events"]


def pipeline_section(section, rank_busy, part1, rank_bytes_sent, rank_weight_bytes) -> dict:
    """The report's ``pipeline`` section: ``section`` (the run's shape: ``stages``,
    ``data_groups``, ...) with each rank's stage, busy seconds, bytes sent and weight bytes,
    the busiest rank of each stage and the bubble fraction (the share of the ranks' time
    spent waiting over the ``part1`` seconds of the timed part). Rank ``r`` is stage
    ``r % stages``."""
    stages, groups = section["stages"], section["data_groups"]
    busy = np.array(rank_busy)
    size = busy.size
    return {
        **section,
        "rank_stage": [r % stages for r in range(size)],
        "rank_busy_seconds": busy.tolist(),
        "stage_busy_seconds": busy.reshape(groups, stages).max(axis=0).tolist(),
        "bubble_fraction": float(1.0 - busy.sum() / (size * part1)) if part1 > 0 else 0.0,
        "rank_bytes_sent": [int(b) for b in rank_bytes_sent],
        "rank_weight_bytes": [int(b) for b in rank_weight_bytes],
    }


def stage_events(rank_events) -> list:
    """Every stage's re-balancings in layer order, from each rank's list (one rank per
    stage gives its list, the others an empty one: a stage's peers hold the same)."""
    return sorted((e for part in rank_events for e in part), key=lambda e: e["after_layer"])


def dedup_section(enabled: bool, rank_checks) -> dict:
    """The report's ``dedup`` section: each rank's checks for identical rows
    (``{after_layer: [live rows, distinct rows, seconds]}``) summed by layer, the seconds
    the longest of them (rows merge within a batch only). Give the checks of data group 0
    only, the others empty: a stage's peers agreed on the same sums."""
    merged: dict = {}
    for part in rank_checks:
        for k, (live, distinct, sec) in part.items():
            c = merged.setdefault(int(k), [0, 0, 0.0])
            c[0], c[1], c[2] = c[0] + live, c[1] + distinct, max(c[2], sec)
    return {
        "enabled": bool(enabled),
        "within": "batch",
        "checks": [
            {"after_layer": k, "live_rows": c[0], "distinct_rows": c[1], "seconds": c[2]}
            for k, c in sorted(merged.items())
        ],
    }
