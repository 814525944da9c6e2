"""``mpisdnn project`` and ``generate bipartite|rmat`` end to end under real ``mpiexec``."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.projection import read_graph, read_projection, write_graph

from .conftest import run_cli, run_cli_batch
from .test_projection import (
    WEIGHTS,
    as_dict,
    assert_same_edges,
    davis_matrix,
    hive_reference,
    nx_projection,
)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("projcli")
    r = run_cli(["generate", "rmat", "--scale", "9", "--edge-factor", "8", "--seed", "2", "-o",
                 d / "rmat.h5"], ranks=2)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = run_cli(["generate", "bipartite", "--rows", "3000", "--cols", "2500", "--edges", "60000",
                 "--seed", "3", "-o", d / "big.h5"])  # fmt: skip
    assert r.returncode == 0, r.stderr
    davis = davis_matrix()
    write_graph(d / "davis.mtx", davis)
    return d


def test_generators_write_the_graph(graphs):
    g = read_graph(graphs / "rmat.h5")
    assert g.shape == (512, 512) and not g.weighted and (g.matrix != g.matrix.T).nnz == 0
    big = read_graph(graphs / "big.h5")
    assert big.shape == (3000, 2500) and big.nnz == 60000


def test_every_weighting_equals_networkx_at_two_ranks(graphs):
    davis = davis_matrix()
    runs = [["project", graphs / "davis.mtx", "--weight", weight, "--onto", "rows",
             "-o", graphs / f"davis-{weight}.h5", "--quiet"] for weight in WEIGHTS]  # fmt: skip
    for weight, r in zip(WEIGHTS, run_cli_batch(runs, ranks=2)):
        out = graphs / f"davis-{weight}.h5"
        assert r.returncode == 0, r.stderr
        got = as_dict(read_projection(out), upper_only=weight != "hive")
        want = (
            hive_reference(davis, "rows")
            if weight == "hive"
            else nx_projection(davis, weight, "rows")
        )
        assert_same_edges(got, want)


def test_identical_output_at_1_2_3_ranks_and_tiny_chunks(graphs):
    results = []
    cases = ((1, None), (2, None), (2, "40K"), (3, None), (3, "40K"))

    def args(ranks, mem):
        return ["project", graphs / "rmat.h5", "-o", graphs / f"r{ranks}-{mem}.h5", "--report",
                graphs / f"rep-{ranks}-{mem}.json", "--weight", "jaccard", "--threads", "1",
                *(["--memory-per-rank", mem] if mem else [])]  # fmt: skip

    # the runs at one rank count share one MPI job (run_cli_batch)
    done = [run_cli(args(1, None))]
    for ranks in (2, 3):
        done += run_cli_batch([args(n, mem) for n, mem in cases if n == ranks], ranks=ranks)
    for (ranks, mem), r in zip(cases, done):
        out = graphs / f"r{ranks}-{mem}.h5"
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("mpisdnn project:") == 1
        rep = json.loads((graphs / f"rep-{ranks}-{mem}.json").read_text())
        assert rep["kind"] == "project" and rep["schema"].startswith("mpisdnn.report/")
        assert len(rep["ranks"]["rows"]) == ranks
        ph = rep["phases"]
        parts = ph["read_seconds"] + ph["kernel_load_seconds"] + ph["plan_seconds"]
        parts += ph["compute_seconds"] + ph["write_seconds"]
        # the total is read + the slowest rank's wall for the rest, so never less than any
        # rank's compute and write (the phases' compute and write are each the slowest
        # rank's, and two ranks may set them: their sum may pass the total; CI saw 13 ms at
        # 3 ranks on 2 cores); a loose upper bound: barriers, allgathers and the sink's
        # set-up are in no phase
        rk = rep["ranks"]
        slowest = max(c + w for c, w in zip(rk["compute_seconds"], rk["write_seconds"]))
        assert ph["read_seconds"] + slowest - 1e-6 <= ph["total_seconds"] <= 2 * parts + 2
        if mem:
            assert rep["result"]["chunks_written"] > 4 * ranks
        results.append(read_projection(out))
    a = read_graph(graphs / "rmat.h5").matrix
    counts = sp.csr_matrix(a.T @ a)
    counts.setdiag(0)
    counts.eliminate_zeros()
    first = results[0]
    assert first.nnz == counts.nnz
    for h in results[1:]:
        assert np.array_equal(h.indptr, first.indptr) and np.array_equal(h.indices, first.indices)
        assert np.array_equal(h.data, first.data)


@pytest.mark.parametrize("ext", ["h5", "mtx", "tsv"])
def test_streaming_output_four_times_the_memory_bound(graphs, ext):
    """The output is >= 4x the per-rank bound; RSS stays under bound + input; exact read-back.

    The growth of RSS during the projection is compared with the bound plus the input; a
    constant 2 MiB covers allocator and library slack, which only matters at this tiny bound.
    """
    bound = 1 << 20
    out = graphs / f"H.{ext}"
    rep_path = graphs / f"big-{ext}.json"
    r = run_cli(["project", graphs / "big.h5", "-o", out, "--memory-per-rank", "1M",
                 "--report", rep_path], ranks=2, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rep = json.loads(rep_path.read_text())
    nnz = rep["result"]["nnz"]
    assert nnz * 8 >= 4 * bound * 2  # the output is at least 4x the bound of each rank
    assert min(rep["ranks"]["chunks"]) >= 4
    for peak, start, inp in zip(
        rep["ranks"]["peak_rss_bytes"], rep["ranks"]["rss_start_bytes"], rep["ranks"]["input_bytes"]
    ):
        assert peak - start <= bound + inp + (2 << 20), (peak, start, inp)
    a = read_graph(graphs / "big.h5").matrix
    ref = sp.csr_matrix(a.T @ a).astype(np.int32)
    ref.setdiag(0)
    ref.eliminate_zeros()
    back = read_projection(out)
    assert back.nnz == nnz == ref.nnz
    assert (back != ref).nnz == 0


def test_ratings_input_and_upper_triangle(tmp_path):
    lines = ["userId,movieId,rating,timestamp"]
    rng = np.random.default_rng(5)
    for u in range(1, 40):
        for m in rng.choice(30, 6, replace=False):
            lines.append(f"{u},{m + 1},{rng.integers(1, 6)}.5,97830{u}")
    (tmp_path / "ratings.csv").write_text("\n".join(lines) + "\n")
    r = run_cli(["project", tmp_path / "ratings.csv", "--format", "ratings", "--skip-lines", "1",
                 "--weight", "product", "--triangle", "upper", "-o", tmp_path / "h.mtx"],
                ranks=3)  # fmt: skip
    assert r.returncode == 0, r.stderr
    g = read_graph(tmp_path / "ratings.csv", fmt="ratings", skip_lines=1)
    ref = sp.triu(g.matrix.T @ g.matrix, k=1)
    back = read_projection(tmp_path / "h.mtx")
    np.testing.assert_allclose(back.toarray(), ref.toarray())


# --- bad input: one clear line from rank 0, exit code 2, no hang ------------------------------


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("projbad")
    (d / "line.mtx").write_text(
        "%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1 1\n2 2 x\n3 3 1\n"
    )
    (d / "header.mtx").write_text("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n")
    (d / "edges.tsv").write_text("0\t1\n1\t2\n2\t3\t4\t5\n")
    (d / "ratings.dat").write_text("1::2::5::0\n1::3::five::0\n")
    (d / "ok.tsv").write_text("0\t1\n1\t1\n")
    return d


_BAD_INPUTS = [
    (["line.mtx"], "line.mtx:4: weight is not a number"),
    (["header.mtx"], "header.mtx:1: only 'coordinate'"),
    (["edges.tsv"], "edges.tsv:3: 4 fields, expected 2"),
    (["ratings.dat"], "ratings.dat:2: weight is not a number"),
    (["missing.mtx"], "missing.mtx: file not found"),
    (["ok.tsv", "--weight", "hive", "--triangle", "upper"], "not symmetric"),
    (["ok.tsv", "--top-k", "2", "--triangle", "upper"], "--top-k"),
    (["ok.tsv", "--memory-per-rank", "10"], "too small"),
    (["ok.tsv", "-o", "ok.tsv"], "overwrite the input"),
]

_BAD_FLAGS = [
    ["project", "x.mtx", "--weight", "cosinus"],
    ["project", "x.mtx", "--top-k", "0"],
    ["project", "x.mtx", "--memory-per-rank", "lots"],
    ["project"],
    ["generate", "rmat", "--scale", "0", "-o", "x.h5"],
    ["generate", "bipartite", "--rows", "3", "--cols", "3", "-o", "x.h5"],
]


@pytest.fixture(scope="module")
def bad_runs(bad_inputs):
    """Every bad-input and bad-flag command line below, at 3 ranks, in one MPI job
    (:func:`run_cli_batch`: whole ``mpisdnn`` runs on three ranks that start once instead
    of 15 times), keyed by the joined case."""
    runs = [["project", bad_inputs / case[0],
             *[bad_inputs / c if c == "ok.tsv" else c for c in case[1:]]]
            for case, _ in _BAD_INPUTS] + _BAD_FLAGS  # fmt: skip
    keys = [" ".join(case) for case, _ in _BAD_INPUTS] + [" ".join(a) for a in _BAD_FLAGS]
    return dict(zip(keys, run_cli_batch(runs, ranks=3, timeout=180)))


@pytest.mark.xdist_group("projection-cli-bad")  # one worker runs the batch
@pytest.mark.parametrize("case, expect", _BAD_INPUTS)
def test_bad_input_one_line_exit_2(bad_runs, case, expect):
    r = bad_runs[" ".join(case)]
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(err) == 1, r.stderr
    assert err[0].startswith("mpisdnn: error:") and expect in err[0], err[0]


@pytest.mark.xdist_group("projection-cli-bad")
@pytest.mark.parametrize("args", _BAD_FLAGS)
def test_bad_flags_reported_once(bad_runs, args):
    r = bad_runs[" ".join(args)]
    assert r.returncode == 2
    assert sum("error:" in ln for ln in r.stderr.splitlines()) == 1, r.stderr
