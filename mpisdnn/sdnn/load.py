"""Load a network and this rank's row block of Y0, from HDF5 or the official TSV files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError
from ..formats import hdf5, tsv
from ..parallel import SerialComm, agree, agree_error, barrier
from ..partition import balanced_blocks, block_of

__all__ = [
    "Problem",
    "load_network",
    "load_inputs",
    "load_truth",
    "load_problem",
    "read_truth_file",
    "streaming_store",
    "network_kind",
    "network_depth",
    "read_layer_slice",
]


@dataclass
class Problem:
    """Everything one rank needs to run inference on its rows."""

    network: object
    y_local: sp.csr_matrix
    row_offset: int
    g_rows: int
    g_nnz: int
    offsets: np.ndarray
    truth: np.ndarray | None
    load_seconds: float = 0.0
    #: a TSV inputs read: bytes, seconds, MB/s, entries (empty for HDF5 inputs)
    inputs_read: dict = field(default_factory=dict)


def load_network(comm, source, layers=None, bias=None, weight_memory=None, prepared_bytes=None):
    """Read the network on every rank (HDF5: each rank reads; TSV layers, a directory or the
    ``neuron{N}.tar.gz`` archive read as a stream: each rank parses its share of the layers,
    every rank gets them all in compact form, :mod:`~mpisdnn.formats.network_read`).

    A v2 HDF5 file is memory-mapped (:class:`~mpisdnn.formats.weight_store.HDF5WeightStore`).
    With ``weight_memory`` (bytes per rank), a v1 file whose layers would not fit is
    not read here: a :class:`~mpisdnn.sdnn.streaming.StreamingStore` is returned that reads
    layer blocks while the engine computes. ``prepared_bytes(nnz, neurons)`` is the
    backend's estimate of one prepared layer (default: 8 bytes per weight).
    """
    source = os.fspath(source)
    kind = agree(comm, network_kind, source)
    if kind == "tsv":  # a neuron{N}/ directory or the neuron{N}.tar.gz archive as published
        from ..formats.network_read import read_network_compact

        return read_network_compact(comm, source, layers, bias)
    if agree(comm, hdf5.network_version, source) == 2:
        # Mapped read-only: the ranks of a node share one copy in the page cache, and the
        # engine still prepares it in blocks that fit ``weight_memory``.
        from ..formats.weight_store import open_weight_store

        return agree(comm, _mapped_store, open_weight_store, source, layers)
    if weight_memory is not None:
        store = agree(comm, streaming_store, source, layers, weight_memory, prepared_bytes)
        if store is not None:
            return store
    return agree(comm, hdf5.read_network, source, layers)


def network_kind(source) -> str:
    """``"tsv"`` (a ``neuron{N}/`` directory or a ``neuron{N}.tar[.gz]`` archive of layer
    TSVs) or ``"hdf5"``: the one place a network source is told apart.

    Raises
    ------
    InputError
        One line: not found, not a regular file (FIFO, device), unreadable, or neither.
    """
    from ..formats.archive import is_network_archive

    source = os.fspath(source)
    if os.path.isdir(source):
        return "tsv"
    if not os.path.exists(source):
        raise InputError(f"{source}: network file or directory not found")
    tsv.regular_file_size(source, "an HDF5 network file")
    if hdf5.is_hdf5(source):
        return "hdf5"
    if is_network_archive(source):
        return "tsv"
    raise InputError(
        f"{source}: not an HDF5 network file nor a tar archive of layers (for the official "
        f"TSV layers pass neuron1024.tar.gz or its unpacked directory neuron1024/)"
    )


def network_depth(source, layers=None) -> int:
    """The depth a run of ``source`` runs: ``layers`` (checked against the network) or all
    its layers; ``source`` of any :func:`network_kind` (an archive is read through once, its
    members skipped, to count them)."""
    source = os.fspath(source)
    if network_kind(source) == "hdf5":
        found = int(hdf5.read_network_meta(source)["layers"])
    elif os.path.isdir(source):
        _, found = tsv.scan_network_dir(source)
    else:
        from ..formats import archive

        seen = [(item.neurons, item.k) for item in archive.network_layers(source)]
        _, found = archive.check_layer_set(source, seen)
    if layers is not None:
        if layers > found:
            raise ShapeError(f"{source}: asked for {layers} layers, the network has {found}")
        return int(layers)
    return int(found)


def read_layer_slice(source, total, k0, k1, bias=None, weight_memory=None, prepared_bytes=None):  # noqa: PLR0913 - the source, its slice and load_network's memory knobs
    """Global layers ``[k0, k1)`` of a ``total``-layer run of ``source``, held the way
    :func:`load_network` holds a whole network: TSV layers (directory or archive) parsed
    into compact form, a v2 HDF5 slice mapped, a v1 slice streamed when it would not fit
    ``weight_memory``, else read. One rank's call (the caller agrees on errors)."""
    if network_kind(source) == "tsv":
        from ..formats.network_read import read_network_compact

        return read_network_compact(SerialComm(), source, k1, bias, layer_start=k0)
    if hdf5.network_version(source) == 2:
        from ..formats.weight_store import open_weight_store

        return open_weight_store(source, total, layer_start=k0, layer_stop=k1)
    if weight_memory is not None and k1 > k0:
        store = streaming_store(source, total, weight_memory, prepared_bytes, k0, k1)
        if store is not None:
            return store
    return hdf5.read_network(source, total, k0, k1)


