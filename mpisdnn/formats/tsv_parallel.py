"""Every rank reads its own byte range of an inputs TSV; rows reach their owners as arrays.

The file is cut into ``P`` byte ranges at line starts (a line that crosses a cut belongs to the
rank where it starts). Each rank parses its range once, in blocks of at most
:data:`BLOCK_BYTES`, with a compiled parser (``_tsv_kernels.parse_block``; a block it does not
fully understand goes through the serial reader, whose checks name the ``file:line``), and
keeps each block's entries compactly, counted per row and grouped by band of rows
(``_tsv_route.kept``: one key ``row << 16 | col`` per entry, 4 bytes for the official files, at
most 12 with the values; the narrow keys in one map per rank, sized from its byte range). The
global entries per row give the same nnz-balanced row blocks as the serial path
(:func:`~mpisdnn.partition.balanced_blocks`); the kept blocks are then routed to the rows'
owners, one block per round, each owner's entries one run of the block
(:func:`~mpisdnn.parallel.alltoallv_array` of the keys, and of the values only when the file
has more than one), and placed straight into each owner's CSR, whose row pointers, and within a
row each source rank's place, are known from the counts. No rank holds more than one block of
text; a rank's peak is its CSR (8 bytes per entry) plus its kept entries, one block's received
keys and the interpreter.

Ranks that share a node still exchange through MPI rather than placing their entries straight
into one CSR in the node's shared memory (tried, 2026-12-01, ``docs/design/results.md``): on
the 2-core VM a page of ``/dev/shm`` costs about twice an anonymous one to first touch (0.085
against 0.05 s per 120 MB) and a rank writing into another's rows must map those pages as well
(0.03 s per 120 MB), more than the exchange's own CPU (0.03-0.045 s a rank at 2 ranks).

A ``.gz`` cannot be entered in the middle, so its ranges are of the inflated text, planned
from its size as the gzip trailer gives it (:func:`~.gz.text_size_estimate`): each rank
inflates the text from its start (in a thread) to the end of its range, passing over what
comes before it without a copy (:class:`~._gz_segment.GzSegment`), and stops there; the last
rank reads to the end, so the checksum and a truncated file are seen. The early ranks, which
stop early, take the longer ranges (:func:`~mpisdnn.partition.prefix_segments`: 60 % and
40 % at 2 ranks). A wrong estimate (a multi-member file) costs balance only: every line
still belongs to exactly one rank. One inflater per node handing the text to the others
through node-shared slots was tried twice and not kept (the same results file).
"""

from __future__ import annotations

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
    log,
)
from ..partition import block_of, prefix_segments
from . import _tsv_route as R
from . import tsv
from ._gz_segment import GzSegment
from ._validate import check_memory

__all__ = ["ImagesBlock", "read_images_parallel", "BLOCK_BYTES", "warmup_steps"]

#: Text a rank parses at once (its text buffer; the parsed entries are 12 bytes each).
BLOCK_BYTES = 16 << 20


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
    plain file, or (``gz``) of the inflated text (``end`` ``None``: to the text's end; a
    gzip stream cannot be entered in the middle, so the rank inflates the text from its
    start and passes over what comes before ``begin``: :class:`~._gz_segment.GzSegment`).
    ``estimate``: the inflated text's size as planned (gz mode: what the kept entries' room
    is sized from)."""

    def __init__(self, path, begin=0, end=0, gz=False, estimate=0):
        self.path, self.begin, self.end = path, begin, end
        self.gz, self.estimate = gz, estimate
        self.tail = None  # the text's last bytes, when this rank read them
        self.text_bytes = 0  # the inflated text's size (gz mode, when this rank saw its end)

    def read_from_start(self) -> None:
        """A new pass over the share: the text's end not seen yet."""
        self.tail = None

    def saw_end(self, text_bytes: int, tail: bytes) -> None:
        """The inflated text ended after ``text_bytes`` bytes, its last bytes ``tail``."""
        self.text_bytes, self.tail = text_bytes, tail

    def open(self):
        if self.gz:
            return GzSegment(self)
        fh = open(self.path, "rb")
        fh.seek(self.begin)
        return fh


