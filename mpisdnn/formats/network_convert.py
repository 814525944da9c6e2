"""Official TSV layers (a ``neuron{N}/`` directory or ``neuron{N}.tar.gz``) to a v2 network
file, every rank parsing and writing its own layers.

The layers are taken in the order the source is read (by number for a directory, archive
order for an archive); the i-th layer read belongs to rank ``i % P``. They go in rounds of
``P x ROUND`` layers (fewer when their text passes ``P x ROUND_BYTES``): every rank parses
its layers of the round with the compiled parser
(:class:`~mpisdnn.formats.archive.LayerParser`), the ranks exchange what each layer needs in
the file (its datasets' sizes: a layer's nnz is known only once parsed), rank 0 creates the
round's datasets, contiguous and allocated at once (``H5D_ALLOC_TIME_EARLY``, no fill), and
sends their file offsets back, and every rank writes its layers' arrays at those offsets with
``os.pwrite``. Rank 0 makes the same HDF5 calls in the same order at any rank count and
nothing else writes HDF5 metadata, so the file is byte for byte the same at any rank count.
A rank holds at most ``ROUND`` parsed layers and one layer's text.

A gzip archive cannot be entered in the middle: every rank inflates the whole stream (in a
thread, overlapped with its parsing) and skips the members that are not its own.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import InputError
from ..parallel import AgreedError, allgather, allreduce, barrier, bcast
from . import archive
from .network_v2 import create_file, layer_group, stamp_file

__all__ = ["convert_network_tsv", "ROUND"]

#: Most layers a rank parses per round (its memory: this many compact layers) ...
ROUND = 16
#: ... and most text per rank per round, in bytes (a compact layer is smaller than its
#: text). A round ends at whichever comes first; every rank sees every layer's size, so the
#: ranks agree on the rounds without a message. Fewer rounds, fewer collectives: on the
#: loaded 2-core VM a rank waiting in one spins while the other may not be scheduled.
ROUND_BYTES = 256 << 20


def _agree(comm, fn, *args):
    """``fn(*args)`` on every rank; the lowest failing rank's error raised on all."""
    from ..errors import MpisdnnError

    try:
        result, failure = fn(*args), None
    except MpisdnnError as exc:
        result, failure = None, (str(exc), getattr(exc, "exit_code", 2))
    except OSError as exc:
        result, failure = None, (f"{exc.strerror or exc}", 2)
    failures = [f for f in allgather(comm, failure) if f is not None]
    if failures:
        raise AgreedError(*failures[0])
    return result


def _spec(layer):
    """What the file needs for one layer: ``(name, dtype, count)`` per dataset and the
    layer_info values."""
    from ..weights import index_dtype, same_bits

    n = layer.neurons
    sets = [("rows", np.dtype(index_dtype(n)).str, int(layer.rows.size))]
    if layer.colptr is not None:
        sets.append(("colptr", "<i8", n + 1))
    if layer.values is not None:
        sets.append(("values", "<f4", int(layer.rows.size)))
    bias = np.asarray(layer.bias, dtype=np.float32)
    uniform = same_bits(bias)
    if not uniform:
        sets.append(("bias", "<f4", n))
    info = (
        int(layer.rows.size),
        -1 if layer.colptr is not None else int(layer.per_col),
        float(np.float32(np.nan) if layer.values is not None else np.float32(layer.value)),
        float(bias[0] if uniform else np.float32(np.nan)),
    )
    return sets, info


def _arrays(layer):
    from ..weights import index_dtype

    out = {"rows": np.ascontiguousarray(layer.rows, dtype=index_dtype(layer.neurons))}
    if layer.colptr is not None:
        out["colptr"] = np.ascontiguousarray(layer.colptr, dtype=np.int64)
    if layer.values is not None:
        out["values"] = np.ascontiguousarray(layer.values, dtype=np.float32)
    out["bias"] = np.ascontiguousarray(layer.bias, dtype=np.float32)
    return out


