"""A one-rank first ``infer`` run's second compiler: the layer loop's kernels compiled in a
helper process (:mod:`mpisdnn._aside`) while the run itself reads and compiles the readers.

At two or more ranks the ranks start the runner's warm-up at different steps
(:func:`mpisdnn.kernel_cache.in_turn`), so the tile kernel and the others compile side by
side. One rank compiled them one after the other, after the reads: on the 2-core VM
(2026-12-03) a first run of the official 1024 x 120 with 60,000 TSV inputs took 36 s more
than a warm one, 21 s of it the tile kernel. The helper opens the same network (its first
layer; of a TSV directory or archive, the first layer file read, whatever its number: the
same store, so the same array types) and runs the runner's warm-up from its first step (the
tile kernel); the run itself takes the warm-up from its last step
(:func:`~mpisdnn.kernel_cache.helped_turns`), so it compiles the others meanwhile.
"""

from __future__ import annotations

__all__ = ["kernels_cached", "warm_up", "warms_up"]


def warms_up(plan) -> bool:
    """Whether :func:`warm_up` compiles what a run of ``plan`` (an
    :class:`~mpisdnn.sdnn.session.InferPlan`, options resolved) calls: the cpu backend's
    one-stage loop, not resumed (a resumed or staged run loads its network otherwise)."""
    return plan.options.backend == "cpu" and plan.stages == 1 and not plan.resume


def kernels_cached() -> bool:
    """Whether the tile kernel's machine code is in the cache (a warm run)."""
    from .. import kernel_cache
    from ..backends import _kernels as K

    return kernel_cache.has_cache_index(K.tile_group)


def warm_up(plan) -> None:
    """Open ``plan``'s network (its first layer) on this process alone and run the layer
    loop's warm-up from its first step (the tile kernel), as rank 0 of a run would, with
    ``plan``'s options: what the helper process of a one-rank first run calls."""
    from .. import backends, kernel_cache
    from ..formats.archive import read_first_layer
    from ..parallel import SerialComm
    from ..weights import as_store
    from .dedup import Dedup
    from .load import load_network, network_kind
    from .runner import loop_warmup_steps

    comm = SerialComm()
    opts = plan.options
    be = backends.create(opts, comm)
    if network_kind(plan.network) == "tsv":  # any one layer: an archive's first member
        first = read_first_layer(plan.network, plan.bias)
    else:
        first = load_network(comm, plan.network, 1, plan.bias, opts.weight_memory,
                             be.prepared_bytes)  # fmt: skip
    net = be.prepare_network(as_store(first))
    dedup = Dedup(comm, 1, opts.dedup, 0, opts.first_group)
    kernel_cache.in_turn(loop_warmup_steps(be, net, dedup), 0)
