"""Projection semantics (serial): every weighting against networkx, count/product against
scipy, filters against post-filtering, chunking, output formats and input readers."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from networkx.algorithms import bipartite as nxb

from mpisdnn.errors import InputError, UsageError
from mpisdnn.generate.graphs import bipartite, rmat
from mpisdnn.partition import chunk_rows
from mpisdnn.projection import (
    SerialComm,
    iter_projection,
    plan,
    project,
    project_matrix,
    read_graph,
    read_projection,
    write_graph,
)
from mpisdnn.system import parse_size

from .conftest import same_csr

WEIGHTS = ["count", "product", "ratio", "jaccard", "overlap", "newman", "cosine", "hive"]


# --- references -----------------------------------------------------------------------------


def davis_matrix():
    """Davis Southern Women as an 18 x 14 women-by-events matrix."""
    g = nx.davis_southern_women_graph()
    women = sorted(n for n, d in g.nodes(data=True) if d["bipartite"] == 0)
    events = sorted(n for n, d in g.nodes(data=True) if d["bipartite"] == 1)
    a = np.zeros((len(women), len(events)))
    for i, w in enumerate(women):
        for j, e in enumerate(events):
            a[i, j] = g.has_edge(w, e)
    return sp.csr_matrix(a)


def nx_bipartite(a):
    """Bipartite networkx graph of matrix ``a``: rows ('r', k), columns ('c', u)."""
    a = sp.coo_matrix(a)
    g = nx.Graph()
    g.add_nodes_from((("r", k) for k in range(a.shape[0])), bipartite=0)
    g.add_nodes_from((("c", u) for u in range(a.shape[1])), bipartite=1)
    for k, u, w in zip(a.row, a.col, a.data):
        g.add_edge(("r", int(k)), ("c", int(u)), weight=float(w))
    return g


def _product(g, u, v):
    return sum(g[u][k]["weight"] * g[v][k]["weight"] for k in set(g[u]) & set(g[v]))


def _cosine(g, u, v):
    norm_u = np.sqrt(sum(d["weight"] ** 2 for d in g[u].values()))
    norm_v = np.sqrt(sum(d["weight"] ** 2 for d in g[v].values()))
    return _product(g, u, v) / (norm_u * norm_v)


def nx_projection(a, weight, onto="cols"):
    """networkx's projection of ``a`` onto one side, as {(u, v): weight} with u < v."""
    g = nx_bipartite(a)
    side = "c" if onto == "cols" else "r"
    nodes = [n for n in g if n[0] == side]
    if weight == "count":
        h = nxb.weighted_projected_graph(g, nodes)
    elif weight == "ratio":
        h = nxb.weighted_projected_graph(g, nodes, ratio=True)
    elif weight == "jaccard":
        h = nxb.overlap_weighted_projected_graph(g, nodes, jaccard=True)
    elif weight == "overlap":
        h = nxb.overlap_weighted_projected_graph(g, nodes, jaccard=False)
    elif weight == "newman":
        h = nxb.collaboration_weighted_projected_graph(g, nodes)
    elif weight == "product":
        h = nxb.generic_weighted_projected_graph(g, nodes, weight_function=_product)
    elif weight == "cosine":
        h = nxb.generic_weighted_projected_graph(g, nodes, weight_function=_cosine)
    else:
        raise ValueError(weight)
    return {(min(u[1], v[1]), max(u[1], v[1])): d["weight"] for u, v, d in h.edges(data=True)}


def hive_reference(a, onto="cols"):
    """H[u, v] = sum over shared k of A[k,u] / (A[k,u] + A[k,v]), straight from the definition."""
    b = sp.csr_matrix(a if onto == "cols" else sp.csr_matrix(a).T).toarray()
    n = b.shape[1]
    out = {}
    for u in range(n):
        for v in range(n):
            if u == v:
                continue
            shared = (b[:, u] != 0) & (b[:, v] != 0)
            if shared.any():
                out[(u, v)] = float(np.sum(b[shared, u] / (b[shared, u] + b[shared, v])))
    return out


def as_dict(h, upper_only=True):
    h = sp.coo_matrix(h)
    return {
        (int(u), int(v)): float(w)
        for u, v, w in zip(h.row, h.col, h.data)
        if not upper_only or u < v
    }


