"""``mpisdnn generate bipartite|rmat``: seeded graphs for projection (registered by generate.py)."""

from __future__ import annotations

from ..parallel import agree, bcast, log, phase
from ._common import add_choice, add_progress, finite_float, nonneg_int, positive_int


def add_parsers(gsub) -> None:
    """Add the graph generators to ``mpisdnn generate``'s sub-parsers."""
    b = gsub.add_parser(
        "bipartite",
        help="uniform random bipartite graph (rows x cols)",
        description="Uniformly random bipartite adjacency with an exact number of distinct "
        "edges. Output by extension: .h5 graph HDF5, .mtx Matrix Market, .tsv/.csv edge list "
        "(another name is refused).",
    )
    b.add_argument("--rows", type=positive_int, help="nodes on the row side (users)")
    b.add_argument("--cols", type=positive_int, help="nodes on the column side (items)")
    add_choice(
        b,
        "--degrees",
        ("uniform", "powerlaw"),
        help="uniform edges, or skewed MovieLens-like degrees on both sides (powerlaw)",
    )
    b.add_argument(
        "--preset",
        choices=("movielens-20m",),
        help="the shape of MovieLens-20M: 138,493 users x 26,744 items, 20,000,263 ratings, "
        "--degrees powerlaw --weights rating (explicit flags still win)",
    )
    size = b.add_mutually_exclusive_group()
    size.add_argument("--edges", type=nonneg_int, help="number of distinct edges")
    size.add_argument("--density", type=finite_float, help="fraction of rows*cols")
    b.add_argument("--seed", type=nonneg_int, default=0)
    add_choice(
        b,
        "--weights",
        ("one", "uniform", "rating"),
        help="edge weights: all 1 (default), uniform in (0,1], or integer ratings 1..5",
    )
    b.add_argument("-o", "--output", required=True, help="graph file to write")
    add_progress(b)
    b.set_defaults(run=run_bipartite)

    r = gsub.add_parser(
        "rmat",
        help="Graph500 R-MAT graph (a=0.57, b=c=0.19, d=0.05)",
        description="Graph500-style R-MAT graph with 2^scale vertices and edge_factor*2^scale "
        "drawn edges, vertex labels scrambled. Undirected (stored both ways) unless --directed; "
        "self-loops and duplicate edges removed unless kept.",
    )
    r.add_argument("--scale", type=positive_int, required=True, help="log2 of the vertex count")
    r.add_argument("--edge-factor", type=positive_int, default=16, help="edges per vertex (16)")
    r.add_argument("--seed", type=nonneg_int, default=0)
    r.add_argument("--directed", action="store_true", help="keep edges one-way as drawn")
    r.add_argument("--keep-self-loops", action="store_true", help="keep u-u edges")
    r.add_argument(
        "--keep-duplicates",
        action="store_true",
        help="keep repeated edges as their multiplicity (stored weight)",
    )
    r.add_argument("--no-scramble", action="store_true", help="skip the vertex permutation")
    r.add_argument("-o", "--output", required=True, help="graph file to write")
    add_progress(r)
    r.set_defaults(run=run_rmat)


def _write(comm, args, make):
    from ..paths import prepare_outputs
    from ..progress import Heartbeat
    from ..projection import Graph, write_graph
    from ._common import command_paths

    agree(comm, _check_graph_name, args.output)  # before any file is touched
    prepare_outputs(comm, command_paths(args))

    def work():
        if comm.rank != 0:
            return None
        # one long numpy step each (RMAT scale 21: 34 s on 2 cores): a heartbeat, not a count
        with Heartbeat(comm, f"generating {args.output}", args.progress) as beat:
            mat = make()
            beat.say("writing")
            weighted = bool(mat.nnz) and not bool((mat.data == 1).all())
            write_graph(args.output, Graph(mat, weighted, _describe(args)))
        return mat.shape, int(mat.nnz)

    return bcast(comm, agree(comm, work))


def _check_graph_name(path) -> None:
    """``-o`` picks the graph's format by name: one that gives none is refused (``g.xyz``,
    ``g.tsv.gz`` were written as HDF5)."""
    from ..errors import UsageError
    from ..formats.names import format_of_name
    from ..formats.projection.graph import GRAPH_OUTPUTS

    if format_of_name(path, GRAPH_OUTPUTS) is None:
        raise UsageError(
            f"-o {path}: its name gives no graph format: end it in .h5, .mtx, .tsv or .csv"
        )


def _describe(args) -> str:
    skip = {"run", "output", "command", "what", "progress", "quiet", "_needs"}
    return "generate " + " ".join(
        f"{k}={v}" for k, v in sorted(vars(args).items()) if k not in skip and v is not None
    )


def _bipartite_args(args):
    """Fill --rows/--cols/--edges from --preset and check that the size is given."""
    import sys

    from ..errors import UsageError
    from ..generate.graphs import MOVIELENS_20M

    if args.preset == "movielens-20m":
        for key, value in MOVIELENS_20M.items():
            if getattr(args, key) is None and not (key == "edges" and args.density is not None):
                setattr(args, key, value)
        if "--degrees" not in sys.argv:
            args.degrees = "powerlaw"
        if "--weights" not in sys.argv:
            args.weights = "rating"
    if args.rows is None or args.cols is None:
        raise UsageError("generate bipartite needs --rows and --cols (or --preset)")
    if args.edges is None and args.density is None:
        raise UsageError("generate bipartite needs --edges or --density (or --preset)")
    if args.degrees == "powerlaw" and args.edges is None:
        args.edges = int(round(args.density * args.rows * args.cols))


@phase("load")
def run_bipartite(args, comm) -> int:
    from ..generate.graphs import bipartite, bipartite_powerlaw
    from ..parallel import agree

    agree(comm, _bipartite_args, args)
    if args.degrees == "powerlaw":
        make = lambda: bipartite_powerlaw(  # noqa: E731
            args.rows, args.cols, args.edges, args.seed, args.weights
        )
    else:
        make = lambda: bipartite(  # noqa: E731
            args.rows, args.cols, args.edges, args.density, args.seed, args.weights
        )
    shape, nnz = _write(comm, args, make)
    log(comm, f"generated bipartite {shape[0]} x {shape[1]} edges={nnz} -> {args.output}")
    return 0


@phase("load")
def run_rmat(args, comm) -> int:
    from ..generate.graphs import rmat

    shape, nnz = _write(
        comm,
        args,
        lambda: rmat(
            args.scale,
            args.edge_factor,
            args.seed,
            scramble=not args.no_scramble,
            directed=args.directed,
            keep_self_loops=args.keep_self_loops,
            keep_duplicates=args.keep_duplicates,
        ),
    )
    log(
        comm,
        f"generated rmat scale={args.scale} n={shape[0]} stored entries={nnz} -> {args.output}",
    )
    return 0
