"""The parallel inputs reader's routing: kept blocks to their rows' owners, into the CSR.

What ``tsv_parallel`` keeps of each parsed block (:func:`kept`: one key per entry, grouped
by band of rows, the values only when they differ, in an :class:`Arena` for a plain file),
the nnz-balanced row blocks and every source's place in each row (:func:`plan`), and the
rounds that send each block's runs to their owners and place them (:func:`route`). The
official files are in column order, so the placement is a transposition: the bands keep the
rows written at once to as many cache lines as fit in L1.
"""

from __future__ import annotations

import mmap

import numpy as np

from ..parallel import allreduce, allreduce_in_place, alltoall_array, alltoallv_array
from ..partition import balanced_blocks, block_of
from ..system import populate, release, small_pages

__all__ = ["BAND_SHIFT", "MAX_BANDS", "Arena", "kept", "plan", "route"]

#: log2 of the rows of one band: a kept block's entries are grouped by band of rows, so the
#: routing's scatter of a band into the CSR writes at most this many rows' cache lines at
#: once (512 x 64 B: L1). Measured on the 2-core EPYC VM, 30 M entries into 3,000 rows: 5.1
#: ns an entry in file order, 3.6 / 2.9 / 2.4 / 2.0 ns with bands of 64 / 128 / 256 / 512
#: rows, 4.3 ns at 1,024 (out of L1).
BAND_SHIFT = 9
#: Most bands of one block (more rows: wider bands): the grouping writes one stream a band.
MAX_BANDS = 1024


def kept(rows, cols, vals, top, ncols, counts, arena=None):
    """One block's entries as kept until routed, its entries per row added to ``counts``.

    Returns ``(keys, bits, bands, shift)``: each entry as one key ``row << 16 | col``
    (uint32, where the block's rows, largest ``top``, and the columns, below ``ncols``, fit
    16 bits; else ``row << 32 | col``, uint64) grouped by band of rows (``row >> shift``;
    band ``b``'s entries are ``keys[bands[b]:bands[b + 1]]``, in file order), and the
    values' int32 bits in the same order, or one when every value has the same bits (the
    official files' 1s). A kept entry costs 4 bytes for the official files up to N =
    65536 (12 at most); the copies are needed anyway (the parser reuses its arrays), so the
    grouping costs little over a plain copy and spares the routing a scatter over every row
    of the rank at once (:data:`BAND_SHIFT`).
    """
    from . import _tsv_kernels as K

    n = rows.size
    shift = BAND_SHIFT
    while (top >> shift) >= MAX_BANDS:
        shift += 1
    bands = np.zeros((top >> shift) + 2, dtype=np.int64)
    bits = vals.view(np.int32)
    same = K.band_counts(rows, counts, shift, bands, bits)
    np.cumsum(bands, out=bands)
    narrow = top < 1 << 16 and ncols <= 1 << 16
    keys = arena.take(n) if narrow and arena is not None else None
    if keys is None:
        keys = _own_empty(n, np.uint32 if narrow else np.uint64)
    kept_bits = bits[:1].copy() if same else _own_empty(n, np.int32)
    pos = bands[:-1].copy()
    K.band_scatter(rows, cols, bits, shift, pos, keys, kept_bits[:0] if same else kept_bits)
    return keys, kept_bits, bands, shift


class Arena:
    """One anonymous map for the narrow keys of a rank's byte range, taken block after block
    (faulted in as taken). With one value in the file, this memory, already faulted in and
    about as large as the rank's CSR, becomes the CSR's values once the keys are placed:
    the values cost no fresh memory (measured at 2 ranks: the routing 0.27-0.32 -> 0.21-0.22 s
    CPU per rank) and the peak is 4 B an entry lower (535 -> 420 MiB per rank)."""

    def __init__(self, entries, buf):
        self.cap, self.buf, self.used = entries, buf, 0

    @classmethod
    def reserve(cls, nbytes, block_bytes):
        """Room for every entry ``nbytes`` of text, parsed in blocks of ``block_bytes``, can
        hold; ``None`` where the address space refuses it (the blocks then take their own
        maps)."""
        entries = nbytes // 5 + 2 * (nbytes // block_bytes + 2)  # the parser's: "1 1 1"
        try:
            return cls(entries, mmap.mmap(-1, 4 * entries, flags=mmap.MAP_PRIVATE))
        except (OSError, OverflowError, ValueError):
            return None

    def take(self, n):
        """The next ``n`` uint32, faulted in (``None`` when the room is short)."""
        if self.used + n > self.cap:
            return None
        out = np.frombuffer(self.buf, np.uint32, n, 4 * self.used)
        self.used += n
        populate(out)
        return out

    def fits(self, nnz) -> bool:
        """Whether ``nnz`` values fit."""
        return nnz <= self.cap

    def values(self, nnz, value):
        """``nnz`` int32 ``value`` in this memory (the keys there are all placed); the pages
        the keys took past them go back to the kernel (a rank that kept more entries than
        its rows hold: an early rank of a ``.gz``, which parses the longer segment)."""
        out = np.frombuffer(self.buf, np.int32, nnz)
        populate(out, min(self.used, nnz))  # what the keys did not touch, in bulk
        out.fill(value)
        if self.used > nnz:
            release(np.frombuffer(self.buf, np.int32, self.used), nnz)
        return out


