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

import os
import time

import numpy as np
import scipy.sparse as sp

from .. import backends
from ..errors import InputError, ShapeError, UsageError, shown
from ..parallel import agree, allgather_array, allreduce
from ..partition import balanced_layers
from ..weights import as_store
from .dedup import Dedup
from .engine import InferenceResult
from .options import InferOptions
from .runner import RowBlock, SliceRunner

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

#: Micro-batches per stage a default batch size aims for: the fill and drain bubble is
#: ``(S - 1) / (batches + S - 1)`` of the run, about 10 % at this many.
BATCHES_PER_STAGE = 8
#: Most layers of the default head (:func:`head_layers`): the survivors of the challenge
#: networks have settled, and merged, after about 20 layers at N=1024 and 40-48 at N=65536
#: (docs/performance.md); on a 1,920-layer network 64 layers are 3 % of the weights.
HEAD_LAYERS = 64
#: Smallest default batch: below this per-batch overheads (conversion, messages) dominate.
MIN_BATCH_ROWS = 256
#: The stages move only when the busiest one's measured work falls by more than this share.
MIN_GAIN = 0.05
#: Sends a stage keeps in flight before waiting for the oldest (bounds buffer memory).
MAX_IN_FLIGHT = 4
#: Seconds a stage sleeps between looks while it waits for a batch or its peers. MPI's
#: blocking calls spin: a waiting stage would take the core from a working one wherever
#: ranks share cores (more ranks than cores, or a loaded node).
IDLE_SLEEP = 1e-4
_TAG = 7311


def stage_layout(size: int, stages: int) -> int:
    """Data groups ``D`` for ``size`` ranks in ``stages`` stages; raises unless ``S`` divides."""
    if stages < 1:
        raise UsageError(f"--stages must be >= 1, got {stages}")
    if size % stages:
        raise UsageError(
            f"--stages {stages} needs a rank count that is a multiple of {stages} "
            f"(ranks = stages x data groups), got {size} ranks"
        )
    return size // stages


def stage_layers(stage: int, stages: int, first: int, stop: int) -> tuple[int, int]:
    """Global layers ``[k0, k1)`` of ``stage`` when layers ``[first, stop)`` are to run."""
    n = stop - first
    return first + stage * n // stages, first + (stage + 1) * n // stages