def assert_same_edges(got: dict, want: dict):
    assert set(got) == set(want)
    keys = sorted(want)
    np.testing.assert_allclose([got[k] for k in keys], [want[k] for k in keys], rtol=1e-12)


def random_bipartite(seed, rows=40, cols=30, edges=260, weights="rating"):
    return bipartite(rows, cols, edges=edges, seed=seed, weights=weights)


# --- semantics ------------------------------------------------------------------------------


@pytest.mark.parametrize("onto", ["cols", "rows"])
@pytest.mark.parametrize("weight", [w for w in WEIGHTS if w != "hive"])
def test_davis_equals_networkx(weight, onto):
    a = davis_matrix()
    h = project_matrix(a, weight=weight, onto=onto)
    got = as_dict(h, upper_only=False)
    want = nx_projection(a, weight, onto)
    # full output is symmetric: every networkx edge appears in both directions
    assert len(got) == 2 * len(want)
    assert_same_edges({k: w for k, w in got.items() if k[0] < k[1]}, want)
    assert_same_edges({(v, u): w for (u, v), w in got.items() if u > v}, want)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("weight", [w for w in WEIGHTS if w != "hive"])
def test_random_bipartite_equals_networkx(weight, seed):
    a = random_bipartite(seed)
    for onto in ("cols", "rows"):
        h = project_matrix(a, weight=weight, onto=onto)
        assert_same_edges(as_dict(h), nx_projection(a, weight, onto))
        # the fast upper-triangle path gives the same edges
        u = project_matrix(a, weight=weight, onto=onto, triangle="upper")
        assert_same_edges(as_dict(u, upper_only=False), nx_projection(a, weight, onto))


@pytest.mark.parametrize("seed", [4, 5])
def test_hive_definition(seed):
    a = random_bipartite(seed)
    for onto in ("cols", "rows"):
        got = as_dict(project_matrix(a, weight="hive", onto=onto), upper_only=False)
        assert_same_edges(got, hive_reference(a, onto))


def test_hive_is_not_symmetric_and_unit_weights_give_half_counts():
    a = random_bipartite(6)
    h = project_matrix(a, weight="hive").toarray()
    assert not np.allclose(h, h.T)
    ones = a.copy()
    ones.data[:] = 1
    np.testing.assert_allclose(
        project_matrix(ones, weight="hive").toarray(),
        project_matrix(ones, weight="count").toarray() / 2,
    )
    with pytest.raises(UsageError, match="not symmetric"):
        project_matrix(a, weight="hive", triangle="upper")


@pytest.mark.parametrize("onto", ["cols", "rows"])
def test_count_and_product_equal_scipy(onto):
    a = random_bipartite(7, 80, 50, 900)
    pattern = a.copy()
    pattern.data[:] = 1
    mul = (lambda m: m.T @ m) if onto == "cols" else (lambda m: m @ m.T)
    for weight, src in (("count", pattern), ("product", a)):
        ref = sp.csr_matrix(mul(src))
        keep = project_matrix(a, weight=weight, onto=onto, self_loops="keep")
        assert (keep != ref).nnz == 0
        drop = project_matrix(a, weight=weight, onto=onto)
        assert (drop != ref - sp.diags(ref.diagonal())).nnz == 0
        assert drop.diagonal().sum() == 0
        assert drop.has_sorted_indices
    assert project_matrix(a).dtype == np.int32  # counts stay integers


def test_upper_triangle_is_triu_of_full():
    a = random_bipartite(8, 60, 45, 700)
    for keep in ("drop", "keep"):
        full = project_matrix(a, weight="jaccard", self_loops=keep)
        up = project_matrix(a, weight="jaccard", self_loops=keep, triangle="upper")
        k = 0 if keep == "keep" else 1
        assert (up != sp.triu(full, k=k)).nnz == 0


def test_min_weight_and_top_k_equal_post_filtering():
    a = random_bipartite(9, 70, 40, 600)
    for weight in ("count", "product", "jaccard", "newman", "hive"):
        full = project_matrix(a, weight=weight)
        cut = float(np.median(full.data))
        got = project_matrix(a, weight=weight, min_weight=cut)
        want = full.copy()
        want.data[want.data < cut] = 0
        want.eliminate_zeros()
        assert (got != want).nnz == 0 and got.nnz == want.nnz
        for k in (1, 3, 10):
            got = project_matrix(a, weight=weight, top_k=k, min_weight=cut)
            assert (got != top_k_reference(want, k)).nnz == 0


