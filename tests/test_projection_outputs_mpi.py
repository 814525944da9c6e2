"""Parquet and compressed HDF5 projection outputs round-trip at any world size (pytest-mpi).

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests``; the references are
plain scipy products.
"""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.generate.graphs import bipartite
from mpisdnn.projection import Graph, project, read_projection

from .conftest import scipy_count

pytestmark = pytest.mark.mpi


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _shared_dir(comm, tmp_path_factory):
    return comm.bcast(str(tmp_path_factory.mktemp("out")) if comm.rank == 0 else None, root=0)


def _scipy_product(a):
    h = (a.T @ a).tocsr()
    h.setdiag(0)
    h.eliminate_zeros()
    h.sort_indices()
    return h


def _same(x, y):
    return x.shape == y.shape and (x != y).nnz == 0 and x.nnz == y.nnz


@pytest.mark.parametrize("compress", ["zstd", "blosc2", "gzip"])
def test_compressed_h5_round_trips(tmp_path_factory, compress):
    pytest.importorskip("hdf5plugin")
    comm = _world()
    d = _shared_dir(comm, tmp_path_factory)
    a = bipartite(150, 90, edges=2500, seed=31, weights="uniform")
    out = f"{d}/h.h5"
    res = project(comm, a, weight="product", output=out, compress=compress,
                  memory_per_rank="16K", threads=1)  # fmt: skip
    assert sum(res.ranks["chunks"]) > comm.size
    comm.Barrier()
    want = _scipy_product(sp.csr_matrix(a))
    got = read_projection(out)
    assert got.shape == want.shape and got.nnz == want.nnz
    assert np.allclose((got - want).data, 0, atol=1e-12)
    import h5py
    import hdf5plugin  # noqa: F401 - plain h5py reads it once the filters are registered

    with h5py.File(out) as f:
        assert f.attrs["compression"] == compress
        assert np.array_equal(f["indptr"][()], got.indptr)


def test_parquet_dataset_round_trips_with_labels(tmp_path_factory):
    pq = pytest.importorskip("pyarrow.parquet")
    comm = _world()
    d = _shared_dir(comm, tmp_path_factory)
    a = sp.csr_matrix(bipartite(120, 70, edges=1500, seed=32))
    labels = np.array([f"item-{i:03d}" for i in range(70)])
    g = Graph(a, False, "", None, labels)
    out = f"{d}/h.parquet"
    for _ in range(2):  # the second run replaces the first dataset as a whole
        project(comm, g, output=out, memory_per_rank="8K", threads=1)
    comm.Barrier()
    want = _scipy_product(a)
    got, got_labels = read_projection(out, with_labels=True)
    assert _same(got, want)
    assert list(got_labels[0]) == list(labels)
    parts = sorted(x for x in os.listdir(out) if not x.startswith(("_", ".")))
    assert parts == [f"part-r{r:05d}.parquet" for r in range(comm.size)]
    table = pq.read_table(out)  # a plain reader sees one table with the label columns
    assert table.num_rows == want.nnz
    u = table["u"].to_numpy()
    assert list(table["u_label"].to_pylist()) == [labels[i] for i in u]
    if comm.rank == 0:
        assert not [x for x in os.listdir(d) if x.startswith(".")]  # no temporary left


