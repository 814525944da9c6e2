"""``mpisdnn report``: validation of the JSON, the summary table and the figures."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mpisdnn.reporting import SCHEMA, infer_report, write_json

from .conftest import run_cli

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _main(args):
    from mpi4py import MPI

    from mpisdnn.cli import main

    return main([str(a) for a in args], MPI.COMM_SELF)


def make_report(ranks=2, rate=2e9, layers=12, inputs=500, threads=1, backend="cpu", seed=0):
    """A report built by the real :func:`infer_report` from a plausible result."""
    rng = np.random.default_rng(seed)
    nnz = (60000 * np.exp(-0.3 * np.arange(layers)) + 800).astype(int).tolist()
    active = np.minimum(inputs, (np.array(nnz) / 90).astype(int) + 8).tolist()
    secs = (0.002 + 1e-7 * np.array(nnz) * rng.uniform(0.9, 1.1, layers)).tolist()
    part1 = sum(secs)
    edges = 32 * 1024 * layers
    result = SimpleNamespace(
        layers=layers,
        g_rows=inputs,
        edges=edges,
        part1=part1,
        part2=0.001,
        rate=rate,
        layer_nnz=nnz,
        layer_active_rows=active,
        layer_seconds=secs,
        rank_seconds=(part1 * rng.uniform(0.85, 1.0, ranks)).tolist(),
        rank_rows=[inputs // ranks] * ranks,
        rank_nnz=[55000 // ranks] * ranks,
        imbalance=1.07,
        backend={"name": backend, "threads": threads},
        categories=np.arange(9),
    )
    run = {"command": "mpisdnn infer ...", "ranks": ranks, "hosts": ["node1"], "versions": {}}
    check = {"status": "PASS", "expected": 9, "found": 9, "missing": 0, "extra": 0}
    return infer_report(result, run, 0.05, check, 1024)


def _write(tmp_path, name, obj):
    path = tmp_path / name
    if isinstance(obj, (dict, list)):
        write_json(path, obj)
    else:
        path.write_text(obj)
    return path


# --- validation: one clear line naming the file, exit 2 ---------------------------------------


@pytest.mark.parametrize(
    "content, expect",
    [
        ("not json at all {", "not a JSON report"),
        ([1, 2, 3], "not an mpisdnn run report"),
        ({"hello": "world"}, "not an mpisdnn run report"),
        ({"schema": "other.thing/1", "kind": "infer"}, "not an mpisdnn run report"),
        ({"schema": "mpisdnn.report/99", "kind": "infer"}, "newer than this mpisdnn reads"),
        # no version: was "newer than this mpisdnn reads ... upgrade mpisdnn"
        ({"schema": "mpisdnn.report", "kind": "infer"}, 'has no version (expected "mpisdnn.'),
        ({"schema": "mpisdnn.report/x", "kind": "infer"}, "has no version"),
        ({"schema": SCHEMA, "kind": "bake"}, "unknown report kind 'bake'"),
        # a challenge sitting's table: was "unknown report kind 'challenge'"
        ({"schema": SCHEMA, "kind": "challenge", "rows": []},
         "an mpisdnn challenge table, not a run report: the table is "),
        ({"schema": SCHEMA, "kind": "infer", "run": {}}, "lacks section(s) problem"),
    ],
)
def test_bad_reports_are_named_once(tmp_path, capsys, content, expect):
    path = _write(tmp_path, "bad.json", content)
    assert _main(["report", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpisdnn: error:"), err
    assert str(path) in err[0] and expect in err[0], err[0]


def test_missing_report_and_mixed_kinds(tmp_path, capsys):
    assert _main(["report", tmp_path / "nope.json"]) == 2
    assert "nope.json: report not found" in capsys.readouterr().err
    good = _write(tmp_path, "a.json", make_report())
    proj = _write(tmp_path, "p.json", {"schema": SCHEMA, "kind": "project", "run": {"ranks": 2}})
    assert _main(["report", good, proj]) == 2
    assert "cannot mix" in capsys.readouterr().err


def test_report_error_once_under_mpiexec(tmp_path):
    path = _write(tmp_path, "bad.json", "{")
    r = run_cli(["report", path], ranks=2)
    assert r.returncode == 2
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [
        f"mpisdnn: error: {path}: not a JSON report (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1))"
    ]


# --- table ------------------------------------------------------------------------------------


def test_scaling_table(tmp_path, capsys):
    paths = [
        _write(tmp_path, f"n{k}.json", make_report(ranks=k, rate=2e9 * k * (0.9 if k > 1 else 1)))
        for k in (4, 1, 2)
    ]
    table = tmp_path / "t.md"
    assert _main(["report", *paths, "--table", table]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in table.read_text().splitlines() if ln.startswith("| n")]
    assert out.startswith(table.read_text().strip())
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2", "4"]  # sorted by ranks
    cells = rows[2].split("|")
    assert cells[9].strip() == "3.60" and cells[10].strip() == "90%"  # speedup, efficiency
    assert all(r.rstrip().endswith("PASS |") for r in rows)


# --- figures ----------------------------------------------------------------------------------


@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib")


def test_single_run_figure(tmp_path, mpl, capsys):
    path = _write(tmp_path, "run.json", make_report(ranks=3))
    fig = tmp_path / "run.png"
    assert _main(["report", path, "-o", fig]) == 0
    data = fig.read_bytes()
    assert data[:8] == PNG and len(data) > 20_000
    assert f"wrote {fig}" in capsys.readouterr().out
    assert _main(["report", path, "-o", tmp_path / "run.pdf", "--title", "Fig. 3"]) == 0
    assert (tmp_path / "run.pdf").read_bytes()[:4] == b"%PDF"


def test_single_run_figure_contents(mpl):
    from mpisdnn.reporting import plots

    rep = make_report(ranks=4, layers=120)
    rep["_path"] = "x.json"
    fig = plots.plot_infer_run(rep)
    a, b, c, d = fig.axes[:4]
    assert a.get_yscale() == "log" and "non-zeros" in a.get_ylabel()
    sec = [ax for ax in a.child_axes if "fill ratio" in ax.get_ylabel()]
    assert sec, "fill ratio axis missing"
    assert "[ms]" in c.get_ylabel() and "[s]" in d.get_ylabel()
    assert "max/mean" in d.get_title()
    assert all(ax.get_xlabel() for ax in (a, b, c, d))
    assert "N=1024, L=120" in fig._suptitle.get_text()
    # layer 0 is the input: L + 1 points
    assert len(a.get_lines()[0].get_xdata()) == 121


def test_scaling_figure(tmp_path, mpl):
    from mpisdnn.reporting import plots

    reps = []
    for k in (1, 2, 4, 8):
        rep = make_report(ranks=k, rate=1e9 * k**0.8)
        rep["_path"] = f"n{k}.json"
        reps.append(rep)
    reps.append(copy.deepcopy(reps[1]))  # a repeat at 2 ranks is allowed
    fig = plots.plot_scaling(reps)
    a, b, c = fig.axes[:3]
    labels = [ln.get_label() for ln in a.get_lines()]
    assert "ideal (linear)" in labels and "measured" in labels
    ideal = next(ln for ln in a.get_lines() if ln.get_label() == "ideal (linear)")
    assert list(ideal.get_ydata()) == pytest.approx([1.0, 2.0, 4.0, 8.0])
    assert "GE/s" in a.get_ylabel() and "efficiency" in b.get_ylabel()
    assert a.get_xlabel() == "MPI ranks" and "[s]" in c.get_ylabel()
    paths = [_write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reps)]
    out = tmp_path / "scaling.png"
    assert _main(["report", *paths, "-o", out]) == 0
    assert out.read_bytes()[:8] == PNG


def test_figure_format_checked(tmp_path, mpl, capsys):
    path = _write(tmp_path, "run.json", make_report())
    assert _main(["report", path, "-o", tmp_path / "fig.jpg"]) == 2
    assert ".png, .pdf or .svg" in capsys.readouterr().err
    assert not (tmp_path / "fig.jpg").exists()


def test_projection_reports(tmp_path, mpl, capsys):
    base = {"schema": SCHEMA, "kind": "project", "problem": {"rows": 1000, "onto": "cols"}}
    one = dict(
        base,
        run={"ranks": 3},
        phases={"read_seconds": 0.2, "multiply_seconds": 1.5},
        ranks={"seconds": [1.0, 1.2, 0.9], "work": [100, 140, 90], "note": "x"},
    )
    p1 = _write(tmp_path, "p1.json", one)
    assert _main(["report", p1, "-o", tmp_path / "p1.png"]) == 0
    assert (tmp_path / "p1.png").read_bytes()[:8] == PNG
    capsys.readouterr()
    bare = _write(tmp_path, "bare.json", dict(base, run={"ranks": 2}, phases={"x_seconds": 1.0}))
    assert _main(["report", bare, "-o", tmp_path / "bare.png"]) == 2
    assert "no per-rank data to plot" in capsys.readouterr().err
    two = dict(one, run={"ranks": 6}, phases={"read_seconds": 0.1, "multiply_seconds": 0.8})
    two["ranks"] = {"seconds": [0.5] * 6}
    p2 = _write(tmp_path, "p2.json", two)
    assert _main(["report", p1, p2, "-o", tmp_path / "ps.png", "--table", tmp_path / "t"]) == 0
    table = (tmp_path / "t").read_text()
    assert "| p2.json | 6 | - | 0.900 | 1.89 | 94% |" in table


def test_end_to_end_from_a_real_run(tmp_path, mpl):
    """infer --report on 2 ranks, then report -o: the real schema, not a hand-made one."""
    d = tmp_path
    assert run_cli(["generate", "network", "--layers", "6", "-o", d / "n.h5"]).returncode == 0
    r = run_cli(["generate", "inputs", "--count", "300", "--network", d / "n.h5", "-o", d / "i.h5"])
    assert r.returncode == 0, r.stderr
    r = run_cli(
        ["infer", "--network", d / "n.h5", "--inputs", d / "i.h5", "--report", d / "r.json"],
        ranks=2,
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(["report", d / "r.json", "-o", d / "r.png"], ranks=1)
    assert r.returncode == 0, r.stderr
    assert (d / "r.png").read_bytes()[:8] == PNG
    assert json.loads((d / "r.json").read_text())["schema"] == SCHEMA


def test_end_to_end_projection_report(tmp_path, mpl):
    """project --report on 1 and 2 ranks, then report: the projection's real schema."""
    d = tmp_path
    r = run_cli(["generate", "rmat", "--scale", "8", "--edge-factor", "8", "-o", d / "g.h5"])
    assert r.returncode == 0, r.stderr
    for ranks in (1, 2):
        r = run_cli(
            [
                "project",
                d / "g.h5",
                "-o",
                d / f"h{ranks}.h5",
                "--threads",
                "1",
                "--quiet",
                "--report",
                d / f"p{ranks}.json",
            ],
            ranks=ranks,
        )
        assert r.returncode == 0, r.stderr
    r = run_cli(["report", d / "p1.json", d / "p2.json", "-o", d / "two.png"])
    assert r.returncode == 0, r.stderr
    rows = [ln.split("|") for ln in r.stdout.splitlines() if ln.startswith("| p")]
    assert [row[2].strip() for row in rows] == ["1", "2"]
    # One curve: the 2-rank run's speedup is the ratio of the runs' total times, read here
    # from the JSON files independently of mpisdnn.reporting.
    totals = []
    for ranks in (1, 2):
        phases = json.loads((d / f"p{ranks}.json").read_text())["phases"]
        if "total_seconds" in phases:
            totals.append(phases["total_seconds"])
        else:
            totals.append(sum(v for k, v in phases.items() if k.endswith("_seconds")))
    assert [row[4].strip() for row in rows] == [f"{t:.3f}" for t in totals]
    assert rows[0][5].strip() == "1.00"
    assert rows[1][5].strip() == f"{totals[0] / totals[1]:.2f}"
    assert (d / "two.png").read_bytes()[:8] == PNG


def test_reporting_package_imports_no_command_module():
    """Library code never imports the CLI (the old plots -> commands.report -> plots cycle)."""
    code = (
        "import sys, mpisdnn.reporting, mpisdnn.reporting.plots; "
        "bad = sorted(m for m in sys.modules if m.startswith(('mpisdnn.commands', 'mpisdnn.cli')));"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr


def test_memory_line_names_a_batch_size_only_when_there_is_one():
    from mpisdnn.reporting.infer import _memory_lines

    def lines(batch_rows):
        mem = {"rank_max_batches": [1, 10], "batch_rows": batch_rows}
        return [s for s in _memory_lines({"memory": mem, "ranks": {}}) if "batches" in s]

    assert lines(None) == ["  rows in up to 10 batches per rank"]
    assert lines(4096) == ["  rows in up to 10 batches of 4096 rows per rank"]
