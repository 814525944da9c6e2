"""Projection under MPI (pytest-mpi): any world size gives the serial result, byte for byte.

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests``.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.generate.graphs import bipartite, rmat
from mpisdnn.parallel import AgreedError
from mpisdnn.projection import project, project_matrix, read_projection, write_graph
from mpisdnn.projection.load import load_graph

from .conftest import same_csr

pytestmark = pytest.mark.mpi

WEIGHTS = ["count", "product", "ratio", "jaccard", "overlap", "newman", "cosine", "hive"]


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _gather(comm, res):
    blocks = comm.allgather((res.row_start, res.matrix))
    return sp.vstack([m for _, m in sorted(blocks, key=lambda x: x[0])], format="csr")


@pytest.mark.parametrize("weight", WEIGHTS)
def test_ranks_match_serial(weight):
    comm = _world()
    a = bipartite(90, 60, edges=1200, seed=21, weights="rating")
    ref = project_matrix(a, weight=weight)
    res = project(comm, a, weight=weight, threads=1)
    assert res.nnz == ref.nnz
    assert res.ranks["rows"] and sum(res.ranks["rows"]) == 60
    assert same_csr(_gather(comm, res), ref)
    tiny = project(comm, a, weight=weight, memory_per_rank="4K", threads=1)
    assert sum(tiny.ranks["chunks"]) > 2 * comm.size
    assert same_csr(_gather(comm, tiny), ref)


def test_upper_and_filters_match_serial():
    comm = _world()
    a = rmat(8, 8, seed=5)
    for opts in (
        {"triangle": "upper"},
        {"triangle": "upper", "self_loops": "keep", "weight": "jaccard"},
        {"top_k": 5, "weight": "newman"},
        {"min_weight": 3},
        {"onto": "rows", "weight": "overlap", "min_weight": 0.5},
    ):
        ref = project_matrix(a, **opts)
        res = project(comm, a, memory_per_rank="16K", threads=1, **opts)
        assert same_csr(_gather(comm, res), ref), opts


def test_rows_are_balanced_by_work():
    """The promise of the split: contiguous row blocks whose work (sum over the neighbours k of
    u of deg(k), computed here with scipy) is within one row's work of the mean."""
    comm = _world()
    a = sp.csr_matrix(rmat(9, 8, seed=6))
    res = project(comm, a, threads=1)
    pattern = a.copy()
    pattern.data[:] = 1
    row_work = pattern.T @ np.asarray(pattern.sum(axis=1)).ravel()  # per output row u
    starts = comm.allgather((res.row_start, res.row_stop))
    assert starts[0][0] == 0 and starts[-1][1] == a.shape[1]
    assert all(starts[i][1] == starts[i + 1][0] for i in range(len(starts) - 1))
    work = np.array([row_work[r0:r1].sum() for r0, r1 in starts])
    assert np.array_equal(work, np.asarray(res.ranks["work"], dtype=float))
    assert np.all(np.abs(work - row_work.sum() / comm.size) <= row_work.max())


def test_more_ranks_than_rows():
    comm = _world()
    a = sp.csr_matrix(np.array([[1.0, 1.0]]))
    res = project(comm, a, threads=1)
    h = _gather(comm, res)
    assert h.toarray().tolist() == [[0, 1], [1, 0]]


@pytest.mark.parametrize("ext", ["h5", "mtx", "tsv"])
def test_file_outputs_from_all_ranks(tmp_path, ext):
    comm = _world()
    d = comm.bcast(str(tmp_path), root=0)
    out = f"{d}/h.{ext}"
    a = bipartite(120, 80, edges=2000, seed=22, weights="uniform")
    ref = project_matrix(a, weight="product")
    for _ in range(2):  # a second run replaces the first one's output atomically
        res = project(comm, a, weight="product", output=out, memory_per_rank="8K", threads=1)
    assert sum(res.ranks["chunks"]) > comm.size
    comm.Barrier()
    back = read_projection(out)
    assert same_csr(back, ref)
    if ext == "h5" and comm.size > 1:
        import h5py

        with h5py.File(out) as f:  # plain h5py sees one matrix through the virtual datasets
            assert np.array_equal(f["indices"][()], ref.indices)
        import os

        parts = os.listdir(f"{d}/h.h5.parts")
        # the first run's parts were removed: one run's index and data part per rank remain
        assert len(parts) == 2 * comm.size
        assert len({p.split("-")[0] for p in parts}) == 1
    comm.Barrier()


def test_text_input_is_broadcast(tmp_path):
    comm = _world()
    d = comm.bcast(str(tmp_path), root=0)
    a = bipartite(50, 30, edges=400, seed=23, weights="rating")
    if comm.rank == 0:
        write_graph(f"{d}/g.mtx", a)
    comm.Barrier()
    g, fmt = load_graph(comm, f"{d}/g.mtx")
    assert fmt == "mtx" and g.weighted and (g.matrix != a).nnz == 0


def test_errors_are_agreed_on_every_rank(tmp_path):
    comm = _world()
    d = comm.bcast(str(tmp_path), root=0)
    if comm.rank == 0:
        with open(f"{d}/bad.tsv", "w") as fh:
            fh.write("0 1\n1 x\n")
    comm.Barrier()
    with pytest.raises(AgreedError, match=r"^[^(]*bad\.tsv:2: target id 'x' is not an integer"):
        load_graph(comm, f"{d}/bad.tsv", ids="index")
    a = bipartite(20, 10, edges=50, seed=24)
    with pytest.raises(AgreedError, match="not symmetric"):
        project(comm, a, weight="hive", triangle="upper")
