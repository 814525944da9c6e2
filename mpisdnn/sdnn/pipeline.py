"""Pipeline stages: ``S`` stages x ``D`` data groups, rows flowing through in micro-batches.

Rank ``r`` is stage ``r % S`` of data group ``r // S``, so a group's stages are neighbouring
ranks (on one node when the launcher fills nodes in order). Stage ``s`` holds only a slice
of the ``R`` layers to run: first ``[s R / S, (s + 1) R / S)``, then, after the first
micro-batch has shown where the work is, the slice that balances the stages' work
(:func:`~mpisdnn.partition.balanced_layers`). Group ``g`` takes the rows of Y0
that ranks ``g S .. g S + S - 1`` loaded (the union of ``S`` neighbouring nnz-balanced
blocks: one contiguous, nnz-balanced block per group); its stage 0 cuts them into
micro-batches of ``batch_rows`` rows, and every stage passes each batch, compacted to its
live rows (global ids plus CSR, and the batch's merges of identical rows), to the next one
with a non-blocking send while it starts on the following batch. After ``S - 1`` batches
every stage is busy.

A *head* of layers may run before the stages, data-parallel on every rank (each on its own
block, as ``--stages 1`` runs them; :func:`head_layers`): on a pruned network nearly all the
work sits in the first layers, where most rows die and the survivors become identical, and a
layer split cannot share that work out (stage 0 would do it alone, micro-batch by
micro-batch). After the head the group's survivors, few and merged, go through the stages.
Every rank then holds the head's layers besides its slice: at most half a slice more.

Rows are independent in ``Y = min(max(Y W + b, 0), ymax)``, so cutting them into batches and
layers into stages changes no value: the final Y is bit-identical to ``--stages 1``.
Statistics: per-stage busy time, the bubble fraction (the share of rank time spent waiting),
bytes sent between stages and the weight bytes each rank holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import scipy.sparse as sp

from .. import backends
from .._handoff import Flow, group_rows, stage_comms
from ..errors import UsageError
from ..parallel import (
    agree,
    allgather,
    allgather_array,
    allreduce,
    barrier,
    bcast,
    idle_barrier,
    phase,
)
from ..partition import (
    default_batch_rows,
    head_layers,
    stage_layers,
    stage_layout,
    stage_offsets,
)
from ..reporting.pipeline import dedup_section, pipeline_section, stage_events
from ..weights import as_store
from .dedup import Dedup
from .engine import InferenceResult
from .options import InferOptions
from .overflow import check_overflow
from .runner import RowBlock, SliceRunner
from .slice_load import load_stage_head, load_stage_network, stage_depth, stage_slicer

# The split maths live in :mod:`mpisdnn.partition` and the slice loading in
# :mod:`mpisdnn.sdnn.slice_load`; their names stay importable from here, the stage flow's module.
__all__ = [
    "head_layers",
    "stage_depth",
    "load_stage_head",
    "stage_layout",
    "stage_layers",
    "default_batch_rows",
    "load_stage_network",
    "stage_slicer",
    "run_pipeline",
]


@dataclass(frozen=True)
class _Job:
    """What every part of one run of :func:`run_pipeline` shares (set up once)."""

    comm: object
    be: object
    #: The options, the weight budget resolved over every rank of the node.
    opts: InferOptions
    stages: int
    total: int
    neurons: int
    #: One past the largest global row id (:meth:`RowBlock.id_end`).
    id_end: int
    #: The DNN edges of the layers run (the rate's numerator) and this rank's input nnz.
    edges: int
    in_nnz: int


class _Stage:
    """One rank's stage: a :class:`~mpisdnn.sdnn.runner.SliceRunner` over its layers
    ``[k0, k1)``, run once per micro-batch. Its collectives (group lengths, re-balancing,
    checks for identical rows) go over ``peers``, the ranks of the same stage in every data
    group, which run the same number of batches. ``balancing``: whether rows may move
    between groups (only when the groups' blocks are in rank order: moves keep the global
    row order then). ``carried``: the statistics of the stage this one replaces."""

    def __init__(self, peers, job, store, opts, k0, balancing, carried=None):
        self.runner = SliceRunner(peers, job.be, store, opts, first=k0, total=job.total,
                                  balancing=balancing, carried=carried)  # fmt: skip
        self.peers, self.job, self.store, self.opts = peers, job, store, opts
        self.k0, self.k1, self.balancing = int(k0), int(k0) + len(store), balancing
        self.nl = len(store)
        self.busy = 0.0
        #: Checks for identical rows by global layer: [live rows, distinct rows, seconds].
        self.checks: dict = {}
        if self.nl:
            self.runner.open()

    def moved(self, store, k0):
        """This stage on layers ``[k0, k0 + len(store))`` instead (collective over its
        peers, which move alike), keeping the statistics of the batches run so far."""
        self.runner.close()
        new = _Stage(self.peers, self.job, store, self.opts, k0, self.balancing,
                     carried=self.runner.stats())  # fmt: skip
        new.busy, new.checks = self.busy, self.checks
        return new

    def compute(self, gid, m, state, t_start):
        """All of this stage's layers on one batch; returns its live rows ``(gid, csr)``
        and the merges of identical rows to go on with (``state``: the previous stage's,
        ``None`` at the first). Kept rows stay merged to the end: the categories are found
        on them, and the final Y is expanded after the timed part (as ``--stages 1`` does)."""
        run, opts = self.runner, self.opts
        if self.nl == 0 or (gid.size == 0 and self.peers.size == 1):
            # A stage left without layers (more stages than layers to run) only forwards,
            # and so does one without rows and without peers to take decisions with.
            return gid, m, state
        t0 = time.perf_counter()
        # A batch's merges go along with it from stage to stage (rows stay merged, the
        # checks keep their schedule); batches never merge with each other.
        dd = Dedup(self.peers, self.job.id_end, opts.dedup, self.k0, opts.first_group)
        if state is not None:
            dd.adopt(state)
        rows = gid.size
        parts = run.run(run.split(sp.csr_matrix(m, dtype=np.float32), gid), t_start, dedup=dd)
        y, gid = run.gather_host(parts)
        for c in dd.checks:
            got = self.checks.setdefault(c["after_layer"], [0, 0, 0.0])
            got[0], got[1] = got[0] + c["live_rows"], got[1] + c["distinct_rows"]
            got[2] += c["seconds"]
        out = gid, y, dd.handoff()
        if rows:  # an empty batch only joins its peers' decisions: waiting, not work
            self.busy += time.perf_counter() - t0
        return out

    def close(self) -> None:
        """Let go of the prepared weights."""
        self.runner.close()


class _Head:
    """The head: global layers ``[first, stop)`` run data-parallel on every rank's rows before
    the stages (:func:`run_pipeline`), in a :class:`~mpisdnn.sdnn.runner.SliceRunner` over
    all ranks, with re-balancing and checks for identical rows as ``--stages 1`` has them."""

    def __init__(self, runner, parts, store):
        self.runner, self.parts, self.store = runner, parts, store
        self.first, self.stop = runner.first, runner.stop
        self.seconds = 0.0

    @classmethod
    @phase("setup")
    def of(cls, job, store, first, rows, tail_layers, progress=None):
        """The head prepared (untimed) and the options left to the stages: the weight
        budget is shared between the head and the stage slice by their layer counts (a
        rank holds both). Returns ``(head, stage options)``."""
        nh, opts = len(store), job.opts
        budget = int(opts.weight_memory)
        head_budget = max(1, budget * nh // (nh + max(1, tail_layers)))
        runner = SliceRunner(job.comm, job.be, store, opts.replace(weight_memory=head_budget),
                             first=int(first), total=job.total, progress=progress)  # fmt: skip
        parts = runner.begin(rows, job.id_end)
        tail = opts.replace(weight_memory=max(1, budget - head_budget))
        return cls(runner, parts, store), tail

    def run(self, t_start):
        """The head's layers (collective over every rank); returns this rank's survivors
        ``(gid, csr)`` and the head's :class:`Dedup` (every rank's merges, the same on all;
        ``None`` without checks), whose :meth:`Dedup.handoff` gives each micro-batch its
        share."""
        run, t0 = self.runner, time.perf_counter()
        parts = run.run(self.parts, t_start)
        self.parts = None
        run.close()
        y, gid = run.gather_host(parts)
        self.seconds = time.perf_counter() - t0
        return gid, y, run.dedup if run.dedup.enabled else None

    def checks(self) -> dict:
        """The head's checks for identical rows, by layer: ``[live, distinct, seconds]``."""
        return {c["after_layer"]: [c["live_rows"], c["distinct_rows"], c["seconds"]]
                for c in self.runner.dedup.checks}  # fmt: skip


