"""Item similarity as recommender users run it: ``cosine`` (binary and rating-weighted) and the
fused ``top_k`` (a bounded heap per row in the kernel), against plain scipy, serially and at
1-3 ranks (``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi``)."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import UsageError
from mpisdnn.generate.graphs import bipartite
from mpisdnn.projection import SerialComm, project, project_matrix

from .conftest import same_csr


def scipy_cosine(a, keep=False):
    """``<a_u, a_v> / (|a_u| |a_v|)`` from scipy's ``AᵀA`` and the column norms."""
    a = sp.csr_matrix(a, dtype=np.float64)
    h = sp.csr_matrix(a.T @ a)
    nrm = np.sqrt(np.asarray(a.multiply(a).sum(axis=0)).ravel())
    inv = sp.diags(np.divide(1.0, nrm, out=np.zeros_like(nrm), where=nrm > 0))
    h = sp.csr_matrix(inv @ h @ inv)
    if not keep:
        h.setdiag(0)
    h.eliminate_zeros()
    h.sort_indices()
    return h


def exact_binary(a, weight, keep=False):
    """Binary cosine and Jaccard from scipy's integer counts with the kernel's float formulas
    (``c / (sqrt(du) sqrt(dv))``, ``c / (du + dv - c)``), so ties are exact ties."""
    p = sp.csr_matrix((sp.csr_matrix(a) != 0).astype(np.int64))
    c = sp.coo_matrix(p.T @ p)
    deg = np.asarray(p.sum(axis=0)).ravel().astype(np.float64)
    cf = c.data.astype(np.float64)
    if weight == "cosine":
        w = cf / (np.sqrt(deg[c.row]) * np.sqrt(deg[c.col]))
    else:
        w = cf / (deg[c.row] + deg[c.col] - cf)
    h = sp.csr_matrix((w, (c.row, c.col)), shape=c.shape)
    if not keep:
        h.setdiag(0)
    h.eliminate_zeros()
    h.sort_indices()
    return h


def top_k_rows(h, k):
    """The k heaviest entries of every row, ties broken by the smaller column, column order."""
    h = sp.csr_matrix(h)
    rows, cols, vals = [], [], []
    for u in range(h.shape[0]):
        c = h.indices[h.indptr[u] : h.indptr[u + 1]]
        w = h.data[h.indptr[u] : h.indptr[u + 1]]
        keep = sorted(sorted(range(c.size), key=lambda i: (-w[i], c[i]))[:k], key=lambda i: c[i])
        rows += [u] * len(keep)
        cols += [int(c[i]) for i in keep]
        vals += [w[i] for i in keep]
    out = sp.csr_matrix((vals, (rows, cols)), shape=h.shape)
    out.sort_indices()
    return out


def tied_graph():
    """Binary graph whose rows tie a lot: 12 columns, users rating blocks of columns, so many
    pairs share the same count, degrees and hence the same cosine and Jaccard."""
    rows = []
    for s in range(12):
        for width in (3, 4):
            rows.append([(s + j) % 12 for j in range(width)])
    rows += [[0, 6], [3, 9], [1, 5, 7, 11]]
    r = np.repeat(np.arange(len(rows)), [len(x) for x in rows])
    c = np.concatenate(rows)
    return sp.csr_matrix((np.ones(c.size), (r, c)), shape=(len(rows), 12))


# --- cosine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", ["rating", "one"])
@pytest.mark.parametrize("keep", [False, True])
def test_cosine_equals_scipy(weights, keep):
    a = bipartite(120, 70, edges=1500, seed=31, weights=weights)
    self_loops = "keep" if keep else "drop"
    h = project_matrix(a, weight="cosine", self_loops=self_loops)
    want = scipy_cosine(a, keep)
    assert np.array_equal(h.indptr, want.indptr) and np.array_equal(h.indices, want.indices)
    np.testing.assert_allclose(h.data, want.data, rtol=1e-14)
    if weights == "one":  # integer counts, the same formula: the same bits
        assert same_csr(h, exact_binary(a, "cosine", keep))
    up = project_matrix(a, weight="cosine", self_loops=self_loops, triangle="upper")
    assert same_csr(up, sp.triu(h, k=0 if keep else 1).tocsr())


