"""``mpisdnn generate``: synthetic networks, inputs (with truth) and graphs."""

from __future__ import annotations

import importlib

from ..parallel import agree, allgather, bcast, gather, log, phase
from ..paths import prepare_outputs
from ._common import (
    _needs,
    add_needs,
    add_progress,
    command_paths,
    finite_float,
    nonneg_int,
    positive_int,
)

DESCRIPTION = "Generate challenge-style data or graphs (seeded)."


def add_arguments(p) -> None:
    gsub = p.add_subparsers(dest="what", metavar="WHAT")
    gsub.required = True
    n = gsub.add_parser("network", help="RadiX-Net network like the official ones")
    n.add_argument("--neurons", type=positive_int, default=1024, help="N (default 1024)")
    n.add_argument("--layers", type=positive_int, default=120, help="L (default 120)")
    n.add_argument("--seed", type=nonneg_int, default=0)
    n.add_argument("--bias", type=finite_float, help="default: official bias for N")
    n.add_argument("-o", "--output", help="network HDF5 file")
    n.add_argument("--tsv-dir", help="also write official-style n{N}-l{k}.tsv files here")
    n.add_argument("--archive", metavar="FILE",
                   help="also write the network as the challenge publishes it: a .tar.gz "
                   "of neuron{N}/n{N}-l{k}.tsv (streamed, no layer file on disk)")  # fmt: skip
    _progress_argument(n)
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
    _progress_argument(i)
    i.set_defaults(run=run_inputs)
    add_needs(i, (_needs("--layers", "layers", "--network (the truth is computed with it)",
                         lambda a: a.network is not None, example=("--layers", "2")),))  # fmt: skip
    try:
        graphs = importlib.import_module("..generate_graphs", __name__)
    except ImportError:
        graphs = None
    if graphs is not None:
        graphs.add_parsers(gsub)


def _progress_argument(p) -> None:
    add_progress(p)


@phase("load")
def run_network(args, comm) -> int:
    from ..errors import UsageError

    prepare_outputs(comm, command_paths(args, hdf5=("-o",)))

    def work():
        if not (args.output or args.tsv_dir or args.archive):
            raise UsageError("give -o/--output, --tsv-dir and/or --archive")
        if comm.rank != 0:
            return None
        return _write_network(args)

    edges = agree(comm, work)
    log(comm, f"generated network N={args.neurons} L={args.layers} edges={edges}")
    return 0


def _write_network(args) -> int:
    """Stream the generated layers into the v2 file, a TSV directory and/or an archive as
    published (rank 0 only)."""
    from contextlib import ExitStack

    import numpy as np

    from ..formats._atomic import atomic_dir
    from ..formats._validate import check_disk
    from ..formats.archive_write import ARCHIVE_RATIO, network_archive
    from ..formats.network_v2 import NetworkWriter
    from ..formats.tsv import is_layer_file, layer_file, write_triples
    from ..generate.radixnet import radixnet_layers
    from ..network import YMAX
    from ..progress import Heartbeat
    from ..weights import index_dtype

    n, nl = args.neurons, args.layers
    layers = radixnet_layers(n, nl, args.seed, args.bias)
    first = next(layers)  # validates N before anything is sized or written
    per_layer = first.nnz
    if args.output:
        check_disk(
            args.output,
            nl * (per_layer * np.dtype(index_dtype(n)).itemsize + 2048),
            f"a network of {nl} layers",
        )
    if args.tsv_dir:
        check_disk(args.tsv_dir, nl * per_layer * 24.0, f"{nl} layer TSV files")
    if args.archive:
        text = nl * per_layer * 24.0
        check_disk(args.archive, text / ARCHIVE_RATIO, f"an archive of {nl} layers")
    source = f"mpisdnn generate network --neurons {n} --layers {nl} --seed {args.seed}"
    edges = 0
    with ExitStack() as stack:
        out = None
        if args.output:
            out = stack.enter_context(NetworkWriter(args.output, n, YMAX, source))
        tsv_dir = None
        if args.tsv_dir:
            tsv_dir = stack.enter_context(atomic_dir(args.tsv_dir, is_layer_file))
        archive = None
        if args.archive:
            archive = stack.enter_context(network_archive(args.archive, n))
        label = f"generating {n} x {nl} network"
        beat = stack.enter_context(Heartbeat(_RANK0, label, args.progress))
        for k, layer in enumerate(_chain(first, layers)):
            beat.say(f"layer {k + 1}/{nl}")
            if out is not None:
                out.add(layer)
            if tsv_dir is not None:
                write_triples(layer_file(tsv_dir, n, k + 1), layer.to_csc())
            if archive is not None:
                archive.add(k + 1, layer.to_csc())
            edges += layer.nnz
    return edges


