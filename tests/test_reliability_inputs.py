"""Inputs that must not hang or be misread (issue 31 items 7 and 9).

A FIFO named as a network layer file or as a ``project`` input used to block until killed;
every path the tool reads is now checked to be a regular file (or a directory) first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
fifo_ok = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")


def _cli(argv, timeout=60):
    """``python -m mpisdnn ARGV`` (a separate process: a hang fails here, not the suite)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        r = subprocess.run([sys.executable, "-m", "mpisdnn", *map(str, argv)],
                           capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpisdnn {' '.join(map(str, argv[:2]))} hung (> {timeout} s)")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, lines


@fifo_ok
@pytest.mark.parametrize("command", ["infer", "convert"])
def test_fifo_as_a_layer_file_is_refused(tmp_path, command):
    from mpisdnn.formats import write_inputs, write_triples
    from mpisdnn.generate import digit_images, radixnet

    net = tmp_path / "net"
    net.mkdir()
    for k, layer in enumerate(radixnet(1024, 2, seed=1).layers, start=1):
        write_triples(net / f"n1024-l{k}.tsv", layer)
    layer = net / "n1024-l2.tsv"
    layer.unlink()
    os.mkfifo(layer)
    if command == "infer":
        write_inputs(tmp_path / "in.h5", digit_images(20, 1024, seed=2))
        argv = ["infer", "--network", net, "--inputs", tmp_path / "in.h5", "--quiet"]
    else:
        argv = ["convert", "network", net, "-o", tmp_path / "n.h5"]
    code, err = _cli(argv)
    assert code == 2 and len(err) == 1, err
    assert "n1024-l2.tsv" in err[0] and "not a regular file" in err[0]


@fifo_ok
def test_fifo_as_a_project_input_is_refused(tmp_path):
    fifo = tmp_path / "g.tsv"
    os.mkfifo(fifo)
    code, err = _cli(["project", fifo, "-o", tmp_path / "h.h5"])
    assert code == 2 and len(err) == 1, err
    assert "g.tsv" in err[0] and "not a regular file" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.tsv"]


def _project(argv, capsys):
    from mpi4py import MPI

    from mpisdnn.cli import main

    code = main([str(a) for a in argv], MPI.COMM_SELF)
    _, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("ext", ["tsv", "h5", "mtx"])
def test_utf8_labels_round_trip_whatever_the_locale(tmp_path, capsys, monkeypatch, ext):
    """Was: a raw ``UnicodeDecodeError`` (numpy decodes ids as ASCII), at any locale."""
    import networkx as nx

    from mpisdnn.projection import read_projection

    monkeypatch.setenv("LC_ALL", "C")
    src = tmp_path / "g.tsv"
    edges = [("ä", "日本"), ("b", "ä"), ("ä", "ä"), ("b", "日本")]
    src.write_bytes("".join(f"{u}\t{v}\n" for u, v in edges).encode())
    out = tmp_path / f"h.{ext}"
    code, err = _project(["project", src, "-o", out, "--quiet"], capsys)
    assert code == 0, err
    got, (rows, cols) = read_projection(out, with_labels=True)
    assert list(cols) == sorted({v for _, v in edges}, key=lambda x: x.encode())
    # reference: H = A^T A over the targets, without self-loops (networkx)
    g = nx.Graph()
    for v in cols:
        g.add_node(v)
    for u in {u for u, _ in edges}:
        targets = sorted({v for x, v in edges if x == u})
        g.add_edges_from((a, b) for i, a in enumerate(targets) for b in targets[i + 1 :])
    want = {(a, b) for a, b in g.edges} | {(b, a) for a, b in g.edges}
    coo = got.tocoo()
    assert {(cols[i], cols[j]) for i, j in zip(coo.row, coo.col)} == want


def test_probable_header_line_is_reported(tmp_path, capsys):
    """Was: ``src<TAB>dst`` became an edge and every id a label, silently. Issue 40's
    grammar: a first record whose fields are not numbers where every other record's are is a
    header, skipped and named in the report; ``--no-header`` reads it as data."""
    import json

    from mpisdnn.projection import read_projection

    src, plain = tmp_path / "g.tsv", tmp_path / "plain.tsv"
    src.write_text("src\tdst\n1\t2\n2\t3\n1\t3\n")
    plain.write_text("1\t2\n2\t3\n1\t3\n")
    outs = {}
    for f in (src, plain):
        out, rep = tmp_path / f"{f.stem}.h5", tmp_path / f"{f.stem}.json"
        code, err = _project(["project", f, "-o", out, "--report", rep, "--quiet"], capsys)
        assert code == 0, err
        outs[f.stem] = read_projection(out)
    assert (outs["g"] != outs["plain"]).nnz == 0 and outs["g"].shape == outs["plain"].shape
    assert "src" in json.dumps(json.load(open(tmp_path / "g.json")))  # the header, named
    code, err = _project(["project", src, "-o", tmp_path / "d.h5", "--no-header", "--quiet"],
                         capsys)  # fmt: skip
    assert code == 0, err
    assert read_projection(tmp_path / "d.h5").shape != outs["plain"].shape  # 'src' is an id


def test_csv_quoted_fields_follow_rfc_4180(tmp_path, capsys):
    """Was: ``"x,1"`` split at its comma and blamed on the wrong line and reason."""
    from mpisdnn.projection import read_projection

    src = tmp_path / "g.csv"
    src.write_text('a,b\n"x,1",b\n"x,1",c\n"say ""hi""",c\n')
    out = tmp_path / "h.h5"
    code, err = _project(["project", src, "-o", out, "--quiet"], capsys)
    assert code == 0, err
    got, (rows, cols) = read_projection(out, with_labels=True)
    assert list(cols) == ["b", "c"] and got.nnz == 2  # b-c share the source "x,1"
    bad = tmp_path / "bad.csv"
    bad.write_text('a,b\n"x,1",b,1,9\n')
    code, err = _project(["project", bad, "-o", out], capsys)
    assert code == 2 and len(err) == 1 and "bad.csv:2: 4 fields" in err[0], err


def test_integer_mtx_with_a_fraction_names_the_value_as_written(tmp_path, capsys):
    """Was: ``value np.float64(1.5) in an integer file`` (a Python repr)."""
    src = tmp_path / "i.mtx"
    src.write_text("%%MatrixMarket matrix coordinate integer general\n3 3 2\n1 2 1.5\n2 3 2\n")
    code, err = _project(["project", src, "-o", tmp_path / "h.h5"], capsys)
    assert code == 2 and err == [f"mpisdnn: error: {src}:3: value 1.5 in an integer file"], err


@pytest.mark.parametrize(
    "line, words",
    [
        # was "row index 9223372036854775808" (clipped to int64) for both
        ("99999999999999999999999\t2\t1", "row index 99999999999999999999999 is beyond"),
        ("9223372036854775808\t2\t1", "row index 9223372036854775808 is beyond"),
        # was "column index 100000000000000000000" (rounded through float64)
        ("2\t99999999999999999999\t1", "column index 99999999999999999999 exceeds the size 64"),
        (
            "2\t-99999999999999999999\t1",
            "row and column must be positive 1-based integers, got 2 -99999999999999999999",
        ),
    ],
)
def test_overflowing_ids_are_quoted_as_written_with_file_and_line(tmp_path, capsys, line, words):
    src = tmp_path / "in.tsv"
    src.write_text(f"1\t1\t1\n{line}\n")
    code, err = _project(["convert", "inputs", src, "--neurons", "64", "-o",
                            tmp_path / "o.h5"], capsys)  # fmt: skip
    assert code == 2 and len(err) == 1, err
    assert f"{src}:2: {words}" in err[0], err


@pytest.mark.parametrize(
    "text",
    ["1\t1\t1\n\n2\t2\t1\n3\t3\t1\n2\t2\t1\n1\t1\t1\n",  # was "duplicate (row, column) entries"
     "1\t1\t1\n9223372036854775808\t2\t1\n",  # was "... rows would need 131072 PiB" and
     "1\t1\t1\n9007199254740993\t2\t1\n"],  # a RuntimeWarning of the int64 cast
)  # fmt: skip
def test_the_serial_inputs_reader_says_what_the_command_says(tmp_path, capsys, text):
    """``formats.read_images_tsv`` (the public serial reader) and ``convert inputs`` (the
    parallel reader) refuse a bad file with the same line, and nothing else is printed."""
    import warnings

    from mpisdnn.errors import InputError
    from mpisdnn.formats import read_images_tsv

    src = tmp_path / "in.tsv"
    src.write_text(text)
    code, err = _project(["convert", "inputs", src, "--neurons", "8", "-o", tmp_path / "o.h5"],
                         capsys)  # fmt: skip
    assert code == 2 and len(err) == 1, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError) as exc:
            read_images_tsv(src, 8)
    assert err[0] == f"mpisdnn: error: {exc.value}"


