"""The projection driver: plan rows across ranks, compute them chunk by chunk, stream them out.

``H = B^T B`` with ``B = A`` (``onto="cols"``) or ``B = A^T`` (``onto="rows"``). Every rank holds
the whole input ``B`` (any output row may need any row of ``B``) and the rows of ``B^T`` of its
own output rows. Output rows are split into contiguous blocks of equal estimated work
(``sum over k in N(u) of deg(k)``, :func:`mpisdnn.partition.balanced_blocks`); each rank then
walks its block in chunks whose output bound fits ``memory_per_rank`` and hands every finished
chunk to a sink (HDF5/Matrix Market/TSV writer or memory), so the output can be far larger than
memory. Rows never depend on the split: any rank count and chunk size gives the same bytes.

This module is the driver (plan, allocate, run, summarise: :func:`project`); the input's
checks live in :mod:`._input`, the chunk loop and the writer's overlap in :mod:`._chunks`,
the result types in :mod:`._result` (re-exported here).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import UsageError
from ..parallel import SerialComm, agree, allgather, phase
from ..partition import balanced_blocks
from ..system import peak_rss_bytes, rss_bytes
from . import plan
from . import weightings as W
from ._chunks import _allocate, _compute_into, _tuning, _write_times
from ._input import _oriented, _prepare, labels_of
from ._result import ProjectionMatrix, ProjectionResult
from ._result import edge_frame as edge_frame
from .options import SYMMETRIC_WEIGHTINGS, WEIGHTINGS, ProjectionOptions, check_options
from .plan import ProjectionPlan, plan_projection

__all__ = [
    "ProjectionOptions",
    "WEIGHTINGS",
    "SYMMETRIC_WEIGHTINGS",
    "ProjectionResult",
    "ProjectionMatrix",
    "SerialComm",
    "check_options",
    "project",
    "project_matrix",
    "peak_rss_bytes",
    "kernels_cached",
    "warm_up",
    "warms_up",
]

#: ``top_k`` of a symmetric weighting comes from the upper triangle by default where the
#: multiply-adds are at least this many times the rows' entry bounds (``min(flops, n)`` per
#: row): half the multiply-adds then outweigh offering every entry to two heaps. Measured
#: (jaccard top-50, 1 thread, CPU s, fused / upper): MovieLens-20M shape (ratio 18.2) 10.9-
#: 11.7 / 8.3-8.9; RMAT-16 (1.6) 3.0-3.1 / 4.4-4.7; bipartite 20,000 x 10,000 (1.0) 0.31 /
#: 0.42-0.45.
UPPER_TOP_K_FLOPS = 8.0


def _agree(comm, fn, *args, **kwargs):
    """:func:`mpisdnn.parallel.agree`, except serially: then the original exception surfaces."""
    if isinstance(comm, SerialComm):
        return fn(*args, **kwargs)
    return agree(comm, fn, *args, **kwargs)


def _make_sink_agreed(comm, *args):
    """Every rank's sink, or none: when another rank could not start its output (a full
    disk), the sinks that did start are aborted, so no temporary file is left."""
    from ..formats.projection.output import make_sink

    made = []

    def make():
        made.append(make_sink(*args))
        return made[0]

    try:
        return _agree(comm, make)
    except BaseException:
        for sink in made:
            sink.abort()
        raise


def current_rss_bytes() -> int:
    """Resident set size now (:func:`mpisdnn.system.rss_bytes`; the peak where that is
    unavailable)."""
    now = rss_bytes()
    return int(now) if now is not None else peak_rss_bytes()


def _is_memory(output) -> bool:
    return isinstance(output, str) and output == "memory"


def warms_up(options: ProjectionOptions) -> bool:
    """Whether :func:`warm_up` compiles what ``project`` with ``options`` will call: not
    for a weighting whose kernel follows the input's weights too (cosine sums integers
    where every weight is 1, floats otherwise; the weights are not read yet)."""
    return W.WEIGHTINGS[options.weight].binary_mode is None


def kernels_cached() -> bool:
    """Whether the projection kernel's machine code is in the cache already (a warm run:
    :func:`warm_up` would only load it)."""
    from .. import kernel_cache
    from . import _kernels as K

    return kernel_cache.has_cache_index(K.project_chunk)


def warm_up(options: ProjectionOptions) -> None:
    """Compile (or load) the kernels :func:`project` calls with ``options``: one projection
    of a 3 x 3 graph on this rank alone, its output in memory.

    For the ranks of a first run other than the first (``mpisdnn project``): they compile
    the projection's kernels while rank 0 compiles the reader's, instead of every rank
    waiting for one compile after the other once the graph is read (measured on 2 ranks of
    the 2-core VM: the projection kernels take 18-22 s to compile, the text reader's 16 s).
    The kernels' types follow the options and the input's index widths: 32-bit here, as
    for any graph under 2**31 rows, columns and entries. See :func:`warms_up`.

    The 3 x 3 projection is written the way the run writes: in memory for a memory output
    (or none), else to a temporary file of the run's format. The stored value's type then
    comes from :func:`~.plan.value_dtypes` as in the run (an HDF5 file stores counts as
    uint16, which the kernel writes directly: a one-rank first run with ``-o H.h5`` that
    warmed up in memory compiled the projection twice, 47-64 s of compiling, 33 s after).
    Its largest degree is 2, so for a graph with a degree of 65,536 or more an HDF5 run's
    counts are int32 and that kernel is compiled by the run itself.
    """
    import os
    import tempfile

    import scipy.sparse as sp

    tiny = sp.csr_matrix(
        (np.ones(4), np.array([0, 1, 1, 2], np.int32), np.array([0, 2, 3, 4], np.int32)),
        shape=(3, 3),
    )
    changes = dict(output="memory", output_format="auto", storage="general", compress=None)
    fmt = plan.file_format(options.output, options.output_format)
    if fmt is None:
        project(SerialComm(), tiny, options.replace(**changes))
        return
    with tempfile.TemporaryDirectory(prefix="mpisdnn-warm-up-") as tmp:
        changes.update(output=os.path.join(tmp, f"h.{fmt}"), output_format=fmt)
        project(SerialComm(), tiny, options.replace(**changes))


def project(comm, graph, options: ProjectionOptions | None = None, *, progress=None,
            **kwargs) -> ProjectionResult:  # fmt: skip
    """Compute this rank's rows of the projection and stream them to ``sink`` (collective).

    Parameters
    ----------
    comm : mpi4py communicator or :class:`SerialComm`
    graph : Graph or sparse matrix
        The full ``rows x cols`` adjacency, on every rank.
    options : ProjectionOptions, optional
        All the options at once; keyword arguments (the fields below) build or amend it.
    weight : str
        One of :data:`WEIGHTINGS`.
    onto : {"cols", "rows"}
        ``cols``: ``H = A^T A`` (nodes are the columns); ``rows``: ``H = A A^T``.
    self_loops : {"drop", "keep"}
    triangle : {"full", "upper"}
        ``upper`` computes and writes only ``v > u`` (``v >= u`` with ``keep``).
    storage : {"general", "symmetric"}
        ``symmetric`` (HDF5 and Matrix Market outputs, symmetric weightings): the file holds
        ``v > u`` (``v >= u`` with ``keep``), computed once; the readers mirror it.
        ``result.nnz`` counts the full matrix, ``result.extra["stored_nnz"]`` the file.
    min_weight : float, optional
        Keep only entries with weight ``>= min_weight`` (applied while computing).
    top_k : int, optional
        Keep the ``top_k`` heaviest entries of every row (ties: smaller column first).
    memory_per_rank : int or str, optional
        Bound on the kernel's scratch plus one chunk's output buffers (``"2G"``). Default:
        half of the available memory.
    threads : int, optional
        Numba threads for this rank (default: numba's current setting).
    output : path-like, "memory" or None
        Where the rows go: ``"memory"`` (default) keeps this rank's rows in ``result.matrix``;
        a path writes HDF5, Matrix Market or TSV (by extension or ``output_format``), streamed
        chunk by chunk; ``None`` computes and discards (for measurements).
    output_format : {"auto", "h5", "mtx", "tsv"}
    index_base : {0, 1}
        First index in TSV outputs.
    compress : {None, "none", "zstd", "blosc2", "gzip"}
        Compression of HDF5 and Parquet outputs.
    dense_ratio, sweep_ratio, mark_ratio, wide
        Kernel tuning (see :class:`ProjectionOptions`).
    progress : callable, optional
        ``progress(rows_done, rows, seconds)`` after every chunk, on every rank (this rank's
        rows; the command line prints rank 0's).

    Returns
    -------
    ProjectionResult
    """
    if comm is None:
        from ..parallel import get_comm

        comm = get_comm(None)
    # the exchange and the sinks' collective opening and closing
    with phase("projection_exchange"):
        t0 = time.perf_counter()
        opts = _agree(comm, _options, options, kwargs).resolved(comm)
        nthreads = _use_threads(opts.threads)
        g = _agree(comm, _prepare, graph, opts, nthreads)
        b = _oriented(g, opts.onto)
        pl, work, factors, timings = _plan(comm, b, opts, nthreads)
        # this rank's rows of B^T (column u lists its neighbours k): part of the planning
        bt = _local_transpose(b, pl)
        timings["plan"] = time.perf_counter() - t0 - timings["kernel_load"]
        done = _execute(comm, g, b, bt, pl, work, factors, progress)
        return _summarise(comm, g, b, bt, pl, work, timings, done)


def _use_threads(threads) -> int:
    """Numba threads of this rank set to ``threads`` (within numba's pool); returns them."""
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    return numba.get_num_threads()


def _plan(comm, b, opts, nthreads):
    """The plan step (collective): the decisions every rank must share, the row work and
    the :class:`ProjectionPlan`. Returns ``(plan, work, factors, timings)``."""
    w = W.WEIGHTINGS[opts.weight]
    m, n = b.shape
    # top-k of a symmetric weighting: the upper triangle, each entry offered to both rows
    mirror, full_work = _upper_top_k_rule(opts, b, opts.memory_per_rank, nthreads)
    # the rule reads this rank's memory and threads: every rank takes the same path (the
    # upper triangle only where all can hold its heaps), or the collectives would differ
    mirror = all(allgather(comm, bool(mirror)))
    # symmetric storage is the upper triangle (and the diagonal) computed once
    triangle = "upper" if mirror or opts.storage == "symmetric" else opts.triangle
    keep = opts.self_loops == "keep"
    idx_dtype = np.int32 if max(n, m) < 2**31 and not opts.wide else np.int64
    # numba's first call in a process loads its cached machine code (about 0.3 s, mostly
    # one-off LLVM set-up): done on a one-row slice and timed apart from the planning
    timings = {"kernel_load": _load_kernels(b, n, triangle, keep, idx_dtype, opts.wide)}
    # the rule's full-row work is these numbers when the rows stay full (keep only counts in
    # the upper triangle): one pass over B, not two (17-33 ms each at 20M entries)
    work = (
        full_work
        if full_work is not None and triangle == "full"
        else plan.row_work(b.indptr, b.indices, n, triangle, keep)
    )
    offsets = balanced_blocks(work, comm.size)
    # weights and per-k factors only for the weightings that read them
    factors = W.factors(w, b, n)
    deg_u = factors[1]
    graph = (b.shape, w.kernel_mode(b), int(deg_u.max()) if deg_u.size else 0)
    pl = _agree(comm, plan_projection, opts, w, graph, nthreads, work, offsets, comm.rank, mirror)
    return pl, work, factors, timings


def _open_sink(comm, g, pl: ProjectionPlan):
    """This rank's sink for the plan's output (collective for files)."""
    from ..formats.projection.output import MemorySink

    opts = pl.options
    n = pl.shape[1]
    if _is_memory(opts.output):
        return MemorySink(n, pl.expected, pl.idx_dtype, pl.val_dtype)
    labels = labels_of(g, opts.onto)
    meta = output_meta(
        dict(
            opts.summary(),
            row_start=pl.rows[0],
            row_stop=pl.rows[1],
            expected_entries=pl.expected,
            budget_entries=pl.budget_entries,
            index_base=int(opts.index_base) if labels is None else 0,
        ),
        n,
        pl.idx_dtype.name,
        pl.val_dtype.name,
    )
    return _make_sink_agreed(
        comm, opts.output, comm, meta, opts.output_format, opts.index_base, labels,
        opts.compress, pl.max_cap,
    )  # fmt: skip


def _execute(comm, g, b, bt, pl: ProjectionPlan, work, factors, progress) -> dict:
    """The run step (collective): allocate, compute every chunk into the sink, close it.
    Returns the rank's figures for :func:`_summarise`."""
    import numba

    from ..formats.projection.output import MemorySink
    from . import _kernels as K

    opts = pl.options
    (r0, r1), m = pl.rows, pl.shape[0]
    # held in a list: the upper-triangle top-k takes it over and lets it go before the
    # exchange of its heaps (nothing else may keep the per-thread heaps alive)
    work_arrays = [_allocate(pl)]
    sink = _open_sink(comm, g, pl)
    b_val, deg_u, kfac, nrm = factors
    use_min = opts.min_weight is not None
    b_rows = K.Csr(b.indptr.astype(np.int64, copy=False),
                   b.indices.astype(pl.idx_dtype, copy=False), b_val, 0,
                   np.zeros(1, bt[3].dtype))  # fmt: skip
    bt_rows = K.Csr(*bt[:3], r0, bt[3])
    rule = K.Rule(pl.mode, pl.upper, pl.keep, use_min, float(opts.min_weight or 0.0),
                  int(pl.kernel_top_k or 0), deg_u, kfac, float(m), nrm, pl.heap_k)  # fmt: skip
    tune = _tuning(opts)
    done = [0, time.perf_counter()]

    def run_chunk(*chunk):  # the fields of K.Chunk, in order
        with numba.parallel_chunksize(1):  # blocks are claimed dynamically
            K.project_chunk(b_rows, bt_rows, rule, tune, work_arrays[0], K.Chunk(*chunk))
        if progress is not None and len(chunk[1]):
            done[0] += len(chunk[1])
            progress(done[0], r1 - r0, time.perf_counter() - done[1])

    # Load the compiled kernels (and start the thread pool) on an empty block list first, so
    # the memory measured from here on is the projection's own, not numba's code.
    no_rows = np.zeros(1, dtype=np.int64)
    run_chunk(r0, work[r0:r0], no_rows, no_rows, np.empty(1, pl.idx_dtype),
              np.empty(1, pl.val_dtype), np.empty(0, np.int64), np.empty(0, np.int64))  # fmt: skip
    K.compact(np.empty(1, pl.idx_dtype), np.empty(1, pl.val_dtype), no_rows, no_rows[:0])
    rss_start = current_rss_bytes()
    nnz_local, t_compute, t_write = _compute_into(
        comm, sink, work_arrays if pl.heap_k else None, pl, work[r0:r1], run_chunk
    )
    rss_before_finish = peak_rss_bytes()
    tf = time.perf_counter()
    stored = sum(allgather(comm, nnz_local))
    diag = W.diagonal_count(pl.weighting, b, deg_u, kfac, opts.min_weight, nrm)
    sink.finish(comm, {"nnz": stored})
    t_finish = time.perf_counter() - tf
    t_compute, t_write, local_write = _write_times(
        sink, t_compute, t_write + t_finish, t_finish, nnz_local * pl.entry_bytes
    )
    return {
        "stored": int(stored),
        "diagonal": int(diag),
        "matrix": sink.matrix() if isinstance(sink, MemorySink) else None,
        "nnz": nnz_local,
        "compute_seconds": t_compute,
        "write_seconds": t_write,
        "peak_rss_bytes": max(rss_before_finish, peak_rss_bytes()),
        "rss_start_bytes": rss_start,
        "write": local_write,
    }


def _summarise(comm, g, b, bt, pl: ProjectionPlan, work, timings, done) -> ProjectionResult:
    """The summarise step (collective): the per-rank table and the result."""
    opts = pl.options
    (r0, r1), n = pl.rows, pl.shape[1]
    # the matrix's own entry count: a symmetric file holds each off-diagonal pair once
    stored, diag = done["stored"], done["diagonal"]
    nnz = 2 * stored - (diag if pl.keep else 0) if pl.symmetric else stored
    timings["compute"], timings["write"] = done["compute_seconds"], done["write_seconds"]
    local = {
        "rows": r1 - r0,
        "work": int(work[r0:r1].sum()),
        **{k: done[k] for k in ("nnz",)},
        "chunks": int(pl.chunks.size - 1),
        **{k: done[k] for k in ("compute_seconds", "write_seconds", "peak_rss_bytes",
                                "rss_start_bytes")},
        "input_bytes": int(b.indptr.nbytes + b.indices.nbytes + b.data.nbytes
                           + sum(x.nbytes for x in bt)),
        **done["write"],
    }  # fmt: skip
    return ProjectionResult(
        shape=(n, n),
        nnz=int(nnz),
        diagonal=int(diag),
        row_start=r0,
        row_stop=r1,
        options=dict(opts.summary(), memory_per_rank=int(opts.memory_per_rank)),
        seconds=timings,
        ranks=_rank_table(comm, local),
        threads=pl.threads,
        index_dtype=pl.idx_dtype.name,
        value_dtype=pl.val_dtype.name,
        matrix=done["matrix"],
        extra={
            "input_rows": int(g.matrix.shape[0]),
            "input_cols": int(g.matrix.shape[1]),
            "input_nnz": int(g.matrix.nnz),
            "flops": int(work.sum()),
            "stored_nnz": int(stored),
            "scratch_bytes": pl.scratch_bytes,
            "top_k_from_upper": pl.mirror,
        },
        labels=labels_of(g, opts.onto),
    )


def _upper_top_k_rule(opts, b=None, mem=0, nthreads=1) -> tuple[bool, np.ndarray | None]:
    """Whether ``top_k`` rows come from the upper triangle (:mod:`mpisdnn.projection.topk`),
    for a symmetric weighting of full rows: as ``opts.top_k_upper`` says, or by default
    (None) where it was measured faster (see :data:`UPPER_TOP_K_FLOPS`) and its heaps take at
    most a quarter of ``mem``. ``b`` is the oriented input, the same on every rank, but
    ``mem`` and ``nthreads`` are this rank's: the caller agrees on the decision.

    Returns ``(upper, full_work)``: the decision, and the full rows' work
    (``plan.row_work(..., "full")``) where the default rule computed it, else None, so the
    caller need not compute it again. A tuple, not a bool: test ``[0]``.
    """
    if not (opts.top_k and opts.weight in SYMMETRIC_WEIGHTINGS and opts.triangle == "full"):
        return False, None
    if opts.top_k_upper is not None or b is None:
        return bool(opts.top_k_upper), None
    n = b.shape[1]
    heaps = (nthreads + 3) * n * (16 * min(n, int(opts.top_k)) + 16)  # 8-byte columns, values
    if heaps > mem // 4:
        return False, None
    work = plan.row_work(b.indptr, b.indices, n)
    bound = plan.row_bounds(work, np.arange(n), n, "full", True)
    return int(work.sum()) >= UPPER_TOP_K_FLOPS * max(int(bound.sum()), 1), work


def _load_kernels(b, n, triangle, keep, idx_dtype, wide=False) -> float:
    """Seconds numba's first calls take (loading cached machine code, one-off LLVM set-up),
    run on a one-row slice so they are timed apart from the planning."""
    from . import _kernels as K

    tk = time.perf_counter()
    one = b[:1]
    plan.row_work(one.indptr, one.indices, n, triangle, keep)
    no_pos = np.empty(0, _pos_dtype(b, wide))  # the variant _local_transpose will call
    K.transpose_cols(one.indptr, one.indices, 0, 1, np.empty(0, idx_dtype), no_pos)
    return time.perf_counter() - tk


def _pos_dtype(b, wide):
    """Positions in ``B``'s entries: int32, or int64 past 2**31 entries (or ``wide``)."""
    return np.int32 if b.nnz < 2**31 and not wide else np.int64


def _local_transpose(b, pl: ProjectionPlan):
    """This rank's rows of ``B^T`` (column u lists its neighbours k): ``(ptr, idx, val,
    pos)``; values only where read (the float-accumulated modes that read weights), and for
    the upper triangle the position of every entry ``(u, k)`` in row ``k`` of ``B`` (where
    the kernel's segment starts; 1-entry placeholders otherwise)."""
    from . import _kernels as K

    (r0, r1), upper, idx_dtype = pl.rows, pl.upper, pl.idx_dtype
    # newman accumulates in floats but reads per-k factors, not weights
    floats = not pl.counting and pl.weighting.reads_values
    pos_dtype = _pos_dtype(b, pl.options.wide)
    # positions are recorded for the upper triangle, and to gather the values
    pos_like = np.empty(1 if upper or floats else 0, pos_dtype)
    idx_like = np.empty(0, idx_dtype)
    ptr, idx, pos = K.transpose_cols(b.indptr, b.indices, r0, r1, idx_like, pos_like)
    val = b.data.astype(np.float64, copy=False)[pos] if floats else np.zeros(1, np.float64)
    if not upper:
        pos = np.zeros(1, pos_dtype)
    return ptr.astype(np.int64, copy=False), idx.astype(idx_dtype, copy=False), val, pos


def _rank_table(comm, local: dict) -> dict:
    """The summarise step's per-rank table (every key a list over ranks) and imbalances."""
    per_rank = allgather(comm, local)
    ranks = {key: [r[key] for r in per_rank] for key in local}
    w = np.asarray(ranks["work"], dtype=np.float64)
    ranks["work_imbalance"] = float(w.max() / w.mean()) if w.size and w.mean() > 0 else 1.0
    ct = np.asarray(ranks["compute_seconds"])
    ranks["compute_imbalance"] = float(ct.max() / ct.mean()) if ct.size and ct.mean() > 0 else 1.0
    return ranks


def output_meta(result_like: dict, n: int, index_dtype: str, value_dtype: str) -> dict:
    """Attributes every output format records (HDF5 attrs, text header)."""
    meta = {"format": "mpisdnn.projection", "version": 1, "rows": n, "cols": n}
    meta.update(result_like)
    meta["index_dtype"] = index_dtype
    meta["value_dtype"] = value_dtype
    return meta


def _options(options, kwargs) -> ProjectionOptions:
    import dataclasses

    known = {f.name for f in dataclasses.fields(ProjectionOptions)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise UsageError(
            f"unknown projection option {unknown[0]} (known: {', '.join(sorted(known))})"
        )
    if options is None:
        return ProjectionOptions(**kwargs)
    if not isinstance(options, ProjectionOptions):
        raise UsageError(f"options must be a ProjectionOptions, got {type(options).__name__}")
    return options.replace(**kwargs) if kwargs else options


def project_matrix(a, **options) -> ProjectionMatrix:
    """Serial in-memory projection (no MPI needed) of a :class:`Graph`, a sparse or dense
    matrix, or an edge list (DataFrame / Table with ``source``, ``target`` and optionally
    ``weight`` columns); returns scipy CSR (:class:`ProjectionMatrix`) whose ``labels``
    name its rows and columns when the input had ids (``to_pandas()`` lists the entries by
    them). Takes the keyword options of :func:`project` except ``output``.
    """
    if "output" in options:
        raise UsageError("project_matrix returns the matrix; use project(..., output=) for files")
    res = project(SerialComm(), a, **options)
    mat = res.matrix
    return ProjectionMatrix((mat.data, mat.indices, mat.indptr), shape=mat.shape,
                            labels=res.labels)  # fmt: skip
