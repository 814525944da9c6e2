"""HDF5 projection outputs (``format="mpisdnn.projection"``): streaming writers and readers.

Layouts (docs/projection.md):

* one rank: one self-contained file, ``/indptr``, ``/indices``, ``/data`` (chunked, optionally
  compressed), attributes for the options and sizes, and ``/labels/rows``, ``/labels/cols``
  when the input had its own ids;
* ``P > 1`` ranks: every rank streams its rows into ``OUT.parts/<run>-r<rank>.h5`` (``/indptr``,
  ``/indices``) and ``<run>-r<rank>.data.h5`` (``/data``), and rank 0 writes the index ``OUT``:
  global ``/indptr``, the part table ``/parts``, the labels, and virtual datasets ``/indices``
  and ``/data`` over the parts, so plain h5py reads it as one matrix.

Uncompressed parts are written by :class:`~mpisdnn.formats.direct_io.StagedWriter` (a writer
thread, page-aligned ``O_DIRECT`` writes overlapping the computation) into the place HDF5 then
gives the contiguous dataset (``ALIGN_BASE``, checked); compressed outputs go through HDF5's
filter pipeline in large chunks, written from the same kind of thread.
"""

from __future__ import annotations

import os
import secrets
import stat
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

from ... import parallel
from ..._signals import track, untrack
from ...errors import InputError, MpisdnnError, UsageError
from .._atomic import _fsync, abandon_h5, atomic_path, no_space, owned_name
from .._validate import plain_attr
from ..hdf5 import open_layout
from .sink import Sink

__all__ = [
    "PROJECTION_FORMAT",
    "COMPRESSIONS",
    "H5Sink",
    "H5DirectSink",
    "make_h5_sink",
    "read_projection_h5",
    "iter_projection",
    "is_symmetric",
    "projection_meta",
    "projection_labels",
]

PROJECTION_FORMAT = "mpisdnn.projection"
PART_FORMAT = "mpisdnn.projection.part"
VERSION = 1
#: Offset of the raw array in a direct-written part (HDF5 metadata fits in front of it).
ALIGN_BASE = 1 << 20
#: Allocations from this size on are aligned to ALIGN_BASE (metadata blocks stay below it).
_ALIGN_THRESHOLD = ALIGN_BASE // 2
#: Chunk of the compressed/chunked datasets (entries): large chunks, few HDF5 calls.
_H5_CHUNK = 1 << 20
#: ``--compress`` choices; all need the optional ``hdf5plugin`` package except gzip.
COMPRESSIONS = ("none", "zstd", "blosc2", "gzip")


def _h5py():
    import h5py

    return h5py


@contextmanager
def _disk_errors(path):
    """Any lack of space while writing becomes one line naming the output."""
    from ..direct_io import DiskFullError

    try:
        yield
    except DiskFullError:
        raise InputError(f"{path}: no space left on device") from None
    except OSError as exc:
        if no_space(exc):
            raise InputError(f"{path}: no space left on device") from None
        raise