def run_pipeline(  # noqa: PLR0913 - keyword-only knobs of the stage flow's one entry point
    stage_store,
    y_local,
    comm,
    *,
    stages: int,
    k0: int,
    k1: int,
    total_layers: int,
    row_offset: int = 0,
    g_rows: int | None = None,
    batch_rows: int | None = None,
    options: InferOptions | None = None,
    backend=None,
    live_rows=None,
    block_rows: int | None = None,
    reslice=None,
    stage_bounds=None,
    head_store=None,
    head_first: int | None = None,
    progress=None,
) -> InferenceResult:
    """Run this rank's stage of the pipeline and gather the categories on every rank.

    Parameters
    ----------
    stage_store : Network or WeightStore
        Layers ``[k0, k1)`` of the network (this rank's stage; see :func:`load_stage_network`).
    y_local : scipy.sparse matrix
        This rank's block of Y0 (or its live rows when ``live_rows`` is given).
    comm : mpi4py communicator
    stages : int
        ``S``; ``comm.size`` must be a multiple of it.
    k0, k1, total_layers : int
        This stage's global layers and the network depth (layers before the first stage's
        ``k0`` were already run, by a checkpointed run).
    row_offset, g_rows : int
        Global index of this rank's block and the global number of inputs.
    batch_rows : int, optional
        Rows per micro-batch (default :func:`default_batch_rows`).
    options : InferOptions, optional
    backend : Backend, optional
    live_rows, block_rows : optional
        As in :func:`~mpisdnn.sdnn.engine.infer` (a resumed run).
    reslice : callable, optional
        ``reslice(k0, k1)`` -> this rank's store of global layers ``[k0, k1)``
        (:func:`stage_slicer`; called only where the stage moves, errors agreed). Given,
        the stages are balanced by work: the first micro-batch runs on the split it was
        called with, its measured seconds per layer (summed over the ranks) are the work
        profile, :func:`~mpisdnn.partition.balanced_layers` splits it, and every stage
        whose layers change takes its new slice before the other batches. Without it the
        split stays as given.
    stage_bounds : sequence of int, optional
        With ``reslice``: the ``S + 1`` layer offsets to move to after the first batch,
        instead of those planned from its profile.
    head_store : Network or WeightStore, optional
        Global layers ``[head_first, first stage's k0)`` on every rank (see
        :func:`load_stage_head`): run data-parallel on each rank's rows before the stages
        (with re-balancing and checks for identical rows over all ranks); then each group's
        survivors, and their merges, go through the stages. ``None``: no head.
    head_first : int, optional
        Global index of ``head_store``'s first layer.
    progress : callable, optional
        As in :func:`~mpisdnn.sdnn.engine.infer`, called after each layer of the head (the
        stages run their layers batch by batch, and print none).

    Returns
    -------
    InferenceResult
        As :func:`~mpisdnn.sdnn.engine.infer`: ``y_local`` is this rank's block of the final
        Y (sent back from the group's last stage); ``pipeline`` holds the stage statistics.
    """
    opts = options if options is not None else InferOptions()
    be = backend if backend is not None else backends.create(opts, comm)
    stage_layout(comm.size, stages)
    rows = RowBlock.of(comm, y_local, row_offset, g_rows, live_rows, block_rows)
    store = as_store(stage_store)
    hstore = as_store(head_store) if head_store is not None and len(head_store) else None
    check_overflow(comm, rows.y, [(store, k0, 0), (hstore, head_first or 0, 0)])
    job = _job(comm, be, opts, stages, total_layers, rows, store, hstore)
    head, tail_opts = None, job.opts
    if hstore is not None:
        head, tail_opts = _Head.of(job, hstore, head_first, rows, len(store), progress)
    with stage_comms(comm, stages) as (sub, peers):
        with phase("setup"):
            st = _Stage(peers, job, store, tail_opts, k0, rows.in_rank_order)
        flow, nbatches, t_start = _flow(job, sub, st, head, rows, batch_rows)
        st, stats = _timed(job, flow, st, nbatches, reslice, stage_bounds, t_start)
        st.close()
    return _result(job, rows, flow, st, head, stats)


