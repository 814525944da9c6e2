"""The collective graph reader (issue 40): the ranks of a node parse consecutive byte ranges
and build one shared CSR; any world size and any grouping give the serial reader's graph and
its errors, and scipy's matrix.

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests``.
"""

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from mpisdnn.errors import InputError
from mpisdnn.formats.projection.graph import read_graph
from mpisdnn.parallel import AgreedError, split_color
from mpisdnn.projection import load as L
from mpisdnn.projection.load import load_graph

from .conftest import same_csr

pytestmark = pytest.mark.mpi


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _edges(seed=7, n=3000, dups=True):
    """Integer triples with repeated pairs spread over the whole file (so over every rank's
    range) and a few zero weights."""
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 300, n)
    c = rng.integers(0, 90, n)
    w = rng.integers(0, 6, n).astype(float) / 2
    if dups:
        k = rng.integers(0, n, n // 10)
        r[k[1:]], c[k[1:]] = r[k[:-1]], c[k[:-1]]
    return r, c, w


def _write(comm, tmp_path, name, text):
    d = comm.bcast(str(tmp_path), root=0)
    path = f"{d}/{name}"
    if comm.rank == 0:
        with open(path, "w") as fh:
            fh.write(text)
    comm.Barrier()
    return path


def _same_graph(g, ref):
    return (
        same_csr(g.matrix, ref.matrix)
        and g.matrix.indices.dtype == ref.matrix.indices.dtype
        and g.matrix.indptr.dtype == ref.matrix.indptr.dtype
        and (g.weighted, g.index_base, g.header, g.source)
        == (ref.weighted, ref.index_base, ref.header, ref.source)
    )


def _mtx_text(r, c, w, field="real"):
    lines = [f"%%MatrixMarket matrix coordinate {field} general", "% a comment",
             f"{r.max() + 1} {c.max() + 1} {r.size}"]  # fmt: skip
    for i, j, x in zip(r + 1, c + 1, w):
        lines.append(f"{i} {j}" if field == "pattern" else f"{i} {j} {x:g}")
    return "\n".join(lines) + "\n"


def _agreed_error(comm, path, *args, **kwargs) -> str:
    """The message the collective reader raises for ``path`` (one, agreed by every rank),
    checked to be the serial reader's own."""
    with pytest.raises(Exception) as serial:
        read_graph(path, *args, **kwargs)
    with pytest.raises(AgreedError) as agreed:
        load_graph(comm, path, *args, **kwargs)
    assert str(agreed.value) == str(serial.value)
    return str(agreed.value)


@pytest.mark.parametrize("field", ["real", "integer", "pattern"])
def test_mtx_with_repeats_equals_serial_reader_and_scipy(tmp_path, field):
    comm = _world()
    r, c, w = _edges()
    w = np.floor(w) if field == "integer" else w
    path = _write(comm, tmp_path, "g.mtx", _mtx_text(r, c, w, field))
    g, fmt = load_graph(comm, path)
    assert fmt == "mtx"
    assert _same_graph(g, read_graph(path))
    want = sp.csr_matrix(scipy.io.mmread(path), dtype=float)  # repeats added, like ours
    want.eliminate_zeros()
    if field == "pattern":  # a repeated pattern entry is one edge of weight 1 here
        want.data[:] = 1
    assert (g.matrix != want).nnz == 0


@pytest.mark.parametrize(("sep", "fmt"), [("\t", "tsv"), (",", "csv")])
def test_edge_list_with_repeats_equals_serial_reader_and_scipy(tmp_path, sep, fmt):
    comm = _world()
    r, c, w = _edges(seed=8)
    text = "u" + sep + "v" + sep + "w\n" + "".join(
        f"{i}{sep}{j}{sep}{x:g}\n" + ("\n" if k % 997 == 5 else "")  # blank lines skipped
        for k, (i, j, x) in enumerate(zip(r + 1, c + 1, w))
    )
    path = _write(comm, tmp_path, f"g.{fmt}", text)
    timings = {}
    g, _ = load_graph(comm, path, fmt, timings=timings, index_base=1)
    assert _same_graph(g, read_graph(path, fmt, index_base=1))
    assert g.header == ("u", "v", "w") and "whole" not in timings
    want = sp.coo_matrix((w, (r, c))).tocsr()
    want.sum_duplicates()
    want.eliminate_zeros()
    assert (g.matrix != want).nnz == 0


def test_unweighted_edge_list_and_auto_ids_equal_serial_reader(tmp_path):
    comm = _world()
    r, c, _ = _edges(seed=9)
    path = _write(comm, tmp_path, "g.tsv", "".join(f"{i}\t{j}\n" for i, j in zip(r, c)))
    g, _ = load_graph(comm, path, "tsv")
    assert _same_graph(g, read_graph(path, "tsv")) and not g.weighted
    # sparse ids become labels: the whole-file reader's way, the same graph
    path = _write(comm, tmp_path, "s.tsv", "".join(f"{i * 10**6}\t{j}\n" for i, j in zip(r, c)))
    g, _ = load_graph(comm, path, "tsv")
    ref = read_graph(path, "tsv")
    assert same_csr(g.matrix, ref.matrix) and np.array_equal(g.row_labels, ref.row_labels)


def test_bad_line_in_the_last_ranks_range_reported_once_with_its_line(tmp_path):
    comm = _world()
    r, c, w = _edges(seed=10, dups=False)
    lines = [f"{i}\t{j}\t{x:g}" for i, j, x in zip(r, c, w)]
    lines[-7] = "5\t6\tnope"  # in the last rank's byte range, whatever the world size
    lines[-2] = "5\t6\t7\t8"  # a later bad line is not the one reported
    path = _write(comm, tmp_path, "bad.tsv", "\n".join(lines) + "\n")
    msg = _agreed_error(comm, path, "tsv")
    assert msg.startswith(f"{path}:{len(lines) - 6}: ")


def test_mtx_index_out_of_range_past_the_first_range_has_its_line(tmp_path):
    comm = _world()
    r, c, w = _edges(seed=11, dups=False)
    text = _mtx_text(r, c, w).splitlines()
    text[-3] = f"{r.max() + 2} 1 1.5"  # a row beyond the size line, near the end
    path = _write(comm, tmp_path, "bad.mtx", "\n".join(text) + "\n")
    agreed = _agreed_error(comm, path)
    assert f"bad.mtx:{len(text) - 2}: row index must be an integer in 1.." in agreed


def test_repeat_refused_across_ranges_like_the_serial_reader(tmp_path):
    comm = _world()
    r, c, w = _edges(seed=12, dups=False)
    lines = [f"{i}\t{j}\t{x + 1:g}" for i, j, x in zip(r, c, w)]
    lines.append(lines[3])  # the first record again, as the file's last line
    path = _write(comm, tmp_path, "dup.tsv", "\n".join(lines) + "\n")
    agreed = _agreed_error(comm, path, "tsv", duplicates="error")
    assert "duplicate edge" in agreed


def test_groups_of_ranks_each_build_the_whole_graph(tmp_path, monkeypatch):
    """Several shared-memory groups (nodes): each parses the whole file among its ranks."""
    comm = _world()
    r, c, w = _edges(seed=13)
    path = _write(comm, tmp_path, "g.mtx", _mtx_text(r, c, w))
    monkeypatch.setattr(
        L, "_node_of", lambda cm: cm if cm.size == 1 else split_color(cm, cm.rank % 2)
    )
    g, _ = load_graph(comm, path)
    assert _same_graph(g, read_graph(path))


def _shared_arrays(monkeypatch):
    """Count the node-shared arrays the build allocates (the file-order pair and the counts
    where the file is in row order; a second pair where the counting sort moves entries)."""
    made = []

    def counted(node, n, dtype):
        made.append(n)
        return real(node, n, dtype)

    real = L.node_shared_array
    monkeypatch.setattr(L, "node_shared_array", counted)
    return made


@pytest.mark.parametrize("fmt", ["tsv", "mtx"])
def test_row_ordered_file_is_its_own_csr(tmp_path, monkeypatch, fmt):
    """A file in row order (the common case: MovieLens, ``mmwrite`` of a CSR) is parsed
    straight into the CSR, no second copy; blank lines leave gaps the ranks close; repeats
    within a row still add in file order."""
    comm = _world()
    r, c, w = _edges(seed=14)
    order = np.argsort(r, kind="stable")
    r, c, w = r[order], c[order], w[order] + 0.5  # no zero weights
    if fmt == "mtx":
        text = _mtx_text(r, c, w).replace("\n1 ", "\n\n1 ")  # blank lines inside the body
    else:
        text = "".join(f"{i}\t{j}\t{x:g}\n" + ("\n" if k % 613 == 3 else "")
                       for k, (i, j, x) in enumerate(zip(r, c, w)))  # fmt: skip
    path = _write(comm, tmp_path, f"o.{fmt}", text)
    made = _shared_arrays(monkeypatch)
    g, _ = load_graph(comm, path, fmt)
    assert _same_graph(g, read_graph(path, fmt))
    assert len(made) == 3  # file-order indices and weights, the counts: nothing moved
    want = sp.coo_matrix((w, (r, c))).tocsr()
    want.sum_duplicates()
    assert (g.matrix != want).nnz == 0


def test_row_ordered_with_a_zero_weight_or_rows_out_of_order_sorts(tmp_path, monkeypatch):
    comm = _world()
    r, c, w = _edges(seed=15, dups=False)
    order = np.argsort(r, kind="stable")
    r, c, w = r[order], c[order], w[order] + 1.0
    for case in ("zero", "order"):
        ww, rr = w.copy(), r.copy()
        if case == "zero":
            ww[-5] = 0.0  # not an edge: dropped while placing
        else:
            rr[-5], rr[5] = rr[5], rr[-5]  # one row out of order, in the last rank's range
        path = _write(comm, tmp_path, f"{case}.tsv",
                      "".join(f"{i}\t{j}\t{x:g}\n" for i, j, x in zip(rr, c, ww)))  # fmt: skip
        made = _shared_arrays(monkeypatch)
        g, _ = load_graph(comm, path, "tsv")
        assert _same_graph(g, read_graph(path, "tsv"))
        assert len(made) == 5  # the counting sort's second pair
        want = sp.coo_matrix((ww, (rr, c))).tocsr()
        want.eliminate_zeros()
        assert (g.matrix != want).nnz == 0


def test_id_below_the_base_in_the_last_range_is_the_serial_readers_error(tmp_path):
    """An id the 4-byte indices cannot hold (here 0 with ids from 1) stops the parse; the
    whole-file reader then gives its message."""
    comm = _world()
    r, c, w = _edges(seed=16, dups=False)
    text = _mtx_text(r, c, w).splitlines()
    text[-3] = "0 1 1.5"
    path = _write(comm, tmp_path, "zero.mtx", "\n".join(text) + "\n")
    agreed = _agreed_error(comm, path)
    assert f"zero.mtx:{len(text) - 2}: row index must be an integer in 1.." in agreed


@pytest.mark.parametrize("symmetry", ["symmetric", "skew-symmetric"])
def test_symmetric_mtx_mirrors_equal_serial_reader_and_scipy(tmp_path, monkeypatch, symmetry):
    """The mirrors of a symmetric file's lower triangle are placed in parallel too, after
    the stored entries of their row (repeats on both sides, a zero, the diagonal)."""
    comm = _world()
    rng = np.random.default_rng(17)
    n = 2500
    r, c = rng.integers(0, 200, n), rng.integers(0, 200, n)
    r, c = np.maximum(r, c), np.minimum(r, c)  # the lower triangle
    if symmetry == "skew-symmetric":
        r, c = r[r != c], c[r != c]  # scipy refuses a skew diagonal; ours keeps it
    w = rng.random(r.size) * 2 - 1  # sums that round: the order of the repeats shows
    w[7] = 0.0
    k = rng.integers(0, r.size, r.size // 3)
    r[k[1:]], c[k[1:]] = r[k[:-1]], c[k[:-1]]  # repeats, across the ranks' ranges
    text = _mtx_text(r, c, w).replace(" general", f" {symmetry}", 1).splitlines()
    text[2] = f"200 200 {r.size}"
    path = _write(comm, tmp_path, "s.mtx", "\n".join(text) + "\n")
    made = _shared_arrays(monkeypatch)
    timings = {}
    g, _ = load_graph(comm, path, timings=timings)
    assert _same_graph(g, read_graph(path)) and "whole" not in timings and len(made) == 5
    want = sp.csr_matrix(scipy.io.mmread(path), dtype=float)
    want.eliminate_zeros()
    assert abs(g.matrix - want).max() < 1e-12 and g.matrix.shape == (200, 200)


def test_symmetric_mtx_entry_above_the_diagonal_is_the_serial_readers_error(tmp_path):
    comm = _world()
    r, c, w = _edges(seed=18, dups=False)
    r, c = np.maximum(r, c), np.minimum(r, c)
    text = _mtx_text(r, c, w).replace(" general", " symmetric", 1).splitlines()
    side = int(max(r.max(), c.max())) + 1
    text[2] = f"{side} {side} {r.size}"
    text[-4] = "1 2 1.5"  # above the diagonal, in the last rank's range
    path = _write(comm, tmp_path, "up.mtx", "\n".join(text) + "\n")
    agreed = _agreed_error(comm, path)
    assert "above the diagonal" in agreed


#: fields a random edge list is made of: ids the numeric pass reads or must hand over, weights
#: Python's float reads and the readers must refuse (not finite, not a number)
_IDS = ["0", "1", "2", "3", "5", "-1", "10", "007", "+2", "--5", "u:1", ""]
_WEIGHTS = ["1", "0.5", "1e3", "-2", "inf", "nan", "1_0", " 1", "+1", ".5", "5.", "0x1",
            "1e400", "-0", "0", "1e-400", "7"]  # fmt: skip


def _outcome(read):
    """``("ok", shape, indptr, indices, data bits, labels, weighted)`` or ``("error", line)``."""
    try:
        g = read()
    except (AgreedError, InputError) as exc:
        return ("error", str(exc))
    m = g.matrix.tocsr()
    labels = [None if x is None else [str(v) for v in x] for x in (g.row_labels, g.col_labels)]
    return ("ok", m.shape, m.indptr.tolist(), m.indices.tolist(), m.data.tobytes(), labels,
            g.weighted)  # fmt: skip


def test_random_edge_lists_give_the_serial_readers_graph_or_line(tmp_path):
    """200 small random files (integer and text ids, odd and non-finite weights, a lone
    record): the collective reader gives the serial reader's graph, or its error line, at
    every world size. At 2 and 3 ranks a NaN weight in one rank's share passed (the flags
    were reduced as 'any rank finite'), and a lone record with a weight that is not a number
    said 'no edges found'."""
    import random

    comm = _world()
    rng = random.Random(41)
    differ = []
    for t in range(200):
        ncol = rng.choice([2, 3])
        lines = []
        for _ in range(rng.randint(1, 8)):
            f = [rng.choice(_IDS[:6] if rng.random() < 0.9 else _IDS) for _ in range(2)]
            if ncol == 3:
                f.append(rng.choice(_WEIGHTS[:4] if rng.random() < 0.7 else _WEIGHTS))
            lines.append("\t".join(f))
        path = _write(comm, tmp_path, f"r{t}.tsv", "".join(ln + "\n" for ln in lines))
        got = _outcome(lambda p=path: load_graph(comm, p, "tsv")[0])
        want = _outcome(lambda p=path: read_graph(p))
        if got != want:
            differ.append((lines, got[:2], want[:2]))
    assert not differ, differ[:3]
