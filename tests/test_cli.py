"""The CLI end to end under real ``mpiexec``: agreement across rank counts and bad inputs."""

import json

import numpy as np
import pytest

from mpisdnn.formats import read_categories, write_inputs, write_network
from mpisdnn.generate import digit_images, radixnet
from mpisdnn.sdnn.reference import reference_inference

from .conftest import run_cli, run_cli_batch
from .matlab_ref import categories, scipy_inference


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    r = run_cli(["generate", "network", "--layers", "14", "--seed", "3", "-o", d / "net.h5"])
    assert r.returncode == 0, r.stderr
    r = run_cli(
        [
            "generate",
            "inputs",
            "--count",
            "600",
            "--seed",
            "4",
            "--network",
            d / "net.h5",
            "-o",
            d / "in.h5",
            "--tsv",
            d / "in.tsv",
            "--truth-tsv",
            d / "truth.tsv",
        ],
        ranks=2,
    )
    assert r.returncode == 0, r.stderr
    return d


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_infer_pass_at_any_rank_count(small_data, ranks):
    rep = small_data / f"r{ranks}.json"
    r = run_cli(
        [
            "infer",
            "--network",
            small_data / "net.h5",
            "--inputs",
            small_data / "in.h5",
            "--report",
            rep,
        ],
        ranks=ranks,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and r.stdout.count("mpisdnn infer:") == 1
    report = json.loads(rep.read_text())
    assert report["schema"].startswith("mpisdnn.report/")
    assert report["run"]["ranks"] == ranks and len(report["ranks"]["seconds"]) == ranks
    assert report["check"]["status"] == "PASS"
    assert report["phases"]["rate_edges_per_second"] > 0
    assert len(report["layers"]["nnz"]) == 14
    # every MPI call of the command is in a phase it entered (parallel.phase), none guessed
    assert "other" not in report["communication"]["phases"], report["communication"]["phases"]


def test_checkpointed_run_counts_every_call_in_a_phase(small_data, tmp_path):
    rep = tmp_path / "r.json"
    r = run_cli(["infer", "--network", small_data / "net.h5", "--inputs", small_data / "in.h5",
                 "--checkpoint", tmp_path / "ck", "--report", rep, "--quiet"], ranks=2)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    phases = json.loads(rep.read_text())["communication"]["phases"]
    assert "other" not in phases and phases["checkpoint"]["calls"] > 0, phases


def test_truth_matches_independent_reference(small_data):
    from mpisdnn.formats import read_inputs, read_network

    net = read_network(small_data / "net.h5")
    y0, stored = read_inputs(small_data / "in.h5")
    expected = categories(scipy_inference(y0, net.layers, net.bias))
    assert stored.tolist() == expected.tolist()
    assert read_categories(small_data / "truth.tsv").tolist() == expected.tolist()
    assert 0 < expected.size < 600  # a meaningful check: some rows die, some survive


def test_tsv_inputs_and_truth_file(small_data):
    r = run_cli(
        [
            "infer",
            "--network",
            small_data / "net.h5",
            "--inputs",
            small_data / "in.tsv",
            "--truth",
            small_data / "truth.tsv",
            "--backend",
            "reference",
        ],
        ranks=2,
    )
    assert r.returncode == 0 and "PASS" in r.stdout, r.stderr


def test_fail_against_wrong_truth_exits_1(small_data, tmp_path):
    truth = read_categories(small_data / "truth.tsv")
    (tmp_path / "wrong.tsv").write_text("\n".join(map(str, truth[1:].tolist() + [599])) + "\n")
    r = run_cli(
        [
            "infer",
            "--network",
            small_data / "net.h5",
            "--inputs",
            small_data / "in.h5",
            "--truth",
            tmp_path / "wrong.tsv",
        ],
        ranks=2,
    )
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "missing 1" in r.stdout


def test_official_network_with_generated_inputs(official_dir, tmp_path):
    """The Done criterion: official N=1024 network, generated inputs, 1/2/3 ranks agree with
    an independent reference's categories."""
    from mpisdnn.formats import read_network_tsv

    y0 = digit_images(1500, 1024, seed=21)
    net = read_network_tsv(official_dir, layers=120)
    expected = categories(scipy_inference(y0, net.layers, net.bias))
    write_inputs(tmp_path / "in.h5", y0, truth=expected)
    for ranks in (1, 2, 3):
        r = run_cli(
            [
                "infer",
                "--network",
                official_dir,
                "--inputs",
                tmp_path / "in.h5",
                "--layers",
                "120",
                "--report",
                tmp_path / f"{ranks}.json",
            ],
            ranks=ranks,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / f"{ranks}.json").read_text())["check"]["status"] == "PASS"


# --- bad input: one clear line from rank 0, exit code 2, no hang ------------------------------


def _error_lines(r):
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


