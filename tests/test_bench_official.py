"""``scripts/bench_official.py`` is a thin wrapper over ``mpisdnn challenge`` (the command's
own tests are tests/test_challenge.py): its flags reach the command, and its outside
measurements come back."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "bench_official", ROOT / "scripts" / "bench_official.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_official"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()


def test_flags_reach_the_challenge_command(tmp_path):
    a = bench.parse_args([
        "--official", str(tmp_path), "--neurons", "1024", "4096", "--layers", "120",
        "--inputs", "500", "--ranks", "3", "--full-check-edges", "0", "--rerun",
        "--out", str(tmp_path / "o"), "--challenge-arg=--threads=1",
    ])  # fmt: skip
    cmd = bench.challenge_command(a, tmp_path)
    from mpisdnn.system import mpiexec_path

    # the venv's mpiexec (beside this Python), whatever is first on PATH
    assert cmd[:3] == [mpiexec_path(), "-n", "3"] and cmd[4:7] == ["-m", "mpisdnn", "challenge"]
    assert os.path.basename(cmd[0]) == "mpiexec"
    text = " ".join(cmd)
    assert "--neurons 1024 4096 --layers 120" in text and "--count 500" in text
    assert "--full-check-edges 0.0" in text and cmd[-2:] == ["--rerun", "--threads=1"]
    # the command parses them as the challenge options meant
    from mpisdnn.cli import build_parser
    from mpisdnn.commands.challenge import options_from_args

    args = build_parser(cmd[6:]).parse_args(cmd[6:])
    opts = options_from_args(args, None)
    assert opts.neurons == (1024, 4096) and opts.layers == (120,) and opts.inputs == 500
    assert opts.full_check_edges == 0.0 and opts.rerun and opts.infer.threads == 1


def test_the_job_is_watched_from_outside(tmp_path):
    """A real (tiny, one-rank) sitting: the exit code, wall, CPU seconds and PSS peak of the
    whole job are recorded beside the command's table."""
    out = tmp_path / "out"
    code = bench.main(["--neurons", "1024", "--layers", "2", "--inputs", "100", "--ranks", "1",
                       "--cache", str(tmp_path / "cache"), "--out", str(out)])  # fmt: skip
    assert code == 0
    rec = json.loads((out / "bench.json").read_text())
    assert rec["exit_code"] == 0 and rec["wall_seconds"] > 0 and rec["cpu_seconds"] > 0
    assert rec["pss_peak_bytes"] > 50 * 2**20  # an interpreter with numpy, scipy and numba
    assert "**PASS**" in (out / "challenge.md").read_text()