def test_binary_cosine_kernel_equals_the_float_kernel():
    # weights all 1 run on integer counts (mode 8); weights all 2 on float sums (mode 7):
    # scaling by a power of two is exact, so both must give the same bits
    a = bipartite(150, 90, edges=2500, seed=32, weights="one")
    one = project_matrix(a, weight="cosine", self_loops="keep")
    two = project_matrix(2 * a, weight="cosine", self_loops="keep")
    assert same_csr(one, two)
    res = project(SerialComm(), a, weight="cosine", self_loops="keep")
    assert res.diagonal == int((np.diff(sp.csc_matrix(a).indptr) > 0).sum())
    assert one.dtype == np.float64


def test_cosine_min_weight_keeps_the_diagonal_as_computed():
    a = bipartite(80, 50, edges=900, seed=33, weights="rating")
    full = project(SerialComm(), a, weight="cosine", self_loops="keep")
    cut = project(SerialComm(), a, weight="cosine", self_loops="keep", min_weight=0.5)
    want = full.matrix.copy()
    want.data[want.data < 0.5] = 0
    want.eliminate_zeros()
    assert same_csr(cut.matrix, want)
    assert cut.nnz == want.nnz and cut.diagonal == int(np.count_nonzero(want.diagonal()))


def test_cosine_rejects_weights_whose_norm_underflows():
    a = sp.csr_matrix(np.array([[1e-200, 1.0], [0.0, 1.0]]))
    with pytest.raises(UsageError, match="underflows"):
        project_matrix(a, weight="cosine")


# --- fused top-k ----------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("weight", ["cosine", "jaccard", "count"])
def test_top_k_with_ties_equals_scipy_then_per_row_top_k(weight, upper):
    # upper: the rows from the upper triangle, each entry offered to both rows' heaps
    a = tied_graph()
    full = exact_binary(a, weight) if weight != "count" else None
    if full is None:
        p = sp.csr_matrix(a.T @ a).astype(np.int64)
        p.setdiag(0)
        p.eliminate_zeros()
        full = p
    # the graph must have ties at a cut for the test to mean anything
    r0 = np.sort(full[0].data)[::-1]
    assert any(r0[k - 1] == r0[k] for k in (1, 2, 3, 5) if k < r0.size)
    for k in (1, 2, 3, 5, 11, 50):
        got = project_matrix(a, weight=weight, top_k=k, top_k_upper=upper, threads=2)
        want = top_k_rows(full, k)
        assert np.array_equal(got.indptr, want.indptr), k
        assert np.array_equal(got.indices, want.indices), k
        assert np.array_equal(got.data, want.data.astype(got.dtype)), k


def test_top_k_heap_on_long_rows_equals_the_full_row_cut():
    # long rows (hundreds of candidates for k = 20) through every kernel path
    a = bipartite(400, 300, edges=12000, seed=34, weights="rating")
    paths = [(1e9, 1.0, 1.0), (1e-9, 1.0, 1e9), (1e-9, 1e9, 1e-9), (1e-9, 1e-9, 1e-9)]
    for weight in ("cosine", "product", "jaccard", "hive"):
        want = top_k_rows(project_matrix(a, weight=weight), 20)
        for dense, sweep, mark in paths:
            for upper in (False, True):  # hive is not symmetric: always the fused heap
                got = project_matrix(
                    a, weight=weight, top_k=20, dense_ratio=dense, sweep_ratio=sweep,
                    mark_ratio=mark, top_k_upper=upper, threads=2,
                )  # fmt: skip
                assert same_csr(got, want), (weight, dense, sweep, mark, upper)


def test_top_k_from_the_upper_triangle_keeps_filters_and_the_diagonal():
    # min_weight cuts before the heaps, the diagonal is offered once; every symmetric weighting
    a = bipartite(60, 40, edges=700, seed=36, weights="rating")
    for weight in ("count", "product", "newman", "overlap", "ratio", "cosine", "jaccard"):
        full = project_matrix(a, weight=weight, self_loops="keep")
        cut = float(np.median(full.data))
        for keep, mw in (("keep", None), ("drop", cut)):
            ref = full.copy()
            if keep == "drop":
                ref.setdiag(0)
            if mw is not None:
                ref.data[ref.data < mw] = 0
            ref.eliminate_zeros()
            for k in (1, 50):
                opts = dict(weight=weight, top_k=k, self_loops=keep, min_weight=mw)
                got = project_matrix(a, top_k_upper=True, threads=2, **opts)
                assert same_csr(got, top_k_rows(ref, k)), (weight, keep, k)
                assert same_csr(got, project_matrix(a, top_k_upper=False, **opts))


