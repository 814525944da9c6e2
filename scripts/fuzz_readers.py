#!/usr/bin/env python
"""Seeded random inputs through the readers and kernels, at any MPI world size, against an
independent reading or reference; prints each disagreement and exits 1 if there is one.

    mpiexec -n 2 python scripts/fuzz_readers.py all --cases 300 --seed 1
    python scripts/fuzz_readers.py edges --cases 1000 --seed 7

Kinds (each case is a small file or problem, so a thousand take seconds):

* ``edges``: TSV edge lists of integer and text ids (with the ids Python's ``int`` reads or
  trips on: ``--5``, ``+5``, ``1_0``, ``007``) and odd or non-finite weights: the collective
  reader (``load_graph``, every rank a byte range) must give the serial reader's graph or
  its very line; with ``ids="label"`` both must equal a plain-Python reading of the grammar
  (docs/projection.md: tabs only, an id is the field byte for byte, leading ``#``/``%``
  lines are comments, an edge listed twice is one edge).
* ``csv``: RFC 4180 files written by Python's ``csv`` (quotes, separators and line breaks
  inside ids), the same two checks.
* ``mtx``: Matrix Market files of every field and symmetry, some with faults: the
  collective reader against the serial one, and the graph against ``scipy.io.mmread``
  where both accept the file (a pattern file's repeats are one edge here, a sum there).
* ``inputs``: challenge inputs TSV with faults: ``read_images_parallel`` (the command
  line's reader; half the time from a gzip of the file, of one to three members) against
  ``read_images_tsv`` (the public serial reader) of the text: the same matrix, bit for bit,
  or both refusing.
* ``project``: ``project`` with random options (count, jaccard, overlap, cosine, ratio,
  newman, product, on pattern or weighted inputs; onto,
  self-loops, triangle, ``--top-k``, ``--min-weight``, a small ``--memory-per-rank``)
  against scipy's ``AᵀA`` filtered afterwards as docs/projection.md defines it.
* ``outputs``: every output format (HDF5 general or symmetric, compressed or not, Matrix
  Market general or symmetric, TSV 0- or 1-based, Parquet), text labels or none, written
  from every rank's rows and read back whole: the in-memory projection, bit for bit.
* ``frames``: ``Graph.from_edges`` of pandas DataFrames and pyarrow Tables (ids of every
  integer width, uint64 past 2**63, text as object, ``string``, categorical and Arrow
  dictionary; weights float and int) against the edges summed in Python.
* ``network``: TSV networks as a directory, a ``.tar`` or a ``.tar.gz`` (members shuffled,
  under ``neuron{N}/`` or not) with a fault in a layer (a repeat, an index 0 or past N, an
  odd value, a missing field, spaces, CRLF, no final newline, an empty file) or in the
  container (a gap, a foreign or repeated layer, ``l0``, ``l01``, a gzip layer file, a
  README, a cut archive): ``infer``'s reader and ``convert network`` against the serial
  readers, bit for bit or the same line; without a fault, against a plain-Python reading.
* ``cli``: ``infer`` command lines with random flags, through ``mpisdnn.cli.main`` on every
  rank: the reference's categories with exit 0, PASS or FAIL against a truth file, or exit
  2 with one line from rank 0 (the refusals are counted and listed).
* ``cli-project``: ``project`` command lines (every weighting, onto, self-loops, triangle,
  min-weight, top-k; with threads, a memory bound, symmetric storage, compression,
  progress, which must not change the result) on TSV and CSV edge lists through
  ``cli.main``: the output read back equals ``project_matrix`` of the same weighting and
  filters, or one line.
* ``truth``: truth files (blank lines, CRLF, odd and huge numbers, gzip) through
  ``load_truth`` against a plain reading (whole numbers from 1 to ``MAX_ROWS``).
* ``hdf5``: a v2 network or an inputs file with one random change (an attribute; a dataset
  deleted, retyped, reshaped or one of its values changed; damaged bytes; the file cut),
  through ``infer``: the reference's categories of what the files then hold, or one line.
  An internal error aborts the whole job, as for a user (exit 3, the traceback captured
  and lost at 2+ ranks): ``FUZZ_TRACE=DIR`` names each case on stderr and keeps its files
  in DIR.
* ``infer``: ``infer`` with random options (groups, dedup, pruning, push density,
  re-balancing, memory bound) on random networks against ``reference_inference``, bit for
  bit.

Found by it on 2026-12-04 (each fixed, each with a test): ``--5`` as a first id was an
internal error; an empty id was a node named ""; a NaN weight in one rank's share passed at
2 and 3 ranks; a lone record whose weight is not a number said "no edges found" at 2 ranks;
the serial inputs reader named no line for a duplicate. Then (``network``): a gzip layer
file in a directory was inflated by the serial reader and refused by the others; weights of
``0`` and ``-0`` alone were all kept as ``-0.0``; the serial archive reader asked for the
bias of a foreign layer's N instead of naming the mixed archive. And (``truth``) a category
past 2**53 was rounded, past 2**63 wrapped negative; (``hdf5``) damaged metadata was an
internal error (h5py's ``RuntimeError``, ``KeyError``; a named datatype in place of a
dataset), a damaged format attribute an error of two lines.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # mpisdnn, tests._cli_batch

_INT = re.compile(r"-?[0-9]+")


def _canonical_int(f: str) -> bool:
    """An exact int64 id in canonical form (what the readers keep as an integer)."""
    if not _INT.fullmatch(f):
        return False
    digits = f.lstrip("-")
    return (digits[0] != "0" or f == "0") and -(2**63) <= int(f) < 2**63


class Run:
    """The world, a shared scratch directory and the disagreements found."""

    def __init__(self, comm, seed):
        self.comm, self.rng, self.bad = comm, random.Random(seed), 0
        self.dir = comm.bcast(tempfile.mkdtemp(prefix="fuzz-") if comm.rank == 0 else None)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        if self.comm.rank == 0:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        self.comm.Barrier()
        return path

    def report(self, what, *details):
        if self.comm.rank == 0:
            print(what, *details, flush=True)
        self.bad += 1


def _outcome(read):
    """``("ok", graph facts)`` or ``("error", message)``; any other exception is a crash."""
    from mpisdnn.errors import MpisdnnError

    try:
        g = read()
    except MpisdnnError as exc:
        return ("error", str(exc))
    except Exception as exc:  # noqa: BLE001 - a crash is what this looks for
        return ("crash", f"{type(exc).__name__}: {exc}")
    m = g.matrix.tocsr()
    labels = [None if x is None else [str(v) for v in x] for x in (g.row_labels, g.col_labels)]
    return ("ok", m.shape, m.indptr.tolist(), m.indices.tolist(), m.data.tobytes(), labels)


def _by_labels(g) -> dict:
    m = g.matrix.tocoo()
    rl, cl = list(g.row_labels), list(g.col_labels)

    def key(x):
        return x.encode() if isinstance(x, str) else bytes(x) if isinstance(x, bytes) else int(x)

    return {(key(rl[r]), key(cl[c])): float(v) for r, c, v in zip(m.row, m.col, m.data)}


def _plain_reading(rows, weights) -> dict:
    """The grammar read in Python: per column, integers when every id is a canonical int,
    else UTF-8 bytes; weights summed over repeats, an unweighted repeat one edge, a weight
    (or a sum) of 0 no edge."""
    keyed = []
    for col in list(zip(*rows))[:2]:
        ints = all(_canonical_int(f) for f in col)
        keyed.append([int(f) for f in col] if ints else [f.encode() for f in col])
    out = {}
    for i, pair in enumerate(zip(*keyed)):
        out[pair] = out.get(pair, 0.0) + float(weights[i]) if weights else 1.0
    return {k: w for k, w in out.items() if w != 0}  # a weight of 0 is no edge


def _compare_readers(run, path, fmt, rows=None, weights=None, **options):
    """The collective reader against the serial one at this world size; with ``rows``, the
    serial reader's labelled graph against :func:`_plain_reading` too."""
    from mpisdnn.projection import read_graph
    from mpisdnn.projection.load import load_graph

    comm = run.comm
    got = _outcome(lambda: load_graph(comm, path, fmt, **options)[0])
    every = comm.gather(got, root=0)
    if comm.rank != 0:
        return
    want = _outcome(lambda: read_graph(path, fmt, **options))
    text = Path(path).read_text(encoding="utf-8")
    for x in [*every, want]:
        if x[0] == "crash":
            run.report("CRASH", repr(text), x[1])
    if any(x != want for x in every):
        run.report("RANKS DIFFER", repr(text), [x[:2] for x in every], want[:2])
    elif rows is not None and want[0] == "ok":
        graph = read_graph(path, fmt, **options)
        plain = _plain_reading(rows, weights)
        if _by_labels(graph) != plain:
            run.report("GRAMMAR", repr(text), _by_labels(graph), plain)


