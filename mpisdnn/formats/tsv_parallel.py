"""Every rank reads its own byte range of an inputs TSV; rows reach their owners as arrays.

The file is cut into ``P`` byte ranges at line starts (a line that crosses a cut belongs to
the rank where it starts). Each rank parses its range once, in blocks of at most
:data:`BLOCK_BYTES`, with a compiled parser (``_tsv_kernels.parse_block``; a block it does
not fully understand goes through the serial reader, whose checks name the ``file:line``),
and keeps each block's entries compactly, counted per row and grouped by band of rows
(:func:`_kept`: one key ``row << 16 | col`` per entry, 4 bytes for the official files, at
most 12 with the values). The global entries per row give the same nnz-balanced row blocks
as the serial path (:func:`~mpisdnn.partition.balanced_blocks`); the kept blocks are then
routed to the rows' owners, one block per round, each owner's entries one run of the block
(:func:`~mpisdnn.parallel.alltoallv_array` of the keys, and of the values only when the file
has more than one), and placed straight into each owner's CSR, whose row pointers, and
within a row each source rank's place, are known from the counts. No rank holds more than
one block of text; a rank's peak is its CSR (8 bytes per entry) plus its kept entries, one
block's received keys and the interpreter.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..parallel import (
    AgreedError,
    agree_earliest,
    allgather,
    allreduce,
    allreduce_in_place,
    alltoall_array,
    alltoallv_array,
    log,
)
from ..partition import balanced_blocks, block_of
from ..system import populate, small_pages
from . import tsv
from ._validate import check_memory

__all__ = ["ImagesBlock", "read_images_parallel", "BLOCK_BYTES"]

#: Text a rank parses at once (its text buffer; the parsed entries are 12 bytes each).
BLOCK_BYTES = 16 << 20
#: log2 of the rows of one band: a kept block's entries are grouped by band of rows, so the
#: routing's scatter of a band into the CSR writes at most this many rows' cache lines at
#: once (512 x 64 B: L1). Measured on the 2-core EPYC VM, 30 M entries into 3,000 rows: 5.1
#: ns an entry in file order, 3.6 / 2.9 / 2.4 / 2.0 ns with bands of 64 / 128 / 256 / 512
#: rows, 4.3 ns at 1,024 (out of L1).
BAND_SHIFT = 9
#: Most bands of one block (more rows: wider bands): the grouping writes one stream a band.
MAX_BANDS = 1024
#: Most row ids the per-row counts can hold (MPI counts and int32 rows).
_MAX_ROWS = 2**31 - 1


@dataclass
class ImagesBlock:
    """One rank's share of an inputs file: its row block of Y0 and the global plan."""

    y: sp.csr_matrix
    row_offset: int
    g_rows: int
    g_nnz: int
    offsets: np.ndarray
    stats: dict = field(default_factory=dict)


def _file_size(path, what) -> int:
    size = tsv.regular_file_size(path, what)
    if size == 0:
        raise InputError(f"{path}: no entries: empty file (0 bytes), expected {what}")
    return size


class _ByteProgress:
    """Rank 0's ``[progress]`` line for a long read: its own share read, scaled to the file
    (the ranks read at about the same speed; no communication)."""

    def __init__(self, comm, path, total, share, interval):
        self.on = comm.rank == 0 and interval > 0 and share > 0
        self.path, self.total, self.share, self.interval = path, total, share, interval
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done):
        if not self.on:
            return
        now = time.perf_counter()
        if now - self.last < self.interval or done >= self.share:
            return
        from ..progress import format_duration

        self.last = now
        frac = done / self.share
        elapsed = now - self.t0
        print(
            f"[progress] reading {self.path}: {frac * self.total / 1e9:.2f}/"
            f"{self.total / 1e9:.2f} GB  {frac * self.total / elapsed / 1e6:.0f} MB/s  "
            f"elapsed {format_duration(elapsed)}  ETA {format_duration(elapsed / frac - elapsed)}",
            flush=True,
        )


class _Entries:
    """The parser's output arrays, reused from block to block (touched once, not per block)."""

    def __init__(self, nbytes, with_lines):
        self.cap, self.with_lines = -1, with_lines
        self.fit(nbytes)

    def fit(self, nbytes):
        cap = nbytes // 5 + 2  # the shortest line is "1 1 1\n"
        if cap > self.cap:
            self.cap = cap
            self.arrays = (
                np.empty(cap, np.int32),
                np.empty(cap, np.int32),
                np.empty(cap, np.float32),
                np.empty(cap if self.with_lines else 0, np.int64),
            )
        return self.arrays


