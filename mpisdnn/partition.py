"""Pure planning functions: who owns which rows or layers.

Nothing here communicates; every function takes sizes or weights and returns offsets, so the
plan can be unit tested without MPI and every rank computes the same plan independently.
"""

from __future__ import annotations

import numpy as np

from .errors import UsageError, shown

__all__ = [
    "balanced_blocks",
    "balanced_layers",
    "block_of",
    "even_blocks",
    "chunk_rows",
    "stage_layout",
    "stage_layers",
    "head_layers",
    "default_batch_rows",
    "stage_offsets",
    "prefix_segments",
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


def even_blocks(n: int, nparts: int) -> np.ndarray:
    """Offsets of ``nparts`` contiguous blocks of ``n`` items whose sizes differ by at most one.

    Returns
    -------
    offsets : ndarray of int64, shape (nparts + 1,)
        Block ``k`` is ``[offsets[k], offsets[k + 1])``.
    """
    if nparts < 1:
        raise ValueError("nparts must be >= 1")
    if n < 0:
        raise ValueError("n must be >= 0")
    base, extra = divmod(n, nparts)
    sizes = np.full(nparts, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def balanced_blocks(weights, nparts: int) -> np.ndarray:
    """Split items into ``nparts`` contiguous blocks of near-equal total weight.

    Block ``k`` starts at the first item whose prefix weight reaches ``k * total / nparts``;
    hence every block's weight differs from ``total / nparts`` by less than the largest single
    weight ("balanced within one row's nnz"). With zero total weight (e.g. all rows empty) the
    split falls back to equal item counts, so empty inputs still spread across ranks.

    Parameters
    ----------
    weights : array_like of non-negative numbers, shape (n,)
        Work per item, e.g. nnz per row of Y0 or flops per output row of a projection.
    nparts : int
        Number of blocks (usually the communicator size); may exceed ``n``.

    Returns
    -------
    offsets : ndarray of int64, shape (nparts + 1,)
        Non-decreasing, ``offsets[0] == 0`` and ``offsets[-1] == n``.
    """
    w = _weights(weights, nparts, "weights")
    n = w.size
    cum = np.concatenate(([0.0], np.cumsum(w)))
    total = cum[-1]
    if total <= 0:
        return even_blocks(n, nparts)
    targets = total * np.arange(nparts + 1, dtype=np.float64) / nparts
    offsets = np.searchsorted(cum, targets, side="left").astype(np.int64)
    offsets[0] = 0
    offsets[-1] = n
    return np.maximum.accumulate(np.minimum(offsets, n))


def balanced_layers(work, nparts: int) -> np.ndarray:
    """Split layers into ``nparts`` contiguous stages whose largest total work is smallest.

    Unlike :func:`balanced_blocks` (targets at ``k / nparts`` of the prefix, within one item
    of the mean) this minimises the bottleneck exactly, which matters when a few layers hold
    most of the work (with pruning, the first layers of the challenge networks): a pipeline
    runs at the pace of its busiest stage. Every stage gets at least one layer when there
    are as many layers as stages (a stage without layers would only forward rows).

    Parameters
    ----------
    work : array_like of non-negative numbers, shape (n,)
        Estimated work of each layer (e.g. seconds measured on a pilot micro-batch).
    nparts : int
        Number of stages.

    Returns
    -------
    offsets : ndarray of int64, shape (nparts + 1,)
        Stage ``s`` holds layers ``[offsets[s], offsets[s + 1])``. With zero total work, or
        fewer layers than stages, the split is :func:`even_blocks`. Among splits with the
        same bottleneck the one whose stages end earliest wins (a deterministic choice: every
        rank computes the same plan from the same profile).
    """
    w = _weights(work, nparts, "work")
    n = w.size
    if n < nparts or w.sum() <= 0 or nparts == 1:
        return even_blocks(n, nparts)
    cum = np.concatenate(([0.0], np.cumsum(w)))
    # best[j]: smallest bottleneck of the first j layers in s stages; cut[s][j]: where the
    # last of those s stages starts. O(nparts n^2) in numpy: n is a network's depth.
    best = cum.copy()
    best[0] = np.inf
    cuts = []
    for s in range(2, nparts + 1):
        nxt = np.full(n + 1, np.inf)
        cut = np.zeros(n + 1, np.int64)
        for j in range(s, n + 1):
            i = np.arange(s - 1, j)
            cost = np.maximum(best[i], cum[j] - cum[i])
            pick = int(np.argmin(cost))  # the first minimum: the earliest start
            nxt[j], cut[j] = cost[pick], i[pick]
        best = nxt
        cuts.append(cut)
    offsets = np.empty(nparts + 1, np.int64)
    offsets[nparts] = n
    for s in range(nparts - 1, 0, -1):
        offsets[s] = cuts[s - 1][offsets[s + 1]]
    offsets[0] = 0
    return offsets


def _weights(weights, nparts: int, name: str) -> np.ndarray:
    """``weights`` as a float64 vector, checked (and ``nparts`` with it)."""
    if nparts < 1:
        raise ValueError("nparts must be >= 1")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    if w.size and (w.min() < 0 or not np.isfinite(w).all()):
        raise ValueError(f"{name} must be finite and non-negative")
    return w


def block_of(offsets: np.ndarray, part: int) -> tuple[int, int]:
    """``(start, stop)`` of block ``part`` in an offsets array."""
    return int(offsets[part]), int(offsets[part + 1])


def chunk_rows(bounds, max_entries: int) -> np.ndarray:
    """Split rows into contiguous chunks whose summed entry bounds stay within ``max_entries``.

    A single row larger than the limit forms a chunk by itself (rows are never split; callers
    check that the limit holds the largest row).

    Returns
    -------
    offsets : ndarray of int64, ``offsets[0] == 0``, ``offsets[-1] == len(bounds)``
    """
    ub = np.asarray(bounds, dtype=np.int64)
    n = ub.size
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    max_entries = max(1, int(max_entries))
    cum = np.concatenate(([0], np.cumsum(ub)))
    offsets = [0]
    start = 0
    while start < n:
        stop = int(np.searchsorted(cum, cum[start] + max_entries, side="right")) - 1
        stop = min(n, max(stop, start + 1))
        offsets.append(stop)
        start = stop
    return np.asarray(offsets, dtype=np.int64)


# -- the stage flow's split (``mpisdnn infer --stages S``) -----------------------------------


def stage_layout(size: int, stages: int) -> int:
    """Data groups ``D`` for ``size`` ranks in ``stages`` stages; raises
    :class:`~mpisdnn.errors.UsageError` unless ``stages`` divides ``size``."""
    if stages < 1:
        raise UsageError(f"--stages must be >= 1, got {stages}")
    if size % stages:
        raise UsageError(
            f"--stages {stages} needs a rank count that is a multiple of {stages} "
            f"(ranks = stages x data groups), got {size} ranks"
        )
    return size // stages


def stage_layers(stage: int, stages: int, first: int, stop: int) -> tuple[int, int]:
    """Global layers ``[k0, k1)`` of ``stage`` when layers ``[first, stop)`` are to run
    (the even split)."""
    n = stop - first
    return first + stage * n // stages, first + (stage + 1) * n // stages


def head_layers(stages: int, first: int, total: int, asked: int | None = None) -> int:
    """Layers run data-parallel before the stages when layers ``[first, total)`` are to run.

    ``asked``: the number wanted (``0``: none, a plain pipeline); ``None``: the default,
    ``min(HEAD_LAYERS, (total - first) // (2 stages))``, so that no rank holds more than 1.5x
    its even share of the layers. One stage has no head (every layer is data-parallel).
    Raises :class:`~mpisdnn.errors.UsageError` when ``asked`` is negative or more than the
    layers to run.
    """
    n = max(0, int(total) - int(first))
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or not 0 <= asked <= n:
            raise UsageError(f"--stage-head must be between 0 and the {n} layers to run, "
                             f"got {shown(asked)}")  # fmt: skip
        return 0 if stages == 1 else int(asked)
    return 0 if stages == 1 else min(HEAD_LAYERS, n // (2 * stages))


def default_batch_rows(group_rows: int, stages: int) -> int:
    """Rows per micro-batch: about ``BATCHES_PER_STAGE`` (8) batches per stage, at least
    ``MIN_BATCH_ROWS`` (256) or the group's rows."""
    want = -(-max(1, group_rows) // (BATCHES_PER_STAGE * stages))
    return max(min(MIN_BATCH_ROWS, max(1, group_rows)), want)


def stage_offsets(profile, stages: int, first: int, total: int) -> list:
    """Stage offsets (``stages + 1`` global layers from ``first`` to ``total``) balanced by
    ``profile`` (seconds per layer from ``first``) with :func:`balanced_layers`, or the even
    split :func:`stage_layers` when that is within ``MIN_GAIN`` (5 %) of as good: a move
    costs a few milliseconds."""
    even = [stage_layers(s, stages, first, total)[0] for s in range(stages)] + [total]
    cut = (balanced_layers(profile, stages) + first).tolist()
    cum = np.concatenate(([0.0], np.cumsum(profile)))

    def worst(offsets):
        return max(cum[b - first] - cum[a - first] for a, b in zip(offsets[:-1], offsets[1:]))

    return cut if worst(cut) < (1.0 - MIN_GAIN) * worst(even) else even


#: What inflating a gzip file's text costs against parsing and keeping it, per byte, on
#: one core: ISA-L inflates about 1.3 GB/s, the inputs parser and the kept entries take
#: about 0.65 GB/s (the 2-core EPYC VM, official-format inputs, 2026-12-02).
INFLATE_COST = 0.5


def prefix_segments(nparts: int, cost: float = INFLATE_COST) -> np.ndarray:
    """Where ``nparts`` ranks cut a stream they must each inflate from its start: fractions
    ``s[0] = 0 < s[1] < ... < s[nparts] = 1`` of the text, part ``r`` parsing
    ``[s[r], s[r + 1])``.

    Part ``r`` inflates the text up to its end and parses its own segment: its time is
    ``cost * s[r + 1] + (s[r + 1] - s[r])`` (``cost``: inflating a byte against parsing
    it). All parts take the same time when ``s[r] = (1 - a**r) / (1 - a**nparts)`` with
    ``a = 1 / (1 + cost)``: the early parts, which stop inflating early, parse more (2
    parts at ``cost`` 0.5: 60 % and 40 %).
    """
    if nparts < 1 or not cost >= 0:
        raise ValueError(f"{nparts} parts at cost {cost}")
    r = np.arange(nparts + 1, dtype=np.float64)
    if cost == 0:
        return r / nparts
    a = 1.0 / (1.0 + cost)
    s = (1.0 - a**r) / (1.0 - a**nparts)
    s[-1] = 1.0
    return s
