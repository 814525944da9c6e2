"""Re-balancing active rows across ranks while layers run.

Rows die unevenly, so the nnz-balanced split of Y0 goes stale: after a few layers one rank
can hold most of the surviving work. Between layer groups the engine measures every rank's
work (:func:`imbalance`), and past a threshold it moves rows so that each rank holds a
contiguous, equally weighted share of the global row order (:func:`destinations`), with
:func:`exchange_rows` (``Alltoallv``). Rows keep their global id, so categories and the final
Y are assembled exactly as without moves; since the global order never changes, every rank's
rows stay sorted by global id and the final return home is another contiguous exchange.

The planning functions are pure (no MPI) so they can be unit tested and every rank computes
the same plan from the same gathered numbers.
"""

from __future__ import annotations

import numpy as np

from ..parallel import alltoall_array, alltoallv_array, phase
from ..partition import balanced_blocks

__all__ = ["imbalance", "destinations", "home_destinations", "exchange_rows"]


def imbalance(work) -> float:
    """``max / mean`` of per-rank work (1.0 is perfect; 1.0 as well when there is no work)."""
    w = np.asarray(work, dtype=np.float64)
    if w.size == 0 or w.sum() <= 0:
        return 1.0
    return float(w.max() / w.mean())


def destinations(weights_by_rank, rank: int):
    """New owner of each of ``rank``'s rows when all rows are re-split by weight.

    Parameters
    ----------
    weights_by_rank : sequence of 1-D arrays
        Work of every row of every rank, in rank order (each rank's rows in their order).
    rank : int
        The rank whose rows are planned.

    Returns
    -------
    dest : ndarray of int64
        Non-decreasing destination rank of each of ``rank``'s rows.
    after : float
        Predicted :func:`imbalance` of the new split.
    """
    sizes = np.array([len(w) for w in weights_by_rank], dtype=np.int64)
    nparts = sizes.size
    allw = (
        np.concatenate([np.asarray(w, dtype=np.float64) for w in weights_by_rank])
        if nparts
        else np.zeros(0)
    )
    offsets = balanced_blocks(allw, nparts)
    cum = np.concatenate(([0.0], np.cumsum(allw)))
    after = imbalance(cum[offsets[1:]] - cum[offsets[:-1]])
    first = int(sizes[:rank].sum())
    pos = np.arange(first, first + int(sizes[rank]), dtype=np.int64)
    dest = np.searchsorted(offsets, pos, side="right") - 1
    return np.minimum(dest, nparts - 1).astype(np.int64), after


def home_destinations(gid, home_offsets):
    """Rank whose original row block holds each global row id (``home_offsets``: P + 1)."""
    dest = np.searchsorted(np.asarray(home_offsets), np.asarray(gid), side="right") - 1
    return dest.astype(np.int64)


@phase("rebalance")
def exchange_rows(comm, mat, gid, dest):
    """Send row ``i`` of ``mat`` (CSR) and its global id to rank ``dest[i]``.

    ``dest`` must be non-decreasing (each destination gets one contiguous slice); rows arrive
    in source-rank order, so globally sorted ids stay sorted. Collective over ``comm``.

    Returns
    -------
    mat : scipy.sparse.csr_matrix, gid : ndarray of int64
        This rank's rows after the exchange.
    """
    import scipy.sparse as sp

    size = comm.size
    dest = np.asarray(dest, dtype=np.int64)
    if dest.size and np.any(np.diff(dest) < 0):
        raise ValueError("destinations must be non-decreasing")
    indptr = np.asarray(mat.indptr, dtype=np.int64)
    lens = np.diff(indptr)
    row_counts = np.bincount(dest, minlength=size).astype(np.int64)
    row_end = np.cumsum(row_counts)
    cum = np.concatenate(([0], np.cumsum(lens)))
    nnz_counts = (cum[row_end] - cum[row_end - row_counts]).astype(np.int64)

    recv_rows = alltoall_array(comm, row_counts)
    recv_nnz = alltoall_array(comm, nnz_counts)
    new_lens = alltoallv_array(comm, lens, row_counts, recv_rows)
    new_gid = alltoallv_array(comm, np.asarray(gid, np.int64), row_counts, recv_rows)
    new_idx = alltoallv_array(comm, np.asarray(mat.indices, np.int32), nnz_counts, recv_nnz)
    new_val = alltoallv_array(comm, np.asarray(mat.data, np.float32), nnz_counts, recv_nnz)
    new_ptr = np.zeros(new_lens.size + 1, np.int64)
    np.cumsum(new_lens, out=new_ptr[1:])
    return sp.csr_matrix((new_val, new_idx, new_ptr), shape=(new_lens.size, mat.shape[1])), new_gid
