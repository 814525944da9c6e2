"""Symmetric storage: full rows from a stored upper triangle (``storage="symmetric"``).

A symmetric projection file holds row ``u``'s entries ``v >= u`` only. Full row ``u`` is the
stored column ``u`` above the diagonal (the entries ``(v, u)``, ``v < u``, ascending ``v``)
followed by the stored row: the two never interleave, so a full row is a concatenation.

* :func:`mirror_csr` does it in memory (``read_projection``).
* :func:`iter_mirrored` does it out of core (``iter_projection``): one pass counts every
  column's entries to cut blocks of about ``max_entries`` full entries, a second pass sorts the
  entries below the diagonal into one spill file per block, and each block then reads its
  stored rows plus its spill file. Memory is bounded by the block size plus ``8 n`` bytes;
  the spill files take the size of the stored entries once and are removed at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import scipy.sparse as sp

__all__ = ["mirror_csr", "merge_rows", "iter_mirrored"]

#: Stored entries read at once by the out-of-core passes.
_PIECE = 1 << 22


def merge_rows(l_ptr, l_idx, l_val, u_ptr, u_idx, u_val):
    """Rows made of a lower part (columns below the diagonal) followed by an upper part.

    All pointers are int64 and start at 0; returns ``(ptr, idx, val)``.
    """
    l_cnt, u_cnt = np.diff(l_ptr), np.diff(u_ptr)
    ptr = l_ptr + u_ptr
    idx = np.empty(int(ptr[-1]), dtype=np.result_type(l_idx.dtype, u_idx.dtype))
    val = np.empty(int(ptr[-1]), dtype=np.result_type(l_val.dtype, u_val.dtype))
    lpos = np.arange(l_idx.size, dtype=np.int64) + np.repeat(ptr[:-1] - l_ptr[:-1], l_cnt)
    upos = np.arange(u_idx.size, dtype=np.int64) + np.repeat(ptr[:-1] + l_cnt - u_ptr[:-1], u_cnt)
    idx[lpos], val[lpos] = l_idx, l_val
    idx[upos], val[upos] = u_idx, u_val
    return ptr, idx, val


def _rows_of(ptr, lo: int, hi: int) -> np.ndarray:
    """The row of every entry ``lo <= j < hi`` under row pointers ``ptr``."""
    return np.searchsorted(ptr, np.arange(lo, hi, dtype=np.int64), side="right") - 1


def mirror_csr(ptr, idx, val, shape):
    """``(ptr, idx, val)`` of the full matrix whose upper triangle is the given CSR.

    ``ptr`` is int64 starting at 0; columns are sorted within rows.
    """
    n = shape[0]
    ptr = np.asarray(ptr, dtype=np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    strict = idx > rows
    s_cnt = np.bincount(rows[strict], minlength=n)
    del rows
    s_ptr = np.concatenate(([0], np.cumsum(s_cnt)))
    upper = sp.csr_matrix((val[strict], idx[strict], s_ptr), shape=shape)
    lower = upper.T.tocsr()  # scipy's transpose sorts the columns of every row
    lower.sort_indices()
    return merge_rows(
        lower.indptr.astype(np.int64), lower.indices, lower.data, ptr, np.asarray(idx), val
    )


def _column_counts(indptr, indices, n: int, where="the stored matrix") -> np.ndarray:
    """Entries above the diagonal in every column, in pieces of the stored entries; a
    column outside ``0 .. n - 1`` (a damaged file) is one line naming ``where``."""
    from ...errors import InputError

    counts = np.zeros(n, dtype=np.int64)
    nnz = int(indptr[-1])
    for lo in range(0, nnz, _PIECE):
        hi = min(nnz, lo + _PIECE)
        cols = np.asarray(indices[lo:hi], dtype=np.int64)
        if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= n):
            raise InputError(f"{where}: column indices outside 0..{n - 1} (damaged?)")
        counts += np.bincount(cols[cols > _rows_of(indptr, lo, hi)], minlength=n)
    return counts


def _spill(indptr, indices, data, offsets, directory) -> list:
    """Every entry ``(v, u)`` above the diagonal, as ``(u, v, value)``, into its block's files."""
    nnz = int(indptr[-1])
    names = [os.path.join(directory, f"b{k:07d}") for k in range(offsets.size - 1)]
    for lo in range(0, nnz, _PIECE):
        hi = min(nnz, lo + _PIECE)
        cols = np.asarray(indices[lo:hi], dtype=np.int64)
        rows = _rows_of(indptr, lo, hi)
        keep = cols > rows
        cols, rows, vals = cols[keep], rows[keep], np.asarray(data[lo:hi])[keep]
        block = np.searchsorted(offsets, cols, side="right") - 1
        order = np.argsort(block, kind="stable")  # rows stay ascending within a column
        cols, rows, vals, block = cols[order], rows[order], vals[order], block[order]
        cuts = np.flatnonzero(np.diff(block)) + 1
        for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [block.size]))):
            if b > a:
                k = int(block[a])
                for suffix, arr in ((".u", cols), (".v", rows), (".x", vals)):
                    with open(names[k] + suffix, "ab") as fh:
                        arr[a:b].tofile(fh)
    return names


def _read_spill(name: str, val_dtype):
    if not os.path.exists(name + ".u"):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, val_dtype)
    return (
        np.fromfile(name + ".u", dtype=np.int64),
        np.fromfile(name + ".v", dtype=np.int64),
        np.fromfile(name + ".x", dtype=val_dtype),
    )


def iter_mirrored(indptr, indices, data, n: int, max_entries: int, tmpdir,
                  where="the stored matrix"):  # fmt: skip
    """Yield ``(row_start, ptr, idx, val)`` blocks of full rows of a symmetric file.

    ``indptr`` is the whole (int64) row pointer array; ``indices`` and ``data`` are sliceable
    (HDF5 datasets). Spill files go to a new directory under ``tmpdir``, removed at the end
    (also when the caller stops early).
    """
    from ...partition import chunk_rows

    indptr = np.asarray(indptr, dtype=np.int64)
    full_len = np.diff(indptr) + _column_counts(indptr, indices, n, where)
    offsets = chunk_rows(full_len, max_entries)
    directory = tempfile.mkdtemp(prefix=".mirror-", dir=tmpdir)
    try:
        names = _spill(indptr, indices, data, offsets, directory)
        for k, name in enumerate(names):
            a, b = int(offsets[k]), int(offsets[k + 1])
            u_ptr = indptr[a : b + 1] - indptr[a]
            u_idx = np.asarray(indices[int(indptr[a]) : int(indptr[b])])
            u_val = np.asarray(data[int(indptr[a]) : int(indptr[b])])
            cols, rows, vals = _read_spill(name, u_val.dtype)
            order = np.argsort(cols, kind="stable")
            l_cnt = np.bincount(cols - a, minlength=b - a)
            l_ptr = np.concatenate(([0], np.cumsum(l_cnt)))
            ptr, idx, val = merge_rows(
                l_ptr, rows[order].astype(u_idx.dtype), vals[order], u_ptr, u_idx, u_val
            )
            for suffix in (".u", ".v", ".x"):
                if os.path.exists(name + suffix):
                    os.remove(name + suffix)
            yield a, ptr, idx, val
    finally:
        shutil.rmtree(directory, ignore_errors=True)
