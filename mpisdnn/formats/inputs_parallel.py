"""Write an inputs file (the ``inputs.h5`` layout of :mod:`.hdf5`) from every rank's row block.

The ranks compress in parallel, rank 0 writes: the entries are cut into the dataset's
chunks (``hdf5._CHUNK`` entries), each chunk is compressed by the rank
that holds its first entry (the few entries of a chunk that crosses a block boundary are
sent to it), with exactly the filters the dataset declares (byte shuffle, then deflate
level 1), and rank 0 stores the compressed chunks in order with ``write_direct_chunk``.
Only compressed chunks travel, one at a time, and rank 0 makes the same HDF5 calls whatever
the number of ranks, so the file is byte for byte the same at every rank count.
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from ..parallel import (
    agree_root,
    allgather,
    exscan,
    gather,
    isend_array,
    recv_array,
    send_array,
)
from . import hdf5
from .hdf5 import INPUTS_FORMAT, _verify_hdf5, stamp

__all__ = ["write_inputs_parallel"]

_LEVEL = 1  # the deflate level of hdf5._COMPRESSION
_TAG = 7311


def _shuffle_deflate(values: np.ndarray, chunk: int) -> bytes:
    """One chunk as HDF5 stores it: padded to ``chunk`` entries with zeros (HDF5 stores
    the last chunk whole), bytes shuffled (byte k of every value together), deflated."""
    if values.size < chunk:
        values = np.concatenate((values, np.zeros(chunk - values.size, values.dtype)))
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(chunk, values.dtype.itemsize)
    return zlib.compress(np.ascontiguousarray(raw.T).tobytes(), _LEVEL)


def _whole_chunks(comm, indices, data, first, chunk):
    """Move the entries before this rank's first chunk start to the rank holding that
    chunk's start; return this rank's ``(entries, received)`` for indices and data (whole
    chunks from ``start`` on) and ``start``."""
    n = indices.size
    starts = np.array(allgather(comm, (first, n)), dtype=np.int64).reshape(-1, 2)
    head = min(n, (-first) % chunk)
    dest = comm.rank
    if head:
        c0 = (first // chunk) * chunk
        holders = np.flatnonzero((starts[:, 0] <= c0) & (c0 < starts[:, 0] + starts[:, 1]))
        dest = int(holders[0])
    heads = allgather(comm, (dest, head))
    extra_i, extra_d = [], []
    reqs = []
    if head and dest != comm.rank:
        reqs.append(isend_array(comm, np.ascontiguousarray(indices[:head]), dest, _TAG))
        reqs.append(isend_array(comm, np.ascontiguousarray(data[:head]), dest, _TAG + 1))
    for src, (d, h) in enumerate(heads):
        if d == comm.rank and src != comm.rank and h:
            bi, bd = np.empty(h, indices.dtype), np.empty(h, data.dtype)
            recv_array(comm, bi, src, _TAG)
            recv_array(comm, bd, src, _TAG + 1)
            extra_i.append(bi)
            extra_d.append(bd)
    for r in reqs:
        r.Wait()
    if head and dest != comm.rank:
        indices, data, first = indices[head:], data[head:], first + head
    # the heads received complete this rank's last chunk: kept apart, not concatenated
    # onto the whole block (that copy was the writer's memory peak)
    extra_i = np.concatenate(extra_i) if extra_i else indices[:0]
    extra_d = np.concatenate(extra_d) if extra_d else data[:0]
    return (indices, extra_i), (data, extra_d), first


def _compressed(values, first, chunk):
    """This rank's chunks as ``(index, bytes)``: ``values`` = (its entries from ``first``, a
    chunk boundary, and the entries after them that complete its last chunk)."""
    own, extra = values
    out = []
    m = own.size
    last = last_raw = None
    for lo in range(0, m + extra.size, chunk):
        piece = own[lo : lo + chunk]
        if lo + chunk > m and extra.size:
            piece = np.concatenate((piece, extra))
        bits = piece.view(np.uint8)
        # a chunk with the bytes of the one before compresses to the same bytes: the
        # official inputs' values are all 1, and deflate was a third of the writing time
        if last is None or not np.array_equal(bits, last):
            last, last_raw = bits, _shuffle_deflate(piece, chunk)
        out.append(((first + lo) // chunk, last_raw))
    return out


def write_inputs_parallel(comm, path, block, truth=None, source="") -> None:
    """Write the inputs file ``path`` from every rank's :class:`~.tsv_parallel.ImagesBlock`.

    Parameters
    ----------
    comm : mpi4py communicator
        Collective.
    path : path-like
        Output (written under a temporary name on rank 0, verified, renamed).
    block : ImagesBlock
        This rank's rows (``y``, ``row_offset``) and the global sizes.
    truth : ndarray, optional
        1-based categories (only rank 0's is used).
    source : str
        The ``source`` attribute.

    Raises
    ------
    AgreedError
        On every rank, when rank 0 could not write (one message; nothing is left behind).
    """
    y = block.y
    first = exscan(comm, int(y.nnz)) or 0
    chunk = min(hdf5._CHUNK, block.g_nnz) or 1
    indices = np.asarray(y.indices, dtype=np.int32)
    data = np.asarray(y.data, dtype=np.float32)
    indices, data, start = _whole_chunks(comm, indices, data, first, chunk)
    parts = [_compressed(indices, start, chunk), _compressed(data, start, chunk)]
    del indices, data
    indptr = np.asarray(y.indptr[1:], dtype=np.int64) + first
    ptrs = gather(comm, indptr, root=0)
    del indptr
    sizes = gather(comm, [len(p) for p in parts], root=0)
    if comm.rank != 0:
        for chunks in parts:
            for index, raw in chunks:
                head = np.array([index, len(raw)], dtype=np.int64)
                send_array(comm, head, 0, _TAG + 2)
                send_array(comm, np.frombuffer(raw, np.uint8), 0, _TAG + 3)
        agree_root(comm, lambda: None, idle=True)
        return

    chunks = _Chunks(comm, parts, sizes)

    def write():
        try:
            indptr = np.concatenate([np.zeros(1, np.int64), *ptrs])
            _write(path, block, indptr, chunks, truth, source)
        finally:
            chunks.drain()  # the other ranks block in Send until everything is received

    agree_root(comm, write, idle=True)


class _Chunks:
    """Rank 0's view of every rank's compressed chunks, received in order as written."""

    def __init__(self, comm, parts, sizes):
        self.comm, self.parts, self.sizes = comm, parts, sizes
        self.left = [[sizes[src][k] for k in (0, 1)] for src in range(comm.size)]

    def __call__(self, k):
        """Chunks ``(index, bytes)`` of dataset ``k`` (0 indices, 1 data), in order."""
        yield from self.parts[k]
        for src in range(1, self.comm.size):
            while self.left[src][k]:
                item = self._recv(src)
                self.left[src][k] -= 1  # before the yield: the consumer may fail with it
                yield item

    def _recv(self, src):
        head = np.empty(2, np.int64)
        recv_array(self.comm, head, src, _TAG + 2)
        raw = np.empty(int(head[1]), np.uint8)
        recv_array(self.comm, raw, src, _TAG + 3)
        return int(head[0]), raw.tobytes()

    def drain(self) -> None:
        """Receive (and drop) what a failed write left unread, in the senders' order."""
        for k in (0, 1):
            for src in range(1, self.comm.size):
                while self.left[src][k]:
                    self._recv(src)
                    self.left[src][k] -= 1


def _write(path, block, indptr, chunks, truth, source) -> None:
    from ._atomic import atomic_h5

    nnz, rows, n = block.g_nnz, block.g_rows, block.y.shape[1]
    raw = 8 * (rows + 1) + 8 * nnz + 8 * (0 if truth is None else np.size(truth))
    with atomic_h5(os.fspath(path), _verify_hdf5, int(raw * 1.05) + (1 << 16)) as f:
        stamp(f, INPUTS_FORMAT, source, {"rows": rows, "neurons": n})
        g = f.create_group("features")
        g.create_dataset("indptr", data=indptr)
        for k, (name, dtype) in enumerate((("indices", np.int32), ("data", np.float32))):
            if nnz == 0:
                g.create_dataset(name, data=np.empty(0, dtype))
                continue
            chunk = min(hdf5._CHUNK, nnz)
            dset = g.create_dataset(
                name,
                shape=(nnz,),
                dtype=dtype,
                chunks=(chunk,),
                compression="gzip",
                compression_opts=_LEVEL,
                shuffle=True,
            )
            for index, raw_chunk in chunks(k):
                dset.id.write_direct_chunk((index * chunk,), raw_chunk)
        if truth is not None:
            f.create_dataset("truth", data=np.asarray(truth, dtype=np.int64))
        f.flush()
