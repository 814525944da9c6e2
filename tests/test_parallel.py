"""The MPI plumbing in ``mpisdnn.parallel``: array collectives past MPI's count limit (lowered
here so small arrays go in many pieces), reductions by name, agreed errors, the accounting hook.

Each collective is checked against the same exchange done with mpi4py's pickled lower-case
calls, which have no count limit and share no code with the wrappers.
"""

import numpy as np
import pytest

from mpisdnn import parallel
from mpisdnn.errors import InputError
from mpisdnn.parallel import AgreedError

from .conftest import self_comm, world


def _blocks(rank, size, seed):
    """Rank ``rank``'s send array and per-destination counts (some zero, some uneven)."""
    rng = np.random.default_rng(seed * 1000 + rank)
    counts = rng.integers(0, 40, size=size).astype(np.int64)
    counts[(rank + 1) % size] = 0  # an empty pair
    return rng.standard_normal(int(counts.sum())).astype(np.float32), counts


def _pickled_alltoallv(comm, send, counts):
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pieces = comm.alltoall([send[s : s + n].tolist() for s, n in zip(starts, counts)])
    return np.array([x for piece in pieces for x in piece], dtype=send.dtype)


@pytest.mark.mpi
@pytest.mark.parametrize("limit", [parallel.MAX_COUNT, 7, 1])
def test_alltoallv_array_in_rounds_matches_pickled_exchange(monkeypatch, limit):
    comm = world()
    # below the limit one Alltoallv; at 7 (or 1) elements every pair needs several rounds
    monkeypatch.setattr(parallel, "MAX_COUNT", limit)
    send, counts = _blocks(comm.rank, comm.size, seed=1)
    recv_counts = np.empty(comm.size, np.int64)
    comm.Alltoall(counts, recv_counts)
    got = parallel.alltoallv_array(comm, send, counts, recv_counts)
    want = _pickled_alltoallv(comm, send, counts)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("piece", [parallel.PIECE_BYTES, 12])
def test_gather_and_bcast_arrays_in_pieces(monkeypatch, piece):
    comm = world()
    monkeypatch.setattr(parallel, "PIECE_BYTES", piece)
    rng = np.random.default_rng(comm.rank)
    mine = [rng.integers(0, 99, size=5 * comm.rank + 3), rng.standard_normal(comm.rank)]
    got = parallel.gather_arrays(comm, mine, root=comm.size - 1)
    everyone = comm.allgather(mine)
    if comm.rank == comm.size - 1:
        for j in range(2):
            np.testing.assert_array_equal(got[j], np.concatenate([m[j] for m in everyone]))
    else:
        assert got is None
    full = np.arange(101, dtype=np.int64) * 3 if comm.rank == 0 else None
    np.testing.assert_array_equal(parallel.bcast_array(comm, full), np.arange(101) * 3)