def top_k_reference(h, k):
    """Keep the k heaviest entries per row; ties broken by the smaller column."""
    h = sp.csr_matrix(h)
    rows, cols, vals = [], [], []
    for u in range(h.shape[0]):
        c = h.indices[h.indptr[u] : h.indptr[u + 1]]
        w = h.data[h.indptr[u] : h.indptr[u + 1]]
        order = sorted(range(c.size), key=lambda i: (-w[i], c[i]))[:k]
        rows += [u] * len(order)
        cols += [int(c[i]) for i in order]
        vals += [w[i] for i in order]
    return sp.csr_matrix((vals, (rows, cols)), shape=h.shape)


def test_top_k_ties_prefer_smaller_columns():
    # column 0 shares one neighbour with each of columns 1..4: all ties at count 1
    a = sp.csr_matrix(
        np.array([[1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 0, 1]])
    )
    h = project_matrix(a, top_k=2)
    assert h[0].indices.tolist() == [1, 2]


def test_self_loops_and_report_counts():
    a = random_bipartite(10)
    res = project(SerialComm(), a, weight="count")
    keep = project(SerialComm(), a, weight="count", self_loops="keep")
    assert res.nnz == res.matrix.nnz and keep.nnz == keep.matrix.nnz
    assert res.nnz == res.matrix.nnz and keep.nnz == keep.matrix.nnz
    assert keep.nnz == res.nnz_with_self_loops == res.nnz + res.diagonal
    assert keep.nnz_without_self_loops == res.nnz
    assert res.diagonal == int((np.diff(sp.csc_matrix(a).indptr) > 0).sum())


@pytest.mark.parametrize("weight", WEIGHTS)
def test_tiny_chunks_give_identical_output(weight):
    a = random_bipartite(11, 90, 60, 1200)
    ref = project(SerialComm(), a, weight=weight)
    tiny = project(SerialComm(), a, weight=weight, memory_per_rank="4K", threads=2)
    assert tiny.ranks["chunks"][0] > 5
    assert (tiny.matrix != ref.matrix).nnz == 0
    assert np.array_equal(tiny.matrix.indices, ref.matrix.indices)


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("shape", [(90, 60, 1200), (200, 2000, 1500)])
def test_every_kernel_path_gives_identical_output(weight, shape):
    # the tuning ratios pick a row's path (plain increments; columns marked in a bitmap while
    # counting, count family; or listed first touches, emitted by sweeping the range or in
    # the order of a bitmap scan or a sort: sparse rows over many columns sort): the output
    # must not depend on it
    a = random_bipartite(12, *shape)
    # (dense, sweep, mark): dense; marked; listed + sweep; listed + order
    paths = [(1e9, 1.0, 1.0), (1e-9, 1.0, 1e9), (1e-9, 1e9, 1e-9), (1e-9, 1e-9, 1e-9)]
    upper = {"triangle": "full" if weight == "hive" else "upper"}  # hive is not symmetric
    for opts in ({}, upper, {"self_loops": "keep"}, {"top_k": 3},
                 {"min_weight": 2.0 if weight == "count" else 0.1, "top_k": 5}):  # fmt: skip
        ref = project_matrix(a, weight=weight, **opts)
        assert ref.nnz or opts
        for dense, sweep, mark in paths:
            got = project_matrix(
                a, weight=weight, dense_ratio=dense, sweep_ratio=sweep, mark_ratio=mark, **opts
            )
            assert np.array_equal(got.indptr, ref.indptr), (opts, dense, sweep, mark)
            assert np.array_equal(got.indices, ref.indices)
            assert np.array_equal(got.data, ref.data) and got.data.dtype == ref.data.dtype


def test_memory_bound_too_small_is_a_usage_error():
    a = random_bipartite(12)
    with pytest.raises(UsageError, match="too small"):
        project_matrix(a, memory_per_rank="100")
    with pytest.raises(UsageError, match="memory size"):
        project_matrix(a, memory_per_rank="lots")


