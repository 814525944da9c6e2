"""Reading a stage's slice of the network for ``mpisdnn infer --stages S``.

Each rank of the stage flow (:mod:`mpisdnn.sdnn.pipeline`) holds only its stage's layers
(and the head every rank runs): :func:`load_stage_network` reads that slice,
:func:`load_stage_head` the head, :func:`stage_slicer` what moves a stage to other layers once
the first micro-batch has shown where the work is. Weights are held as
:func:`mpisdnn.sdnn.load.load_network` holds them (a v2 HDF5 slice mapped, a v1 slice read or
streamed, TSV layers parsed) by :func:`mpisdnn.sdnn.load.read_layer_slice`: the source's kind
is told apart in one place (:func:`~mpisdnn.sdnn.load.network_kind`), for a directory, a
``neuron{N}.tar.gz`` archive and HDF5 alike.
"""

from __future__ import annotations

from ..parallel import agree, phase
from ..partition import stage_layers
from .load import network_depth, network_kind
from .load import read_layer_slice as _read_slice

__all__ = ["stage_depth", "load_stage_head", "load_stage_network", "stage_slicer"]


@phase("load")
def stage_depth(comm, source, layers=None) -> int:
    """The depth a staged run of ``source`` runs (``layers``, or all the network's layers;
    collective, errors agreed)."""
    return int(agree(comm, network_depth, source, layers))


@phase("load")
def load_stage_head(comm, source, total, first, stop, bias=None, weight_memory=None,  # noqa: PLR0913
                    prepared_bytes=None):  # fmt: skip
    """Global layers ``[first, stop)`` of a ``total``-layer run, held on every rank as
    :func:`load_stage_network` holds a slice (collective; errors agreed): the head that
    :func:`run_pipeline` runs data-parallel before the stages."""
    return agree(comm, _read_slice, source, total, first, stop, bias, weight_memory,
                 prepared_bytes)  # fmt: skip


@phase("load")
def load_stage_network(  # noqa: PLR0913 - the source and the memory knobs of load_network
    comm, source, stages, layers=None, bias=None, first_layer=0, weight_memory=None,
    prepared_bytes=None, total=None,
):  # fmt: skip
    """Read only this rank's stage slice of the network (collective; errors agreed).

    Weights are held the way :func:`~mpisdnn.sdnn.load.load_network` holds them: a v2 HDF5
    slice is mapped, a v1 slice that would not fit ``weight_memory`` is streamed in blocks
    (:class:`~mpisdnn.sdnn.streaming.StreamingStore`), the rest is read. The slice is the
    even split :func:`stage_layers`; :func:`run_pipeline` may move it once it has measured
    where the work is (see :func:`stage_slicer`). ``total``: the depth when the caller
    already has it from :func:`stage_depth` (not read again).

    Returns
    -------
    (network, k0, k1, total_layers)
        ``network`` holds global layers ``[k0, k1)``; ``total_layers`` is the depth run.
    """
    if total is None:
        total = stage_depth(comm, source, layers)
    k0, k1 = stage_layers(comm.rank % stages, stages, first_layer, total)
    store = agree(comm, _read_slice, source, total, k0, k1, bias, weight_memory, prepared_bytes)
    return store, k0, k1, total


def stage_slicer(source, total, bias=None, weight_memory=None, prepared_bytes=None, first=0):
    """What :func:`run_pipeline` calls to move this rank's stage to other layers:
    ``slicer(k0, k1)`` gives global layers ``[k0, k1)`` of ``source`` held as
    :func:`load_stage_network` holds them (called only on the ranks whose stage moves; the
    caller agrees on errors). Call it after :func:`load_stage_network` (setup, untimed).

    A v2 HDF5 network is mapped here once for all layers ``[first, total)`` (not validated
    again: the stages' slices at load covered every one of them), so moving a stage costs
    no I/O; a v1 slice is read (or streamed) again when it moves. Returns ``None`` for TSV
    layers (a directory or an archive): parsing a slice again would cost more than the
    balance gains, so a TSV network keeps the even split.
    """
    from ..formats import hdf5

    if network_kind(source) == "tsv":
        return None
    if hdf5.network_version(source) == 2:
        from ..formats.weight_store import HDF5WeightStore

        whole = HDF5WeightStore(source, total, first, total, validate=False)
        return lambda k0, k1: whole.slice(k0 - first, k1 - first)

    def slicer(k0, k1):
        return _read_slice(source, total, k0, k1, bias, weight_memory, prepared_bytes)

    return slicer
