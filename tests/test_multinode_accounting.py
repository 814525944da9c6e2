"""Communication accounting (``parallel.counting``): calls and bytes per phase, exactly.

Run under ``mpiexec -n K ... -m mpi``: each rank makes MPI calls of known sizes through a
counting communicator and the report section must add up to the sizes computed here.
"""

import numpy as np
import pytest

from mpisdnn.parallel import communication_section, counting, phase

from .conftest import world


@pytest.mark.mpi
def test_bytes_and_calls_per_phase_are_exact():
    from mpi4py import MPI

    raw = world()
    comm = counting(raw)
    p, r = raw.size, raw.rank
    with phase("gather"):
        local = np.full(r + 1, r, dtype=np.float64)  # rank r puts in 8 (r + 1) bytes
        counts = np.arange(1, p + 1)
        out = np.empty(int(counts.sum()))
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        comm.Allgatherv(local, [out, counts, displs, MPI.DOUBLE])
        assert out.sum() == sum(k * (k + 1) for k in range(p))
    with phase("load"):
        buf = np.arange(100, dtype=np.int32) if r == 0 else np.empty(100, dtype=np.int32)
        comm.Bcast(buf, root=0)  # only the root's 400 bytes are sent
        comm.allgather(np.ones(5, dtype=np.float32))  # pickled array: its 20 bytes
    with phase("stage_handoff"):
        if p > 1:
            msg = np.full(10, r, dtype=np.uint8)
            req = comm.Isend([msg, MPI.BYTE], dest=(r + 1) % p, tag=5)
            got = np.empty(10, dtype=np.uint8)
            comm.Recv([got, MPI.BYTE], source=(r - 1) % p, tag=5)  # receives are not counted
            req.Wait()
        sub = comm.Split(r % 2, r)  # a sub-communicator counts into the same counter
        sub.Allreduce(np.ones(3), np.empty(3), op=MPI.SUM)  # 24 bytes per rank
        sub.Free()
    section = communication_section(comm)
    assert communication_section(raw) is None  # an uncounted communicator has no section
    ph = section["phases"]
    # Nothing leaves a one-rank communicator: a 1-rank job (or sub-communicator) sends 0 bytes.
    one = p == 1
    assert ph["gather"]["bytes"] == (0 if one else 8 * p * (p + 1) // 2)
    assert ph["gather"]["max_rank_bytes"] == (0 if one else 8 * p)
    assert ph["gather"]["calls"] == p and ph["gather"]["sends"] == 0
    assert ph["load"]["bytes"] == (0 if one else 400 + 20 * p)
    assert ph["load"]["max_rank_bytes"] == (0 if one else 420)
    assert ph["load"]["calls"] == 2 * p
    sends = 0 if one else p
    # ranks whose parity class (their sub-communicator) has another rank in it
    in_pairs = sum(1 for k in range(p) if len(range(k % 2, p, 2)) > 1)
    assert ph["stage_handoff"]["sends"] == sends
    assert ph["stage_handoff"]["send_bytes"] == 10 * sends
    assert ph["stage_handoff"]["bytes"] == 10 * sends + 24 * in_pairs
    assert ph["stage_handoff"]["collectives"] == 2 * p  # Split and the sub Allreduce
    assert section["bytes"] == sum(v["bytes"] for v in ph.values())
    mine = 0 if one else 8 * (r + 1) + 20 + (400 if r == 0 else 0) + 10
    mine += 24 if len(range(r % 2, p, 2)) > 1 else 0
    assert section["rank_bytes"][r] == mine


@pytest.mark.mpi
def test_calls_count_in_the_phase_their_caller_entered(tmp_path_factory):
    """No phase is guessed from the calling module: a wrapper called from code compiled as
    :mod:`mpisdnn.sdnn.rebalance` outside every phase counts as ``other``, while
    :func:`~mpisdnn.sdnn.rebalance.exchange_rows` (which enters its phase) counts as
    ``rebalance``, and a stage's slice loading as ``load`` (not ``stage_handoff``)."""
    import scipy.sparse as sp

    from mpisdnn.formats import hdf5
    from mpisdnn.parallel import allgather_array, bcast
    from mpisdnn.sdnn import rebalance
    from mpisdnn.sdnn.pipeline import load_stage_network

    from .conftest import random_network

    raw = world()
    comm = counting(raw)
    code = compile("allgather_array(comm, x)", rebalance.__file__, "eval")
    scope = {"__name__": rebalance.__name__, "allgather_array": allgather_array, "comm": comm,
             "x": np.ones(4)}  # fmt: skip
    eval(code, scope)
    ph = communication_section(comm)["phases"]
    assert list(ph) == ["other"], ph
    assert ph["other"]["bytes"] >= (32 * comm.size if comm.size > 1 else 0)

    comm = counting(raw)
    rows = sp.csr_matrix(np.eye(4, 8, dtype=np.float32))
    gid = np.arange(4, dtype=np.int64) + 4 * raw.rank
    rebalance.exchange_rows(comm, rows, gid, np.full(4, (raw.rank + 1) % raw.size))
    ph = communication_section(comm)["phases"]
    assert list(ph) == ["rebalance"], ph

    comm = counting(raw)
    path = bcast(raw, str(tmp_path_factory.mktemp("net") / "net.h5") if raw.rank == 0 else None)
    if raw.rank == 0:
        hdf5.write_network(path, random_network(16, 4, seed=3))
    raw.Barrier()
    store, k0, k1, total = load_stage_network(comm, path, raw.size)
    assert total == 4 and len(store) == k1 - k0
    ph = communication_section(comm)["phases"]
    assert list(ph) == ["load"], ph