class _Root:
    """Rank 0's HDF5 side: creates datasets, reports offsets, writes the index at the end."""

    def __init__(self, tmp, neurons, source, ymax):
        import h5py

        self.h5py = h5py
        self.f = create_file(tmp)
        self.tmp, self.neurons, self.source, self.ymax = tmp, neurons, source, ymax
        self.info = {}
        self.min_size = 0
        self.reserved = 0

    def create(self, k, sets, info):
        """Datasets of layer ``k`` (1-based), allocated now; their file offsets."""
        from ._atomic import reserve

        h5d, h5p = self.h5py.h5d, self.h5py.h5p
        need = sum(np.dtype(dt).itemsize * count for _, dt, count in sets)
        want = int((self.min_size + need) * 1.01) + 4096 * (len(self.info) + 8) + (256 << 10)
        if want > self.reserved:
            try:  # 64 MiB ahead, so a big network reserves once every few rounds
                reserve(self.tmp, want + (64 << 20))
                self.reserved = want + (64 << 20)
            except OSError:  # a small disk may hold the file but not the slack
                reserve(self.tmp, want)
                self.reserved = want
        g = self.f.create_group(layer_group(k - 1))
        offsets = {}
        for name, dt, count in sets:
            dcpl = h5p.create(h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
            dset = g.create_dataset(name, shape=(count,), dtype=dt, dcpl=dcpl, track_times=False)
            offsets[name] = dset.id.get_offset() if count else None
            self.min_size += np.dtype(dt).itemsize * count
        self.info[k] = info
        return offsets

    def finish(self, layers):
        f = self.f
        grp = f.create_group("layer_info")
        cols = list(zip(*(self.info[k] for k in range(1, layers + 1))))
        for key, dtype, values in zip(
            ("nnz", "per_col", "value", "bias"), (np.int64, np.int64, np.float32, np.float32), cols
        ):
            grp.create_dataset(key, data=np.asarray(values, dtype=dtype), track_times=False)
        stamp_file(f, self.neurons, layers, self.ymax, self.source)
        f.flush()
        f.close()
        self.f = None

    def abandon(self):
        from ._atomic import abandon_h5

        if self.f is not None:
            abandon_h5(self.tmp, self.f)
            self.f = None


def _verify(tmp, min_size, layers):
    import h5py

    from ._atomic import check_size

    check_size(tmp, min_size)
    size = os.path.getsize(tmp)
    with h5py.File(tmp, "r") as f:
        if int(f.attrs["layers"]) != layers:
            raise OSError(f"{tmp}: layer count not recorded")
        for k in range(layers):
            for dset in f[layer_group(k)].values():
                off = dset.id.get_offset()
                if dset.size and (off is None or off + dset.nbytes > size):
                    raise OSError(28, f"{dset.name} extends past the end of the file")


class _Progress:
    def __init__(self, comm, source, interval):
        self.on = comm.rank == 0 and interval and interval > 0
        self.source, self.interval = source, interval
        self.t0 = self.last = time.perf_counter()

    def __call__(self, layers, text_bytes, total=None):
        """``layers`` written so far, ``text_bytes`` of their text (estimated from rank
        0's share: no communication)."""
        if not self.on:
            return
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        from ..progress import format_duration

        self.last = now
        el = now - self.t0
        of = f"/{total}" if total else ""
        print(
            f"[progress] converting {self.source}: {layers}{of} layers, "
            f"{text_bytes / 1e9:.2f} GB of text, {text_bytes / el / 1e6:.0f} MB/s, "
            f"elapsed {format_duration(el)}",
            flush=True,
        )


def convert_network_tsv(comm, source, output, layers=None, bias=None, progress=5.0,
                        ymax=None):  # fmt: skip
    """Write the v2 network file ``output`` from official TSV layers (collective).

    Parameters
    ----------
    comm : mpi4py communicator
    source : path-like
        ``neuron{N}/`` directory of ``n{N}-l{k}.tsv`` files, or ``neuron{N}.tar.gz`` (or
        ``.tar``), read as published.
    output : path-like
        Written under a temporary name, checked, renamed; nothing is left on failure.
    layers : int, optional
        First ``layers`` layers (default: all).
    bias : float, optional
        Default: the official value for N.
    progress : float
        Seconds between rank 0's progress lines (0: none).

    Returns
    -------
    (neurons, layers, edges, stats)
        ``stats``: text bytes, seconds, MB/s.

    Raises
    ------
    AgreedError
        One line on every rank: a bad layer (its file and line), a missing, repeated or
        foreign layer, no official bias for N, an unwritable output.
    """
    from ..network import YMAX
    from . import tsv

    source = os.fspath(source)
    output = os.fspath(output)
    t0 = time.perf_counter()
    is_dir = _agree(comm, _source_kind, source)
    neurons = top = None
    if is_dir:
        neurons, top = _agree(comm, tsv.scan_network_dir, source, layers)
    total = layers if layers is not None else top

    def wanted(k):
        return total is None or k <= total

    tmp = bcast(comm, _agree(comm, _start, comm, output), root=0)  # every rank knows it
    root = None
    from .._signals import temporary

    with temporary(tmp):
        try:
            if comm.rank == 0:
                root = _agree(comm, _Root, tmp, neurons or 0, source, ymax or YMAX)
            else:
                _agree(comm, lambda: None)
            out = _rounds(comm, source, tmp, root, wanted, bias, progress)
            neurons, seen, edges, text_bytes = out
            if not is_dir:
                neurons, top = _agree(comm, archive.check_layer_set, source, seen, layers)
            total = layers if layers is not None else top
            _agree(comm, _finish, comm, root, tmp, output, total)
        except AgreedError as exc:
            if root is not None:
                root.abandon()  # an agreed error: every rank is here, rank 0 removes it
            if "no space left" in str(exc) and output not in str(exc):
                raise AgreedError(f"{output}: {exc}", exc.exit_code) from None  # name the file
            raise
        except BaseException:
            # an interrupt or a crash on this rank: the job ends (MPI_Abort) while rank 0,
            # the file's creator, may sit in a collective and never run its clean-up; so
            # every rank that knows the temporary removes it (issue 42 item 10)
            try:
                if root is not None:
                    root.abandon()
            except OSError:  # another rank removed it first
                pass
            _discard(tmp)
            raise
    seconds = time.perf_counter() - t0
    stats = {"bytes": text_bytes, "seconds": seconds, "mb_per_second": text_bytes / seconds / 1e6}
    return neurons, total, edges, stats


def _discard(tmp):
    try:
        os.remove(tmp)
    except OSError:
        pass


def _source_kind(source) -> bool:
    """True for a directory, False for an archive; one line for anything else."""
    if os.path.isdir(source):
        return True
    if not os.path.exists(source):
        raise InputError(f"{source}: network directory or archive not found")
    from .tsv import regular_file_size

    regular_file_size(source, "a network directory or neuron{N}.tar.gz")
    if not archive.is_network_archive(source):
        raise InputError(
            f"{source}: not a directory of n{{N}}-l{{k}}.tsv layers nor a tar archive of them"
        )
    return False


def _start(comm, output):
    """Rank 0 creates the temporary output (``O_EXCL``); every rank gets its name."""
    from ._atomic import output_error, temp_name

    tmp = None
    if comm.rank == 0:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
            tmp = temp_name(output)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            # tracked from its creation: a SIGTERM while the ranks agree on the name (the
            # moment a user sees the file appear) left it behind (issue 42 item 10)
            from .._signals import track

            track(tmp)
        except OSError as exc:
            raise output_error(output, exc) from None
    return tmp


def _finish(comm, root, tmp, output, total):
    """After every rank's writes: rank 0 writes the index, syncs, checks and renames."""
    from ._atomic import _fsync, output_errors

    barrier(comm)  # every pwrite is done
    if comm.rank != 0:
        return
    with output_errors(output):
        root.finish(total)
        _fsync(tmp)
        _verify(tmp, root.min_size, total)
        os.replace(tmp, output)


def _rounds(comm, source, tmp, root, wanted, bias, progress):
    """Parse and write every wanted layer; returns ``(N, seen, edges, text bytes)``."""
    from .tsv import layer_bias

    parser = archive.LayerParser()
    size, rank = comm.size, comm.rank
    fd = os.open(tmp, os.O_WRONLY)
    seen = []  # (N, k) of every layer file, in read order (for the archive's checks)
    seen_set = set()
    edges = 0
    text = 0
    tick = _Progress(comm, source, progress)
    held = []  # this rank's parsed layers of the round: (position, k, layer)
    pos = 0
    neurons = None
    try:
        items = archive.network_layers(source, None)
        done = False
        want_here = size * ROUND  # a round: P x ROUND wanted layers; this rank parses its own
        bytes_here = size * ROUND_BYTES
        while not done:
            got_round = 0
            got_bytes = 0

            def step():
                nonlocal got_round, got_bytes, pos, neurons, text, done
                while got_round < want_here and got_bytes < bytes_here:
                    item = next(items, None)
                    if item is None:
                        done = True
                        return
                    seen.append((item.neurons, item.k))
                    if neurons is None:
                        neurons = item.neurons
                    if item.neurons != neurons or (neurons, item.k) in seen_set:
                        archive.check_layer_set(source, seen)  # names the layer; raises
                    seen_set.add((neurons, item.k))
                    if not wanted(item.k) or item.neurons != neurons:
                        continue
                    if pos % size == rank:
                        b = layer_bias(source, neurons, bias)
                        held.append((pos, item.k, parser(item, b)))
                        text += item.size
                    pos += 1
                    got_round += 1
                    got_bytes += item.size

            _agree(comm, step)
            edges += _write_round(comm, root, fd, held)
            held.clear()
            tick(pos, text * size, None)
        if root is not None:
            root.neurons = neurons
        neurons = bcast(comm, neurons, root=0)
    finally:
        os.close(fd)
    return neurons, seen, edges, allreduce(comm, text)


def _write_round(comm, root, fd, held):
    """Exchange the round's layer specs, rank 0 allocates, every rank writes its own."""
    mine = [(pos, k, *_spec(layer)) for pos, k, layer in held]
    every = sorted(sum(allgather(comm, mine), []))
    offsets = None
    if root is not None:

        def create():
            return [root.create(k, sets, info) for _, k, sets, info in every]

        offsets = _agree_root(comm, create)
    else:
        _agree_root(comm, lambda: None)
    offsets = bcast(comm, offsets, root=0)
    where = {pos: off for (pos, *_), off in zip(every, offsets)}
    edges = 0

    def write():
        for pos, _k, layer in held:
            for name, arr in _arrays(layer).items():
                off = where[pos].get(name)
                if off is None or not arr.size:
                    continue
                _pwrite_all(fd, arr, off)
        return None

    _agree(comm, write)
    for _, _, _, info in every:
        edges += info[0]
    return edges


def _agree_root(comm, fn):
    try:
        result, failure = fn(), None
    except Exception as exc:  # noqa: BLE001 - reported once, agreed
        from ._atomic import no_space

        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if no_space(exc):
            msg = "no space left on device"
        result, failure = None, (msg, 2)
    failures = [f for f in allgather(comm, failure) if f is not None]
    if failures:
        raise AgreedError(*failures[0])
    return result


def _pwrite_all(fd, arr, offset):
    view = memoryview(np.ascontiguousarray(arr)).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(28, "short write")
        done += n
