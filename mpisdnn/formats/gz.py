"""Byte streams of input files as published: plain, or gzip (told by its magic bytes, not its
name), inflated in a background thread while the caller parses.

:func:`open_bytes` returns a readable stream (``readinto``/``read``) for any file; a gzip
file is inflated block by block by :class:`GzipStream` in a thread (the inflate call releases
the GIL, as the compiled parser does), a few blocks ahead of the reader, so inflating and
parsing overlap and the memory held is a few blocks. The inflater is ISA-L's
(``isal.isal_zlib``) when installed, else the standard library's ``zlib`` (same output; ISA-L
inflates 2-3x faster: ``scripts/bench_gzip.py``). A gzip file that ends inside its
compressed data or whose checksum fails is one :class:`~mpisdnn.errors.InputError` line.
"""

from __future__ import annotations

import os
import queue
import threading

from ..errors import InputError

__all__ = [
    "GZIP_MAGIC",
    "is_gzip",
    "open_bytes",
    "GzipStream",
    "inflater_name",
    "read_all",
    "inflate_bytes",
    "gzip_writer",
    "text_size_estimate",
    "trailer_size",
]

GZIP_MAGIC = b"\x1f\x8b"
#: Decompressed bytes handed over at once.
BLOCK = 4 << 20
#: Blocks inflated ahead of the reader.
DEPTH = 4
_READ = 1 << 20


def _zlib():
    try:
        from isal import isal_zlib

        return isal_zlib
    except ImportError:  # pragma: no cover - isal is optional
        import zlib

        return zlib


def inflater_name() -> str:
    """``isal`` or ``zlib``: the library that inflates gzip input here."""
    return "zlib" if _zlib().__name__ == "zlib" else "isal"


def gzip_writer(path, threads: int | None = None):
    """A binary file object writing one gzip stream to ``path`` (the caller closes it).

    ISA-L's threaded writer (``isal.igzip_threaded``, level 1, ``threads`` compressing
    threads, default the CPUs this process may use) when installed: on the official layer
    text it compresses 6.7x at ~390 MB/s a core, where the published archive (gzip's default
    level) has 7.2x and the standard library's ``gzip`` level 6 runs ~20 MB/s. Without isal,
    the standard library's ``gzip`` at level 6.
    """
    try:
        from isal import igzip_threaded
    except ImportError:  # pragma: no cover - isal is optional
        import gzip

        return gzip.open(path, "wb", compresslevel=6)
    threads = threads or len(os.sched_getaffinity(0))
    return igzip_threaded.open(path, "wb", compresslevel=1, threads=max(1, threads))


