"""A rank's share of a gzip file's inflated text, as a stream of whole lines.

A ``.gz`` cannot be entered in the middle: each rank of :mod:`.tsv_parallel` inflates from
the start (in a thread, :class:`~.gz.GzipStream`), passes over the text before its range
without a copy, counting its newlines, and stops after the last line that starts in its
range.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GZ_PIECE", "GzSegment", "first_newline"]

#: Inflated bytes a gzip file's inflater hands over at once (a piece of the text).
GZ_PIECE = 4 << 20


class GzSegment:
    """The text of the lines of a gzip file that start in ``[share.begin, share.end)`` of
    its inflated text, as a stream (``readinto``, ``tell``: the compressed bytes read). The
    text before is inflated and passed over in the inflater's pieces (no copy), its
    newlines counted (``lines_before``); ``start``: where the first line begins. The rank
    stops inflating after its last line (closing the stream stops the inflating thread);
    when the text ends under it, ``share.saw_end`` is told its size and last 64 bytes."""

    def __init__(self, share):
        from .gz import GzipStream

        self.share = share
        self.src = GzipStream(share.path, GZ_PIECE)
        self.pieces = self.src.blocks(GZ_PIECE)
        self.cur = _NO_BYTES  # the current piece's bytes not handed over yet
        self.at = 0  # the text offset of cur[0]
        self.last = b""  # the last 64 bytes inflated
        self.lines_before = 0
        self.ended = False  # the text's end reached
        try:
            self.start = self._skip(share.begin)
        except BaseException:
            self.src.close()
            raise
        self.done = share.end is not None and self.start >= share.end

    def _next(self) -> bool:
        """The next piece into ``cur`` (the last one handed over or passed); ``False`` at
        the text's end (the share told)."""
        piece = next(self.pieces, None)
        if piece is None:
            self.cur = _NO_BYTES
            if not self.ended:
                self.ended = True
                self.share.saw_end(self.at, self.last)
            return False
        self.cur = np.frombuffer(piece, np.uint8)
        self.last = (self.last + bytes(piece[-64:]))[-64:]
        return True

    def _skip(self, begin) -> int:
        """Pass over the text to the first line starting at or after ``begin``; returns
        where it starts (the text's end when none does)."""
        from . import _tsv_kernels as K

        if begin <= 0:
            return 0
        while self.cur.size or self._next():
            cut = self._line_end(begin - 1)  # a line starts after the newline at begin - 1 on
            if cut:
                self.lines_before += K.count_newlines(self.cur, cut)
                self.cur = self.cur[cut:]
                self.at += cut
                return self.at
            self.lines_before += K.count_newlines(self.cur, self.cur.size)
            self.at += self.cur.size
            self.cur = _NO_BYTES
        return self.at

    def _line_end(self, offset) -> int:
        """Where in ``cur`` the line holding text byte ``offset`` ends, just after its
        newline (``offset`` before ``cur``: its first line); 0 when that is past ``cur``."""
        at = first_newline(self.cur, max(0, offset - self.at))
        return at + 1 if at >= 0 else 0

    def readinto(self, buf) -> int:
        """Up to ``len(buf)`` bytes of the segment into ``buf``; 0 at its end."""
        view = np.frombuffer(memoryview(buf).cast("B"), np.uint8)
        got, end = 0, self.share.end
        while got < view.size and not self.done:
            if not self.cur.size and not self._next():
                self.done = True
                break
            take = min(view.size - got, self.cur.size)
            if end is not None and self.at + self.cur.size > end - 1:
                # the line holding byte end - 1 is the last: up to the newline ending it
                cut = self._line_end(end - 1)
                if cut and cut <= take:
                    take = cut
                    self.done = True
            view[got : got + take] = self.cur[:take]
            self.cur = self.cur[take:]
            self.at += take
            got += take
        return got

    def tell(self) -> int:
        return self.src.tell()

    def close(self) -> None:
        self.src.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_NO_BYTES = np.empty(0, np.uint8)


def first_newline(buf, start) -> int:
    """The index of the first newline of ``buf`` at or after ``start`` (-1: none), searched
    in 64 KiB steps (``tsv_parallel._last_newline``'s twin), for the line a gzip range's
    cut falls in (a few bytes on, in a 4 MiB piece)."""
    lo = start
    while lo < buf.size:
        hi = min(buf.size, lo + 65536)
        at = np.flatnonzero(buf[lo:hi] == 10)
        if at.size:
            return lo + int(at[0])
        lo = hi
    return -1
