"""Collective input loading: every rank ends up with the whole graph.

HDF5 graphs are read by every rank directly (parallel reads of one file). Numeric text
(Matrix Market, edge lists and ratings with integer ids) is read by the ranks of each node
together (:func:`_ranged`): each parses its own line-aligned byte range of its memory map of
the file (the page cache is shared) straight into its place in one file-order pair of arrays
in memory every rank of the node maps (:func:`~mpisdnn.parallel.node_shared_array`); where
the file is in row order those arrays are the CSR already, else each rank places its entries
into a second pair (the counting sort, rank order kept within a row, so repeated edges add
in file order); then each makes its own block of rows canonical; the node's ranks share that
one graph. No array crosses MPI:
an all-gather of each rank's entries was measured slower (240 MB through MPICH's shared
memory took 4.7-15 s on the loaded 2-core VM, where a whole parse took 4-9 s: the copy needs
both ranks on a core at once), and each node of a multi-node job reads the whole file among
its own ranks. A symmetric Matrix Market file's mirrors are placed by the same counting
sort, after the stored entries of their row. Where the file is not the plain case (an error,
text or sparse ids, ids past 4 bytes in a file of under 2**31 lines, a refused repeat, too
little shared memory), every rank reads
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
def load_graph(comm, path, fmt="auto", timings=None, warm_up=None, **options):
    """Read ``path`` on the ranks that need to and give every rank the :class:`Graph`.

    ``warm_up`` (a callable, or None): what the ranks other than each node's first call
    while the first compiles (or loads) the reader's kernels, before the ranks next wait
    for each other: ``mpisdnn project`` compiles the projection's kernels there, so a first
    run compiles both side by side. Called at most once per rank; text inputs only.

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
    g = _parallel_text(comm, path, fmt, timings, warm_up, **options)
    if g is None:  # text ids, quotes, an uncertain header: rank 0 reads the whole file
        t = time.perf_counter()
        if warm_up is not None and comm.rank > 0:
            warm_up()  # while rank 0 reads
        g = _root_read(comm, path, fmt, **options)
        timings["serial"] = time.perf_counter() - t
    return g, fmt


