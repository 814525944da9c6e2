"""``infer --categories-out`` and ``--output-y``: what a run hands back, checked against an
independent scipy reference; unwritable outputs fail before any work."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.formats import read_categories, read_inputs, write_inputs, write_network
from mpisdnn.generate import digit_images, radixnet
from mpisdnn.sdnn.results import write_final_y

from .conftest import run_cli, world
from .matlab_ref import categories, scipy_inference


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    d = tmp_path_factory.mktemp("outputs")
    net = radixnet(1024, 6, seed=7)
    y0 = digit_images(150, 1024, seed=8)
    final = scipy_inference(y0, net.layers, net.bias)
    write_network(d / "net1.h5", net, version=1)  # chunked, gzip: streamed by a reader
    write_network(d / "net2.h5", net, version=2)  # compact: memory-mapped
    write_inputs(d / "in.h5", y0, truth=categories(final))
    return d, final


@pytest.mark.parametrize(("ranks", "version"), [(1, 1), (2, 1), (2, 2)])
def test_outputs_streamed_and_batched_match_reference(problem, ranks, version):
    d, final = problem
    out = d / f"r{ranks}v{version}"
    out.mkdir()
    r = run_cli(
        [
            "infer",
            "--network", d / f"net{version}.h5",
            "--inputs", d / "in.h5",
            "--weight-memory", "1M",
            "--memory-per-rank", "400K",
            "--categories-out", out / "cats.tsv",
            "--output-y", out / "y.h5",
            "--report", out / "r.json",
            "--quiet",
        ],
        ranks=ranks,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "PASS" in r.stdout and "streamed in" in r.stdout
    cats = read_categories(out / "cats.tsv")
    assert cats.tolist() == categories(final).tolist() and cats.size > 0
    y, _ = read_inputs(out / "y.h5")
    assert y.shape == final.shape
    np.testing.assert_allclose(y.toarray(), final.toarray(), rtol=1e-5, atol=1e-5)
    rep = json.loads((out / "r.json").read_text())
    assert len(rep["memory"]["blocks"]) == 6
    assert max(rep["memory"]["rank_max_batches"]) > 1
    streams = rep["memory"]["rank_streaming"]
    if version == 1:  # read in blocks by the background reader
        assert all(s and s["blocks_read"] == 6 for s in streams)
    else:  # mapped: nothing to read, still prepared block by block
        assert streams == [None] * ranks
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize("flag", ["--categories-out", "--output-y", "--report"])
def test_unwritable_output_fails_before_loading(problem, tmp_path, flag):
    d, _ = problem
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    # The network does not exist either: the output check must come first.
    r = run_cli(
        ["infer", "--network", tmp_path / "missing.h5", "--inputs", d / "in.h5",
         flag, blocker / "out"],
        ranks=1,
    )  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpisdnn: error:")
    assert flag in lines[0] and str(blocker) in lines[0] and "Traceback" not in r.stderr


@pytest.mark.mpi
def test_write_final_y_blocks_in_rank_order(tmp_path_factory):
    comm = world()
    rng = np.random.default_rng(3)
    rows = 5 * comm.size + 2
    y = sp.random(rows, 40, density=0.2, random_state=rng, format="csr", dtype=np.float32)
    bounds = np.linspace(0, rows, comm.size + 1).astype(int)
    r0, r1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    path = comm.bcast(tmp_path_factory.mktemp("y") / "y.h5" if comm.rank == 0 else None)
    write_final_y(comm, path, y[r0:r1], r0, rows, layers=3)
    got, _ = read_inputs(path)
    assert (got != y).nnz == 0 and got.shape == y.shape
    part, _ = read_inputs(path, r0, r1)
    assert (part != y[r0:r1]).nnz == 0
