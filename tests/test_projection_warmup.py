"""The projection's warm-up (what ``mpisdnn project``'s ranks other than the first compile
while the first compiles the reader's kernels) against a real projection of a graph read
from a file: it must compile the very specialisations the projection then calls, or a first
run compiles twice and the warm-up has cost a rank its time for nothing."""

import numpy as np
import pytest

from mpisdnn.projection import SerialComm, project
from mpisdnn.projection import _kernels as K
from mpisdnn.projection.core import warm_up, warms_up
from mpisdnn.projection.load import load_graph
from mpisdnn.projection.options import ProjectionOptions

from .conftest import self_comm
from .tsv_cases import kernel_types, uncovered

#: The projection kernels the Python side calls (each through the module, so a spy sees it).
KERNELS = ("project_chunk", "compact", "transpose_cols", "row_work", "axis_sums",
           "merge_heaps")  # fmt: skip


def _edges(path, weighted):
    rng = np.random.default_rng(4)
    pairs = sorted(set(zip(rng.integers(1, 60, 400).tolist(), rng.integers(1, 25, 400).tolist())))
    with open(path, "w") as fh:
        for r, c in pairs:
            fh.write(f"{r}\t{c}\t{rng.integers(1, 5)}\n" if weighted else f"{r}\t{c}\n")
    return path


@pytest.mark.parametrize(
    "weighted, changes",
    [
        (False, dict(weight="count")),
        (False, dict(weight="jaccard", min_weight=0.2)),
        (False, dict(weight="count", top_k=3, onto="rows")),
        (False, dict(weight="overlap", triangle="upper", self_loops="keep")),
        (True, dict(weight="product")),
        (True, dict(weight="newman", top_k=2)),
        # an HDF5 file stores counts as uint16, which the kernel writes directly
        (False, dict(weight="count", output="h.h5")),
        (False, dict(weight="jaccard", output="h.h5")),
        # the text and Matrix Market writers: the warm-up writes the run's own format
        (False, dict(weight="count", output="h.mtx")),
        (True, dict(weight="product", output="h.tsv", top_k=2)),
    ],
)
def test_warm_up_compiles_what_the_projection_of_a_read_graph_calls(tmp_path, monkeypatch,
                                                                   weighted, changes):  # fmt: skip
    if "output" in changes:
        changes = dict(changes, output=str(tmp_path / changes["output"]))
    opts = ProjectionOptions(**changes).resolved(SerialComm())
    graph, _ = load_graph(self_comm(), str(_edges(tmp_path / "g.tsv", weighted)))
    assert warms_up(opts)
    warm = kernel_types(monkeypatch, lambda: warm_up(opts), K, KERNELS)
    real = kernel_types(monkeypatch, lambda: project(self_comm(), graph, opts), K, KERNELS)
    assert "project_chunk" in real
    assert not uncovered(real, warm)


def test_no_warm_up_where_the_kernel_follows_the_weights():
    """cosine sums integers where every weight is 1 and floats otherwise: its kernel is not
    known before the weights are read, so the warm-up is not run for it."""
    assert not warms_up(ProjectionOptions(weight="cosine"))
    assert warms_up(ProjectionOptions(weight="count"))
