"""Symmetric storage (serial): the mirroring helpers against scipy, and the option checks."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import UsageError
from mpisdnn.formats.projection.symmetric import iter_mirrored, mirror_csr
from mpisdnn.projection import ProjectionOptions

from .conftest import same_csr


def _symmetric(n, density, seed, empty_rows=()):
    r = sp.random(n, n, density=density, format="csr", random_state=seed, dtype=np.float64)
    h = (r + r.T).tocsr()
    keep = np.ones(n, bool)
    keep[list(empty_rows)] = False
    d = sp.diags(keep.astype(float))
    h = (d @ h @ d).tocsr()
    h.eliminate_zeros()
    h.sort_indices()
    return h


def _parts(m):
    u = sp.triu(m).tocsr()
    u.sort_indices()
    return u.indptr.astype(np.int64), u.indices, u.data


@pytest.mark.parametrize("empty_rows", [(), (0, 5, 39)])
def test_mirror_csr_equals_scipy(empty_rows):
    h = _symmetric(40, 0.1, 3, empty_rows)
    ptr, idx, val = mirror_csr(*_parts(h), h.shape)
    assert same_csr(sp.csr_matrix((val, idx, ptr), shape=h.shape), h)


def test_mirror_csr_of_nothing():
    ptr, idx, val = mirror_csr(np.zeros(4, np.int64), np.empty(0, np.int32), np.empty(0), (3, 3))
    assert list(ptr) == [0, 0, 0, 0] and idx.size == 0 and val.size == 0


@pytest.mark.parametrize("max_entries", [1, 17, 100, 10**6])
def test_iter_mirrored_blocks_are_whole_full_rows(tmp_path, max_entries):
    h = _symmetric(60, 0.08, 5, empty_rows=(0, 59))
    ptr, idx, val = _parts(h)
    blocks = list(iter_mirrored(ptr, idx, val, 60, max_entries, tmp_path))
    starts = [a for a, *_ in blocks]
    assert starts[0] == 0 and starts == sorted(set(starts))
    mats = [sp.csr_matrix((v, i, p), shape=(p.size - 1, 60)) for _, p, i, v in blocks]
    assert same_csr(sp.vstack(mats, format="csr"), h)
    big = [m.nnz for m in mats if m.shape[0] > 1]
    assert all(nnz <= max_entries for nnz in big)  # only a single row may exceed the block
    assert os.listdir(tmp_path) == []


def test_iter_mirrored_removes_spill_files_when_stopped_early(tmp_path):
    h = _symmetric(50, 0.1, 7)
    it = iter_mirrored(*_parts(h), 50, 20, tmp_path)
    next(it)
    assert len(os.listdir(tmp_path)) == 1
    it.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(weight="hive"), "not symmetric"),
        (dict(triangle="upper"), "drop --triangle upper"),
        (dict(top_k=3), "--top-k"),
        (dict(output="memory"), "not memory"),
        (dict(output="h.tsv"), "not tsv"),
        (dict(output="h.parquet"), "not parquet"),
        (dict(storage="lower"), "'general' or 'symmetric'"),
    ],
)
def test_symmetric_storage_refuses_what_it_cannot_store(kwargs, message):
    opts = dict(storage="symmetric", output="h.h5")
    opts.update(kwargs)
    with pytest.raises(UsageError, match=message):
        ProjectionOptions(**opts)


def test_symmetric_storage_accepts_h5_mtx_and_no_output():
    for out in ("h.h5", "h.mtx", None):
        assert ProjectionOptions(storage="symmetric", output=out).storage == "symmetric"


def test_symmetric_file_whose_header_lies_is_one_clear_error(tmp_path):
    import h5py

    from mpisdnn.errors import InputError
    from mpisdnn.generate.graphs import bipartite
    from mpisdnn.projection import iter_projection, project, read_projection
    from mpisdnn.projection.core import SerialComm

    out = tmp_path / "h.h5"
    project(SerialComm(), bipartite(50, 30, edges=300, seed=3), storage="symmetric", output=out)
    assert read_projection(out).nnz > 0
    with h5py.File(out, "a") as f:
        f.attrs["rows"] = f.attrs["cols"] = 10**12  # no 8 TB allocation: checked first
    with pytest.raises(InputError, match="symmetric storage of a"):
        read_projection(out)
    with pytest.raises(InputError, match="symmetric storage of a"):
        next(iter_projection(out))
