"""MPI runs (pytest-mpi): any world size must give the 1-rank result.

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests``.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.partition import balanced_blocks
from mpisdnn.sdnn.load import load_problem

from .conftest import random_inputs, random_network, run_infer, self_comm, world
from .matlab_ref import categories, scipy_inference

pytestmark = pytest.mark.mpi


def _run_split(net, y0, backend, comm):
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    res = run_infer(net, y0[r0:r1], comm, row_offset=r0, g_rows=y0.shape[0], backend=backend)
    blocks = comm.allgather(res.y_local)
    return res, sp.vstack(blocks, format="csr")


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_ranks_match_serial(backend):
    comm = world()
    net = random_network(128, 8, seed=11, density=0.05)
    y0 = random_inputs(97, 128, seed=12, density=0.12)
    expected = scipy_inference(y0, net.layers, net.bias)
    res, y = _run_split(net, y0, backend, comm)
    assert res.categories.tolist() == categories(expected).tolist()
    np.testing.assert_allclose(y.toarray(), expected.toarray(), rtol=1e-5, atol=1e-5)
    serial = run_infer(net, y0, self_comm(), backend=backend)
    # Row results never depend on the split: bit-identical to one rank.
    assert (serial.y_local != y).nnz == 0
    assert res.layer_nnz == serial.layer_nnz


def test_more_ranks_than_rows():
    comm = world()
    net = random_network(64, 4, seed=3, negative=False)
    y0 = random_inputs(max(1, comm.size - 1), 64, seed=4, density=0.3)
    res, y = _run_split(net, y0, "cpu", comm)
    expected = scipy_inference(y0, net.layers, net.bias)
    assert res.categories.tolist() == categories(expected).tolist()
    assert y.shape == y0.shape


def test_all_rows_die_everywhere():
    comm = world()
    net = random_network(64, 3, seed=3)
    net.bias[:] = -50
    res, y = _run_split(net, random_inputs(31, 64, seed=4), "cpu", comm)
    assert res.categories.size == 0 and y.nnz == 0


def test_load_problem_from_hdf5_and_tsv(tmp_path_factory):
    from mpisdnn.formats import write_inputs, write_network, write_triples
    from mpisdnn.generate import digit_images, radixnet

    comm = world()
    if comm.rank == 0:
        d = tmp_path_factory.mktemp("load")
        net = radixnet(1024, 7, seed=5)
        y0 = digit_images(300, 1024, seed=6)
        write_network(d / "net.h5", net)
        write_inputs(d / "in.h5", y0, truth=[1, 2])
        write_triples(d / "in.tsv", y0)
        for k, w in enumerate(net.layers):
            write_triples(d / "neuron1024" / f"n1024-l{k + 1}.tsv", w)
    else:
        d = None
    d = comm.bcast(d)
    results = []
    for network, inputs in (("net.h5", "in.h5"), ("neuron1024", "in.tsv")):
        pb = load_problem(comm, d / network, d / inputs, layers=6)
        assert len(pb.network) == 6 and pb.g_rows == 300
        assert comm.allreduce(pb.y_local.shape[0]) == 300
        res = run_infer(pb.network, pb.y_local, comm, row_offset=pb.row_offset, g_rows=pb.g_rows)
        results.append(res.categories.tolist())
    assert results[0] == results[1]