def _own_empty(n, dtype):
    """An array of ``n`` ``dtype`` in its own anonymous memory map, unmapped as soon as it is
    dropped (a kept block is a few MiB: after the first such free, glibc's growing mmap
    threshold would put the next ones on the heap, whose freed middle stays the
    process's)."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < (1 << 20):
        return np.empty(n, dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    out = np.frombuffer(m, dtype=dtype, count=n)
    populate(out)  # one bulk fault: the grouping's scatter faulted page by page at 3x the CPU
    return out


def plan(comm, counts, g_rows):
    """The row blocks and where each rank's entries go in this rank's CSR (collective).

    ``counts``: this rank's entries per row (rows up to its largest). Returns ``(offsets,
    starts)``: the nnz-balanced row blocks of the whole file (the serial path's), and
    ``starts`` (P + 1 rows, one per source rank and the end, int64): the CSR position of
    source rank ``s``'s first entry in each of this rank's rows. Entries from lower ranks
    come first in a row, so a file whose rows are in column order within each range and
    across ranks (the official files: column-major; or row-major) gives sorted rows.
    """
    mine = np.zeros(g_rows, dtype=np.int64)
    mine[: counts.size] = counts
    total = mine.copy()
    if comm.size > 1:
        allreduce_in_place(comm, total)
    offsets = balanced_blocks(total, comm.size)
    r0, r1 = block_of(offsets, comm.rank)
    del total
    width = np.diff(np.asarray(offsets, dtype=np.int64))
    got = alltoallv_array(comm, mine, width, np.full(comm.size, r1 - r0, np.int64))
    del mine
    starts = np.zeros((comm.size + 1, r1 - r0), dtype=np.int64)
    per_source = got.reshape(comm.size, r1 - r0)
    # row r's entries from source s start after rows < r (all sources) and sources < s
    whole = per_source.sum(axis=0)
    starts[0, 1:] = np.cumsum(whole)[:-1]
    np.cumsum(per_source, axis=0, out=starts[1:])
    starts[1:] += starts[0]
    return offsets, starts


def route(comm, parsed, offsets, starts, value, wide, arena=None):
    """Send each kept block's entries to their rows' owners and place what arrives at the
    rows' fill pointers, one per source rank (``starts``); returns ``(indices, data, bytes
    this rank sent)``.

    One kept block per round (:class:`_Exchange`); a rank's own run goes from its kept
    block straight to its CSR. ``value``: the bits of the file's one value (written once,
    in one sequential fill, never routed), or ``None``. ``wide``: the file's rows or columns
    pass 16 bits (uint64 keys on the wire). Each block is freed once placed, so the CSR
    fills as the kept entries go; the runs arrive grouped by band, so the scatter into the
    CSR writes a band's rows at a time.

    ``arena`` (:class:`Arena`): where this rank's narrow keys were kept; with one value,
    its memory, already faulted in, becomes the CSR's values once the keys are placed."""
    from . import _tsv_kernels as K

    nnz = int(starts[-1][-1]) if starts.shape[1] else 0
    indices = np.empty(nnz, dtype=np.int32)
    with_data = value is None
    if not with_data and arena is not None and arena.fits(nnz):
        bits = None  # the arena's, after the rounds
        fresh = (indices,)
    else:
        bits = np.empty(nnz, np.int32)
        fresh = (indices, bits)
        arena = None
    for a in fresh:
        # the CSR's first touch, in bulk and in small pages: its rows fill from the first
        # round on, so a fault taken inside the scatter stalls it, and a first-touched huge
        # page costs the host a 2 MiB allocation (system.small_pages). Measured, 2 ranks:
        # the placement 0.40 s CPU per rank with its faults, 0.07-0.09 s + 0.1 s populating
        small_pages(a)
        populate(a)
    if bits is not None and not with_data:
        bits.fill(value)
    fill = starts[:-1].copy()
    size, me = comm.size, comm.rank
    ex = _Exchange(comm, offsets, np.uint64 if wide else np.uint32, with_data)
    out_bits = _EMPTY_BITS if bits is None else bits
    r0 = block_of(offsets, comm.rank)[0]
    rounds = allreduce(comm, len(parsed), op="max") if size > 1 else len(parsed)
    parsed.reverse()  # pop() from the end takes the blocks in file order
    for _ in range(rounds):
        keys, vbits, bands, shift = parsed.pop() if parsed else EMPTY_KEPT
        (a, b), recv, rbits, rcount = ex.round(keys, vbits, bands, shift)
        lo = 0
        for s in range(size):
            if s == me:
                own_bits = vbits[a:b] if vbits.size == keys.size else vbits
                placed = K.place_keys(
                    keys[a:b], own_bits, r0, fill[s], indices, out_bits, with_data
                )
            else:
                hi = lo + int(rcount[s])
                got_bits = rbits[lo:hi] if with_data else _EMPTY_BITS
                placed = K.place_keys(
                    recv[lo:hi], got_bits, r0, fill[s], indices, out_bits, with_data
                )
                lo = hi
            if not placed:
                raise RuntimeError("parallel TSV read: a routed entry has no place (a bug)")
        del keys, vbits, recv, rbits
    if not np.array_equal(fill, starts[1:]):
        raise RuntimeError("parallel TSV read: a row got other entries than counted (a bug)")
    if bits is None:
        bits = arena.values(nnz, value)
    return indices, bits.view(np.float32), ex.sent