def test_top_k_upper_only_where_it_applies_and_validated():
    from mpisdnn.projection.core import ProjectionOptions, _upper_top_k_rule

    def _upper_top_k(opts):  # the decision; no input, so no work computed
        upper, work = _upper_top_k_rule(opts)
        assert work is None
        return upper

    opts = ProjectionOptions(weight="jaccard", top_k=10, top_k_upper=True)
    assert _upper_top_k(opts)
    assert not _upper_top_k(opts.replace(weight="hive"))  # not symmetric: the fused heap
    assert not _upper_top_k(opts.replace(top_k_upper=False))
    assert not _upper_top_k(opts.replace(top_k=None))
    assert not _upper_top_k(opts.replace(top_k_upper=None))  # no input: no default rule
    with pytest.raises(UsageError, match="top_k_upper"):
        ProjectionOptions(top_k_upper="yes")


def test_top_k_from_the_upper_triangle_by_default_where_flops_dominate():
    from mpisdnn.projection.core import UPPER_TOP_K_FLOPS

    # 20 items of 200 users with 10 items each: 100 multiply-adds per possible entry
    dense = bipartite(400, 20, edges=4000, seed=38)
    # 300 items, 4 users each: a handful of multiply-adds per entry
    sparse = bipartite(400, 300, edges=1200, seed=39)
    for a, upper, mem in ((dense, True, None), (sparse, False, None), (dense, False, "16K")):
        for weight in ("jaccard", "cosine"):
            want = top_k_rows(exact_binary(a, weight), 5)
            res = project(SerialComm(), a, weight=weight, top_k=5, memory_per_rank=mem)
            assert res.extra["top_k_from_upper"] is upper, (weight, mem)
            assert same_csr(res.matrix, want), (weight, upper)
            if not upper:  # full rows (the rule's work reused where it ran): sum_k deg(k)^2
                assert res.extra["flops"] == int((np.diff(a.indptr) ** 2).sum()), (weight, mem)
    flops = np.diff(dense.indptr) ** 2
    assert flops.sum() >= UPPER_TOP_K_FLOPS * 20 * 20  # the rule's premise for `dense`


# --- MPI ------------------------------------------------------------------------------------


def _gather(comm, res):
    blocks = comm.allgather((res.row_start, res.matrix))
    return sp.vstack([m for _, m in sorted(blocks, key=lambda x: x[0])], format="csr")


@pytest.mark.mpi
def test_cosine_and_top_k_at_every_rank_count():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    tied = tied_graph()
    rated = bipartite(150, 80, edges=2400, seed=35, weights="rating")
    cases = [
        (tied, {"weight": "cosine", "top_k": 3}, top_k_rows(exact_binary(tied, "cosine"), 3)),
        (tied, {"weight": "jaccard", "top_k": 2}, top_k_rows(exact_binary(tied, "jaccard"), 2)),
        (rated, {"weight": "cosine", "top_k": 7}, None),
        (rated, {"weight": "cosine", "self_loops": "keep"}, None),
    ]
    for a, opts, want in cases:
        ref = project_matrix(a, **opts)
        if want is not None:
            assert same_csr(ref, want), opts
        else:
            full = scipy_cosine(a, opts.get("self_loops") == "keep")
            want = top_k_rows(full, opts["top_k"]) if "top_k" in opts else full
            assert np.array_equal(ref.indices, want.indices), opts
            np.testing.assert_allclose(ref.data, want.data, rtol=1e-14)
        for mem, upper in ((None, False), ("8K", False), ("8K", True)):
            res = project(comm, a, memory_per_rank=mem, threads=1, top_k_upper=upper, **opts)
            assert same_csr(_gather(comm, res), ref), (opts, mem, upper)


@pytest.mark.mpi
@pytest.mark.parametrize("ext", ["h5", "tsv"])
def test_top_k_from_the_upper_triangle_to_files_at_every_rank_count(tmp_path, ext):
    from mpi4py import MPI

    from mpisdnn.projection import read_projection

    comm = MPI.COMM_WORLD
    out = f"{comm.bcast(str(tmp_path), root=0)}/h.{ext}"
    a = bipartite(150, 80, edges=2400, seed=37, weights="rating")
    want = top_k_rows(scipy_cosine(a), 9)
    res = project(comm, a, weight="cosine", top_k=9, top_k_upper=True, output=out, threads=1)
    assert res.nnz == want.nnz
    back = read_projection(out)
    assert np.array_equal(back.indptr, want.indptr) and np.array_equal(back.indices, want.indices)
    np.testing.assert_allclose(back.data, want.data, rtol=1e-14)
    assert same_csr(back, project_matrix(a, weight="cosine", top_k=9, top_k_upper=False))
    comm.Barrier()
