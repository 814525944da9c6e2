"""The inference loop shared by every backend: layer groups, pruning, re-balancing, categories."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import backends
from ..parallel import allgather_array, get_comm
from . import rebalance as rb

__all__ = ["InferenceResult", "infer", "check_categories", "DEFAULT_REBALANCE", "MAX_GROUP"]

#: Default ``rebalance_threshold``: move rows when the busiest rank has 25 % more work than
#: the mean (0 turns re-balancing off).
DEFAULT_REBALANCE = 1.25
#: Longest layer group of a fused backend (groups double while the tiles stay full).
MAX_GROUP = 32
#: First layer group of a fused backend. Starting long avoids writing out the big early
#: layers (at 60,000 digits, groups of 1, 2, 4 layers cost 1.5x the time of one of 8).
FIRST_GROUP = 8
#: A group is followed by a longer one while its last layer computed at most 1/_FULL times
#: the tiles the survivors would fill once regrouped; beyond that, rows died faster than
#: the group could repack them, and the next group is shorter.
_FULL = 0.75


@dataclass
class InferenceResult:
    """What :func:`infer` returns on every rank.

    ``categories`` (1-based, global) and all statistics are identical on every rank;
    ``y_local`` is this rank's block of the final activations, rows
    ``[row_offset, row_offset + y_local.shape[0])`` of the global Y (rows that were moved to
    other ranks by re-balancing are brought back).

    ``layer_seconds`` are exact for per-layer backends; a fused backend runs several layers
    in one pass, and its group's time is split over the group's layers in proportion to the
    tiles each layer computed. ``layer_imbalance`` is ``max / mean`` over ranks of the work
    left after each layer (active rows for tile backends, non-zeros otherwise);
    ``rebalances`` lists every re-balancing with the imbalance before and after it.
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
    groups: list = field(default_factory=list)
    layer_imbalance: list = field(default_factory=list)
    rebalance_threshold: float = 0.0
    rebalances: list = field(default_factory=list)

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
    rebalance_threshold=DEFAULT_REBALANCE,
    max_group=MAX_GROUP,
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
    rebalance_threshold : float
        Between layer groups, when the busiest rank's remaining work exceeds this multiple of
        the mean, rows are moved to even it out (``0`` or ``None``: never). Results do not
        depend on it.
    max_group : int
        Most layers a fused backend runs in one pass (1 = layer by layer).

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
    nlayers = len(network.layers)
    fused = hasattr(be, "run_layers")
    threshold = float(rebalance_threshold or 0.0)
    balancing = threshold > 0 and comm.size > 1
    if balancing:
        # Moves keep the global row order, which needs the blocks in rank order.
        blocks = np.array(comm.allgather((int(row_offset), int(l_rows))), dtype=np.int64)
        balancing = bool(np.all(blocks[:-1, 0] + blocks[:-1, 1] <= blocks[1:, 0]))

    if fused:
        net = be.prepare_network(network)
        be.warmup(net)

        def step(y, k0, k1):
            # The loop drops ``y`` right after: its memory may go as its rows are used.
            return be.run_layers(y, net, k0, k1, prune, consume=True)

        def row_work(y):
            return be.row_work(y)

    else:
        weights = be.prepare_network(network)
        if nlayers:
            be.warmup(weights[0], network.bias[0], network.ymax)

        def step(y, k0, k1):
            return _generic_step(be, y, weights, network, k0, k1, prune)

        def row_work(y):
            return be.row_nnz(y)

    y = be.to_device(y_host)
    gid = np.arange(row_offset, row_offset + l_rows, dtype=np.int64)
    l_nnz = np.zeros(nlayers, dtype=np.int64)
    l_active = np.zeros(nlayers, dtype=np.int64)
    l_work = np.zeros(nlayers, dtype=np.float64)
    l_sec = np.zeros(nlayers, dtype=np.float64)
    groups, events = [], []
    moved = False

    comm.Barrier()
    t_start = time.perf_counter()
    k, glen = 0, min(FIRST_GROUP, max(1, int(max_group)))
    while k < nlayers:
        k1 = min(nlayers, k + (glen if fused else 1))
        t0 = time.perf_counter()
        rows_in = gid.size
        if rows_in:
            y, keep, st = step(y, k, k1)
            gid = gid[keep]
        else:
            st = {key: np.zeros(k1 - k, np.int64) for key in ("active", "nnz", "tiles")}
        be.synchronize()
        dt = time.perf_counter() - t0
        l_nnz[k:k1] = st["nnz"]
        l_active[k:k1] = st["active"]
        l_work[k:k1] = st["active"] if fused else st["nnz"]
        tiles = np.asarray(st["tiles"], dtype=np.float64)
        share = tiles / tiles.sum() if tiles.sum() > 0 else np.full(k1 - k, 1.0 / (k1 - k))
        l_sec[k:k1] = dt * share
        groups.append([k, k1])
        if progress is not None:
            for layer in range(k, k1):
                progress(layer + 1, nlayers, int(l_active[layer]), time.perf_counter() - t_start)
        if k1 < nlayers and (fused or balancing):
            # One small collective per group: every rank takes the same decisions.
            last_in = st["active"][-2] if k1 - k > 1 else rows_in
            ideal = be.ideal_tiles(int(last_in)) if fused else 0
            mine = (float(ideal), float(tiles[-1]), float(row_work(y).sum()))
            table = np.array(comm.allgather(mine)) if comm.size > 1 else np.array([mine])
            if fused:
                full = table[:, 0].sum() >= _FULL * table[:, 1].sum()
                glen = min(max(1, int(max_group)), 2 * glen) if full else max(1, glen // 2)
            if balancing:
                before = rb.imbalance(table[:, 2])
                if before > threshold:
                    t_rb = time.perf_counter()
                    y, gid, event = _rebalance(be, comm, y, gid, row_work(y), before)
                    if event is not None:
                        moved = True
                        event.update(after_layer=k1, seconds=time.perf_counter() - t_rb)
                        events.append(event)
        k = k1
    t_local = time.perf_counter() - t_start
    comm.Barrier()
    part1 = time.perf_counter() - t_start

    t1 = time.perf_counter()
    y_final = be.to_host(y, consume=True) if fused else be.to_host(y)
    del y
    sums = np.asarray(y_final.sum(axis=1)).ravel() if y_final.shape[0] else np.zeros(0)
    local_cats = gid[sums != 0] + 1
    categories = np.sort(allgather_array(comm, local_cats.astype(np.int64)))
    part2 = time.perf_counter() - t1
    # Both phases end on a collective, so the slowest rank defines them; agree on one number.
    part1, part2 = comm.allreduce(part1, op=_max()), comm.allreduce(part2, op=_max())

    if moved:
        # Untimed: bring re-balanced rows back to the rank whose block of Y0 they came from.
        home = np.append(blocks[:, 0], np.iinfo(np.int64).max)
        y_final, gid = rb.exchange_rows(comm, y_final, gid, rb.home_destinations(gid, home))

    g_nnz = np.zeros_like(l_nnz)
    g_act = np.zeros_like(l_active)
    g_sec = np.zeros_like(l_sec)
    comm.Allreduce(l_nnz, g_nnz, op=_sum())
    comm.Allreduce(l_active, g_act, op=_sum())
    comm.Allreduce(l_sec, g_sec, op=_max())
    works = np.array(comm.allgather(l_work)).reshape(comm.size, nlayers)
    y_out = _expand(y_final, gid - row_offset, l_rows)
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
        groups=groups,
        layer_imbalance=[rb.imbalance(works[:, i]) for i in range(nlayers)],
        rebalance_threshold=threshold,
        rebalances=events,
    )


