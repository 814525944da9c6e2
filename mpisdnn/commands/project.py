"""``mpisdnn project``: graph projection H = A^T A or A A^T (see mpisdnn.projection)."""

from __future__ import annotations

import sys

from ..parallel import agree_root, allreduce, communication_section, log
from ._common import add_choice, finite_float, nonneg_int, positive_int

DESCRIPTION = (
    "Project a (bipartite) graph onto one side: nodes u, v are connected when "
    "they share a neighbour. Rows are split across ranks by work and streamed to the output "
    "in chunks bounded by --memory-per-rank. Formats and formulas: docs/projection.md."
)


def add_arguments(p) -> None:
    p.add_argument("input", help="graph: .mtx, TSV/CSV edge list, ratings file or graph HDF5")
    add_choice(
        p,
        "--format",
        ("auto", "mtx", "tsv", "csv", "ratings", "h5"),
        help="input format: auto (default: by signature and extension), mtx, tsv, csv, "
        "ratings, h5",
    )
    add_choice(
        p,
        "--sep",
        ("auto", "tab", "comma", "semicolon", "whitespace", "::"),
        help="field separator of edge lists and ratings: auto (default: tabs if the file has "
        "any; CSV for .csv; '::' or blanks only where certain), tab, comma, semicolon, "
        "whitespace (runs of blanks), :: (MovieLens). An id is the whole field, byte for byte",
    )
    head = p.add_mutually_exclusive_group()
    head.add_argument(
        "--header",
        dest="header",
        action="store_const",
        const=True,
        default=None,
        help="the first record of an edge list is a header (column names): skip it "
        "(default: detected when its fields are not numbers where the rest are)",
    )
    head.add_argument(
        "--no-header",
        dest="header",
        action="store_const",
        const=False,
        help="the first record is data, even if it looks like a header",
    )
    base = p.add_mutually_exclusive_group()
    base.add_argument(
        "--one-based", action="store_true", help="TSV/CSV ids start at 1 (input and TSV output)"
    )
    base.add_argument(
        "--index-base",
        type=int,
        choices=(0, 1),
        help="first id of edge lists (default 0) and ratings (default 1); TSV, CSV and "
        "Parquet outputs number the nodes from it too",
    )
    add_choice(
        p,
        "--ids",
        ("auto", "index", "label"),
        help="edge-list/ratings ids: auto (default: labels when the ids are not integers or "
        "are sparse), index (integers used as indices), label (any text, kept as labels in "
        "every output). Ids are exact: integers in int64 or text, never floats",
    )
    p.add_argument(
        "--skip-lines", type=nonneg_int, default=0, help="lines to skip first in text inputs (0)"
    )
    add_choice(
        p,
        "--duplicates",
        ("sum", "error"),
        help="repeated input edges: add weights (default) or reject",
    )
    add_choice(p, "--onto", ("cols", "rows"), help="cols: H = A^T A (default); rows: H = A A^T")
    add_choice(
        p,
        "--weight",
        ("count", "product", "ratio", "jaccard", "overlap", "newman", "cosine", "hive"),
        help="edge weight of H (default count = shared neighbours)",
    )
    add_choice(
        p,
        "--self-loops",
        ("drop", "keep"),
        help="diagonal entries H[u,u]: drop (default, like networkx) or keep (like scipy)",
    )
    add_choice(
        p,
        "--triangle",
        ("full", "upper"),
        help="upper: only v > u, computed once (symmetric weightings only)",
    )
    add_choice(
        p,
        "--storage",
        ("general", "symmetric"),
        help="symmetric: .h5/.mtx outputs store only v >= u, computed once and mirrored by "
        "the readers (half the time and size; symmetric weightings)",
    )
    p.add_argument("--min-weight", type=finite_float, help="keep entries with weight >= X")
    p.add_argument(
        "--top-k",
        type=positive_int,
        help="keep the K heaviest entries per row (ties: smaller column), selected in the kernel",
    )
    p.add_argument(
        "--memory-per-rank",
        default=None,
        metavar="SIZE",
        help="bound for kernel scratch + one chunk of output, e.g. 64M, 2G "
        "(default: half the available memory / ranks on the node)",
    )
    p.add_argument(
        "--threads", type=positive_int, help="threads per rank (default: cores / ranks on node)"
    )
    p.add_argument(
        "-o",
        "--output",
        help="output file (.h5, .mtx, .tsv, .csv, .parquet directory); omit to only compute",
    )
    add_choice(
        p,
        "--output-format",
        ("auto", "h5", "mtx", "tsv", "csv", "parquet"),
        metavar="FMT",
        help="auto (default: by the output's extension), h5, mtx, tsv, csv, parquet",
    )
    add_choice(
        p,
        "--compress",
        ("none", "zstd", "blosc2", "gzip"),
        help="compress HDF5 (zstd, blosc2: bit-shuffled, need hdf5plugin) or Parquet output",
    )
    p.add_argument("--report", metavar="JSON", help="write the full report as JSON")
    p.add_argument(
        "--progress",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="progress line interval on rank 0 (default 10 s; 0 = off)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines and no summary")
    p.set_defaults(run=run)