class _Share:
    """What a rank reads of an inputs file: the lines starting in bytes ``[begin, end)`` of a
    plain file, or (``gz``) every ``size``-th block of the inflated stream from block
    ``rank`` on (a gzip stream cannot be entered in the middle: every rank inflates it all,
    in a thread, and parses its blocks; the blocks' cuts depend only on the text, so the
    ranks agree on them)."""

    def __init__(self, path, begin=0, end=0, gz=False, rank=0, size=1):
        self.path, self.begin, self.end = path, begin, end
        self.gz, self.rank, self.size = gz, rank, size
        self.tail = None  # the text's last bytes, when this rank read them
        self.text_bytes = 0  # the inflated text's size (gz mode, once read)

    def read_from_start(self) -> None:
        """A new pass over the share: the text's end not seen yet."""
        self.tail = None

    def saw_end(self, text_bytes: int, tail: bytes | None) -> None:
        """The inflated text ended after ``text_bytes`` bytes; ``tail``: its last bytes, when
        this rank's buffer held any (``None``: keep what an earlier block gave)."""
        self.text_bytes = text_bytes
        if tail is not None:
            self.tail = tail

    def open(self):
        from . import gz

        if self.gz:
            return gz.GzipStream(self.path, 4 << 20)
        fh = open(self.path, "rb")
        fh.seek(self.begin)
        return fh


def _blocks(share, nrows, ncols, progress=None, with_lines=False):
    """Parse this rank's blocks of ``share`` (:class:`_Share`).

    Yields ``(rows, cols, vals, lines, newlines, line_base)``: one block's entries (int32,
    int32, float32; 0-based), with ``with_lines`` each entry's line within the block
    (0-based; else ``None``), the newlines in the block, and the lines of the file before
    it (``None`` for a byte range: counted from the file when a message needs it). The
    arrays are reused for the next block. In ``gz`` mode every block of the rank is
    yielded, empty or not (the routing rounds pair the ranks' k-th blocks), and the share
    is told the text's size and last 64 bytes (:meth:`_Share.saw_end`).
    """
    from . import _tsv_kernels as K

    bounds = np.array([nrows or 0, ncols], dtype=np.int64)
    span = share.end - share.begin if not share.gz else BLOCK_BYTES
    buf = np.empty(min(BLOCK_BYTES, max(span, 1)) + 1, dtype=np.uint8)
    out = _Entries(buf.size, with_lines)
    held = 0  # bytes of an unfinished line kept at the front of buf
    pos = share.begin  # offset of buf[0] in the (inflated) text
    line_base = 0  # newlines before buf[0] (gz mode)
    index = 0  # block number in the whole text (gz mode)
    ended = False
    with share.open() as fh:
        while not ended:
            want = buf.size - held
            if not share.gz:
                want = min(want, share.end - pos - held)
            got = _fill(fh, buf, held, want) if want > 0 else 0
            n = held + got
            ended = (pos + n >= share.end) if not share.gz else got < want
            final = ended
            if share.gz and ended:
                share.saw_end(pos + n, buf[max(0, n - 64) : n].tobytes() if n else None)
            if n == 0:
                break
            mine = not share.gz or index % share.size == share.rank
            if not mine:
                used = n if final else _last_newline(buf, n)
                if used == 0:
                    buf = np.concatenate((buf, np.empty(buf.size, np.uint8)))
                    held = n
                    continue
                lines = K.count_newlines(buf, used)
            else:
                rows, cols, vals, line_of = out.fit(buf.size)
                status, count, used, lines = K.parse_block(
                    buf, n, final, bounds, rows, cols, vals, line_of
                )
                if status != K.OK:
                    used = n if final else _last_newline(buf, n)
                    text = buf[:used].tobytes()
                    base = line_base if share.gz else None
                    rows, cols, vals = _serial_block(share.path, text, nrows, ncols, pos, base)
                    count, lines = rows.size, text.count(b"\n")
                    if with_lines:
                        line_of = np.array(
                            [i for i, raw in enumerate(text.split(b"\n")) if raw.strip()],
                            np.int64,
                        )
                elif used == 0 and not final:
                    buf = np.concatenate((buf, np.empty(buf.size, np.uint8)))  # a long line
                    held = n
                    continue
                where = line_of[:count] if with_lines else None
                base = line_base if share.gz else None
                yield rows[:count], cols[:count], vals[:count], where, lines, base
            buf[: n - used] = buf[used:n]
            held = n - used
            pos += used
            line_base += lines
            index += 1
            if progress is not None:
                progress(fh.tell() if share.gz else pos - share.begin)


