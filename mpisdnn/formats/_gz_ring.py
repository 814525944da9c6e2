"""One inflater per node for the parallel inputs reader: a gzip file's text through a ring.

A gzip stream cannot be entered in the middle, so every rank of the parallel reader needs the
whole inflated text (the blocks' cuts depend on it). Rather than every rank inflating the
file, the node's first rank inflates it (:class:`~.gz.GzipStream`) and copies the text, as
it reads it, into a ring of slots in the node's shared memory
(:func:`~mpisdnn.parallel.node_shared_array`); the node's other ranks read the same bytes
from the ring. Each slot filled is announced to every other rank of the node (a small
message: its sequence number, bytes and the compressed bytes read so far), and each rank
acknowledges a slot once it has copied it out; the inflating rank reuses a slot only when
every rank has. Both sides read to the end even when they stop early (a bad line, the
caller's error): a stream's ``close`` drains it, so no rank is ever left waiting. A gzip
error on the inflating rank reaches the others as a failure of their own read; the
inflating rank's message is the one reported (it is the node's lowest rank, and the same
error stops every node's inflater).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..parallel import node_shared_array, recv_array_idle, send_array

__all__ = ["SLOT_BYTES", "SLOTS", "Ring"]

#: Bytes of one slot of the ring (the inflater's pieces are 4 MiB).
SLOT_BYTES = 4 << 20
#: Slots of the ring: room for the inflating rank to run two 16 MiB blocks ahead.
SLOTS = 12
_DATA, _ACK = 4101, 4102  # message tags on the node's communicator
_END, _FAILED = 0, -1  # a slot announcement's byte count: the text ended, or failed


class Ring:
    """The node's ring (collective over ``node`` to make: :func:`make`); ``open`` gives this
    rank's stream of the file's text."""

    def __init__(self, node, path, slots, slot_bytes):
        self.node, self.path = node, path
        self.slots, self.slot_bytes = slots, slot_bytes
        self.mem = node_shared_array(node, slots * slot_bytes, np.uint8).reshape(slots, -1)

    @classmethod
    def make(cls, node, path, slots=None, slot_bytes=None):
        """The ring, or ``None`` when the node has one rank or its shared memory refuses
        the room (the same answer on every rank of the node)."""
        if node.size == 1:
            return None
        try:
            return cls(node, path, slots or SLOTS, slot_bytes or SLOT_BYTES)
        except OSError:
            return None

    @property
    def inflates(self) -> bool:
        """Whether this rank is the node's inflater."""
        return self.node.rank == 0

    def open(self):
        """This rank's stream of the text: the inflater's on the node's first rank, the
        ring's on the others (a context manager with ``readinto`` and ``tell``)."""
        return _Feed(self) if self.inflates else _Reader(self)


class _Feed:
    """The node's first rank: inflates, hands the caller its bytes and fills the ring."""

    def __init__(self, ring):
        from .gz import GzipStream

        self.ring = ring
        self.src = GzipStream(ring.path, 4 << 20)
        self.seq = 0  # slots announced
        self.acked = 0  # slots every other rank has copied out (they do so in order)
        self.done = False  # the end (or a failure) announced
        self.msg = np.zeros(3, np.int64)
        self.ack = np.zeros(1, np.int64)

    def _announce(self, n, where):
        node = self.ring.node
        self.msg[:] = (self.seq, n, where)
        for r in range(1, node.size):
            send_array(node, self.msg, r, _DATA)

    def _slot(self):
        """The next slot, once every other rank has copied out what it last held."""
        while self.seq - self.acked >= self.ring.slots:
            self._acks()
        return self.ring.mem[self.seq % self.ring.slots]

    def _acks(self):
        node = self.ring.node
        for r in range(1, node.size):
            recv_array_idle(node, self.ack, r, _ACK)
        self.acked += 1

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        if self.done:
            return 0
        got = 0
        while got < len(view):
            slot = self._slot()
            want = min(len(view) - got, slot.size)
            try:
                k = self.src.readinto(slot[:want])
            except BaseException:
                self._finish(_FAILED)
                raise
            if k == 0:
                self._finish(_END)
                break
            view[got : got + k] = slot[:k]
            self._announce(k, self.src.tell())
            self.seq += 1
            got += k
        return got

    def _finish(self, how):
        if not self.done:
            self.done = True
            self._announce(how, self.src.tell())
            while self.acked < self.seq:  # the slots still held
                self._acks()

    def tell(self) -> int:
        return self.src.tell()

    def close(self) -> None:
        """Read to the end for the others (the caller may have stopped early), then close."""
        try:
            scratch = np.empty(self.ring.slot_bytes, np.uint8)
            while not self.done:
                self.readinto(scratch)
        except (InputError, OSError, MemoryError):
            pass  # announced as a failure; the caller has or will report its own
        finally:
            self.src.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Reader:
    """Another rank of the node: the text from the ring, slot by slot, in order."""

    def __init__(self, ring):
        self.ring = ring
        self.msg = np.zeros(3, np.int64)
        self.ack = np.zeros(1, np.int64)
        self.cur = None  # the slot being copied out, and how far
        self.at = self.left = 0
        self.where = 0
        self.done = False

    def _next(self) -> bool:
        node = self.ring.node
        recv_array_idle(node, self.msg, 0, _DATA)
        seq, n, self.where = (int(x) for x in self.msg)
        if n == _END:
            self.done = True
            return False
        if n == _FAILED:
            self.done = True
            raise InputError(f"{self.ring.path}: the gzip stream failed on the inflating rank")
        self.cur = self.ring.mem[seq % self.ring.slots]
        self.at, self.left = 0, n
        return True

    def _release(self):
        self.ack[0] = 1
        send_array(self.ring.node, self.ack, 0, _ACK)
        self.cur = None

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        got = 0
        while got < len(view):
            if self.cur is None and (self.done or not self._next()):
                break
            k = min(len(view) - got, self.left)
            view[got : got + k] = self.cur[self.at : self.at + k]
            self.at += k
            self.left -= k
            got += k
            if self.left == 0:
                self._release()
        return got

    def tell(self) -> int:
        return self.where

    def close(self) -> None:
        """Take (and release) every slot to the end: the inflating rank waits for them."""
        try:
            if self.cur is not None:
                self._release()
            while not self.done and self._next():
                self._release()
        except InputError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
