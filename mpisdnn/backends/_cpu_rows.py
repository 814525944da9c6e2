"""Rows of Y as (start, length) slices of buffers the CPU backend owns, and those buffers.

:class:`Rows` is what the tile kernels read and write between layer groups; :func:`_reserve`
gives a group's output buffers as untouched anonymous memory (only the pages written become
memory), which :func:`_drop_pages` returns as rows are consumed. Split from
:mod:`mpisdnn.backends.cpu`; the backend's steps are there.
"""

from __future__ import annotations

import mmap
import weakref

import numpy as np
import scipy.sparse as sp

__all__ = ["Rows"]


class Rows:
    """Rows of a sparse matrix as (start, length) slices of shared index/value buffers.

    Taking a subset of rows is free (no copy), and a kernel can write each chunk's rows
    wherever is convenient. ``to_csr`` gathers the rows into an ordinary CSR matrix.
    """

    __slots__ = ("starts", "lens", "indices", "data", "ncols")

    def __init__(self, starts, lens, indices, data, ncols):
        self.starts = starts
        self.lens = lens
        self.indices = indices
        self.data = data
        self.ncols = int(ncols)

    @classmethod
    def from_csr(cls, mat):
        """Rows of a CSR matrix: float32 values, int32 column indices sorted within each row.

        A matrix already in that canonical form is used in place (kernels never write to
        their input), otherwise it is copied and canonicalised: sorted indices are the
        canonical summation order (see ``sdnn.reference``).
        """
        m = sp.csr_matrix(mat)
        if not (m.dtype == np.float32 and m.has_canonical_format):
            m = sp.csr_matrix(m, dtype=np.float32, copy=True)
            m.sum_duplicates()  # also sorts the indices
        indptr = m.indptr.astype(np.int64, copy=False)
        return cls(
            indptr[:-1],
            np.diff(indptr),
            m.indices.astype(np.int32, copy=False),
            m.data.astype(np.float32, copy=False),
            m.shape[1],
        )

    @property
    def shape(self):
        return (int(self.starts.size), self.ncols)

    @property
    def nnz(self) -> int:
        return int(self.lens.sum())

    def take(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        return Rows(self.starts[rows], self.lens[rows], self.indices, self.data, self.ncols)

    def packed_in_order(self) -> bool:
        """Rows stored in row order without overlaps (what in-place compaction needs)."""
        ends = self.starts[:-1] + self.lens[:-1]
        return bool(np.all(self.starts[1:] >= ends)) and bool(np.all(self.starts >= 0))

    def to_csr(self, release=False) -> sp.csr_matrix:
        """The rows as an ordinary CSR matrix (a copy).

        ``release``: free the source buffer's pages as rows are copied (the rows must be
        in order in a buffer this module owns, and are unusable afterwards); the copy then
        never needs a second full-size buffer at once.
        """
        from . import _kernels

        indptr = np.zeros(self.starts.size + 1, np.int64)
        np.cumsum(self.lens, out=indptr[1:])
        oi = np.empty(int(indptr[-1]), np.int32)
        od = np.empty(int(indptr[-1]), np.float32)
        nrows = self.starts.size
        steps = np.linspace(0, nrows, 9 if release else 2).astype(np.int64)
        for r0, r1 in zip(steps[:-1], steps[1:]):
            if r1 <= r0:
                continue
            _kernels.gather_rows(
                self.starts[r0:r1],
                self.lens[r0:r1],
                self.indices,
                self.data,
                indptr[r0 : r1 + 1],
                oi,
                od,
            )
            if release:
                lo, hi = int(self.starts[r0]), int(self.starts[r1 - 1] + self.lens[r1 - 1])
                _drop_pages(self.indices, lo, hi)
                _drop_pages(self.data, lo, hi)
        return sp.csr_matrix((od, oi, indptr), shape=self.shape)


def _join_rows(pieces, n):
    """Rows of several ``(index in the input, rows)`` pieces as one, in input order."""
    pieces = [(idx, rows) for idx, rows in pieces if idx.size]
    if not pieces:
        empty = np.zeros(0, np.int64)
        return empty, Rows(empty, empty, np.zeros(0, np.int32), np.zeros(0, np.float32), n)
    if len(pieces) == 1:
        return pieces[0]
    idx = np.concatenate([p[0] for p in pieces])
    order = np.argsort(idx, kind="stable")
    lens = np.concatenate([p[1].lens for p in pieces])[order]
    indptr = np.zeros(idx.size + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    oi, od = _reserve(int(indptr[-1]))
    at = np.zeros(idx.size, np.int64)
    at[order] = indptr[:-1]
    from . import _kernels

    pos = 0
    for _, rows in pieces:
        m = rows.starts.size
        # gather_rows writes row ``r`` at ``indptr[r]``: here, its place in input order.
        dest = at[pos : pos + m]
        _kernels.gather_rows(rows.starts, rows.lens, rows.indices, rows.data, dest, oi, od)
        pos += m
    return idx[order], Rows(indptr[:-1], lens, oi, od, n)


def _merge_pieces(pieces, starts, lens, n):
    """Rows of consecutive batches ``(r0, r1, indices, data)`` as one :class:`Rows` (one
    buffer when there are several: rare, only when a group exceeds the reserve)."""
    rows = [
        (np.arange(r0, r1, dtype=np.int64), Rows(starts[r0:r1], lens[r0:r1], oi, od, n))
        for r0, r1, oi, od in pieces
    ]
    return rows[0][1] if len(rows) == 1 else _join_rows(rows, n)[1]


#: Output buffers this module allocated: ``id(array) -> (weakref(array), mmap)``. Only
#: these may be compacted in place or have their pages returned (never a caller's arrays).
_OWNED = {}


def _reserve(entries: int):
    """Index and value arrays with room for ``entries``, as untouched anonymous memory.

    Anonymous ``mmap`` instead of ``np.empty``: numpy asks for transparent huge pages on big
    arrays, and then one written byte makes 2 MiB resident; with 4 KiB pages, only the pages
    a chunk writes ever count towards the process's memory.
    """
    entries = max(1, int(entries))
    out = []
    for dtype in (np.int32, np.float32):
        try:
            m = mmap.mmap(-1, entries * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (AttributeError, OSError, ValueError):  # no anonymous mmap here: plain memory
            out.append(np.empty(entries, dtype=dtype))
            continue
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
        arr = np.frombuffer(m, dtype=dtype, count=entries)
        key = id(arr)
        _OWNED[key] = (weakref.ref(arr, lambda _ref, key=key: _OWNED.pop(key, None)), m)
        out.append(arr)
    return out[0], out[1]


def _mmap_of(arr):
    entry = _OWNED.get(id(arr))
    return entry[1] if entry is not None and entry[0]() is arr else None


def _owned(rows) -> bool:
    return _mmap_of(rows.indices) is not None and _mmap_of(rows.data) is not None


def _drop_pages(arr, lo: int, hi: int) -> None:
    """Return the memory of the whole pages inside ``arr[lo:hi]`` (they read as zeros after)."""
    m = _mmap_of(arr)
    if m is None or not hasattr(mmap, "MADV_DONTNEED") or not hasattr(m, "madvise"):
        return
    page = mmap.PAGESIZE
    start = -(-lo * arr.itemsize // page) * page
    end = (hi * arr.itemsize // page) * page
    if end > start:
        m.madvise(mmap.MADV_DONTNEED, start, end - start)
