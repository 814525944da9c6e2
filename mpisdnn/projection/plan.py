"""Pure planning for the projection: work per output row, entry bounds, chunks, memory sizes.

Nothing here communicates or allocates more than a few arrays of the input's size, so every
rank computes the same plan from the same input and the plan is unit tested without MPI.
Rows of ``H = B^T B`` are the columns of ``B`` (``B`` is ``m x n``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ProjectionPlan",
    "plan_projection",
    "row_work",
    "row_bounds",
    "scratch_bytes",
]


def row_work(b_indptr, b_indices, n: int, triangle: str = "full", keep_diag: bool = False):
    """Flops of every output row: ``sum over k in N(u) of deg(k)`` (``full``).

    For ``upper`` only the terms that land at columns ``v > u`` (``v >= u`` with
    ``keep_diag``) count, which is the work the kernel really does (it starts row ``k`` of
    ``B`` after ``u``'s own entry, whose position the transpose recorded).

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    from ._kernels import row_work as _row_work

    ptr = np.asarray(b_indptr, dtype=np.int64)
    return _row_work(ptr, np.asarray(b_indices), int(n), triangle != "full", int(keep_diag))


def row_bounds(work, rows, n: int, triangle: str, keep_diag: bool, top_k=None):
    """Upper bound of the entries each output row can emit (sizes the output buffers).

    A row holds at most ``min(work, columns in its triangle)`` entries, and at most ``top_k``.
    """
    work = np.asarray(work, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    if triangle == "full":
        cap = np.full(rows.size, n, dtype=np.int64)
    else:
        cap = n - rows - 1 + int(keep_diag)
    ub = np.minimum(work, cap)
    if top_k:
        ub = np.minimum(ub, int(top_k))
    return np.maximum(ub, 0)


def scratch_bytes(n: int, threads: int, acc_bytes: int, idx_bytes: int, top_k, flag_bytes=0) -> int:
    """Per-rank scratch of the kernel: accumulator, flags, bitmap and touched list per thread."""
    per_thread = n * (acc_bytes + idx_bytes + flag_bytes) + 8 * (n // 64 + 2)
    if top_k:
        per_thread += min(n, int(top_k)) * (idx_bytes + 8)  # the row's bounded heap
    return threads * per_thread


#: Entries of the reused per-rank work buffer (one chunk's output bound at most). Small
#: enough to stay in cache between the kernel and the copy out (8 MiB at 32-bit counts):
#: measured 1.1-1.35x faster in memory than 128 MiB, and steadier.
WORK_ENTRIES = 1 << 20
#: Blocks per thread and chunk: enough for dynamic load balance, few enough to stay cheap.
BLOCKS_PER_THREAD = 16
#: Entries a finished top-k row set is written in at a time (mpisdnn.projection.topk).
PIECE_ENTRIES = 1 << 20


@dataclass(frozen=True, eq=False)
class ProjectionPlan:
    """Everything one rank's projection decided before computing (frozen, validated on
    creation; made by the pure :func:`plan_projection`, the same on every rank but for the
    rank's own rows).

    Attributes
    ----------
    options : ProjectionOptions
        The resolved options (``memory_per_rank`` in bytes, ``threads`` set).
    weighting : Weighting
        The weighting's record; ``mode`` is its kernel mode for this input.
    shape : (m, n)
        The oriented input ``B`` (``H`` is ``n x n``).
    threads : int
        Numba threads of this rank.
    triangle : {"full", "upper"}
        What the kernel computes (``upper`` for symmetric storage and the upper top-k too).
    mirror : bool
        ``top_k`` from the upper triangle (every entry offered to both rows' heaps).
    idx_dtype, acc_dtype, val_dtype : numpy dtype
        Column indices, kernel accumulators, stored values.
    rows : (r0, r1)
        This rank's output rows.
    offsets : ndarray
        Every rank's first row (``size + 1`` entries).
    bounds : ndarray
        Entry bound of each of this rank's rows.
    chunks : ndarray
        Chunk boundaries, relative to ``r0``.
    budget_entries, max_cap, expected, scratch_bytes : int
        Entries a chunk may hold, the work buffer's entries, the rank's entry bound (or its
        top-k entries), the kernel's scratch in bytes.
    file_format : str or None
        The output's format (None: memory or no output).
    """

    options: object
    weighting: object
    mode: int
    shape: tuple
    threads: int
    triangle: str
    mirror: bool
    idx_dtype: np.dtype
    acc_dtype: np.dtype
    val_dtype: np.dtype
    rows: tuple
    offsets: np.ndarray
    bounds: np.ndarray
    chunks: np.ndarray
    budget_entries: int
    max_cap: int
    expected: int
    scratch_bytes: int
    file_format: str | None

    def __post_init__(self):
        m, n = self.shape
        r0, r1 = self.rows
        checks = {
            "rows within the nodes": 0 <= r0 <= r1 <= n,
            "threads >= 1": self.threads >= 1,
            "a known triangle": self.triangle in ("full", "upper"),
            "a bound per row": self.bounds.size == r1 - r0,
            "chunks cover the rows": self.chunks.size >= 1 and int(self.chunks[-1]) == r1 - r0,
            "the weighting's kernel mode": self.mode
            in (self.weighting.mode, self.weighting.binary_mode),
            "float accumulators for float modes": self.counting
            or self.acc_dtype == np.float64,
            "top-k heaps only for symmetric weightings": not self.mirror
            or self.weighting.symmetric,
        }
        broken = [what for what, ok in checks.items() if not ok]
        if broken:
            raise ValueError(f"inconsistent projection plan: {', '.join(broken)}")

    @property
    def counting(self) -> bool:
        """The kernel accumulates integer counts."""
        from .weightings import COUNTING_MODES

        return self.mode in COUNTING_MODES

    @property
    def keep(self) -> bool:
        return self.options.self_loops == "keep"

    @property
    def upper(self) -> bool:
        return self.triangle == "upper"

    @property
    def symmetric(self) -> bool:
        """Symmetric storage: the file holds ``v >= u`` only."""
        return self.options.storage == "symmetric"

    @property
    def kernel_top_k(self):
        """The kernel's own top-k (the fused heap), None where the upper top-k runs."""
        return None if self.mirror else self.options.top_k

    @property
    def heap_k(self) -> int:
        """``k`` of the upper top-k's heaps (0: none)."""
        return min(self.shape[1], int(self.options.top_k)) if self.mirror else 0

    @property
    def entry_bytes(self) -> int:
        return self.idx_dtype.itemsize + self.val_dtype.itemsize


def value_dtypes(w, counting: bool, m: int, wide: bool, max_degree: int, file_format):
    """(accumulator dtype, stored value dtype): integer counts where they fit; a weighting
    that stores counts (:attr:`~.weightings.Weighting.counts`) writes them as uint16 in
    HDF5 files when no count can reach 65,536 (a count ``H[u, v]`` is at most the largest
    degree; two bytes less per entry is a quarter of a streamed count projection's bytes)."""
    if not counting:
        return np.dtype(np.float64), np.dtype(np.float64)
    acc = np.dtype(np.int32 if m < 2**31 and not wide else np.int64)
    if not w.counts:
        return acc, np.dtype(np.float64)
    if not wide and file_format == "h5" and max_degree < 2**16:
        return acc, np.dtype(np.uint16)
    return acc, acc


def buffers_per_chunk(file_format) -> int:
    """Chunk-sized buffers an output holds at once: the kernel's own (memory and no output),
    plus two staging buffers for the binary writers (one filling, one being written), or the
    formatting temporaries of the text writers."""
    if file_format is None:
        return 1
    return 2 if file_format in ("mtx", "tsv") else 3


def file_format(output, output_format):
    """The format of a file output (``"h5"``, ``"mtx"``, ...), None for memory or no output."""
    if output is None or (isinstance(output, str) and output == "memory"):
        return None
    from ..formats.projection.output import output_format as fmt_of

    return fmt_of(output, output_format)


def plan_projection(opts, w, graph, threads: int, work, offsets, rank: int,
                    mirror: bool) -> ProjectionPlan:  # fmt: skip
    """The plan of rank ``rank`` (pure: the same inputs give the same plan on every rank).

    ``opts`` are the resolved options, ``w`` the weighting's record, ``graph`` the oriented
    input's ``(shape, kernel mode, largest degree of a projected node)``, ``work`` every
    output row's work in the kernel's triangle, ``offsets`` the ranks' first rows,
    ``mirror`` the agreed upper top-k decision. Raises :class:`UsageError` where
    ``opts.memory_per_rank`` cannot hold the kernel's scratch and the largest row.
    """
    from ..errors import UsageError
    from ..partition import chunk_rows
    from ..system import format_size
    from .weightings import COUNTING_MODES

    shape, mode, max_degree = graph
    m, n = (int(x) for x in shape)
    fmt = file_format(opts.output, opts.output_format)
    counting = mode in COUNTING_MODES
    triangle = "upper" if mirror or opts.storage == "symmetric" else opts.triangle
    keep = opts.self_loops == "keep"
    k_top = None if mirror else opts.top_k
    idx_dtype = np.dtype(np.int32 if max(n, m) < 2**31 and not opts.wide else np.int64)
    acc_dtype, val_dtype = value_dtypes(w, counting, m, opts.wide, max_degree, fmt)
    r0, r1 = int(offsets[rank]), int(offsets[rank + 1])
    ub = row_bounds(work[r0:r1], np.arange(r0, r1), n, triangle, keep, k_top)
    scratch = scratch_bytes(n, threads, acc_dtype.itemsize, idx_dtype.itemsize, k_top,
                            flag_bytes=int(not counting))  # fmt: skip
    per_entry = (idx_dtype.itemsize + val_dtype.itemsize) * buffers_per_chunk(fmt)
    mem = int(opts.memory_per_rank)
    budget = (mem - scratch) // per_entry
    biggest = int(ub.max()) if ub.size else 0
    if budget < max(biggest, 1):
        need = scratch + max(biggest, 1) * per_entry
        raise UsageError(
            f"--memory-per-rank {format_size(mem)} is too small: the kernel scratch "
            f"({threads} threads x {n} columns) and the largest row need {format_size(need)}"
        )
    # a modest reused work buffer stays in cache and in resident memory: faulting in fresh
    # pages costs more than computing them on some machines
    chunks = chunk_rows(ub, min(budget, WORK_ENTRIES))
    cum_ub = np.concatenate(([0], np.cumsum(ub)))
    max_cap = int(np.max(np.diff(cum_ub[chunks]))) if chunks.size > 1 else 0
    max_cap += threads * BLOCKS_PER_THREAD + 1
    expected = (r1 - r0) * min(n, int(opts.top_k)) if mirror else int(ub.sum())
    if mirror:
        max_cap = max(max_cap, min(PIECE_ENTRIES, expected))
    return ProjectionPlan(
        options=opts, weighting=w, mode=int(mode), shape=(m, n), threads=int(threads),
        triangle=triangle, mirror=bool(mirror), idx_dtype=idx_dtype, acc_dtype=acc_dtype,
        val_dtype=val_dtype, rows=(r0, r1), offsets=np.asarray(offsets), bounds=ub,
        chunks=chunks, budget_entries=int(budget), max_cap=int(max_cap), expected=expected,
        scratch_bytes=int(scratch), file_format=fmt,
    )  # fmt: skip
