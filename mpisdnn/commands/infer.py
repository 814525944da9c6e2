"""``mpisdnn infer``: run the challenge inference, check the categories, report timings."""

from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np

from ..parallel import agree_root, log
from ..sdnn.options import DEFAULT_REBALANCE, MAX_GROUP, InferOptions
from ..system import peak_rss_bytes, pss_bytes
from . import _long_run
from ._common import add_choice, finite_float, positive_int


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


DESCRIPTION = (
    "Run Y = min(max(Y W + b, 0), ymax) through every layer, gather the "
    "categories (rows with a non-zero sum) and check them against the truth."
)


def add_arguments(p) -> None:
    p.add_argument(
        "--network",
        help="network HDF5 file, or an official neuron{N}/ directory of TSV layers",
    )
    p.add_argument(
        "--inputs",
        help="inputs HDF5 file, or an official sparse-images-{N}.tsv file",
    )
    p.add_argument(
        "--truth",
        help="categories file (1-based row per line); default: the "
        "truth stored in the inputs HDF5, if any",
    )
    p.add_argument("--layers", type=positive_int, help="use the first L layers (default all)")
    p.add_argument(
        "--bias",
        type=finite_float,
        help="bias for TSV networks (default: the official value for N)",
    )
    add_choice(
        p,
        "--backend",
        ("cpu", "reference", "gpu"),
        help="cpu: fused numba kernel; reference: plain scipy; gpu: CuPy",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        help="threads per rank for the cpu backend (default: cores / ranks on node)",
    )
    p.add_argument(
        "--rebalance-threshold",
        type=non_negative_float,
        default=None,
        metavar="X",
        help="move rows between ranks when the busiest rank has more than X times the mean "
        f"remaining work (default {DEFAULT_REBALANCE}; 0 = off)",
    )
    p.add_argument(
        "--max-group",
        type=positive_int,
        default=None,
        metavar="L",
        help=f"cpu backend: most layers per fused pass (default {MAX_GROUP}; 1 = layer by layer)",
    )
    p.add_argument(
        "--push-density",
        type=non_negative_float,
        default=None,
        metavar="X",
        help="cpu backend: rows with fewer non-zeros than X x N go row by row through the push "
        "kernel while they stay that sparse (default 0.5 from N=8192, else 0; 0 = tiles only)",
    )
    p.add_argument(
        "--no-prune",
        action="store_true",
        help="keep empty rows in the working set (for measurements)",
    )
    p.add_argument(
        "--weight-memory",
        type=size_arg,
        metavar="SIZE",
        help="bytes of weights a rank may hold (e.g. 2G); a larger HDF5 network is read in "
        "layer blocks ahead of the compute (default: half the node's available memory / "
        "ranks on the node)",
    )
    p.add_argument(
        "--memory-per-rank",
        type=size_arg,
        metavar="SIZE",
        help="bound on a rank's activation working set (e.g. 1G): rows then go through each "
        "layer group in batches; same results (default: no bound)",
    )
    add_choice(
        p,
        "--dedup",
        ("on", "off"),
        help="between layer groups, compute byte-identical live rows once and expand them "
        "back at the end; same results (default on)",
    )
    p.add_argument(
        "--categories-out",
        metavar="FILE",
        help="write the categories found (official TSV: 1-based rows, one per line)",
    )
    p.add_argument(
        "--output-y",
        metavar="FILE.h5",
        help="write the final activations Y (CSR, the inputs HDF5 layout; docs/formats.md)",
    )
    p.add_argument("--report", metavar="JSON", help="write the full report as JSON")
    p.add_argument(
        "--progress",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="progress line interval on rank 0 (default 10 s; 0 = off)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _long_run.add_arguments(p)
    p.set_defaults(run=run)


def size_arg(text: str) -> int:
    """argparse type: a memory size such as ``64M``, ``2G`` or ``500000`` (bytes)."""
    from ..errors import UsageError
    from ..projection.plan import parse_size

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def options_from_args(args) -> InferOptions:
    """The :class:`InferOptions` the command-line flags ask for."""
    return InferOptions(
        backend=args.backend,
        threads=args.threads,
        prune=not args.no_prune,
        rebalance_threshold=(
            DEFAULT_REBALANCE if args.rebalance_threshold is None else args.rebalance_threshold
        ),
        max_group=args.max_group or MAX_GROUP,
        push_density=getattr(args, "push_density", None),
        weight_memory=getattr(args, "weight_memory", None),
        memory_per_rank=getattr(args, "memory_per_rank", None),
        dedup=getattr(args, "dedup", "on") == "on",
    )


def run(args, comm) -> int:
    from .. import backends
    from ..parallel import agree
    from ..paths import prepare_outputs
    from ..progress import Progress
    from ..reporting import infer_report, infer_summary, run_info, write_json
    from ..sdnn.engine import check_categories, infer
    from ..sdnn.results import write_categories_file, write_final_y
    from ..sdnn.streaming import default_weight_memory

    prepare_outputs(comm, args)  # no input overwritten, outputs writable: before any work
    options = agree(comm, options_from_args, args)
    if options.weight_memory is None:
        options = options.replace(weight_memory=default_weight_memory(comm))
    # Before any data is read, and agreed by all ranks: a missing CuPy/GPU is one message
    # from rank 0, not one per rank.
    backend = agree(comm, backends.create, options, comm)
    # Stages, checkpoints, resume (and missing --network/--inputs) go to _long_run.
    staged = _long_run.run(args, comm, options, backend) if _long_run.wanted(args) else None
    if isinstance(staged, int):
        return staged
    problem = (
        staged[0]
        if staged
        else _long_run.load_named_problem(
            comm, args, weight_memory=options.weight_memory, prepared_bytes=backend.prepared_bytes
        )
    )
    net = problem.network
    reporter = Progress(
        comm,
        problem.g_rows,
        net.edges / max(1, len(net)),
        interval=0 if args.quiet else args.progress,
    )
    result = (
        staged[1]
        if staged
        else infer(
            net,
            problem.y_local,
            comm,
            row_offset=problem.row_offset,
            g_rows=problem.g_rows,
            options=options,
            backend=backend,
            progress=reporter,
        )
    )
    streaming = net.statistics() if hasattr(net, "statistics") else None
    if hasattr(net, "close"):
        net.close()
    if args.categories_out:
        write_categories_file(comm, args.categories_out, result.categories)
    if args.output_y:
        write_final_y(
            comm, args.output_y, result.y_local, result.row_offset, result.g_rows, result.layers
        )
    check = None
    if comm.rank == 0 and problem.truth is not None:
        check = check_categories(result.categories, problem.truth)
    check = comm.bcast(check, root=0)
    run_meta = run_info(comm, sys.argv, network=str(args.network), inputs=str(args.inputs))
    report = infer_report(result, run_meta, problem.load_seconds, check, net.neurons)
    if problem.inputs_read:
        report["phases"]["inputs_read"] = problem.inputs_read
    # Peak memory per rank (the benchmark's memory check) and a digest of the categories
    # (lets a benchmark compare runs without shipping the whole vector).
    report["ranks"]["peak_rss_bytes"] = comm.allgather(peak_rss_bytes())
    report["ranks"]["pss_bytes"] = comm.allgather(pss_bytes())
    report.setdefault("memory", {})["rank_streaming"] = comm.allgather(streaming)
    report["memory"]["outputs"] = {"categories": args.categories_out, "y": args.output_y}
    report.update(_long_run.report_extras(result))
    report["categories"]["sha1"] = hashlib.sha1(
        np.asarray(result.categories, dtype=np.int64).tobytes()
    ).hexdigest()
    if comm.rank == 0:
        log(comm, infer_summary(report))
    # After the summary (a report that cannot be written loses no result), and agreed: one
    # line from rank 0, exit 2, no job abort
    if args.report:
        agree_root(comm, write_json, args.report, report)
    return 1 if check is not None and check["status"] != "PASS" else 0