def test_option_errors():
    a = random_bipartite(13)
    with pytest.raises(UsageError, match="unknown weight"):
        project_matrix(a, weight="cosinus")
    with pytest.raises(UsageError, match="top-k"):
        project_matrix(a, top_k=3, triangle="upper")
    neg = a.copy()
    neg.data[0] = -1
    with pytest.raises(UsageError, match="positive"):
        project_matrix(neg, weight="hive")


@pytest.mark.parametrize("kwargs", [{"top_k": 2.5}, {"top_k": True}, {"threads": 1.5},
                                    {"top_k": "3"}])  # fmt: skip
def test_counts_that_are_not_integers_are_refused(kwargs):
    """``top_k=2.5`` was a top 2 without a word (``int()``), ``threads=1.5`` one thread."""
    with pytest.raises(UsageError, match="must be an integer"):
        project_matrix(random_bipartite(13), **kwargs)


def test_rmat_count_matches_scipy():
    a = rmat(9, 8, seed=3)
    ref = sp.csr_matrix(a.T @ a)
    ref.setdiag(0)
    ref.eliminate_zeros()
    h = project_matrix(a, threads=2)
    assert (h != ref).nnz == 0
    up = project_matrix(a, triangle="upper", threads=2)
    assert (up != sp.triu(ref, k=1)).nnz == 0


def test_input_is_canonicalised_without_touching_the_callers_matrix():
    """Duplicates are summed, explicit zeros dropped, unsorted rows sorted: on a copy."""
    a = random_bipartite(16, 50, 30, 400)
    coo = a.tocoo()
    # every entry twice (halves), one explicit zero, rows reversed
    rows = np.concatenate([coo.row, coo.row, [0]])
    cols = np.concatenate([coo.col, coo.col, [int(np.setdiff1d(np.arange(30), a[0].indices)[0])]])
    vals = np.concatenate([coo.data / 2, coo.data / 2, [0.0]])
    order = np.lexsort((-cols, rows))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=50))])
    messy = sp.csr_matrix((vals[order], cols[order], indptr), shape=a.shape)
    assert not messy.has_canonical_format
    saved = [messy.indptr.copy(), messy.indices.copy(), messy.data.copy()]
    for weight in ("count", "product", "jaccard"):
        got = project_matrix(messy, weight=weight)
        assert (got != project_matrix(a, weight=weight)).nnz == 0
    now = [messy.indptr, messy.indices, messy.data]
    assert all(np.array_equal(x, y) for x, y in zip(saved, now))


@pytest.mark.parametrize(
    "acc_t,idx_t,val_t",
    [
        (np.int32, np.int32, np.int32),
        (np.int64, np.int64, np.int64),
        (np.int32, np.int64, np.float64),
        (np.int64, np.int32, np.int32),
    ],
)
def test_sweep16_emits_nonzeros_in_column_order(acc_t, idx_t, val_t):
    from numba import njit

    from mpisdnn.projection._simd import sweep16

    @njit
    def sweep(a, v, oi, od, pos):
        return sweep16(a, v, oi, od, pos)

    rng = np.random.default_rng(0)
    for trial in range(20):
        a = (rng.integers(0, 2, 64) * rng.integers(1, 2**20, 64)).astype(acc_t)
        a[16 + trial % 16] = 0 if trial % 2 else 5
        before = a.copy()
        oi = np.full(40, -1, idx_t)
        od = np.full(40, -1, val_t)
        k = sweep(a, 16, oi, od, 3)
        cols = np.flatnonzero(before[16:32]) + 16
        assert k == cols.size
        assert oi[3 : 3 + k].tolist() == cols.tolist()
        assert od[3 : 3 + k].tolist() == before[cols].tolist()
        assert (oi[:3] == -1).all() and (oi[3 + k :] == -1).all()  # nothing outside
        assert (od[:3] == -1).all() and (od[3 + k :] == -1).all()
        assert not a[16:32].any()  # cleared
        assert np.array_equal(a[:16], before[:16]) and np.array_equal(a[32:], before[32:])


