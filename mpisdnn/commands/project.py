"""``mpisdnn project``: graph projection H = A^T A or A A^T (see mpisdnn.projection)."""

from __future__ import annotations

import sys

from ..parallel import agree_root, allreduce, communication_section, log, phase
from ..projection.options import WEIGHTINGS
from ._common import add_choice, add_needs, add_progress, finite_float, nonneg_int, positive_int
from .infer import size_arg

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
        "--one-based",
        dest="index_base",
        action="store_const",
        const=1,
        help="the same as --index-base 1 (kept for old scripts)",
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
    p.add_argument(
        "--weight",
        choices=WEIGHTINGS,
        default="count",
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
        type=size_arg,
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
    add_progress(p)
    add_needs(p, PROJECT_NEEDS)
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
    from .._aside import spare_cpus
    from .._aside import start as start_aside
    from ..parallel import agree
    from ..paths import prepare_outputs
    from ..projection.core import kernels_cached, warms_up
    from ._common import command_paths

    with phase("setup"):
        # no input overwritten, outputs writable: before any work
        prepare_outputs(comm, command_paths(args))
        # validated on every rank at once, so a contradiction is one line from rank 0; the
        # defaults of memory and threads are the options' (resolved once)
        options = agree(comm, _options, args).resolved(comm)
    progress = _Progress(comm, args.progress)
    import numba

    numba.set_num_threads(max(1, min(int(options.threads), numba.config.NUMBA_NUM_THREADS)))
    # a first run: the projection's kernels compile on the other ranks while each node's
    # first compiles the reader's, or, on one rank, in a helper process on a spare core;
    # skipped once they are cached (a warm run loading them there held rank 0 back by
    # 0.07-0.09 s)
    warm = aside = None
    if not kernels_cached() and warms_up(options):
        if comm.size > 1:
            warm = _warm_once(options)
        elif spare_cpus():
            aside = start_aside("mpisdnn.projection.core:warm_up", options)
    try:
        return _read_and_project(args, comm, options, progress, warm)
    finally:
        if aside is not None:
            aside.close()  # done by now, unless the run needed other kernels or failed


def _read_and_project(args, comm, options, progress, warm) -> int:
    import time

    from ..projection.core import project
    from ..projection.load import load_graph
    from ..projection.report import project_report, project_summary
    from ..reporting import run_info, write_json

    t0 = time.perf_counter()
    read_phases = {}
    graph, fmt = load_graph(
        comm, args.input, fmt=args.format, timings=read_phases, warm_up=warm,
        index_base=args.index_base,
        skip_lines=args.skip_lines, duplicates=args.duplicates, ids=args.ids, sep=args.sep,
        header=args.header,
    )  # fmt: skip
    read_seconds = allreduce(comm, time.perf_counter() - t0, "max")
    read_phases = {k: allreduce(comm, v, "max") for k, v in sorted(read_phases.items())}
    progress.say(
        f"read {args.input} in {read_seconds:.2f} s ("
        + ", ".join(f"{k} {v:.2f} s" for k, v in read_phases.items())
        + f"): {graph.matrix.shape[0]} x {graph.matrix.shape[1]}, {graph.matrix.nnz} edges"
    )
    t1 = time.perf_counter()
    # the projected side's ids are written from the input's own first id (ratings: 1)
    out_base = args.index_base if args.index_base is not None else graph.index_base
    result = project(comm, graph, options.replace(index_base=out_base), progress=progress)
    wall = allreduce(comm, time.perf_counter() - t1, "max")
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
    report = project_report(
        result, run_meta, problem, read_seconds, args.output, read_phases=read_phases,
        wall=wall, communication=communication_section(comm),
    )  # fmt: skip
    log(comm, project_summary(report))
    # After the summary (a report that cannot be written loses no result), and agreed: one
    # line from rank 0, exit 2, no job abort
    if args.report:
        agree_root(comm, write_json, args.report, report)
    return 0


def _warm_once(options):
    """:func:`~mpisdnn.projection.core.warm_up` with ``options``, at most once, silent, and
    never failing: it only compiles, and the projection itself reports what a tiny graph
    could not show (a rank raising here would leave the others waiting in the read)."""
    import contextlib
    import io

    from ..projection.core import warm_up

    done = []

    def warm():
        if done:  # the ranged read may give up and leave the file to rank 0
            return
        done.append(True)
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            with contextlib.suppress(Exception):
                warm_up(options)

    return warm


def _options(args):
    """The command line's :class:`~mpisdnn.projection.ProjectionOptions` (validated; the
    output's index base is set once the input is read)."""
    from ..projection.options import ProjectionOptions

    return ProjectionOptions(
        weight=args.weight,
        onto=args.onto,
        self_loops=args.self_loops,
        triangle=args.triangle,
        min_weight=args.min_weight,
        top_k=args.top_k,
        storage=args.storage,
        memory_per_rank=args.memory_per_rank,
        threads=args.threads,
        output=args.output,
        output_format=args.output_format,
        compress=args.compress,
    )


def _output_format(args):
    """The output's format from the flags, None without ``-o`` (or an unknown one: the
    options refuse it with their own line)."""
    if args.output is None:
        return None
    from ..formats.projection.output import output_format

    try:
        return output_format(args.output, args.output_format)
    except Exception:  # noqa: BLE001 - refused later, with the writer's message
        return None


def _needs(*args, **kwargs):
    from ..sdnn.options import Needs

    return Needs(*args, **kwargs)


def _text_input(a) -> bool:
    return a.format not in ("h5", "mtx")


def _nonsymmetric() -> str:
    from ..projection.weightings import WEIGHTINGS as ALL

    return ", ".join(n for n, w in ALL.items() if not w.symmetric)


#: Flags of ``project`` that take effect only in some combinations (refused elsewhere, one
#: line, before any file is opened).
PROJECT_NEEDS = (
    _needs("--compress", "compress", "an HDF5 or Parquet output (-o .h5 / .parquet)",
           lambda a: _output_format(a) in ("h5", "parquet") or (
               a.output is not None and _output_format(a) is None),
           given=lambda v: v not in (None, "none"), example=("--compress", "gzip")),
    _needs("--output-format", "output_format", "an output (-o)", lambda a: a.output is not None,
           given=lambda v: v != "auto", example=("--output-format", "tsv")),
    _needs("--storage", "storage", "an .h5 or .mtx output (or none) and a symmetric --weight",
           lambda a: (a.output is None or _output_format(a) in ("h5", "mtx"))
           and a.weight in _symmetric(),
           given=lambda v: v != "general", example=("--storage", "symmetric"),
           without=("-o", "h.tsv")),
    _needs("--triangle", "triangle", f"a symmetric --weight ({_nonsymmetric()} is not symmetric)",
           lambda a: a.weight in _symmetric(), given=lambda v: v != "full",
           example=("--triangle", "upper"), without=("--weight", "hive")),
    _needs("--ids", "ids", "a text edge-list or ratings input (not --format h5 or mtx)",
           _text_input, given=lambda v: v != "auto", example=("--ids", "label"),
           without=("--format", "h5")),
    _needs("--skip-lines", "skip_lines", "a text edge-list or ratings input (not --format h5 "
           "or mtx)", _text_input, given=lambda v: v != 0, example=("--skip-lines", "1"),
           without=("--format", "mtx")),
    _needs("--sep", "sep", "a text edge-list or ratings input (not --format h5 or mtx)",
           _text_input, given=lambda v: v != "auto", example=("--sep", "tab"),
           without=("--format", "h5")),
    _needs("--header", "header", "a text edge-list or ratings input (not --format h5 or mtx)",
           _text_input, given=lambda v: v is True, example=("--header",),
           without=("--format", "mtx")),
    _needs("--no-header", "header", "a text edge-list or ratings input (not --format h5 or "
           "mtx)", _text_input, given=lambda v: v is False, example=("--no-header",),
           without=("--format", "h5")),
    _needs("--duplicates", "duplicates", "a text input (not --format h5)",
           lambda a: a.format != "h5", given=lambda v: v != "sum",
           example=("--duplicates", "error"), without=("--format", "h5")),
    _needs("--index-base", "index_base", "a text edge-list or ratings input, or a TSV, CSV "
           "or Parquet output", lambda a: _text_input(a) or _output_format(a) in (
               "tsv", "csv", "parquet"),
           example=("--index-base", "1"), without=("--format", "h5")),
)  # fmt: skip


def _symmetric():
    from ..projection.weightings import SYMMETRIC_WEIGHTINGS

    return SYMMETRIC_WEIGHTINGS