def read_network_tsv_source(source):
    """The reader of a TSV network ``source``: the directory's, or the archive's (a stream)."""
    if os.path.isdir(source):
        return tsv.read_network_tsv
    from ..formats.archive import read_network_archive

    return read_network_archive


def _mapped_store(open_store, source, layers):
    nl_file = int(hdf5.read_network_meta(source)["layers"])
    if layers is not None and not 0 < int(layers) <= nl_file:
        raise ShapeError(f"{source}: asked for {layers} layers, the file has {nl_file}")
    return open_store(source, layers)


def streaming_store(source, layers, weight_memory, prepared_bytes, k0=0, k1=None):
    """A streaming store of layers ``[k0, k1)`` (default all) of a v1 HDF5 network when they
    would not fit ``weight_memory``, else ``None``."""
    from .streaming import Hdf5LayerSource, StreamingStore, estimated_weight_bytes

    src = Hdf5LayerSource(source, layers, k0, k1)
    est = prepared_bytes or (lambda nnz, n: 8 * nnz + 20 * n)
    # Reading the whole file also holds its scipy CSR copy (8 bytes per weight) for a while.
    need = estimated_weight_bytes(src.edges, len(src), src.neurons, est) + 8 * src.edges
    return StreamingStore(src) if need > int(weight_memory) else None


def _root_only(comm, fn):
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs) if comm.rank == 0 else None

    return wrapped


