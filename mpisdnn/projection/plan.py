"""Pure planning for the projection: work per output row, entry bounds, chunks, memory sizes.

Nothing here communicates or allocates more than a few arrays of the input's size, so every
rank computes the same plan from the same input and the plan is unit tested without MPI.
Rows of ``H = B^T B`` are the columns of ``B`` (``B`` is ``m x n``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
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