class _Progress:
    """Rank 0's progress lines: the read's phases, then rows done at most every
    ``interval`` seconds (nothing for a run shorter than one interval)."""

    def __init__(self, comm, interval: float):
        import time

        self.on = comm.rank == 0 and interval > 0
        self.interval = interval
        self.last = time.perf_counter()

    def say(self, line: str) -> None:
        if self.on:
            print(f"[progress] {line}", flush=True)

    def __call__(self, done: int, total: int, seconds: float) -> None:
        import time

        from ..progress import format_duration

        now = time.perf_counter()
        if not self.on or now - self.last < self.interval or done >= total:
            return
        self.last = now
        eta = seconds / done * (total - done) if done else 0.0
        self.say(
            f"rows (rank 0) {done}/{total} ({100 * done / max(total, 1):.0f} %)  elapsed "
            f"{format_duration(seconds)}  ETA {format_duration(eta)}"
        )


def run(args, comm) -> int:
    import time

    from ..parallel import agree
    from ..paths import prepare_outputs
    from ..projection.core import ProjectionOptions, project
    from ..projection.load import load_graph
    from ..projection.report import project_report, project_summary
    from ..reporting import run_info, write_json
    from ..system import available_memory, default_threads, local_ranks

    base = 1 if args.one_based else args.index_base
    prepare_outputs(comm, args)  # no input overwritten, outputs writable: before any work
    progress = _Progress(comm, 0 if args.quiet else args.progress)
    local = local_ranks(comm)
    threads = args.threads or default_threads(local)
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    t0 = time.perf_counter()
    read_phases = {}
    graph, fmt = load_graph(
        comm,
        args.input,
        fmt=args.format,
        timings=read_phases,
        index_base=base,
        skip_lines=args.skip_lines,
        duplicates=args.duplicates,
        ids=args.ids,
        sep=args.sep,
        header=args.header,
    )
    read_seconds = allreduce(comm, time.perf_counter() - t0, "max")
    read_phases = {k: allreduce(comm, v, "max") for k, v in sorted(read_phases.items())}
    progress.say(
        f"read {args.input} in {read_seconds:.2f} s ("
        + ", ".join(f"{k} {v:.2f} s" for k, v in read_phases.items())
        + f"): {graph.matrix.shape[0]} x {graph.matrix.shape[1]}, {graph.matrix.nnz} edges"
    )
    memory = args.memory_per_rank or available_memory() // (2 * local)
    t1 = time.perf_counter()
    # the projected side's ids are written from the input's own first id (ratings: 1)
    out_base = base if base is not None else graph.index_base
    # validated on every rank at once, so a contradiction is one line from rank 0
    options = agree(
        comm,
        ProjectionOptions,
        weight=args.weight,
        onto=args.onto,
        self_loops=args.self_loops,
        triangle=args.triangle,
        min_weight=args.min_weight,
        top_k=args.top_k,
        storage=args.storage,
        memory_per_rank=memory,
        threads=threads,
        output=args.output,
        output_format=args.output_format,
        index_base=out_base,
        compress=args.compress,
    )
    result = project(comm, graph, options, progress=progress)
    result.seconds["wall"] = allreduce(comm, time.perf_counter() - t1, "max")
    problem = {
        "input": str(args.input),
        "format": fmt,
        "rows": int(graph.matrix.shape[0]),
        "cols": int(graph.matrix.shape[1]),
        "nnz": int(graph.matrix.nnz),
        "weighted": bool(graph.weighted),
        "labelled": bool(result.labels is not None),
        "index_base": int(out_base),
        "header": list(graph.header) if graph.header else None,
    }
    run_meta = run_info(comm, sys.argv, input=str(args.input), output=args.output)
    report = project_report(result, run_meta, problem, read_seconds, args.output)
    report["phases"]["read"] = read_phases
    report["communication"] = communication_section(comm)
    if comm.rank == 0 and not args.quiet:
        log(comm, project_summary(report))
    # After the summary (a report that cannot be written loses no result), and agreed: one
    # line from rank 0, exit 2, no job abort
    if args.report:
        agree_root(comm, write_json, args.report, report)
    return 0