#: The UTF-8 byte-order mark (written as U+FEFF): some files start with one.
BOM = "\ufeff"

#: ids a file may hold: integers, ones Python's int() reads or trips on, text, separators
IDS = ["0", "1", "2", "3", "5", "-1", "10", "007", "+2", "--5", "1_0", "-0", " 7", "5-",
       "u:1", "a b", "x;y", "c,d", "Zürich", "東京", str(2**63), str(-(2**63)),
       "99999999999999999999"]  # fmt: skip
WEIGHTS = ["1", "0.5", "1e3", "-2", "inf", "nan", "1_0", " 1", "+1", ".5", "5.", "0x1", "1e400",
           "-0", "0", "1e-400", "7"]  # fmt: skip


def fuzz_edges(run, cases):
    rng = run.rng
    for t in range(cases):
        ncol = rng.choice([2, 3])
        pool = rng.sample(IDS, rng.randint(2, 8)) if rng.random() < 0.5 else IDS[:6]
        lines = []
        for _ in range(rng.randint(1, 8)):
            f = [rng.choice(pool), rng.choice(pool)]
            if ncol == 3:
                f.append(rng.choice(WEIGHTS[:4] if rng.random() < 0.7 else WEIGHTS))
            lines.append(f)
        if rng.random() < 0.05:
            lines[rng.randrange(len(lines))][rng.randrange(2)] = ""  # an empty id: refused
        if rng.random() < 0.03:
            lines[rng.randrange(len(lines))][rng.randrange(2)] = "n\0"  # a NUL: refused
        bom = BOM if rng.random() < 0.1 else ""  # text encoding, not part of the first id
        path = run.write(f"e{t}.tsv", bom + "".join("\t".join(f) + "\n" for f in lines))
        _compare_readers(run, path, "tsv")
        plain = ncol == 2 or all(_float_ok(f[2]) for f in lines)
        if plain and all(f[0] and f[1] and "\0" not in f[0] + f[1] for f in lines):
            _compare_readers(run, path, "tsv", rows=lines,
                             weights=[f[2] for f in lines] if ncol == 3 else None,
                             header=False, ids="label")  # fmt: skip


def _float_ok(f: str) -> bool:
    try:
        return np.isfinite(float(f)) and abs(float(f)) < 1e300
    except ValueError:
        return False


def fuzz_csv(run, cases):
    rng = run.rng
    pool = ["a", "b,c", 'q"q', "line\nbreak", " sp ", "7", "007", "-1", "x;y", "Zürich", "12",
            "3", "\t"]  # fmt: skip
    for t in range(cases):
        weighted = t % 2 == 1
        rows = [[rng.choice(pool), rng.choice(pool)] + ([rng.choice(["1", "2.5", "-1"])]
                if weighted else []) for _ in range(rng.randint(1, 8))]  # fmt: skip
        buf = io.StringIO(newline="")
        quoting = rng.choice([csv.QUOTE_MINIMAL, csv.QUOTE_ALL])
        csv.writer(buf, lineterminator="\n", quoting=quoting).writerows(rows)
        bom = BOM if rng.random() < 0.1 else ""
        path = run.write(f"c{t}.csv", bom + buf.getvalue())
        _compare_readers(run, path, "csv", rows=rows,
                         weights=[r[2] for r in rows] if weighted else None,
                         header=False, ids="label")  # fmt: skip


def fuzz_mtx(run, cases):
    import scipy.io

    from mpisdnn.projection import read_graph
    from mpisdnn.projection.load import load_graph

    rng, comm = run.rng, run.comm
    values = ["1", "2", "-3", "0.5", "1e3", "0", "nan", "inf", "1.5e", "x", "-0", "+2", ".5"]
    for t in range(cases):
        field = rng.choice(["real", "integer", "pattern", "double"])
        sym = rng.choice(["general", "general", "symmetric", "skew-symmetric"])
        nr = rng.randint(1, 5)
        nc = nr if sym != "general" else rng.randint(1, 5)
        ents = []
        for _ in range(rng.randint(0, 7)):
            i, j = rng.randint(1, nr), rng.randint(1, nc)
            if rng.random() < 0.08:
                i = rng.choice([0, nr + 1])
            if sym != "general" and i < j:
                i, j = j, i
            v = rng.choice(values[:6] if rng.random() < 0.85 else values)
            ents.append(f"{i} {j}" + ("" if field == "pattern" else f" {v}"))
        nnz = len(ents) + (rng.choice([-1, 1]) if rng.random() < 0.08 else 0)
        text = (f"%%MatrixMarket matrix coordinate {field} {sym}\n{nr} {nc} {nnz}\n"
                + "".join(e + "\n" for e in ents))  # fmt: skip
        path = run.write(f"m{t}.mtx", text)
        every = comm.gather(_outcome(lambda p=path: load_graph(comm, p, "mtx")[0]), root=0)
        if comm.rank != 0:
            continue
        want = _outcome(lambda p=path: read_graph(p))
        if any(x != want for x in every) or want[0] == "crash":
            run.report("RANKS DIFFER", repr(text), [x[:2] for x in every], want[:2])
            continue
        try:
            ref = sp.csr_matrix(scipy.io.mmread(path))
        except Exception:  # noqa: BLE001, S112 - scipy refuses what it refuses
            continue
        if want[0] == "ok" and field != "pattern":
            got = read_graph(path).matrix.toarray()
            if not np.array_equal(got, ref.toarray(), equal_nan=True):
                if not (field == "integer" and "1e3" in text):  # scipy reads 1e3 as 1
                    run.report("VS SCIPY", repr(text), got.tolist(), ref.toarray().tolist())


def fuzz_inputs(run, cases):
    from mpisdnn.formats import read_images_tsv
    from mpisdnn.formats.tsv_parallel import read_images_parallel

    rng, comm = run.rng, run.comm
    odd_ids = ["0", "-1", "+1", "01", "1.0", " 1", "99", str(2**63), "", "x"]
    odd_values = ["nan", "inf", "1e40", "1e-50", "-0", "0", "+1", "0x1", "1_0", "1.5e", ".5"]
    n = 8
    for t in range(cases):
        lines = []
        for _ in range(rng.randint(1, 12)):
            f = [str(rng.randint(1, 6)), str(rng.randint(1, n)), rng.choice(["1", "0.5", "2"])]
            if rng.random() < 0.25:
                j = rng.randrange(3)
                f[j] = rng.choice(odd_ids if j < 2 else odd_values)
            lines.append("\t".join(f) + ("\r" if rng.random() < 0.05 else ""))
        text = "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")
        path = run.write(f"i{t}.tsv", text)
        source = path
        if rng.random() < 0.5:  # the parallel reader takes its gzip: one member or several
            source = _gzip_copy(run, path, f"i{t}.tsv.gz", rng.choice([1, 1, 2, 3]))

        def parallel(p=source):
            b = read_images_parallel(comm, p, n, progress_interval=0)
            return b.y

        got = _matrix_outcome(parallel)
        every = comm.gather(got, root=0)
        if comm.rank != 0:
            continue
        want = _matrix_outcome(lambda p=path: read_images_tsv(p, n))
        if any(x[0] == "crash" for x in [*every, want]):
            run.report("CRASH", repr(text), [x[1] for x in [*every, want] if x[0] == "crash"])
        elif {x[0] for x in every} != {want[0]}:
            run.report("READERS DIFFER", repr(text), [x[:2] for x in every], want[:2])
        elif want[0] == "ok":
            whole = sp.vstack([x[1] for x in every]).tocsr()
            if not _same_bits(whole, want[1]):
                run.report("MATRICES DIFFER", repr(text))