def _fill(fh, buf, held, want) -> int:
    """Read up to ``want`` bytes into ``buf[held:]``; fewer only at the end of the input."""
    view = memoryview(buf)[held : held + want]
    got = 0
    while got < want:
        k = fh.readinto(view[got:])
        if not k:
            break
        got += k
    return got


def _last_newline(buf, n) -> int:
    at = np.flatnonzero(buf[:n] == 10)
    return int(at[-1]) + 1 if at.size else 0


def _scan(share, nrows, ncols, progress):
    """The one pass over this rank's share: every check, the entries of each row, and the
    parsed entries themselves, kept block by block (:func:`_kept`).

    Returns ``(counts, parsed, newlines, entries, tail, value, arena)``; ``counts`` covers
    rows up to the largest seen (its size is that row + 1); ``tail``: the text's last bytes
    when this rank read the end (else ``None``); ``value``: the int32 bits every value of
    this rank's entries has, ``None`` without entries, ``"mixed"`` when they differ;
    ``arena``: the :class:`_Arena` holding the narrow keys (``None``: none reserved).
    """
    counts = np.zeros(0, dtype=np.int64)
    parsed = []
    newlines = entries = 0
    value = None
    arena = None if share.gz else _Arena.reserve(share.end - share.begin)
    share.read_from_start()
    for rows, cols, vals, _, lines, _base in _blocks(share, nrows, ncols, progress):
        newlines += lines
        if rows.size:
            top = int(rows.max())
            if top >= counts.size:
                # one stray huge row id must not size the counts (8 B per row, 16 B with
                # the row pointers later)
                path = share.path
                check_memory(16 * (top + 1), f"{path}: {top + 1} rows (the largest row id)")
                counts = np.concatenate((counts, np.zeros(top + 1 - counts.size, np.int64)))
            entries += rows.size
            kept = _kept(rows, cols, vals, top, ncols, counts, arena)
            parsed.append(kept)
            one = int(kept[1][0]) if kept[1].size == 1 else "mixed"
            value = one if value is None or value == one else "mixed"
        elif share.gz:
            parsed.append(_EMPTY_KEPT)  # keeps the ranks' rounds paired
    tail = share.tail
    if not share.gz and share.end > share.begin and share.end == _size_of(share.path):
        tail = _tail(share.path, share.end)
    if tail and not tail.endswith(b"\n"):
        tsv.check_last_line(share.path, tail)
    return counts, parsed, newlines, entries, tail, value, arena


def _size_of(path) -> int:
    return os.path.getsize(path)


def _tail(path, size) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 64))
        return fh.read(64)


def _kept(rows, cols, vals, top, ncols, counts, arena=None):
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


class _Arena:
    """One anonymous map for the narrow keys of a rank's byte range, taken block after block
    (faulted in as taken). With one value in the file, this memory, already faulted in and
    about as large as the rank's CSR, becomes the CSR's values once the keys are placed:
    the values cost no fresh memory (measured at 2 ranks: the routing 0.27-0.32 -> 0.21-0.22 s
    CPU per rank) and the peak is 4 B an entry lower (535 -> 420 MiB per rank)."""

    def __init__(self, entries, buf):
        self.cap, self.buf, self.used = entries, buf, 0

    @classmethod
    def reserve(cls, nbytes):
        """Room for every entry ``nbytes`` of text can hold; ``None`` where the address space
        refuses it (the blocks then take their own maps)."""
        entries = nbytes // 5 + 2 * (nbytes // BLOCK_BYTES + 2)  # as _Entries: "1 1 1"
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
        """Whether ``nnz`` values fit without holding much more than them (at most 1/8 or
        1 MiB of faulted-in memory past them)."""
        return nnz <= self.cap and self.used <= nnz + max(nnz >> 3, 1 << 18)

    def values(self, nnz, value):
        """``nnz`` int32 ``value`` in this memory (the keys there are all placed)."""
        out = np.frombuffer(self.buf, np.int32, nnz)
        populate(out, min(self.used, nnz))  # what the keys did not touch, in bulk
        out.fill(value)
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


