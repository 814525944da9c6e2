"""Pure planning for the projection: work per output row, entry bounds, chunks, memory sizes.

Nothing here communicates or allocates more than a few arrays of the input's size, so every
rank computes the same plan from the same input and the plan is unit tested without MPI.
Rows of ``H = B^T B`` are the columns of ``B`` (``B`` is ``m x n``).
"""

from __future__ import annotations

import os
import re

import numpy as np

from ..errors import UsageError

__all__ = [
    "row_work",
    "row_bounds",
    "chunk_rows",
    "parse_size",
    "format_size",
    "available_memory",
    "scratch_bytes",
]


def row_work(b_indptr, b_indices, n: int, triangle: str = "full", keep_diag: bool = False):
    """Flops of every output row: ``sum over k in N(u) of deg(k)`` (``full``).

    For ``upper`` only the terms that land at columns ``v > u`` (``v >= u`` with
    ``keep_diag``) count, which is the work the kernel really does (it skips the rest of row
    ``k`` with one binary search).

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


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text) -> int:
    """``"64M"``, ``"2G"``, ``"1.5g"``, ``"500000"`` (bytes) -> bytes."""
    if isinstance(text, (int, np.integer)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise UsageError(f"memory size must look like 64M, 2G or 500000, got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return int(value)


def format_size(nbytes: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(nbytes) < 1024 or unit == "T":
            return f"{nbytes:.0f}{unit}" if unit == "B" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024
    return f"{nbytes:.1f}T"  # pragma: no cover


def available_memory() -> int:
    """``MemAvailable`` from /proc/meminfo (bytes), or total physical memory as a fallback."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 << 30


def scratch_bytes(n: int, threads: int, acc_bytes: int, idx_bytes: int, top_k, flag_bytes=0) -> int:
    """Per-rank scratch of the kernel: accumulator, flags, bitmap and touched list per thread."""
    per_thread = n * (acc_bytes + idx_bytes + flag_bytes) + 8 * (n // 64 + 2)
    if top_k:
        per_thread += min(n, int(top_k)) * (idx_bytes + 8)  # the row's bounded heap
    return threads * per_thread