def _gzip_copy(run, path, name, members):
    """``path`` gzipped into ``name``: ``members`` gzip members cut at random bytes (what
    ``cat a.gz b.gz`` makes), each one a complete stream."""
    import gzip

    out = os.path.join(run.dir, name)
    raw = Path(path).read_bytes()
    cuts = sorted(run.rng.randint(0, len(raw)) for _ in range(members - 1))  # every rank
    if run.comm.rank == 0:
        parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
        Path(out).write_bytes(b"".join(gzip.compress(p) for p in parts))
    run.comm.Barrier()
    return out


def _matrix_outcome(read):
    """``("ok", what read() returns)``, ``("error", its line)`` or ``("crash", ...)``."""
    from mpisdnn.errors import MpisdnnError

    try:
        return ("ok", read())
    except MpisdnnError as exc:
        return ("error", str(exc))
    except Exception as exc:  # noqa: BLE001
        return ("crash", f"{type(exc).__name__}: {exc}")


def _same_bits(a, b) -> bool:
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    a.sort_indices()
    b.sort_indices()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data.view(np.uint32), b.data.view(np.uint32)))  # fmt: skip


def _on_every_rank(run, work, *context):
    """``work()`` on every rank; on rank 0 the list of every rank's result, ``None`` on the
    others and where a rank failed (reported as ERROR with ``context``)."""
    try:
        mine = ("ok", work())
    except Exception as exc:  # noqa: BLE001 - a failure is what this looks for
        mine = ("error", f"{type(exc).__name__}: {exc}")
    every = run.comm.gather(mine, root=0)
    if run.comm.rank != 0:
        return None
    failed = [x[1] for x in every if x[0] == "error"]
    if failed:
        run.report("ERROR", *context, failed[0])
        return None
    return [x[1] for x in every]


def _reference_projection(a, weight, onto, self_loops, triangle, min_weight, top_k) -> dict:
    """scipy's AᵀA, weighted, filtered afterwards: min-weight, then the top k of every row
    (ties: the smaller column), as docs/projection.md defines the result. ``product`` and
    ``cosine`` read the weights, the others the pattern; ``ratio`` divides by the other
    side's size, ``newman`` weighs each shared ``k`` by ``1 / (deg k - 1)``."""
    w = sp.csr_matrix(a, dtype=np.float64)
    if onto == "rows":
        w = sp.csr_matrix(w.T)
    b = w.copy()
    b.data[:] = 1
    c = (b.T @ b).toarray()
    d = np.asarray(b.sum(axis=0)).ravel()
    kdeg = np.asarray(b.sum(axis=1)).ravel()
    kfac = np.where(kdeg > 1, 1.0 / np.maximum(kdeg - 1, 1), 0.0)
    p = (w.T @ w).toarray()
    nrm = np.sqrt(np.asarray(w.multiply(w).sum(axis=0)).ravel())
    with np.errstate(divide="ignore", invalid="ignore"):
        h = {"count": c, "jaccard": c / (d[:, None] + d[None, :] - c),
             "overlap": c / np.minimum(d[:, None], d[None, :]),
             "ratio": c / max(b.shape[0], 1), "product": p,
             "newman": (b.T @ sp.diags(kfac) @ b).toarray(),
             "cosine": p / (nrm[:, None] * nrm[None, :])}[weight]  # fmt: skip
    out = {}
    for u in range(c.shape[0]):
        row = [(v, h[u, v]) for v in range(c.shape[0]) if c[u, v] > 0
               and (self_loops == "keep" or u != v) and (triangle == "full" or v >= u)]  # fmt: skip
        if min_weight is not None:
            row = [(v, w) for v, w in row if w >= min_weight]
        if top_k is not None:
            row = sorted(row, key=lambda e: (-e[1], e[0]))[:top_k]
        out.update(((u, v), w) for v, w in row)
    return out


def fuzz_project(run, cases):
    from mpisdnn.projection import Graph, project

    rng, comm = run.rng, run.comm
    for _ in range(cases):
        seed = rng.randrange(1 << 30)
        a = sp.random(rng.randint(1, 30), rng.randint(1, 30), format="csr",
                      density=rng.choice([0.05, 0.2, 0.5]), random_state=seed)  # fmt: skip
        weighted = rng.random() < 0.4
        a.data = 0.1 + 1.9 * a.data if weighted else np.ones_like(a.data)
        weight = rng.choice(["count", "jaccard", "overlap", "cosine", "ratio", "newman",
                             "product"])  # fmt: skip
        triangle = rng.choice(["full", "upper"])
        loops = "drop" if weight == "newman" else rng.choice(["drop", "keep"])
        opts = dict(weight=weight, onto=rng.choice(["cols", "rows"]),
                    self_loops=loops, triangle=triangle,
                    top_k=rng.choice([None, None, 1, 2, 5]) if triangle == "full" else None,
                    min_weight=rng.choice([None, None, 2.0, 0.3 + 1e-9, 1.0]),
                    memory_per_rank=rng.choice([None, "64K", "1M"]),
                    threads=rng.choice([1, 2]))  # fmt: skip
        if weight == "count" and opts["min_weight"] is not None:
            opts["min_weight"] = float(round(opts["min_weight"]))
        if opts["top_k"] is not None and rng.random() < 0.5:
            opts["top_k_upper"] = rng.choice([True, False])
        def work(a=a, weighted=weighted, opts=opts):
            res = project(comm, Graph(a, weighted, "fuzz"), **opts)
            return res.row_start, sp.coo_matrix(res.matrix)

        every = _on_every_rank(run, work, seed, opts)
        if every is None:
            continue
        got = {(int(i) + r0, int(j)): float(v)
               for r0, m in every for i, j, v in zip(m.row, m.col, m.data)}  # fmt: skip
        keys = ("weight", "onto", "self_loops", "triangle", "min_weight", "top_k")
        want = _reference_projection(a, *(opts[k] for k in keys))
        if set(got) != set(want) or any(abs(got[k] - w) > 1e-12 * max(1, abs(w))
                                        for k, w in want.items()):  # fmt: skip
            run.report("PROJECTION", seed, a.shape, opts)