def _generic_step(be, y, weights, network, k0, k1, prune):
    """Layers one at a time through ``be.layer`` (backends without a fused multi-layer pass)."""
    nl = k1 - k0
    active = np.zeros(nl, np.int64)
    nnz = np.zeros(nl, np.int64)
    keep = np.arange(be.row_nnz(y).size, dtype=np.int64)
    for i, k in enumerate(range(k0, k1)):
        y = be.layer(y, weights[k], network.bias[k], network.ymax)
        counts = be.row_nnz(y)
        if prune:
            alive = counts > 0
            n_alive = int(alive.sum())
            # Compacting costs a copy; only worth it once a good share of rows died.
            if n_alive < keep.size and (n_alive == 0 or 10 * n_alive < 9 * keep.size):
                rows = np.flatnonzero(alive)
                y = be.take_rows(y, rows)
                keep = keep[rows]
                counts = counts[rows]
        nnz[i] = int(counts.sum())
        active[i] = int((counts > 0).sum())
    return y, keep, {"active": active, "nnz": nnz, "tiles": np.zeros(nl, np.int64)}


def _rebalance(be, comm, y, gid, work, before):
    """Move rows so every rank holds an equal share of the work; returns (y, gid, event)."""
    weights = comm.allgather(np.asarray(work, dtype=np.float64))
    dest, after = rb.destinations(weights, comm.rank)
    # Not worth a move when the best split is hardly better (e.g. a few huge rows).
    if after > before - 0.5 * (before - 1.0):
        return y, gid, None
    stay = int((dest == comm.rank).sum())
    rows_moved = comm.allreduce(int(gid.size - stay))
    host, gid = rb.exchange_rows(comm, be.to_host(y), gid, dest)
    event = {"before": float(before), "after": float(after), "rows_moved": int(rows_moved)}
    return be.to_device(host), gid, event


def _expand(y, local_ids, l_rows):
    """Put the surviving rows back at their local positions (pruned rows are empty)."""
    y = sp.csr_matrix(y)
    if y.shape[0] == l_rows and np.array_equal(local_ids, np.arange(l_rows)):
        return y
    lens = np.zeros(l_rows, dtype=np.int64)
    lens[np.asarray(local_ids, dtype=np.int64)] = np.diff(y.indptr)
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
