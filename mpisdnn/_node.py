"""The ranks of one node: the node split and arrays every rank of a node maps; owned and
re-exported by :mod:`mpisdnn.parallel` (call them from there).

Kept apart from ``parallel.py`` as one concern (memory shared within a node, its file, its
room check); it imports nothing of the package, so ``parallel`` can re-export it.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["split_shared", "split_color", "node_shared_array", "SHARED_DIR"]

#: Where :func:`node_shared_array` puts its files: the node's memory file system.
SHARED_DIR = "/dev/shm"


def split_shared(comm):
    """The ranks of ``comm`` that share this node (``Split_type(COMM_TYPE_SHARED)``, a
    collective); the caller frees it. A communicator without MPI (the library's
    ``SerialComm``) is its own node."""
    if not hasattr(comm, "Split_type"):
        return comm
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED)


def split_color(comm, color: int):
    """The ranks of ``comm`` with the same ``color`` (``Split``, a collective; ranks keep
    their order); the caller frees it."""
    return comm.Split(int(color), comm.rank)


def _create(nbytes: int) -> str:
    st = os.statvfs(SHARED_DIR)
    if st.f_bavail * st.f_frsize < nbytes:
        raise OSError(f"{SHARED_DIR}: {nbytes} bytes needed, {st.f_bavail * st.f_frsize} free")
    import tempfile

    fd, name = tempfile.mkstemp(prefix="mpisdnn-shared-", dir=SHARED_DIR)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    return name


def node_shared_array(node, n: int, dtype) -> np.ndarray:
    """A 1-D array of ``n`` items of ``dtype`` that every rank of ``node`` (ranks sharing a
    node, :func:`split_shared`) maps: one copy of the memory, each rank writing its part
    (collective over ``node``; the caller synchronises the writes with a barrier).

    The memory is a file in :data:`SHARED_DIR`, created by the node's rank 0 and unlinked
    once every rank has mapped it, so it goes away with the last array that views it. An
    MPI-3 shared window (``Win.Allocate_shared``) would hold the same pages, but it must be
    freed collectively, which arrays dropped at different moments on different ranks (a
    :class:`~mpisdnn.projection.Graph` kept by a caller) cannot promise. Raises
    :class:`OSError` on every rank when the file system lacks the room (checked first: a
    write past a full tmpfs would be a SIGBUS, not an error); a single rank gets a plain
    array.
    """
    import mmap

    from mpi4py import MPI

    dtype = np.dtype(dtype)
    n = int(n)
    if node.size == 1:
        return np.empty(n, dtype)
    nbytes = max(n * dtype.itemsize, 1)  # mmap refuses 0 bytes
    made = None
    if node.rank == 0:
        try:
            made = ("ok", _create(nbytes))
        except OSError as exc:
            made = ("error", f"{exc.strerror or exc}")
    kind, name = node.bcast(made, root=0)
    if kind == "error":
        raise OSError(name)
    try:
        fd = os.open(name, os.O_RDWR)
        try:
            mem = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        failure = None
    except OSError as exc:
        mem, failure = None, exc
    failed = node.allreduce(failure is not None, op=MPI.LOR)  # every rank has mapped it
    if node.rank == 0:
        os.unlink(name)
    if failed:
        raise failure or OSError(f"{name}: another rank of the node could not map it")
    return np.frombuffer(mem, dtype, count=n)