@pytest.mark.parametrize("weight", ["count", "jaccard", "product"])
def test_64bit_index_path_gives_identical_results(tmp_path, weight):
    """The int64 index/count path (taken past 2**31 columns or entries), forced on a small
    graph: same rows, same values, int64 arrays, also streamed through HDF5."""

    a = rmat(8, 8, seed=5)
    ref = project_matrix(a, weight=weight, threads=2)
    res = project(SerialComm(), a, weight=weight, self_loops="drop", threads=2, wide=True)
    # scipy narrows the index arrays of a small matrix again; the kernel ran 64-bit
    assert res.index_dtype == "int64"
    if weight == "count":
        assert res.value_dtype == "int64"
    wide = res.matrix
    assert np.array_equal(wide.indptr, ref.indptr) and np.array_equal(wide.indices, ref.indices)
    assert np.array_equal(wide.data, ref.data)
    out = tmp_path / "h.h5"
    res = project(
        SerialComm(), a, weight=weight, output=out, memory_per_rank="64K", threads=2, wide=True
    )
    assert res.index_dtype == "int64" and res.ranks["chunks"][0] > 1
    back = read_projection(out)
    assert np.array_equal(back.indices, ref.indices) and np.array_equal(back.data, ref.data)
    # the upper triangle reads int64 positions of B^T's entries in B; so does its top-k
    up = project(SerialComm(), a, weight=weight, triangle="upper", threads=2, wide=True).matrix
    want = sp.triu(ref, k=1, format="csr")
    want.sort_indices()
    assert np.array_equal(up.indptr, want.indptr) and np.array_equal(up.indices, want.indices)
    assert np.array_equal(up.data, want.data)
    top = project(SerialComm(), a, weight=weight, top_k=5, top_k_upper=True, wide=True).matrix
    assert same_csr(top, project_matrix(a, weight=weight, top_k=5, top_k_upper=False))


# --- outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["h5", "mtx", "tsv"])
@pytest.mark.parametrize("weight", ["count", "jaccard"])
def test_output_larger_than_chunk_bound_round_trips(tmp_path, ext, weight):
    a = random_bipartite(14, 120, 80, 2000)
    ref = project_matrix(a, weight=weight)
    out = tmp_path / f"h.{ext}"
    res = project(SerialComm(), a, weight=weight, memory_per_rank="8K", output=out, threads=2)
    assert res.ranks["chunks"][0] > 3
    assert ref.nnz * 8 > 4 * 8192  # the output is several times the memory bound
    back = read_projection(out)
    assert back.shape == ref.shape and back.nnz == ref.nnz
    assert np.array_equal(back.indptr, ref.indptr) and np.array_equal(back.indices, ref.indices)
    assert np.array_equal(back.data, ref.data)  # exact, also for floats in text
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_iter_projection_streams_whole_rows(tmp_path):
    a = random_bipartite(15, 100, 70, 1500)
    ref = project_matrix(a, weight="count")
    project(SerialComm(), a, output=tmp_path / "h.h5")
    blocks = list(iter_projection(tmp_path / "h.h5", max_entries=500))
    assert len(blocks) > 3
    assert all(b.nnz <= 500 or b.shape[0] == 1 for _, b in blocks)
    assert [s for s, _ in blocks] == np.cumsum([0] + [b.shape[0] for _, b in blocks[:-1]]).tolist()
    assert (sp.vstack([b for _, b in blocks]) != ref).nnz == 0


def test_one_based_tsv_output(tmp_path):
    a = random_bipartite(16)
    project(SerialComm(), a, output=tmp_path / "h.tsv", index_base=1)
    text = (tmp_path / "h.tsv").read_text().splitlines()
    assert text[0].startswith("# mpisdnn projection") and "base=1" in text[0]
    ref = project_matrix(a)
    first = ref.tocoo()
    assert text[1] == f"{first.row[0] + 1}\t{first.col[0] + 1}\t{first.data[0]}"
    assert (read_projection(tmp_path / "h.tsv") != ref).nnz == 0


def test_bad_mtx_output_names_file_and_line(tmp_path):
    out = tmp_path / "h.mtx"
    project(SerialComm(), random_bipartite(16), output=out)
    lines = out.read_text().splitlines()  # banner, options comment, size line, entries
    lines[3] = "1 x 2"
    out.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"h\.mtx:4: "):
        read_projection(out)


# --- inputs ---------------------------------------------------------------------------------


