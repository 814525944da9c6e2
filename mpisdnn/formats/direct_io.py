"""Overlapped, page-aligned streaming of two parallel arrays into files (O_DIRECT when possible).

A :class:`StagedWriter` owns two page-aligned staging pairs (one slot for the index array, one
for the value array). The producer fills one pair (``append_blocks`` gathers a kernel chunk into
it) while a writer thread writes the other with ``pwrite``. Writes are whole 4 KiB-aligned runs
at 4 KiB-aligned file offsets, so the files can be opened with ``O_DIRECT``: the bytes go from
the staging buffer to the disk without a page-cache copy, which measured 0.9-1.2 GB/s against
0.6 GB/s buffered on the development VM and leaves the CPU to the kernels. The unaligned tail
of each full buffer is carried to the front of the next one; the last tail is written with a
buffered descriptor at ``close``.

Filesystems without ``O_DIRECT`` (tmpfs) fall back to buffered ``pwrite`` transparently.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time

import numpy as np

from ..errors import DiskFullError

__all__ = ["StagedWriter", "ALIGN"]

#: File offsets and write sizes are multiples of this (the largest common O_DIRECT block).
ALIGN = 4096
#: Entries per staging buffer: writes of 32-64 MiB reach the disk's streaming rate.
STAGE_ENTRIES = 1 << 23


def _aligned(n: int, dtype) -> tuple[np.ndarray, mmap.mmap]:
    nbytes = max(ALIGN, -(-int(n) * np.dtype(dtype).itemsize // ALIGN) * ALIGN)
    buf = mmap.mmap(-1, nbytes)  # anonymous mappings are page-aligned
    return np.frombuffer(buf, dtype=dtype, count=int(n)), buf


def _open(path: str, direct: bool) -> tuple[int, bool]:
    flags = os.O_WRONLY | os.O_CREAT
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


class _Target:
    """One output file written from ``base`` on: descriptor, offset so far, O_DIRECT state.

    The descriptor and its O_DIRECT state change only together, in its own methods (a
    buffered reopen, the close): the writer thread and the closing producer share it.
    """

    def __init__(self, path: str, base: int, direct: bool):
        self.path = path
        self.base = base
        self.fd, self.direct = _open(path, direct)
        self.written = 0  # bytes from base

    def reopen_buffered(self) -> None:
        """Write on without ``O_DIRECT`` (a tail that is not a whole alignment unit, or a
        filesystem that refuses it at write time)."""
        os.close(self.fd)
        self.fd, self.direct = _open(self.path, False)

    def pwrite_all(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            try:
                n = os.pwrite(self.fd, view[done:], self.base + self.written + done)
            except OSError as exc:
                if exc.errno == errno.EINVAL and self.direct:
                    # the filesystem refused O_DIRECT at write time: reopen buffered
                    self.reopen_buffered()
                    continue
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise DiskFullError(exc.errno, "no space left on device", self.path) from None
                raise
            if n <= 0:
                raise DiskFullError(errno.ENOSPC, "no space left on device", self.path)
            done += n
        self.written += len(view)

    def fsync(self) -> None:
        """Flush to the disk; a full disk (or quota) found only now is a
        :class:`DiskFullError`."""
        try:
            os.fsync(self.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(exc.errno, "no space left on device", self.path) from None
            raise

    def close(self) -> None:
        """Close the descriptor once (later calls do nothing; a failing close is ignored: the
        caller is already finishing or removing the file)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class StagedWriter:
    """Stream ``(index, value)`` entries into two files, overlapping the writes with the caller.

    Parameters
    ----------
    paths : (str, str)
        Files for the index and the value array (created if missing, never truncated).
    dtypes : (dtype, dtype)
    base : int
        Byte offset of the first entry in each file (a multiple of :data:`ALIGN`).
    min_entries : int
        Largest batch one ``append_blocks`` call can bring (the staging buffers hold at least
        this plus one alignment unit).
    direct : bool
        Try ``O_DIRECT``.
    stage_entries : int, optional
        Entries per staging buffer (default :data:`STAGE_ENTRIES`; raised to fit
        ``min_entries``).
    """

    def __init__(self, paths, dtypes, base: int, min_entries: int = 0, direct: bool = True,
                 stage_entries=None):  # fmt: skip
        if base % ALIGN:
            raise ValueError(f"base offset {base} is not a multiple of {ALIGN}")
        self.dtypes = [np.dtype(d) for d in dtypes]
        # entries per alignment unit, for every dtype (4- and 8-byte types: 1024 covers both)
        self.unit = ALIGN // min(d.itemsize for d in self.dtypes)
        stage = STAGE_ENTRIES if stage_entries is None else min(STAGE_ENTRIES, int(stage_entries))
        self.cap = max(stage, int(min_entries) + self.unit)
        self._bufs = []
        self.slots = []
        for _ in range(2):
            pair = []
            for d in self.dtypes:
                arr, raw = _aligned(self.cap, d)
                self._bufs.append(raw)
                pair.append(arr)
            self.slots.append(pair)
        self.targets = [_Target(p, base, direct) for p in paths]
        self.cur = 0
        self.fill = 0
        self.entries = 0  # entries handed over so far (written or queued), tail excluded
        self.write_seconds = 0.0  # writer thread busy time
        self.wait_seconds = 0.0  # producer time spent waiting for a free buffer
        self._free = [threading.Event(), threading.Event()]
        for e in self._free:
            e.set()
        self._job = None
        self._cv = threading.Condition()
        self._error = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="mpisdnn-writer", daemon=True)
        self._thread.start()

    # -- producer side ------------------------------------------------------------------------

    def append_blocks(self, src_idx, src_val, blk_cap, blk_cnt) -> int:
        """Gather a chunk's blocks behind the staged entries; returns the entries added."""
        from ._gather import gather_blocks

        k = int(blk_cnt.sum())
        if self.fill + k > self.cap:
            self._hand_over()
        idx, val = self.slots[self.cur]
        self.fill = int(gather_blocks(src_idx, src_val, blk_cap, blk_cnt, idx, val, self.fill))
        return k

    def append(self, idx_part, val_part) -> None:
        """Stage contiguous entries (any length)."""
        lo, n = 0, int(idx_part.size)
        while lo < n:
            if self.fill == self.cap:
                self._hand_over()
            take = min(n - lo, self.cap - self.fill)
            idx, val = self.slots[self.cur]
            idx[self.fill : self.fill + take] = idx_part[lo : lo + take]
            val[self.fill : self.fill + take] = val_part[lo : lo + take]
            self.fill += take
            lo += take

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _hand_over(self) -> None:
        """Queue the aligned part of the current buffer, carry its tail into the other one."""
        self._check()
        n = self.fill // self.unit * self.unit
        nxt = 1 - self.cur
        tw = time.perf_counter()
        self._free[nxt].wait()
        self.wait_seconds += time.perf_counter() - tw
        self._check()
        tail = self.fill - n
        for src, dst in zip(self.slots[self.cur], self.slots[nxt]):
            dst[:tail] = src[n : self.fill]
        if n:
            self._free[self.cur].clear()
            with self._cv:
                self._job = (self.cur, n)
                self._cv.notify()
            self.entries += n
        self.cur, self.fill = nxt, tail

    # -- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stop:
                    self._cv.wait()
                if self._job is None:
                    return
                slot, n = self._job
                self._job = None
            t = time.perf_counter()
            try:
                if self._error is None:
                    for arr, target in zip(self.slots[slot], self.targets):
                        target.pwrite_all(memoryview(arr[:n]).cast("B"))
            except BaseException as exc:  # reported to the producer at its next call
                self._error = exc
            finally:
                self.write_seconds += time.perf_counter() - t
                self._free[slot].set()

    def close(self) -> int:
        """Write everything, wait, fsync and close; returns the number of entries written."""
        try:
            self._hand_over()
            for e in self._free:
                e.wait()
            self._check()
            tail = self.fill
            if tail:
                t = time.perf_counter()
                for arr, target in zip(self.slots[self.cur], self.targets):
                    target.reopen_buffered()
                    target.pwrite_all(memoryview(arr[:tail]).cast("B"))
                self.write_seconds += time.perf_counter() - t
            self.entries += tail
            self.fill = 0
            for target in self.targets:
                target.fsync()
            return self.entries
        finally:
            self._shutdown()

    def abort(self) -> None:
        """Stop the thread and close the files (the caller removes them)."""
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()
        for target in self.targets:
            target.close()
        self.slots = []
        self._bufs = []
