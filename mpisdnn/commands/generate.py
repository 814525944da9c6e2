"""``mpisdnn generate``: synthetic networks, inputs (with truth) and graphs."""

from __future__ import annotations

import importlib

from ..parallel import agree, log
from ._common import finite_float, nonneg_int, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate networks, inputs or graphs",
        description="Generate challenge-style data or graphs (seeded).",
    )
    gsub = p.add_subparsers(dest="what", metavar="WHAT")
    gsub.required = True
    n = gsub.add_parser("network", help="RadiX-Net network like the official ones")
    n.add_argument("--neurons", type=positive_int, default=1024, help="N (default 1024)")
    n.add_argument("--layers", type=positive_int, default=120, help="L (default 120)")
    n.add_argument("--seed", type=nonneg_int, default=0)
    n.add_argument("--bias", type=finite_float, help="default: official bias for N")
    n.add_argument("-o", "--output", help="network HDF5 file")
    n.add_argument("--tsv-dir", help="also write official-style n{N}-l{k}.tsv files here")
    n.set_defaults(run=run_network)
    i = gsub.add_parser("inputs", help="digit-like inputs, with truth from the reference path")
    i.add_argument("--neurons", type=positive_int, default=1024, help="N (default 1024)")
    i.add_argument("--count", type=positive_int, default=60000, help="inputs (default 60000)")
    i.add_argument("--seed", type=nonneg_int, default=0)
    i.add_argument("--network", help="network (HDF5 or TSV dir) to compute the truth with")
    i.add_argument("--layers", type=positive_int, help="truth after the first L layers")
    i.add_argument("-o", "--output", help="inputs HDF5 file (features + truth)")
    i.add_argument("--tsv", help="also write sparse-images-style TSV here")
    i.add_argument("--truth-tsv", help="also write the truth as a categories TSV here")
    i.set_defaults(run=run_inputs)
    try:
        graphs = importlib.import_module("..generate_graphs", __name__)
    except ImportError:
        graphs = None
    if graphs is not None:
        graphs.add_parsers(gsub)


def run_network(args, comm) -> int:
    from ..errors import UsageError
    from ..formats import write_network
    from ..formats.tsv import layer_file, write_triples
    from ..generate import radixnet

    def work():
        if not args.output and not args.tsv_dir:
            raise UsageError("give -o/--output and/or --tsv-dir")
        if comm.rank != 0:
            return None
        net = radixnet(args.neurons, args.layers, args.seed, args.bias)
        if args.output:
            write_network(args.output, net)
        if args.tsv_dir:
            for k, w in enumerate(net.layers):
                write_triples(layer_file(args.tsv_dir, net.neurons, k + 1), w)
        return net.edges

    edges = agree(comm, work)
    log(comm, f"generated network N={args.neurons} L={args.layers} edges={edges}")
    return 0


def run_inputs(args, comm) -> int:
    import numpy as np

    from ..errors import UsageError
    from ..formats import write_inputs
    from ..formats.tsv import write_categories, write_triples
    from ..generate import digit_images
    from ..sdnn.load import load_network

    def make():
        if not args.output and not args.tsv:
            raise UsageError("give -o/--output and/or --tsv")
        if args.truth_tsv and not args.network:
            raise UsageError("--truth-tsv needs --network to compute the truth")
        # Rows are seeded per block, so each rank draws its own share of the set.
        start, stop = (
            (args.count * comm.rank) // comm.size,
            (args.count * (comm.rank + 1)) // comm.size,
        )
        return start, digit_images(stop - start, args.neurons, args.seed, start)

    start, mine = agree(comm, make)
    truth = None
    if args.network:
        net = load_network(comm, args.network, args.layers)
        if net.neurons != args.neurons:
            agree(comm, _fail, f"network has N={net.neurons}, inputs N={args.neurons}")
        found = agree(comm, _reference_truth, net, mine, start)
        truth = np.concatenate(comm.allgather(found))
    parts = comm.gather(mine, root=0)

    def write():
        if comm.rank != 0:
            return None
        import scipy.sparse as sp

        y = sp.vstack(parts, format="csr")
        if args.output:
            write_inputs(args.output, y, truth, source=f"generate inputs seed={args.seed}")
        if args.tsv:
            write_triples(args.tsv, y)
        if args.truth_tsv:
            write_categories(args.truth_tsv, truth)
        return y.shape[0], y.nnz

    rows, nnz = comm.bcast(agree(comm, write), root=0)
    extra = f", truth {truth.size} categories" if truth is not None else ""
    log(comm, f"generated inputs rows={rows} nnz={nnz} ({nnz / max(rows, 1):.1f}/row){extra}")
    return 0


#: Entries of Y one truth block may reach (rows x N); bounds the reference path's memory.
TRUTH_BLOCK_ENTRIES = 2**26


def _reference_truth(net, y, row_offset):
    """Categories of ``y``'s rows by the plain-scipy reference, in row blocks.

    The stored truth must not come from the engine it is meant to check, so it is computed
    with :func:`mpisdnn.reference_inference`. Rows are independent, so blocks of rows bound
    the memory of the early, denser layers.
    """
    import numpy as np

    from ..sdnn.reference import categories_of, reference_inference

    step = max(1, TRUTH_BLOCK_ENTRIES // net.neurons)
    found = [np.zeros(0, dtype=np.int64)]
    for lo in range(0, y.shape[0], step):
        out = reference_inference(y[lo : lo + step], net)
        found.append(categories_of(out, row_offset + lo))
    return np.concatenate(found)


def _fail(message):
    from ..errors import ShapeError

    raise ShapeError(message)
