"""``mpisdnn infer`` with pipeline stages, checkpoints or a resume (the CLI glue).

The plain run (``--stages 1``, no checkpoint) stays in :mod:`mpisdnn.commands.infer`; this
module loads what a staged or resumed run needs (a stage's layer slice, a checkpoint's live
rows) and calls :func:`~mpisdnn.sdnn.pipeline.run_pipeline` or
:func:`~mpisdnn.sdnn.engine.infer` with the checkpoint hook.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import UsageError
from ..parallel import agree, agree_error, agree_root, log

__all__ = ["wanted", "add_arguments", "run", "load_named_problem"]


def add_arguments(p) -> None:
    """The flags of staged, checkpointed and resumed runs."""
    from ._common import positive_int
    from .infer import non_negative_float

    p.add_argument(
        "--stages",
        type=positive_int,
        default=1,
        metavar="S",
        help="pipeline stages: ranks = S x data groups, stage s holds layers "
        "[s L/S, (s+1) L/S) (default 1)",
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
        type=non_negative_float,
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


def load_named_problem(comm, args, **kwargs):
    """The :class:`~mpisdnn.sdnn.load.Problem` that ``--network``, ``--inputs``, ``--layers``,
    ``--truth`` and ``--bias`` name (``kwargs`` go to :func:`~mpisdnn.sdnn.load.load_problem`)."""
    from ..sdnn.load import load_problem

    return load_problem(
        comm, args.network, args.inputs, args.layers, args.truth, args.bias, **kwargs
    )


def wanted(args) -> bool:
    """True when the run needs this module (stages, checkpoints or a resume)."""
    missing = args.network is None or args.inputs is None
    return args.stages > 1 or bool(args.checkpoint) or bool(args.resume) or missing


def _validate(args, comm):
    if args.resume is None and (args.network is None or args.inputs is None):
        raise UsageError(
            "--network and --inputs are required (unless --resume DIR is given) "
            "(see 'mpisdnn infer --help')"
        )
    if (args.checkpoint or args.checkpoint_every is not None) and args.stages > 1:
        raise UsageError("--checkpoint works with --stages 1 only (a resume may use any --stages)")
    if args.checkpoint_every is not None and not (args.checkpoint or args.resume):
        raise UsageError("--checkpoint-every needs --checkpoint DIR")
    from ..sdnn.pipeline import stage_layout

    stage_layout(comm.size, args.stages)


def run(args, comm, options, backend):
    """Load and run; returns ``(problem, result)`` or an exit code (stopped after checkpoint).

    ``problem`` is a :class:`~mpisdnn.sdnn.load.Problem` (its network is this rank's layers).
    """
    from ..sdnn import checkpoint as ck
    from ..sdnn.load import Problem, load_inputs, load_truth

    agree(comm, _validate, args, comm)
    comm.Barrier()
    t0 = time.perf_counter()
    resumed, start, live = None, 0, None
    inputs_read = {}  # a TSV inputs read's bytes, seconds and MB/s, for the report
    if args.resume:
        manifest, warnings = ck.choose_checkpoint(comm, args.resume)
        for w in warnings:
            log(comm, f"mpisdnn: warning: {w}", file=sys.stderr)
        ident = manifest["identity"]
        agree_root(comm, _same_files, args, ident, manifest["path"])
        args.network = ident["network"]["path"]
        args.inputs = ident["inputs"]["path"]
        args.truth = None if ident["truth"] is None else ident["truth"]["path"]
        args.layers = ident["options"]["layers"]
        args.bias = ident["options"]["bias"]
        options = options.replace(prune=bool(ident["options"]["prune"]))
        start = int(manifest["next_layer"])
        live = ck.read_live_rows(comm, manifest)
        resumed = {
            "checkpoint": manifest["path"],
            "next_layer": start,
            "written_ranks": manifest["written_ranks"],
            "written_at": manifest["time"],
            "skipped_damaged": warnings,
        }
        log(comm, f"mpisdnn infer: resuming from {manifest['path']} at layer {start + 1}")

    if args.stages > 1:
        from ..sdnn.pipeline import load_stage_network

        net, k0, k1, total = load_stage_network(
            comm, args.network, args.stages, args.layers, args.bias, start
        )
        if live is None:
            y, r0, g_rows, g_nnz, offsets, stored = load_inputs(
                comm, args.inputs, net.neurons, inputs_read
            )
        truth = load_truth(comm, args.truth) if args.truth else None
    elif live is None:
        problem = load_named_problem(comm, args)
        inputs_read = problem.inputs_read
        net, total = problem.network, len(problem.network)
        y, r0, g_rows, g_nnz = problem.y_local, problem.row_offset, problem.g_rows, problem.g_nnz
        offsets, truth, stored = problem.offsets, problem.truth, None
    else:
        from ..sdnn.load import load_network

        net = load_network(comm, args.network, args.layers, args.bias)
        total = len(net)
        truth = load_truth(comm, args.truth) if args.truth else None
    if live is not None:
        y, r0, g_rows = live["y"], live["row_offset"], live["g_rows"]
        g_nnz, offsets, stored = comm.allreduce(int(y.nnz)), None, None
        if args.truth is None:
            stored = agree_root(comm, _stored_truth, args.inputs)
    if args.stages > 1 or live is not None:
        truth = truth if truth is not None else stored
    if live is not None and total != int(manifest["layers"]):
        agree_error(
            comm,
            UsageError(
                f"{manifest['path']}: checkpoint of a {manifest['layers']}"
                f"-layer run, the network now gives {total} layers"
            ),
        )

    saver = None
    if args.checkpoint or (args.resume and args.checkpoint_every is not None):
        directory = args.checkpoint or args.resume
        ident = agree_root(
            comm,
            ck.problem_identity,
            args.network,
            args.inputs,
            args.truth,
            layers=args.layers,
            bias=args.bias,
            prune=options.prune,
        )
        every = 600.0 if args.checkpoint_every is None else args.checkpoint_every
        saver = ck.Checkpointer(comm, directory, every, ident, g_rows, total, net.neurons)
    comm.Barrier()
    load_seconds = time.perf_counter() - t0
    problem = Problem(net, y, r0, g_rows, g_nnz, offsets, truth, load_seconds, inputs_read)
    kw = {}
    if live is not None:
        kw = {"live_rows": live["gid"], "block_rows": live["block_rows"]}
    try:
        if args.stages > 1:
            from ..sdnn.pipeline import run_pipeline

            result = run_pipeline(
                net, y, comm, stages=args.stages, k0=k0, k1=k1, total_layers=total,
                row_offset=r0, g_rows=g_rows, batch_rows=args.batch_rows, options=options,
                backend=backend, **kw,
            )  # fmt: skip
        else:
            from ..sdnn.engine import infer

            result = infer(
                net, y, comm, row_offset=r0, g_rows=g_rows, options=options, backend=backend,
                start_layer=start, on_boundary=saver, **kw,
            )  # fmt: skip
    except ck.CheckpointStop as stop:
        log(comm, f"mpisdnn infer: {stop}")
        return stop.exit_code
    pipe = getattr(result, "pipeline", None)
    if pipe is not None:
        log(comm, pipeline_line(pipe))
    if saver is not None:
        result.checkpoint = saver.describe()
        log(comm, checkpoint_line(result.checkpoint))
    result.resumed = resumed
    if resumed is not None:
        result.layers_run = total - start
        if args.stages == 1:
            # The rate counts the work of this run: the layers after the checkpoint.
            from ..sdnn.weights import as_store

            store = as_store(net)
            result.edges = int(sum(store.layer(k).nnz for k in range(start, total)))
    return problem, result


def pipeline_line(pipe) -> str:
    """One summary line of the pipeline statistics."""
    busy = ", ".join(f"{b:.3f}" for b in pipe["stage_busy_seconds"])
    return (
        f"mpisdnn infer: pipeline {pipe['stages']} stages x {pipe['data_groups']} groups, "
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


def _same_files(args, ident, where):
    from ..sdnn.checkpoint import _file_identity, compare_identity

    for key in ("network", "inputs", "truth"):
        given = getattr(args, key)
        rec = ident.get(key)
        if given is None or rec is None:
            continue
        if os.path.abspath(given) != rec["path"]:
            now = _file_identity(given)
            if now["sha256"] != rec["sha256"] or now["size"] != rec["size"]:
                raise UsageError(
                    f"{where}: --{key} {given} is not the {key} the checkpoint was made with "
                    f"({rec['path']})"
                )
    compare_identity(ident, where)


def _stored_truth(inputs):
    from ..formats import hdf5

    if not hdf5.is_hdf5(inputs):
        return None
    return hdf5.read_inputs(inputs, 0, 0, with_truth=True)[1]


def report_extras(result) -> dict:
    """The report sections of a staged, checkpointed or resumed run."""
    out = {}
    for key in ("pipeline", "checkpoint", "resumed"):
        got = getattr(result, key, None)
        if got is not None:
            out[key] = got
    if getattr(result, "layers_run", None) is not None:
        out["resumed"]["layers_run"] = int(result.layers_run)
    return out
