"""Collective input loading: every rank ends up with the whole graph.

HDF5 graphs are read by every rank directly (parallel reads of one file). Numeric text
(Matrix Market, edge lists and ratings with integer ids) is parsed by every rank from its
memory map of the file (the page cache is shared), by the rank's threads in chunks, and
every rank builds the CSR: no communication but the agreement on errors. (All-gathering
each rank's share of the entries instead was measured slower: 240 MB through MPICH's shared
memory took 4.7-15 s on the loaded 2-core VM, where a whole parse took 4-9 s; the exchange
needs both ranks on a core at once.) Text ids, quoted CSV and files whose header needs the
whole file are parsed on rank 0 and broadcast as arrays. A bad line is reported once.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..formats.projection import edgelist as E
from ..formats.projection.graph import (
    Graph,
    detect_format,
    mtx_graph,
    mtx_plan,
    mtx_range,
    read_graph,
)
from ..parallel import agree, agree_earliest, allgather, bcast, bcast_array, phase

__all__ = ["load_graph"]


@phase("load")
def load_graph(comm, path, fmt="auto", timings=None, **options):
    """Read ``path`` on the ranks that need to and give every rank the :class:`Graph`.

    ``timings`` (a dict), when given, receives the read's phases in seconds: ``parse``,
    ``exchange``, ``build`` (and ``serial`` for the rank-0 path).

    Returns
    -------
    (Graph, str)
        The graph and the format it was read as.
    """
    timings = {} if timings is None else timings
    fmt = agree(comm, lambda: detect_format(path) if fmt == "auto" else fmt)
    if fmt == "h5":
        t = time.perf_counter()
        g = agree(comm, read_graph, path, fmt, **options)
        timings["parse"] = time.perf_counter() - t
        return g, fmt
    g = _parallel_text(comm, path, fmt, timings, **options)
    if g is None:  # text ids, quotes, an uncertain header: rank 0 reads the whole file
        t = time.perf_counter()
        g = _root_read(comm, path, fmt, **options)
        timings["serial"] = time.perf_counter() - t
    return g, fmt


def _parallel_text(comm, path, fmt, timings, index_base=None, skip_lines=0,  # noqa: PLR0913
                   duplicates="sum", shape=None, ids="auto", sep="auto",
                   header=None):  # fmt: skip - read_graph's options, passed on by name
    """The graph parsed in parallel, or None where the text needs the serial reader."""
    from ..formats.projection import _text_kernels as K

    t0 = time.perf_counter()
    ratings = fmt == "ratings"
    strict = ids != "index"
    allowed = (3, 4) if ratings else (2, 3)

    def plan():
        buf = E.file_buffer(path)
        if fmt == "mtx":
            return buf, mtx_plan(path, buf)
        return buf, E.plan_text(path, buf, fmt, allowed, sep, header, skip_lines, strict)

    buf, head = agree_earliest(comm, plan)
    text_plan = head[3] if fmt == "mtx" else head
    if not text_plan.numeric:
        return None
    lo, hi = text_plan.start, len(buf)

    def parse():
        if fmt == "mtx":
            return mtx_range(path, buf, lo, hi, head)
        return E.parse_numeric_range(path, buf, lo, hi, text_plan, strict)

    part = agree_earliest(comm, parse)
    if not all(allgather(comm, part.status == K.OK)):
        return None
    timings["parse"] = time.perf_counter() - t0
    t2 = time.perf_counter()
    rows, cols, vals = part.rows, part.cols, part.vals

    def where(i):
        return E.record_line(buf, part.lo, i)

    if fmt == "mtx":
        whole = E.NumericPart(K.OK, rows, cols, vals, 0)
        g = agree_earliest(comm, mtx_graph, path, head, whole, duplicates, where)
    else:
        if rows.size == 0:
            agree_earliest(comm, _raise, InputError(f"{path}: no edges found"))
        base = (1 if ratings else 0) if index_base is None else int(index_base)
        names = ("user", "item") if ratings else ("source", "target")
        g = agree(
            comm, E.graph_from_columns, path, rows, cols, vals, where, base=base, ids=ids,
            duplicates=duplicates, shape=shape, names=names, header=text_plan.header,
        )  # fmt: skip
    timings["build"] = time.perf_counter() - t2
    return g


def _raise(exc):
    raise exc


def _root_read(comm, path, fmt, **options):
    """Rank 0 reads the whole file (text ids, quotes), every rank gets the arrays."""
    if comm.size == 1:
        return agree_earliest(comm, read_graph, path, fmt, **options)

    def read():
        return read_graph(path, fmt, **options) if comm.rank == 0 else None

    g = agree_earliest(comm, read)  # only rank 0 can fail: its message as it is
    head = (
        (g.matrix.shape, g.weighted, g.source, g.row_labels, g.col_labels, g.index_base,
         g.header)
        if comm.rank == 0
        else None
    )  # fmt: skip
    shape, weighted, source, row_labels, col_labels, base, header = bcast(comm, head)
    m = g.matrix if comm.rank == 0 else None
    indptr = bcast_array(comm, m.indptr if m is not None else None)
    indices = bcast_array(comm, m.indices if m is not None else None)
    if weighted:
        data = bcast_array(comm, m.data if m is not None else None)
    else:
        data = np.ones(indices.size, dtype=np.float64)
    mat = sp.csr_matrix((data, indices, indptr), shape=shape)
    return Graph(mat, weighted, source, row_labels, col_labels, index_base=base, header=header,
                 validate=False)  # fmt: skip
