"""``ProjectionOptions``: every knob of one projection, validated once, on creation.

The command (``mpisdnn project``), the benchmark and library callers build one of these and
hand it to :func:`mpisdnn.projection.project`; the keyword form of ``project`` builds it for
them. The kernel tuning ratios and the forced 64-bit path are options here, not module
globals to patch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .._checks import check_int, python_scalars
from ..errors import UsageError, shown
from .weightings import SYMMETRIC_WEIGHTINGS, WEIGHTINGS

__all__ = [
    "ProjectionOptions",
    "WEIGHTINGS",
    "SYMMETRIC_WEIGHTINGS",
    "STORAGES",
    "check_options",
    "default_memory_per_rank",
    "default_threads_per_rank",
]

# WEIGHTINGS (name -> record, mpisdnn.projection.weightings) is the one list of supported
# ``weight`` values; SYMMETRIC_WEIGHTINGS is its live view of the symmetric ones.
#: ``general``: every entry is stored; ``symmetric``: the upper triangle and the diagonal
#: only, mirrored by the readers (Matrix Market's ``symmetric``).
STORAGES = ("general", "symmetric")
_COMPRESS = (None, "none", "zstd", "blosc2", "gzip")


def check_options(
    weight="count",
    onto="cols",
    self_loops="drop",
    triangle="full",
    min_weight=None,
    top_k=None,
    storage="general",
) -> None:
    """Reject contradictory or out-of-range options with a :class:`UsageError`."""
    if weight not in WEIGHTINGS:
        raise UsageError(f"unknown weight {weight!r}; choose one of {', '.join(WEIGHTINGS)}")
    if onto not in ("rows", "cols"):
        raise UsageError(f"--onto must be 'rows' or 'cols', got {onto!r}")
    if self_loops not in ("drop", "keep"):
        raise UsageError(f"--self-loops must be 'drop' or 'keep', got {self_loops!r}")
    if triangle not in ("full", "upper"):
        raise UsageError(f"--triangle must be 'full' or 'upper', got {triangle!r}")
    if triangle == "upper" and weight not in SYMMETRIC_WEIGHTINGS:
        raise UsageError(
            f"--weight {weight} is not symmetric (H[u,v] != H[v,u]); use --triangle full"
        )
    if triangle == "upper" and top_k is not None:
        raise UsageError("--top-k selects within full rows; use it with --triangle full")
    if storage not in STORAGES:
        raise UsageError(f"--storage must be 'general' or 'symmetric', got {storage!r}")
    if storage == "symmetric":
        if weight not in SYMMETRIC_WEIGHTINGS:
            raise UsageError(f"--weight {weight} is not symmetric; use --storage general")
        if triangle != "full":
            raise UsageError("--storage symmetric stores the full matrix; drop --triangle upper")
        if top_k is not None:
            raise UsageError("--top-k rows are not symmetric; use --storage general")
    if top_k is not None and check_int("--top-k", top_k) < 1:
        raise UsageError(f"--top-k must be >= 1, got {top_k}")
    if min_weight is not None and not np.isfinite(min_weight):
        raise UsageError(f"--min-weight must be finite, got {min_weight}")


@dataclass(frozen=True)
class ProjectionOptions:
    """What to compute and where it goes (see :func:`mpisdnn.projection.project`).

    Attributes
    ----------
    weight, onto, self_loops, triangle, min_weight, top_k
        The projection itself.
    storage : {"general", "symmetric"}
        How a file output stores the matrix: every entry, or (symmetric weightings, HDF5 and
        Matrix Market) only ``v >= u``, computed once and mirrored by the readers.
    memory_per_rank : int or str or None
        Bound on kernel scratch plus a chunk's buffers (``"2G"``); None: half the memory.
    threads : int or None
        Numba threads for this rank.
    output : path-like, "memory" or None
    output_format : {"auto", "h5", "mtx", "tsv", "parquet"}
    index_base : {0, 1}
    compress : {None, "none", "zstd", "blosc2", "gzip"}
    dense_ratio, sweep_ratio, mark_ratio : float or None
        Kernel path thresholds (None: the kernels' measured defaults); for tuning runs.
    wide : bool
        Force 64-bit indices and counts (normally only past 2**31), so tests can run that
        path on small graphs.
    top_k_upper : bool or None
        ``top_k`` of a symmetric weighting computed from the upper triangle (half the
        multiply-adds; every entry offered to both rows' heaps), or from full rows with the
        fused heap (False). The same rows either way. None (default): the upper triangle
        where the multiply-adds are at least 8 times the rows' entry bounds (measured faster
        there, e.g. the MovieLens-20M shape; slower on RMAT and uniform graphs, see
        docs/projection.md) and its heaps (``(threads + 3) x n x (16 top_k + 16)`` bytes per
        rank, on top of ``memory_per_rank``) fit in a quarter of ``memory_per_rank``.
    """

    weight: str = "count"
    onto: str = "cols"
    self_loops: str = "drop"
    triangle: str = "full"
    min_weight: float | None = None
    top_k: int | None = None
    storage: str = "general"
    memory_per_rank: int | str | None = None
    threads: int | None = None
    output: object = "memory"
    output_format: str = "auto"
    index_base: int = 0
    compress: str | None = None
    dense_ratio: float | None = None
    sweep_ratio: float | None = None
    mark_ratio: float | None = None
    wide: bool = False
    top_k_upper: bool | None = None

    def __post_init__(self):
        python_scalars(self)
        check_options(
            self.weight,
            self.onto,
            self.self_loops,
            self.triangle,
            self.min_weight,
            self.top_k,
            self.storage,
        )
        to_memory = isinstance(self.output, str) and self.output == "memory"
        fmt = None
        if self.output is not None and not to_memory:
            from ..formats.projection.output import output_format

            fmt = output_format(self.output, self.output_format)  # refuses a name of none
        if self.storage == "symmetric" and self.output is not None:
            if to_memory:
                raise UsageError("--storage symmetric is for .h5 and .mtx outputs, not memory")
            if fmt not in ("h5", "mtx"):
                raise UsageError(f"--storage symmetric is for .h5 and .mtx outputs, not {fmt}")
        if self.index_base not in (0, 1):
            raise UsageError(f"index base must be 0 or 1, got {self.index_base}")
        if self.compress not in _COMPRESS:
            raise UsageError(f"unknown compression {self.compress!r}")
        if self.top_k_upper is not None and not isinstance(self.top_k_upper, bool):
            raise UsageError(
                "top_k_upper must be true, false or left unset (the automatic choice), "
                f"got {shown(self.top_k_upper)}"
            )
        if self.threads is not None and check_int("--threads", self.threads) < 1:
            raise UsageError(f"--threads must be >= 1, got {self.threads}")
        for name in ("dense_ratio", "sweep_ratio", "mark_ratio"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise UsageError(f"{name} must be a positive number, got {v}")
        if self.memory_per_rank is not None:
            from ..system import parse_size

            parse_size(self.memory_per_rank)  # raises on a malformed size

    def resolved(self, comm) -> ProjectionOptions:
        """A copy with the defaults that depend on the machine filled in (the one place
        they are computed): ``memory_per_rank`` in bytes
        (:func:`default_memory_per_rank` when unset) and ``threads``
        (:func:`default_threads_per_rank` when unset). Collective when a default is needed
        (the ranks on a node are counted)."""
        from ..system import parse_size

        changes = {}
        if self.memory_per_rank is None:
            changes["memory_per_rank"] = default_memory_per_rank(comm)
        elif not isinstance(self.memory_per_rank, int):
            changes["memory_per_rank"] = parse_size(self.memory_per_rank)
        if self.threads is None:
            changes["threads"] = default_threads_per_rank(comm)
        return self.replace(**changes) if changes else self

    def replace(self, **changes) -> ProjectionOptions:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def summary(self) -> dict:
        """The options a report and an output's attributes record."""
        keys = ("weight", "onto", "self_loops", "triangle", "min_weight", "top_k", "storage")
        return {k: getattr(self, k) for k in keys}


def _local_ranks(comm) -> int:
    if comm.size == 1:
        return 1  # serial (SerialComm included): no MPI needed to count the node's ranks
    from ..system import local_ranks

    return local_ranks(comm)


def default_memory_per_rank(comm) -> int:
    """``memory_per_rank`` when none is given: half the available memory shared by the
    ranks on this node (collective)."""
    from ..system import available_memory

    return int(available_memory() // (2 * _local_ranks(comm)))


def default_threads_per_rank(comm) -> int:
    """``threads`` when none is given: the cores shared by the ranks on this node
    (:func:`mpisdnn.system.default_threads`; collective)."""
    from ..system import default_threads

    return default_threads(_local_ranks(comm))
