"""The plumbing of ``scripts/bench_official.py`` on a tiny matrix (N=1024, 2-3 layers, 200 inputs).

The full-size table is a benchmark (docs/performance.md); here: files are generated once and
reused, a finished configuration is not rerun, and the independent check fails when a category
is wrong (full reference and sampled reference).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# one worker runs them all: they share the module's matrix (generated once)
pytestmark = pytest.mark.xdist_group("bench_official")


def _load():
    spec = importlib.util.spec_from_file_location(
        "bench_official", ROOT / "scripts" / "bench_official.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_official"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


bench = _load()


def _argv(tmp, *extra):
    return [
        "--neurons", "1024", "--layers", "2", "3", "--inputs", "200", "--ranks", "1",
        "--ablation-seconds", "0", "--cache", str(tmp / "cache"), "--out", str(tmp / "out"),
        *extra,
    ]  # fmt: skip


# Session scope: a module-scoped fixture is rebuilt whenever the worker comes back to this
# module after another one (22 s each time).
@pytest.fixture(scope="session")
def matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("official")
    assert bench.main(_argv(tmp)) == 0
    return tmp


def _mtimes(d: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


def test_matrix_writes_tables_and_passes(matrix):
    out = json.loads((matrix / "out" / "official.json").read_text())
    rows = out["rows"]
    assert [(r["n"], r["l"]) for r in rows] == [(1024, 2), (1024, 3)]
    assert all(r["status"] == "PASS" and r["check"] == "reference, all rows" for r in rows)
    assert all(r["checked_rows"] == 200 and r["rows"] == 200 for r in rows)
    assert rows[0]["edges"] == 2 * 32 * 1024 and rows[1]["categories"] <= rows[0]["categories"]
    md = (matrix / "out" / "official.md").read_text()
    assert md.count("**PASS**") == 2
    assert (matrix / "out" / "official.png").stat().st_size > 0
    assert not (matrix / "out" / "tmp").exists()  # temporaries cleaned up


def test_resume_reuses_cache_and_reruns_only_missing(matrix, capsys):
    cache, runs = matrix / "cache", matrix / "out" / "runs"
    before, kept = _mtimes(cache), (runs / "N1024-L2.json").stat().st_mtime_ns
    (runs / "N1024-L3.json").unlink()  # a matrix stopped after its first configuration
    assert bench.main(_argv(matrix)) == 0
    said = capsys.readouterr().out
    assert "N=1024 L=2: done before" in said and "N=1024 L=3: running" in said
    assert "generating" not in said
    assert _mtimes(cache) == before  # network and inputs reused, not regenerated
    assert (runs / "N1024-L2.json").stat().st_mtime_ns == kept
    assert json.loads((runs / "N1024-L3.json").read_text())["status"] == "PASS"


def _row(matrix, layers):
    return json.loads((matrix / "out" / "runs" / f"N1024-L{layers}.json").read_text())


def _claimed(matrix, layers):
    """The run's categories recomputed by the reference (its result file keeps only counts)."""
    row = _row(matrix, layers)
    y = bench.sample_inputs(Path(row["inputs"]), False, np.arange(200), 1024, _opts(matrix))
    return row, bench.reference_here(row["network"], layers, y)


def _opts(matrix, **kw):
    return bench.parse_args(_argv(matrix, *kw.get("extra", ())))


@pytest.mark.parametrize("how", ["full", "sampled"])
def test_check_fails_on_a_wrong_category(matrix, tmp_path, how):
    extra = ("--full-check-edges", "0", "--check-rows", "400") if how == "sampled" else ()
    o = _opts(matrix, extra=extra)
    row, right = _claimed(matrix, 2)
    assert right.size == row["categories"] > 1
    wrong = right.copy()
    wrong[0] = np.setdiff1d(np.arange(1, 201), right)[0]  # one category swapped for a dead row
    res = bench.check(o, row, wrong, tmp_path)
    assert res["check"] == ("reference, all rows" if how == "full" else "reference, sampled rows")
    assert res["pass"] is False
    if how == "sampled":  # the same path passes the right answer
        assert bench.check(o, row, right, tmp_path)["pass"] is True


def test_xdist_groups_this_module_on_one_worker(request):
    """Under ``--dist loadgroup`` (scripts/test.sh) this module's tests share one worker and
    so one matrix, and the Slurm tests one cluster: pytest 9.2 with pytest-xdist 3.8 silently
    stopped grouping (pyproject.toml pins pytest below 9.2)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only meaningful in an xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@bench_official"), request.node.nodeid