def head_layers(stages: int, first: int, total: int, asked: int | None = None) -> int:
    """Layers run data-parallel before the stages when layers ``[first, total)`` are to run.

    ``asked``: the number wanted (``0``: none, a plain pipeline); ``None``: the default,
    ``min(HEAD_LAYERS, (total - first) // (2 stages))``, so that no rank holds more than 1.5x
    its even share of the layers. One stage has no head (every layer is data-parallel).
    Raises :class:`UsageError` when ``asked`` is negative or more than the layers to run.
    """
    n = max(0, int(total) - int(first))
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or not 0 <= asked <= n:
            raise UsageError(f"--stage-head must be between 0 and the {n} layers to run, "
                             f"got {shown(asked)}")  # fmt: skip
        return 0 if stages == 1 else int(asked)
    return 0 if stages == 1 else min(HEAD_LAYERS, n // (2 * stages))


def default_batch_rows(group_rows: int, stages: int) -> int:
    """Rows per micro-batch: about :data:`BATCHES_PER_STAGE` batches per stage."""
    want = -(-max(1, group_rows) // (BATCHES_PER_STAGE * stages))
    return max(min(MIN_BATCH_ROWS, max(1, group_rows)), want)


def _total_layers(source, layers):
    from ..formats import hdf5, tsv

    source = os.fspath(source)
    if os.path.isdir(source):
        _, present = tsv._scan_network_dir(source)
        found = 0
        while found + 1 in present:
            found += 1
    elif hdf5.is_hdf5(source):
        found = int(hdf5.read_network_meta(source)["layers"])
    else:
        raise InputError(f"{source}: network file or directory not found (or not HDF5)")
    if layers is not None:
        if layers > found:
            raise ShapeError(f"{source}: asked for {layers} layers, the network has {found}")
        return int(layers)
    return found


def stage_depth(comm, source, layers=None) -> int:
    """The depth a staged run of ``source`` runs (``layers``, or all the network's layers;
    collective, errors agreed)."""
    return int(agree(comm, _total_layers, source, layers))


def load_stage_head(comm, source, total, first, stop, bias=None, weight_memory=None,
                    prepared_bytes=None):  # fmt: skip
    """Global layers ``[first, stop)`` of a ``total``-layer run, held on every rank as
    :func:`load_stage_network` holds a slice (collective; errors agreed): the head that
    :func:`run_pipeline` runs data-parallel before the stages."""
    return agree(comm, _read_slice, source, total, first, stop, bias, weight_memory,
                 prepared_bytes)  # fmt: skip


def load_stage_network(
    comm, source, stages, layers=None, bias=None, first_layer=0, weight_memory=None,
    prepared_bytes=None, total=None,
):  # fmt: skip
    """Read only this rank's stage slice of the network (collective; errors agreed).

    Weights are held the way :func:`~mpisdnn.sdnn.load.load_network` holds them: a v2 HDF5
    slice is mapped, a v1 slice that would not fit ``weight_memory`` is streamed in blocks
    (:class:`~mpisdnn.sdnn.streaming.StreamingStore`), the rest is read. The slice is the
    even split :func:`stage_layers`; :func:`run_pipeline` may move it once it has measured
    where the work is (see :func:`stage_slicer`). ``total``: the depth when the caller
    already has it from :func:`stage_depth` (not read again).

    Returns
    -------
    (network, k0, k1, total_layers)
        ``network`` holds global layers ``[k0, k1)``; ``total_layers`` is the depth run.
    """
    if total is None:
        total = stage_depth(comm, source, layers)
    k0, k1 = stage_layers(comm.rank % stages, stages, first_layer, total)
    store = agree(comm, _read_slice, source, total, k0, k1, bias, weight_memory, prepared_bytes)
    return store, k0, k1, total


def _read_slice(source, total, k0, k1, bias, weight_memory, prepared_bytes):
    """Global layers ``[k0, k1)`` of ``source`` (a ``total``-layer run), held as
    :func:`load_stage_network` describes."""
    from ..formats import hdf5, tsv

    if os.path.isdir(os.fspath(source)):
        return tsv.read_network_tsv(source, layers=k1, bias=bias, layer_start=k0)
    if hdf5.network_version(source) == 2:
        from ..formats.weight_store import open_weight_store

        return open_weight_store(source, total, layer_start=k0, layer_stop=k1)
    if weight_memory is not None and k1 > k0:
        from .load import streaming_store

        store = streaming_store(source, total, weight_memory, prepared_bytes, k0, k1)
        if store is not None:
            return store
    return hdf5.read_network(source, total, k0, k1)


def stage_slicer(source, total, bias=None, weight_memory=None, prepared_bytes=None, first=0):
    """What :func:`run_pipeline` calls to move this rank's stage to other layers:
    ``slicer(k0, k1)`` gives global layers ``[k0, k1)`` of ``source`` held as
    :func:`load_stage_network` holds them (called only on the ranks whose stage moves; the
    caller agrees on errors). Call it after :func:`load_stage_network` (setup, untimed).

    A v2 HDF5 network is mapped here once for all layers ``[first, total)`` (not validated
    again: the stages' slices at load covered every one of them), so moving a stage costs
    no I/O; a v1 slice is read (or streamed) again when it moves. Returns ``None`` for a TSV
    directory: parsing a slice again would cost more than the balance gains, so a TSV
    network keeps the even split.
    """
    from ..formats import hdf5

    if os.path.isdir(os.fspath(source)):
        return None
    if hdf5.network_version(source) == 2:
        from ..formats.weight_store import HDF5WeightStore

        whole = HDF5WeightStore(source, total, first, total, validate=False)
        return lambda k0, k1: whole.slice(k0 - first, k1 - first)

    def slicer(k0, k1):
        return _read_slice(source, total, k0, k1, bias, weight_memory, prepared_bytes)

    return slicer


def _pack(gid, m, state) -> np.ndarray:
    """One byte buffer: ``[rows, nnz, state size]`` then gid, indptr (int64), indices
    (int32), data, and the merges of identical rows (:meth:`Dedup.handoff`, int64)."""
    state = np.zeros(0, np.int64) if state is None else state
    head = np.array([gid.size, m.nnz, state.size], dtype=np.int64)
    parts = [
        head,
        np.ascontiguousarray(gid, np.int64),
        np.ascontiguousarray(m.indptr, np.int64),
        np.ascontiguousarray(m.indices, np.int32),
        np.ascontiguousarray(m.data, np.float32),
        np.ascontiguousarray(state, np.int64),
    ]
    return np.concatenate([p.view(np.uint8) for p in parts])


def _unpack(buf, neurons):
    rows, nnz, nstate = (int(v) for v in buf[:24].view(np.int64))
    o = 24
    gid = buf[o : o + 8 * rows].view(np.int64)
    o += 8 * rows
    indptr = buf[o : o + 8 * (rows + 1)].view(np.int64)
    o += 8 * (rows + 1)
    indices = buf[o : o + 4 * nnz].view(np.int32)
    o += 4 * nnz
    data = buf[o : o + 4 * nnz].view(np.float32)
    o += 4 * nnz
    state = buf[o : o + 8 * nstate].view(np.int64) if nstate else None
    return gid, sp.csr_matrix((data, indices, indptr), shape=(rows, neurons)), state


class _Stage:
    """One rank's stage: a :class:`~mpisdnn.sdnn.runner.SliceRunner` over its layers, run
    once per micro-batch. Its collectives (group lengths, re-balancing, checks for
    identical rows) go over ``peers``, the ranks of the same stage in every data group,
    which run the same number of batches."""

    def __init__(self, peers, be, store, opts, k0, total, id_end):
        self.runner = SliceRunner(peers, be, store, opts, first=k0, total=total)
        self.nl = len(store)
        self.id_end = int(id_end)
        self.busy = 0.0
        #: Checks for identical rows by global layer: [live rows, distinct rows, seconds].
        self.checks: dict = {}
        if self.nl:
            self.runner.open()

    def moved(self, store, k0):
        """This stage on layers ``[k0, k0 + len(store))`` instead (collective over its
        peers, which move alike), keeping the statistics of the batches run so far."""
        old = self.runner
        old.close()
        new = _Stage(old.comm, old.be, store, old.opts, k0, old.total, self.id_end)
        run = new.runner
        for name in ("l_nnz", "l_active", "l_work", "l_sec"):
            getattr(run, name)[:] += getattr(old, name)
        run.groups[:0], run.events[:0] = old.groups, old.events
        run.prepare_loop += old.prepare_loop
        run.max_batches = max(run.max_batches, old.max_batches)
        run.act_peak = max(run.act_peak, old.act_peak)
        run.balancing = run.balancing and old.balancing
        new.busy, new.checks = self.busy, self.checks
        return new

    def compute(self, gid, m, state, t_start):
        """All of this stage's layers on one batch; returns its live rows ``(gid, csr)``
        and the merges of identical rows to go on with (``state``: the previous stage's,
        ``None`` at the first). Kept rows stay merged to the end: the categories are found
        on them, and the final Y is expanded after the timed part (as ``--stages 1`` does)."""
        run, opts = self.runner, self.runner.opts
        if self.nl == 0 or (gid.size == 0 and run.comm.size == 1):
            # A stage left without layers (more stages than layers to run) only forwards,
            # and so does one without rows and without peers to take decisions with.
            return gid, m, state
        t0 = time.perf_counter()
        # A batch's merges go along with it from stage to stage (rows stay merged, the
        # checks keep their schedule); batches never merge with each other.
        run.dd = Dedup(run.comm, self.id_end, opts.dedup, run.first, opts.first_group)
        if state is not None:
            run.dd.adopt(state)
        rows = gid.size
        parts = run.run(run.split(sp.csr_matrix(m, dtype=np.float32), gid), t_start)
        y, gid = run.gather_host(parts)
        for c in run.dd.checks:
            got = self.checks.setdefault(c["after_layer"], [0, 0, 0.0])
            got[0], got[1] = got[0] + c["live_rows"], got[1] + c["distinct_rows"]
            got[2] += c["seconds"]
        out = gid, y, run.dd.handoff()
        if rows:  # an empty batch only joins its peers' decisions: waiting, not work
            self.busy += time.perf_counter() - t0
        return out


def run_pipeline(
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
    groups = stage_layout(comm.size, stages)
    stage, group = comm.rank % stages, comm.rank // stages
    store = as_store(stage_store)
    neurons = int(store.neurons)
    rows = RowBlock.of(comm, y_local, row_offset, g_rows, live_rows, block_rows)
    hstore = as_store(head_store) if head_store is not None and len(head_store) else None
    edges = comm.allreduce(int(store.edges) if group == 0 else 0)
    if hstore is not None:
        edges += int(hstore.edges)
    if opts.weight_memory is None:
        from .streaming import default_weight_memory

        # Decided over every rank of the node, not over a stage's peers.
        opts = opts.replace(weight_memory=default_weight_memory(comm))
    in_nnz, id_end = int(rows.y.nnz), rows.id_end(comm)
    head, tail_opts = None, opts
    if hstore is not None:
        head, tail_opts = _Head.of(comm, be, hstore, opts, head_first, total_layers, rows,
                                   id_end, len(store), progress)  # fmt: skip
    sub = comm.Split(group, stage)
    peers = comm.Split(stage, group)
    try:
        st = _Stage(peers, be, store, tail_opts, k0, total_layers, id_end)
        # Moves between groups keep the global row order, which needs the groups' blocks
        # in rank order.
        st.runner.balancing = st.runner.balancing and rows.in_rank_order
        t_start = None
        if head is not None:
            comm.Barrier()
            t_start = time.perf_counter()
            gid, y_host, merges = head.run(t_start)
            st.busy += head.seconds
        else:
            gid, y_host, merges = rows.gid, rows.y, None
        gid, y_host, nrows = _group_rows(sub, stage, gid, y_host)
        rows.y = None  # the group's rows are on its stage 0 now
        batch = int(batch_rows) if batch_rows else default_batch_rows(nrows, stages)
        # Every group runs as many batches (some empty): a stage's collectives span groups.
        nbatches = allreduce(comm, max(1, -(-nrows // batch)), "max")
        flow = _Flow(sub, stage, stages, gid, y_host, batch, neurons, merges)
        st, stats = _timed(comm, flow, st, nbatches, reslice, stage_bounds, t_start)
        st.runner.close()
    finally:
        sub.Free()
        peers.Free()
    part1 = allreduce(comm, stats["seconds"], "max")

    categories, part2, merges = _categories(comm, flow.finals, id_end)
    # Untimed, as --stages 1: every kept row expanded to the inputs it stands for.
    gid, y_final = _final_rows(flow.finals, merges, neurons)
    run = st.runner
    stage_ranges = [list(b) for b in stats["stage_layers"]]
    head_range = None if head is None else [head.first, head.stop]
    section = {"stages": int(stages), "data_groups": int(groups), "batch_rows": int(batch),
               "batches_per_group": comm.allgather(int(nbatches)),
               "stage_layers": stage_ranges, "split": stats["split"], "head_layers": head_range,
               "head_seconds": allreduce(comm, head.seconds if head else 0.0, "max")}  # fmt: skip
    weights = _weight_bytes(run.store) + (0 if head is None else _weight_bytes(hstore))
    return InferenceResult(
        # Untimed: the last stage hands every row back to the rank whose block it came from.
        y_local=rows.home(comm, y_final, gid),
        **rows.result_fields(comm, categories),
        layers=int(total_layers),
        edges=int(edges),
        part1=float(part1),
        part2=float(part2),
        rank_seconds=comm.allgather(float(stats["seconds"])),
        rank_nnz=comm.allgather(in_nnz),
        backend=be.describe(),
        groups=([head_range] if head is not None else []) + stage_ranges,
        rebalance_threshold=run.threshold,
        memory=run.memory_statistics(comm),
        pipeline=_pipeline_section(comm, section, st, stats, part1, weights),
        **_layer_fields(comm, opts, st, head, stage, group == 0),
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


def _layer_fields(comm, opts, st, head, stage, in_group0) -> dict:
    """The result's per-layer statistics, re-balancings and checks for identical rows
    (collective). The head's layers ran on every rank, the stages' on one stage per group:
    disjoint layers, so the statistics add up."""
    run = st.runner

    def both(name):
        return getattr(run, name) + (0 if head is None else getattr(head.runner, name))

    checks = dict(st.checks) if in_group0 else {}
    if head is not None and comm.rank == 0:  # every rank knows the head's checks
        checks.update(head.checks())
    events = _stage_events(comm, stage, run.events)
    return {
        "layer_nnz": allreduce(comm, both("l_nnz"), "sum").tolist(),
        "layer_active_rows": allreduce(comm, both("l_active"), "sum").tolist(),
        "layer_seconds": allreduce(comm, both("l_sec"), "max").tolist(),
        "rebalances": (head.runner.events if head is not None else []) + events,
        "dedup": _dedup_report(comm, opts, checks),
    }


class _Head:
    """The head: global layers ``[first, stop)`` run data-parallel on every rank's rows before
    the stages (:func:`run_pipeline`), in a :class:`~mpisdnn.sdnn.runner.SliceRunner` over
    all ranks, with re-balancing and checks for identical rows as ``--stages 1`` has them."""

    def __init__(self, runner, parts):
        self.runner, self.parts = runner, parts
        self.first, self.stop = runner.first, runner.stop
        self.seconds = 0.0

    @classmethod
    def of(cls, comm, be, store, opts, first, total, rows, id_end, tail_layers, progress=None):
        """The head prepared (untimed) and the options left to the stages: the weight
        budget is shared between the head and the stage slice by their layer counts (a
        rank holds both). Returns ``(head, stage options)``."""
        nh = len(store)
        budget = int(opts.weight_memory)
        head_budget = max(1, budget * nh // (nh + max(1, tail_layers)))
        runner = SliceRunner(comm, be, store, opts.replace(weight_memory=head_budget),
                             first=int(first), total=total, progress=progress)  # fmt: skip
        parts = runner.begin(rows, id_end)
        tail = opts.replace(weight_memory=max(1, budget - head_budget))
        return cls(runner, parts), tail

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
        return gid, y, run.dd if run.dd.enabled else None

    def checks(self) -> dict:
        """The head's checks for identical rows, by layer: ``[live, distinct, seconds]``."""
        return {c["after_layer"]: [c["live_rows"], c["distinct_rows"], c["seconds"]]
                for c in self.runner.dd.checks}  # fmt: skip


def _group_rows(sub, stage, gid, y_host):
    """The group's rows on its stage 0, in global row order (setup, like loading); returns
    ``(gid, rows, number of rows)`` (stage 0 holds them, the others only the count)."""
    got = sub.gather((gid, y_host), root=0)
    if stage == 0:
        gid = np.concatenate([g for g, _ in got])
        y_host = sp.vstack([m for _, m in got], format="csr", dtype=np.float32)
        order = np.argsort(gid, kind="stable")
        gid, y_host = gid[order], y_host[order]
    del got
    nrows = sub.bcast(int(gid.size) if stage == 0 else None, root=0)
    return gid, y_host, nrows


def _pipeline_section(comm, section, st, stats, part1, weights) -> dict:
    """The report's ``pipeline`` section (collective)."""
    stages, groups = section["stages"], section["data_groups"]
    busy = np.array(comm.allgather(st.busy))
    return {
        **section,
        "rank_stage": [r % stages for r in range(comm.size)],
        "rank_busy_seconds": busy.tolist(),
        "stage_busy_seconds": busy.reshape(groups, stages).max(axis=0).tolist(),
        "bubble_fraction": float(1.0 - busy.sum() / (comm.size * part1)) if part1 > 0 else 0.0,
        "rank_bytes_sent": comm.allgather(int(stats["bytes_sent"])),
        "rank_weight_bytes": comm.allgather(int(weights)),
    }


def _stage_events(comm, stage, events) -> list:
    """Every stage's re-balancings (collective): a stage's peers hold the same list."""
    got = comm.allgather(events if comm.rank == stage else [])
    return sorted((e for part in got for e in part), key=lambda e: e["after_layer"])


def _dedup_report(comm, opts, checks) -> dict:
    """Every stage's checks summed by layer (collective): rows merge within a batch. Pass
    the checks of data group 0 only (a stage's peers agreed on the same sums)."""
    merged: dict = {}
    for part in comm.allgather(checks):
        for k, (live, distinct, sec) in part.items():
            c = merged.setdefault(int(k), [0, 0, 0.0])
            c[0], c[1], c[2] = c[0] + live, c[1] + distinct, max(c[2], sec)
    return {
        "enabled": bool(opts.dedup),
        "within": "batch",
        "checks": [
            {"after_layer": k, "live_rows": c[0], "distinct_rows": c[1], "seconds": c[2]}
            for k, c in sorted(merged.items())
        ],
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


class _Flow:
    """One rank's part of its group's flow: receive, compute and forward micro-batches
    (stage 0 cuts them from the group's rows ``gid``/``y``; the last stage keeps them)."""

    def __init__(self, sub, stage, stages, gid, y, batch, neurons, merges=None):
        self.sub, self.stage, self.stages = sub, stage, stages
        self.gid, self.y, self.batch, self.neurons = gid, y, batch, neurons
        #: The head's :class:`Dedup` (stage 0; ``None`` without a head or checks).
        self.merges = merges
        self.finals: list = []
        self.sent = 0

    def run(self, st, batches, t_start):
        """Micro-batches ``batches`` (a range) through ``st``; returns once every send of
        them has completed."""
        from mpi4py import MPI

        sub, stage, batch = self.sub, self.stage, self.batch
        pending = []
        status = MPI.Status()
        for b in batches:
            if stage == 0:
                lo, hi = b * batch, min(self.gid.size, (b + 1) * batch)
                g, m = self.gid[lo:hi], self.y[lo:hi]
                state = None if self.merges is None else self.merges.handoff(g)
            else:
                while not sub.Iprobe(source=stage - 1, tag=_TAG, status=status):
                    time.sleep(IDLE_SLEEP)
                buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
                sub.Recv([buf, MPI.BYTE], source=stage - 1, tag=_TAG)
                g, m, state = _unpack(buf, self.neurons)
            g, m, state = st.compute(g, m, state, t_start)
            if stage == self.stages - 1:
                self.finals.append((np.array(g), sp.csr_matrix(m), state))
                continue
            out = _pack(g, m, state)
            self.sent += out.nbytes
            pending.append((sub.Isend([out, MPI.BYTE], dest=stage + 1, tag=_TAG), out))
            if len(pending) > MAX_IN_FLIGHT:
                _idle_wait(pending.pop(0)[0])
        for r, _ in pending:
            _idle_wait(r)


def _timed(comm, flow, st, nbatches, reslice, stage_bounds, t_start=None):
    """The timed part: every micro-batch of the group, with the stages balanced by work
    after the first when ``reslice`` is given (:func:`run_pipeline`). ``t_start``: when the
    timed part began (the head's start; default now). Returns the stage (moved or not) and
    the statistics."""
    stages = flow.stages
    first = allreduce(comm, int(st.runner.first), "min")
    total = st.runner.total
    bounds = [stage_layers(s, stages, first, total) for s in range(stages)]
    split = {"by": "layers"}
    if t_start is None:
        flow.sub.Barrier()
        t_start = time.perf_counter()
    rest = range(nbatches)
    if reslice is not None and stages > 1 and nbatches > 1:
        flow.run(st, range(1), t_start)
        t0 = time.perf_counter()
        st, bounds = _rebound(comm, st, reslice, stages, first, stage_bounds)
        split = {"by": "work", "pilot_batches": 1,
                 "seconds": allreduce(comm, time.perf_counter() - t0, "max")}  # fmt: skip
        rest = range(1, nbatches)
    flow.run(st, rest, t_start)
    seconds = time.perf_counter() - t_start
    _idle_wait(flow.sub.Ibarrier())
    stats = {"seconds": seconds, "bytes_sent": flow.sent, "stage_layers": bounds, "split": split}
    return st, stats


def _plan(profile, stages, first, total) -> list:
    """Stage offsets balanced by ``profile`` (seconds per layer from ``first``), or the
    even split when that is within :data:`MIN_GAIN` of as good (a move costs a few ms)."""
    even = [stage_layers(s, stages, first, total)[0] for s in range(stages)] + [total]
    cut = (balanced_layers(profile, stages) + first).tolist()
    cum = np.concatenate(([0.0], np.cumsum(profile)))

    def worst(offsets):
        return max(cum[b - first] - cum[a - first] for a, b in zip(offsets[:-1], offsets[1:]))

    return cut if worst(cut) < (1.0 - MIN_GAIN) * worst(even) else even


def _idle_wait(request) -> None:
    """Wait for ``request`` without spinning (see :data:`IDLE_SLEEP`)."""
    while not request.Test():
        time.sleep(IDLE_SLEEP)


def _rebound(comm, st, reslice, stages, first, stage_bounds):
    """Stage boundaries balanced by the work measured so far (collective); this rank's
    stage moves to its new layers. Returns ``(stage, [(k0, k1) per stage])``."""
    run = st.runner
    _idle_wait(comm.Ibarrier())  # the last stage is still on the first batch
    if stage_bounds is None:
        # The seconds each layer took on the pilot batch, summed over the groups (a layer
        # ran on the ranks of its stage only). Rank 0 plans: every rank gets the same cut.
        profile = allreduce(comm, np.asarray(run.l_sec, np.float64), "sum")
        offsets = None
        if comm.rank == 0:
            offsets = _plan(profile[first:], stages, first, run.total)
        offsets = comm.bcast(offsets, root=0)
    else:
        offsets = [int(b) for b in stage_bounds]
        if len(offsets) != stages + 1 or offsets[0] != first or offsets[-1] != run.total:
            raise UsageError(f"stage bounds {offsets}: want {stages + 1} offsets {first}..")
    stage = comm.rank % stages
    k0, k1 = int(offsets[stage]), int(offsets[stage + 1])
    moves = (k0, k1) != (run.first, run.stop)
    store = agree(comm, lambda: reslice(k0, k1) if moves else None)
    if moves:
        st = st.moved(as_store(store), k0)
    return st, [(int(offsets[s]), int(offsets[s + 1])) for s in range(stages)]