def _serial_block(path, text, nrows, ncols, offset, line_base=None):
    """A block the compiled parser left to the serial reader (every check, exact lines)."""
    r, c, v = tsv._triples(path, text, nrows, ncols, offset, line_base)
    if r.size and r.max() >= _MAX_ROWS:
        i = int(np.argmax(r))
        base = line_base if line_base is not None else tsv._lines_before(path, offset)
        raise InputError(
            f"{path}:{base + tsv._line_of(text, i)}: row index "
            f"{tsv.written(text, i, 0, int(r[i]) + 1)} is beyond the largest supported row count "
            f"{_MAX_ROWS}"
        )
    return r.astype(np.int32), c.astype(np.int32), v


def read_images_parallel(comm, path, neurons: int, rows=None, progress_interval=5.0):
    """Read an inputs TSV (``sparse-images-{N}.tsv``) in parallel; each rank gets its rows.

    Parameters
    ----------
    comm : mpi4py communicator
        Collective over ``comm``.
    path : path-like
        The TSV file (``row<TAB>col<TAB>value``, 1-based; any whitespace separates fields).
    neurons : int
        N: column indices must not exceed it.
    rows : int, optional
        Number of inputs; default the largest row index present. Rows without entries count.
    progress_interval : float
        Seconds between rank 0's progress lines (0: none).

    Returns
    -------
    ImagesBlock
        This rank's rows ``[row_offset, row_offset + y.shape[0])`` as float32 CSR with sorted
        columns, in the same nnz-balanced blocks as the serial path, and ``stats`` (bytes,
        seconds, MB/s, entries, the phases' ends in wall and CPU seconds, the bytes this
        rank routed to the others, whether the file has one value).

    Raises
    ------
    AgreedError
        On every rank, with one message naming ``file:line`` (the earliest failing rank's):
        not a regular file, empty file, no entries (without ``rows``), a malformed line, an
        index out of range, a non-finite value, a duplicate ``(row, column)``.
    """
    path = os.fspath(path)
    t0 = time.perf_counter()
    c0 = time.process_time()  # CPU seconds too: on a loaded machine the wall says little
    size = agree_earliest(comm, _file_size, path, "an inputs TSV")
    from .gz import is_gzip

    if agree_earliest(comm, is_gzip, path):
        share = _Share(path, 0, size, gz=True, rank=comm.rank, size=comm.size)
        progress = _ByteProgress(comm, path, size, size, progress_interval)
    else:
        start, stop = size * comm.rank // comm.size, size * (comm.rank + 1) // comm.size
        begin, end = agree_earliest(comm, tsv.line_range, path, start, stop)
        share = _Share(path, begin, end)
        progress = _ByteProgress(comm, path, size, end - begin, progress_interval)
    counts, parsed, newlines, entries, tail, value, arena = agree_earliest(
        comm, _scan, share, rows, neurons, progress
    )
    ends_cut = bool(tail) and not tail.endswith(b"\n") and (not share.gz or comm.rank == 0)
    text_bytes = share.text_bytes if share.gz else size
    info = allgather(comm, (newlines, entries, counts.size - 1, ends_cut, value))
    g_nnz = sum(item[1] for item in info)
    if rows is None:
        agree_earliest(comm, tsv.check_image_entries, path, g_nnz)
        g_rows = max(item[2] for item in info) + 1
    else:
        g_rows = int(rows)
    what = f"{path}: {g_rows} rows (the largest row id)"
    agree_earliest(comm, check_memory, 24 * (g_rows + 1), what)
    marks = {"parse": time.perf_counter() - t0}
    cpu = {"parse": time.process_time() - c0}
    offsets, starts = _plan(comm, counts, g_rows)
    del counts
    r0, r1 = block_of(offsets, comm.rank)
    values = {item[4] for item in info if item[4] is not None}
    value = values.pop() if len(values) == 1 and isinstance(next(iter(values)), int) else None
    wide = max(item[2] for item in info) >= 1 << 16 or neurons > 1 << 16
    indices, data, sent = _route(comm, parsed, offsets, starts, share.gz, value, wide, arena)
    del arena
    indptr = np.append(starts[0], starts[-1][-1]) if r1 > r0 else np.zeros(1, np.int64)
    marks["route"] = time.perf_counter() - t0
    cpu["route"] = time.process_time() - c0
    from . import _tsv_kernels as K

    dup = K.sort_rows(indptr, indices, data)
    found = allgather(comm, None if dup[0] < 0 else (int(dup[0]) + r0, int(dup[1])))
    found = [f for f in found if f is not None]
    if found:
        _duplicate_error(comm, share, found[0], rows, neurons, info)
    y = sp.csr_matrix((data, indices, indptr), shape=(r1 - r0, neurons))
    y.has_sorted_indices = True
    if any(item[3] for item in info):  # after every check: an error stays one line
        log(comm, tsv.cut_short_warning(path, sum(item[0] for item in info) + 1), file=sys.stderr)
    size = text_bytes
    seconds = time.perf_counter() - t0
    marks["sort"] = seconds
    cpu["sort"] = time.process_time() - c0
    stats = {
        "bytes": size,
        "seconds": seconds,
        "mb_per_second": size / seconds / 1e6 if seconds > 0 else 0.0,
        "entries": g_nnz,
        "ranks": comm.size,
        "phase_ends": marks,  # seconds from the start: parse, route, sort
        "phase_cpu_ends": cpu,  # this rank's CPU seconds (process) at the same points
        "sent_bytes": sent,  # what this rank routed to the others
        "uniform_value": value is not None,  # one value for all: placed once, never routed
    }
    if share.gz:
        stats["compressed_bytes"] = os.path.getsize(path)
    return ImagesBlock(y, r0, g_rows, g_nnz, offsets, stats)


