"""One way through ``mpisdnn infer``: a validated plan, then load, then run.

:class:`InferPlan` holds what a run is asked to do (sources, options, stages, checkpoints);
:func:`load` reads what it needs (the whole network or a stage's slice, streamed or mapped
within ``weight_memory``; this rank's rows of Y0 or of a checkpoint; the truth) and
:func:`run` runs it in the data-parallel flow (:func:`~mpisdnn.sdnn.engine.infer`) or the
stage flow (:func:`~mpisdnn.sdnn.pipeline.run_pipeline`). A checkpointed or resumed run is
the same path with a checkpoint hook and a start layer, not a detour.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import UsageError, shown
from ..parallel import agree, agree_error, agree_root, allreduce, barrier, log, phase
from .load import Problem, load_inputs, load_network, load_problem, load_truth
from .options import InferOptions, Needs, refuse_without_effect

__all__ = ["InferPlan", "PLAN_NEEDS", "Loaded", "locked", "load", "run"]

#: Seconds between checkpoints when ``--checkpoint-every`` is not given.
DEFAULT_CHECKPOINT_EVERY = 600.0


@dataclass(frozen=True)
class InferPlan:
    """What one ``mpisdnn infer`` run is asked to do (validated by :meth:`check`).

    Parameters
    ----------
    network, inputs, truth : str or None
        Sources (``network`` and ``inputs`` may be left to a checkpoint's record).
    layers : int, optional
        Run the first ``layers`` layers.
    bias : float, optional
        Bias of a TSV network.
    stages, batch_rows : int
        Pipeline stages and rows per micro-batch (:mod:`mpisdnn.sdnn.pipeline`).
    stage_head : int, optional
        Layers run data-parallel before the stages (``None``: the default of
        :func:`~mpisdnn.sdnn.pipeline.head_layers`; ``0``: none).
    checkpoint, resume : str, optional
        Checkpoint directory to write, or to continue from.
    checkpoint_every : float, optional
        Seconds between checkpoints (default :data:`DEFAULT_CHECKPOINT_EVERY`).
    options : InferOptions
        Backend, pruning, groups, memory budgets.
    """

    network: str | None = None
    inputs: str | None = None
    truth: str | None = None
    layers: int | None = None
    bias: float | None = None
    stages: int = 1
    batch_rows: int | None = None
    stage_head: int | None = None
    checkpoint: str | None = None
    checkpoint_every: float | None = None
    resume: str | None = None
    options: InferOptions = dataclasses.field(default_factory=InferOptions)

    @property
    def directory(self) -> str | None:
        """The checkpoint directory this run locks (``--checkpoint`` or ``--resume``)."""
        return self.checkpoint or self.resume

    @property
    def saves(self) -> bool:
        """True when this run writes checkpoints."""
        return bool(self.checkpoint) or (bool(self.resume) and self.checkpoint_every is not None)

    def replace(self, **changes) -> InferPlan:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def check(self, size: int) -> None:
        """Raise :class:`UsageError` unless the plan can run on ``size`` ranks."""
        from .pipeline import stage_layout

        if self.resume is None and (self.network is None or self.inputs is None):
            raise UsageError(
                "--network and --inputs are required (unless --resume DIR is given) "
                "(see 'mpisdnn infer --help')"
            )
        if (self.checkpoint or self.checkpoint_every is not None) and self.stages > 1:
            raise UsageError(
                "--checkpoint works with --stages 1 only (a resume may use any --stages)"
            )
        sh = self.stage_head
        if sh is not None and (isinstance(sh, bool) or not isinstance(sh, int) or sh < 0):
            raise UsageError(f"--stage-head must be an integer >= 0, got {shown(sh)}")
        self._check_fields()
        self.refuse_without_effect()
        stage_layout(size, self.stages)

    def refuse_without_effect(self) -> None:
        """Raise :class:`UsageError` for a flag of :data:`PLAN_NEEDS` given where it has no
        effect (the options' own, :data:`~mpisdnn.sdnn.options.OPTION_NEEDS`, are refused
        when the options are made)."""
        refuse_without_effect(PLAN_NEEDS, self)


    def _check_fields(self) -> None:
        """Every field of its type, whoever built the plan (the API as the command line):
        a number given as text is refused, not parsed."""
        for flag, value in (("--layers", self.layers), ("--batch-rows", self.batch_rows),
                            ("--stages", self.stages)):  # fmt: skip
            if value is not None and (not _whole(value) or value < 1):
                raise UsageError(f"{flag} must be a positive integer, got {shown(value)}")
        for flag, value in (("--bias", self.bias), ("--checkpoint-every", self.checkpoint_every)):
            if value is not None and not _real(value):
                raise UsageError(f"{flag} must be a finite number, got {shown(value)}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise UsageError(f"--checkpoint-every must be >= 0, got {shown(self.checkpoint_every)}")
        for flag, value in (("--network", self.network), ("--inputs", self.inputs),
                            ("--truth", self.truth), ("--checkpoint", self.checkpoint),
                            ("--resume", self.resume)):  # fmt: skip
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise UsageError(f"{flag} must be a path, got {shown(value)}")
        if not isinstance(self.options, InferOptions):
            raise UsageError(f"options must be an InferOptions, got {shown(self.options)}")


#: The plan's flags that take effect only in some combinations (see
#: :class:`~mpisdnn.sdnn.options.Needs`); the backend knobs are in ``OPTION_NEEDS``.
PLAN_NEEDS = (
    Needs("--stage-head", "stage_head", "--stages > 1", lambda p: p.stages > 1,
          example=("--stage-head", "1")),
    Needs("--batch-rows", "batch_rows", "--stages > 1", lambda p: p.stages > 1,
          example=("--batch-rows", "16")),
    Needs("--checkpoint-every", "checkpoint_every", "--checkpoint DIR or --resume DIR",
          lambda p: bool(p.directory), example=("--checkpoint-every", "5")),
)  # fmt: skip


def _whole(value) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value) -> bool:
    import math
    import numbers

    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return ok and math.isfinite(value)


@contextlib.contextmanager
def locked(comm, plan: InferPlan):
    """Check ``plan`` (agreed) and hold its checkpoint directory's lock while the run lasts
    (:mod:`mpisdnn.sdnn.checkpoint_identity`)."""
    from . import checkpoint_identity as cid

    directory = plan.directory
    with phase("setup"):
        agree(comm, _check, plan, comm)
        if directory:
            flag = "--checkpoint" if plan.checkpoint else "--resume"
            agree_root(comm, cid.lock, directory, flag, plan.saves)
    try:
        yield
    finally:
        if directory and comm.rank == 0:
            cid.unlock(directory)


def _check(plan, comm) -> None:
    plan.check(comm.size)
    if plan.bias is not None and plan.network and os.path.isfile(plan.network):
        from ..formats.hdf5 import is_hdf5

        if is_hdf5(plan.network):  # was silently ignored: the file's own bias was used
            raise UsageError(
                f"--bias applies to TSV layers; {plan.network} is a network file with its own "
                "bias (convert the TSV layers again with --bias to change it)"
            )
    if plan.checkpoint and comm.rank == 0:  # before any data is read
        from .checkpoint_identity import check_target

        check_target("--checkpoint", plan.checkpoint)


class Staged(NamedTuple):
    """What a staged run loaded besides its slice ``[k0, k1)``: ``reslice`` (from
    :func:`~mpisdnn.sdnn.pipeline.stage_slicer`) and the ``head`` every rank runs before the
    stages, global layers from ``head_first`` (``None``: no head)."""

    k0: int
    k1: int
    reslice: object
    head: object
    head_first: int


@dataclass
class Loaded:
    """What :func:`load` read for this rank.

    ``problem.network`` holds this rank's layers (all of them, or a stage's slice, described
    by ``stage``, a :class:`Staged`); ``start`` is the first layer to run,
    ``live`` a checkpoint's live rows, ``saver`` the checkpoint hook and ``resumed`` what
    the report says of a resume.
    """

    problem: Problem
    total: int
    start: int = 0
    stage: tuple | None = None
    live: dict | None = None
    saver: object = None
    resumed: dict | None = None


@phase("load")
def load(comm, plan: InferPlan, backend) -> tuple[InferPlan, Loaded]:
    """Read what ``plan`` runs on (collective; errors agreed).

    Returns the plan completed by a checkpoint's record (sources, layers, bias, pruning)
    and what was loaded. Weights are read the same way on every path: a v2 HDF5 network
    is mapped, a v1 network that does not fit ``options.weight_memory`` is streamed.
    """
    from . import checkpoint as ck

    barrier(comm)
    t0 = time.perf_counter()
    start, live, resumed = 0, None, None
    if plan.resume:
        plan, manifest, resumed = _resume_plan(comm, plan)
        start = int(manifest["next_layer"])
        live = ck.read_live_rows(comm, manifest)
        log(comm, f"mpisdnn infer: resuming from {manifest['path']} at layer {start + 1}")
    problem, total, stage = _load_problem(comm, plan, backend, start, live)
    if live is not None and total != int(manifest["layers"]):
        agree_error(
            comm,
            UsageError(
                f"{manifest['path']}: checkpoint of a {manifest['layers']}"
                f"-layer run, the network now gives {total} layers"
            ),
        )
    saver = _checkpointer(comm, plan, problem, total) if plan.saves else None
    barrier(comm)
    problem = dataclasses.replace(problem, load_seconds=time.perf_counter() - t0)
    return plan, Loaded(problem, total, start, stage, live, saver, resumed)


def _resume_plan(comm, plan):
    """The plan completed by the newest complete checkpoint in ``plan.resume``."""
    from . import checkpoint as ck

    manifest, warnings = ck.choose_checkpoint(comm, plan.resume)
    for w in warnings:
        log(comm, f"mpisdnn: warning: {w}", file=sys.stderr)
    ident = manifest["identity"]
    agree_root(comm, _same_files, plan, ident, manifest)
    truth = plan.truth  # a --truth given with --resume is the truth checked
    if truth is None and ident["truth"] is not None:
        truth = ident["truth"]["path"]
    recorded = ident["options"]
    plan = plan.replace(
        network=ident["network"]["path"],
        inputs=ident["inputs"]["path"],
        truth=truth,
        layers=recorded["layers"],
        bias=recorded["bias"],
        options=plan.options.replace(prune=bool(recorded["prune"])),
    )
    resumed = {
        "checkpoint": manifest["path"],
        "next_layer": int(manifest["next_layer"]),
        "written_ranks": manifest["written_ranks"],
        "written_at": manifest["time"],
        "skipped_damaged": warnings,
    }
    return plan, manifest, resumed


def _load_problem(comm, plan, backend, start, live):
    """``(problem, total layers, stage range or None)``: network, rows and truth."""
    from . import pipeline as pl

    memory = {"weight_memory": plan.options.weight_memory,
              "prepared_bytes": backend.prepared_bytes}  # fmt: skip
    stage = None
    if plan.stages == 1 and live is None:
        problem = load_problem(
            comm, plan.network, plan.inputs, plan.layers, plan.truth, plan.bias, **memory
        )
        return problem, len(problem.network), None
    if plan.stages > 1:
        total = pl.stage_depth(comm, plan.network, plan.layers)
        nh = agree(comm, pl.head_layers, plan.stages, start, total, plan.stage_head)
        head = None
        if nh:
            head = pl.load_stage_head(
                comm, plan.network, total, start, start + nh, plan.bias, **memory
            )
        net, k0, k1, total = pl.load_stage_network(
            comm, plan.network, plan.stages, plan.layers, plan.bias, start + nh, total=total,
            **memory,
        )
        # What moves a stage once the first micro-batch has shown where the work is.
        reslice = agree(
            comm, pl.stage_slicer, plan.network, total, plan.bias, first=start + nh, **memory
        )
        stage = Staged(k0, k1, reslice, head, start)
    else:
        net = load_network(comm, plan.network, plan.layers, plan.bias, **memory)
        total = len(net)
    truth = load_truth(comm, plan.truth) if plan.truth else None
    read_stats = {}
    if live is None:
        y, r0, g_rows, g_nnz, offsets, stored = load_inputs(
            comm, plan.inputs, net.neurons, read_stats
        )
    else:
        y, r0, g_rows = live["y"], live["row_offset"], live["g_rows"]
        g_nnz, offsets, stored = allreduce(comm, int(y.nnz)), None, None
        if plan.truth is None:
            stored = agree_root(comm, _stored_truth, plan.inputs)
    truth = truth if truth is not None else stored
    return Problem(net, y, r0, g_rows, g_nnz, offsets, truth, 0.0, read_stats), total, stage


def _checkpointer(comm, plan, problem, total):
    from . import checkpoint as ck

    ident = agree_root(
        comm,
        ck.problem_identity,
        plan.network,
        plan.inputs,
        plan.truth,
        layers=plan.layers,
        bias=plan.bias,
        prune=plan.options.prune,
    )
    agree_root(comm, _own_directory, plan.directory, ident, bool(plan.checkpoint))
    every = DEFAULT_CHECKPOINT_EVERY if plan.checkpoint_every is None else plan.checkpoint_every
    return ck.Checkpointer(
        comm, plan.directory, every, ident, problem.g_rows, total, problem.network.neurons
    )


def run(comm, plan: InferPlan, loaded: Loaded, backend, progress=None):
    """Run the loaded problem in the flow ``plan`` asks for; returns the
    :class:`~mpisdnn.sdnn.engine.InferenceResult` (raises
    :class:`~mpisdnn.sdnn.checkpoint.CheckpointStop` when asked to stop after a
    checkpoint)."""
    pb, live = loaded.problem, loaded.live
    common = {"row_offset": pb.row_offset, "g_rows": pb.g_rows, "options": plan.options,
              "backend": backend}  # fmt: skip
    if live is not None:
        common.update(live_rows=live["gid"], block_rows=live["block_rows"])
    with _sigterm_checkpoints(loaded.saver):
        if loaded.stage is not None:
            from .pipeline import run_pipeline

            sg = loaded.stage
            result = run_pipeline(
                pb.network, pb.y_local, comm, stages=plan.stages, k0=sg.k0, k1=sg.k1,
                total_layers=loaded.total, batch_rows=plan.batch_rows, reslice=sg.reslice,
                head_store=sg.head, head_first=sg.head_first, progress=progress, **common,
            )  # fmt: skip
        else:
            from .engine import infer

            result = infer(
                pb.network, pb.y_local, comm, start_layer=loaded.start,
                on_boundary=loaded.saver, progress=progress, **common,
            )  # fmt: skip
    if loaded.saver is not None:
        result.checkpoint = loaded.saver.describe()
    if loaded.resumed is not None:
        result.resumed = {**loaded.resumed, "layers_run": loaded.total - loaded.start}
        if loaded.stage is None:
            # The rate counts the work of this run: the layers after the checkpoint.
            from ..weights import as_store

            store = as_store(pb.network)
            edges = int(sum(store.layer(k).nnz for k in range(loaded.start, loaded.total)))
            result = dataclasses.replace(result, edges=edges)
    return result


@contextlib.contextmanager
def _sigterm_checkpoints(saver):
    """With checkpoints, SIGTERM asks for one at the next layer-group boundary (like SIGUSR1
    and ``DIR/STOP``), then the run exits 143; without, SIGTERM interrupts at once."""
    if saver is None:
        yield
        return
    from .. import _signals
    from . import checkpoint as ck

    with _signals.deferred_termination(lambda: ck._on_signal(signal.SIGTERM, None)):
        yield


def _own_directory(directory, ident, fresh: bool) -> None:
    from .checkpoint_identity import check_identity

    check_identity(directory, ident, "--checkpoint" if fresh else "--resume")


def _same_files(plan, ident, manifest):
    from .checkpoint import _file_identity, compare_identity

    where = manifest["path"]
    _same_options(plan, ident["options"], where, int(manifest["layers"]))
    for key in ("network", "inputs"):
        given = getattr(plan, key)
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
    _same_rows(ident, manifest)


def _same_rows(ident, manifest) -> None:
    """An HDF5 inputs file says how many inputs the run had: the manifest's ``g_rows`` must
    be that number (it sizes the resumed ranks' blocks)."""
    from ..formats import hdf5

    path = (ident.get("inputs") or {}).get("path")
    if path is None or not hdf5.is_hdf5(path):
        return
    rows = hdf5.read_inputs_meta(path)["rows"]
    if rows != manifest["g_rows"]:
        raise UsageError(
            f"{manifest['path']}: the manifest's run had {manifest['g_rows']} inputs, "
            f"{path} has {rows} (damaged manifest?)"
        )


def _same_options(plan, recorded: dict, where, layers: int) -> None:
    """Refuse result-defining flags that contradict the checkpoint's run (a resume continues
    that run; --backend, --threads, ranks and --truth may differ). ``layers``: the run's
    depth (``--layers 120`` repeats a run of a 120-layer network that named no --layers)."""
    for key, flag in (("layers", "--layers"), ("bias", "--bias")):
        given = getattr(plan, key)
        if key == "layers" and given == layers and recorded.get(key) in (None, layers):
            continue
        if given is not None and given != recorded.get(key):
            was = recorded.get(key)
            raise UsageError(
                f"{where}: {flag} {given} contradicts the checkpoint's run "
                f"({flag} {'not given' if was is None else was}); leave {flag} out to resume"
            )
    if not plan.options.prune and recorded.get("prune", True):
        raise UsageError(f"{where}: --no-prune contradicts the checkpoint's run (pruned)")


def _stored_truth(inputs):
    from ..formats import hdf5

    if not hdf5.is_hdf5(inputs):
        return None
    return hdf5.read_inputs(inputs, 0, 0, with_truth=True)[1]
