"""``mpisdnn convert``: official TSV files to the project's HDF5 layout."""

from __future__ import annotations

from ..parallel import agree, log
from ..paths import prepare_outputs
from ._common import finite_float, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="convert official TSV files to HDF5",
        description="Convert the official Graph Challenge TSV files to HDF5.",
    )
    csub = p.add_subparsers(dest="what", metavar="WHAT")
    csub.required = True
    n = csub.add_parser("network", help="neuron{N}/ directory of layer TSVs -> network.h5")
    n.add_argument("source", help="directory holding n{N}-l{k}.tsv")
    n.add_argument("-o", "--output", required=True, help="network HDF5 file to write")
    n.add_argument("--layers", type=positive_int, help="first L layers (default: all present)")
    n.add_argument("--bias", type=finite_float, help="bias (default: official value for N)")
    n.set_defaults(run=run_network)
    i = csub.add_parser("inputs", help="sparse-images-{N}.tsv (+ truth) -> inputs.h5")
    i.add_argument("source", help="sparse-images-{N}.tsv")
    i.add_argument("-o", "--output", required=True, help="inputs HDF5 file to write")
    i.add_argument("--neurons", type=positive_int, required=True, help="N (features per row)")
    i.add_argument("--rows", type=positive_int, help="number of inputs (default: largest row)")
    i.add_argument("--truth", help="categories TSV to store with the inputs")
    i.set_defaults(run=run_inputs)


def run_network(args, comm) -> int:
    from ..formats import read_network_tsv, write_network

    prepare_outputs(comm, args)

    def work():
        if comm.rank == 0:
            net = read_network_tsv(args.source, args.layers, bias=args.bias)
            write_network(args.output, net)
            return net.neurons, len(net), net.edges

    info = agree(comm, work)
    if comm.rank == 0:
        log(comm, f"wrote {args.output}: N={info[0]} L={info[1]} edges={info[2]}")
    return 0


def run_inputs(args, comm) -> int:
    from ..errors import ShapeError
    from ..formats import read_categories, read_images_tsv, write_inputs

    prepare_outputs(comm, args)

    def work():
        if comm.rank == 0:
            y = read_images_tsv(args.source, args.neurons, args.rows)
            truth = read_categories(args.truth) if args.truth else None
            if truth is not None and truth.size and truth.max() > y.shape[0]:
                raise ShapeError(
                    f"{args.truth}: names row {truth.max()} but the inputs have {y.shape[0]}"
                )
            write_inputs(args.output, y, truth, source=str(args.source))
            return y.shape[0], y.nnz

    info = agree(comm, work)
    if comm.rank == 0:
        log(comm, f"wrote {args.output}: rows={info[0]} nnz={info[1]}")
    return 0
