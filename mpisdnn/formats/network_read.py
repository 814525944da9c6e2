"""A TSV network (``neuron{N}/`` or ``neuron{N}.tar.gz``, as published) read by all the ranks
at once, for a run: each rank parses its share of the layers, then every rank holds every
layer in compact form (:class:`~mpisdnn.weights.CompactStore`).

Layer ``k`` is parsed by rank ``(k - 1) % P``, with the compiled parser of ``convert
network`` (:class:`~mpisdnn.formats.archive.LayerParser`), and broadcast from there. A
directory's rank opens only its own files; an archive is one gzip stream that cannot be
entered in the middle, so every rank inflates all of it (in a thread, overlapped with its
parsing) and skips the members that are not its own. Before, rank 0 parsed every layer into
scipy CSR while the others waited, and broadcast the CSR: 2 ranks, a 120-layer N = 65536
archive (6.2 GB of text), 23-29 s of load and 6.3 GB of peak RSS a rank.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..parallel import agree_earliest, bcast
from . import archive

__all__ = ["read_network_compact"]


def read_network_compact(comm, source, layers=None, bias=None, layer_start=0):
    """Layers ``[layer_start, layers)`` (default: all) of the TSV network ``source`` on every
    rank of ``comm`` (collective).

    Parameters
    ----------
    comm : mpi4py communicator or :class:`~mpisdnn.parallel.SerialComm`
    source : path-like
        A ``neuron{N}/`` directory of ``n{N}-l{k}.tsv`` files or a ``neuron{N}.tar[.gz]``.
    layers : int, optional
    bias : float, optional
        Default: the official value for N.
    layer_start : int
        The first layer held (a pipeline stage's slice; its store's ``layer_start``).

    Returns
    -------
    CompactStore
        The same layers on every rank, as :func:`~mpisdnn.formats.archive.parse_layer`
        gives them.

    Raises
    ------
    AgreedError
        One line on every rank (the lowest failing rank's): a bad line (its file and line),
        a missing, repeated or foreign layer, fewer layers than ``layers``, no official bias
        for N, or layers that would take more memory than each rank of the node has (the
        line says to convert the network instead).
    """
    from ..network import YMAX
    from ..system import local_ranks
    from ..weights import CompactStore
    from . import tsv
    from ._validate import memory_bound

    source = os.fspath(source)
    is_dir = os.path.isdir(source)
    total = layers
    budget = memory_bound() // local_ranks(comm)  # every rank of the node holds every layer
    if is_dir:
        neurons, top = agree_earliest(comm, tsv.scan_network_dir, source, layers)
        total = top if layers is None else layers
    own, seen = agree_earliest(comm, _parse_own, source, is_dir, (layer_start, total), bias,
                               comm.rank, comm.size, budget)  # fmt: skip
    if not is_dir:
        neurons, top = agree_earliest(comm, archive.check_layer_set, source, seen, layers)
        total = top if layers is None else layers
    got = [own.get(k) if comm.size == 1 else bcast(comm, own.get(k), root=(k - 1) % comm.size)
           for k in range(layer_start + 1, total + 1)]  # fmt: skip
    return CompactStore(got, neurons, YMAX, layer_start, total_layers=total, source=source)


def _parse_own(source, is_dir, span, bias, rank, size, budget):  # noqa: PLR0913
    """``({k: layer}, seen)``: this rank's layers of ``span = (start, stop)`` (1-based ``k``
    in ``(start, stop]``; ``stop`` None: all) parsed, and ``(N, k)`` of every layer file in
    read order (an archive's; a directory is checked by its scan).

    Every rank will hold every layer, about ``size`` times what this rank parsed: past
    ``budget`` bytes, one :class:`~mpisdnn.errors.UsageError` line says to convert the
    network (a v2 file is mapped, one copy a node) instead of being killed for memory."""
    from ._validate import human_bytes
    from .tsv import layer_bias

    start, stop = span

    def mine(k):
        return start < k and (stop is None or k <= stop) and (k - 1) % size == rank

    parser = archive.LayerParser()
    own, seen, neurons, held = {}, [], None, 0
    for item in archive.network_layers(source, mine if is_dir else None):
        seen.append((item.neurons, item.k))
        neurons = item.neurons if neurons is None else neurons
        if item.neurons != neurons or not mine(item.k):
            continue  # another rank's, or a foreign layer (check_layer_set names it)
        b = layer_bias(source, neurons, bias)
        if item.k in own:
            archive.check_layer_set(source, seen)  # a repeated layer: names it, raises
        layer = own[item.k] = parser(item, b)
        held += sum(a.nbytes for a in (layer.rows, layer.colptr, layer.values, layer.bias)
                    if a is not None)  # fmt: skip
        if held * size > budget:
            raise UsageError(
                f"{source}: its layers would take more than the {human_bytes(budget)} of "
                f"memory each rank of this node has ({human_bytes(held * size)} for the "
                f"first {len(own) * size} layers); convert it once (mpisdnn convert "
                f"network {source} -o net.h5) and run from net.h5, which the ranks of a "
                f"node map and share"
            )
    return own, seen
