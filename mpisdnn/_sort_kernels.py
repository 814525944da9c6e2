"""Sorts written out as loops for numba kernels (imported by ``formats._tsv_kernels`` and
``backends._kernels``).

numba compiles its own sort (``np.argsort``, ``ndarray.sort``) into every kernel that calls
it, 1.1-1.6 s of a first run each, and an array slice assignment (``a[:] = b``) about 3 s
more; these loops compile in a fraction of that and run as fast on the sizes the kernels
sort (a row of columns, a chunk's lanes, a layer's column hashes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["RUN", "sort_pairs", "argsort_small", "heapsort"]

#: Runs an insertion sort orders before :func:`sort_pairs` merges them.
RUN = 32


@njit(cache=True)
def sort_pairs(keys, vals):
    """Sort ``keys`` ascending, in place and stably, ``vals`` moved with them: insertion
    sorts of :data:`RUN`-entry runs, then bottom-up merges (:func:`_merge_runs`) between
    the arrays and one buffer pair.

    In ``formats._tsv_kernels.sort_rows`` it replaced ``np.argsort(kind="mergesort")`` and
    the slice assignments of the sorted copies: 3.8-4.6 -> 1.7 s of a first run, and no
    copy through an index array (which read both arrays twice)."""
    n = keys.size
    for lo in range(0, n, RUN):
        hi = min(n, lo + RUN)
        for i in range(lo + 1, hi):
            k = keys[i]
            v = vals[i]
            j = i - 1
            while j >= lo and keys[j] > k:  # strictly greater: equal keys keep their order
                keys[j + 1] = keys[j]
                vals[j + 1] = vals[j]
                j -= 1
            keys[j + 1] = k
            vals[j + 1] = v
    if n <= RUN:
        return
    tk = np.empty(n, keys.dtype)
    tv = np.empty(n, vals.dtype)
    width = RUN
    moved = False  # the sorted runs are in the buffers
    while width < n:
        if moved:
            _merge_runs(tk, tv, keys, vals, width)
        else:
            _merge_runs(keys, vals, tk, tv, width)
        moved = not moved
        width *= 2
    if moved:  # element by element: an array slice assignment costs numba ~3 s to compile
        for i in range(n):
            keys[i] = tk[i]
            vals[i] = tv[i]


@njit(cache=True)
def _merge_runs(sk, sv, dk, dv, width):
    """Merge each pair of sorted ``width``-entry runs of ``sk`` (``sv`` alongside) into
    ``dk``/``dv``; on equal keys the left run's entry first (stable)."""
    n = sk.size
    for lo in range(0, n, 2 * width):
        mid = min(n, lo + width)
        hi = min(n, lo + 2 * width)
        i = lo
        j = mid
        o = lo
        while i < mid and j < hi:
            if sk[j] < sk[i]:
                dk[o] = sk[j]
                dv[o] = sv[j]
                j += 1
            else:
                dk[o] = sk[i]
                dv[o] = sv[i]
                i += 1
            o += 1
        while i < mid:
            dk[o] = sk[i]
            dv[o] = sv[i]
            i += 1
            o += 1
        while j < hi:
            dk[o] = sk[j]
            dv[o] = sv[j]
            j += 1
            o += 1


@njit(cache=True)
def argsort_small(keys):
    """The indices that sort ``keys`` (int64; ties in index order), by :func:`sort_pairs`
    on a copy: what ``np.argsort`` returns for distinct keys."""
    n = keys.size
    k = np.empty(n, np.int64)
    order = np.empty(n, np.int64)
    for i in range(n):
        k[i] = keys[i]
        order[i] = i
    sort_pairs(k, order)
    return order


@njit(cache=True, boundscheck=False)
def heapsort(a):
    """Sort ``a`` ascending in place (not stable: for distinct-value checks). In
    ``backends._kernels._stride_of_sets`` it replaced ``a.sort()``: 2.8-2.9 -> 1.1-1.3 s of
    a first run."""
    n = a.size
    for top in range(n // 2 - 1, -1, -1):
        _sift_down(a, top, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift_down(a, 0, end)


@njit(cache=True, boundscheck=False, inline="always")
def _sift_down(a, i, n):
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and a[c + 1] > a[c]:
            c += 1
        if a[i] >= a[c]:
            return
        a[i], a[c] = a[c], a[i]
        i = c
