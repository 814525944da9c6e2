"""``mpisdnn convert``: official TSV files (or a v1 network file) to the project's HDF5 layout.

Under ``mpiexec`` the ranks share the parsing: for a network each rank parses every
``size``-th layer file and rank 0 writes the layers in order as they arrive (one layer per rank
in flight, so memory stays bounded); for inputs each rank parses one byte range of the file.
The output is byte for byte the same whatever the number of ranks.
"""

from __future__ import annotations

import os
import time

from ..parallel import agree, agree_error, agree_root, log, phase
from ..paths import prepare_outputs
from ._common import _needs, add_needs, add_progress, command_paths, finite_float, positive_int

DESCRIPTION = (
    "Convert the official Graph Challenge TSV files to HDF5 (in parallel "
    "under mpiexec), or upgrade a network file to the current layout."
)

#: Only the v2 conversion prints progress lines (``--layout 1`` writes in one go).
NETWORK_NEEDS = (
    _needs("--progress", "progress", "--layout 2", lambda a: a.layout == 2,
           example=("--progress", "5"), without=("--layout", "1")),
    _needs("--quiet", "quiet", "--layout 2", lambda a: a.layout == 2, given=bool,
           example=("--quiet",), without=("--layout", "1")),
)  # fmt: skip


def add_arguments(p) -> None:
    csub = p.add_subparsers(dest="what", metavar="WHAT")
    csub.required = True
    n = csub.add_parser(
        "network",
        help="neuron{N}/ directory or neuron{N}.tar.gz of layer TSVs (or a network.h5) "
        "-> network.h5",
    )
    n.add_argument(
        "source",
        help="directory holding n{N}-l{k}.tsv, the neuron{N}.tar.gz archive as published, "
        "or a network HDF5 file",
    )
    n.add_argument("-o", "--output", required=True, help="network HDF5 file to write")
    n.add_argument("--layers", type=positive_int, help="first L layers (default: all present)")
    n.add_argument("--bias", type=finite_float, help="bias (default: official value for N)")
    n.add_argument(
        "--layout", type=int, choices=(1, 2), default=2, help="network layout version (default 2)"
    )
    add_progress(n)
    add_needs(n, NETWORK_NEEDS)
    n.set_defaults(run=run_network)
    i = csub.add_parser("inputs", help="sparse-images-{N}.tsv (+ truth) -> inputs.h5")
    i.add_argument("source", help="sparse-images-{N}.tsv, or its .tsv.gz as published")
    i.add_argument("-o", "--output", required=True, help="inputs HDF5 file to write")
    i.add_argument("--neurons", type=positive_int, required=True, help="N (features per row)")
    i.add_argument("--rows", type=positive_int, help="number of inputs (default: largest row)")
    i.add_argument("--truth", help="categories TSV to store with the inputs")
    add_progress(i)
    i.set_defaults(run=run_inputs)


@phase("load")
def run_network(args, comm) -> int:
    from ..formats import hdf5

    prepare_outputs(comm, command_paths(args, hdf5=("-o",)))
    if os.path.isfile(args.source) and hdf5.is_hdf5(args.source):
        info = agree_root(comm, _upgrade, args)
    else:
        info = _network_from_tsv(args, comm)
    log(comm, f"wrote {args.output}: N={info[0]} L={info[1]} edges={info[2]}")
    return 0


def _upgrade(args):
    """Rewrite a network file (v1 or v2) in the layout asked for, a group of layers at a time."""
    from ..errors import UsageError
    from ..formats import hdf5
    from ..formats.network_v2 import NetworkWriter
    from ..weights import CompactLayer

    if args.bias is not None:
        raise UsageError("--bias applies to TSV layers; a network file keeps its own bias")
    meta = hdf5.read_network_meta(args.source)
    total = int(meta["layers"]) if args.layers is None else args.layers
    if args.layout == 1:
        net = hdf5.read_network(args.source, total)
        hdf5.write_network(args.output, net, version=1)
        return net.neurons, len(net), net.edges
    group = 32
    head = hdf5.read_network(args.source, total, 0, min(group, total))
    with NetworkWriter(args.output, head.neurons, head.ymax, str(head.source), head.attrs) as out:
        for a in range(0, total, group):
            stop = min(a + group, total)
            part = head if a == 0 else hdf5.read_network(args.source, total, a, stop)
            for w, b in zip(part.layers, part.bias):
                out.add(CompactLayer.from_matrix(w, b))
        return head.neurons, out.layers, out.edges


def _network_from_tsv(args, comm):
    from ..formats.network_convert import convert_network_tsv

    if args.layout == 1:
        return agree_root(comm, _tsv_v1, args, args.layers, args.bias)
    neurons, total, edges, stats = convert_network_tsv(
        comm, args.source, args.output, args.layers, args.bias, progress=args.progress
    )
    log(
        comm,
        f"converted {stats['bytes'] / 1e6:.0f} MB of text in {stats['seconds']:.2f} s "
        f"({stats['mb_per_second']:.0f} MB/s, {comm.size} rank{'s' if comm.size > 1 else ''})",
    )
    return neurons, total, edges


def _tsv_v1(args, total, bias):
    from ..formats.hdf5 import write_network
    from ..sdnn.load import read_network_tsv_source

    net = read_network_tsv_source(args.source)(args.source, total, bias=bias)
    write_network(args.output, net, version=1)
    return net.neurons, len(net), net.edges


@phase("load")
def run_inputs(args, comm) -> int:
    from ..errors import ShapeError
    from ..formats.inputs_parallel import write_inputs_parallel
    from ..formats.tsv_parallel import read_images_parallel
    from ..sdnn.load import read_truth_file

    prepare_outputs(comm, command_paths(args, hdf5=("-o",)))
    truth = agree_root(comm, read_truth_file, args.truth) if args.truth else None
    block = read_images_parallel(comm, args.source, args.neurons, args.rows, args.progress)
    bad = None
    if truth is not None and truth.size and truth.max() > block.g_rows:
        bad = ShapeError(
            f"{args.truth}: names row {truth.max()} but the inputs have {block.g_rows}"
        )
    agree_error(comm, bad)
    rows = block.g_rows if comm.rank == 0 else 0
    agree(comm, _check_inputs_memory, args.source, block.y.nnz, 4, rows)
    t0 = time.perf_counter()
    write_inputs_parallel(comm, args.output, block, truth, source=str(args.source))
    st = block.stats
    log(
        comm,
        f"wrote {args.output}: rows={block.g_rows} nnz={block.g_nnz} (read "
        f"{st['bytes'] / 1e6:.0f} MB in {st['seconds']:.2f} s, {st['mb_per_second']:.0f} MB/s; "
        f"wrote in {time.perf_counter() - t0:.2f} s)",
    )
    return 0


def _check_inputs_memory(source, entries: int, itemsize: int, rows: int = 0) -> None:
    """Refuse before reading when a rank's share would not fit: its CSR (``itemsize`` + 4
    bytes per entry), its compressed chunks (at most as much again) and rank 0's row
    pointers (16 bytes per row while gathered)."""
    from ..formats._validate import check_memory

    check_memory(
        2 * entries * (itemsize + 4) + 16 * (rows + 1),
        f"converting {source} ({entries} entries, {rows} rows)",
    )
