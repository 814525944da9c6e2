"""A memory-mapped v2 network gives the same final Y as the in-memory network, at any world
size (every rank maps the same file)."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.formats import write_network
from mpisdnn.formats.weight_store import HDF5WeightStore, open_weight_store
from mpisdnn.generate import digit_images, radixnet
from mpisdnn.partition import balanced_blocks

from .conftest import random_network, run_infer, world

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("kind", ["radix", "random"])
def test_mapped_store_bit_identical_final_y(tmp_path_factory, backend, kind):
    comm = world()
    if kind == "radix":
        net, y0 = radixnet(1024, 12, seed=3), digit_images(64, 1024, seed=4)
    else:
        net = random_network(256, 6, seed=5, density=0.08)
        y0 = sp.random(40, 256, density=0.2, random_state=6, format="csr", dtype=np.float32)
    d = comm.bcast(tmp_path_factory.mktemp("store") if comm.rank == 0 else None)
    if comm.rank == 0:
        write_network(d / "n.h5", net)
    comm.Barrier()
    store = open_weight_store(d / "n.h5")
    assert isinstance(store, HDF5WeightStore) and store.edges == net.edges
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    got = run_infer(store, y0[r0:r1], comm, backend=backend, row_offset=r0, g_rows=y0.shape[0])
    y = sp.vstack(comm.allgather(got.y_local), format="csr")
    ref = run_infer(net, y0, backend=backend, g_rows=y0.shape[0])
    assert got.categories.tolist() == ref.categories.tolist()
    diff = y != ref.y_local
    assert diff.nnz == 0
    comm.Barrier()