def is_gzip(path) -> bool:
    """Whether ``path`` starts with the gzip magic bytes (any name; False when unreadable)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False


def open_bytes(path, block: int = BLOCK):
    """A binary stream of the content of ``path``: inflated when it is gzip, else the file.

    The caller closes it (``with`` works).
    """
    if is_gzip(path):
        return GzipStream(path, block)
    return open(path, "rb")


def read_all(path) -> bytes:
    """The whole content of ``path`` (inflated when gzip): for small files (a truth file)."""
    with open_bytes(path) as fh:
        return fh.read()


def inflate_bytes(data: bytes, name) -> bytes:
    """The inflated content of gzip ``data`` (one or several members) read from ``name``:
    a gzip file inside an archive, or named ``.tsv``, has the lines a file's stream has
    (truncated, corrupt, trailing data), naming ``name``."""
    import io

    with GzipStream(name, fileobj=io.BytesIO(data)) as fh:
        return fh.read()


def trailer_size(path) -> int:
    """The ISIZE of gzip file ``path``'s trailer: its last member's inflated size modulo
    2**32 (the whole text's size for one member)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 4))
        return int.from_bytes(fh.read(4), "little")


def text_size_estimate(path, sample: int = 1 << 18) -> int:
    """About how many bytes the gzip file ``path`` inflates to: its trailer's ISIZE (the
    last member's size modulo 2**32), plus the multiple of 2**32 that brings the whole
    file's ratio nearest that of its first ``sample`` compressed bytes; that ratio's size
    itself where even so ISIZE is under a quarter of it (several members: ``bgzip``'s 64 KiB
    ones, or files joined with ``cat``, whose last member's ISIZE says little). Exact for
    one member under 4 GiB; only a plan's hint otherwise (the same on every rank: it reads
    the same bytes)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(min(sample, size))
    isize = trailer_size(path)
    try:
        d = _zlib().decompressobj(31)
        got = len(d.decompress(head, 64 * len(head)))  # at most 64x: a sample is enough
        used = len(head) - len(d.unconsumed_tail) - (len(d.unused_data) if d.eof else 0)
    except Exception:  # noqa: BLE001 - a damaged file: its read says so, with its line
        return isize
    ratio = got / max(used, 1)
    want = ratio * size
    k = max(0, round((want - isize) / 2**32))
    guess = isize + k * 2**32
    return int(want) if 4 * guess < want else guess


class _Failure:
    def __init__(self, exc):
        self.exc = exc


_END = object()


class GzipStream:
    """The inflated content of a gzip file (one or several members), read in order.

    A thread inflates ``block``-byte pieces at most :data:`DEPTH` ahead of the reader.
    Errors (truncated, corrupt, unreadable) are raised by the read that reaches them.
    """

    def __init__(self, path, block: int = BLOCK, depth: int = DEPTH, fileobj=None):
        self.path = os.fspath(path)
        self.block = int(block)
        self._q = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._cur = memoryview(b"")
        self._done = False
        self.inflated = 0
        self._fh = open(self.path, "rb") if fileobj is None else fileobj  # named: path
        self._thread = threading.Thread(target=self._run, name="mpisdnn-gunzip", daemon=True)
        self._thread.start()

    # the producer -------------------------------------------------------------------------
    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._inflate()
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            self._put(_Failure(exc))
            return
        self._put(_END)

    def _inflate(self) -> None:
        z = _zlib()
        d = None  # the current member's inflater
        fh = self._fh
        carry = b""
        while not self._stop.is_set():
            raw = fh.read(_READ)
            if not raw:
                break
            raw, carry = carry + raw, b""
            while raw:
                if d is None or d.eof:
                    if not raw.strip(b"\0"):
                        break  # zero padding after the last member
                    if len(raw) < 2 and d is not None:
                        carry = raw  # a next member's magic split over two reads
                        break
                    if not raw.startswith(GZIP_MAGIC):
                        raise InputError(
                            f"{self.path}: data after the end of the gzip stream (a damaged "
                            f"or appended file?)"
                        )
                    d = z.decompressobj(31)
                try:
                    out = d.decompress(raw, self.block)
                except z.error as exc:
                    raise InputError(f"{self.path}: corrupt gzip data ({exc})") from None
                raw = d.unused_data if d.eof else d.unconsumed_tail
                if out and not self._put(out):
                    return
        if self._stop.is_set():
            return
        if d is None or not d.eof:
            raise InputError(
                f"{self.path}: truncated gzip file (it ends inside the compressed data: an "
                f"interrupted download or copy?)"
            )

    # the reader ---------------------------------------------------------------------------
    def _next(self) -> bool:
        if self._done:
            return False
        item = self._q.get()
        if item is _END:
            self._done = True
            return False
        if isinstance(item, _Failure):
            self._done = True
            raise item.exc
        self._cur = memoryview(item)
        return True

    def readinto(self, buf) -> int:
        """Copy up to ``len(buf)`` inflated bytes into ``buf``; 0 at the end."""
        view = memoryview(buf).cast("B")
        got = 0
        while got < len(view):
            if not self._cur.nbytes and not self._next():
                break
            n = min(len(view) - got, self._cur.nbytes)
            view[got : got + n] = self._cur[:n]
            self._cur = self._cur[n:]
            got += n
        self.inflated += got
        return got

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when ``n`` < 0)."""
        if n is None or n < 0:
            parts = [bytes(self._cur)]
            self.inflated += self._cur.nbytes
            self._cur = memoryview(b"")
            while self._next():
                parts.append(bytes(self._cur))
                self.inflated += self._cur.nbytes
                self._cur = memoryview(b"")
            return b"".join(parts)
        buf = bytearray(n)
        got = self.readinto(buf)
        return bytes(buf[:got])

    def blocks(self, size: int = BLOCK):
        """The content as successive pieces of at most ``size`` bytes (views, read once)."""
        while True:
            if not self._cur.nbytes and not self._next():
                return
            piece = self._cur[:size]
            self._cur = self._cur[size:]
            self.inflated += piece.nbytes
            yield piece

    def tell(self) -> int:
        """Compressed bytes read so far (ahead of the inflated ones the reader has: for
        progress lines)."""
        try:
            return self._fh.tell()
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
