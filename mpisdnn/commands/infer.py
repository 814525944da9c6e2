"""``mpisdnn infer``: run the challenge inference, check the categories, report timings."""

from __future__ import annotations

import argparse
import sys

from ..parallel import agree_root, bcast, communication_section, log, phase
from ..sdnn.options import DEFAULT_REBALANCE, MAX_GROUP, InferOptions
from ._common import add_choice, add_progress, finite_float, nonneg_float, nonneg_int, positive_int

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
    _backend_arguments(p)
    p.add_argument(
        "--no-prune",
        action="store_true",
        help="keep empty rows in the working set (for measurements)",
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
    add_progress(p)
    _long_run_arguments(p)
    p.set_defaults(run=run)


def _backend_arguments(p) -> None:
    """The flags of how the layers run (shared with ``mpisdnn challenge``)."""
    from .. import backends

    add_choice(
        p,
        "--backend",
        backends.NAMES,
        help="; ".join(f"{name}: {backends.HELP[name]}" for name in backends.NAMES)
        + f" (default {backends.NAMES[0]})",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        help="threads per rank for the cpu backend (default: cores / ranks on node)",
    )
    p.add_argument(
        "--share-gpus",
        action="store_true",
        help="gpu backend: let more ranks than GPUs on a node share them round-robin "
        "(default: one GPU per rank; more ranks than GPUs is an error)",
    )
    p.add_argument(
        "--rebalance-threshold",
        type=nonneg_float,
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
        help=f"cpu and gpu backends: most layers per fused pass (default {MAX_GROUP}; 1 = layer "
        "by layer)",
    )
    p.add_argument(
        "--push-density",
        type=nonneg_float,
        default=None,
        metavar="X",
        help="cpu backend: rows with fewer non-zeros than X x N go row by row through the push "
        "kernel while they stay that sparse (default 0.5 from N=8192, else 0; 0 = tiles only)",
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


def _long_run_arguments(p) -> None:
    """The flags of staged, checkpointed and resumed runs."""
    p.add_argument(
        "--stages",
        type=positive_int,
        default=1,
        metavar="S",
        help="pipeline stages: ranks = S x data groups; after the head (--stage-head) each "
        "stage holds one slice of the remaining layers (default 1)",
    )
    p.add_argument(
        "--stage-head",
        type=nonneg_int,
        metavar="K",
        help="with --stages: run the first K layers data-parallel on every rank before the "
        "stages (default min(64, L/(2S)): where a pruned network does most of its work; "
        "0: none). Every rank holds them besides its slice",
    )
    p.add_argument(
        "--batch-rows",
        type=positive_int,
        metavar="R",
        help="rows per pipeline micro-batch (default: about 8 batches per stage, >= 256 rows)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="write checkpoints of the live rows into DIR (with --stages 1)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=nonneg_float,
        metavar="SECONDS",
        help="seconds between checkpoints (default 600; 0 = only when asked to stop by "
        "SIGUSR1 or a DIR/STOP file)",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue from the newest complete checkpoint in DIR with its recorded network, "
        "inputs and truth (any ranks, --stages, --backend)",
    )


def size_arg(text: str) -> int:
    """argparse type: a memory size such as ``64M``, ``2G`` or ``500000`` (bytes)."""
    from ..errors import UsageError
    from ..system import parse_size

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def options_from_args(args) -> InferOptions:
    """The :class:`InferOptions` the flags of :func:`_backend_arguments` ask for (``infer``
    and ``challenge``): a flag not given leaves the option's own default."""
    given = {
        "threads": args.threads,
        "rebalance_threshold": args.rebalance_threshold,
        "max_group": args.max_group,
        "push_density": args.push_density,
        "weight_memory": args.weight_memory,
        "memory_per_rank": args.memory_per_rank,
    }
    return InferOptions(
        backend=args.backend,
        prune=not getattr(args, "no_prune", False),
        dedup=args.dedup == "on",
        gpus_per_rank=0 if args.share_gpus else 1,
        **{k: v for k, v in given.items() if v is not None},
    )


def plan_from_args(args):
    """The :class:`~mpisdnn.sdnn.session.InferPlan` the command-line flags ask for."""
    from ..sdnn.session import InferPlan

    plan = InferPlan(
        network=args.network,
        inputs=args.inputs,
        truth=args.truth,
        layers=args.layers,
        bias=args.bias,
        stages=args.stages,
        batch_rows=args.batch_rows,
        stage_head=args.stage_head,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        options=options_from_args(args),
    )
    plan.refuse_without_effect()
    return plan


def run(args, comm) -> int:
    """parse -> plan -> load -> run -> write outputs -> report."""
    from .. import backends, kernel_cache
    from ..parallel import agree
    from ..paths import prepare_outputs
    from ..sdnn import session
    from ..sdnn.checkpoint import CheckpointStop
    from ..walltime import WallClock
    from ._common import command_paths

    with phase("setup"):
        clock = WallClock(comm)
        plan = agree(comm, plan_from_args, args)  # flags refused before any file is touched
        # no input overwritten, outputs writable: before any work
        prepare_outputs(comm, command_paths(args))
        plan = plan.replace(options=plan.options.resolved(comm))
        # Before any data is read, and agreed by all ranks: a missing CuPy/GPU is one message
        # from rank 0, not one per rank.
        backend = agree(comm, backends.create, plan.options, comm)
    aside = _helper(comm, plan)
    try:
        with session.locked(comm, plan):
            clock.mark("setup")
            # numba's registries load in a thread while the ranks read files and wait on
            # each other (kernel_cache.preload), not while this thread imports
            kernel_cache.preload()
            with _loading(comm, args):
                plan, loaded = session.load(comm, plan, backend)
            clock.mark("load")
            _warn_truth_mismatch(comm, plan, loaded)
            try:
                result = session.run(comm, plan, loaded, backend, _reporter(comm, args, loaded))
            except CheckpointStop as stop:
                return _stopped(comm, stop)
            clock.mark("run")
    finally:
        if aside is not None:
            aside.close()  # done by now, unless the run failed first
            kernel_cache.helped_turns(False)
    return _finish(args, comm, plan, loaded, result, clock)


def _helper(comm, plan):
    """On a one-rank first run with a spare core: the layer loop's kernels compiled in a
    helper process while this one reads (:mod:`mpisdnn.sdnn.warm`); ``None`` otherwise
    (several ranks compile side by side already)."""
    from .. import _aside, kernel_cache
    from ..sdnn import warm

    if comm.size > 1 or not warm.warms_up(plan) or warm.kernels_cached():
        return None
    if not _aside.spare_cpus():
        return None
    helper = _aside.start("mpisdnn.sdnn.warm:warm_up", plan)
    if helper is not None:
        kernel_cache.helped_turns()  # the helper takes the warm-up from its first step
    return helper


def _warn_truth_mismatch(comm, plan, loaded) -> None:
    """One warning line when the truth file's name names another layer count than the run
    has (``--layers`` defaults to all the network's layers, so a 1920-layer network with
    the ``-l120-`` truth would run 16 times the work and then FAIL). A warning, not a
    refusal: a truth file may be named anything, and the check still decides."""
    if plan.truth is None or comm.rank != 0:
        return
    from ..sdnn.challenge import truth_mismatch

    line = truth_mismatch(plan.truth, loaded.total, loaded.problem.network.neurons)
    if line:
        print(line, file=sys.stderr, flush=True)


def _loading(comm, args):
    """Progress lines while the network, inputs and truth load (rank 0)."""
    from ..progress import Heartbeat

    return Heartbeat(comm, "loading network and inputs", 0 if args.quiet else args.progress)


def _reporter(comm, args, loaded):
    from ..progress import Progress

    net = loaded.problem.network
    return Progress(
        comm,
        loaded.problem.g_rows,
        net.edges / max(1, len(net)),
        interval=0 if args.quiet else args.progress,
    )


def _stopped(comm, stop) -> int:
    """The exit of a run stopped after a checkpoint."""
    from .._signals import TERMINATED, mark_reported, termination_deferred

    if termination_deferred():
        # SIGTERM (scancel, a Slurm time limit) asked for this checkpoint: the job ends as
        # terminated (143), with the line that says how to continue.
        log(comm, f"mpisdnn: terminated: {stop}", file=sys.stderr)
        mark_reported()
        return TERMINATED
    log(comm, f"mpisdnn infer: {stop}")
    return stop.exit_code


@phase("gather")
def _finish(args, comm, plan, loaded, result, clock) -> int:
    """Write the outputs, check the categories and report."""
    from ..reporting import infer_report, infer_summary, rank_section, run_info, write_json
    from ..sdnn.engine import check_categories
    from ..sdnn.results import write_categories_file, write_final_y

    problem = loaded.problem
    net = problem.network
    if result.pipeline is not None:
        log(comm, pipeline_line(result.pipeline))
    if result.checkpoint is not None:
        log(comm, checkpoint_line(result.checkpoint))
    streaming = net.statistics() if hasattr(net, "statistics") else None
    if hasattr(net, "close"):
        net.close()
    if args.categories_out:
        write_categories_file(comm, args.categories_out, result.categories)
    if args.output_y:
        write_final_y(
            comm, args.output_y, result.y_local, result.row_offset, result.g_rows, result.layers
        )
    clock.mark("writing")
    check = None
    if comm.rank == 0 and problem.truth is not None:
        check = check_categories(result.categories, problem.truth)
    check = bcast(comm, check)
    run_meta = run_info(comm, sys.argv, network=str(plan.network), inputs=str(plan.inputs))
    report = infer_report(
        result, run_meta, problem.load_seconds, check, net.neurons,
        ranks=rank_section(comm, streaming), inputs_read=problem.inputs_read,
        outputs={"categories": args.categories_out, "y": args.output_y},
        communication=communication_section(comm),
        wall=clock.parts(load=problem.load_seconds, part1=result.part1, part2=result.part2,
                         timed_kernels=result.timed_kernel_seconds),
    )  # fmt: skip
    if comm.rank == 0:
        log(comm, infer_summary(report))
    # After the summary (a report that cannot be written loses no result), and agreed: one
    # line from rank 0, exit 2, no job abort
    if args.report:
        agree_root(comm, write_json, args.report, report)
    return 1 if check is not None and check["status"] != "PASS" else 0


def pipeline_line(pipe) -> str:
    """One summary line of the pipeline statistics."""
    busy = ", ".join(f"{b:.3f}" for b in pipe["stage_busy_seconds"])
    head = pipe.get("head_layers")
    head = f"head layers {head[0] + 1}-{head[1]} on every rank, " if head else ""
    return (
        f"mpisdnn infer: {head}pipeline {pipe['stages']} stages x {pipe['data_groups']} groups, "
        f"{max(pipe['batches_per_group'])} batches of {pipe['batch_rows']} rows: stage busy "
        f"[{busy}] s, bubble {100 * pipe['bubble_fraction']:.1f} %, "
        f"sent {sum(pipe['rank_bytes_sent']) / 2**20:.1f} MiB, "
        f"weights {max(pipe['rank_weight_bytes']) / 2**20:.1f} MiB/rank"
    )


def checkpoint_line(ck) -> str:
    """One summary line of the checkpoints written."""
    size = max((s["bytes"] for s in ck["saved"]), default=0)
    return (
        f"mpisdnn infer: checkpoints {ck['count']} in {ck['directory']} ({ck['seconds']:.3f} s, "
        f"largest {size / 2**20:.1f} MiB)"
    )
