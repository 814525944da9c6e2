"""The user's own ids: sparse integer and string ids in, the same ids out (vs plain scipy)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.projection import read_graph, read_projection
from tests.test_projection_cli import run_cli


def _movielens_like(seed=7, users=300, items=400, ratings=6000):
    """MovieLens-100k-shaped ratings: skewed item popularity, ratings 1..5, a timestamp."""
    rng = np.random.default_rng(seed)
    u = rng.integers(1, users + 1, ratings)
    m = rng.zipf(1.4, ratings) % items + 1
    r = rng.integers(1, 6, ratings)
    return u, m, r


def _reference(users, items, weights):
    """Item x item shared-user counts by plain scipy, keyed by the original item ids."""
    uid, ui = np.unique(users, return_inverse=True)
    iid, ii = np.unique(items, return_inverse=True)
    a = sp.coo_matrix((np.ones(ui.size), (ui, ii)), shape=(uid.size, iid.size)).tocsr()
    a.data[:] = 1  # duplicates summed by tocsr: count presence, as projection's count does
    h = (a.T @ a).tocoo()
    off = h.row != h.col
    return {(iid[r], iid[c]): int(v) for r, c, v in zip(h.row[off], h.col[off], h.data[off])}


def _read_labelled_tsv(path, cast):
    out = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        a, b, w = line.rstrip("\n").split("\t")
        out[(cast(a), cast(b))] = int(w)
    return out


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["string", "sparse"])
def test_tsv_output_named_by_the_original_ids(tmp_path, kind, ranks):
    u, m, r = _movielens_like()
    if kind == "string":
        users, items = np.array([f"u{x}" for x in u]), np.array([f"m{x}" for x in m])
        cast = str
    else:  # ids up to ~400,007 for 400 items: used as indices they would make 400k columns
        users, items = u * 1000 + 3, m * 1000 + 7
        cast = int
    src = tmp_path / "ratings.dat"
    src.write_text("".join(f"{a}::{b}::{c}::881250949\n" for a, b, c in zip(users, items, r)))
    out = tmp_path / "items.tsv"
    res = run_cli(["project", src, "--format", "ratings", "-o", out, "--quiet"], ranks=ranks)
    assert res.returncode == 0, res.stderr
    assert _read_labelled_tsv(out, cast) == _reference(users, items, r)
    g = read_graph(src, fmt="ratings")
    assert g.matrix.shape == (np.unique(users).size, np.unique(items).size)


def test_h5_output_stores_labels_and_readers_return_them(tmp_path):
    u, m, _ = _movielens_like(seed=3)
    items = np.array([f"movie {x:04d}"[:5] + f"-{x}" for x in m])  # spaces are separators
    items = np.char.replace(items, " ", "_")
    src = tmp_path / "edges.tsv"
    src.write_text("".join(f"{a}\t{b}\n" for a, b in zip(u, items)))
    for ranks in (1, 2, 3):
        out = tmp_path / f"h{ranks}.h5"
        res = run_cli(["project", src, "-o", out, "--quiet"], ranks=ranks)
        assert res.returncode == 0, res.stderr
        mat, labels = read_projection(out, with_labels=True)
        assert list(labels[0]) == sorted(set(items.tolist())) and list(labels[1]) == list(labels[0])
        got = {(labels[0][i], labels[1][j]): int(v) for i, j, v in zip(*sp.find(mat))}
        assert got == _reference(u, items, None)
        import h5py

        with h5py.File(out) as f:  # plain h5py sees the labels too
            assert f["labels/rows"].shape == (len(labels[0]),)


def test_dense_numeric_ids_keep_their_index_meaning(tmp_path):
    src = tmp_path / "e.tsv"
    src.write_text("1 1\n1 3\n2 3\n")  # 1-based: nodes 1..3, node 2 has no edge
    out = tmp_path / "h.tsv"
    res = run_cli(["project", src, "--one-based", "-o", out, "--quiet"], ranks=1)
    assert res.returncode == 0, res.stderr
    h = read_projection(out)
    assert h.shape == (3, 3) and h[0, 2] == 1 and h[2, 0] == 1 and h.nnz == 2
    assert "labels" not in open(out).readline()


def test_forced_index_ids_reject_text_with_the_line(tmp_path):
    src = tmp_path / "e.tsv"
    src.write_text("0 1\nu7 2\n")
    res = run_cli(["project", src, "--ids", "index", "-o", tmp_path / "h.h5"], ranks=1)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and ":2:" in res.stderr, res.stderr


def test_huge_ids_are_compacted_not_allocated(tmp_path):
    """An item id of 2**40 is a label (two items), not a 2**40-column matrix."""
    src = tmp_path / "r.tsv"
    src.write_text(f"1\t{2**40}\t5\n2\t{2**40}\t4\n2\t17\t3\n")
    out = tmp_path / "h.tsv"
    res = run_cli(["project", src, "--format", "ratings", "-o", out, "--quiet"], ranks=1)
    assert res.returncode == 0, res.stderr
    assert _read_labelled_tsv(out, int) == {(17, 2**40): 1, (2**40, 17): 1}