def test_mtx_variants(tmp_path):
    p = tmp_path / "g.mtx"
    p.write_text(
        "%%MatrixMarket matrix coordinate integer symmetric\n% c\n3 3 3\n1 1 2\n2 1 5\n3 2 7\n"
    )
    g = read_graph(p)
    assert g.weighted
    np.testing.assert_array_equal(g.matrix.toarray(), [[2, 5, 0], [5, 0, 7], [0, 7, 0]])
    p.write_text("%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n")
    g = read_graph(p)
    assert not g.weighted and g.matrix.toarray().tolist() == [[0, 0, 1], [1, 0, 0]]
    p.write_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 0.5\n2 2 0\n")
    assert read_graph(p).matrix.nnz == 1  # a stored zero is no edge


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n",
            r"g\.mtx:1: only 'coordinate'",
        ),
        ("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n", "complex"),
        ("hello\n", r"g\.mtx:1: not a Matrix Market"),
        ("%%MatrixMarket matrix coordinate real general\n2 2\n", r"g\.mtx:2: size line"),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n1 x 1\n",
            r"g\.mtx:4: column index must be an integer",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n3 1 1\n",
            r"g\.mtx:4: row index",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n2 1\n",
            r"g\.mtx:4: 2 fields, expected 3",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 1\n",
            "says 3 entries, found 1",
        ),
        ("%%MatrixMarket matrix coordinate real symmetric\n2 2 1\n1 2 1\n", r"g\.mtx:3: entry"),
    ],
)
def test_bad_mtx_names_file_and_line(tmp_path, text, match):
    p = tmp_path / "g.mtx"
    p.write_text(text)
    with pytest.raises(InputError, match=match):
        read_graph(p)


def test_edge_lists_and_ratings(tmp_path):
    (tmp_path / "e.tsv").write_text("# comment\n0\t1\n2\t0\n\n1\t1\n")
    g = read_graph(tmp_path / "e.tsv")
    assert g.matrix.shape == (3, 2) and not g.weighted and g.matrix.nnz == 3
    (tmp_path / "e.csv").write_text("src,dst,w\n1,2,0.5\n2,1,1.5\n")
    g = read_graph(tmp_path / "e.csv", index_base=1, skip_lines=1)
    assert g.weighted and g.matrix.toarray().tolist() == [[0, 0.5], [1.5, 0]]
    (tmp_path / "r.dat").write_text("1::10::5::978300760\n2::10::3::978302109\n1::3::4::9\n")
    g = read_graph(tmp_path / "r.dat")
    assert g.matrix.shape == (2, 10) and g.matrix[0, 9] == 5 and g.matrix[0, 2] == 4
    (tmp_path / "r.csv").write_text("userId,movieId,rating,timestamp\n1,1,4.0,9\n2,1,3.5,9\n")
    g = read_graph(tmp_path / "r.csv", fmt="ratings", skip_lines=1)
    assert g.matrix[:, 0].toarray().ravel().tolist() == [4.0, 3.5]
    (tmp_path / "d.tsv").write_text("0 1 1\n0 1 2\n")
    assert read_graph(tmp_path / "d.tsv").matrix[0, 1] == 3
    with pytest.raises(InputError, match=r"d\.tsv:2: duplicate edge"):
        read_graph(tmp_path / "d.tsv", duplicates="error")


@pytest.mark.parametrize(
    "name, text, kwargs, match",
    [
        ("e.tsv", "0 1\n0 x\n", {"ids": "index"}, r"e\.tsv:2: target id 'x' is not"),
        ("e.tsv", "0 1\n0 1 2 3\n", {}, r"e\.tsv:2: 4 fields, expected 2"),
        ("e.tsv", "0 1 2 3\n", {}, r"e\.tsv:1: 4 fields in a blank-separated line"),
        ("e.tsv", "# c\n0 1\n-1 2\n", {}, r"e\.tsv:3: source index must be an integer >= 0"),
        # 1.5 is no integer: text in auto (a label, exact), refused as an index
        ("e.tsv", "0 1\n1.5 2\n", {"ids": "index"}, r"e\.tsv:2: source id '1.5' is not"),
        ("e.tsv", "1 1 nan\n", {}, r"e\.tsv:1: weight is nan"),
        (
            "e.tsv",
            "0 1\n0 1\n",
            {"index_base": 1},
            r"e\.tsv:1: source index must be an integer >= 1",
        ),
        ("r.dat", "1::2::5\n2::x::1\n", {"ids": "index"}, r"r\.dat:2: item id 'x' is not"),
        ("r.dat", "1 2\n", {}, r"r\.dat:1: 2 fields in a blank-separated line, expected 3"),
        ("r.dat", "u i r t\n1 2 3 4\n", {"header": False}, r"r\.dat:1: blank-separated fields"),
        ("e.tsv", "", {}, "no edges"),
    ],
)
def test_bad_edge_lists_name_file_and_line(tmp_path, name, text, kwargs, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=match):
        read_graph(tmp_path / name, **kwargs)