@pytest.mark.mpi
def test_allreduce_by_name_scalars_and_arrays():
    comm = world()
    r, n = comm.rank, comm.size
    assert parallel.allreduce(comm, r + 1) == n * (n + 1) // 2
    assert parallel.allreduce(comm, float(r), "max") == n - 1
    assert parallel.allreduce(comm, r, "min") == 0
    assert parallel.allreduce(comm, 1 << r, "bor") == (1 << n) - 1
    arr = np.array([r, -r, 2], dtype=np.int64)
    got = parallel.allreduce(comm, arr, "sum")
    assert got.dtype == np.int64 and got is not arr
    assert got.tolist() == [n * (n - 1) // 2, -n * (n - 1) // 2, 2 * n]
    assert parallel.allreduce(comm, arr.astype(np.float64), "max").tolist() == [n - 1, 0, 2]


@pytest.mark.mpi
def test_agree_error_from_one_rank_reaches_all_and_names_it():
    comm = world()
    err = InputError("bad file") if comm.rank == comm.size - 1 else None
    with pytest.raises(AgreedError) as info:
        parallel.agree_error(comm, err)
    prefix = f"(rank {comm.size - 1}) " if comm.size > 1 else ""
    assert str(info.value) == f"{prefix}bad file" and info.value.exit_code == 2
    parallel.agree_error(comm, None)  # nobody failed: returns


def test_accounting_sees_every_wrapped_call():
    """The wrappers' MPI calls go through the counting communicator (one rank: no bytes)."""
    comm = parallel.counting(self_comm())
    with parallel.phase("gather"):
        parallel.allreduce(comm, np.zeros(4, np.float64), "max")  # Allreduce
        parallel.alltoallv_array(
            comm, np.arange(3, dtype=np.int32), [3], [3]
        )  # allreduce, Alltoallv
        parallel.agree(comm, lambda: None)  # allgather
    section = parallel.communication_section(comm)
    assert list(section["phases"]) == ["gather"]
    assert section["phases"]["gather"]["calls"] == 4 and section["bytes"] == 0


def test_a_call_outside_every_phase_counts_as_other():
    comm = parallel.counting(self_comm())
    comm.allgather(1)  # no phase entered: not guessed from this module's name
    with parallel.phase("load"):
        comm.allgather(2)
        with parallel.phase("gather"):  # the innermost phase wins
            comm.allgather(3)
        comm.Barrier()
    phases = parallel.communication_section(comm)["phases"]
    assert {k: v["calls"] for k, v in phases.items()} == {"load": 2, "gather": 1, "other": 1}
    assert list(phases) == ["load", "gather", "other"]  # report order: PHASE_NAMES, other


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown communication phase 'lod'"):
        parallel.phase("lod")
    with pytest.raises(ValueError):
        parallel.phase("other")  # where calls outside every phase go; not entered


def test_phase_as_a_decorator_counts_every_call_of_the_function():
    comm = parallel.counting(self_comm())

    @parallel.phase("checkpoint")
    def save():
        parallel.agree(comm, lambda: None)  # a wrapper serves the caller's phase
        comm.Barrier()

    save()
    save()
    comm.Barrier()
    phases = parallel.communication_section(comm)["phases"]
    assert {k: v["calls"] for k, v in phases.items()} == {"checkpoint": 4, "other": 1}


def test_serial_collectives_on_one_rank(monkeypatch):
    comm = self_comm()
    monkeypatch.setattr(parallel, "MAX_COUNT", 2)
    send = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(parallel.alltoallv_array(comm, send, [5], [5]), send)
    got = parallel.gather_arrays(comm, [send])
    np.testing.assert_array_equal(got[0], send)
    with pytest.raises(AgreedError, match="^no such file$"):
        parallel.agree_error(comm, InputError("no such file"))


@pytest.mark.mpi
def test_prefix_sum_in_place_reduction_point_to_point_and_node_split():
    """The wrappers the parallel readers and writers use (exscan, allreduce_in_place,
    isend/send/recv_array, split_shared) against values computed from the ranks alone."""
    comm = world()
    r, n = comm.rank, comm.size
    assert parallel.exscan(comm, r + 1) == (None if r == 0 else r * (r + 1) // 2)
    arr = np.array([r, 1], np.int64)
    assert parallel.allreduce_in_place(comm, arr) is arr
    assert arr.tolist() == [n * (n - 1) // 2, n]
    # a ring: each rank's ids to the next rank, received from the previous one
    request = parallel.isend_array(comm, np.full(3, r, np.int32), (r + 1) % n, 5)
    got = parallel.recv_array(comm, np.empty(3, np.int32), (r - 1) % n, 5)
    request.Wait()
    assert got.tolist() == [(r - 1) % n] * 3
    if r:
        parallel.send_array(comm, np.array([10 * r], np.int64), 0, 6)
    else:
        heard = [parallel.recv_array(comm, np.empty(1, np.int64), s, 6) for s in range(1, n)]
        assert [int(h[0]) for h in heard] == [10 * s for s in range(1, n)]
    node = parallel.split_shared(comm)
    try:
        assert 1 <= node.size <= n and parallel.allreduce(node, 1) == node.size
        assert parallel.allreduce(comm, 1 if node.rank == 0 else 0) >= 1  # one leader per node
    finally:
        node.Free()


@pytest.mark.mpi
def test_ranks_waiting_for_the_root_sleep_instead_of_spinning():
    """While rank 0 works alone in ``agree_root(..., idle=True)`` (1.5 s here), the others
    wait in ``idle_barrier``: they use almost no CPU (MPI's blocking wait would spin a core at
    100 %, taking it from rank 0's own threads), and they get rank 0's result."""
    import time

    comm = world()
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    parallel.barrier(comm)
    c0 = time.process_time()
    got = parallel.agree_root(comm, lambda: time.sleep(1.5) or "done", idle=True)
    spent = time.process_time() - c0
    assert got == "done"
    if comm.rank > 0:
        assert spent < 0.5, f"rank {comm.rank} used {spent:.2f} CPU-s waiting 1.5 s"