def _blocks(share, nrows, ncols, progress=None, with_lines=False):
    """Parse this rank's blocks of ``share`` (:class:`_Share`).

    Yields ``(rows, cols, vals, lines, newlines, line_base)``: one block's entries (int32,
    int32, float32; 0-based), with ``with_lines`` each entry's line within the block
    (0-based; else ``None``), the newlines in the block, and the lines of the file before
    it (``None`` for a plain file's byte range: counted from the file when a message needs
    it). The arrays are reused for the next block.
    """
    from . import _tsv_kernels as K

    bounds = np.array([nrows or 0, ncols], dtype=np.int64)
    span = share.end - share.begin if not share.gz else BLOCK_BYTES
    buf = np.empty(min(BLOCK_BYTES, max(span, 1)) + 1, dtype=np.uint8)
    out = _Entries(buf.size, with_lines)
    held = 0  # bytes of an unfinished line kept at the front of buf
    ended = False
    with share.open() as fh:
        pos = fh.start if share.gz else share.begin  # offset of buf[0] in the (inflated) text
        line_base = fh.lines_before if share.gz else 0  # newlines before buf[0] (gz mode)
        while not ended:
            want = buf.size - held
            if not share.gz:
                want = min(want, share.end - pos - held)
            got = _fill(fh, buf, held, want) if want > 0 else 0
            n = held + got
            ended = final = (pos + n >= share.end) if not share.gz else got < want
            if n == 0:
                break
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
    """The end of the last whole line of ``buf[:n]`` (0: none), searched from the end in
    64 KiB steps: a block's last newline is a few bytes from its end (comparing the whole
    16 MiB block took 10-15 ms)."""
    hi = n
    while hi > 0:
        lo = max(0, hi - 65536)
        at = np.flatnonzero(buf[lo:hi] == 10)
        if at.size:
            return lo + int(at[-1]) + 1
        hi = lo
    return 0


def _scan(share, nrows, ncols, progress):
    """The one pass over this rank's share: every check, the entries of each row, and the
    parsed entries themselves, kept block by block (:func:`_kept`).

    Returns ``(counts, parsed, newlines, entries, tail, value, arena)``; ``counts`` covers
    rows up to the largest seen (its size is that row + 1); ``tail``: the text's last bytes
    when this rank read the end (else ``None``); ``value``: the int32 bits every value of
    this rank's entries has, ``None`` without entries, ``"mixed"`` when they differ;
    ``arena``: the :class:`~._tsv_route.Arena` holding the narrow keys (``None``: none reserved).
    """
    counts = np.zeros(0, dtype=np.int64)
    parsed = []
    newlines = entries = 0
    value = None
    arena = R.Arena.reserve(_kept_text(share), BLOCK_BYTES)
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
            kept = R.kept(rows, cols, vals, top, ncols, counts, arena)
            parsed.append(kept)
            one = int(kept[1][0]) if kept[1].size == 1 else "mixed"
            value = one if value is None or value == one else "mixed"
    tail = share.tail
    if not share.gz and share.end > share.begin and share.end == _size_of(share.path):
        tail = _tail(share.path, share.end)
    if tail and not tail.endswith(b"\n"):
        tsv.check_last_line(share.path, tail)
    return counts, parsed, newlines, entries, tail, value, arena


def _kept_text(share) -> int:
    """The bytes of text whose entries this rank keeps, or a bound: its byte range, or for a
    gzip file its segment of a text as long as planned (``share.estimate``, from the
    trailer: only a hint; the arena is virtual memory, touched as taken, and a block it has
    no room for takes its own map)."""
    if not share.gz:
        return share.end - share.begin
    end = share.estimate if share.end is None else share.end
    return max(0, end - share.begin) + 2 * BLOCK_BYTES


def _size_of(path) -> int:
    return os.path.getsize(path)


def _tail(path, size) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 64))
        return fh.read(64)


def _serial_block(path, text, nrows, ncols, offset, line_base=None):
    """A block the compiled parser left to the serial reader (every check, exact lines)."""
    r, c, v = tsv._triples(path, text, nrows, ncols, offset, line_base, tsv.MAX_ROWS)
    return r.astype(np.int32), c.astype(np.int32), v


