"""``mpisdnn generate bipartite|rmat``: seeded graphs for projection (registered by generate.py)."""

from __future__ import annotations

from ..parallel import agree, log
from ._common import finite_float, nonneg_int, positive_int


def add_parsers(gsub) -> None:
    """Add the graph generators to ``mpisdnn generate``'s sub-parsers."""
    b = gsub.add_parser(
        "bipartite",
        help="uniform random bipartite graph (rows x cols)",
        description="Uniformly random bipartite adjacency with an exact number of distinct "
        "edges. Output by extension: .mtx Matrix Market, .tsv/.csv edge list, else graph HDF5.",
    )
    b.add_argument("--rows", type=positive_int, required=True, help="nodes on the row side")
    b.add_argument("--cols", type=positive_int, required=True, help="nodes on the column side")
    size = b.add_mutually_exclusive_group(required=True)
    size.add_argument("--edges", type=nonneg_int, help="number of distinct edges")
    size.add_argument("--density", type=finite_float, help="fraction of rows*cols")
    b.add_argument("--seed", type=nonneg_int, default=0)
    b.add_argument(
        "--weights",
        choices=("one", "uniform", "rating"),
        default="one",
        help="edge weights: all 1 (default), uniform in (0,1], or integer ratings 1..5",
    )
    b.add_argument("-o", "--output", required=True, help="graph file to write")
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
    r.set_defaults(run=run_rmat)


def _write(comm, args, make):
    from ..paths import prepare_outputs
    from ..projection.io import Graph, write_graph

    prepare_outputs(comm, args)

    def work():
        if comm.rank != 0:
            return None
        mat = make()
        weighted = bool(mat.nnz) and not bool((mat.data == 1).all())
        write_graph(args.output, Graph(mat, weighted, _describe(args)))
        return mat.shape, int(mat.nnz)

    return comm.bcast(agree(comm, work), root=0)


def _describe(args) -> str:
    skip = {"run", "output", "command", "what"}
    return "generate " + " ".join(
        f"{k}={v}" for k, v in sorted(vars(args).items()) if k not in skip and v is not None
    )


def run_bipartite(args, comm) -> int:
    from ..generate.graphs import bipartite

    shape, nnz = _write(
        comm,
        args,
        lambda: bipartite(args.rows, args.cols, args.edges, args.density, args.seed, args.weights),
    )
    log(comm, f"generated bipartite {shape[0]} x {shape[1]} edges={nnz} -> {args.output}")
    return 0


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
