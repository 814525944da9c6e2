"""The slice runner: one loop that runs a range of layers over a set of rows.

Both flows of ``mpisdnn infer`` use it. The data-parallel flow
(:func:`mpisdnn.sdnn.engine.infer`) runs every layer once over each rank's rows; the stage
flow (:func:`mpisdnn.sdnn.pipeline.run_pipeline`) runs a stage's layer slice once per
micro-batch, its collectives over the ranks that hold the same stage. Either way the rows go
through weight blocks that fit ``weight_memory`` (streamed or mapped stores), adaptive
layer groups, row batches that fit ``memory_per_rank``, pruning, re-balancing between
groups, checks for identical rows and the checkpoint hook, with the same kernels on the
same rows: cutting rows into batches or layers into stages changes no result bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import kernel_cache
from ..backends.base import empty_stats
from ..network import as_csr32
from ..parallel import allgather, allreduce, phase
from . import rebalance as rb
from .dedup import Dedup
from .runner_stats import RunnerStats

__all__ = ["RowBlock", "RunnerStats", "SliceRunner", "sorted_rows"]

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
class RowBlock:
    """This rank's block of Y0 as both flows take it: rows ``[row_offset, row_offset +
    l_rows)`` of the global Y, of which ``y`` holds the rows ``gid`` (all of them, or a
    resumed run's live rows). ``blocks`` is every rank's ``(row_offset, l_rows)``."""

    y: sp.csr_matrix
    gid: np.ndarray
    row_offset: int
    l_rows: int
    g_rows: int
    blocks: np.ndarray

    @classmethod
    @phase("setup")
    def of(cls, comm, y_local, row_offset=0, g_rows=None, live_rows=None, block_rows=None):
        """The block from a flow's arguments (collective)."""
        y = as_csr32(y_local)
        l_rows = y.shape[0] if live_rows is None else int(block_rows)
        if g_rows is None:
            g_rows = allreduce(comm, l_rows, "sum")
        blocks = np.array(allgather(comm, (int(row_offset), int(l_rows))), dtype=np.int64)
        if live_rows is None:
            gid = np.arange(row_offset, row_offset + l_rows, dtype=np.int64)
        else:
            gid = np.asarray(live_rows, dtype=np.int64)
        return cls(y, gid, int(row_offset), int(l_rows), int(g_rows), blocks)

    def release(self) -> None:
        """Let go of the rows (handed on; :attr:`gid` and the blocks stay)."""
        self.y = None

    @property
    def in_rank_order(self) -> bool:
        """True when the blocks follow the rank order (moves between ranks keep the global
        row order only then)."""
        b = self.blocks
        return bool(np.all(b[:-1, 0] + b[:-1, 1] <= b[1:, 0]))

    @phase("setup")
    def id_end(self, comm) -> int:
        """One past the largest global row id of any rank (collective)."""
        end = int(self.blocks[:, 0].max() + self.blocks[:, 1].max())
        return max(self.g_rows, allreduce(comm, end, "max"))

    def home(self, comm, y, gid, moved: bool = True) -> sp.csr_matrix:
        """Final rows ``y`` (ids ``gid``, on any rank when ``moved``) as this block: every
        row goes back to the rank whose block of Y0 it came from (collective when
        ``moved``), pruned rows are empty (untimed)."""
        if moved:
            # The rows come in any order (the pipeline's micro-batches, rows expanded from
            # their representatives): sorted by destination for the exchange, which sends
            # each rank one contiguous slice.
            dest = _home_ranks(self.blocks, gid)
            if dest.size > 1 and np.any(dest[1:] < dest[:-1]):
                order = np.argsort(dest, kind="stable")
                y, gid, dest = sp.csr_matrix(y)[order], gid[order], dest[order]
            y, gid = rb.exchange_rows(comm, y, gid, dest)
            y, gid = sorted_rows(y, gid)
        return _expand(y, gid - self.row_offset, self.l_rows)

    def result_fields(self, comm, categories) -> dict:
        """The :class:`~mpisdnn.sdnn.engine.InferenceResult` fields of the rows (collective)."""
        return {
            "categories": categories,
            "row_offset": self.row_offset,
            "g_rows": self.g_rows,
            "rank_rows": allgather(comm, self.l_rows),
        }


def loop_warmup_steps(backend, net, dedup) -> list:
    """The layer loop's warm-up, as independent steps for
    :func:`~mpisdnn.kernel_cache.in_turn`: the backend's kernels on ``net`` (a prepared
    network), then the identical-row checks of ``dedup`` (a ``Dedup``). What the
    runner compiles before its timed loop, and a one-rank run's helper process
    (:func:`mpisdnn.sdnn.warm.warm_up`) beside it."""
    return backend.warmup_steps(net) + dedup.warmup_steps()


class SliceRunner:
    """Layers ``[first, stop)`` of a network on one rank's rows: weight blocks, layer groups,
    row batches, pruning, re-balancing and checks for identical rows between groups.

    Rows live in *parts* ``[y, gid]`` (backend rows and their global ids), in row order:
    one part unless ``memory_per_rank`` asks for row batches. Layers are prepared in
    *blocks* that fit ``weight_memory``: one block unless the weights are too big, and then
    the store is told which block comes next (:meth:`WeightStore.prefetch`) and which are
    done (:meth:`WeightStore.release`). Neither changes a single result bit: rows never
    interact, and every layer runs the same kernel on the same row.

    Parameters
    ----------
    comm : mpi4py communicator
        The ranks that run the same layers at the same time (every rank for the
        data-parallel flow, the ranks of one stage for the stage flow): the per-group
        decisions, re-balancing and checks for identical rows are collective over it.
    be : Backend
    store : WeightStore
        The layers, store index ``k`` being global layer ``first + k``.
    opts : InferOptions
    first, total : int
        Global index of the store's first layer, and the network's depth (statistics are
        kept for every global layer).
    start : int, optional
        First global layer to run (a resumed run starts where its checkpoint stopped;
        default ``first``).
    on_boundary : callable, optional
        ``on_boundary(backend, y, gid, next_layer)`` at each layer-group boundary
        (collective: the checkpoint hook of :mod:`mpisdnn.sdnn.checkpoint`).
    balancing : bool
        ``False``: never re-balance rows between the ranks of ``comm`` (the stage flow's
        groups whose blocks are not in rank order); re-balancing also needs a threshold and
        more than one rank.
    progress : callable, optional
        ``progress(layer, layers, active_rows, seconds)`` after each layer.
    carried : RunnerStats, optional
        The statistics of the runner this one replaces (a stage moved to other layers):
        this runner's statistics go on from them.

    What it measured is :meth:`stats` (a read-only :class:`RunnerStats`); nothing else of
    its state is for its callers.
    """

    def __init__(  # noqa: PLR0913 - the loop's knobs, keyword-only
        self, comm, be, store, opts, *, first=0, total=None, start=None, on_boundary=None,
        balancing=True, progress=None, carried: RunnerStats | None = None,
    ):  # fmt: skip
        self._comm, self._be, self._store, self._opts = comm, be, store, opts
        self._progress = progress
        self._first = int(first)
        self._stop = self._first + len(store)
        self._total = self._stop if total is None else int(total)
        self._threshold = float(opts.rebalance_threshold or 0.0)
        self._balancing = bool(balancing) and self._threshold > 0 and comm.size > 1
        n = self._total
        self._l_nnz = np.zeros(n, np.int64)
        self._l_active = np.zeros(n, np.int64)
        self._l_work = np.zeros(n, np.float64)
        self._l_sec = np.zeros(n, np.float64)
        self._groups: list = []
        self._events: list = []
        self._t_local = 0.0
        self._batch_rows = None
        if opts.memory_per_rank is not None:
            per_row = max(1, be.activation_bytes_per_row(store.neurons))
            self._batch_rows = max(1, int(opts.memory_per_rank) // per_row)
        self._blocks: list = []
        self._weight_memory = 0
        self._layer_bytes = 0
        self._prepare_first = 0.0
        self._prepare_loop = 0.0
        self._max_batches = 1
        self._act_peak = 0
        self._on_boundary = on_boundary
        self._start = self._first if start is None else int(start)
        self._dd = Dedup(comm, 0, enabled=False)
        self._net, self._net_block = None, -1
        if carried is not None:
            self._carry(carried)

    def _carry(self, old: RunnerStats) -> None:
        """Go on from the statistics of the runner this one replaces."""
        for name in ("l_nnz", "l_active", "l_work", "l_sec"):
            getattr(self, "_" + name)[:] += getattr(old, name)
        self._groups[:0] = [list(g) for g in old.groups]
        self._events[:0] = [dict(e) for e in old.events]
        self._prepare_loop += old.prepare_loop
        self._max_batches = max(self._max_batches, old.max_batches)
        self._act_peak = max(self._act_peak, old.act_peak)

    @property
    def first(self) -> int:
        """Global index of the store's first layer."""
        return self._first

    @property
    def stop(self) -> int:
        """One past the global index of the store's last layer."""
        return self._stop

    @property
    def dedup(self) -> Dedup:
        """The checks for identical rows of the last :meth:`run` (the merges its kept rows
        stand for)."""
        return self._dd

    def stats(self) -> RunnerStats:
        """What this runner measured so far: a read-only copy."""
        return RunnerStats(
            l_nnz=self._l_nnz,
            l_active=self._l_active,
            l_work=self._l_work,
            l_sec=self._l_sec,
            groups=tuple(tuple(g) for g in self._groups),
            events=tuple(dict(e) for e in self._events),
            threshold=self._threshold,
            t_local=float(self._t_local),
            weight_memory=int(self._weight_memory),
            weight_bytes_estimate=int(self._layer_bytes * len(self._store)),
            blocks=tuple(tuple(b) for b in self._blocks),
            prepare_first=float(self._prepare_first),
            prepare_loop=float(self._prepare_loop),
            memory_per_rank=self._opts.memory_per_rank,
            batch_rows=self._batch_rows,
            max_batches=int(self._max_batches),
            act_peak=int(self._act_peak),
        )

    # -- rows ------------------------------------------------------------------------------
    def split(self, y_host, gid):
        """Host rows -> parts of at most ``batch_rows`` rows each, on the backend."""
        step = self._batch_rows or max(1, gid.size)
        if step >= gid.size:  # one batch: no copy (a canonical block is used in place)
            return [[self._be.to_device(y_host), gid]]
        return [
            [self._be.to_device(y_host[a : a + step]), gid[a : a + step]]
            for a in range(0, gid.size, step)
        ]

    def gather_host(self, parts):
        """All parts as one host CSR matrix and their global ids (consumes the parts)."""
        mats, gids = [], []
        while parts:
            y, gid = parts.pop(0)
            mats.append(self._be.to_host(y, consume=True))
            gids.append(gid)
            del y
        if not mats:
            return sp.csr_matrix((0, self._store.neurons), dtype=np.float32), np.zeros(0, np.int64)
        y = mats[0] if len(mats) == 1 else sp.vstack(mats, format="csr")
        # Deduplicated rows may sit in a part of their own: restore the global row order.
        return sorted_rows(sp.csr_matrix(y), np.concatenate(gids))

    def _merge_small(self, parts):
        """Join neighbouring batches that fit one batch together (rows die as layers pass)."""
        if self._batch_rows is None or len(parts) < 2:
            return [p for p in parts if p[1].size] or parts[:1]
        out, pending, rows = [], [], 0
        for p in parts:
            if not p[1].size:
                continue
            if pending and rows + p[1].size > self._batch_rows:
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
        return [self._be.to_device(y), gid]

    # -- the loop --------------------------------------------------------------------------
    @phase("setup")
    def begin(self, rows: RowBlock, id_end: int):
        """Take this rank's rows for :meth:`run` (untimed set-up, as both flows start):
        re-balancing only when the blocks follow the rank order (moves keep the global row
        order only then), checks for identical rows scheduled from :attr:`start` over ids
        below ``id_end``, the rows on the backend, the first weight block prepared
        (:meth:`open`). Returns the parts."""
        self._balancing = self._balancing and rows.in_rank_order
        self._dd = Dedup(self._comm, id_end, self._opts.dedup, self._start, self._opts.first_group)
        parts = self.split(rows.y, rows.gid)
        self.open()
        return parts

    @phase("setup")
    def open(self) -> None:
        """Plan the weight blocks, prepare the first one and warm the kernels up (untimed)."""
        from .streaming import estimated_weight_bytes, plan_blocks

        be, store, nlayers = self._be, self._store, len(self._store)
        # the commands resolve it once; an API caller's None gets the same default here
        self._weight_memory = int(self._opts.resolved(self._comm).weight_memory)
        total = estimated_weight_bytes(store.edges, nlayers, store.neurons, be.prepared_bytes)
        self._layer_bytes = total // max(1, nlayers)
        self._blocks = plan_blocks(nlayers, self._layer_bytes, self._weight_memory)
        t0 = time.perf_counter()
        if self._blocks:
            self._prepare(self._first_block(), fresh=True)
        else:
            self._net = be.prepare_network(store)
        self._prepare_first = time.perf_counter() - t0
        # each rank starts at another step: a first run compiles the kernels side by side
        kernel_cache.in_turn(loop_warmup_steps(be, self._net, self._dd), self._comm.rank)

    def close(self) -> None:
        """Let go of the prepared weights."""
        self._net, self._net_block = None, -1

    def _first_block(self) -> int:
        """The block holding the first layer to run (a resumed run starts inside one)."""
        skip = self._start - self._first
        return next((i for i, (_, b1) in enumerate(self._blocks) if b1 > skip), 0)

    def run_all(self, parts, t_start: float):
        """:meth:`run`, then :meth:`close`; this rank's seconds from ``t_start`` to the end
        are its ``rank_seconds`` in :meth:`stats`."""
        parts = self.run(parts, t_start)
        self.close()
        self._t_local = time.perf_counter() - t_start
        return parts

    @phase("layers")
    def run(self, parts, t_start: float, dedup: Dedup | None = None):
        """Every layer of the slice on ``parts``; returns the parts left (collective over
        the runner's ``comm``: every rank of it calls this as often). ``t_start``: when the
        timed loop began (for progress lines). ``dedup``: the checks for identical rows of
        these rows (a micro-batch's, with the merges it came with); default the ones
        :meth:`begin` scheduled."""
        if dedup is not None:
            self._dd = dedup
        be, comm = self._be, self._comm
        max_group = self._opts.max_group if be.fuses_layers else 1
        glen = min(self._opts.first_group, max_group)
        first_block = self._first_block()
        for bi in range(first_block, len(self._blocks)):
            b0, b1 = self._blocks[bi]
            if bi != self._net_block:
                t0 = time.perf_counter()
                self._prepare(bi, fresh=bi == first_block)
                self._prepare_loop += time.perf_counter() - t0
            k = max(b0, self._start - self._first)
            while k < b1:
                k1 = self._dd.group_end(self._first + k, self._first + min(b1, k + glen))
                k1 -= self._first
                rows_in = [p[1].size for p in parts]
                parts, st, last_in = self._group(parts, k, k1, b0, t_start, rows_in)
                g1 = self._first + k1
                if g1 < self._stop and (be.fuses_layers or self._balancing):
                    # One small collective per group: every rank takes the same decisions.
                    ideal = float(sum(be.ideal_tiles(int(r)) for r in last_in))
                    work = float(sum(be.row_work(p[0]).sum() for p in parts))
                    lost = float(sum(rows_in) - sum(p[1].size for p in parts))
                    table = _gather_rows(comm, (ideal, float(st["tiles"][-1]), work, lost))
                    if be.fuses_layers:
                        glen = _next_group(glen, max_group, table)
                    if self._balancing:
                        parts = self._maybe_rebalance(parts, table[:, 2], g1)
                if self._dd.due(g1, self._stop):
                    parts = self._dedup(parts, g1)
                if self._on_boundary is not None:
                    parts = self._call_hook(parts, g1)
                k = k1
        return parts

    @phase("checkpoint")
    def _call_hook(self, parts, k1):
        """The checkpoint hook takes one row set: batches are joined for it, and kept rows
        are expanded to every input they stand for (a checkpoint does not depend on
        deduplication, so a run may resume with it on or off)."""
        if self._dd.active:
            host, gid = self.gather_host(parts)
            full, full_gid = self._dd.expand_rows(host, gid)
            self._on_boundary(self._be, self._be.to_device(full), full_gid, k1)
            del full
            return self.split(host, gid)
        if len(parts) > 1:
            parts = [self._join(parts)]
        self._on_boundary(self._be, parts[0][0], parts[0][1], k1)
        return parts

    # -- identical rows --------------------------------------------------------------------
    def _dedup(self, parts, after_layer):
        """Keep one row of each set of byte-identical rows, batch by batch (collective)."""
        be, out, t0 = self._be, [], time.perf_counter()
        for y, gid in parts:
            # Read in place where the backend can (no copy of rows that stay distinct).
            keep = self._dd.local(be.row_view(y), gid)
            if keep is None:
                out.append([y, gid])
                continue
            out.append([be.take_rows(y, keep), gid[keep]])
        self._dd.commit(after_layer, time.perf_counter() - t0)
        return out

    def _prepare(self, bi, fresh=False):
        """Block ``bi`` in the backend's form (``fresh``: not read ahead, ask for it now);
        the store may drop it and read the next."""
        b0, b1 = self._blocks[bi]
        if fresh:
            self._store.prefetch(b0, b1)
        self._net = None  # the previous block goes before the next one is prepared
        self._net = self._be.prepare_group(self._store, b0, b1)
        self._net_block = bi
        self._store.release(b0, b1)
        if bi + 1 < len(self._blocks):
            self._store.prefetch(*self._blocks[bi + 1])

    def _group(self, parts, k, k1, b0, t_start, rows_in):
        """Store layers ``[k, k1)`` on every batch of live rows; records their statistics."""
        net, g0, g1 = self._net, self._first + k, self._first + k1
        t0 = time.perf_counter()
        self._be.share_preparation(net, k - b0, k1 - b0, self._comm)
        st = empty_stats(k1 - k)
        stored = sum(self._be.activation_bytes(p[0]) for p in parts)
        out, last_in, biggest = [], [], 0
        for (y, gid), n_in in zip(parts, rows_in):
            if gid.size:
                # The loop drops ``y`` right after: its memory may go as its rows are used.
                # Rows and non-zeros count every input a kept row stands for (its weight);
                # ``rows`` and ``tiles`` are the work done.
                w = self._dd.weights(gid)
                y, keep, s = self._be.run_layers(
                    y, net, k - b0, k1 - b0, self._opts.prune, consume=True, weights=w
                )
                last_in.append(s["rows"][-2] if k1 - k > 1 else n_in)
                nnz = s["nnz"][-1] if w is None else None  # weighted counts: not the rows'
                biggest = max(biggest, self._be.activation_bytes(y, nnz))
                gid = gid[keep]
                for key in st:
                    st[key] += s[key]
            out.append([y, gid])
            del y
        self._act_peak = max(self._act_peak, stored + biggest)
        self._max_batches = max(self._max_batches, len(out))
        parts = self._merge_small(out)
        self._be.synchronize()
        dt = time.perf_counter() - t0
        # Summed: the stage flow runs its slice once per micro-batch.
        self._l_nnz[g0:g1] += st["nnz"]
        self._l_active[g0:g1] += st["active"]
        self._l_work[g0:g1] += st["active"] if self._be.fuses_layers else st["nnz"]
        tiles = np.asarray(st["tiles"], dtype=np.float64)
        share = tiles / tiles.sum() if tiles.sum() > 0 else np.full(k1 - k, 1.0 / (k1 - k))
        self._l_sec[g0:g1] += dt * share
        self._groups.append([g0, g1])
        if self._progress is not None:
            for layer in range(g0, g1):
                elapsed = time.perf_counter() - t_start
                self._progress(layer + 1, self._total, int(self._l_active[layer]), elapsed)
        return parts, st, last_in

    @phase("rebalance")
    def _maybe_rebalance(self, parts, works, after_layer):
        before = rb.imbalance(works)
        if before <= self._threshold:
            return parts
        t_rb = time.perf_counter()
        parts, event = self._rebalance(parts, before)
        if event is not None:
            event.update(after_layer=after_layer, seconds=time.perf_counter() - t_rb)
            self._events.append(event)
        return parts

    def _rebalance(self, parts, before):
        """Move rows so every rank holds an equal share of the work; returns
        ``(parts, event or None)``."""
        be, comm = self._be, self._comm
        work = np.concatenate([np.asarray(be.row_work(p[0]), np.float64) for p in parts])
        # In the order gather_host puts the rows (by global id).
        work = work[np.argsort(np.concatenate([p[1] for p in parts]), kind="stable")]
        weights = allgather(comm, work)
        dest, after = rb.destinations(weights, comm.rank)
        # Not worth a move when the best split is hardly better (e.g. a few huge rows).
        if after > before - 0.5 * (before - 1.0):
            return parts, None
        stay = int((dest == comm.rank).sum())
        rows_moved = allreduce(comm, int(dest.size - stay), "sum")
        host, gid = self.gather_host(parts)
        host, gid = rb.exchange_rows(comm, host, gid, dest)
        event = {"before": float(before), "after": float(after), "rows_moved": int(rows_moved)}
        return self.split(sp.csr_matrix(host), gid), event


def _gather_rows(comm, row) -> np.ndarray:
    return np.array(allgather(comm, row)) if comm.size > 1 else np.array([row])


def _home_ranks(blocks, gid) -> np.ndarray:
    """Rank whose block ``(row_offset, l_rows)`` of ``blocks`` holds each id of ``gid``
    (blocks in any rank order; empty blocks hold nothing)."""
    blocks = np.asarray(blocks, dtype=np.int64).reshape(-1, 2)
    ranks = np.flatnonzero(blocks[:, 1] > 0)
    ranks = ranks[np.argsort(blocks[ranks, 0], kind="stable")]
    at = np.searchsorted(blocks[ranks, 0], np.asarray(gid, np.int64), side="right") - 1
    return ranks[np.maximum(at, 0)].astype(np.int64) if ranks.size else np.zeros_like(at)


def sorted_rows(y, gid):
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
