"""Collective input loading: every rank ends up with the whole graph.

HDF5 graphs are read by every rank directly (parallel reads of one file). Numeric text
(Matrix Market, edge lists and ratings with integer ids) is read by the ranks of each node
together (:func:`_ranged`): each parses its own line-aligned byte range of its memory map of
the file (the page cache is shared), counts its entries per row, places them (the counting
sort, rank order kept within a row, so repeated edges add in file order) into one CSR in
memory every rank of the node maps (:func:`~mpisdnn.parallel.node_shared_array`), then makes
its own block of rows canonical; the node's ranks share that one graph. No array crosses MPI:
an all-gather of each rank's entries was measured slower (240 MB through MPICH's shared
memory took 4.7-15 s on the loaded 2-core VM, where a whole parse took 4-9 s: the copy needs
both ranks on a core at once), and each node of a multi-node job reads the whole file among
its own ranks. Where the file is not the plain case (an error, text or sparse ids, a
symmetric Matrix Market file, a refused repeat, too little shared memory), every rank reads
the whole file as before (:func:`_whole`), so errors are those readers' own lines, once, at
any rank count. Text ids, quoted CSV and files whose header needs the whole file are parsed
on rank 0 and broadcast as arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, MpisdnnError
from ..formats.projection import edgelist as E
from ..formats.projection.graph import (
    Graph,
    detect_format,
    mtx_graph,
    mtx_plan,
    mtx_range,
    read_graph,
)
from ..parallel import (
    SHARED_DIR,
    agree,
    agree_earliest,
    agree_root,
    allgather,
    allgather_array,
    allreduce,
    barrier,
    bcast,
    bcast_array,
    node_shared_array,
    phase,
    split_shared,
)

__all__ = ["load_graph"]


@phase("load")
def load_graph(comm, path, fmt="auto", timings=None, **options):
    """Read ``path`` on the ranks that need to and give every rank the :class:`Graph`.

    ``timings`` (a dict), when given, receives the read's phases in seconds, the slowest
    rank's being the caller's to reduce: ``plan`` (the format's header or first line),
    ``kernel_load`` (numba's first calls, timed apart), ``parse`` (this rank's byte range
    with its checks, or the whole file), ``build`` (the node's CSR), ``whole`` (the ranged
    attempt, when the file then had to be read whole: see the module docstring) and
    ``serial`` (the rank-0 path).

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
    timings["plan"] = time.perf_counter() - t0  # with numba's set-up where a text plan calls it
    text_plan = head[3] if fmt == "mtx" else head
    if not text_plan.numeric:
        return None
    opts = dict(base=(1 if ratings else 0) if index_base is None else int(index_base),
                ids=ids, duplicates=duplicates, shape=shape, strict=strict)  # fmt: skip
    g = _ranged(comm, path, fmt, buf, head, timings, t0, **opts)
    if g is not None:
        return g
    timings["whole"] = time.perf_counter() - t0
    return _whole(comm, path, fmt, buf, head, timings, **opts)


def _all(comm, ok) -> bool:
    """Whether ``ok`` holds on every rank (every node takes the same way through)."""
    return bool(allreduce(comm, bool(ok), "min"))


def _node_of(comm):
    """The ranks of ``comm`` that share memory and split the parsing (``comm`` itself when
    it has one rank); a test hook: any split into groups of one node's ranks gives the
    same graph."""
    return comm if comm.size == 1 else split_shared(comm)


def _ranged(comm, path, fmt, buf, head, timings, t0, *, base, ids, duplicates,  # noqa: C901, PLR0911, PLR0913
            shape, strict):  # fmt: skip
    """The graph, the ranks of each node parsing consecutive byte ranges and building one
    CSR in the node's shared memory; ``None`` (on every rank) where anything is not the
    plain case: then :func:`_whole` reads the file again and gives its graph or its error.

    A check here only decides whether the plain case holds; every message comes from the
    whole-file readers, so the errors (the earliest bad line, ``file:line``) are theirs by
    construction, at any rank count.
    """
    from ..formats.projection import _text_kernels as K

    if fmt == "mtx" and head[1] != "general":  # mirrored triangles: the whole-file reader
        return None
    if fmt != "mtx" and ids == "label":
        return None
    node = _node_of(comm)
    try:
        text_plan = head[3] if fmt == "mtx" else head
        timings["kernel_load"] = _load_kernels(path, text_plan, strict)
        t0 = time.perf_counter()
        lo0, size = text_plan.start, len(buf)
        lo = lo0 + (size - lo0) * node.rank // node.size
        hi = lo0 + (size - lo0) * (node.rank + 1) // node.size
        try:
            if fmt == "mtx":
                part = mtx_range(path, buf, lo, hi, head)
            else:
                part = E.parse_numeric_range(path, buf, lo, hi, text_plan, strict)
            ok = part.status == K.OK
        except (InputError, OSError, MemoryError):  # the whole-file reader says it once
            part, ok = None, False
        if not _all(comm, ok):
            return None
        rows, cols, w = part.rows, part.cols, part.vals
        del part
        total = int(allreduce(node, rows.size))
        weighted = w is not None
        *ext, finite, whole, zeros = _facts(node, K, rows, cols, w)
        if fmt == "mtx":
            _, _, (nr, nc, nnz), _ = head
            field = head[0]
            ok = total == nnz and (total == 0 or (ext[0] >= 1 and ext[1] <= nr and ext[2] >= 1
                                                  and ext[3] <= nc))  # fmt: skip
            ok = ok and finite and (whole or field != "integer")
            base = 1
        else:
            ok = total > 0 and ext[0] >= base and ext[2] >= base and finite
            ok = ok and ext[1] - base < 2**62 and ext[3] - base < 2**62
            if ok and ids == "auto":
                ok = _dense(node, K, rows, ext[0], ext[1], base, total) and _dense(
                    node, K, cols, ext[2], ext[3], base, total)  # fmt: skip
            if ok and shape is not None:
                ok = ext[1] - base < shape[0] and ext[3] - base < shape[1]
            nr, nc = shape if shape is not None else (ext[1] - base + 1, ext[3] - base + 1)
        if not _all(comm, ok):
            return None
        if zeros:  # a zero weight is not an edge (build_csr's rule)
            keep = w != 0
            rows, cols, w = rows[keep], cols[keep], w[keep]
        timings["parse"] = time.perf_counter() - t0
        if not _all(comm, _room(node, int(allreduce(node, rows.size)), nr)):
            return None
        t = time.perf_counter()
        mat = _node_csr(comm, node, K, rows, cols, w, base, (int(nr), int(nc)), duplicates)
        if mat is None:
            return None
        timings["build"] = time.perf_counter() - t
        if fmt == "mtx":
            return Graph(mat, weighted, os.fspath(path), index_base=1, validate=False)
        return Graph(mat, weighted, os.fspath(path), index_base=base,
                     header=text_plan.header, validate=False)  # fmt: skip
    finally:
        if node is not comm:
            node.Free()


def _load_kernels(path, text_plan, strict) -> float:
    """Seconds numba's first calls take (loading the cached machine code of the parse and
    build kernels, and numba's one-off set-up of its compiler target in this process: 0.4-2
    s on the 2-core VM, by the load), run on one-entry inputs of the real calls' types so
    that they are timed apart from the parse (the projection's ``kernel_load`` likewise)."""
    from ..formats.projection import _text_kernels as K

    t = time.perf_counter()
    with contextlib.suppress(InputError):  # only the types matter, not what a line says
        E.parse_numeric_range(path, b"1 1 1\n", 0, 6, dataclasses.replace(text_plan, start=0),
                              strict)  # fmt: skip
    one, w = np.zeros(1, np.int64), np.ones(1, np.float64)
    for weighted in (True, False):
        val = w if weighted else np.empty(0, np.float64)
        K.triple_facts(one, one, val, weighted)
        K.row_counts(one, 0, np.zeros(1, np.int64))
        idx = np.zeros(1, np.int32)
        K.scatter_rows(one, one, val, weighted, 0, np.zeros(1, np.int64), idx, val.copy())
        K.canonical_rows(np.array([0, 1], np.int64), 0, 1, idx, val.copy(), weighted)
    K.mark_seen(one, 0, np.zeros(1, np.uint8))
    return time.perf_counter() - t


def _facts(node, K, rows, cols, w):
    """``(row min, row max, column min, column max, finite, whole, zeros)`` of the node's
    triples (weights all finite, all whole numbers; this rank's zero weights), one pass."""
    *ext, finite, whole, zeros = K.triple_facts(rows, cols, w if w is not None else
                                                np.empty(0), w is not None)  # fmt: skip
    lows = allreduce(node, np.array([ext[0], ext[2], -int(finite), -int(whole)], np.int64),
                     "min")  # fmt: skip
    highs = allreduce(node, np.array([ext[1], ext[3]], np.int64), "max")
    return (int(lows[0]), int(highs[0]), int(lows[1]), int(highs[1]), lows[2] == -1,
            lows[3] == -1, int(zeros))  # fmt: skip


def _dense(node, K, col, lo, hi, base, total) -> bool:
    """Whether ``ids="auto"`` keeps this column's integer ids as indices (``map_ids``'
    rule, on the distinct ids of the whole node)."""
    span = hi - lo + 1
    if span > max(total * E._DENSE_IDS, E._EMPTY_IDS) + total:
        return False
    seen = np.zeros(span, np.uint8)
    K.mark_seen(col, lo, seen)
    distinct = int(np.count_nonzero(allreduce(node, seen, "max")))
    return hi - base + 1 - distinct <= max(distinct * (E._DENSE_IDS - 1), E._EMPTY_IDS)


def _room(node, m, nr) -> bool:
    """Whether the node's shared memory holds the CSR of ``m`` entries (and the counts)."""
    if node.size == 1:
        return True
    need = 8 * node.size * nr + 16 * m  # counts, 8-byte indices at most, values or ones

    def free():
        st = os.statvfs(SHARED_DIR)
        return st.f_bavail * st.f_frsize

    try:
        return need <= agree_root(node, free)
    except MpisdnnError:
        return False


def _node_csr(comm, node, K, rows, cols, w, base, shape, duplicates):  # noqa: PLR0913
    """The canonical CSR of the node's triples (this rank's share: ``rows``, ``cols``,
    ``w``, in file order, ids from ``base``), built once in memory every rank of the node
    maps: each rank counts and places its own triples (the counting sort, rank order kept
    within a row, so repeats add in file order), then makes its block of rows canonical.
    The same arrays as :func:`~mpisdnn.formats.projection.adjacency.build_csr` gives;
    ``None`` (on every rank) for repeated edges under ``duplicates="error"``.

    Ranks of a node share these arrays: nothing may write them (the projection copies a
    matrix before it changes one).
    """
    nr, nc = shape
    p, q = node.size, node.rank
    weighted = w is not None
    counts = node_shared_array(node, p * nr, np.int64).reshape(p, nr)
    counts[q] = 0
    K.row_counts(rows, base, counts[q])
    barrier(node)
    indptr = np.zeros(nr + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=indptr[1:])
    fill = indptr[:-1] + counts[:q].sum(axis=0)
    del counts
    m = int(indptr[-1])
    narrow = max(nr, nc, m) < 2**31
    idx = node_shared_array(node, m, np.int32 if narrow else np.int64)
    val = node_shared_array(node, m if weighted else 0, np.float64)
    K.scatter_rows(rows, cols, w if weighted else np.empty(0, np.float64), weighted, base,
                   fill, idx, val)  # fmt: skip
    del fill
    barrier(node)
    # blocks of whole rows of about the same number of entries, the same on every rank
    cut = np.searchsorted(indptr, m * np.arange(p + 1) // p).clip(0, nr)
    cut[0], cut[-1] = 0, nr
    r0, r1 = int(cut[q]), int(cut[q + 1])
    starts = indptr.copy()
    end, dups = K.canonical_rows(starts, r0, r1, idx, val, weighted)
    dups = int(allreduce(node, dups))
    if not _all(comm, dups == 0 or duplicates != "error"):
        return None
    nnz = m
    if dups:
        raw0 = int(indptr[r0])
        kept = allgather(node, int(end) - raw0)
        first = sum(kept[:q])
        nnz = sum(kept)
        mine = starts[r0:r1] - indptr[r0] + first
        indptr = np.append(allgather_array(node, mine), np.int64(nnz))
        for k in range(1, p):  # in rank order: a block moves down over dead entries only
            if k == q and kept[q]:
                idx[first : first + kept[q]] = idx[raw0 : raw0 + kept[q]]
                if weighted:
                    val[first : first + kept[q]] = val[raw0 : raw0 + kept[q]]
            barrier(node)
    if weighted:
        data = val[:nnz]
    else:
        data = node_shared_array(node, nnz, np.float64)
        data[nnz * q // p : nnz * (q + 1) // p] = 1.0
        barrier(node)
    indices = idx[:nnz]
    small = max(nr, nc, nnz) < 2**31
    if small and not narrow:
        indices = indices.astype(np.int32)
    dtype = np.int32 if small else np.int64
    return sp.csr_matrix((data, indices, indptr.astype(dtype, copy=False)), shape=(nr, nc))


def _whole(comm, path, fmt, buf, head, timings, *, base, ids, duplicates, shape,  # noqa: PLR0913
           strict):  # fmt: skip
    """The graph, every rank parsing the whole file (its memory map; the page cache is
    shared) and building its own CSR: the readers' own checks and messages, file order.
    ``None`` where the text needs the serial reader."""
    from ..formats.projection import _text_kernels as K

    t0 = time.perf_counter()
    text_plan = head[3] if fmt == "mtx" else head
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
        names = ("user", "item") if fmt == "ratings" else ("source", "target")
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
