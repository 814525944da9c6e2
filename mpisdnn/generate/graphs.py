"""Seeded synthetic graphs for projection: uniform bipartite graphs and Graph500 R-MAT.

Both generators are vectorised numpy (no per-edge Python) and return a
:class:`scipy.sparse.csr_matrix` with sorted, unique column indices; the same seed always gives
the same matrix, whatever the machine.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError

__all__ = ["bipartite", "bipartite_powerlaw", "rmat", "RMAT_PARAMS", "MOVIELENS_20M"]

#: Graph500 initiator probabilities (a, b, c, d).
RMAT_PARAMS = (0.57, 0.19, 0.19, 0.05)

#: Edges drawn per vectorised R-MAT batch; fixed so results do not depend on memory.
_RMAT_BATCH = 1 << 22

_WEIGHTS = ("one", "uniform", "rating")


def check_memory(what: str, need: int, available=None) -> None:
    """Refuse, before allocating, a graph whose generation needs more than the available
    memory: one line with both sizes (a 2**40-row graph asked for TiB and died in numpy).
    The one memory check of the package (:func:`mpisdnn.formats._validate.check_memory`)."""
    from ..formats._validate import check_memory as _check

    _check(need, f"generating {what}", available)


def bipartite_bytes(rows: int, cols: int, edges: int, exact_sampling: bool) -> int:
    """Peak bytes of :func:`bipartite`: CSR pointers, the drawn positions and the arrays made
    from them (about 48 bytes an edge), and the permutation of exact sampling."""
    need = 16 * (rows + 1) + 48 * edges
    if exact_sampling:
        need += 8 * rows * cols
    return need


def _weights(rng, count: int, kind: str) -> np.ndarray:
    if kind == "one":
        return np.ones(count, dtype=np.float64)
    if kind == "uniform":
        # (0, 1]: a weight of exactly 0 would not be an edge
        return 1.0 - rng.random(count)
    if kind == "rating":
        return rng.integers(1, 6, count).astype(np.float64)
    raise UsageError(f"unknown weights {kind!r}; choose one of {', '.join(_WEIGHTS)}")


def bipartite(rows: int, cols: int, edges=None, density=None, seed=0, weights="one"):
    """A uniformly random ``rows x cols`` bipartite adjacency with exactly ``edges`` edges.

    Parameters
    ----------
    rows, cols : int
        Sizes of the two sides.
    edges : int, optional
        Number of distinct edges. Give this or ``density``.
    density : float, optional
        Fraction of the ``rows * cols`` possible edges (rounded to an edge count).
    seed : int
    weights : {"one", "uniform", "rating"}
        Edge weights: all 1, uniform in (0, 1], or integer ratings 1..5.

    Returns
    -------
    scipy.sparse.csr_matrix of float64
    """
    if rows < 1 or cols < 1:
        raise UsageError(f"rows and cols must be >= 1, got {rows} x {cols}")
    total = rows * cols
    if (edges is None) == (density is None):
        raise UsageError("give exactly one of --edges and --density")
    if edges is None:
        if not 0 <= density <= 1:
            raise UsageError(f"--density must be in [0, 1], got {density}")
        edges = int(round(density * total))
    if not 0 <= edges <= total:
        raise UsageError(f"--edges must be in [0, rows*cols = {total}], got {edges}")
    exact = total <= 1 << 24 or edges > total // 4
    check_memory(f"bipartite {rows} x {cols} with {edges} edges",
                 bipartite_bytes(rows, cols, edges, exact))  # fmt: skip
    if total >= 2**62:
        raise UsageError(
            f"bipartite {rows} x {cols}: rows x cols must be below 2**62 (edges are drawn "
            "as positions row * cols + col)"
        )
    rng = np.random.default_rng(seed)
    if exact:
        # small or dense: exact sampling without replacement is cheap enough
        pos = np.sort(rng.choice(total, size=edges, replace=False))
    else:
        # sparse: oversample with replacement, deduplicate, top up, then subsample exactly
        pos = np.unique(rng.integers(0, total, size=edges + edges // 8 + 16))
        while pos.size < edges:
            extra = rng.integers(0, total, size=2 * (edges - pos.size) + 16)
            pos = np.union1d(pos, extra)
        if pos.size > edges:
            pos = np.sort(pos[rng.choice(pos.size, size=edges, replace=False)])
    r = pos // cols
    c = pos % cols
    indptr = np.concatenate(([0], np.cumsum(np.bincount(r, minlength=rows)))).astype(np.int64)
    data = _weights(rng, edges, weights)
    return _csr(data, c, indptr, (rows, cols))


#: The shape of MovieLens-20M: users, items, ratings; item degrees median 18, mean 748,
#: max 67,310; user degrees at least 20, median 68, mean 144, max 9,254.
MOVIELENS_20M = {"rows": 138_493, "cols": 26_744, "edges": 20_000_263}
#: (median, mean, max) of the expected degrees on each side (rows = users, cols = items),
#: from the MovieLens-20M summary statistics above. Users get at least 20.
_ML_ITEMS = (18.0, 748.0, 67_310.0)
_ML_USERS = (48.0, 124.0, 9_234.0)  # on top of the 20 ratings every user has


def _lognormal_degrees(n: int, median: float, mean: float, cap: float, total: float):
    """Expected degrees of ``n`` nodes: log-normal quantiles (deterministic shape) with the
    given median and mean, capped at ``cap`` and scaled so they add up to ``total``."""
    from scipy.special import ndtri

    sigma = np.sqrt(2 * np.log(mean / median))
    q = (np.arange(n) + 0.5) / n
    d = np.exp(np.log(median) + sigma * ndtri(q))
    for _ in range(50):  # the cap moves mass; re-scale until the total holds
        d = np.minimum(d * (total / d.sum()), cap)
        if abs(d.sum() - total) <= 1e-9 * total:
            break
    return d


def bipartite_powerlaw(rows: int, cols: int, edges: int, seed=0, weights="one",
                       items=_ML_ITEMS, users=_ML_USERS, min_user=20):  # fmt: skip
    """A ``rows x cols`` bipartite graph with skewed (MovieLens-like) degrees on both sides.

    Users (rows) and items (cols) get expected degrees from log-normal shapes fitted to
    MovieLens-20M (item degree median 18, mean 748, at most 67,310 scaled to the size asked;
    every user rates at least ``min_user`` items), scaled to ``edges``; edges are drawn with
    probability proportional to the product of the two expected degrees (Chung-Lu),
    duplicates are dropped and redrawn until exactly ``edges`` distinct edges remain. Node
    ids are shuffled so the popular items are spread over the index range. Seeded.
    """
    if rows < 1 or cols < 1:
        raise UsageError(f"rows and cols must be >= 1, got {rows} x {cols}")
    if not 0 <= edges <= rows * cols // 4:
        raise UsageError(f"--edges must be in [0, rows*cols/4 = {rows * cols // 4}], got {edges}")
    check_memory(f"bipartite {rows} x {cols} with {edges} edges",
                 40 * (rows + cols) + 64 * edges)  # fmt: skip
    if rows * cols >= 2**62:
        raise UsageError(f"bipartite {rows} x {cols}: rows x cols must be below 2**62")
    rng = np.random.default_rng(seed)
    scale = edges / MOVIELENS_20M["edges"]
    item_cap = min(items[2] * max(scale, 1e-9) * MOVIELENS_20M["rows"] / rows, rows / 2)
    di = _lognormal_degrees(cols, items[0], items[1], max(item_cap, 1.0), edges)
    base = min(min_user, edges / rows)
    du = base + _lognormal_degrees(
        rows, users[0], users[1], max(min(users[2], cols / 2) - base, 1.0), edges - base * rows
    )
    ci = np.cumsum(di[rng.permutation(cols)])
    cu = np.cumsum(du[rng.permutation(rows)])
    keys = np.empty(0, np.int64)
    want = edges
    while keys.size < edges:
        k = want + want // 8 + 16
        u = np.searchsorted(cu, rng.random(k) * cu[-1], side="right")
        i = np.searchsorted(ci, rng.random(k) * ci[-1], side="right")
        keys = np.union1d(keys, np.minimum(u, rows - 1) * np.int64(cols) + np.minimum(i, cols - 1))
        want = 2 * (edges - keys.size) + 16
    if keys.size > edges:
        keys = np.sort(keys[rng.choice(keys.size, size=edges, replace=False)])
    r, c = keys // cols, keys % cols
    indptr = np.concatenate(([0], np.cumsum(np.bincount(r, minlength=rows)))).astype(np.int64)
    return _csr(_weights(rng, edges, weights), c, indptr, (rows, cols))


def _csr(data, indices, indptr, shape):
    idx_dtype = np.int32 if max(shape) < 2**31 and len(indices) < 2**31 else np.int64
    return sp.csr_matrix(
        (data, np.asarray(indices, dtype=idx_dtype), np.asarray(indptr, dtype=idx_dtype)),
        shape=shape,
    )


def rmat(
    scale: int,
    edge_factor: int = 16,
    seed=0,
    params=RMAT_PARAMS,
    scramble=True,
    directed=False,
    keep_self_loops=False,
    keep_duplicates=False,
):
    """Graph500-style R-MAT graph with ``2**scale`` vertices and ``edge_factor * 2**scale`` edges.

    Each edge picks one quadrant per bit with probabilities ``a, b, c, d`` (Graph500: 0.57,
    0.19, 0.19, 0.05), like the Graph500 reference generator; vertex labels are then scrambled
    by a seeded random permutation, so high-degree vertices are not clustered at low ids.

    Parameters
    ----------
    scale, edge_factor : int
    seed : int
    params : tuple of 4 floats
        Quadrant probabilities; must sum to 1.
    scramble : bool
        Apply the random vertex permutation (default, as Graph500).
    directed : bool
        Keep edges as drawn. By default the graph is undirected: every edge is stored in both
        directions, so the adjacency is symmetric (RMAT-18 then has about 7.6 M stored entries).
    keep_self_loops : bool
        Keep ``u -> u`` edges (removed by default).
    keep_duplicates : bool
        Keep repeated edges as their multiplicity (the stored weight counts how often the edge
        was drawn). By default duplicates are merged and every weight is 1.

    Returns
    -------
    scipy.sparse.csr_matrix of float64, shape (2**scale, 2**scale)
    """
    if not 1 <= scale <= 40:
        raise UsageError(f"--scale must be in 1..40, got {scale}")
    if edge_factor < 1:
        raise UsageError(f"--edge-factor must be >= 1, got {edge_factor}")
    a, b, c, d = (float(x) for x in params)
    if min(a, b, c, d) < 0 or abs(a + b + c + d - 1) > 1e-9:
        raise UsageError(f"R-MAT parameters must be >= 0 and sum to 1, got {params}")
    n = 1 << scale
    m = edge_factor * n
    # drawn pairs (16 bytes), both directions and the CSR built from them (~4x), the
    # permutation and the pointers
    check_memory(f"rmat --scale {scale} --edge-factor {edge_factor}", 80 * m + 24 * n)
    rng = np.random.default_rng(seed)
    # Graph500 reference: bit i of the row is set with probability c+d; the column bit then
    # with probability b/(a+b) or d/(c+d) depending on the row bit.
    ab = a + b
    p_col_top = b / ab if ab > 0 else 0.0
    p_col_bottom = d / (c + d) if c + d > 0 else 0.0
    src = np.empty(m, dtype=np.int64)
    dst = np.empty(m, dtype=np.int64)
    for lo in range(0, m, _RMAT_BATCH):
        hi = min(m, lo + _RMAT_BATCH)
        r = np.zeros(hi - lo, dtype=np.int64)
        q = np.zeros(hi - lo, dtype=np.int64)
        for bit in range(scale):
            row_bit = rng.random(hi - lo) >= ab
            p = np.where(row_bit, p_col_bottom, p_col_top)
            col_bit = rng.random(hi - lo) < p
            r |= row_bit.astype(np.int64) << bit
            q |= col_bit.astype(np.int64) << bit
        src[lo:hi] = r
        dst[lo:hi] = q
    if scramble:
        perm = rng.permutation(n)
        src = perm[src]
        dst = perm[dst]
    if not directed:
        src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
    if not keep_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    mat = sp.coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n)).tocsr()
    mat.sum_duplicates()  # canonical: sorted unique columns, weights = multiplicity
    if not keep_duplicates:
        mat.data[:] = 1.0
    return _csr(mat.data, mat.indices, mat.indptr, (n, n))