@pytest.mark.parametrize("ext", ["h5", "mtx"])
@pytest.mark.parametrize("self_loops", ["drop", "keep"])
def test_symmetric_storage_reads_back_full(tmp_path_factory, ext, self_loops):
    comm = _world()
    d = _shared_dir(comm, tmp_path_factory)
    a = sp.csr_matrix(bipartite(140, 90, edges=2200, seed=41, weights="uniform"))
    out = f"{d}/h.{ext}"
    res = project(comm, a, self_loops=self_loops, storage="symmetric", output=out,
                  memory_per_rank="16K", threads=1)  # fmt: skip
    assert sum(res.ranks["chunks"]) > comm.size
    comm.Barrier()
    want = scipy_count(a, self_loops == "keep")
    assert res.nnz == want.nnz  # the matrix's entries, not the stored ones
    assert res.extra["stored_nnz"] == sp.triu(want).nnz
    got = read_projection(out)
    assert _same(got, want) and got.has_sorted_indices
    assert np.issubdtype(got.dtype, np.integer)
    if ext == "h5":
        import h5py

        from mpisdnn.projection import iter_projection

        with h5py.File(out) as f:  # plain h5py: the stored triangle, marked as such
            assert f.attrs["storage"] == "symmetric"
            assert f.attrs["nnz"] == sp.triu(want).nnz
        assert _same(read_projection(out, mirror=False), sp.triu(want).tocsr())
        for max_entries in (1, 50, 1 << 20):
            blocks = list(iter_projection(out, max_entries))
            starts = np.cumsum([0] + [b.shape[0] for _, b in blocks])[:-1]
            assert [s for s, _ in blocks] == list(starts)
            assert _same(sp.vstack([b for _, b in blocks], format="csr"), want)
        comm.Barrier()  # every rank's reading done: its spill files are gone
        assert not [x for x in os.listdir(d) if x.startswith(".mirror-")]
    else:
        with open(out) as fh:
            assert fh.readline().split()[-1] == "symmetric"
    comm.Barrier()


def test_symmetric_storage_float_weights_labels_and_compression(tmp_path_factory):
    comm = _world()
    d = _shared_dir(comm, tmp_path_factory)
    a = sp.csr_matrix(bipartite(120, 70, edges=1800, seed=43, weights="uniform"))
    labels = np.array([f"item{i:03d}" for i in range(70)])
    g = Graph(a, weighted=True, col_labels=labels)
    want = project(comm, g, weight="jaccard", min_weight=0.05, output="memory", threads=1)
    blocks = comm.allgather((want.row_start, want.matrix))
    want = sp.vstack([m for _, m in sorted(blocks, key=lambda x: x[0])], format="csr")
    compress = "gzip"
    out = f"{d}/j.h5"
    project(comm, g, weight="jaccard", min_weight=0.05, storage="symmetric", output=out,
            compress=compress, memory_per_rank="16K", threads=1)  # fmt: skip
    comm.Barrier()
    got, got_labels = read_projection(out, with_labels=True)
    assert _same(got, want)
    assert np.array_equal(got.data, want.data)  # bit for bit: the same kernel, mirrored
    assert list(got_labels[0]) == list(labels)
    comm.Barrier()


def _graph_with_empty_shares(kind):
    """A 12 x 8 incidence whose projection is empty ("empty": every row holds one column), or
    holds only columns 0 and 1 ("first": the later ranks' shares of the rows are empty)."""
    rows = np.arange(12)
    cols = rows % 8
    if kind == "first":
        rows, cols = np.r_[rows, 0], np.r_[cols, 1]  # row 0 joins columns 0 and 1
    return sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(12, 8))


@pytest.mark.parametrize("kind", ["empty", "first"])
@pytest.mark.parametrize(
    "ext,compress", [("h5", None), ("h5", "gzip"), ("tsv", None), ("mtx", None), ("parquet", None)]
)
def test_empty_shares_write_valid_outputs(tmp_path_factory, kind, ext, compress):
    """Issue 31 item 4: a rank whose share of the output is empty writes a valid empty part
    (was at 2+ ranks into ``.h5``: "short write (800 of 1048576 bytes)", exit 2)."""
    if ext == "parquet":
        pytest.importorskip("pyarrow")
    comm = _world()
    d = _shared_dir(comm, tmp_path_factory)
    a = _graph_with_empty_shares(kind)
    out = f"{d}/h.{ext}"
    project(comm, a, output=out, compress=compress, threads=1)
    comm.Barrier()
    want = _scipy_product(a)
    got = read_projection(out)
    assert got.shape == want.shape and got.nnz == want.nnz == (0 if kind == "empty" else 2)
    assert (got != want).nnz == 0
