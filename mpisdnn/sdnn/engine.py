"""The inference loop shared by every backend: layers, dead-row pruning, categories."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import backends
from ..parallel import allgather_array, get_comm

__all__ = ["InferenceResult", "infer", "check_categories"]


@dataclass
class InferenceResult:
    """What :func:`infer` returns on every rank.

    ``categories`` (1-based, global) and all statistics are identical on every rank;
    ``y_local`` is this rank's block of the final activations, rows
    ``[row_offset, row_offset + y_local.shape[0])`` of the global Y.
    """

    categories: np.ndarray
    y_local: sp.csr_matrix
    row_offset: int
    g_rows: int
    layers: int
    edges: int
    part1: float
    part2: float
    layer_nnz: list = field(default_factory=list)
    layer_active_rows: list = field(default_factory=list)
    layer_seconds: list = field(default_factory=list)
    rank_seconds: list = field(default_factory=list)
    rank_rows: list = field(default_factory=list)
    rank_nnz: list = field(default_factory=list)
    backend: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Challenge rate: inputs x DNN edges / (part 1 + part 2), in edges per second."""
        total = self.part1 + self.part2
        return self.g_rows * self.edges / total if total > 0 else float("inf")

    @property
    def imbalance(self) -> float:
        """max / mean of the per-rank layer-loop times (1.0 is perfect)."""
        t = np.asarray(self.rank_seconds, dtype=float)
        return float(t.max() / t.mean()) if t.size and t.mean() > 0 else 1.0


def infer(
    network,
    y_local,
    comm=None,
    row_offset=0,
    g_rows=None,
    backend="cpu",
    backend_options=None,
    prune=True,
    progress=None,
):
    """Run every layer of ``network`` on this rank's rows and gather the categories.

    Parameters
    ----------
    network : Network
        All layers (every rank holds the whole network).
    y_local : scipy.sparse matrix
        This rank's contiguous row block of Y0.
    comm : mpi4py communicator, optional
        Default ``MPI.COMM_WORLD``.
    row_offset : int
        Global index of ``y_local``'s first row.
    g_rows : int, optional
        Global number of inputs (default: sum of local rows).
    backend : str or Backend
        ``cpu`` (fused numba), ``reference`` (plain scipy) or ``gpu`` (CuPy).
    prune : bool
        Drop rows that became empty from the working set. Exact: an empty row stays empty
        because the bias is only added where ``Y W`` is non-zero.
    progress : callable, optional
        ``progress(layer, layers, active_rows, seconds_so_far)`` called on every rank after
        each layer (the CLI's reporter prints on rank 0 only).

    Returns
    -------
    InferenceResult
    """
    comm = get_comm(comm)
    options = dict(backend_options or {})
    be = backends.get(backend, rank=comm.rank, **options) if isinstance(backend, str) else backend
    y_host = sp.csr_matrix(y_local, dtype=np.float32)
    l_rows = y_host.shape[0]
    if g_rows is None:
        g_rows = comm.allreduce(l_rows)
    weights = be.prepare_network(network)
    bias = network.bias
    nlayers = len(weights)

    if nlayers:
        be.warmup(weights[0], bias[0], network.ymax)
    y = be.to_device(y_host)
    active = np.arange(l_rows, dtype=np.int64)  # local ids of the rows still in ``y``
    l_nnz = np.zeros(nlayers, dtype=np.int64)
    l_active = np.zeros(nlayers, dtype=np.int64)
    l_sec = np.zeros(nlayers, dtype=np.float64)

    comm.Barrier()
    t_start = time.perf_counter()
    for k in range(nlayers):
        t0 = time.perf_counter()
        if active.size:
            y = be.layer(y, weights[k], bias[k], network.ymax)
            counts = be.row_nnz(y)
            if prune:
                alive = counts > 0
                n_alive = int(alive.sum())
                # Compacting costs a copy; only worth it once a good share of rows died.
                if n_alive < active.size and (n_alive == 0 or 10 * n_alive < 9 * active.size):
                    keep = np.flatnonzero(alive)
                    y = be.take_rows(y, keep)
                    active = active[keep]
                    counts = counts[keep]
            l_nnz[k] = int(counts.sum())
            l_active[k] = int((counts > 0).sum())
        be.synchronize()
        l_sec[k] = time.perf_counter() - t0
        if progress is not None:
            progress(k + 1, nlayers, int(l_active[k]), time.perf_counter() - t_start)
    t_local = time.perf_counter() - t_start
    comm.Barrier()
    part1 = time.perf_counter() - t_start

    t1 = time.perf_counter()
    y_final = be.to_host(y)
    sums = np.asarray(y_final.sum(axis=1)).ravel() if y_final.shape[0] else np.zeros(0)
    local_cats = active[sums != 0] + row_offset + 1
    categories = np.sort(allgather_array(comm, local_cats.astype(np.int64)))
    part2 = time.perf_counter() - t1
    # Both phases end on a collective, so the slowest rank defines them; agree on one number.
    part1, part2 = comm.allreduce(part1, op=_max()), comm.allreduce(part2, op=_max())

    g_nnz = np.zeros_like(l_nnz)
    g_act = np.zeros_like(l_active)
    g_sec = np.zeros_like(l_sec)
    comm.Allreduce(l_nnz, g_nnz, op=_sum())
    comm.Allreduce(l_active, g_act, op=_sum())
    comm.Allreduce(l_sec, g_sec, op=_max())
    y_out = _expand(y_final, active, l_rows)
    return InferenceResult(
        categories=categories,
        y_local=y_out,
        row_offset=int(row_offset),
        g_rows=int(g_rows),
        layers=nlayers,
        edges=int(network.edges),
        part1=float(part1),
        part2=float(part2),
        layer_nnz=g_nnz.tolist(),
        layer_active_rows=g_act.tolist(),
        layer_seconds=g_sec.tolist(),
        rank_seconds=comm.allgather(float(t_local)),
        rank_rows=comm.allgather(int(l_rows)),
        rank_nnz=comm.allgather(int(y_host.nnz)),
        backend=be.describe(),
    )


def _expand(y, active, l_rows):
    """Put the surviving rows back at their local positions (pruned rows are empty)."""
    y = sp.csr_matrix(y)
    if y.shape[0] == l_rows:
        return y
    lens = np.zeros(l_rows, dtype=np.int64)
    lens[active] = np.diff(y.indptr)
    indptr = np.concatenate(([0], np.cumsum(lens)))
    return sp.csr_matrix((y.data, y.indices, indptr), shape=(l_rows, y.shape[1]))


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _sum():
    from mpi4py import MPI

    return MPI.SUM


def check_categories(found, truth) -> dict:
    """Compare found categories with the truth; ``status`` is ``PASS`` or ``FAIL``."""
    found = np.unique(np.asarray(found, dtype=np.int64))
    truth = np.unique(np.asarray(truth, dtype=np.int64))
    missing = np.setdiff1d(truth, found)
    extra = np.setdiff1d(found, truth)
    return {
        "status": "PASS" if missing.size == 0 and extra.size == 0 else "FAIL",
        "expected": int(truth.size),
        "found": int(found.size),
        "missing": int(missing.size),
        "extra": int(extra.size),
        "first_missing": missing[:10].tolist(),
        "first_extra": extra[:10].tolist(),
    }