def _remove_empty_dir(path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _token(comm) -> str:
    return parallel.bcast(comm, secrets.token_hex(4) if comm.rank == 0 else None)


def start_output(path, comm) -> str:
    """Collective start of an output: rank 0 cleans up leftovers of crashed runs of ``path``,
    then every rank gets the run's token."""
    if comm.rank == 0:
        clean_leftovers(path)
    return _token(comm)


def _attrs(meta: dict) -> dict:
    # HDF5 attributes have no None
    return {k: ("" if v is None else v) for k, v in meta.items()}


def compression_filter(name: str | None) -> dict:
    """``create_dataset`` keywords for a ``--compress`` choice (bit-shuffled, fast levels)."""
    if name in (None, "none"):
        return {}
    if name == "gzip":
        return {"compression": "gzip", "compression_opts": 1, "shuffle": True}
    if name not in COMPRESSIONS:
        raise UsageError(f"unknown compression {name!r}; choose one of {', '.join(COMPRESSIONS)}")
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError(
            f"--compress {name} needs the optional package hdf5plugin "
            "(pip install 'mpisdnn[compress]')"
        ) from None
    if name == "zstd":
        # bit-shuffle then zstd: the Bitshuffle filter with its zstd back end
        return dict(hdf5plugin.Bitshuffle(cname="zstd", clevel=1))
    return dict(hdf5plugin.Blosc2(cname="zstd", clevel=1, filters=hdf5plugin.Blosc2.BITSHUFFLE))


def _write_labels(f, labels) -> None:
    if labels is None:
        return
    h5py = _h5py()
    g = f.create_group("labels")
    arr = np.asarray(labels)
    if arr.dtype.kind in "USO":
        data = np.array([str(x).encode() for x in arr.tolist()], dtype=object)
        dt = h5py.string_dtype("utf-8")
    else:
        data, dt = arr.astype(np.int64), np.int64
    for name in ("rows", "cols"):
        g.create_dataset(name, data=data, dtype=dt)


# --- writers ---------------------------------------------------------------------------------


class _DeferredWrites(Sink):
    """A sink of per-rank files whose write errors, at several ranks, wait for the close.

    Each rank fails at its own moment: raised at once, every failing rank printed its line
    and MPICH its Abort line (2-3 lines, issue 31 item 6). The close is collective, so the
    ranks agree there on one line; this rank's files go at the failure, freeing the disk,
    and its later rows are dropped. Subclasses write through :meth:`_deferred` and close
    their files in ``_close_part_files``.
    """

    #: Ranks writing; with more than one a write error waits for the close.
    ranks = 1
    #: The write error kept for the close.
    failed = None

    def _deferred(self, fn, *args) -> None:
        """Run one write of ``fn``; at several ranks a full disk is kept for the close."""
        if self.failed is not None:
            return
        try:
            with _disk_errors(self.path):
                fn(*args)
        except MpisdnnError as exc:
            if self.ranks == 1:
                raise
            self.failed = exc
            self._drop_files()

    def _drop_files(self) -> None:
        """This rank's files, removed at once after a write error."""
        self.abort()

    def _close_part(self) -> None:
        if self.failed is not None:
            raise self.failed
        with _disk_errors(self.path):
            self._close_part_files()


class _PartSink(_DeferredWrites):
    """What both HDF5 sinks do at the end: every rank closes its part (collectively, so one
    rank's failure aborts all), then, with parts, rank 0 writes the index over them."""

    #: One self-contained file: no parts, no index.
    single = False

    def finish(self, comm, totals) -> None:
        from ...parallel import agree

        try:
            agree(comm, self._close_part)
        except BaseException:
            self.abort()
            raise
        # From here a part is kept rather than removed by the watchdog: a part removed after
        # the index that lists it was written would break a complete output (an unlisted one
        # is a leftover that the next run or `mpisdnn clean` removes).
        untrack(*self._temporaries())
        if not self.single:
            _finish_index(comm, self.path, self.meta, self.parts, self.nnz, self.labels)

    def _temporaries(self) -> list:
        """This rank's temporary and part files (see :func:`mpisdnn._signals.track`)."""
        tmps = getattr(self, "tmps", None) or [getattr(self, "tmp", None)]
        return [*tmps, self.parts.index_part, self.parts.data_part]


class H5Sink(_PartSink):
    """Streams rows into one chunked HDF5 CSR (one rank, or any rank count when compressed).

    With ``P > 1`` ranks each rank writes a part holding ``/indptr``, ``/indices`` and
    ``/data`` and rank 0 writes the index (virtual datasets over the parts).
    """

    def __init__(self, path, comm, meta: dict, labels=None, compress=None):
        h5py = _h5py()
        self.path = os.fspath(path)
        self.meta = dict(meta)
        self.labels = labels
        self.single = comm.size == 1
        self.ranks = comm.size
        self.token = start_output(self.path, comm)
        self.filters = compression_filter(compress)
        self.meta["compression"] = compress or "none"
        self.parts = _PartNames(
            self.path, self.token, comm.rank, separate_data=False, create=not self.single
        )
        self.final = self.path if self.single else self.parts.index_part
        self.tmp = owned_name(self.final, "tmp")
        track(self.tmp, None if self.single else self.final)
        budget = int(self.meta.pop("budget_entries", _H5_CHUNK))
        expected = int(self.meta.pop("expected_entries", _H5_CHUNK))
        # whole chunks are written at once from our buffer (2 chunks <= the chunk budget), so
        # HDF5's chunk cache is not needed
        chunk = (int(min(_H5_CHUNK, max(1024, min(expected, budget // 2)))),)
        self.nnz = 0
        self.counts = []
        self.idx_dtype = np.dtype(meta["index_dtype"])
        self.val_dtype = np.dtype(meta["value_dtype"])
        self.f = None
        try:
            with _disk_errors(self.path):  # a disk already full: one line, nothing left
                parts_dir = None if self.single else self.parts.dir
                self.f = _create_part(h5py, self.tmp, parts_dir, rdcc_nbytes=0)
                self.ind = self.f.create_dataset(
                    "indices", shape=(0,), maxshape=(None,), dtype=self.idx_dtype,
                    chunks=chunk, **self.filters,
                )  # fmt: skip
                self.dat = self.f.create_dataset(
                    "data", shape=(0,), maxshape=(None,), dtype=self.val_dtype, chunks=chunk,
                    **self.filters,
                )  # fmt: skip
        except BaseException:
            self.abort()
            raise
        self.chunk = chunk[0]
        # entries wait in a buffer until a whole chunk can be written at once
        self.buf_idx = np.empty(2 * self.chunk, self.idx_dtype)
        self.buf_val = np.empty(2 * self.chunk, self.val_dtype)
        self.fill = 0
        self.write_seconds = 0.0

    def write(self, row_start, counts, indices, data) -> None:
        self._deferred(self._write, counts, indices, data)

    def _write(self, counts, indices, data) -> None:
        self.counts.append(np.asarray(counts, dtype=np.int64).copy())
        lo, n = 0, int(indices.size)
        while lo < n:
            take = min(n - lo, self.buf_idx.size - self.fill)
            self.buf_idx[self.fill : self.fill + take] = indices[lo : lo + take]
            self.buf_val[self.fill : self.fill + take] = data[lo : lo + take]
            self.fill += take
            lo += take
            if self.fill >= self.chunk:
                self._flush(self.chunk)

    def _flush(self, k: int) -> None:
        if k == 0:
            return
        lo = self.nnz
        self.ind.resize((lo + k,))
        self.dat.resize((lo + k,))
        self.ind[lo:] = self.buf_idx[:k]
        self.dat[lo:] = self.buf_val[:k]
        self.nnz += k
        rest = self.fill - k
        self.buf_idx[:rest] = self.buf_idx[k : self.fill]
        self.buf_val[:rest] = self.buf_val[k : self.fill]
        self.fill = rest

    def abort(self) -> None:
        f, self.f = self.f, None  # abort may run twice (a deferred error, then finish)
        try:
            if f is not None:
                # truncated first: HDF5 closing a file on a full disk can crash in its flush
                abandon_h5(self.tmp, f)
        except (OSError, RuntimeError):
            pass
        finally:
            _remove(self.tmp)
            if not self.single:
                _remove_empty_dir(self.parts.dir)

    def _close_part_files(self) -> None:
        self._flush(self.fill)
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        indptr = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        if self.single:
            self.f.attrs.update(_attrs(self.meta))
            self.f.attrs["nnz"] = self.nnz
            _write_labels(self.f, self.labels)
            full = np.zeros(int(self.meta["rows"]) + 1, np.int64)
            r0 = int(self.meta["row_start"])
            full[r0 : r0 + indptr.size] = indptr
            full[r0 + indptr.size :] = indptr[-1]
            self.f.create_dataset("indptr", data=full)
        else:
            self.f.create_dataset("indptr", data=indptr)
            self.f.attrs.update(_part_attrs(self.meta, self.nnz))
        self.f.flush()
        self.f.close()
        _verify_h5(self.tmp, {"indices": self.nnz, "data": self.nnz})
        os.replace(self.tmp, self.final)


class H5DirectSink(_PartSink):
    """Multi-rank uncompressed HDF5 output written by an overlapped ``O_DIRECT`` writer thread.

    The kernel's blocks are gathered straight into page-aligned staging buffers
    (:meth:`append_blocks`); a thread writes full buffers at ``ALIGN_BASE`` onwards into two
    files that ``finish`` turns into HDF5 files whose contiguous dataset HDF5 places exactly
    there (alignment property; the offset is checked, and the sizes are verified on disk).
    """

    staged = True

    def __init__(self, path, comm, meta: dict, labels=None, max_batch: int = 0):
        from ..direct_io import StagedWriter

        h5py = _h5py()
        self.path = os.fspath(path)
        self.meta = dict(meta)
        budget = int(self.meta.pop("budget_entries", 0))
        self.meta.pop("expected_entries", None)
        self.meta["compression"] = "none"
        self.labels = labels
        self.ranks = comm.size
        self.token = start_output(self.path, comm)
        self.parts = _PartNames(self.path, self.token, comm.rank, separate_data=True)
        self.idx_dtype = np.dtype(meta["index_dtype"])
        self.val_dtype = np.dtype(meta["value_dtype"])
        parts = (self.parts.index_part, self.parts.data_part)
        self.tmps = [owned_name(part, "tmp") for part in parts]
        track(*self.tmps, self.parts.index_part, self.parts.data_part)
        try:
            with _disk_errors(self.path):  # a disk already full: one line, nothing left
                for tmp in self.tmps:
                    with _create_part(h5py, tmp, self.parts.dir):
                        pass  # superblock only; the array goes at ALIGN_BASE
        except BaseException:
            for tmp in self.tmps:
                _remove(tmp)
            _remove_empty_dir(self.parts.dir)
            raise
        self.counts = []
        self.writer = StagedWriter(
            self.tmps, (self.idx_dtype, self.val_dtype), ALIGN_BASE, min_entries=max_batch,
            stage_entries=budget or None,
        )  # fmt: skip
        self.nnz = 0

    @property
    def write_seconds(self) -> float:
        return self.writer.write_seconds

    @property
    def wait_seconds(self) -> float:
        return self.writer.wait_seconds

    def append_blocks(self, counts, idx, val, blk_cap, blk_cnt) -> None:
        self.counts.append(np.asarray(counts, dtype=np.int64).copy())
        self._deferred(self.writer.append_blocks, idx, val, blk_cap, blk_cnt)

    def write(self, row_start, counts, indices, data) -> None:
        self.counts.append(np.asarray(counts, dtype=np.int64).copy())
        self._deferred(self.writer.append, indices, data)

    def abort(self) -> None:
        try:
            self.writer.abort()
        finally:
            for tmp in self.tmps:
                _remove(tmp)
            _remove_empty_dir(self.parts.dir)

    def _close_part_files(self) -> None:
        h5py = _h5py()
        self.nnz = self.writer.close()
        for tmp, dt in zip(self.tmps, (self.idx_dtype, self.val_dtype)):
            # an empty share writes nothing at ALIGN_BASE: its file is the superblock alone
            need = ALIGN_BASE + self.nnz * dt.itemsize if self.nnz else 0
            if os.path.getsize(tmp) < need:
                raise InputError(f"{tmp}: short write ({os.path.getsize(tmp)} of {need} bytes)")
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        indptr = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        if int(indptr[-1]) != self.nnz:
            raise InputError(f"{self.tmps[0]}: {self.nnz} entries written, rows hold {indptr[-1]}")
        for tmp, name, dt in zip(self.tmps, ("indices", "data"), (self.idx_dtype, self.val_dtype)):
            small = self.nnz * dt.itemsize < _ALIGN_THRESHOLD
            raw = _pread_array(tmp, self.nnz, dt) if small else None
            with h5py.File(
                tmp, "r+", alignment_threshold=_ALIGN_THRESHOLD, alignment_interval=ALIGN_BASE
            ) as f:
                # a small array is rewritten through HDF5 (it is not aligned, so not in place)
                ds = f.create_dataset(name, data=raw) if small else _adopt(f, name, self.nnz, dt)
                if not small and ds.id.get_offset() != ALIGN_BASE:
                    raise InputError(
                        f"{tmp}: HDF5 placed /{name} at {ds.id.get_offset()}, not {ALIGN_BASE}"
                    )
                if name == "indices":
                    f.create_dataset("indptr", data=indptr)
                f.attrs.update(_part_attrs(self.meta, self.nnz))
        for tmp in self.tmps:
            _fsync(tmp)
        os.replace(self.tmps[0], self.parts.index_part)
        os.replace(self.tmps[1], self.parts.data_part)


def _pread_array(path, n, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if n == 0:
        return np.zeros(0, dtype)
    with open(path, "rb") as fh:
        fh.seek(ALIGN_BASE)
        raw = fh.read(n * dtype.itemsize)
    if len(raw) != n * dtype.itemsize:
        raise InputError(f"{path}: short write ({len(raw)} of {n * dtype.itemsize} bytes)")
    return np.frombuffer(raw, dtype=dtype)


def _adopt(f, name, n, dtype):
    """Declare the contiguous dataset whose bytes were already written at ALIGN_BASE."""
    h5py = _h5py()
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return f.create_dataset(name, shape=(n,), dtype=dtype, dcpl=dcpl)


def _part_attrs(meta, nnz) -> dict:
    return {
        "format": PART_FORMAT,
        "version": VERSION,
        "row_start": meta["row_start"],
        "row_stop": meta["row_stop"],
        "nnz": nnz,
    }


def _verify_h5(path, sizes: dict) -> None:
    """Re-open a just-written file and check its dataset sizes (catches swallowed errors)."""
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            for name, n in sizes.items():
                if f[name].shape[0] != n:
                    raise InputError(f"{path}: /{name} holds {f[name].shape[0]} of {n} entries")
    except OSError as exc:
        raise InputError(f"{path}: written file does not read back: {exc}") from None


def clean_leftovers(path) -> list:
    """Remove what crashed writers of ``path`` left (temporary files and unreferenced parts of
    dead processes on this host); parts the current index names are kept. Returns the names."""
    from ...leftovers import remove_stale_tagged

    path = os.path.abspath(os.fspath(path))
    d, b = os.path.split(path)
    removed = remove_stale_tagged(d, f".{b}.")
    parts = path + ".parts"
    if os.path.isdir(parts):
        keep = set(_old_parts(path, os.path.basename(parts)))
        removed += remove_stale_tagged(parts, "", keep=keep)
    return removed


def _remove(path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class _PartNames:
    """Per-run part names in ``OUT.parts/``: ``<token>-r<rank>.h5`` (+ ``.data.h5``)."""

    def __init__(self, path: str, token: str, rank: int, separate_data: bool, create=True):
        self.dir = os.path.abspath(path) + ".parts"
        self.rel = os.path.basename(self.dir)
        from ...leftovers import owner_tag

        # the owner tag lets a later run prove a part unreferenced by any index is a leftover
        self.stem = f"{token}-r{rank:05d}{owner_tag()}"
        self.index_part = os.path.join(self.dir, self.stem + ".h5")
        self.data_part = os.path.join(self.dir, self.stem + ".data.h5") if separate_data else None
        if create and not os.path.isdir(self.dir):
            os.makedirs(self.dir, exist_ok=True)


def _create_part(h5py, tmp: str, parts_dir, **kwargs):
    """``h5py.File(tmp, "w")`` for a part in ``parts_dir`` (None: not a part).

    Another rank that failed first (a full disk) removes the parts directory while it is
    still empty; the creation then fails with ENOENT, which would hide the real cause. The
    directory is made again and the creation retried once, so this rank meets the same
    error itself (ENOSPC: one clear line) or goes on.
    """
    try:
        return h5py.File(tmp, "w", **kwargs)
    except FileNotFoundError:
        if parts_dir is None:
            raise
        os.makedirs(parts_dir, exist_ok=True)
        return h5py.File(tmp, "w", **kwargs)


def _nothing(*_):
    return None


def _finish_index(comm, path, meta, parts: _PartNames, nnz, labels) -> None:
    from ...parallel import agree

    row = (
        os.path.basename(parts.index_part),
        os.path.basename(parts.data_part) if parts.data_part else "",
        int(meta["row_start"]),
        int(meta["row_stop"]),
        int(nnz),
    )
    table = parallel.gather(comm, row)
    if comm.rank == 0:
        agree(comm, _write_index, path, meta, parts, table, labels)
    else:
        agree(comm, _nothing)


def _old_parts(path: str, rel: str) -> list:
    """Part files named by the index now at ``path`` (those the new index replaces)."""
    if not os.path.isfile(path):
        return []
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            if "parts" not in f:
                return []
            names = []
            for key in ("files", "data_files"):
                if key in f["parts"]:
                    names += [_s(x) for x in f["parts"][key][()]]
    except (OSError, KeyError, ValueError):
        return []
    return [n.split("/", 1)[1] for n in names if n.startswith(rel + "/") and n.count("/") == 1]


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _write_index(path, meta, parts: _PartNames, table, labels) -> None:
    """Rank 0: the index file over every rank's part, then the previous index's parts go."""
    h5py = _h5py()
    n = int(meta["rows"])
    names = [t[0] for t in table]
    dnames = [t[1] or t[0] for t in table]
    row_off = np.array([t[2] for t in table] + [table[-1][3]], dtype=np.int64)
    nnz = np.array([t[4] for t in table], dtype=np.int64)
    nnz_off = np.concatenate(([0], np.cumsum(nnz)))
    total = int(nnz_off[-1])
    rel = parts.rel
    old = _old_parts(path, rel)
    idx_dtype, val_dtype = np.dtype(meta["index_dtype"]), np.dtype(meta["value_dtype"])
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        skip = ("row_start", "row_stop")
        f.attrs.update(_attrs({k: v for k, v in meta.items() if k not in skip}))
        f.attrs["nnz"] = total
        f.attrs["parts"] = len(table)
        g = f.create_group("parts")
        g.create_dataset("files", data=np.array([f"{rel}/{x}" for x in names], dtype="S"))
        g.create_dataset("data_files", data=np.array([f"{rel}/{x}" for x in dnames], dtype="S"))
        g.create_dataset("rows", data=row_off)
        g.create_dataset("nnz", data=nnz_off)
        _write_labels(f, labels)
        indptr = np.zeros(n + 1, np.int64)
        for p, name in enumerate(names):
            a, b = int(row_off[p]), int(row_off[p + 1])
            if b > a:
                with h5py.File(os.path.join(parts.dir, name), "r") as part:
                    indptr[a + 1 : b + 1] = part["indptr"][1 : b - a + 1] + nnz_off[p]
            indptr[b:] = nnz_off[p + 1]
        f.create_dataset("indptr", data=indptr)
        for ds, dtype, files in (("indices", idx_dtype, names), ("data", val_dtype, dnames)):
            if total == 0:
                f.create_dataset(ds, shape=(0,), dtype=dtype)
                continue
            layout = h5py.VirtualLayout(shape=(total,), dtype=dtype)
            for p, name in enumerate(files):
                if nnz[p]:
                    src = h5py.VirtualSource(f"{rel}/{name}", ds, shape=(int(nnz[p]),))
                    layout[int(nnz_off[p]) : int(nnz_off[p + 1])] = src
            f.create_virtual_dataset(ds, layout, fillvalue=0)
    # only the parts the replaced index named: a concurrent run's parts are never touched,
    # and a run that replaced this index owns the output completely
    mine = set(names) | set(dnames)
    for entry in old:
        if entry not in mine:
            _remove(os.path.join(parts.dir, entry))


def make_h5_sink(path, comm, meta, labels=None, compress=None, max_batch=0):
    """The HDF5 sink: direct-written parts for uncompressed multi-rank output, else chunked."""
    if comm.size > 1 and compress in (None, "none"):
        return H5DirectSink(path, comm, meta, labels, max_batch)
    return H5Sink(path, comm, meta, labels, compress)


# --- readers ---------------------------------------------------------------------------------


def _part_path(path: str, entry: str) -> str:
    """The part file ``entry`` of index ``path``: a plain name in ``OUT.parts``, a regular file."""
    rel = os.path.basename(os.path.abspath(path)) + ".parts"
    pre, _, name = entry.partition("/")
    if pre != rel or not name or "/" in name or name in (".", "..") or "\\" in name:
        raise InputError(f"{path}: part entry {entry!r} is not a file inside {rel}/")
    full = os.path.join(os.path.dirname(os.path.abspath(path)), rel, name)
    from .._validate import stat_or_error

    where = f"{path}: part file {full}"
    st = stat_or_error(full, f"{where} is missing", f"{where}: ", follow=False)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: part file {full} is not a regular file")
    return full


def _open_projection(path):
    try:  # registers the compression filters, when installed
        import hdf5plugin  # noqa: F401
    except ImportError:
        pass
    path = os.fspath(path)
    f = open_layout(path, PROJECTION_FORMAT)
    if "parts" in f:
        try:
            _check_parts(path, f)
        except BaseException:
            f.close()
            raise
    return f


def _check_parts(path, f) -> None:
    h5py = _h5py()
    g = f["parts"]
    nnz = np.diff(g["nnz"][()])
    for key, ds in (("files", "indices"), ("data_files", "data")):
        if key not in g:
            continue
        for entry, k in zip(g[key][()], nnz):
            full = _part_path(path, _s(entry))
            try:
                with h5py.File(full, "r") as part:
                    held = part[ds].shape[0] if ds in part else -1
            except OSError as exc:
                raise InputError(f"{full}: not a readable HDF5 part: {exc}") from None
            if int(held) != int(k):
                raise InputError(f"{full}: holds {held} entries in /{ds}, index says {k}")


def projection_meta(path) -> dict:
    """Attributes of an HDF5 projection output (rows, cols, nnz, weight, onto, ...)."""
    with _open_projection(path) as f:
        return {k: plain_attr(v) for k, v in f.attrs.items()}


def projection_labels(path):
    """``(row_labels, col_labels)`` of an HDF5 projection, or ``None`` when it has none."""
    with _open_projection(path) as f:
        return _labels(f)


def _labels(f):
    if "labels" not in f:
        return None
    out = []
    for name in ("rows", "cols"):
        ds = f["labels"][name]
        if ds.dtype.kind == "O" or ds.dtype.kind == "S":
            out.append(np.array([_s(x) for x in ds[()]], dtype=object).astype(str))
        else:
            out.append(ds[()])
    return tuple(out)


def _csr(indptr, indices, data, shape):
    nnz = int(indptr[-1]) - int(indptr[0])
    idx = np.int32 if max(nnz, shape[1]) < 2**31 else np.int64
    ptr = (np.asarray(indptr, dtype=np.int64) - int(indptr[0])).astype(idx)
    data = np.asarray(data)
    if data.dtype.kind == "u" and data.dtype.itemsize < 4:
        # counts stored narrow (see projection.core.stored_count_dtype) come back as the
        # kernel's int32, so arithmetic on the matrix does not wrap at 65,536
        data = data.astype(np.int32)
    return sp.csr_matrix((data, np.asarray(indices).astype(idx, copy=False), ptr), shape=shape)


def is_symmetric(meta: dict) -> bool:
    """Whether a projection's attributes say it stores only ``v >= u`` (``storage``)."""
    return _s(meta.get("storage", "general")) == "symmetric"


def _symmetric_indptr(path, f, n: int, nc: int) -> np.ndarray:
    """The row pointers of a symmetric file, checked against its shape before anything sized
    by the attributes is allocated."""
    ds = f["indptr"]
    if n != nc or ds.shape != (n + 1,):
        raise InputError(
            f"{path}: symmetric storage of a {n} x {nc} matrix with {ds.shape} row pointers"
        )
    ptr = np.asarray(ds[()], dtype=np.int64)
    if ptr[0] != 0 or (np.diff(ptr) < 0).any() or ptr[-1] != f["indices"].shape[0]:
        raise InputError(f"{path}: row pointers do not match the {f['indices'].shape[0]} entries")
    return ptr


def iter_projection(path, max_entries: int = 1 << 24, mirror: bool = True, tmpdir=None):
    """Stream an HDF5 projection as ``(row_start, csr_block)`` pairs of about ``max_entries``.

    Blocks hold whole rows (a row larger than ``max_entries`` comes alone), so the memory used
    is bounded by the block size, whatever the size of the file. The labels, when the file has
    them, come from :func:`projection_labels`.

    Parameters
    ----------
    path : path-like
    max_entries : int
        Entries per block (whole rows).
    mirror : bool
        For a file with ``storage="symmetric"`` (only ``v >= u`` stored): yield the full rows
        (default), which takes one counting pass and writes the stored entries once to spill
        files under ``tmpdir`` (default: the output's directory), removed at the end; or, when
        False, the stored rows as they are.
    tmpdir : path-like, optional
    """
    from ...partition import chunk_rows
    from .symmetric import iter_mirrored

    with _open_projection(path) as f:
        n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
        if mirror and is_symmetric(f.attrs):
            where = os.path.dirname(os.path.abspath(os.fspath(path))) if tmpdir is None else tmpdir
            ptr = _symmetric_indptr(path, f, n, nc)
            blocks = iter_mirrored(ptr, f["indices"], f["data"], n, max_entries, where)
            for a, ptr, idx, val in blocks:
                yield a, _csr(ptr, idx, val, (ptr.size - 1, nc))
            return
        indptr = f["indptr"]
        step = 1 << 22
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            ptr = indptr[lo : hi + 1]
            offsets = chunk_rows(np.diff(ptr), max_entries)
            for a, b in zip(offsets[:-1], offsets[1:]):
                p = ptr[a : b + 1]
                ind = f["indices"][int(p[0]) : int(p[-1])]
                dat = f["data"][int(p[0]) : int(p[-1])]
                yield lo + int(a), _csr(p, ind, dat, (int(b - a), nc))


def read_projection_h5(path, with_labels=False, mirror=True):
    """The whole HDF5 projection as scipy CSR (and its labels or None with ``with_labels``).

    A file with ``storage="symmetric"`` is mirrored to the full matrix unless ``mirror`` is
    False (then the stored upper triangle comes as it is).
    """
    from .symmetric import mirror_csr

    with _open_projection(path) as f:
        n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
        if mirror and is_symmetric(f.attrs):
            ptr = _symmetric_indptr(path, f, n, nc)
            ptr, idx, val = mirror_csr(ptr, f["indices"][()], f["data"][()], (n, nc))
        else:
            ptr, idx, val = f["indptr"][()], f["indices"][()], f["data"][()]
        mat = _csr(ptr, idx, val, (n, nc))
        return (mat, _labels(f)) if with_labels else mat
