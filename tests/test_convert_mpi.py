"""Parallel ``convert`` (any world size) writes exactly what a serial conversion writes.

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests/test_convert_mpi.py``;
serially the same tests check a one-rank conversion against the scipy reference.
"""

import numpy as np
import pytest

from mpisdnn.cli import main
from mpisdnn.formats import read_inputs, read_network, write_triples

from .conftest import random_inputs, random_network, self_comm, world

pytestmark = pytest.mark.mpi


def _shared_dir(comm, factory, name):
    return comm.bcast(factory.mktemp(name) if comm.rank == 0 else None)


def test_parallel_network_conversion_equals_serial(tmp_path_factory):
    from mpisdnn.generate import radixnet

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "convnet")
    # random layers (colptr + values) and official-style ones; 7 layers: uneven rank shares
    rnd = random_network(64, 3, seed=comm.size, density=0.1)
    rad = radixnet(1024, 4, seed=2)
    if comm.rank == 0:
        for k, w in enumerate(rnd.layers):
            write_triples(d / "rnd" / f"n64-l{k + 1}.tsv", w)
        for k, w in enumerate(rad.layers):
            write_triples(d / "rad" / f"n1024-l{k + 1}.tsv", w)
    comm.Barrier()
    for sub, ref, bias in (("rnd", rnd, "-0.2"), ("rad", rad, None)):
        extra = ["--bias", bias] if bias else []
        code = main(
            ["convert", "network", str(d / sub), "-o", str(d / f"{sub}-p.h5"), *extra], comm
        )
        assert code == 0
        if comm.rank == 0:
            serial = ["convert", "network", str(d / sub), "-o", str(d / f"{sub}-s.h5"), *extra]
            assert main(serial, self_comm()) == 0
            assert (d / f"{sub}-p.h5").read_bytes() == (d / f"{sub}-s.h5").read_bytes()
            net = read_network(d / f"{sub}-p.h5")
            assert len(net) == len(ref.layers)
            for a, b in zip(net.layers, ref.layers):
                assert abs(a - b).max() <= 1e-6 * abs(b).max()
            want = float(bias) if bias else -0.3
            assert np.all(net.bias == np.float32(want))
        comm.Barrier()


def test_parallel_inputs_conversion_equals_serial(tmp_path_factory):
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "convin")
    y = random_inputs(97, 64, seed=3, density=0.2)
    if comm.rank == 0:
        write_triples(d / "in.tsv", y)
        (d / "truth.tsv").write_text("3\n17\n")
    comm.Barrier()
    args = [
        "convert",
        "inputs",
        str(d / "in.tsv"),
        "--neurons",
        "64",
        "--truth",
        str(d / "truth.tsv"),
    ]
    assert main([*args, "-o", str(d / "p.h5")], comm) == 0
    if comm.rank == 0:
        assert main([*args, "-o", str(d / "s.h5")], self_comm()) == 0
        assert (d / "p.h5").read_bytes() == (d / "s.h5").read_bytes()
        got, truth = read_inputs(d / "p.h5")
        assert got.shape == y.shape and abs(got - y).max() <= 1e-6
        assert truth.tolist() == [3, 17]
    comm.Barrier()


def test_parallel_conversion_bad_line_is_named(tmp_path_factory, capsys):
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "convbad")
    if comm.rank == 0:
        lines = [f"{r}\t{c}\t1" for r in range(1, 40) for c in (1, 2)]
        lines[70] = "5\tx\t1"  # line 71, in the last rank's byte range at 2 or 3 ranks
        (d / "in.tsv").write_text("\n".join(lines) + "\n")
        (d / "old.h5").write_bytes(b"previous")
    comm.Barrier()
    code = main(
        ["convert", "inputs", str(d / "in.tsv"), "--neurons", "4", "-o", str(d / "old.h5")], comm
    )
    assert code == 2
    if comm.rank == 0:
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "in.tsv:71:" in err[0]
        assert (d / "old.h5").read_bytes() == b"previous"
        assert sorted(p.name for p in d.iterdir()) == ["in.tsv", "old.h5"]
    comm.Barrier()
