"""Counts stored as uint16 in HDF5 when no count can reach 65,536, and read back as int32.

Run serially and under ``mpiexec -n 2/3`` (the multi-rank writer is the direct-I/O one), so
both HDF5 writers store the narrow type; the values are checked against plain scipy, at the
boundary where a wrapped count would show (65,535 fits, 65,536 does not).
"""

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.generate.graphs import bipartite
from mpisdnn.projection import SerialComm, iter_projection, project, read_projection

from .conftest import same_csr, scipy_count, world


def _shared_dir(comm, tmp_path_factory):
    return comm.bcast(str(tmp_path_factory.mktemp("out")) if comm.rank == 0 else None, root=0)


def _hub_graph(hub_degree):
    """Columns 0 and 1 share ``hub_degree`` rows, plus a random bipartite part: the largest
    count is ``H[0, 1] = hub_degree`` (``H[0, 0]`` too with self-loops kept)."""
    rest = sp.csr_matrix(bipartite(300, 60, edges=3000, seed=7))
    m = hub_degree + rest.shape[0]
    rows = np.concatenate([np.arange(hub_degree), np.arange(hub_degree)])
    cols = np.concatenate([np.zeros(hub_degree, int), np.ones(hub_degree, int)])
    hub = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(hub_degree, 62))
    body = sp.hstack([sp.csr_matrix((rest.shape[0], 2)), rest]).tocsr()
    a = sp.vstack([hub, body]).tocsr()
    assert a.shape == (m, 62)
    return a


BOUNDARY = pytest.mark.parametrize(("hub_degree", "stored"), [(65535, "uint16"), (65536, "int32")])
STORAGE = pytest.mark.parametrize("storage", ["general", "symmetric"])
#: (dense_ratio, sweep_ratio, mark_ratio) that send every row down one kernel path
RATIOS = {
    "dense": (1e9, 1.0, 1.0),
    "marked": (1e-9, 1.0, 1e9),
    "listed-sweep": (1e-9, 1e9, 1e-9),
    "listed-order": (1e-9, 1e-9, 1e-9),
}
PATHS = pytest.mark.parametrize("path", ["dense", "marked", "listed-sweep", "listed-order"])


#: Serially (the chunked h5py writer), and at 2-3 ranks under ``-m mpi`` (the direct writer)
WHERE = pytest.mark.parametrize("where", ["serial", pytest.param("mpi", marks=pytest.mark.mpi)])


def _comm_and_dir(where, tmp_path_factory):
    if where == "serial":
        return SerialComm(), str(tmp_path_factory.mktemp("out"))
    comm = world()
    return comm, _shared_dir(comm, tmp_path_factory)


@WHERE
@BOUNDARY
@STORAGE
def test_counts_narrow_only_where_they_fit(tmp_path_factory, where, hub_degree, stored, storage):
    comm, d = _comm_and_dir(where, tmp_path_factory)
    a = _hub_graph(hub_degree)
    out = f"{d}/h.h5"
    res = project(comm, a, self_loops="keep", storage=storage, output=out,
                  memory_per_rank="1M", threads=1)  # fmt: skip
    assert res.value_dtype == stored
    comm.Barrier()
    want = scipy_count(a, keep=True)
    assert want[0, 1] == hub_degree and want.max() == hub_degree
    got = read_projection(out)
    assert same_csr(got, want) and got.dtype == np.int32
    blocks = [b for _, b in iter_projection(out, max_entries=500)]
    assert all(b.dtype == np.int32 for b in blocks)
    assert same_csr(sp.vstack(blocks, format="csr"), want)
    with h5py.File(out) as f:  # plain h5py sees the stored type
        assert f["data"].dtype == np.dtype(stored)
        assert int(f["data"][()].max()) == hub_degree
    comm.Barrier()


@WHERE
@PATHS
def test_every_kernel_path_stores_uint16_counts(tmp_path_factory, where, path):
    comm, d = _comm_and_dir(where, tmp_path_factory)
    a = sp.csr_matrix(bipartite(400, 300, edges=6000, seed=13))
    dense, sweep, mark = RATIOS[path]
    for opts in ({}, {"triangle": "upper"}, {"min_weight": 2}, {"top_k": 4}):
        out = f"{d}/h-{len(opts)}-{next(iter(opts), 'x')}.h5"
        res = project(comm, a, output=out, dense_ratio=dense, sweep_ratio=sweep,
                      mark_ratio=mark, memory_per_rank="32K", threads=2, **opts)  # fmt: skip
        assert res.value_dtype == "uint16"
        comm.Barrier()
        ref = project(SerialComm(), a, **opts).matrix  # int32 in memory, default paths
        assert ref.dtype == np.int32
        got = read_projection(out)
        assert same_csr(got, ref)
    want = scipy_count(a)
    assert same_csr(read_projection(f"{d}/h-0-x.h5"), want)
    comm.Barrier()


def test_memory_and_text_keep_int32(tmp_path):
    a = sp.csr_matrix(bipartite(100, 50, edges=800, seed=3))
    assert project(SerialComm(), a).value_dtype == "int32"
    res = project(SerialComm(), a, output=str(tmp_path / "h.tsv"))
    assert res.value_dtype == "int32"
    assert project(SerialComm(), a, output=None).value_dtype == "int32"


def test_parquet_keeps_int32(tmp_path):
    pytest.importorskip("pyarrow")
    a = sp.csr_matrix(bipartite(100, 50, edges=800, seed=3))
    res = project(SerialComm(), a, output=str(tmp_path / "h.parquet"))
    assert res.value_dtype == "int32"
