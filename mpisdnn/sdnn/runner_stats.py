"""What a :class:`~mpisdnn.sdnn.runner.SliceRunner` measured, read-only, and its report
statistics (split from :mod:`mpisdnn.sdnn.runner`, which re-exports :class:`RunnerStats`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parallel import allgather, allreduce
from . import rebalance as rb

__all__ = ["RunnerStats"]


@dataclass(frozen=True)
class RunnerStats:
    """What a :class:`SliceRunner` measured (:meth:`SliceRunner.stats`), read-only: the
    per-layer arrays are copies that cannot be written.

    ``l_nnz``, ``l_active``, ``l_work``, ``l_sec``: this rank's non-zeros, active rows,
    work and seconds per global layer (summed over batches); ``groups``: the layer groups
    run; ``events``: the re-balancings; the rest tells how weights and rows were bounded.
    """

    l_nnz: np.ndarray
    l_active: np.ndarray
    l_work: np.ndarray
    l_sec: np.ndarray
    groups: tuple
    events: tuple
    threshold: float
    t_local: float
    weight_memory: int
    weight_bytes_estimate: int
    blocks: tuple
    prepare_first: float
    prepare_loop: float
    memory_per_rank: int | None
    batch_rows: int | None
    max_batches: int
    act_peak: int

    def __post_init__(self):
        for name in ("l_nnz", "l_active", "l_work", "l_sec"):
            arr = np.array(getattr(self, name))  # a copy: the runner goes on adding
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    def memory_statistics(self, comm) -> dict:
        """How weights and activations were bounded on this run (collective over ``comm``)."""
        return {
            "weight_memory_bytes": self.weight_memory,
            "weight_bytes_estimate": self.weight_bytes_estimate,
            "blocks": [list(b) for b in self.blocks],
            "prepare_first_seconds": self.prepare_first,
            "prepare_in_loop_seconds": allreduce(comm, self.prepare_loop, "max"),
            "memory_per_rank_bytes": self.memory_per_rank,
            "batch_rows": self.batch_rows,
            "rank_max_batches": allgather(comm, self.max_batches),
            "rank_activation_peak_bytes": allgather(comm, self.act_peak),
        }

    def statistics(self, comm) -> dict:
        """Per-layer and per-rank statistics, identical on every rank (collective over
        ``comm``, the ranks that ran these layers together)."""
        nlayers = self.l_nnz.size
        g_nnz = allreduce(comm, self.l_nnz, "sum")
        g_act = allreduce(comm, self.l_active, "sum")
        g_sec = allreduce(comm, self.l_sec, "max")
        works = np.array(allgather(comm, self.l_work)).reshape(comm.size, nlayers)
        return {
            "layer_nnz": g_nnz.tolist(),
            "layer_active_rows": g_act.tolist(),
            "layer_seconds": g_sec.tolist(),
            "rank_seconds": allgather(comm, self.t_local),
            "groups": [list(g) for g in self.groups],
            "layer_imbalance": [rb.imbalance(works[:, i]) for i in range(nlayers)],
            "rebalances": [dict(e) for e in self.events],
        }
