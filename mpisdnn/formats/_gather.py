"""The writers' block copy: a chunk's per-block entries, gathered behind what is staged.

Used by the projection's in-memory result and the direct-I/O writer; a numba kernel (this
module is imported lazily, so ``import mpisdnn.formats`` does not load numba).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["gather_blocks"]


@njit(parallel=True, cache=True, nogil=True)
def gather_blocks(src_idx, src_val, blk_cap, blk_cnt, dst_idx, dst_val, pos):
    """Copy block ``b``'s entries from ``src[blk_cap[b]:]`` to ``dst`` behind ``pos``, in order
    (in parallel: the destinations are known from the block counts). Returns the new end."""
    nb = blk_cnt.size
    start = np.empty(nb + 1, np.int64)
    start[0] = pos
    for b in range(nb):
        start[b + 1] = start[b] + blk_cnt[b]
    for b in prange(nb):
        s = blk_cap[b]
        d = start[b]
        for j in range(blk_cnt[b]):
            dst_idx[d + j] = src_idx[s + j]
            dst_val[d + j] = src_val[s + j]
    return start[nb]