class _Exchange:
    """One round of the routing: a kept block's runs to their owners (collective).

    The block's bands cut by a row block boundary are partitioned first
    (``_tsv_kernels.owner_cuts``), so each rank's entries are one run of the block, sent as
    it lies (:func:`~mpisdnn.parallel.alltoallv_array` with displacements: nothing packed)
    as keys (``wire``: uint32 ``row << 16 | col``, or uint64 ``row << 32 | col``), with the
    values' bits beside them only ``with_data``. The receive buffers are reused."""

    def __init__(self, comm, offsets, wire, with_data):
        self.comm, self.wire, self.with_data = comm, wire, with_data
        self.offs = np.asarray(offsets, dtype=np.int64)
        self.cuts = np.empty(comm.size + 1, dtype=np.int64)
        self.keys = np.empty(0, dtype=wire)
        self.bits = np.empty(0, dtype=np.int32)
        self.room = {}  # one band's room for owner_cuts, by key dtype
        self.sent = 0  # bytes this rank sent to the others

    def round(self, keys, vbits, bands, shift):
        """Returns ``((a, b), keys, bits, counts)``: this rank's own run ``keys[a:b]`` of
        the block, and what the others sent (``counts`` per source, in rank order)."""
        from . import _tsv_kernels as K

        comm, me, cuts = self.comm, self.comm.rank, self.cuts
        if comm.size == 1:
            return (0, keys.size), self.keys, self.bits, np.zeros(1, np.int64)
        widest = _cut_band(bands, shift, self.offs)
        tk, tb = self.room.get(keys.dtype, (keys[:0], _EMPTY_BITS))
        if tk.size < widest:
            tk, tb = np.empty(widest, keys.dtype), np.empty(widest, np.int32)
            self.room[keys.dtype] = tk, tb
        K.owner_cuts(keys, vbits, bands, shift, self.offs, cuts, tk, tb)
        scount = np.diff(cuts)
        scount[me] = 0  # placed from the kept block, in its turn among the sources
        rcount = alltoall_array(comm, scount)
        total = int(rcount.sum())
        if self.keys.size < total:
            self.keys = np.empty(int(total * 1.25), dtype=self.wire)
            self.bits = np.empty(self.keys.size if self.with_data else 0, dtype=np.int32)
        send = keys if keys.dtype == self.wire else _widened(keys)
        recv = alltoallv_array(comm, send, scount, rcount, self.keys, cuts[:-1])
        self.sent += int(scount.sum()) * send.itemsize
        rbits = self.bits
        if self.with_data:
            one = vbits.size != keys.size
            vsend = np.full(keys.size, vbits[0], np.int32) if one else vbits
            rbits = alltoallv_array(comm, vsend, scount, rcount, self.bits, cuts[:-1])
            self.sent += int(scount.sum()) * 4
        return (int(cuts[me]), int(cuts[me + 1])), recv, rbits, rcount


def _cut_band(bands, shift, offsets) -> int:
    """Entries of the largest band of a kept block that a row block boundary cuts (0: none)."""
    widest = 0
    nb = bands.size - 1
    for row in offsets[1:-1]:
        b = int(row) >> shift
        if b < nb and int(row) != b << shift:
            widest = max(widest, int(bands[b + 1] - bands[b]))
    return widest


def _widened(keys):
    """uint32 keys ``row << 16 | col`` as uint64 ``row << 32 | col`` (a block whose rows
    fit 16 bits, in a file whose rows or columns do not)."""
    wide = keys.astype(np.uint64)
    return ((wide >> np.uint64(16)) << np.uint64(32)) | (wide & np.uint64(0xFFFF))


_EMPTY = np.empty(0, np.uint32)
_EMPTY_BITS = np.empty(0, np.int32)
EMPTY_KEPT = (_EMPTY, _EMPTY_BITS, np.zeros(1, np.int64), BAND_SHIFT)
