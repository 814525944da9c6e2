"""The HDF5 projection sinks: one chunked file, or this rank's part, chunked or direct-written.

:class:`H5Sink` streams rows through HDF5's filter pipeline in large chunks (one rank, or any
rank count when compressed); :class:`H5DirectSink` writes uncompressed parts through
:class:`~mpisdnn.formats.direct_io.StagedWriter` (a writer thread, page-aligned ``O_DIRECT``
writes overlapping the computation) at ``ALIGN_BASE``, where HDF5 then places the contiguous
dataset (checked). At several ranks a write error waits for the collective close
(:class:`_DeferredWrites`). Split from :mod:`mpisdnn.formats.projection.h5`, which re-exports
the public names.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np

from ..._signals import track, untrack
from ...errors import InputError, MpisdnnError
from .._atomic import _fsync, abandon_h5, no_space, owned_name
from ._h5_layout import (
    _ALIGN_THRESHOLD,
    _H5_CHUNK,
    ALIGN_BASE,
    _attrs,
    _h5py,
    _part_attrs,
    _write_labels,
    compression_filter,
)
from ._h5_parts import (
    _create_part,
    _finish_index,
    _PartNames,
    _remove,
    _remove_empty_dir,
    start_output,
)
from .sink import Sink


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


def make_h5_sink(path, comm, meta, labels=None, compress=None, max_batch=0):
    """The HDF5 sink: direct-written parts for uncompressed multi-rank output, else chunked."""
    if comm.size > 1 and compress in (None, "none"):
        return H5DirectSink(path, comm, meta, labels, max_batch)
    return H5Sink(path, comm, meta, labels, compress)