def load_inputs(comm, source, neurons, stats=None, progress=0.0):
    """Return ``(y_local, row_offset, g_rows, g_nnz, offsets, stored_truth)`` for this rank.

    Rows are split into contiguous blocks balanced by nnz (:func:`balanced_blocks`). An HDF5
    file is read by every rank (its own rows); a TSV is read in parallel, every rank parsing
    one byte range (:func:`~mpisdnn.formats.tsv_parallel.read_images_parallel`). ``stats``
    (a dict), when given, receives the TSV read's bytes, seconds and MB/s. ``progress``:
    seconds between the TSV reader's own lines on rank 0 (0, the default: none; ``infer``
    and ``challenge`` print their load's heartbeat instead, at their ``--progress``).
    """
    source = os.fspath(source)
    agree(comm, tsv.regular_file_size, source, "an inputs file (HDF5 or TSV)")
    if hdf5.is_hdf5(source):
        meta = agree(comm, hdf5.read_inputs_meta, source)
        if meta["neurons"] != neurons:
            agree_error(
                comm,
                ShapeError(
                    f"{source}: inputs have {meta['neurons']} features, the network has "
                    f"{neurons} neurons"
                ),
            )
        indptr = meta["indptr"]
        offsets = balanced_blocks(np.diff(indptr), comm.size)
        r0, r1 = block_of(offsets, comm.rank)
        y, truth = agree(comm, hdf5.read_inputs, source, r0, r1, comm.rank == 0)
        return y, r0, meta["rows"], int(indptr[-1]), offsets, truth
    from ..formats.tsv_parallel import read_images_parallel

    _warm_reader(comm, source, rank0=True, neurons=neurons)
    block = read_images_parallel(comm, source, neurons, progress_interval=progress)
    if stats is not None:
        stats.update(block.stats)
    return block.y, block.row_offset, block.g_rows, block.g_nnz, block.offsets, None


def load_truth(comm, source):
    """Read a categories file on rank 0 (other ranks get ``None``).

    A last line without a newline is read, with one warning line (a cut file looks the same).
    """
    return agree(comm, _root_only(comm, read_truth_file), os.fspath(source))


def read_truth_file(source):
    """:func:`~mpisdnn.formats.tsv.read_categories`, plus the one warning line (stderr) when
    the file's last line has no newline."""
    import sys

    cats = tsv.read_categories(source)
    line = tsv.unterminated_line(source)
    if line:
        print(tsv.cut_short_warning(source, line), file=sys.stderr, flush=True)
    return cats


def _warm_reader(comm, inputs, rank0=False, neurons=0) -> None:
    """The ranks call the inputs reader's kernels on a one-entry problem
    (:func:`~mpisdnn.formats.tsv_parallel.warmup_steps`), each rank from another step, so a
    first run's ranks compile different kernels at once (a warm run only loads them here,
    as the read would). :func:`load_problem` has the ranks other than 0 do it before the
    network loads, while rank 0 reads and parses the network; :func:`load_inputs` has
    every rank do it (``rank0``) just before the read, in the keys' width of ``neurons``
    columns. Only an optimisation: any failure is left to the read itself."""
    if comm.size == 1 or (comm.rank == 0 and not rank0):
        return
    from .. import kernel_cache
    from ..formats import gz, tsv_parallel

    try:
        if hdf5.is_hdf5(inputs):
            return
        wide = neurons > 1 << 16
        steps = tsv_parallel.warmup_steps(comm.size, gz.is_gzip(inputs), wide)
        kernel_cache.in_turn(steps, comm.rank)
    except Exception:  # noqa: BLE001 - the read reports a bad file, with its line
        pass


def load_problem(
    comm,
    network,
    inputs,
    layers=None,
    truth=None,
    bias=None,
    weight_memory=None,
    prepared_bytes=None,
) -> Problem:
    """Load network, this rank's Y0 block and (rank 0) the truth categories.

    ``weight_memory`` and ``prepared_bytes``: see :func:`load_network` (streaming).
    """
    from time import perf_counter

    barrier(comm)
    t0 = perf_counter()
    _warm_reader(comm, inputs)
    net = load_network(comm, network, layers, bias, weight_memory, prepared_bytes)
    read_stats = {}
    y, r0, g_rows, g_nnz, offsets, stored = load_inputs(comm, inputs, net.neurons, read_stats)
    cats = load_truth(comm, truth) if truth is not None else stored
    bad = comm.rank == 0 and cats is not None and cats.size and cats.max() > g_rows
    agree_error(
        comm,
        ShapeError(f"truth names row {int(cats.max())} but the inputs have {g_rows} rows")
        if bad
        else None,
    )
    barrier(comm)
    seconds = perf_counter() - t0
    return Problem(net, y, r0, g_rows, g_nnz, offsets, cats, seconds, read_stats)

