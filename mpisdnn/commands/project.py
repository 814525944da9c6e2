"""``mpisdnn project``: graph projection H = A^T A or A A^T (see mpisdnn.projection)."""

from __future__ import annotations

import sys

from ..parallel import agree_root, allreduce, log
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
        help="input format (default: by signature and extension)",
    )
    base = p.add_mutually_exclusive_group()
    base.add_argument(
        "--one-based", action="store_true", help="TSV/CSV ids start at 1 (input and TSV output)"
    )
    base.add_argument(
        "--index-base", type=int, choices=(0, 1), help="first id of edge lists and ratings"
    )
    add_choice(
        p,
        "--ids",
        ("auto", "index", "label"),
        help="edge-list/ratings ids: numbers used as indices (index), any text mapped to "
        "indices in sorted order and kept as labels (label), or auto: labels when the ids are "
        "not numbers or are sparse (default)",
    )
    p.add_argument(
        "--skip-lines", type=nonneg_int, default=0, help="header lines to skip in text inputs"
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
        ("count", "product", "ratio", "jaccard", "overlap", "newman", "hive"),
        help="edge weight of H (default count = shared neighbours)",
    )
    add_choice(p, "--self-loops", ("drop", "keep"))
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
    p.add_argument("--top-k", type=positive_int, help="keep the K heaviest entries per row")
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
        "-o", "--output", help="output file (.h5, .mtx, .tsv, .parquet); omit to only compute"
    )
    add_choice(p, "--output-format", ("auto", "h5", "mtx", "tsv", "parquet"), metavar="FMT")
    add_choice(
        p,
        "--compress",
        ("none", "zstd", "blosc2", "gzip"),
        help="compress HDF5 (zstd, blosc2: bit-shuffled, need hdf5plugin) or Parquet output",
    )
    p.add_argument("--report", metavar="JSON", help="write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="no summary on stdout")
    p.set_defaults(run=run)


def run(args, comm) -> int:
    import time

    from ..paths import prepare_outputs
    from ..projection.core import ProjectionOptions, project
    from ..projection.load import load_graph
    from ..projection.plan import available_memory
    from ..projection.report import project_report, project_summary
    from ..reporting import run_info, write_json
    from ..system import default_threads, local_ranks

    base = 1 if args.one_based else args.index_base
    prepare_outputs(comm, args)  # no input overwritten, outputs writable: before any work
    t0 = time.perf_counter()
    graph, fmt = load_graph(
        comm,
        args.input,
        fmt=args.format,
        index_base=base,
        skip_lines=args.skip_lines,
        duplicates=args.duplicates,
        ids=args.ids,
    )
    read_seconds = allreduce(comm, time.perf_counter() - t0, "max")
    local = local_ranks(comm)
    memory = args.memory_per_rank or available_memory() // (2 * local)
    t1 = time.perf_counter()
    from ..parallel import agree

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
        threads=args.threads or default_threads(local),
        output=args.output,
        output_format=args.output_format,
        index_base=base or 0,
        compress=args.compress,
    )
    result = project(comm, graph, options)
    result.seconds["wall"] = allreduce(comm, time.perf_counter() - t1, "max")
    problem = {
        "input": str(args.input),
        "format": fmt,
        "rows": int(graph.matrix.shape[0]),
        "cols": int(graph.matrix.shape[1]),
        "nnz": int(graph.matrix.nnz),
        "weighted": bool(graph.weighted),
    }
    run_meta = run_info(comm, sys.argv, input=str(args.input), output=args.output)
    report = project_report(result, run_meta, problem, read_seconds, args.output)
    if comm.rank == 0 and not args.quiet:
        log(comm, project_summary(report))
    # After the summary (a report that cannot be written loses no result), and agreed: one
    # line from rank 0, exit 2, no job abort
    if args.report:
        agree_root(comm, write_json, args.report, report)
    return 0
