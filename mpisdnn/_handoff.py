"""The stage flow's hand-off: micro-batches passed from one pipeline stage to the next.

A stage of ``mpisdnn infer --stages S`` (:mod:`mpisdnn.sdnn.pipeline`) receives a batch of
live rows from the stage before it, runs its layers on them and sends the survivors on to
the next one while it starts on the following batch. This module owns that traffic: the
wire format (:func:`pack` / :func:`unpack`: one byte buffer per batch), the flow of one
rank (:class:`Flow`), the group's communicators (:func:`stage_comms`) and the waits that
do not spin (:func:`~mpisdnn.parallel.idle_wait`).

It is the one module besides :mod:`mpisdnn.parallel` that calls MPI directly (its
collectives go through :mod:`mpisdnn.parallel`), and the only one with point-to-point
messages: a batch goes to one neighbour, as soon as it is ready, with a non-blocking send
(``Isend``) that overlaps the next batch's compute and a probe (``Iprobe``) that sleeps
between looks; no collective can express that overlap. The group communicators
(``Split``) serve the same flow, and its waits sleep (:func:`~mpisdnn.parallel.idle_wait`). It knows
nothing of layers or rows beyond the arrays it moves: what a stage computes is a callable.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

from .parallel import bcast, gather, idle_wait, phase

__all__ = ["Flow", "group_rows", "pack", "stage_comms", "unpack"]

#: Sends a stage keeps in flight before waiting for the oldest (bounds buffer memory).
MAX_IN_FLIGHT = 4
#: Seconds a stage sleeps between looks while it waits for a batch or its peers. MPI's
#: blocking calls spin: a waiting stage would take the core from a working one wherever
#: ranks share cores (more ranks than cores, or a loaded node).
IDLE_SLEEP = 1e-4
_TAG = 7311


def pack(gid, m, state) -> np.ndarray:
    """One byte buffer: ``[rows, nnz, state size]`` then gid, indptr (int64), indices
    (int32), data, and the merges of identical rows (``state``: int64, or ``None``)."""
    state = np.zeros(0, np.int64) if state is None else state
    head = np.array([gid.size, m.nnz, state.size], dtype=np.int64)
    parts = [
        head,
        np.ascontiguousarray(gid, np.int64),
        np.ascontiguousarray(m.indptr, np.int64),
        np.ascontiguousarray(m.indices, np.int32),
        np.ascontiguousarray(m.data, np.float32),
        np.ascontiguousarray(state, np.int64),
    ]
    return np.concatenate([p.view(np.uint8) for p in parts])


def unpack(buf, neurons):
    """``(gid, csr, state)`` from a :func:`pack` buffer (views of ``buf``, no copies);
    ``state`` is ``None`` when the batch carried none."""
    rows, nnz, nstate = (int(v) for v in buf[:24].view(np.int64))
    o = 24
    gid = buf[o : o + 8 * rows].view(np.int64)
    o += 8 * rows
    indptr = buf[o : o + 8 * (rows + 1)].view(np.int64)
    o += 8 * (rows + 1)
    indices = buf[o : o + 4 * nnz].view(np.int32)
    o += 4 * nnz
    data = buf[o : o + 4 * nnz].view(np.float32)
    o += 4 * nnz
    state = buf[o : o + 8 * nstate].view(np.int64) if nstate else None
    return gid, sp.csr_matrix((data, indices, indptr), shape=(rows, neurons)), state


@contextmanager
def stage_comms(comm, stages: int):
    """``(group, peers)``: the ranks of this rank's data group (its stages, in order) and
    the ranks of its stage in every group; both freed on exit."""
    stage, group = comm.rank % stages, comm.rank // stages
    with phase("stage_handoff"):
        sub = comm.Split(group, stage)
        peers = comm.Split(stage, group)
    try:
        yield sub, peers
    finally:
        peers.Free()
        sub.Free()


@phase("stage_handoff")
def group_rows(sub, stage, gid, y_host):
    """The group's rows on its stage 0, in global row order (setup, like loading); returns
    ``(gid, rows, number of rows)`` (stage 0 holds them, the others only the count)."""
    got = gather(sub, (gid, y_host), root=0)
    if stage == 0:
        gid = np.concatenate([g for g, _ in got])
        y_host = sp.vstack([m for _, m in got], format="csr", dtype=np.float32)
        order = np.argsort(gid, kind="stable")
        gid, y_host = gid[order], y_host[order]
    del got
    nrows = bcast(sub, int(gid.size) if stage == 0 else None, root=0)
    return gid, y_host, nrows


class Flow:
    """One rank's part of its group's flow: receive, compute and forward micro-batches
    (stage 0 cuts them from the group's rows ``gid``/``y``; the last stage keeps them in
    :attr:`finals`). ``merges``: what gives stage 0 each batch's state (an object with
    ``handoff(gid)``, the head's merges of identical rows), or ``None``."""

    def __init__(self, sub, stage, stages, gid, y, batch, neurons, merges=None):
        self.sub, self.stage, self.stages = sub, stage, stages
        self.gid, self.y, self.batch, self.neurons = gid, y, batch, neurons
        self.merges = merges
        #: The last stage's batches: ``(gid, csr, state)`` each.
        self.finals: list = []
        #: Bytes this rank sent to the next stage.
        self.sent = 0

    def _batch(self, b, status):
        """Batch ``b``: cut from the group's rows (stage 0) or received from the stage
        before (sleeping between probes)."""
        from mpi4py import MPI

        if self.stage == 0:
            lo, hi = b * self.batch, min(self.gid.size, (b + 1) * self.batch)
            g, m = self.gid[lo:hi], self.y[lo:hi]
            state = None if self.merges is None else self.merges.handoff(g)
            return g, m, state
        sub, src = self.sub, self.stage - 1
        while not sub.Iprobe(source=src, tag=_TAG, status=status):
            time.sleep(IDLE_SLEEP)
        buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
        sub.Recv([buf, MPI.BYTE], source=src, tag=_TAG)
        return unpack(buf, self.neurons)

    @phase("stage_handoff")
    def run(self, compute, batches):
        """Micro-batches ``batches`` (a range) through ``compute(gid, csr, state) -> (gid,
        csr, state)``; returns once every send of them has completed."""
        from mpi4py import MPI

        pending = []
        status = MPI.Status()
        for b in batches:
            g, m, state = compute(*self._batch(b, status))
            if self.stage == self.stages - 1:
                self.finals.append((np.array(g), sp.csr_matrix(m), state))
                continue
            out = pack(g, m, state)
            self.sent += out.nbytes
            pending.append((self.sub.Isend([out, MPI.BYTE], dest=self.stage + 1, tag=_TAG), out))
            if len(pending) > MAX_IN_FLIGHT:
                idle_wait(pending.pop(0)[0], IDLE_SLEEP)
        for r, _ in pending:
            idle_wait(r, IDLE_SLEEP)