def test_header_skip_keeps_line_numbers(tmp_path):
    (tmp_path / "r.csv").write_text("userId,movieId,rating\n1,1,4\n1,x,4\n")
    with pytest.raises(InputError, match=r"r\.csv:3: item id .x. is not an integer"):
        read_graph(tmp_path / "r.csv", fmt="ratings", skip_lines=1, ids="index")


@pytest.mark.parametrize("ext", ["h5", "mtx", "tsv", "csv"])
def test_graph_write_read_round_trip(tmp_path, ext):
    a = random_bipartite(17, weights="uniform")
    write_graph(tmp_path / f"g.{ext}", a)
    g = read_graph(tmp_path / f"g.{ext}", shape=a.shape if ext in ("tsv", "csv") else None)
    assert g.weighted and (g.matrix != a).nnz == 0


def test_bad_graph_h5(tmp_path):
    import h5py

    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.attrs["format"] = "something.else"
    with pytest.raises(InputError, match="not an mpisdnn.graph"):
        read_graph(tmp_path / "x.h5")
    write_graph(tmp_path / "g.h5", random_bipartite(18))
    with h5py.File(tmp_path / "g.h5", "a") as f:
        f["indptr"][-1] = 5
    with pytest.raises(InputError, match="indptr"):
        read_graph(tmp_path / "g.h5")


# --- generators and planning -----------------------------------------------------------------


def test_generators_are_seeded_and_exact():
    a, b = bipartite(50, 40, edges=300, seed=1), bipartite(50, 40, edges=300, seed=1)
    assert a.nnz == 300 and (a != b).nnz == 0
    assert (bipartite(50, 40, edges=300, seed=2) != a).nnz > 0
    assert bipartite(10, 10, density=0.5, seed=0).nnz == 50
    big = bipartite(100_000, 100_000, edges=5000, seed=3)  # sparse path (oversampling)
    assert big.nnz == 5000 and big.has_canonical_format
    with pytest.raises(UsageError):
        bipartite(5, 5, edges=26)


def test_rmat_graph500_shape():
    g = rmat(10, 16, seed=1)
    assert g.shape == (1024, 1024)
    assert (g != g.T).nnz == 0 and g.diagonal().sum() == 0 and np.all(g.data == 1)
    assert 0.5 * 2 * 16 * 1024 < g.nnz <= 2 * 16 * 1024  # minus duplicates and loops
    deg = np.diff(g.indptr)
    assert deg.max() > 20 * deg.mean()  # skewed degrees
    d = rmat(10, 16, seed=1, directed=True, keep_self_loops=True, keep_duplicates=True)
    assert d.data.sum() == 16 * 1024 and d.data.max() > 1
    assert (rmat(10, 16, seed=1) != g).nnz == 0
    unscrambled = rmat(10, 16, seed=1, scramble=False)
    # without the permutation, vertex 0 (all bits "a") is the hub
    assert np.argmax(np.diff(unscrambled.indptr)) == 0


