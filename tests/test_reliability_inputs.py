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