def test_nan_marking_a_per_layer_dataset_that_is_missing_says_so(tmp_path, capsys):
    """Was: NaN in /layer_info/bias or /value reported as only "dataset ... is missing"."""
    import h5py
    import numpy as np

    from mpisdnn.formats import write_inputs, write_network
    from mpisdnn.generate import digit_images, radixnet

    write_inputs(tmp_path / "in.h5", digit_images(10, 1024, seed=2))
    for key, what in (("bias", "biases"), ("value", "weights")):
        net = tmp_path / f"{key}.h5"
        write_network(net, radixnet(1024, 2, seed=1))
        with h5py.File(net, "r+") as f:
            f[f"layer_info/{key}"][0] = np.nan
        code, err = _project(["infer", "--network", net, "--inputs", tmp_path / "in.h5",
                                "--quiet"], capsys)  # fmt: skip
        assert code == 2 and len(err) == 1, err
        assert f"/layer_info/{key} of layer 1 is NaN" in err[0] and what in err[0], err


def test_unreadable_network_file_is_permission_denied(tmp_path, capsys, monkeypatch):
    """Was: a mode-000 network file was "not an HDF5 network file". Root reads any file, so
    the refusal is injected into ``os.open`` when the tests run as root."""
    from mpisdnn.formats import write_inputs, write_network
    from mpisdnn.generate import digit_images, radixnet

    net = tmp_path / "n.h5"
    write_network(net, radixnet(1024, 2, seed=1))
    write_inputs(tmp_path / "in.h5", digit_images(10, 1024, seed=2))
    net.chmod(0)
    if os.geteuid() == 0:
        real = os.open

        def refuse(path, *args, **kwargs):
            if os.fspath(path) == str(net):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    code, err = _project(["infer", "--network", net, "--inputs", tmp_path / "in.h5",
                            "--quiet"], capsys)  # fmt: skip
    assert code == 2 and err == [f"mpisdnn: error: {net}: permission denied (cannot read an "
                                 "HDF5 network file)"], err  # fmt: skip