def test_plan_work_and_chunks():
    a = sp.csr_matrix(np.array([[1, 1, 1], [0, 1, 1], [1, 0, 0]]))
    full = plan.row_work(a.indptr, a.indices, 3)
    # row u: sum of deg(k) over the rows k that hold u
    assert full.tolist() == [3 + 1, 3 + 2, 3 + 2]
    up = plan.row_work(a.indptr, a.indices, 3, "upper")
    assert up.tolist() == [2, 1 + 1, 0]
    up_diag = plan.row_work(a.indptr, a.indices, 3, "upper", keep_diag=True)
    assert up_diag.tolist() == [3 + 1, 2 + 2, 1 + 1]
    # a random matrix against the definition
    r = sp.random(30, 20, 0.2, format="csr", random_state=3)
    deg = np.diff(r.indptr)
    want = np.zeros(20, np.int64)
    want_up = np.zeros(20, np.int64)
    for k in range(30):
        cols = r.indices[r.indptr[k] : r.indptr[k + 1]]
        want[cols] += deg[k]
        for u in cols:
            want_up[u] += int((cols > u).sum())
    assert plan.row_work(r.indptr, r.indices, 20).tolist() == want.tolist()
    assert plan.row_work(r.indptr, r.indices, 20, "upper").tolist() == want_up.tolist()
    assert plan.row_bounds(full, np.arange(3), 3, "full", False, top_k=2).tolist() == [2, 2, 2]
    assert chunk_rows([3, 3, 3, 10, 1], 6).tolist() == [0, 2, 3, 4, 5]
    assert parse_size("64M") == 64 << 20 and parse_size("1.5g") == 3 << 29


# --- a new weighting is one record ----------------------------------------------------------


def _salton(g, u, v):
    """Salton's index: shared neighbours over the geometric mean of the degrees."""
    return len(set(g[u]) & set(g[v])) / np.sqrt(len(g[u]) * len(g[v]))


def test_a_new_weighting_is_one_record(monkeypatch):
    """Registering one record (here, inside the test only: Salton's index, run by the
    kernel's binary-cosine mode with the degrees' roots as norms) makes the weighting
    known to the options, the kernels' dispatch, the diagonal count and the command line."""
    from mpisdnn.cli import build_parser
    from mpisdnn.projection import SYMMETRIC_WEIGHTINGS, WEIGHTINGS
    from mpisdnn.projection import _kernels as K
    from mpisdnn.projection import weightings as W

    # the registry's kernel modes are the kernels' own
    assert (W.COUNT, W.RATIO, W.JACCARD, W.OVERLAP, W.PRODUCT, W.NEWMAN, W.HIVE, W.COSINE,
            W.BCOSINE) == (K.COUNT, K.RATIO, K.JACCARD, K.OVERLAP, K.PRODUCT, K.NEWMAN,
                           K.HIVE, K.COSINE, K.BCOSINE)  # fmt: skip
    salton = W.Weighting(
        "salton", W.BCOSINE, lambda b, d, kfac, nrm: d / (nrm * nrm),
        norms=lambda deg, sq: np.sqrt(deg.astype(np.float64)),
    )  # fmt: skip
    monkeypatch.setitem(W.WEIGHTINGS, "salton", salton)
    assert "salton" in WEIGHTINGS and "salton" in SYMMETRIC_WEIGHTINGS
    a = random_bipartite(5)  # weighted: salton counts shared neighbours, weights ignored
    for onto in ("cols", "rows"):
        g = nx_bipartite(a)
        side = "c" if onto == "cols" else "r"
        h = nxb.generic_weighted_projected_graph(g, [n for n in g if n[0] == side], _salton)
        want = {(min(u[1], v[1]), max(u[1], v[1])): d["weight"] for u, v, d in h.edges(data=True)}
        got = project_matrix(a, weight="salton", onto=onto)
        assert_same_edges(as_dict(got), want)
        up = project_matrix(a, weight="salton", onto=onto, triangle="upper")
        assert_same_edges(as_dict(up), want)
    # scipy: counts over the roots of the degrees; the diagonal (1.0) counted in the report
    b = sp.csr_matrix(a)
    b.data[:] = 1
    c = (b.T @ b).toarray()
    d = np.sqrt(np.diag(c))
    res = project(SerialComm(), a, weight="salton", self_loops="keep")
    np.testing.assert_allclose(res.matrix.toarray(), c / np.outer(d, d), rtol=1e-12)
    assert res.diagonal == int(np.count_nonzero(np.diag(c)))
    # the command line offers it
    args = build_parser().parse_args(["project", "g.h5", "--weight", "salton"])
    assert args.weight == "salton"
    with pytest.raises(UsageError, match="unknown weight"):
        project_matrix(a, weight="sorensen")