def _parallel_text(comm, path, fmt, timings, warm_up, index_base=None, skip_lines=0,  # noqa: PLR0913
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
    g = _ranged(comm, path, fmt, buf, head, timings, t0, warm_up=warm_up, **opts)
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


def _ranged(comm, path, fmt, buf, head, timings, t0, *, base, ids, duplicates,  # noqa: PLR0911, PLR0913
            shape, strict, warm_up=None):  # fmt: skip
    """The graph, the ranks of each node parsing consecutive byte ranges and building one
    CSR in the node's shared memory; ``None`` (on every rank) where anything is not the
    plain case: then :func:`_whole` reads the file again and gives its graph or its error.

    Each rank counts the lines of its range first (the most records it can hold), so the
    ranks' places in one file-order pair of arrays in the node's shared memory are known
    before any parse: the columns and weights are parsed straight into it (4-byte indices,
    ids less the index base), and only the rows into the rank's own memory. Fresh memory is
    the dear part of a read here (first touch costs 0.4-2 ms a MB on the 2-core VM, against
    a 0.3 s parse of 157 MB): the entries are written once, where they stay when the file
    is in row order (the CSR is then file order), and moved once by the counting sort when
    it is not.

    A check here only decides whether the plain case holds; every message comes from the
    whole-file readers, so the errors (the earliest bad line, ``file:line``) are theirs by
    construction, at any rank count.
    """
    from ..formats.projection import _text_kernels as K
    from ..formats.projection.adjacency import small_empty
    from ..system import populate

    if fmt != "mtx" and ids == "label":
        return None
    node = _node_of(comm)
    if warm_up is not None and node.rank > 0:
        warm_up()  # while the node's first rank compiles the reader's kernels
    try:
        text_plan = head[3] if fmt == "mtx" else head
        timings["kernel_load"] = _load_kernels(path, text_plan, strict)
        t0 = time.perf_counter()
        lo0, size = text_plan.start, len(buf)
        lo = lo0 + (size - lo0) * node.rank // node.size
        hi = lo0 + (size - lo0) * (node.rank + 1) // node.size
        chunks = E.numeric_chunks(buf, lo, hi, text_plan)
        caps = allgather(node, chunks.capacity)
        cap, off, total_cap = caps[node.rank], sum(caps[: node.rank]), sum(caps)
        weighted = text_plan.ncols >= 3
        narrow = total_cap < 2**31
        itype = np.dtype(np.int32 if narrow else np.int64)
        limit = 2**31 - 1 if narrow else 2**62
        shift = 1 if fmt == "mtx" else base
        need = total_cap * (itype.itemsize + (8 if weighted else 0))
        if not _all(comm, _room(node, need)):
            return None
        idx_fo = node_shared_array(node, total_cap, itype)
        val_fo = node_shared_array(node, total_cap if weighted else 0, np.float64)
        rows_mine = small_empty(cap, itype)
        # each rank its own pages, in bulk: cheaper than a fault per page inside the parse
        for arr in (idx_fo[off : off + cap], val_fo[off : off + cap], rows_mine):
            populate(arr)
        try:
            part = E.parse_numeric_into(
                path, buf, chunks, text_plan, strict, rows_mine,
                idx_fo[off : off + cap], val_fo[off : off + cap], shift, limit,
            )  # fmt: skip
            ok = part.status == K.OK
        except (InputError, OSError, MemoryError):  # the whole-file reader says it once
            part, ok = None, False
        if not _all(comm, ok):
            return None
        rows, cols, w = part.rows, part.cols, part.vals
        del part
        ok, (nr, nc), mirror, zeros = _plain(node, K, fmt, head, rows, cols, w, ids, shape)
        if not _all(comm, ok):
            return None
        timings["parse"] = time.perf_counter() - t0
        t = time.perf_counter()
        mat = _node_csr(comm, node, K, (rows, cols, w), (idx_fo, val_fo, off),
                        zeros, mirror, (int(nr), int(nc)), duplicates)  # fmt: skip
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


def _plain(node, K, fmt, head, rows, cols, w, ids, shape):  # noqa: PLR0913
    """Whether the node's parsed triples (ids less the index base) are the plain case, and
    ``(shape, mirror sign or None, any zero weight)``: every count, range and value check
    the whole-file readers would make, so that only where one fails do they read again
    (and say why)."""
    total = int(allreduce(node, rows.size))
    *ext, finite, whole, zeros = _facts(node, K, rows, cols, w)
    mirror = None  # the mirrors' sign, for a symmetric Matrix Market file
    if fmt == "mtx":  # ids from 1 (shifted to 0, none below: the parse saw to it)
        field, symmetry, (nr, nc, nnz), _ = head
        ok = total == nnz and (total == 0 or (ext[1] < nr and ext[3] < nc))
        ok = ok and finite and (whole or field != "integer")
        if symmetry != "general":  # square, the lower triangle only (else its message)
            mirror = -1.0 if symmetry == "skew-symmetric" else 1.0
            ok = ok and nr == nc and not bool(allreduce(node, bool((rows < cols).any()),
                                                        "max"))  # fmt: skip
    else:  # ids from the index base, shifted to 0
        ok = total > 0 and finite
        if ok and ids == "auto":
            ok = _dense(node, K, rows, ext[0], ext[1], total) and _dense(
                node, K, cols, ext[2], ext[3], total)  # fmt: skip
        if ok and shape is not None:
            ok = ext[1] < shape[0] and ext[3] < shape[1]
        nr, nc = shape if shape is not None else (ext[1] + 1, ext[3] + 1)
    return ok, (nr, nc), mirror, zeros > 0


def _load_kernels(path, text_plan, strict) -> float:
    """Seconds numba's first calls take (loading the cached machine code of the parse and
    build kernels, and numba's one-off set-up of its compiler target in this process: 0.4-2
    s on the 2-core VM, by the load), run on one-entry inputs of the real calls' types so
    that they are timed apart from the parse (the projection's ``kernel_load`` likewise)."""
    from ..formats.projection import _text_kernels as K

    t = time.perf_counter()
    one, w = np.zeros(1, np.int32), np.ones(1, np.float64)
    plan = dataclasses.replace(text_plan, start=0)
    with contextlib.suppress(InputError):  # only the types matter, not what a line says
        E.parse_numeric_into(path, b"1 1 1\n", E.numeric_chunks(b"1 1 1\n", 0, 6, plan), plan,
                             strict, one.copy(), one.copy(), w.copy(), 1, 2**31 - 1)  # fmt: skip
    ptr = np.array([0, 1], np.int64)
    for weighted in (True, False):
        val = w if weighted else np.empty(0, np.float64)
        K.triple_facts(one, one, val, weighted)
        K.scatter_rows(one, one, val, weighted, 0, np.zeros(1, np.int64), one.copy(),
                       val.copy())  # fmt: skip
        K.canonical_rows(ptr.copy(), 0, 1, one.copy(), val.copy(), weighted)
    K.row_order(one)
    K.row_counts(one, 0, np.zeros(1, np.int64))
    K.mark_seen(one, 0, np.zeros(1, np.uint8))
    return time.perf_counter() - t


def _facts(node, K, rows, cols, w):
    """``(row min, row max, column min, column max, finite, whole, zeros)`` of the node's
    triples (weights all finite, all whole numbers; the node's zero weights), one pass."""
    *ext, finite, whole, zeros = K.triple_facts(rows, cols, w if w is not None else
                                                np.empty(0), w is not None)  # fmt: skip
    # every rank's weights finite (whole): the minimum of the flags, 1 only when all are 1
    # (the minimum of their negations was 1 when any rank's were: a NaN weight on one rank
    # passed at 2 ranks and was refused at 1)
    lows = allreduce(node, np.array([ext[0], ext[2], int(finite), int(whole)], np.int64),
                     "min")  # fmt: skip
    highs = allreduce(node, np.array([ext[1], ext[3], zeros], np.int64), "max")
    return (int(lows[0]), int(highs[0]), int(lows[1]), int(highs[1]), lows[2] == 1,
            lows[3] == 1, int(highs[2]))  # fmt: skip


def _dense(node, K, col, lo, hi, total) -> bool:
    """Whether ``ids="auto"`` keeps this column's integer ids (less the index base) as
    indices (``map_ids``' rule, on the distinct ids of the whole node)."""
    span = hi - lo + 1
    if span > max(total * E._DENSE_IDS, E._EMPTY_IDS) + total:
        return False
    seen = np.zeros(span, np.uint8)
    K.mark_seen(col, lo, seen)
    distinct = int(np.count_nonzero(allreduce(node, seen, "max")))
    return hi + 1 - distinct <= max(distinct * (E._DENSE_IDS - 1), E._EMPTY_IDS)


def _room(node, need) -> bool:
    """Whether the node's shared memory holds ``need`` more bytes."""
    if node.size == 1:
        return True

    def free():
        st = os.statvfs(SHARED_DIR)
        return st.f_bavail * st.f_frsize

    try:
        return need <= agree_root(node, free)
    except MpisdnnError:
        return False


def _node_csr(comm, node, K, mine, file_order, zeros, mirror, shape, duplicates):  # noqa: PLR0913
    """The canonical CSR of the node's triples, built once in memory every rank of the node
    maps; ``None`` (on every rank) for repeated edges under ``duplicates="error"`` or too
    little shared memory.

    ``mine`` is this rank's ``(rows, cols, weights)`` in file order, ids from 0: ``rows`` its
    own array, ``cols`` and ``weights`` its part of the node's file-order arrays
    (``file_order``: those arrays and where this rank's part starts); ``zeros``: whether any
    rank has a zero weight (not an edge); ``mirror``: the sign of the mirrors ``(c, r)`` of
    the off-diagonal entries of a symmetric file (``None``: none), which follow every
    stored entry of their row (ranks in order), as the whole-file reader appends them.
    Where the node's triples are in row order (every
    rank's rows non-decreasing and each rank's first row at or after the previous rank's
    last) and none is zero, file order is the counting sort's order and the file-order arrays
    are the CSR's (a rank's part moved down over any gap blank lines left); else each rank
    places its triples into a second pair (the counting sort, rank order kept within a row,
    so repeats add in file order). Either way each rank then makes its block of rows
    canonical. The same arrays as :func:`~mpisdnn.formats.projection.adjacency.build_csr`
    gives.

    Ranks of a node share these arrays: nothing may write them (the projection copies a
    matrix before it changes one).
    """
    nr, nc = shape
    p, q = node.size, node.rank
    rows, cols, w = mine
    idx_fo, val_fo, off = file_order
    weighted = w is not None
    n = rows.size
    info = allgather(node, (*(bool(x) if i == 0 else int(x) for i, x in
                              enumerate(K.row_order(rows))), n))  # fmt: skip
    order = [x for x in info if x[3]]  # the ranks with entries, in rank order
    direct = mirror is None and not zeros and all(x[0] for x in order) and all(
        a[2] <= b[1] for a, b in zip(order, order[1:]))  # fmt: skip
    sets = 1 if mirror is None else 2  # stored entries, then their mirrors
    more = 8 * sets * p * nr + sets * (idx_fo.itemsize * idx_fo.size + val_fo.nbytes)
    if not _all(comm, direct or _room(node, more)):
        return None
    counts = node_shared_array(node, sets * p * nr, np.int64).reshape(sets, p, nr)
    counts[:, q] = 0
    if zeros and weighted:
        K.row_counts_nonzero(rows, w, counts[0, q])
    else:
        K.row_counts(rows, 0, counts[0, q])
    if mirror is not None:
        K.mirror_counts(rows, cols, w if weighted else np.empty(0, np.float64), weighted,
                        counts[1, q])  # fmt: skip
    barrier(node)
    indptr = np.zeros(nr + 1, np.int64)
    np.cumsum(counts.sum(axis=(0, 1)), out=indptr[1:])
    m = int(indptr[-1])
    if direct:
        del counts
        first = sum(x[3] for x in info[:q])
        for k in range(1, p):  # in rank order: a part moves down over what is left behind
            if k == q and n and first != off:
                idx_fo[first : first + n] = idx_fo[off : off + n]
                if weighted:
                    val_fo[first : first + n] = val_fo[off : off + n]
            barrier(node)
        idx, val = idx_fo, val_fo
    else:
        fill = indptr[:-1] + counts[0, :q].sum(axis=0)
        idx = node_shared_array(node, m, idx_fo.dtype)
        val = node_shared_array(node, m if weighted else 0, np.float64)
        wv = w if weighted else np.empty(0, np.float64)
        if zeros and weighted:
            K.scatter_nonzero(rows, cols, w, fill, idx, val)
        else:
            K.scatter_rows(rows, cols, wv, weighted, 0, fill, idx, val)
        if mirror is not None:  # after every rank's stored entries of the row
            fill = indptr[:-1] + counts[0].sum(axis=0) + counts[1, :q].sum(axis=0)
            K.scatter_mirrors(rows, cols, wv, weighted, mirror, fill, idx, val)
        del fill, counts
        barrier(node)
    del rows, cols, w, mine, file_order, idx_fo, val_fo
    return _canonical(comm, node, K, indptr, idx, val, weighted, shape, duplicates)


def _canonical(comm, node, K, indptr, idx, val, weighted, shape, duplicates):  # noqa: PLR0913
    """The node's row-sorted CSR (``indptr``, ``idx``, ``val``: every rank's same arrays)
    made canonical, each rank its block of rows (columns sorted, repeats added, the blocks
    packed down in rank order over merged entries); ``None`` (on every rank) for repeats
    under ``duplicates="error"``."""
    nr, nc = shape
    p, q = node.size, node.rank
    m = int(indptr[-1])
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
    if small and indices.dtype != np.int32:
        indices = indices.astype(np.int32)
    elif not small and indices.dtype != np.int64:
        indices = indices.astype(np.int64)
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
        if rows.size == 0 and text_plan.header is not None:
            return None  # one record, taken as a header only tentatively: the text reader's
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