def _bad(args, ranks=3):
    r = run_cli(args, ranks=ranks, timeout=60)
    return r, _error_lines(r)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, small_data):
    d = tmp_path_factory.mktemp("bad")
    (d / "garbage.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    raw = (small_data / "net.h5").read_bytes()
    (d / "trunc.h5").write_bytes(raw[: len(raw) // 3])
    (d / "bad.tsv").write_text("1\t1\t1\n2\tfoo\t1\n")
    (d / "empty.tsv").write_bytes(b"")
    (d / "neuron1024").mkdir()
    net = radixnet(1024, 2)
    from mpisdnn.formats import write_triples

    write_triples(d / "neuron1024" / "n1024-l1.tsv", net.layers[0])
    write_network(d / "net64.h5", radixnet(64, 2))
    write_inputs(d / "nan.h5", digit_images(5, 1024) * np.float32(np.nan))
    return d


_BAD_INPUTS = [
    ("missing_network", "not found"),
    ("truncated_network", "trunc.h5"),
    ("garbage_network", "garbage.h5"),
    ("inputs_as_network", "not an mpisdnn.network"),
    ("malformed_tsv_inputs", "bad.tsv:2: non-numeric"),
    ("empty_tsv_inputs", "empty.tsv: no entries"),
    ("missing_layer", "n1024-l2.tsv: missing layer file"),
    ("shape_mismatch", "64 neurons"),
    ("nan_inputs", "NaN"),
    ("too_many_layers", "asked for 99 layers"),
]

_BAD_FLAGS = [
    ["infer", "--network", "x"],
    ["infer", "--network", "x", "--inputs", "y", "--backend", "tpu"],
    ["infer", "--network", "x", "--inputs", "y", "--layers", "0"],
    ["frobnicate"],
]


@pytest.fixture(scope="module")
def bad_runs(small_data, bad_files):
    """Every bad-input and bad-flag command line below, at 3 ranks, in one MPI job
    (:func:`run_cli_batch`): each is still a whole ``mpisdnn`` run on three ranks, and the
    ranks start once instead of 14 times. Keyed by case name or by the joined flags."""
    net, inp = small_data / "net.h5", small_data / "in.h5"
    inputs = {
        "missing_network": ["--network", bad_files / "nope.h5", "--inputs", inp],
        "truncated_network": ["--network", bad_files / "trunc.h5", "--inputs", inp],
        "garbage_network": ["--network", bad_files / "garbage.h5", "--inputs", inp],
        "inputs_as_network": ["--network", inp, "--inputs", inp],
        "malformed_tsv_inputs": ["--network", net, "--inputs", bad_files / "bad.tsv"],
        "empty_tsv_inputs": ["--network", net, "--inputs", bad_files / "empty.tsv"],
        "missing_layer": ["--network", bad_files / "neuron1024", "--inputs", inp, "--layers", "2"],
        "shape_mismatch": ["--network", bad_files / "net64.h5", "--inputs", inp],
        "nan_inputs": ["--network", net, "--inputs", bad_files / "nan.h5"],
        "too_many_layers": ["--network", net, "--inputs", inp, "--layers", "99"],
    }
    keys = [case for case, _ in _BAD_INPUTS] + [" ".join(a) for a in _BAD_FLAGS]
    runs = [["infer", *inputs[case]] for case, _ in _BAD_INPUTS] + _BAD_FLAGS
    return dict(zip(keys, run_cli_batch(runs, ranks=3, timeout=180)))


@pytest.mark.xdist_group("cli-bad")  # one worker runs the batch
@pytest.mark.parametrize("case, expect", _BAD_INPUTS)
def test_bad_input_one_line_exit_2(bad_runs, case, expect):
    r = bad_runs[case]
    err = _error_lines(r)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(err) == 1, r.stderr
    assert err[0].startswith("mpisdnn: error:") and expect in err[0], err[0]
    assert "Traceback" not in r.stderr


@pytest.mark.xdist_group("cli-bad")
@pytest.mark.parametrize("args", _BAD_FLAGS)
def test_bad_flags_reported_once(bad_runs, args):
    r = bad_runs[" ".join(args)]
    err = _error_lines(r)
    assert r.returncode == 2
    assert len(err) == 1, r.stderr  # no usage block: one line pointing at --help
    assert "error:" in err[0] and err[0].endswith("--help')"), err[0]


def test_python_api_main_returns_codes(small_data):
    from mpi4py import MPI

    from mpisdnn.cli import main

    assert (
        main(
            [
                "infer",
                "--network",
                str(small_data / "net.h5"),
                "--inputs",
                str(small_data / "in.h5"),
                "--quiet",
            ],
            MPI.COMM_SELF,
        )
        == 0
    )
    assert main(["infer", "--network", "/nonexistent", "--inputs", "x"], MPI.COMM_SELF) == 2


def test_reference_inference_helper_agrees(small_data):
    from mpisdnn.formats import read_inputs, read_network

    net = read_network(small_data / "net.h5")
    y0, truth = read_inputs(small_data / "in.h5")
    out = reference_inference(y0, net)
    assert categories(out).tolist() == truth.tolist()


def test_gpu_backend_unavailable_is_one_line(small_data):
    from mpisdnn.backends import available

    if available()["gpu"] is True:
        pytest.skip("a CUDA GPU is visible here: the gpu backend is usable")
    r, err = _bad(
        [
            "infer",
            "--network",
            small_data / "net.h5",
            "--inputs",
            small_data / "in.h5",
            "--backend",
            "gpu",
        ]
    )
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "backend 'gpu'" in err[0] and ("CUDA" in err[0] or "numba-cuda" in err[0]), err[0]


def test_empty_inputs_tsv_is_refused_unless_rows_given(bad_files, tmp_path):
    out = tmp_path / "conv.h5"
    r, err = _bad(
        ["convert", "inputs", bad_files / "empty.tsv", "--neurons", "1024", "-o", out], ranks=2
    )
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "empty.tsv: no entries" in err[0] and not out.exists()
    # a 0-byte file is refused even with --rows (a failed download); a file of blank lines
    # with --rows is 3 empty inputs
    args = ["convert", "inputs", bad_files / "empty.tsv", "--neurons", "1024", "--rows", "3"]
    r = run_cli([*args, "-o", out])
    assert r.returncode == 2 and "empty file (0 bytes)" in r.stderr and not out.exists()
    (tmp_path / "blank.tsv").write_text("\n")
    args = ["convert", "inputs", tmp_path / "blank.tsv", "--neurons", "1024", "--rows", "3"]
    r = run_cli([*args, "-o", out])
    assert r.returncode == 0, r.stderr
    from mpisdnn.formats import read_inputs

    y, _ = read_inputs(out, with_truth=False)
    assert y.shape == (3, 1024) and y.nnz == 0


@pytest.fixture
def library_reads(monkeypatch):
    """Every attribute of a parsed command line read by a library module (not ``commands/``,
    ``cli.py`` or ``__main__.py``) while the test runs ``cli.main``: ``["paths.py:353 .output"]``.

    argparse is made to parse into a namespace that notes the module of each reader; a value
    the command line hands down (``args.report``) is a plain value, not the namespace, and is
    not noted."""
    import argparse
    import sys
    from pathlib import Path

    import mpisdnn

    package = Path(mpisdnn.__file__).resolve().parent
    command_line = (package / "commands", package / "cli.py", package / "__main__.py")
    reads = []

    class Noted(argparse.Namespace):
        def __getattribute__(self, name):
            if name == "__dict__" or not name.startswith("__"):
                caller = sys._getframe(1)
                where = Path(caller.f_code.co_filename).resolve()
                if where.is_relative_to(package) and not any(
                    where == c or where.is_relative_to(c) for c in command_line
                ):
                    reads.append(f"{where.relative_to(package)}:{caller.f_lineno} .{name}")
            return super().__getattribute__(name)

    parse = argparse.ArgumentParser.parse_args

    def parse_noted(self, args=None, namespace=None):
        return parse(self, args, Noted() if namespace is None else namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_noted)
    return reads


def test_no_library_code_reads_the_parsed_command_line(small_data, tmp_path, library_reads):
    """Every command turns its flags into typed objects (the plan, the options, the paths it
    reads and writes) in ``commands/``; nothing below reads the namespace (issue 39)."""
    from mpi4py import MPI

    from mpisdnn.cli import main

    d, t = small_data, tmp_path
    edges = t / "edges.tsv"
    edges.write_text("1\t1\n1\t2\n2\t2\n3\t1\n")
    runs = [
        ["generate", "network", "--layers", "2", "-o", t / "net.h5", "--archive",
         t / "net.tar.gz", "--quiet"],
        ["generate", "inputs", "--count", "8", "--network", d / "net.h5", "-o", t / "in.h5",
         "--tsv", t / "in.tsv", "--quiet"],
        ["convert", "inputs", t / "in.tsv", "-o", t / "conv.h5", "--neurons", "1024"],
        ["generate", "bipartite", "--rows", "20", "--cols", "10", "--edges", "30",
         "-o", t / "g.tsv"],
        ["infer", "--network", d / "net.h5", "--inputs", d / "in.h5", "--truth", d / "truth.tsv",
         "--backend", "reference", "--report", t / "r.json", "--categories-out", t / "c.tsv",
         "--checkpoint", t / "ck", "--quiet"],
        ["project", edges, "-o", t / "h.tsv", "--report", t / "p.json", "--quiet"],
        ["report", t / "r.json", "--table", t / "table.md"],
        ["clean", t / "h.tsv"],
    ]  # fmt: skip
    for argv in runs:
        assert main([str(a) for a in argv], MPI.COMM_SELF) == 0, argv
    # the refusals read the flags too: a flag given where it has no effect, a clash of paths
    assert main(["project", str(edges), "--storage", "symmetric", "-o", str(t / "h2.tsv")],
                MPI.COMM_SELF) == 2  # fmt: skip
    assert main(["infer", "--network", str(d / "net.h5"), "--inputs", str(d / "in.h5"),
                 "--report", str(d / "net.h5")], MPI.COMM_SELF) == 2  # fmt: skip
    assert library_reads == [], "library code reads the parsed command line"