def read_images_parallel(comm, path, neurons: int, rows=None, progress_interval=0.0):
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
        Seconds between rank 0's progress lines (0, the default: none; ``convert inputs`` passes
        its ``--progress``).

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
    from .gz import is_gzip, text_size_estimate

    if agree_earliest(comm, is_gzip, path):
        # Every rank inflates the text from its start up to the end of its segment: the
        # early ranks, which stop early, parse longer segments (partition.prefix_segments).
        estimate = agree_earliest(comm, text_size_estimate, path)
        fractions = prefix_segments(comm.size)
        cuts = [int(round(f * estimate)) for f in fractions]
        end = None if comm.rank == comm.size - 1 else cuts[comm.rank + 1]
        share = _Share(path, cuts[comm.rank], end, gz=True, estimate=estimate)
        # rank 0 reads the compressed file up to its segment's end
        progress = _ByteProgress(comm, path, size, int(size * fractions[1]), progress_interval)
    else:
        start, stop = size * comm.rank // comm.size, size * (comm.rank + 1) // comm.size
        begin, end = agree_earliest(comm, tsv.line_range, path, start, stop)
        share = _Share(path, begin, end)
        progress = _ByteProgress(comm, path, size, end - begin, progress_interval)
    counts, parsed, newlines, entries, tail, value, arena = agree_earliest(
        comm, _scan, share, rows, neurons, progress
    )
    ends_cut = bool(tail) and not tail.endswith(b"\n")
    info = allgather(comm, (newlines, entries, counts.size - 1, ends_cut, value, share.text_bytes))
    # a gzip text's size: the ranks that reached its end know it (the last always does)
    text_bytes = max(item[5] for item in info) if share.gz else size
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
    offsets, starts = R.plan(comm, counts, g_rows)
    del counts
    r0, r1 = block_of(offsets, comm.rank)
    values = {item[4] for item in info if item[4] is not None}
    value = values.pop() if len(values) == 1 and isinstance(next(iter(values)), int) else None
    wide = max(item[2] for item in info) >= 1 << 16 or neurons > 1 << 16
    indices, data, sent = R.route(comm, parsed, offsets, starts, value, wide, arena)
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


def warmup_steps(ranks: int, gz: bool = False, wide: bool = False) -> list:
    """The read's compiled kernels, each step calling some on a one-entry problem in the
    very types :func:`read_images_parallel` passes them (for
    :func:`mpisdnn.kernel_cache.in_turn`: a first run's ranks compile different ones at
    once). ``ranks``: the read's rank count (the exchange's kernel only above one); ``gz``:
    a gzip file (the newline count of a skipped text); ``wide``: more than 2**16 rows or
    columns (64-bit keys)."""
    from . import _tsv_kernels as K

    def parse():
        buf = np.frombuffer(b"1\t1\t1\n", np.uint8).copy()
        rows, cols, vals, line_of = _Entries(buf.size, False).arrays
        bounds = np.array([0, 1], dtype=np.int64)
        K.parse_block(buf, buf.size, True, bounds, rows, cols, vals, line_of)

    def keep():
        counts = np.zeros(1, np.int64)
        one = np.zeros(1, np.int32)
        R.kept(one, one, np.ones(1, np.float32), 1 << 16 if wide else 0, 1, counts)

    def place():
        keys = np.zeros(1, np.uint64 if wide else np.uint32)
        bits = np.zeros(1, np.int32)
        fill = np.zeros((1, 1), np.int64)
        indices = np.empty(1, np.int32)
        for with_data in (False, True):
            fill[:] = 0
            K.place_keys(keys[:1], bits[:1], 0, fill[0], indices, bits, with_data)
        if ranks > 1:
            bands = np.array([0, 1], np.int64)
            cuts = np.empty(3, np.int64)
            offs = np.array([0, 1, 1], np.int64)
            K.owner_cuts(keys, bits, bands, R.BAND_SHIFT, offs, cuts, keys.copy(), bits.copy())

    def sort():
        K.sort_rows(np.array([0, 1], np.int64), np.zeros(1, np.int32), np.ones(1, np.float32))

    steps = [parse, keep, place, sort]
    if gz:
        steps.append(lambda: K.count_newlines(np.frombuffer(b"\n", np.uint8), 1))
    return steps


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
