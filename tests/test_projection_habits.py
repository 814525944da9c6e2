"""docs/projection.md "Coming from networkx, pandas or DuckDB": every line of the table, run
both ways, the same result."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import InputError
from mpisdnn.projection import Graph, project_matrix, read_graph, read_projection
from tests.test_projection_cli import run_cli

pd = pytest.importorskip("pandas")

DF = pd.DataFrame(
    {
        "user": ["ann", "ann", "bob", "bob", "cy", "cy", "dee"],
        "book": ["b:1", "b,2", "b:1", "b;3", "b,2", "b;3", "b:1"],
        "stars": [5, 3, 4, 2, 1, 5, 4],
    }
)
BOOKS = sorted(set(DF.book))


def _pairs(h_nx):
    out = {}
    for u, v, d in h_nx.edges(data=True):
        out[(u, v)] = out[(v, u)] = d["weight"]
    return out


def _ours(h):
    return {(h.labels[r], h.labels[c]): v for r, c, v in zip(*sp.find(h))}


def test_edge_list_from_a_dataframe_and_projection():
    b = nx.from_pandas_edgelist(DF, "user", "book")
    g = Graph.from_edges(DF, source="user", target="book")
    assert set(g.col_labels) == set(BOOKS) and set(g.row_labels) == set(DF.user)
    assert g.nnz == b.number_of_edges()
    ref = _pairs(nx.bipartite.weighted_projected_graph(b, BOOKS))
    assert _ours(project_matrix(g)) == ref


def test_weighted_edges_keep_the_attribute():
    b = nx.from_pandas_edgelist(DF, "user", "book", edge_attr="stars")
    g = Graph.from_edges(DF, source="user", target="book", weight="stars")
    for u, v, d in b.edges(data=True):
        user, book = (u, v) if u in set(DF.user) else (v, u)
        i = list(g.row_labels).index(user)
        j = list(g.col_labels).index(book)
        assert g.matrix[i, j] == d["stars"]


@pytest.mark.parametrize("weight, fn", [
    ("jaccard", lambda b: nx.bipartite.overlap_weighted_projected_graph(b, BOOKS)),
    ("newman", lambda b: nx.bipartite.collaboration_weighted_projected_graph(b, BOOKS)),
])  # fmt: skip
def test_jaccard_and_newman_weights(weight, fn):
    b = nx.from_pandas_edgelist(DF, "user", "book")
    ref = _pairs(fn(b))
    got = _ours(project_matrix(Graph.from_edges(DF, source="user", target="book"), weight=weight))
    assert got.keys() == ref.keys()
    assert all(np.isclose(got[k], ref[k]) for k in ref)


def test_onto_rows_projects_the_sources():
    b = nx.from_pandas_edgelist(DF, "user", "book")
    ref = _pairs(nx.bipartite.weighted_projected_graph(b, sorted(set(DF.user))))
    got = _ours(project_matrix(Graph.from_edges(DF, source="user", target="book"), onto="rows"))
    assert got == ref


def test_back_to_a_dataframe_and_to_scipy():
    b = nx.from_pandas_edgelist(DF, "user", "book")
    ref = nx.to_pandas_edgelist(nx.bipartite.weighted_projected_graph(b, BOOKS))
    h = project_matrix(Graph.from_edges(DF, source="user", target="book"))
    df = h.to_pandas()
    assert list(df.columns) == ["source", "target", "weight"]
    both = {(a, c, w) for a, c, w in zip(ref.source, ref.target, ref.weight)}
    both |= {(c, a, w) for a, c, w in both}
    assert set(zip(df.source, df.target, df.weight)) == both
    nodes = list(h.labels)
    ref_mat = nx.to_scipy_sparse_array(nx.bipartite.weighted_projected_graph(b, BOOKS), nodes)
    assert (sp.csr_matrix(ref_mat) != h.to_scipy()).nnz == 0


def test_read_a_tsv_like_pandas_with_str_ids(tmp_path):
    src = tmp_path / "e.tsv"
    src.write_text("".join(f"{u}\t{b}\n" for u, b in zip(DF.user, DF.book)))
    frame = pd.read_csv(src, sep="\t", header=None, dtype=str)
    g = read_graph(src)
    assert list(g.col_labels) == sorted(set(frame[1]))
    assert list(g.row_labels) == sorted(set(frame[0]))


def test_a_csv_with_a_header(tmp_path):
    src = tmp_path / "r.csv"
    DF.assign(user=range(1, 8), book=[10, 20, 10, 30, 20, 30, 10]).to_csv(src, index=False)
    frame = pd.read_csv(src)
    g = read_graph(src, fmt="ratings")
    assert g.header == tuple(frame.columns) and g.nnz == len(frame)


def test_projection_to_parquet_read_by_pandas_and_duckdb(tmp_path):
    pytest.importorskip("pyarrow")
    src = tmp_path / "e.tsv"
    src.write_text("".join(f"{u}\t{b}\n" for u, b in zip(DF.user, DF.book)))
    out = tmp_path / "H.parquet"
    r = run_cli(["project", src, "-o", out, "--quiet"], ranks=2)
    assert r.returncode == 0, r.stderr
    frame = pd.read_parquet(out)
    b = nx.from_pandas_edgelist(DF, "user", "book")
    ref = _pairs(nx.bipartite.weighted_projected_graph(b, BOOKS))
    assert dict(zip(zip(frame.u_label, frame.v_label), frame.weight)) == ref
    mat, (labels, _) = read_projection(out, with_labels=True)
    assert {(labels[r], labels[c]): v for r, c, v in zip(*sp.find(mat))} == ref
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(
        f"SELECT u_label, v_label, weight FROM read_parquet('{out}/*.parquet')"
    ).fetchall()
    assert {(a, c): w for a, c, w in rows} == ref


def test_a_table_to_project_matrix():
    h = project_matrix(DF.rename(columns={"user": "source", "book": "target"}))
    assert set(h.labels) == set(BOOKS)
    with pytest.raises(InputError, match="'source' and 'target'"):
        project_matrix(DF)