class _RANK0:
    """Where only rank 0 runs (the network is written by rank 0): its progress lines."""

    rank = 0


def _chain(first, rest):
    yield first
    yield from rest


@phase("load")
def run_inputs(args, comm) -> int:
    import numpy as np

    from ..errors import UsageError
    from ..formats import write_inputs
    from ..formats._validate import check_memory
    from ..formats.tsv import write_categories, write_triples
    from ..progress import Heartbeat
    from ..sdnn.load import load_network

    prepare_outputs(comm, command_paths(args, hdf5=("-o",)))

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
        # ~102 non-zeros per row at N=1024, x4 per size step; 8 bytes each, ~3 copies while
        # generating and gathering: refuse before touching memory a flag asked for.
        per_row = 110 * args.neurons / 1024 * 8 * 3
        check_memory(per_row * (args.count if comm.rank == 0 else stop - start), "the inputs")
        return start, _draw_rows(beat, stop - start, args.neurons, args.seed, start)

    beat = Heartbeat(comm, f"generating {args.count} inputs", args.progress)
    with beat:
        start, mine = agree(comm, make)
    truth = None
    if args.network:
        net = load_network(comm, args.network, args.layers)
        if net.neurons != args.neurons:
            agree(comm, _fail, f"network has N={net.neurons}, inputs N={args.neurons}")
        beat = Heartbeat(comm, "computing the truth (scipy reference)", args.progress)
        with beat:
            found = agree(comm, _reference_truth, net, mine, start, beat)
        truth = np.concatenate(allgather(comm, found))
    parts = gather(comm, mine)

    def write():
        if comm.rank != 0:
            return None
        import scipy.sparse as sp

        # one part (one rank): no copy, the 60,000 x 65536 set is 3.4 GB
        y = parts[0] if len(parts) == 1 else sp.vstack(parts, format="csr")
        del parts[:]
        if args.output:
            write_inputs(args.output, y, truth, source=f"generate inputs seed={args.seed}")
        if args.tsv:
            write_triples(args.tsv, y)
        if args.truth_tsv:
            write_categories(args.truth_tsv, truth)
        return y.shape[0], y.nnz

    with Heartbeat(comm, "writing the inputs", args.progress):
        rows, nnz = bcast(comm, agree(comm, write))
    extra = f", truth {truth.size} categories" if truth is not None else ""
    log(comm, f"generated inputs rows={rows} nnz={nnz} ({nnz / max(rows, 1):.1f}/row){extra}")
    return 0


#: Entries of Y one truth block may reach (rows x N); bounds the reference path's memory.
TRUTH_BLOCK_ENTRIES = 2**26


def _draw_rows(beat, count, neurons, seed, start):
    """:func:`~mpisdnn.generate.digit_images` in blocks of its own seeding, so the progress
    line can say how far it is (the same rows as one call)."""
    import scipy.sparse as sp

    from ..generate import digit_images
    from ..generate.images import BLOCK

    parts, done = [], 0
    while done < count or not parts:
        step = min(count - done, BLOCK - (start + done) % BLOCK)
        parts.append(digit_images(step, neurons, seed, start + done))
        done += step
        beat.say(f"rows {done:,}/{count:,} (rank 0)")
    return parts[0] if len(parts) == 1 else sp.vstack(parts, format="csr")


def _reference_truth(net, y, row_offset, beat=None):
    """Categories of ``y``'s rows by the plain-scipy reference, in row blocks.

    The stored truth must not come from the engine it is meant to check, so it is computed
    with :func:`mpisdnn.reference_inference`. Rows are independent, so blocks of rows bound
    the memory of the early, denser layers.
    """
    import numpy as np

    from ..sdnn.reference import categories_of, reference_inference

    # 4096 rows at most: a progress line can tell how far it is
    step = max(1, min(TRUTH_BLOCK_ENTRIES // net.neurons, 4096))
    found = [np.zeros(0, dtype=np.int64)]
    for lo in range(0, y.shape[0], step):
        out = reference_inference(y[lo : lo + step], net)
        found.append(categories_of(out, row_offset + lo))
        if beat is not None:
            beat.say(f"rows {min(lo + step, y.shape[0]):,}/{y.shape[0]:,} (rank 0)")
    return np.concatenate(found)


def _fail(message):
    from ..errors import ShapeError

    raise ShapeError(message)