def fuzz_infer(run, cases):
    from mpisdnn import InferOptions, Network, balanced_blocks, infer, reference_inference

    rng, comm = run.rng, run.comm
    for _ in range(cases):
        seed = rng.randrange(1 << 30)
        r = np.random.default_rng(seed)
        n, nl = int(rng.choice([16, 32, 64, 96])), rng.randint(1, 12)
        layers = []
        for _ in range(nl):
            w = sp.random(n, n, density=rng.choice([0.05, 0.1, 0.3]), format="csr",
                          random_state=r, dtype=np.float32)  # fmt: skip
            kind = rng.choice(["pos", "mixed", "official", "odd"])
            if kind == "official":
                w.data[:] = 0.0625
            elif kind != "pos":
                w.data = (w.data * (3.3 if kind == "odd" else 1) - 0.4).astype(np.float32)
            layers.append(w)
        bias = (np.full((nl, n), -0.3, np.float32) if rng.random() < 0.5
                else r.uniform(-0.5, 0.2, (nl, n)).astype(np.float32))  # fmt: skip
        net = Network(layers, bias, n)
        y0 = sp.random(rng.randint(1, 80), n, density=rng.choice([0.05, 0.2, 0.5]), format="csr",
                       random_state=r, dtype=np.float32)  # fmt: skip
        y0.data = (y0.data * rng.choice([1, 10, 40])).astype(np.float32)
        if rng.random() < 0.3:  # identical rows, for the deduplication
            y0 = sp.vstack([y0, y0[: max(1, y0.shape[0] // 2)]]).tocsr()
        y0.sort_indices()
        opts = dict(max_group=rng.choice([1, 2, 3, 8, 128]), first_group=rng.choice([1, 2, 8]),
                    dedup=rng.random() < 0.6, prune=rng.random() < 0.8,
                    push_density=rng.choice([None, 0.0, 0.5, 1.0]),
                    rebalance_threshold=rng.choice([0, 1.25, 1.01]),
                    memory_per_rank=rng.choice([None, None, 1 << 12, 1 << 16]),
                    threads=rng.choice([1, 2]), chunk_tiles=rng.choice([1, 4, 16]))  # fmt: skip
        offs = balanced_blocks(np.diff(y0.indptr), comm.size)
        lo, hi = offs[comm.rank], offs[comm.rank + 1]
        def work(net=net, y0=y0, lo=lo, hi=hi, opts=opts):
            return infer(net, y0[lo:hi], comm, row_offset=lo, g_rows=y0.shape[0],
                         options=InferOptions(**opts)).y_local  # fmt: skip

        every = _on_every_rank(run, work, seed, opts)
        if every is not None and not _same_bits(sp.vstack(every), reference_inference(y0, net)):
            run.report("INFERENCE", seed, n, nl, opts)


def fuzz_outputs(run, cases):
    """Every output format (HDF5 general or symmetric, compressed or not; Matrix Market
    general or symmetric; TSV 0- or 1-based; Parquet), written by every rank's rows and read
    back whole: the in-memory projection, values bit for bit, labels included."""
    import importlib.util

    from mpisdnn.projection import Graph, project, read_projection

    rng, comm = run.rng, run.comm
    formats = ["h5", "mtx", "tsv"] + (["parquet"] if importlib.util.find_spec("pyarrow") else [])
    for t in range(cases):
        seed = rng.randrange(1 << 30)
        a = sp.random(rng.randint(1, 25), rng.randint(1, 25), format="csr",
                      density=rng.choice([0.1, 0.3]), random_state=seed)  # fmt: skip
        weighted = rng.random() < 0.5
        if not weighted:
            a.data[:] = 1
        weight = rng.choice(["count", "jaccard", "cosine", "product"] if weighted
                            else ["count", "jaccard", "overlap", "newman", "hive"])  # fmt: skip
        fmt = rng.choice(formats)
        symmetric = fmt in ("h5", "mtx") and weight != "hive" and rng.random() < 0.4
        opts = dict(weight=weight, onto=rng.choice(["cols", "rows"]),
                    self_loops=rng.choice(["drop", "keep"]),
                    storage="symmetric" if symmetric else "general",
                    memory_per_rank=rng.choice([None, "64K"]))  # fmt: skip
        if fmt == "tsv":
            opts["index_base"] = rng.choice([0, 1])
        if fmt in ("h5", "parquet") and rng.random() < 0.3:
            opts["compress"] = "gzip"
        labels = None
        if rng.random() < 0.3:
            names = [f"n:{i:03d}, {'é' * (i % 3)}" for i in range(max(a.shape))]
            labels = (names[: a.shape[0]], names[: a.shape[1]])
        graph = Graph(a, weighted, "fuzz") if labels is None else Graph(
            a, weighted, "fuzz", row_labels=np.array(labels[0]), col_labels=np.array(labels[1]))
        out = os.path.join(run.dir, f"o{t}.{fmt}")
        def work(graph=graph, opts=opts, out=out):
            whole = project(comm, graph, **{**opts, "storage": "general"})
            project(comm, graph, **opts, output=out)
            return whole.matrix

        every = _on_every_rank(run, work, seed, fmt, opts)
        if every is None:
            continue
        want = sp.vstack(every).tocsr()
        try:
            got, lab = read_projection(out, with_labels=True)
        except Exception as exc:  # noqa: BLE001
            run.report("READ BACK", seed, fmt, opts, f"{type(exc).__name__}: {exc}")
            continue
        if not _same_values(got, want):
            run.report("OUTPUT", seed, fmt, opts)
        elif labels is not None:
            side = labels[1] if opts["onto"] == "cols" else labels[0]
            if lab is None or [str(x) for x in lab[0]] != side:
                run.report("LABELS", seed, fmt, opts, lab and list(lab[0])[:3], side[:3])


def _same_values(a, b) -> bool:
    """The same entries, values equal as float64 bit patterns (counts may come back as
    integers of another width)."""
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    a.sort_indices()
    b.sort_indices()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data.astype(np.float64).view(np.uint64),
                               b.data.astype(np.float64).view(np.uint64)))  # fmt: skip


def fuzz_frames(run, cases):
    """``Graph.from_edges`` of pandas DataFrames and pyarrow Tables with ids of every integer
    width, text (object, ``string``, categorical, Arrow string and dictionary) and weights of
    several types, against the edges summed in Python (a weight of 0 no edge)."""
    import importlib.util

    import pandas as pd

    from mpisdnn.errors import MpisdnnError
    from mpisdnn.projection import Graph

    arrow = importlib.util.find_spec("pyarrow") is not None
    rng = run.rng
    int_types = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
    for t in range(cases):
        n = rng.randint(1, 12)
        cols = {}
        for side in ("s", "t"):
            kind = rng.choice(["int", "str", "category", "string", "arrow"] if arrow
                              else ["int", "str", "category", "string"])  # fmt: skip
            if kind == "int":
                dt = rng.choice(int_types)
                hi = int(np.iinfo(dt).max)  # uint64 past 2**63 included
                lo = max(int(np.iinfo(dt).min), -(2**63))
                vals = [rng.choice([lo, hi, 0, 1, 7]) if rng.random() < 0.3
                        else rng.randint(max(lo, -5), min(hi, 9)) for _ in range(n)]  # fmt: skip
                cols[side] = (pd.Series(np.array(vals, dtype=dt)), vals)
            else:
                vals = [rng.choice(["a", "b", "é", "x y", "7", "07", ":"]) for _ in range(n)]
                ser = {"str": pd.Series(vals, dtype=object), "category": pd.Series(
                    vals, dtype="category"), "string": pd.Series(vals, dtype="string"),
                    "arrow": pd.Series(vals, dtype=object)}[kind]  # fmt: skip
                cols[side] = (ser, vals)
        weighted = rng.random() < 0.5
        w = [rng.choice([1, 2, 0.5, 0, -1.5]) for _ in range(n)] if weighted else None
        df = pd.DataFrame({"s": cols["s"][0], "t": cols["t"][0]})
        if weighted:
            df["w"] = np.array(w, dtype=rng.choice(["float64", "float32", "int64"]))
            if df["w"].dtype.kind == "i":
                w = [int(x) for x in df["w"]]
        table = df
        if arrow and rng.random() < 0.4:
            import pyarrow as pa

            table = pa.Table.from_pandas(df, preserve_index=False)
            if rng.random() < 0.5 and table.schema.field("s").type == pa.string():
                table = table.set_column(0, "s", table.column("s").dictionary_encode())
        want = {}
        for i, (a, b) in enumerate(zip(cols["s"][1], cols["t"][1])):
            want[(a, b)] = want.get((a, b), 0.0) + (float(w[i]) if weighted else 1.0)
        if not weighted:
            want = dict.fromkeys(want, 1.0)
        want = {k: v for k, v in want.items() if v != 0}
        try:
            g = Graph.from_edges(table, source="s", target="t", weight="w" if weighted else None)
        except MpisdnnError as exc:
            run.report("REFUSED", t, df.dtypes.to_dict(), str(exc))
            continue
        m = g.matrix.tocoo()
        rl, cl = list(g.row_labels), list(g.col_labels)

        def plain(x):
            return x.item() if hasattr(x, "item") else x

        got = {(plain(rl[r]), plain(cl[c])): float(v) for r, c, v in zip(m.row, m.col, m.data)}
        if got != want:
            run.report("FRAME", t, df.dtypes.to_dict(), got, want)



#: layer weights a file may hold (float32 midpoints and their neighbours included: a parser
#: that rounds twice, or inexactly, lands on the other side of a tie)
NET_VALUES = ["0.0625", "-0.0625", "1", "0.5", "2.25", "-3", "1e-3", "6.25e-2", "0.1",
              "0.30000001192092896", "1.00000005960464477539062500",  # 1 + 2**-24: a tie
              "1.0000000596046448", "1.0000000596046447", "3.4028235e38", "1e-45", "+1",
              "0.0", "-0"]  # fmt: skip
NET_ODD = ["nan", "inf", "-inf", "1e40", "x", "0x1", "1_0", ".5", "5.", "", "1e400",
           "1.5e", "1,5"]  # fmt: skip


def _layer_lines(rng, n):
    """One random layer: ``(lines, entries)``; entries ``{(row, col): value text}``, 1-based,
    in column order or shuffled."""
    count = rng.randint(1, min(3 * n, n * n))
    cells = rng.sample(range(n * n), count)
    entries = {(c % n + 1, c // n + 1): rng.choice(NET_VALUES) for c in cells}
    order = sorted(entries, key=lambda rc: (rc[1], rc[0]))
    if rng.random() < 0.3:
        rng.shuffle(order)
    return [[str(r), str(c), entries[r, c]] for r, c in order], entries


def _layer_fault(rng, n, lines):
    """A fault in one layer's lines, in place; its name."""
    kind = rng.choice(["dup", "index", "value", "fields", "blank", "space", "crlf", "final",
                       "comment", "empty"])  # fmt: skip
    i = rng.randrange(len(lines))
    if kind == "dup":
        lines.insert(rng.randrange(len(lines) + 1), list(lines[i]))
    elif kind == "index":
        lines[i][rng.randrange(2)] = rng.choice(["0", str(n + 1), "-1", "+1", "01", "1.0", "x",
                                                 str(2**63), ""])  # fmt: skip
    elif kind == "value":
        lines[i][2] = rng.choice(NET_ODD)
    elif kind == "fields":
        lines[i] = lines[i][:2] if rng.random() < 0.5 else [*lines[i], "1"]
    elif kind == "blank":
        lines.insert(i, [])
    elif kind == "comment":
        lines.insert(0, ["# a comment"])
    elif kind == "empty":
        lines.clear()
    return kind


def _layer_text(rng, lines, kind):
    sep = " " if kind == "space" else "\t"
    end = "\r\n" if kind == "crlf" else "\n"
    text = "".join(sep.join(f) + end for f in lines)
    if kind == "final" and text:
        text = text[: -len(end)]
    return text


def _network_source(run, t, n, texts, container, fault):
    """The layer texts (``{name: text}``) as a directory, a ``.tar`` or a ``.tar.gz``
    (members shuffled, some under ``neuron{N}/``), with a container ``fault``; the path."""
    import gzip
    import io
    import tarfile

    rng = run.rng
    names = list(texts)
    if container != "dir" or rng.random() < 0.5:
        rng.shuffle(names)
    if fault == "repeat":  # one member twice in the archive
        names.append(rng.choice(names))
    base = os.path.join(run.dir, f"neuron{n}-{t}")
    prefix = f"neuron{n}/" if rng.random() < 0.7 else ""
    cut = rng.random()
    if run.comm.rank == 0:
        if container == "dir":
            os.makedirs(base)
            for name in names:
                data = texts[name].encode()
                if fault == "gzip-member" and name == names[0]:
                    data = gzip.compress(data)
                Path(base, name).write_bytes(data)
        else:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for name in names:
                    data = texts[name].encode()
                    if fault == "gzip-member" and name == names[0]:
                        data = gzip.compress(data)
                    info = tarfile.TarInfo(prefix + name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            raw = buf.getvalue()
            if container == "tar.gz":
                raw = gzip.compress(raw)
            if fault == "truncated":
                raw = raw[: max(1, int(len(raw) * cut))]
            Path(base + "." + container).write_bytes(raw)
    run.comm.Barrier()
    return base if container == "dir" else base + "." + container


def _same_layers(a, b) -> bool:
    return len(a) == len(b) and all(
        _same_bits(wa, wb) and np.array_equal(ba.view(np.uint32), bb.view(np.uint32))
        for (wa, ba), (wb, bb) in zip(a, b))  # fmt: skip


def _first_difference(got, want):
    """Where two lists of ``(layer, bias)`` first differ, for the report."""
    for k, ((wg, bg), (ww, bw)) in enumerate(zip(got, want)):
        if not np.array_equal(bg.view(np.uint32), bw.view(np.uint32)):
            return f"layer {k + 1}: bias {bg[:3]} against {bw[:3]}"
        a, b = wg.todok(), ww.todok()
        for key in sorted(set(a.keys()) | set(b.keys())):
            if key not in a or key not in b or a[key].tobytes() != b[key].tobytes():
                return f"layer {k + 1} {key}: {a.get(key)!r} against {b.get(key)!r}"
    return f"{len(got)} layers against {len(want)}"


def _network_case(run, t):
    """One random network source: ``(src, case, bias, plain)``; ``plain`` the layers'
    entries when no fault was put in, else ``None``."""
    rng = run.rng
    n = rng.choice([4, 16, 33, 1024])
    nl = rng.randint(1, 5)
    bias = None if n == 1024 and rng.random() < 0.5 else rng.choice([-0.3, 0.25, -1e-3])
    texts, plain = {}, []
    faulted = rng.random() < 0.5
    bad_layer = rng.randrange(nl) if faulted and rng.random() < 0.7 else -1
    fault = "layer" if faulted else "clean"
    for k in range(nl):
        lines, entries = _layer_lines(rng, n)
        kind = _layer_fault(rng, n, lines) if k == bad_layer else "clean"
        texts[f"n{n}-l{k + 1}.tsv"] = _layer_text(rng, lines, kind)
        plain.append(entries)
    container = rng.choice(["dir", "tar", "tar.gz"])
    last = f"n{n}-l{nl}.tsv"
    if faulted and bad_layer < 0:
        fault = rng.choice(["missing", "foreign", "extra", "gzip-member", "zero", "lead"]
                           + ([] if container == "dir" else ["truncated", "repeat"]))
        if fault == "missing" and nl > 1:
            del texts[f"n{n}-l{rng.randint(1, nl - 1)}.tsv"]
        elif fault == "foreign":
            texts[f"n{n * 2}-l1.tsv"] = "1\t1\t1\n"
        elif fault == "extra":
            texts["README"] = "not a layer\n"
        elif fault == "zero":
            texts[f"n{n}-l0.tsv"] = "1\t1\t1\n"
        elif fault == "lead":
            texts[f"n{n}-l0{nl}.tsv"] = texts[last]
    src = _network_source(run, t, n, texts, container, fault)
    return src, (t, container, fault, n, nl), bias, None if faulted else plain


def _plain_layers(plain, n, bias):
    """The layers read in plain Python: ``float`` of each value text, rounded once to
    float32; the bias ``bias`` (the official N=1024 one by default)."""
    b32 = np.float32(-0.3 if bias is None else bias)
    out = []
    for entries in plain:
        r = [r - 1 for r, _ in entries]
        c = [c - 1 for _, c in entries]
        v = np.array([float(x) for x in entries.values()]).astype(np.float32)
        out.append((sp.csr_matrix((v, (r, c)), shape=(n, n)), np.full(n, b32)))
    return out


def fuzz_network(run, cases):
    """TSV networks (a directory, a ``.tar`` or a ``.tar.gz`` as published, members in any
    order) with faults in a layer or in the container: ``read_network_compact`` (``infer``'s
    reader, every rank its share of the layers) and ``convert_network_tsv`` (read back from
    the v2 file it writes) against the serial readers (``read_network_tsv`` and
    ``read_network_archive``): the same layers bit for bit, or the same line; for a source
    without faults, also against the layers read in plain Python."""
    from mpisdnn.formats.archive import read_network_archive
    from mpisdnn.formats.network_convert import convert_network_tsv
    from mpisdnn.formats.network_read import read_network_compact
    from mpisdnn.formats.tsv import read_network_tsv
    from mpisdnn.formats.weight_store import open_weight_store

    comm = run.comm
    for t in range(cases):
        src, case, bias, plain = _network_case(run, t)
        out = os.path.join(run.dir, f"net{t}.h5")

        def compact(src=src, bias=bias):
            s = read_network_compact(comm, src, bias=bias)
            return [(s.layer(k).to_csr(), s.layer(k).bias) for k in range(len(s))]

        def converted(src=src, out=out, bias=bias):
            convert_network_tsv(comm, src, out, bias=bias, progress=0)
            s = open_weight_store(out)
            return [(s.layer(k).to_csr(), np.array(s.layer(k).bias)) for k in range(len(s))]

        def serial(src=src, bias=bias):
            read = read_network_tsv if os.path.isdir(src) else read_network_archive
            net = read(src, bias=bias)
            return list(zip(net.layers, net.bias))

        every = comm.gather([_matrix_outcome(compact), _matrix_outcome(converted)], root=0)
        if comm.rank != 0:
            continue
        want = _matrix_outcome(serial)
        outcomes = [x for g in every for x in g] + [want]
        if any(x[0] == "crash" for x in outcomes):
            run.report("CRASH", case, [x[1] for x in outcomes if x[0] == "crash"][:2])
        elif {x[0] for x in outcomes} != {want[0]}:
            run.report("READERS DIFFER", case, [x[:2] if x[0] != "ok" else "ok"
                                                for x in outcomes])  # fmt: skip
        elif want[0] == "error":
            if len({x[1] for x in outcomes}) > 1:
                run.report("LINES DIFFER", case, sorted({x[1] for x in outcomes}))
        elif not all(_same_layers(x[1], want[1]) for x in outcomes):
            run.report("LAYERS DIFFER", case, *[_first_difference(x[1], want[1])
                                                for x in outcomes[:-1]])  # fmt: skip
        elif plain is not None:
            ref = _plain_layers(plain, case[3], bias)
            if not _same_layers(want[1], ref):
                run.report("NOT THE PLAIN READING", case, _first_difference(want[1], ref))


def _cli_data(run):
    """The files the ``cli`` kind's command lines read: one 64-neuron network of 6 layers as
    v2 HDF5 (its own per-neuron bias), as a TSV directory and as a ``.tar.gz`` (weights of a
    few sixteenths, exact in text), 97 inputs as HDF5, TSV and ``.tsv.gz``; the reference's
    categories of each network form for every depth."""
    import gzip
    import tarfile

    from mpisdnn import Network, categories_of, reference_inference
    from mpisdnn.formats import write_inputs, write_network
    from mpisdnn.formats.tsv import write_triples

    r = np.random.default_rng(5)
    n, nl = 64, 6
    layers = []
    for _ in range(nl):
        w = sp.random(n, n, density=0.1, format="csr", random_state=r, dtype=np.float32)
        w.data = r.choice(np.float32([0.0625, 0.125, 0.25, -0.0625]), w.nnz)
        layers.append(w)
    y0 = sp.random(97, n, density=0.15, format="csr", random_state=r, dtype=np.float32)
    y0.data = r.choice(np.float32([1, 0.5, 2]), y0.nnz)
    y0.sort_indices()
    bias = r.uniform(-0.3, 0.0, (nl, n)).astype(np.float32)
    h5net, tsv_bias = Network(layers, bias, n), -0.125
    tsvnet = Network(layers, np.full((nl, n), tsv_bias, np.float32), n)
    d = Path(run.dir) / "cli"
    files = {k: str(d / v) for k, v in dict(h5="net.h5", dir="neuron64", tar="neuron64.tar.gz",
                                            y5="in.h5", tsv="in.tsv", gz="in.tsv.gz").items()}
    if run.comm.rank == 0:
        write_network(files["h5"], h5net)
        for k, w in enumerate(layers):
            write_triples(Path(files["dir"]) / f"n{n}-l{k + 1}.tsv", w)
        with tarfile.open(files["tar"], "w:gz") as t:
            for k in reversed(range(nl)):
                t.add(Path(files["dir"]) / f"n{n}-l{k + 1}.tsv", f"neuron64/n64-l{k + 1}.tsv")
        write_inputs(files["y5"], y0)
        write_triples(files["tsv"], y0)
        Path(files["gz"]).write_bytes(gzip.compress(Path(files["tsv"]).read_bytes()))
    run.comm.Barrier()
    want = {}
    for form, net in (("h5", h5net), ("tsv", tsvnet)):
        for depth in range(1, nl + 1):
            want[form, depth] = categories_of(reference_inference(y0, net, depth)).tolist()
    return files, want, nl, tsv_bias


def _infer_argv(rng, files, nl, tsv_bias, size, out):
    """A random ``infer`` command line: ``(argv, network form, depth, truth given right)``."""
    net = rng.choice(["h5", "dir", "tar"])
    argv = ["infer", "--network", files[net], "--inputs", files[rng.choice(["y5", "tsv", "gz"])],
            "--categories-out", out]  # fmt: skip
    argv += ["--quiet"] if rng.random() < 0.5 else ["--progress", rng.choice(["0", "0.001"])]
    depth = nl
    if rng.random() < 0.5:
        depth = rng.randint(1, nl)
        argv += ["--layers", str(depth)]
    if net != "h5" or rng.random() < 0.1:
        argv += ["--bias", str(tsv_bias)]
    pool = {
        "--threads": ["1", "2"], "--rebalance-threshold": ["0", "1.01", "1.5"],
        "--max-group": ["1", "2", "128"], "--push-density": ["0", "0.5", "1"],
        "--weight-memory": ["1K", "64K", "1G"], "--memory-per-rank": ["4K", "64K", "1G"],
        "--dedup": ["on", "off"], "--no-prune": [None],
    }  # fmt: skip
    if rng.random() < 0.15:  # the reference backend takes few of them (a refusal each)
        argv += ["--backend", "reference"]
    elif rng.random() < 0.3:
        argv += ["--backend", "cpu"]
    for flag in rng.sample(list(pool), rng.randint(0, 6)):
        value = rng.choice(pool[flag])
        argv += [flag] if value is None else [flag, value]
    stages = rng.choice([s for s in (1, 2, 3) if size % s == 0])
    if stages > 1 or rng.random() < 0.05:
        argv += ["--stages", str(stages)]
        if rng.random() < 0.5:
            argv += ["--stage-head", str(rng.randint(0, 3))]
        if rng.random() < 0.5:
            argv += ["--batch-rows", str(rng.choice([1, 7, 500]))]
    return argv, "h5" if net == "h5" else "tsv", depth


def _where(err: str) -> str:
    """A traceback's innermost mpisdnn frame and its last line (the exception)."""
    frames = re.findall(r'File "[^"]*/mpisdnn/([^"]+)", line (\d+), in (\w+)', err)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return f"{':'.join(frames[-1]) if frames else '?'}: {last[:200]}"


def _run_cli(run, argv, ok_codes, refusals, case=None):
    """``argv`` through ``mpisdnn.cli.main`` on every rank, as ``mpiexec`` runs it. On rank
    0: ``(exit code, every rank's stderr lines)`` when all ranks exited alike with a code of
    ``ok_codes``; a refusal (2) must be one line from rank 0 alone, and is kept in
    ``refusals`` under its line (paths as PATH). ``None`` on the other ranks and after a
    crash (reported, as ``case`` or the command line)."""
    from tests._cli_batch import run_captured

    code, _, err = run_captured(argv, run.comm)
    every = run.comm.gather((code, err), root=0)
    if run.comm.rank != 0:
        return None
    codes = {c for c, _ in every}
    lines = [e.strip().splitlines() for _, e in every]
    what = argv if case is None else case
    if len(codes) != 1 or code not in ok_codes:
        run.report("CRASH", what, sorted(codes), [_where(e) for _, e in every])
        return None
    if code == 2:
        if len(lines[0]) != 1 or any(lines[1:]):
            run.report("NOT ONE LINE", what, lines)
        key = re.sub(r"/\S+", "PATH", lines[0][-1])[:140] if lines[0] else "(no line)"
        refusals.setdefault(key, []).append(argv)
    return code, lines


def _print_refusals(run, refusals) -> None:
    """Each refusal line seen, how often, and the flags of its first command line."""
    if run.comm.rank == 0:
        for line, argvs in sorted(refusals.items()):
            flags = " ".join(a for a in argvs[0] if "/" not in a)
            print(f"  refused {len(argvs)}x:", line, "<-", flags)


def fuzz_cli(run, cases):
    """``infer`` command lines with random flags (backend, threads, groups, push density,
    weight and activation memory bounds, dedup, pruning, stages and their head and batches;
    networks as HDF5, a TSV directory or an archive; inputs as HDF5, TSV or ``.tsv.gz``),
    run through :func:`mpisdnn.cli.main` on every rank as ``mpiexec`` runs them: each either
    writes the reference's categories (plain scipy, the network's depth and bias) with exit
    0, or refuses with exit 2 and one line from rank 0 and nothing from the others. A
    truth file, right or wrong, must give PASS (0) or FAIL (1). Any other exit is a crash."""
    rng, comm = run.rng, run.comm
    files, want, nl, tsv_bias = _cli_data(run)
    refusals = {}
    for t in range(cases):
        out = os.path.join(run.dir, f"cats{t}.tsv")
        argv, form, depth = _infer_argv(rng, files, nl, tsv_bias, comm.size, out)
        truth = rng.choice([None, "right", "wrong"])
        if truth is not None:
            cats = list(want[form, depth]) if truth == "right" else [1, 2, 3]
            tpath = run.write(f"truth{t}.tsv", "".join(f"{c}\n" for c in cats))
            argv += ["--truth", tpath]
        verdict = _run_cli(run, argv, (0, 1, 2), refusals)
        if verdict is None or verdict[0] == 2:
            continue
        code, lines = verdict
        noise = [ln for ln in lines[0] if "warning" not in ln.lower()]
        if noise or any(lines[1:]):
            run.report("NOISE", argv, lines)
        else:
            got = [int(x) for x in Path(out).read_text().split()]
            if got != want[form, depth]:
                run.report("CATEGORIES", argv, len(got), len(want[form, depth]))
            if code != (1 if truth == "wrong" and got != [1, 2, 3] else 0):
                run.report("VERDICT", argv, code, truth)
    if comm.rank == 0:
        refused = sum(len(a) for a in refusals.values())
        print(f"  cli: {cases - refused} runs, {refused} refused")
    _print_refusals(run, refusals)



def fuzz_truth(run, cases):
    """Truth files (one 1-based row per line; blank lines, CRLF, spaces, odd and huge
    numbers, several fields, gzip) through ``load_truth`` (rank 0 reads, every rank gets the
    verdict) against a plain reading: every non-blank line one number that is a whole
    number from 1 to ``MAX_ROWS``, the set of them; else a line naming the first bad line."""
    from mpisdnn.formats._tsv_text import MAX_ROWS
    from mpisdnn.sdnn.load import load_truth

    rng, comm = run.rng, run.comm
    odd = ["0", "-1", "+1", "01", "1.0", "1e3", "1.5", "nan", "inf", "x", "1 2", "1\t", " 7",
           str(2**31 - 1), str(2**31), str(2**53 + 1), "9" * 23, "1e300", "1_0",
           "0x10"]  # fmt: skip
    for t in range(cases):
        lines = []
        for _ in range(rng.randint(0, 8)):
            lines.append(rng.choice(odd) if rng.random() < 0.2 else str(rng.randint(1, 50)))
            if rng.random() < 0.1:
                lines.append("")
        end = rng.choice(["\n", "\r\n"])
        bom = BOM if rng.random() < 0.1 else ""  # skipped, as the inputs reader skips it
        text = bom + "".join(x + end for x in lines)
        path = run.write(f"t{t}.tsv", text)
        if rng.random() < 0.3:
            path = _gzip_copy(run, path, f"t{t}.tsv.gz", rng.choice([1, 2]))
        got = _matrix_outcome(lambda p=path: load_truth(comm, p))
        every = comm.gather(got, root=0)
        if comm.rank != 0:
            continue
        want = ("ok", set())
        for x in lines:
            fields = x.split()
            if not fields:
                continue
            try:
                v = float(fields[0]) if len(fields) == 1 and "_" not in x else None
            except ValueError:
                v = None
            if v is None or not (1 <= v <= MAX_ROWS) or v != int(v):
                want = ("error", x)
                break
            want[1].add(int(v))
        mine = every[0]
        if any(x[0] == "crash" for x in every):
            run.report("CRASH", repr(text), [x[1] for x in every if x[0] == "crash"])
        elif mine[0] != want[0]:
            run.report("TRUTH", repr(text), mine[:2], want)
        elif want[0] == "ok" and mine[1].tolist() != sorted(want[1]):
            run.report("CATEGORIES", repr(text), mine[1].tolist(), sorted(want[1]))



def _h5_mutation(rng, path, kind):
    """One random change to the HDF5 file ``path`` (a v2 network or an inputs file), made in
    place on rank 0; its description."""
    import h5py

    if kind == "bytes":  # a few bytes changed (past the superblock: a damaged copy)
        raw = bytearray(Path(path).read_bytes())
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(96, len(raw))] = rng.randrange(256)
        Path(path).write_bytes(bytes(raw))
        return "bytes"
    if kind == "cut":
        raw = Path(path).read_bytes()
        Path(path).write_bytes(raw[: rng.randrange(len(raw))])
        return "cut"
    with h5py.File(path, "r+") as f:
        names = []
        f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
        name = rng.choice(names)
        if kind == "attr":
            key = rng.choice(sorted(f.attrs))
            value = rng.choice([0, -1, 2**40, 1.5, float("nan"), "x", 3, np.int8(7),
                                np.array([1, 2])])  # fmt: skip
            f.attrs[key] = value
            return f"attr {key}={value!r}"
        data = f[name][()]
        if kind == "delete":
            del f[name]
            return f"delete {name}"
        if kind == "dtype":
            new = data.astype(rng.choice([np.float64, np.int8, np.uint64, np.float16, np.int32]))
            del f[name]
            f[name] = new
            return f"dtype {name} {new.dtype}"
        if kind == "shape":
            new = data.reshape(-1)[: max(0, data.size - rng.randint(1, 3))]
            if rng.random() < 0.3:
                new = np.concatenate([data.reshape(-1), data.reshape(-1)[:2]])
            elif rng.random() < 0.3 and data.size >= 2:
                new = data.reshape(-1)[: data.size // 2 * 2].reshape(2, -1)
            del f[name]
            f[name] = new
            return f"shape {name} {new.shape}"
        if data.size:  # a value
            flat = data.reshape(-1).copy()
            i = rng.randrange(flat.size)
            choices = [0, 1, -1, 2**15, 2**31, 7, 65535]
            if flat.dtype.kind == "f":
                choices += [float("nan"), float("inf"), -0.0, 1e38]
            v = rng.choice(choices)
            try:
                flat[i] = v
            except (OverflowError, ValueError):
                return "value none"
            f[name][...] = flat.reshape(data.shape)
            return f"value {name}[{i}]={v!r}"
        return "value none"


def fuzz_hdf5(run, cases):
    """A valid v2 network (and a valid inputs file) with one random change (an attribute, a
    dataset deleted, retyped, reshaped or one of its values changed, bytes damaged, the file
    cut), through ``infer`` (``mpisdnn.cli.main`` on every rank): the reference's categories
    of what the files hold when the change leaves them valid, else exit 2 with one line from
    rank 0; never an internal error, a traceback or a hang."""
    from mpisdnn import Network, categories_of, reference_inference
    from mpisdnn.formats import read_inputs, read_network, write_inputs, write_network

    rng, comm = run.rng, run.comm
    r = np.random.default_rng(7)
    n, nl = 32, 3
    layers = [sp.random(n, n, density=0.2, format="csr", random_state=r, dtype=np.float32)
              for _ in range(nl)]  # fmt: skip
    bias = np.full((nl, n), -0.1, np.float32)
    y0 = sp.random(40, n, density=0.3, format="csr", random_state=r, dtype=np.float32)
    verdicts = {}
    for t in range(cases):
        net_path = os.path.join(run.dir, f"n{t}.h5")
        in_path = os.path.join(run.dir, f"i{t}.h5")
        target = rng.choice(["network", "inputs"])
        kind = rng.choice(["attr", "delete", "dtype", "shape", "value", "value", "bytes", "cut"])
        mine = random.Random(rng.randrange(1 << 30))  # rank 0's alone: the streams stay equal
        what = None
        if comm.rank == 0:
            write_network(net_path, Network(layers, bias, n))
            write_inputs(in_path, y0, truth=[1, 2] if mine.random() < 0.3 else None)
            what = _h5_mutation(mine, net_path if target == "network" else in_path, kind)
        what = comm.bcast(what)
        if os.environ.get("FUZZ_TRACE"):  # a case that kills the job: its files are kept
            os.write(2, f"[rank {comm.rank}] case {t}: {target} {what}\n".encode())
            if comm.rank == 0:
                import shutil

                for p in (net_path, in_path):
                    shutil.copy(p, os.path.join(os.environ["FUZZ_TRACE"], os.path.basename(p)))
        out = os.path.join(run.dir, f"c{t}.tsv")
        argv = ["infer", "--network", net_path, "--inputs", in_path, "--categories-out", out,
                "--quiet"]  # fmt: skip
        case = (t, target, what)
        verdict = _run_cli(run, argv, (0, 1, 2), {}, case)
        if verdict is None:
            continue
        code = verdict[0]
        verdicts[code] = verdicts.get(code, 0) + 1
        if code in (0, 1):  # accepted: what the files now hold, run by the reference
            try:
                net, y = read_network(net_path), read_inputs(in_path)[0]
                want = categories_of(reference_inference(y, net)).tolist()
            except Exception as exc:  # noqa: BLE001 - accepted by infer, refused here
                run.report("READERS DIFFER", case, f"{type(exc).__name__}: {exc}")
                continue
            got = [int(x) for x in Path(out).read_text().split()]
            if got != want:
                run.report("CATEGORIES", case, got[:5], want[:5])
    if comm.rank == 0:
        print(f"  hdf5: exit codes {dict(sorted(verdicts.items()))}")



def _project_argv(rng, files, out):
    """A random ``project`` command line: ``(argv, the flags that set the result)``."""
    src = rng.choice(list(files))
    weight = rng.choice(["count", "product", "ratio", "jaccard", "overlap", "newman", "cosine",
                         "hive"])  # fmt: skip
    result = ["--weight", weight, "--onto", rng.choice(["cols", "rows"]),
              "--self-loops", rng.choice(["drop", "keep"])]  # fmt: skip
    if rng.random() < 0.3:
        result += ["--triangle", "upper"]
    if rng.random() < 0.2:
        result += ["--min-weight", rng.choice(["0.5", "1", "2"])]
    if rng.random() < 0.2:
        result += ["--top-k", rng.choice(["1", "2", "5"])]
    free = []  # flags that must not change the result
    pool = {"--threads": ["1", "2"], "--memory-per-rank": ["4K", "64K", "1G"],
            "--storage": ["general", "symmetric"], "--compress": ["none", "gzip"],
            "--progress": ["0", "0.001"]}  # fmt: skip
    for flag in rng.sample(list(pool), rng.randint(0, 4)):
        value = rng.choice(pool[flag])
        free += [flag] if value is None else [flag, value]
    return ["project", files[src], "--ids", "index", *result, *free, "-o", out], result


def fuzz_cli_project(run, cases):
    """``project`` command lines with random weightings and filters, and flags that must not
    change the result (threads, a memory bound, symmetric storage, compression, progress),
    on TSV, CSV and Matrix Market inputs, through ``cli.main`` on every rank: the output read
    back equals the same weighting and filters run with none of those flags at one rank
    (``project_matrix``), or exit 2 with one line from rank 0."""
    from mpisdnn.errors import MpisdnnError
    from mpisdnn.projection import project_matrix, read_projection

    rng, comm = run.rng, run.comm
    r = np.random.default_rng(11)
    a = sp.random(40, 25, density=0.15, format="lil", random_state=r)
    a[0, 0], a[39, 24] = 1.0, 2.0  # the ids reach the shape's corners
    a = a.tocoo()
    a.data = np.round(r.uniform(0.5, 3, a.nnz) * 4) / 4
    if comm.rank == 0:
        lines = [f"{i}\t{j}\t{v}\n" for i, j, v in zip(a.row, a.col, a.data)]
        Path(run.dir, "g.tsv").write_text("".join(lines))
        Path(run.dir, "g.csv").write_text("".join(f"{i},{j}\n" for i, j in zip(a.row, a.col)))
    comm.Barrier()
    files = {k: os.path.join(run.dir, f"g.{k}") for k in ("tsv", "csv")}
    weighted = {"tsv": a.tocsr(), "csv": (a != 0).astype(np.float64).tocsr()}
    refused = {}
    for t in range(cases):
        out = os.path.join(run.dir, f"H{t}.h5")
        argv, result = _project_argv(rng, files, out)
        verdict = _run_cli(run, argv, (0, 2), refused)
        if verdict is None or verdict[0] == 2:
            continue
        opts = dict(zip(result[::2], result[1::2]))
        try:
            want = project_matrix(
                weighted[argv[1].rsplit(".", 1)[1]], weight=opts["--weight"],
                onto=opts["--onto"], self_loops=opts["--self-loops"],
                triangle=opts.get("--triangle", "full"),
                min_weight=float(opts["--min-weight"]) if "--min-weight" in opts else None,
                top_k=int(opts["--top-k"]) if "--top-k" in opts else None)  # fmt: skip
        except MpisdnnError as exc:
            run.report("CLI TOOK WHAT THE API REFUSES", argv, exc)
            continue
        got = read_projection(out)
        if got.shape != want.shape or (got != want).nnz:
            run.report("PROJECTION", argv, got.shape, want.shape, got.nnz, want.nnz)
    _print_refusals(run, refused)


KINDS = {"edges": fuzz_edges, "csv": fuzz_csv, "mtx": fuzz_mtx, "inputs": fuzz_inputs,
         "project": fuzz_project, "outputs": fuzz_outputs, "frames": fuzz_frames,
         "infer": fuzz_infer, "network": fuzz_network, "cli": fuzz_cli,
         "truth": fuzz_truth, "hdf5": fuzz_hdf5,
         "cli-project": fuzz_cli_project}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=[*KINDS, "all"])
    ap.add_argument("--cases", type=int, default=200, help="cases per kind (default 200)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    from mpi4py import MPI

    run = Run(MPI.COMM_WORLD, args.seed)
    for name in KINDS if args.kind == "all" else [args.kind]:
        before = run.bad
        KINDS[name](run, args.cases)
        if run.comm.rank == 0:
            print(f"{name}: {args.cases} cases, {run.bad - before} disagreements", flush=True)
    if run.comm.rank == 0:
        import shutil

        shutil.rmtree(run.dir, ignore_errors=True)
    return 1 if run.comm.allreduce(run.bad, op=MPI.MAX) else 0


if __name__ == "__main__":
    sys.exit(main())
