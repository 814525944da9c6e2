"""Validated options of one inference run (what the CLI, the benchmarks and the API build)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from .._checks import python_scalars
from ..backends.names import NAMES
from ..errors import UsageError, shown

__all__ = [
    "InferOptions",
    "DEFAULT_REBALANCE",
    "MAX_GROUP",
    "FIRST_GROUP",
    "Needs",
    "OPTION_NEEDS",
    "refuse_without_effect",
]

#: Default ``rebalance_threshold``: move rows when the busiest rank has 25 % more work than
#: the mean (0 turns re-balancing off).
DEFAULT_REBALANCE = 1.25
#: Longest layer group of a fused backend (groups double while the tiles stay full, and
#: jump to this length once a group loses no row).
MAX_GROUP = 128
#: First layer group of a fused backend. Starting long avoids writing out the big early
#: layers (at 60,000 digits, groups of 1, 2, 4 layers cost 1.5x the time of one of 8).
FIRST_GROUP = 8


@dataclass(frozen=True)
class InferOptions:
    """How to run inference; validated when created (bad values raise :class:`UsageError`).

    Attributes
    ----------
    backend : one of :data:`mpisdnn.backends.NAMES`
        ``cpu``: fused numba kernel; ``reference``: plain scipy (MATLAB semantics);
        ``gpu``: CUDA kernels on CuPy arrays.
    threads : int or None
        Threads per rank for the ``cpu`` backend (``None``: cores / ranks on the node).
    prune : bool
        Drop rows that became empty from the working set. Exact: an empty row stays empty
        because the bias is only added where ``Y W`` is non-zero.
    rebalance_threshold : float
        Between layer groups, move rows when the busiest rank's remaining work exceeds this
        multiple of the mean (``0``: never). Results never depend on it.
    max_group, first_group : int
        Most layers a fused backend runs in one pass, and the length of its first pass.
    chunk_tiles : int
        ``cpu``: most 16-row tiles per chunk a thread keeps for a whole layer group.
    output_reserve : int
        ``cpu``: address space reserved for one group's output, in entries.
    push_density : float or None
        ``cpu``: rows with fewer non-zeros than this share of N go through the push kernel,
        layer after layer while they stay that sparse (``0``: tiles only; ``None``: 0.5 from
        8,192 neurons, where a 16-row tile no longer fits the cache, else 0). Results never
        depend on it.
    gpus_per_rank : int
        ``gpu``: ranks on a node may not outnumber its GPUs unless this is 0 (share devices).
    weight_memory : int or None
        Bytes of weights a rank may hold at once (compact layers read ahead plus the
        backend's prepared copy). A network that needs more is run in layer blocks that are
        read ahead of the compute and released after use. ``None``: a share of the node's
        memory (:func:`~mpisdnn.sdnn.streaming.default_weight_memory`).
    memory_per_rank : int or None
        Bytes of activations a rank may work on at once: when the backend's worst-case
        working set for all its rows would exceed it, rows go through each layer group in
        batches. ``None``: no bound (one batch).
    dedup : bool
        Between layer groups, keep one row of each set of byte-identical live rows and
        expand it back at the end (:mod:`mpisdnn.sdnn.dedup`). Results never depend on it.
    """

    backend: str = "cpu"
    threads: int | None = None
    prune: bool = True
    rebalance_threshold: float = DEFAULT_REBALANCE
    max_group: int = MAX_GROUP
    first_group: int = FIRST_GROUP
    chunk_tiles: int = 16
    output_reserve: int = 1 << 30
    push_density: float | None = None
    gpus_per_rank: int = 1
    weight_memory: int | None = None
    memory_per_rank: int | None = None
    dedup: bool = True

    def __post_init__(self):
        python_scalars(self)
        if self.backend not in NAMES:
            raise UsageError(
                f"unknown backend {shown(self.backend)}; choose one of {', '.join(NAMES)}"
            )
        for name in ("max_group", "first_group", "chunk_tiles", "output_reserve"):
            _positive(name, getattr(self, name))
        for name in ("threads", "weight_memory", "memory_per_rank"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.gpus_per_rank not in (0, 1):
            raise UsageError(
                f"gpus_per_rank must be 0 (share) or 1, got {shown(self.gpus_per_rank)}"
            )
        if not isinstance(self.prune, bool):
            raise UsageError(f"prune must be True or False, got {shown(self.prune)}")
        if not isinstance(self.dedup, bool):
            raise UsageError(f"dedup must be True or False, got {shown(self.dedup)}")
        pd = self.push_density
        if pd is not None and (
            isinstance(pd, bool) or not isinstance(pd, (int, float)) or not 0 <= pd < float("inf")
        ):
            raise UsageError(f"push_density must be a finite number >= 0, got {shown(pd)}")
        thr = self.rebalance_threshold
        bad_type = isinstance(thr, bool) or not isinstance(thr, (int, float))
        if bad_type or not 0 <= thr < float("inf"):
            raise UsageError(f"rebalance_threshold must be a finite number >= 0, got {shown(thr)}")
        refuse_without_effect(OPTION_NEEDS, self)

    def resolved(self, comm) -> InferOptions:
        """These options with every default that depends on the machine filled in: the one
        place ``weight_memory``'s default is computed
        (:func:`~mpisdnn.sdnn.streaming.default_weight_memory`; collective when it is
        ``None``, a no-op otherwise)."""
        if self.weight_memory is not None:
            return self
        from .streaming import default_weight_memory

        return self.replace(weight_memory=default_weight_memory(comm))

    def replace(self, **changes) -> InferOptions:
        """A copy with some fields changed (validated again)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise UsageError(f"unknown inference option(s): {', '.join(sorted(unknown))}")
        return InferOptions(**{**asdict(self), **changes})

    def as_dict(self) -> dict:
        return asdict(self)


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {shown(value)}")


def _given(value) -> bool:
    return value is not None


@dataclass(frozen=True)
class Needs:
    """A flag that takes effect only in some combinations of the others; given elsewhere it
    is refused in one line (a flag that silently does nothing misleads a measurement).

    Attributes
    ----------
    flag : str
        The command-line flag (the refusal names it).
    field : str
        Where its value lands on the object checked: ``"threads"``, ``"options.threads"``.
    needs : str
        The combination it takes effect in, in words that name the other flags.
    effective : callable
        ``effective(obj) -> bool``: whether it takes effect in ``obj``'s combination.
    given : callable
        ``given(value) -> bool``: whether the value was asked for (default: not ``None``).
    example : tuple of str
        Command-line words that give the flag (the tests generate the refused cases).
    without : tuple of str
        Command-line words of a combination where it has no effect (the same tests).
    """

    flag: str
    field: str
    needs: str
    effective: Callable
    given: Callable = _given
    example: tuple = ()
    without: tuple = ()

    def value(self, obj):
        for part in self.field.split("."):
            obj = getattr(obj, part)
        return obj

    def message(self) -> str:
        return f"{self.flag} has no effect here: it needs {self.needs}"


def refuse_without_effect(rules, obj) -> None:
    """Raise :class:`UsageError` (one line) for the first rule of ``rules`` whose flag
    ``obj`` gives where it has no effect.

    ``obj`` is an object the flags became (:class:`InferOptions`, an ``InferPlan``), never
    the parsed command line: the command line judges its own rules on its flags
    (``mpisdnn.commands._common.resolve_args``)."""
    for rule in rules:
        if rule.given(rule.value(obj)) and not rule.effective(obj):
            raise UsageError(rule.message())


#: The knobs of one backend (or of the fused ones): given with another backend, refused.
OPTION_NEEDS = (
    Needs("--threads", "threads", "--backend cpu", lambda o: o.backend == "cpu",
          example=("--threads", "2"), without=("--backend", "reference")),
    Needs("--push-density", "push_density", "--backend cpu", lambda o: o.backend == "cpu",
          example=("--push-density", "0.1"), without=("--backend", "reference")),
    Needs("--max-group", "max_group", "a backend that fuses layers (--backend cpu or gpu)",
          lambda o: o.backend != "reference", given=lambda v: v != MAX_GROUP,
          example=("--max-group", "4"), without=("--backend", "reference")),
    Needs("--share-gpus", "gpus_per_rank", "--backend gpu", lambda o: o.backend == "gpu",
          given=lambda v: v == 0, example=("--share-gpus",)),
)  # fmt: skip