@phase("setup")
def _job(comm, be, opts, stages, total, rows, store, hstore) -> _Job:
    """The run's shared set-up (collective): the edges run, the weight budget decided over
    every rank of the node (not over a stage's peers), the largest row id."""
    edges = allreduce(comm, int(store.edges) if comm.rank < stages else 0, "sum")
    if hstore is not None:
        edges += int(hstore.edges)
    opts = opts.resolved(comm)  # over every rank of the node, not a stage's peers
    return _Job(comm, be, opts, int(stages), int(total), int(store.neurons), rows.id_end(comm),
                int(edges), int(rows.y.nnz))  # fmt: skip


@phase("stage_handoff")
def _flow(job, sub, st, head, rows, batch_rows):
    """The group's flow, ready to run (collective): the head run first when there is one
    (its start starts the timed part), then the group's rows gathered on its stage 0 and
    cut into micro-batches. Returns ``(flow, batches, t_start or None)``."""
    comm, stages = job.comm, job.stages
    t_start = None
    if head is not None:
        barrier(comm)
        t_start = time.perf_counter()
        gid, y_host, merges = head.run(t_start)
    else:
        gid, y_host, merges = rows.gid, rows.y, None
    stage = comm.rank % stages
    gid, y_host, nrows = group_rows(sub, stage, gid, y_host)
    rows.release()  # the group's rows are on its stage 0 now
    batch = int(batch_rows) if batch_rows else default_batch_rows(nrows, stages)
    # Every group runs as many batches (some empty): a stage's collectives span groups.
    nbatches = allreduce(comm, max(1, -(-nrows // batch)), "max")
    return Flow(sub, stage, stages, gid, y_host, batch, job.neurons, merges), nbatches, t_start


@phase("stage_handoff")
def _timed(job, flow, st, nbatches, reslice, stage_bounds, t_start=None):
    """The timed part: every micro-batch of the group, with the stages balanced by work
    after the first when ``reslice`` is given (:func:`run_pipeline`). ``t_start``: when the
    timed part began (the head's start; default now). Returns the stage (moved or not) and
    the statistics."""
    comm, stages = job.comm, job.stages
    first = allreduce(comm, st.k0, "min")
    bounds = [stage_layers(s, stages, first, job.total) for s in range(stages)]
    split = {"by": "layers"}
    if t_start is None:
        barrier(flow.sub)
        t_start = time.perf_counter()
    rest = range(nbatches)
    if reslice is not None and stages > 1 and nbatches > 1:
        flow.run(partial(st.compute, t_start=t_start), range(1))
        t0 = time.perf_counter()
        st, bounds = _rebound(job, st, reslice, first, stage_bounds)
        split = {"by": "work", "pilot_batches": 1,
                 "seconds": allreduce(comm, time.perf_counter() - t0, "max")}  # fmt: skip
        rest = range(1, nbatches)
    flow.run(partial(st.compute, t_start=t_start), rest)
    seconds = time.perf_counter() - t_start
    idle_barrier(flow.sub)
    stats = {"seconds": seconds, "bytes_sent": flow.sent, "stage_layers": bounds, "split": split,
             "batches": nbatches}  # fmt: skip
    return st, stats


def _rebound(job, st, reslice, first, stage_bounds):
    """Stage boundaries balanced by the work measured so far (collective); this rank's
    stage moves to its new layers. Returns ``(stage, [(k0, k1) per stage])``."""
    comm, stages = job.comm, job.stages
    idle_barrier(comm)  # the last stage is still on the first batch
    if stage_bounds is None:
        # The seconds each layer took on the pilot batch, summed over the groups (a layer
        # ran on the ranks of its stage only). Rank 0 plans: every rank gets the same cut.
        profile = allreduce(comm, np.asarray(st.runner.stats().l_sec, np.float64), "sum")
        offsets = None
        if comm.rank == 0:
            offsets = stage_offsets(profile[first:], stages, first, job.total)
        offsets = bcast(comm, offsets, root=0)
    else:
        offsets = [int(b) for b in stage_bounds]
        if len(offsets) != stages + 1 or offsets[0] != first or offsets[-1] != job.total:
            raise UsageError(f"stage bounds {offsets}: want {stages + 1} offsets {first}..")
    stage = comm.rank % stages
    k0, k1 = int(offsets[stage]), int(offsets[stage + 1])
    moves = (k0, k1) != (st.k0, st.k1)
    with phase("load"):
        store = agree(comm, lambda: reslice(k0, k1) if moves else None)
    if moves:
        st = st.moved(as_store(store), k0)
    return st, [(int(offsets[s]), int(offsets[s + 1])) for s in range(stages)]


@phase("gather")
def _result(job, rows, flow, st, head, stats) -> InferenceResult:
    """The run's result (collective): categories (part 2), the final rows sent home
    (untimed, as ``--stages 1``: every kept row expanded to the inputs it stands for) and
    the statistics."""
    comm, run = job.comm, st.runner.stats()
    part1 = allreduce(comm, stats["seconds"], "max")
    categories, part2, merges = _categories(comm, flow.finals, job.id_end)
    gid, y_final = _final_rows(flow.finals, merges, job.neurons)
    stage_ranges = [list(b) for b in stats["stage_layers"]]
    head_range = None if head is None else [head.first, head.stop]
    head_seconds = 0.0 if head is None else head.seconds
    section = {"stages": job.stages, "data_groups": comm.size // job.stages,
               "batch_rows": int(flow.batch),
               "batches_per_group": allgather(comm, int(stats["batches"])),
               "stage_layers": stage_ranges, "split": stats["split"], "head_layers": head_range,
               "head_seconds": allreduce(comm, head_seconds, "max")}  # fmt: skip
    weights = _weight_bytes(st.store) + (0 if head is None else _weight_bytes(head.store))
    return InferenceResult(
        # Untimed: the last stage hands every row back to the rank whose block it came from.
        y_local=rows.home(comm, y_final, gid),
        **rows.result_fields(comm, categories),
        layers=job.total,
        edges=job.edges,
        part1=float(part1),
        part2=float(part2),
        rank_seconds=allgather(comm, float(stats["seconds"])),
        rank_nnz=allgather(comm, job.in_nnz),
        backend=job.be.describe(),
        groups=([head_range] if head is not None else []) + stage_ranges,
        rebalance_threshold=run.threshold,
        memory=run.memory_statistics(comm),
        # The head ran on every rank before the stages: busy, as the stages' batches are.
        pipeline=pipeline_section(
            section, allgather(comm, st.busy + head_seconds), part1,
            allgather(comm, int(stats["bytes_sent"])), allgather(comm, int(weights)),
        ),  # fmt: skip
        **_layer_fields(job, st, head),
    )


def _merges(comm, id_end, state):
    """A :class:`Dedup` holding the merges ``state`` (:meth:`Dedup.handoff`), or ``None``
    when no row stands for others."""
    if state is None:
        return None
    dd = Dedup(comm, id_end)
    dd.adopt(state)
    return dd if dd.active else None


def _categories(comm, finals, id_end):
    """The categories (collective), the part-2 seconds and each batch's merges from the
    last stages' kept rows ``finals`` (``(gid, csr, merges)`` per batch): a kept row with a
    non-zero sum is a category for every input it stands for."""
    t1 = time.perf_counter()
    found, merges = [np.zeros(0, np.int64)], []
    for gid, y, state in finals:
        merges.append(_merges(comm, id_end, state))
        reps = gid[np.asarray(y.sum(axis=1)).ravel() != 0] if y.shape[0] else gid[:0]
        found.append(reps if merges[-1] is None else merges[-1].expand_ids(reps))
    local = np.concatenate(found).astype(np.int64) + 1
    categories = np.sort(allgather_array(comm, local))
    return categories, allreduce(comm, time.perf_counter() - t1, "max"), merges


def _final_rows(finals, merges, neurons):
    """This rank's final rows, each kept row expanded to the inputs it stands for
    (``merges``: each batch's, from :func:`_categories`): ``(gid, csr)`` (local)."""
    gids, mats = [], []
    for (gid, y, _), dd in zip(finals, merges):
        y, gid = (y, gid) if dd is None else dd.expand_rows(y, gid)
        gids.append(np.asarray(gid, np.int64))
        mats.append(sp.csr_matrix(y, dtype=np.float32))
    if not mats:
        return np.zeros(0, np.int64), sp.csr_matrix((0, neurons), dtype=np.float32)
    return np.concatenate(gids), sp.vstack(mats, format="csr", dtype=np.float32)


def _layer_fields(job, st, head) -> dict:
    """The result's per-layer statistics, re-balancings and checks for identical rows
    (collective). The head's layers ran on every rank, the stages' on one stage per group:
    disjoint layers, so the statistics add up."""
    comm, run = job.comm, st.runner.stats()
    hrun = None if head is None else head.runner.stats()

    def both(name):
        return getattr(run, name) + (0 if hrun is None else getattr(hrun, name))

    # The checks of data group 0 only (a stage's peers agreed on the same sums); every rank
    # knows the head's.
    checks = dict(st.checks) if comm.rank < job.stages else {}
    if head is not None and comm.rank == 0:
        checks.update(head.checks())
    # A stage's peers hold the same re-balancings: the ranks of group 0 give them.
    events = stage_events(allgather(comm, list(run.events) if comm.rank < job.stages else []))
    return {
        "layer_nnz": allreduce(comm, both("l_nnz"), "sum").tolist(),
        "layer_active_rows": allreduce(comm, both("l_active"), "sum").tolist(),
        "layer_seconds": allreduce(comm, both("l_sec"), "max").tolist(),
        "rebalances": ([] if hrun is None else list(hrun.events)) + events,
        "dedup": dedup_section(job.opts.dedup, allgather(comm, checks)),
    }


def _weight_bytes(store) -> int:
    got = store.weight_bytes()
    if got:
        return int(got)
    total = 0
    for k in range(len(store)):
        layer = store.layer(k)
        total += layer.rows.nbytes + (0 if layer.values is None else layer.values.nbytes)
        total += 0 if layer.colptr is None else layer.colptr.nbytes
    return total
