"""The inference loop shared by every backend: layer groups, pruning, re-balancing, categories."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import backends
from ..backends.base import Backend, empty_stats
from ..parallel import allgather_array, allreduce, get_comm
from ..weights import as_store
from . import rebalance as rb
from .dedup import Dedup
from .options import DEFAULT_REBALANCE, FIRST_GROUP, MAX_GROUP, InferOptions

__all__ = [
    "InferenceResult",
    "InferOptions",
    "infer",
    "check_categories",
    "DEFAULT_REBALANCE",
    "FIRST_GROUP",
    "MAX_GROUP",
]

#: A group is followed by a longer one while its last layer computed at most 1/_FULL times
#: the tiles the survivors would fill once regrouped; beyond that, rows died faster than
#: the group could repack them, and the next group is shorter.
_FULL = 0.75


def _next_group(glen: int, max_group: int, table) -> int:
    """Length of the next layer group from the last one's ``(ideal tiles, tiles computed,
    work, rows lost)`` per rank (pure).

    Groups double while their tiles stay full and halve when rows died faster than a group
    could repack them. A group that lost no row on any rank is followed by the longest
    one: its rows have settled (the survivors of the challenge networks do so after about
    20 layers), and every group boundary moves every live row out of its tiles and back,
    which at N=65536 costs as much as 10-20 layers of dense survivors.
    """
    full = table[:, 0].sum() >= _FULL * table[:, 1].sum()
    if full and table[:, 3].sum() == 0:
        return max_group
    return min(max_group, 2 * glen) if full else max(1, glen // 2)


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
    ``memory`` tells how weights and rows were bounded: the layer ``blocks`` the weights
    were prepared in (one block when they fit ``weight_memory``), the seconds spent preparing
    blocks inside the loop, the row ``batches`` and the peak activation bytes per rank.
    ``dedup`` records each check for identical rows (:mod:`mpisdnn.sdnn.dedup`): after
    which layer, the live rows (inputs), the distinct rows kept and the seconds it took.
    Row counts (``layer_active_rows``, ``layer_nnz``) count every input a kept row stands for.
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
    memory: dict = field(default_factory=dict)
    dedup: dict = field(default_factory=dict)

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


def infer(  # noqa: PLR0913 - keyword-only knobs of the one public entry point
    network,
    y_local,
    comm=None,
    *,
    row_offset: int = 0,
    g_rows: int | None = None,
    options: InferOptions | None = None,
    backend: Backend | None = None,
    progress=None,
    start_layer: int = 0,
    live_rows=None,
    block_rows: int | None = None,
    on_boundary=None,
) -> InferenceResult:
    """Run every layer of ``network`` on this rank's rows and gather the categories.

    Parameters
    ----------
    network : Network or WeightStore
        The layers (every rank sees all of them; a store may map or stream them).
    y_local : scipy.sparse matrix
        This rank's contiguous row block of Y0.
    comm : mpi4py communicator, optional
        Default ``MPI.COMM_WORLD``.
    row_offset : int
        Global index of ``y_local``'s first row.
    g_rows : int, optional
        Global number of inputs (default: sum of local rows).
    options : InferOptions, optional
        Backend, pruning, layer groups, re-balancing (default ``InferOptions()``).
    backend : Backend, optional
        An already created backend (default: created from ``options`` on ``comm``).
    progress : callable, optional
        ``progress(layer, layers, active_rows, seconds_so_far)`` called on every rank after
        each layer (the CLI's reporter prints on rank 0 only).
    start_layer : int
        First layer to run (a resumed run starts where its checkpoint stopped).
    live_rows : array of int, optional
        Global ids of the rows of ``y_local`` when it holds only the live rows of the block
        ``[row_offset, row_offset + block_rows)`` (a resumed run); default all rows.
    block_rows : int, optional
        Rows of this rank's block when ``live_rows`` is given.
    on_boundary : callable, optional
        ``on_boundary(backend, y, gid, next_layer)`` called on every rank at each layer-group
        boundary (collective: the checkpoint hook of :mod:`mpisdnn.sdnn.checkpoint`).

    Returns
    -------
    InferenceResult
    """
    comm = get_comm(comm)
    opts = options if options is not None else InferOptions()
    be = backend if backend is not None else backends.create(opts, comm)
    loop = _LayerLoop(comm, be, as_store(network), opts, progress)
    loop.on_boundary, loop.start = on_boundary, int(start_layer)
    y_host = sp.csr_matrix(y_local, dtype=np.float32)
    l_rows = y_host.shape[0] if live_rows is None else int(block_rows)
    if g_rows is None:
        g_rows = comm.allreduce(l_rows)
    blocks = np.array(comm.allgather((int(row_offset), int(l_rows))), dtype=np.int64)
    # Moves keep the global row order, which needs the blocks in rank order.
    loop.balancing = loop.balancing and bool(
        np.all(blocks[:-1, 0] + blocks[:-1, 1] <= blocks[1:, 0])
    )
    if live_rows is None:
        gid = np.arange(row_offset, row_offset + l_rows, dtype=np.int64)
    else:
        gid = np.asarray(live_rows, dtype=np.int64)
    id_end = allreduce(comm, int(blocks[:, 0].max() + blocks[:, 1].max()), "max")
    loop.dd = Dedup(comm, max(int(g_rows), id_end), opts.dedup, start_layer, opts.first_group)
    parts, part1 = loop.run(loop.split(y_host, gid))

    t1 = time.perf_counter()
    y_final, gid = loop.gather_host(parts)
    del parts
    sums = np.asarray(y_final.sum(axis=1)).ravel() if y_final.shape[0] else np.zeros(0)
    # A kept row stands for every input merged into it.
    local_cats = loop.dd.expand_ids(gid[sums != 0]) + 1
    categories = np.sort(allgather_array(comm, local_cats.astype(np.int64)))
    part2 = time.perf_counter() - t1
    # Both phases end on a collective, so the slowest rank defines them; agree on one number.
    part1, part2 = allreduce(comm, part1, "max"), allreduce(comm, part2, "max")

    # Untimed: the final Y holds a copy of a kept row for every input it stands for.
    y_final, gid = loop.dd.expand_rows(y_final, gid)
    if loop.events:
        # Untimed: bring re-balanced rows back to the rank whose block of Y0 they came from.
        home = np.append(blocks[:, 0], np.iinfo(np.int64).max)
        y_final, gid = rb.exchange_rows(comm, y_final, gid, rb.home_destinations(gid, home))
        y_final, gid = _sorted(y_final, gid)

    return InferenceResult(
        categories=categories,
        y_local=_expand(y_final, gid - row_offset, l_rows),
        row_offset=int(row_offset),
        g_rows=int(g_rows),
        layers=len(loop.store),
        edges=int(loop.store.edges),
        part1=float(part1),
        part2=float(part2),
        rank_rows=comm.allgather(int(l_rows)),
        rank_nnz=comm.allgather(int(y_host.nnz)),
        backend=be.describe(),
        rebalance_threshold=loop.threshold,
        memory=loop.memory_statistics(),
        dedup=loop.dd.describe(),
        **loop.statistics(),
    )


class _LayerLoop:
    """The layer loop of one rank: weight blocks, layer groups, row batches, pruning and
    re-balancing between groups.

    Rows live in *parts* ``[y, gid]`` (backend rows and their global ids), in row order:
    one part unless ``memory_per_rank`` asks for row batches. Layers are prepared in
    *blocks* that fit ``weight_memory``: one block unless the weights are too big, and then
    the store is told which block comes next (:meth:`WeightStore.prefetch`) and which are
    done (:meth:`WeightStore.release`). Neither changes a single result bit: rows never
    interact, and every layer runs the same kernel on the same row.
    """

    def __init__(self, comm, be, store, opts, progress):
        self.comm, self.be, self.store, self.opts = comm, be, store, opts
        self.progress = progress
        self.threshold = float(opts.rebalance_threshold or 0.0)
        self.balancing = self.threshold > 0 and comm.size > 1
        n = len(store)
        self.l_nnz = np.zeros(n, np.int64)
        self.l_active = np.zeros(n, np.int64)
        self.l_work = np.zeros(n, np.float64)
        self.l_sec = np.zeros(n, np.float64)
        self.groups: list = []
        self.events: list = []
        self.t_local = 0.0
        self.batch_rows = None
        if opts.memory_per_rank is not None:
            per_row = max(1, be.activation_bytes_per_row(store.neurons))
            self.batch_rows = max(1, int(opts.memory_per_rank) // per_row)
        self.blocks: list = []
        self.weight_memory = 0
        self.layer_bytes = 0
        self.prepare_first = 0.0
        self.prepare_loop = 0.0
        self.max_batches = 1
        self.act_peak = 0
        self.on_boundary, self.start = None, 0
        self.dd = Dedup(comm, 0, enabled=False)

    # -- rows ------------------------------------------------------------------------------
    def split(self, y_host, gid):
        """Host rows -> parts of at most ``batch_rows`` rows each, on the backend."""
        step = self.batch_rows or max(1, gid.size)
        if step >= gid.size:  # one batch: no copy (a canonical block is used in place)
            return [[self.be.to_device(y_host), gid]]
        return [
            [self.be.to_device(y_host[a : a + step]), gid[a : a + step]]
            for a in range(0, gid.size, step)
        ]

    def gather_host(self, parts):
        """All parts as one host CSR matrix and their global ids (consumes the parts)."""
        mats, gids = [], []
        while parts:
            y, gid = parts.pop(0)
            mats.append(self.be.to_host(y, consume=True))
            gids.append(gid)
            del y
        if not mats:
            return sp.csr_matrix((0, self.store.neurons), dtype=np.float32), np.zeros(0, np.int64)
        y = mats[0] if len(mats) == 1 else sp.vstack(mats, format="csr")
        # Deduplicated rows may sit in a part of their own: restore the global row order.
        return _sorted(sp.csr_matrix(y), np.concatenate(gids))

    def _merge_small(self, parts):
        """Join neighbouring batches that fit one batch together (rows die as layers pass)."""
        if self.batch_rows is None or len(parts) < 2:
            return [p for p in parts if p[1].size] or parts[:1]
        out, pending, rows = [], [], 0
        for p in parts:
            if not p[1].size:
                continue
            if pending and rows + p[1].size > self.batch_rows:
                out.append(self._join(pending))
                pending, rows = [], 0
            pending.append(p)
            rows += p[1].size
        if pending:
            out.append(self._join(pending))
        return out or parts[:1]

    def _join(self, parts):
        if len(parts) == 1:
            return parts[0]
        y, gid = self.gather_host(parts)
        return [self.be.to_device(y), gid]

    # -- the loop --------------------------------------------------------------------------
    def run(self, parts):
        """All layers on ``parts``; returns the final parts and the loop's seconds."""
        from .streaming import default_weight_memory, estimated_weight_bytes, plan_blocks

        be, comm, store, nlayers = self.be, self.comm, self.store, len(self.store)
        budget = self.opts.weight_memory
        self.weight_memory = int(budget if budget is not None else default_weight_memory(comm))
        total = estimated_weight_bytes(store.edges, nlayers, store.neurons, be.prepared_bytes)
        self.layer_bytes = total // max(1, nlayers)
        self.blocks = plan_blocks(nlayers, self.layer_bytes, self.weight_memory)
        # A resumed run starts in the block holding its first layer.
        first = next((i for i, (_, b1) in enumerate(self.blocks) if b1 > self.start), 0)
        t0 = time.perf_counter()
        net = self._prepare(first, first) if self.blocks else be.prepare_network(store)
        self.prepare_first = time.perf_counter() - t0
        be.warmup(net)
        self.dd.warmup()
        max_group = self.opts.max_group if be.fuses_layers else 1
        comm.Barrier()
        t_start = time.perf_counter()
        glen = min(self.opts.first_group, max_group)
        for bi in range(first, len(self.blocks)):
            b0, b1 = self.blocks[bi]
            if bi > first:
                t0 = time.perf_counter()
                net = self._prepare(bi, first)
                self.prepare_loop += time.perf_counter() - t0
            k = max(b0, self.start)
            while k < b1:
                k1 = self.dd.group_end(k, min(b1, k + glen))
                rows_in = [p[1].size for p in parts]
                parts, st, last_in = self._group(net, parts, k, k1, b0, t_start, rows_in)
                if k1 < nlayers and (be.fuses_layers or self.balancing):
                    # One small collective per group: every rank takes the same decisions.
                    ideal = float(sum(be.ideal_tiles(int(r)) for r in last_in))
                    work = float(sum(be.row_work(p[0]).sum() for p in parts))
                    lost = float(sum(rows_in) - sum(p[1].size for p in parts))
                    table = _gather_rows(comm, (ideal, float(st["tiles"][-1]), work, lost))
                    if be.fuses_layers:
                        glen = _next_group(glen, max_group, table)
                    if self.balancing:
                        parts = self._maybe_rebalance(parts, table[:, 2], k1)
                if self.dd.due(k1, nlayers):
                    parts = self._dedup(parts, k1)
                if self.on_boundary is not None:
                    parts = self._call_hook(parts, k1)
                k = k1
            del net
        self.t_local = time.perf_counter() - t_start
        comm.Barrier()
        return parts, time.perf_counter() - t_start

    def _call_hook(self, parts, k1):
        """The checkpoint hook takes one row set: batches are joined for it, and kept rows
        are expanded to every input they stand for (a checkpoint does not depend on
        deduplication, so a run may resume with it on or off)."""
        if self.dd.active:
            host, gid = self.gather_host(parts)
            full, full_gid = self.dd.expand_rows(host, gid)
            self.on_boundary(self.be, self.be.to_device(full), full_gid, k1)
            del full
            return self.split(host, gid)
        if len(parts) > 1:
            parts = [self._join(parts)]
        self.on_boundary(self.be, parts[0][0], parts[0][1], k1)
        return parts

    # -- identical rows --------------------------------------------------------------------
    def _dedup(self, parts, after_layer):
        """Keep one row of each set of byte-identical rows, batch by batch (collective)."""
        be, out, t0 = self.be, [], time.perf_counter()
        for y, gid in parts:
            host = be.to_host(y)
            keep = self.dd.local(host, gid)
            if keep is None:
                out.append([y, gid])
                continue
            del y
            out.append([be.to_device(host[keep]), gid[keep]])
        self.dd.commit(after_layer, time.perf_counter() - t0)
        return out

    def _prepare(self, bi, first=0):
        """Block ``bi`` in the backend's form; the store may drop it and read the next."""
        b0, b1 = self.blocks[bi]
        if bi == first:
            self.store.prefetch(b0, b1)
        net = self.be.prepare_group(self.store, b0, b1)
        self.store.release(b0, b1)
        if bi + 1 < len(self.blocks):
            self.store.prefetch(*self.blocks[bi + 1])
        return net

    def _group(self, net, parts, k, k1, b0, t_start, rows_in):
        """Layers ``[k, k1)`` on every batch of live rows; records their statistics."""
        t0 = time.perf_counter()
        self.be.share_preparation(net, k - b0, k1 - b0, self.comm)
        st = empty_stats(k1 - k)
        stored = 8 * sum(int(self.be.row_nnz(p[0]).sum()) for p in parts)
        out, last_in, biggest = [], [], 0
        for (y, gid), n_in in zip(parts, rows_in):
            if gid.size:
                # The loop drops ``y`` right after: its memory may go as its rows are used.
                # Rows and non-zeros count every input a kept row stands for (its weight);
                # ``rows`` and ``tiles`` are the work done.
                w = self.dd.weights(gid)
                y, keep, s = self.be.run_layers(
                    y, net, k - b0, k1 - b0, self.opts.prune, consume=True, weights=w
                )
                last_in.append(s["rows"][-2] if k1 - k > 1 else n_in)
                out_nnz = s["nnz"][-1] if w is None else self.be.row_nnz(y).sum()
                biggest = max(biggest, 8 * int(out_nnz))
                gid = gid[keep]
                for key in st:
                    st[key] += s[key]
            out.append([y, gid])
            del y
        self.act_peak = max(self.act_peak, stored + biggest)
        self.max_batches = max(self.max_batches, len(out))
        parts = self._merge_small(out)
        self.be.synchronize()
        dt = time.perf_counter() - t0
        self.l_nnz[k:k1] = st["nnz"]
        self.l_active[k:k1] = st["active"]
        self.l_work[k:k1] = st["active"] if self.be.fuses_layers else st["nnz"]
        tiles = np.asarray(st["tiles"], dtype=np.float64)
        share = tiles / tiles.sum() if tiles.sum() > 0 else np.full(k1 - k, 1.0 / (k1 - k))
        self.l_sec[k:k1] = dt * share
        self.groups.append([k, k1])
        if self.progress is not None:
            for layer in range(k, k1):
                elapsed = time.perf_counter() - t_start
                self.progress(layer + 1, len(self.store), int(self.l_active[layer]), elapsed)
        return parts, st, last_in

    def _maybe_rebalance(self, parts, works, after_layer):
        before = rb.imbalance(works)
        if before <= self.threshold:
            return parts
        t_rb = time.perf_counter()
        parts, event = _rebalance(self, parts, before)
        if event is not None:
            event.update(after_layer=after_layer, seconds=time.perf_counter() - t_rb)
            self.events.append(event)
        return parts

    def memory_statistics(self) -> dict:
        """How weights and activations were bounded on this run (collective)."""
        comm = self.comm
        return {
            "weight_memory_bytes": int(self.weight_memory),
            "weight_bytes_estimate": int(self.layer_bytes * len(self.store)),
            "blocks": [list(b) for b in self.blocks],
            "prepare_first_seconds": float(self.prepare_first),
            "prepare_in_loop_seconds": allreduce(comm, float(self.prepare_loop), "max"),
            "memory_per_rank_bytes": self.opts.memory_per_rank,
            "batch_rows": self.batch_rows,
            "rank_max_batches": comm.allgather(int(self.max_batches)),
            "rank_activation_peak_bytes": comm.allgather(int(self.act_peak)),
        }

    def statistics(self) -> dict:
        """Per-layer and per-rank statistics, identical on every rank (collective)."""
        comm, nlayers = self.comm, len(self.store)
        g_nnz = allreduce(comm, self.l_nnz, "sum")
        g_act = allreduce(comm, self.l_active, "sum")
        g_sec = allreduce(comm, self.l_sec, "max")
        works = np.array(comm.allgather(self.l_work)).reshape(comm.size, nlayers)
        return {
            "layer_nnz": g_nnz.tolist(),
            "layer_active_rows": g_act.tolist(),
            "layer_seconds": g_sec.tolist(),
            "rank_seconds": comm.allgather(float(self.t_local)),
            "groups": self.groups,
            "layer_imbalance": [rb.imbalance(works[:, i]) for i in range(nlayers)],
            "rebalances": self.events,
        }


def _gather_rows(comm, row) -> np.ndarray:
    return np.array(comm.allgather(row)) if comm.size > 1 else np.array([row])


def _rebalance(loop, parts, before):
    """Move rows so every rank holds an equal share of the work; returns (parts, event)."""
    be, comm = loop.be, loop.comm
    work = np.concatenate([np.asarray(be.row_work(p[0]), np.float64) for p in parts])
    # In the order gather_host puts the rows (by global id).
    work = work[np.argsort(np.concatenate([p[1] for p in parts]), kind="stable")]
    weights = comm.allgather(work)
    dest, after = rb.destinations(weights, comm.rank)
    # Not worth a move when the best split is hardly better (e.g. a few huge rows).
    if after > before - 0.5 * (before - 1.0):
        return parts, None
    stay = int((dest == comm.rank).sum())
    rows_moved = comm.allreduce(int(dest.size - stay))
    host, gid = loop.gather_host(parts)
    host, gid = rb.exchange_rows(comm, host, gid, dest)
    event = {"before": float(before), "after": float(after), "rows_moved": int(rows_moved)}
    return loop.split(sp.csr_matrix(host), gid), event


def _sorted(y, gid):
    """Rows in ascending global id (a no-op when they already are)."""
    if gid.size < 2 or bool(np.all(gid[1:] > gid[:-1])):
        return y, gid
    order = np.argsort(gid, kind="stable")
    return sp.csr_matrix(y)[order], gid[order]


def _expand(y, local_ids, l_rows):
    """Put the surviving rows back at their local positions (pruned rows are empty)."""
    y = sp.csr_matrix(y)
    if y.shape[0] == l_rows and np.array_equal(local_ids, np.arange(l_rows)):
        return y
    lens = np.zeros(l_rows, dtype=np.int64)
    lens[np.asarray(local_ids, dtype=np.int64)] = np.diff(y.indptr)
    indptr = np.concatenate(([0], np.cumsum(lens)))
    return sp.csr_matrix((y.data, y.indices, indptr), shape=(l_rows, y.shape[1]))


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
