"""Device choice and launch shape of the gpu backend: a rank's GPU, the launch knobs, defaults.

:func:`device_for` maps the ranks of a node to its GPUs (pure); :class:`GpuLaunch` holds the
knobs tests and benchmarks set (``None``: the default for the device or the simulator);
:func:`tail_rows_for` is the tail kernel's default batch bound. Split from
:mod:`mpisdnn.backends.gpu`, which re-exports the public names.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..errors import BackendError, UsageError

#: Rows per chunk (one thread block's rows for a whole layer group): 2 tiles of 32 rows.
#: 64 rather than 128: twice the blocks once few rows live (0.11 s against 0.17 s for the
#: official N=1024 x 120 with 60,000 inputs on an H200, docs/gpu.md).
CHUNK_ROWS = 64
#: Warps per thread block on a GPU (each warp computes one output column at a time).
WARPS = 8
#: Under the simulator every thread is a Python thread: small chunks and blocks keep CI fast.
SIM_CHUNK_ROWS = 64
SIM_WARPS = 2
#: Share of free device memory one batch of rows may use for its two buffers.
BATCH_SHARE = 0.25
#: Threads per block of the small per-row kernels.
ROW_THREADS = 128


def device_for(local_rank: int, local_ranks: int, devices: int, gpus_per_rank: int = 1) -> int:
    """The device of the ``local_rank``-th of ``local_ranks`` ranks on a node (pure).

    Raises
    ------
    BackendError
        No device, or more ranks than devices on the node while ``gpus_per_rank`` is not 0.
    """
    if devices < 1:
        raise BackendError("backend 'gpu': no CUDA device visible on this node")
    if gpus_per_rank and local_ranks > devices:
        raise BackendError(
            f"backend 'gpu': {local_ranks} ranks on this node but {devices} GPU(s); start at "
            f"most {devices} rank(s) per node, or share devices (--share-gpus, gpus_per_rank=0)"
        )
    return int(local_rank) % int(devices)


def tail_rows_for(n: int, sms: int, l2_bytes: int, chunk: int) -> int:
    """The default :meth:`GpuBackend.tail_limit` (pure): at least ``sms`` rows, more while
    the batch takes at most a third of the L2, never more than ``chunk * sms``."""
    fit = int(l2_bytes) // 3 // (4 * max(1, int(n)))
    return int(min(max(sms, fit), max(sms, int(chunk) * sms)))


@dataclass(frozen=True)
class GpuLaunch:
    """Launch-shape knobs of the gpu backend; ``None`` takes the default (for the device, or
    for the CUDA simulator).

    Attributes
    ----------
    chunk_rows : rows per chunk, a multiple of 32 (one thread block owns one chunk).
    warps : warps per block.
    batch_rows : rows per batch (default: by free device memory, ``BATCH_SHARE``).
    weight_bytes : device bytes for the weights of a group (default: a quarter of the free
        memory; 0: every group's weights streamed).
    shared_entries : weight entries a block stages in shared memory at once.
    split_rows : batches up to this many rows run the split-layer kernel (0: never).
    tail_rows : batches up to this many rows run the tail kernel (one block per row through
        the whole group; 0: never). Checked before ``split_rows``.
    column_sets : sum each set of equal columns once (default); ``False`` is the ablation.
    """

    chunk_rows: int | None = None
    warps: int | None = None
    batch_rows: int | None = None
    weight_bytes: int | None = None
    shared_entries: int | None = None
    split_rows: int | None = None
    tail_rows: int | None = None
    column_sets: bool = True

    def __post_init__(self):
        for name in ("chunk_rows", "warps", "batch_rows", "shared_entries"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or value < 1):
                raise UsageError(f"gpu {name} must be a positive integer, got {value!r}")
        for name in ("weight_bytes", "split_rows", "tail_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Integral) or value < 0):
                raise UsageError(f"gpu {name} must be an integer >= 0, got {value!r}")
