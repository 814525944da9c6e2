"""The data-parallel flow of ``mpisdnn infer``: every layer over each rank's rows.

The layers run in :class:`~mpisdnn.sdnn.runner.SliceRunner` (the loop the stage flow of
:mod:`mpisdnn.sdnn.pipeline` uses too); this module splits the rows, gathers the categories
and brings re-balanced rows home. :class:`InferenceResult` is what both flows return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import backends
from .._checks import check_infer_args
from ..backends.base import Backend
from ..parallel import allgather, allgather_array, allreduce, barrier, get_comm, phase
from ..walltime import kernel_seconds
from ..weights import as_store
from .options import DEFAULT_REBALANCE, FIRST_GROUP, MAX_GROUP, InferOptions
from .overflow import check_overflow
from .runner import RowBlock, SliceRunner

__all__ = [
    "InferenceResult",
    "InferOptions",
    "infer",
    "check_categories",
    "DEFAULT_REBALANCE",
    "FIRST_GROUP",
    "MAX_GROUP",
]


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
    #: The stage flow's statistics (:func:`~mpisdnn.sdnn.pipeline.run_pipeline`); ``None``
    #: for the data-parallel flow.
    pipeline: dict | None = None
    #: The checkpoints written (:meth:`~mpisdnn.sdnn.checkpoint.Checkpointer.describe`).
    checkpoint: dict | None = None
    #: Where a resumed run started: checkpoint, next layer, layers run.
    resumed: dict | None = None
    #: Seconds of kernel compiling or cache loading inside parts 1 and 2 (the most of any
    #: rank): 0 when the warm-up compiled every path the run took. Part 1 contains them.
    timed_kernel_seconds: float = 0.0

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
    y_local = check_infer_args(
        network, y_local, row_offset, g_rows, start_layer, live_rows, block_rows
    )
    comm = get_comm(comm)
    opts = options if options is not None else InferOptions()
    be = backend if backend is not None else backends.create(opts, comm)
    store = as_store(network)
    loop = SliceRunner(comm, be, store, opts, start=int(start_layer), on_boundary=on_boundary,
                       progress=progress)  # fmt: skip
    rows = RowBlock.of(comm, y_local, row_offset, g_rows, live_rows, block_rows)
    check_overflow(comm, rows.y, [(store, store.layer_start, int(start_layer))])
    parts = loop.begin(rows, rows.id_end(comm))
    with phase("setup"):
        barrier(comm)
    k_start = kernel_seconds()
    t_start = time.perf_counter()
    parts = loop.run_all(parts, t_start)
    with phase("layers"):  # part 1 ends when the slowest rank is done
        barrier(comm)
    part1 = time.perf_counter() - t_start
    return _gathered(comm, loop, rows, store, be, parts, part1, k_start)


@phase("gather")
def _gathered(comm, loop, rows, store, be, parts, part1, k_start=None) -> InferenceResult:
    """Part 2 (the categories) and the result (collective), after the layers; ``k_start``:
    this rank's :func:`~mpisdnn.walltime.kernel_seconds` when part 1 began."""
    t1 = time.perf_counter()
    y_final, gid = loop.gather_host(parts)
    del parts
    sums = np.asarray(y_final.sum(axis=1)).ravel() if y_final.shape[0] else np.zeros(0)
    # A kept row stands for every input merged into it.
    dd = loop.dedup
    local_cats = dd.expand_ids(gid[sums != 0]) + 1
    categories = np.sort(allgather_array(comm, local_cats.astype(np.int64)))
    part2 = time.perf_counter() - t1
    # Both phases end on a collective, so the slowest rank defines them; agree on one number.
    part1, part2 = allreduce(comm, part1, "max"), allreduce(comm, part2, "max")
    timed_kernels = 0.0 if k_start is None else kernel_seconds() - k_start
    timed_kernels = allreduce(comm, timed_kernels, "max")

    # Untimed: the final Y holds a copy of a kept row for every input it stands for, and
    # re-balanced rows go back to the rank whose block of Y0 they came from.
    y_final, gid = dd.expand_rows(y_final, gid)
    stats = loop.stats()
    return InferenceResult(
        y_local=rows.home(comm, y_final, gid, moved=bool(stats.events)),
        **rows.result_fields(comm, categories),
        layers=len(store),
        edges=int(store.edges),
        part1=float(part1),
        part2=float(part2),
        timed_kernel_seconds=float(timed_kernels),
        rank_nnz=allgather(comm, int(rows.y.nnz)),
        backend=be.describe(),
        rebalance_threshold=stats.threshold,
        memory=stats.memory_statistics(comm),
        dedup=dd.describe(),
        **stats.statistics(comm),
    )


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
