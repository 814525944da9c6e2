"""Pipeline stages: ``S`` stages x ``D`` data groups, rows flowing through in micro-batches.

Rank ``r`` is stage ``r % S`` of data group ``r // S``, so a group's stages are neighbouring
ranks (on one node when the launcher fills nodes in order). Stage ``s`` holds only layers
``[s R / S, (s + 1) R / S)`` of the ``R`` layers to run. Group ``g`` takes the rows of Y0
that ranks ``g S .. g S + S - 1`` loaded (the union of ``S`` neighbouring nnz-balanced
blocks: one contiguous, nnz-balanced block per group); its stage 0 cuts them into
micro-batches of ``batch_rows`` rows, and every stage passes each batch, compacted to its
live rows (global ids plus CSR), to the next one with a non-blocking send while it starts on
the following batch. After ``S - 1`` batches every stage is busy.

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
from ..backends.base import empty_stats
from ..errors import InputError, ShapeError, UsageError
from ..parallel import agree, allgather_array, allreduce
from . import rebalance as rb
from .dedup import run_batch
from .engine import InferenceResult, _expand
from .options import InferOptions
from .weights import as_store

__all__ = [
    "stage_layout",
    "stage_layers",
    "default_batch_rows",
    "load_stage_network",
    "run_pipeline",
]

#: Micro-batches per stage a default batch size aims for: the fill and drain bubble is
#: ``(S - 1) / (batches + S - 1)`` of the run, about 10 % at this many.
BATCHES_PER_STAGE = 8
#: Smallest default batch: below this per-batch overheads (conversion, messages) dominate.
MIN_BATCH_ROWS = 256
#: Sends a stage keeps in flight before waiting for the oldest (bounds buffer memory).
MAX_IN_FLIGHT = 4
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


def load_stage_network(comm, source, stages, layers=None, bias=None, first_layer=0):
    """Read only this rank's stage slice of the network (collective; errors agreed).

    Returns
    -------
    (network, k0, k1, total_layers)
        ``network`` holds global layers ``[k0, k1)``; ``total_layers`` is the depth run.
    """
    from ..formats import hdf5, tsv

    total = agree(comm, _total_layers, source, layers)
    k0, k1 = stage_layers(comm.rank % stages, stages, first_layer, total)

    def read():
        if os.path.isdir(os.fspath(source)):
            return tsv.read_network_tsv(source, layers=k1, bias=bias, layer_start=k0)
        return hdf5.read_network(source, total, k0, k1)

    return agree(comm, read), k0, k1, total


def _pack(gid, m) -> np.ndarray:
    """One byte buffer: ``[rows, nnz]`` then gid, indptr (int64), indices (int32), data."""
    head = np.array([gid.size, m.nnz], dtype=np.int64)
    parts = [
        head,
        np.ascontiguousarray(gid, np.int64),
        np.ascontiguousarray(m.indptr, np.int64),
        np.ascontiguousarray(m.indices, np.int32),
        np.ascontiguousarray(m.data, np.float32),
    ]
    return np.concatenate([p.view(np.uint8) for p in parts])


def _unpack(buf, neurons):
    rows, nnz = (int(v) for v in buf[:16].view(np.int64))
    o = 16
    gid = buf[o : o + 8 * rows].view(np.int64)
    o += 8 * rows
    indptr = buf[o : o + 8 * (rows + 1)].view(np.int64)
    o += 8 * (rows + 1)
    indices = buf[o : o + 4 * nnz].view(np.int32)
    o += 4 * nnz
    data = buf[o : o + 4 * nnz].view(np.float32)
    return gid, sp.csr_matrix((data, indices, indptr), shape=(rows, neurons))


class _Stage:
    """One rank's stage: its prepared layers and the per-batch computation."""

    def __init__(self, be, store, opts, k0, nlayers_total):
        self.be, self.opts, self.k0 = be, opts, k0
        self.store = store
        self.nl = len(store)
        self.net = be.prepare_network(store)
        be.warmup(self.net)
        self.glen = opts.max_group if be.fuses_layers else max(1, self.nl)
        self.l_nnz = np.zeros(nlayers_total, np.int64)
        self.l_active = np.zeros(nlayers_total, np.int64)
        self.l_sec = np.zeros(nlayers_total, np.float64)
        self.busy = 0.0
        #: Checks for identical rows by global layer: [live rows, distinct rows, seconds].
        self.checks: dict = {}

    def compute(self, gid, m):
        """All of this stage's layers on one batch; returns its live rows ``(gid, csr)``."""
        t0 = time.perf_counter()
        be = self.be
        if gid.size == 0 or self.nl == 0:
            # A stage left without layers (more stages than layers to run) only forwards.
            return gid, m
        if self.opts.dedup:
            gid, out = self._compute_dedup(gid, m)
        else:
            gid, out = self._compute(gid, m)
        be.synchronize()
        dt = time.perf_counter() - t0
        self.busy += dt
        work = self.l_nnz[self.k0 : self.k0 + self.nl].astype(np.float64)
        share = work / work.sum() if work.sum() > 0 else np.full(self.nl, 1.0 / self.nl)
        self.l_sec[self.k0 : self.k0 + self.nl] += dt * share
        return gid, sp.csr_matrix(out)

    def _compute_dedup(self, gid, m):
        """The batch with identical rows computed once (:func:`~.dedup.run_batch`)."""
        gid, out, st, checks = run_batch(self.be, self.net, m, gid, 0, self.nl, self.opts)
        ka, kb = self.k0, self.k0 + self.nl
        self.l_nnz[ka:kb] += st["nnz"]
        self.l_active[ka:kb] += st["active"]
        for k, live, distinct, sec in checks:
            c = self.checks.setdefault(self.k0 + k, [0, 0, 0.0])
            c[0], c[1], c[2] = c[0] + live, c[1] + distinct, c[2] + sec
        return gid, out

    def _compute(self, gid, m):
        be = self.be
        y = be.to_device(m)
        for a in range(0, self.nl, self.glen):
            b = min(self.nl, a + self.glen)
            if gid.size:
                y, keep, st = be.run_layers(y, self.net, a, b, self.opts.prune, consume=True)
                gid = gid[keep]
            else:
                st = empty_stats(b - a)
            ka, kb = self.k0 + a, self.k0 + b
            self.l_nnz[ka:kb] += st["nnz"]
            self.l_active[ka:kb] += st["active"]
        return gid, be.to_host(y, consume=True)


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
    y_host = sp.csr_matrix(y_local, dtype=np.float32)
    l_rows = y_host.shape[0] if live_rows is None else int(block_rows)
    if live_rows is None:
        gid = np.arange(row_offset, row_offset + l_rows, dtype=np.int64)
    else:
        gid = np.asarray(live_rows, dtype=np.int64)
    if g_rows is None:
        g_rows = comm.allreduce(l_rows)
    blocks = np.array(comm.allgather((int(row_offset), int(l_rows))), dtype=np.int64)
    edges = comm.allreduce(int(store.edges) if group == 0 else 0)
    sub = comm.Split(group, stage)
    try:
        # Setup (like loading): the group's rows go to its stage 0, in global row order.
        got = sub.gather((gid, y_host), root=0)
        if stage == 0:
            gid = np.concatenate([g for g, _ in got])
            y_host = sp.vstack([m for _, m in got], format="csr", dtype=np.float32)
            order = np.argsort(gid, kind="stable")
            gid, y_host = gid[order], y_host[order]
        del got
        nrows = sub.bcast(int(gid.size) if stage == 0 else None, root=0)
        batch = int(batch_rows) if batch_rows else default_batch_rows(nrows, stages)
        nbatches = max(1, -(-nrows // batch))
        st = _Stage(be, store, opts, k0, total_layers)
        finals, stats = _flow(sub, st, stage, stages, gid, y_host, batch, nbatches, neurons)
    finally:
        sub.Free()
    part1 = allreduce(comm, stats["seconds"], "max")

    t1 = time.perf_counter()
    if finals:
        gid = np.concatenate([g for g, _ in finals])
        y_final = sp.vstack([m for _, m in finals], format="csr", dtype=np.float32)
    else:
        gid, y_final = np.zeros(0, np.int64), sp.csr_matrix((0, neurons), dtype=np.float32)
    sums = np.asarray(y_final.sum(axis=1)).ravel() if y_final.shape[0] else np.zeros(0)
    categories = np.sort(allgather_array(comm, (gid[sums != 0] + 1).astype(np.int64)))
    part2 = allreduce(comm, time.perf_counter() - t1, "max")

    # Untimed: the last stage hands every row back to the rank whose block it came from.
    home = np.append(blocks[:, 0], np.iinfo(np.int64).max)
    y_final, gid = rb.exchange_rows(comm, y_final, gid, rb.home_destinations(gid, home))

    g_nnz, g_act = allreduce(comm, st.l_nnz, "sum"), allreduce(comm, st.l_active, "sum")
    g_sec = allreduce(comm, st.l_sec, "max")
    busy = np.array(comm.allgather(st.busy))
    local = np.array(comm.allgather(stats["seconds"]))
    by_stage = busy.reshape(groups, stages)
    first = allreduce(comm, int(k0), "min")
    stage_ranges = [list(stage_layers(s, stages, first, total_layers)) for s in range(stages)]
    result = InferenceResult(
        categories=categories,
        y_local=_expand(y_final, gid - row_offset, l_rows),
        row_offset=int(row_offset),
        g_rows=int(g_rows),
        layers=int(total_layers),
        edges=int(edges),
        part1=float(part1),
        part2=float(part2),
        layer_nnz=g_nnz.tolist(),
        layer_active_rows=g_act.tolist(),
        layer_seconds=g_sec.tolist(),
        rank_seconds=local.tolist(),
        rank_rows=comm.allgather(int(l_rows)),
        rank_nnz=comm.allgather(int(y_host.nnz) if stage == 0 else 0),
        backend=be.describe(),
        groups=stage_ranges,
        dedup=_dedup_report(comm, opts, st.checks),
    )
    result.pipeline = {
        "stages": int(stages),
        "data_groups": int(groups),
        "batch_rows": int(batch),
        "batches_per_group": comm.allgather(int(nbatches)),
        "stage_layers": result.groups,
        "rank_stage": [r % stages for r in range(comm.size)],
        "rank_busy_seconds": busy.tolist(),
        "stage_busy_seconds": by_stage.max(axis=0).tolist(),
        "bubble_fraction": float(1.0 - busy.sum() / (comm.size * part1)) if part1 > 0 else 0.0,
        "rank_bytes_sent": comm.allgather(int(stats["bytes_sent"])),
        "rank_weight_bytes": comm.allgather(int(_weight_bytes(store))),
    }
    return result


def _dedup_report(comm, opts, checks) -> dict:
    """Every stage's checks summed by layer (collective): rows merge within a batch."""
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


def _flow(sub, st, stage, stages, gid, y_host, batch, nbatches, neurons):
    """The timed part: receive, compute and forward every micro-batch of the group."""
    from mpi4py import MPI

    pending, sent = [], 0
    finals = []
    sub.Barrier()
    t_start = time.perf_counter()
    status = MPI.Status()
    for b in range(nbatches):
        if stage == 0:
            lo, hi = b * batch, min(gid.size, (b + 1) * batch)
            g, m = gid[lo:hi], y_host[lo:hi]
        else:
            sub.Probe(source=stage - 1, tag=_TAG, status=status)
            buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            sub.Recv([buf, MPI.BYTE], source=stage - 1, tag=_TAG)
            g, m = _unpack(buf, neurons)
        g, m = st.compute(g, m)
        if stage == stages - 1:
            finals.append((np.array(g), m))
            continue
        out = _pack(g, m)
        sent += out.nbytes
        pending.append((sub.Isend([out, MPI.BYTE], dest=stage + 1, tag=_TAG), out))
        if len(pending) > MAX_IN_FLIGHT:
            pending.pop(0)[0].Wait()
    MPI.Request.Waitall([r for r, _ in pending])
    seconds = time.perf_counter() - t_start
    sub.Barrier()
    return finals, {"seconds": seconds, "bytes_sent": sent}