def _plan(comm, counts, g_rows):
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


def _route(comm, parsed, offsets, starts, interleaved, value, wide, arena=None):
    """Send each kept block's entries to their rows' owners and place what arrives at the
    rows' fill pointers, one per source rank (``starts``); returns ``(indices, data, bytes
    this rank sent)``.

    One kept block per round (:class:`_Exchange`); a rank's own run goes from its kept
    block straight to its CSR. ``value``: the bits of the file's one value (written once,
    in one sequential fill, never routed), or ``None``. ``wide``: the file's rows or columns
    pass 16 bits (uint64 keys on the wire). Each block is freed once placed, so the CSR
    fills as the kept entries go; the runs arrive grouped by band, so the scatter into the
    CSR writes a band's rows at a time.

    ``interleaved`` (a gzip file: rank s's k-th block is the text's block k P + s): one
    fill pointer per row for all sources, which the rounds fill in file order.

    ``arena`` (:class:`_Arena`): where this rank's narrow keys were kept; with one value,
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
    if interleaved:
        one = starts[0].copy()
        fill = [one] * comm.size
    else:
        fill = starts[:-1].copy()
    size, me = comm.size, comm.rank
    ex = _Exchange(comm, offsets, np.uint64 if wide else np.uint32, with_data)
    out_bits = _EMPTY_BITS if bits is None else bits
    r0 = block_of(offsets, comm.rank)[0]
    rounds = allreduce(comm, len(parsed), op="max") if size > 1 else len(parsed)
    parsed.reverse()  # pop() from the end takes the blocks in file order
    for _ in range(rounds):
        keys, vbits, bands, shift = parsed.pop() if parsed else _EMPTY_KEPT
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
    ends = starts[-1] if interleaved else starts[1:]
    if not np.array_equal(fill[0] if interleaved else fill, ends):
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
_EMPTY_KEPT = (_EMPTY, _EMPTY_BITS, np.zeros(1, np.int64), BAND_SHIFT)


def _duplicate_error(comm, share, dup, nrows, ncols, info):
    """Raise the duplicate ``dup`` = (row, col) (0-based) naming the line of its second copy
    (collective: every rank scans its own share again; an error path)."""
    row, col = dup
    line = sum(item[0] for item in info[: comm.rank])  # newlines before this rank's range
    mine = []
    for rows, cols, _, line_of, lines, base in _blocks(share, nrows, ncols, None, True):
        at = base if base is not None else line
        hit = np.flatnonzero((rows == row) & (cols == col))
        mine.extend(int(at + line_of[i] + 1) for i in hit)
        line += lines
    every = sorted(sum(allgather(comm, mine), []))
    where = f"{share.path}:{every[1]}" if len(every) > 1 else share.path
    raise AgreedError(f"{where}: duplicate entry for row {row + 1}, column {col + 1}")
