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

This module is the front door: it reads the files (:func:`iter_projection`,
:func:`read_projection_h5`) and re-exports the rest; the layout's names live in
:mod:`._h5_layout`, the rank parts and their index in :mod:`._h5_parts`, the sinks in
:mod:`._h5_write`.
"""

from __future__ import annotations

import contextlib
import os
import stat

import numpy as np
import scipy.sparse as sp

from ...errors import InputError
from .._validate import hdf5_damage, plain_attr
from ..hdf5 import open_layout
from ._h5_layout import ALIGN_BASE as ALIGN_BASE
from ._h5_layout import COMPRESSIONS, PROJECTION_FORMAT, _h5py, _s
from ._h5_layout import PART_FORMAT as PART_FORMAT
from ._h5_layout import VERSION as VERSION
from ._h5_layout import compression_filter as compression_filter
from ._h5_parts import clean_leftovers as clean_leftovers
from ._h5_parts import start_output as start_output
from ._h5_write import H5DirectSink, H5Sink, make_h5_sink
from ._h5_write import _DeferredWrites as _DeferredWrites
from ._h5_write import _disk_errors as _disk_errors

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


@contextlib.contextmanager
def _reading(path):
    """``with _reading(path) as f``: :func:`_open_projection`, and a damaged file's HDF5
    errors inside (a failed metadata checksum: h5py's ``KeyError``) as one line."""
    with hdf5_damage(path), _open_projection(path) as f:
        yield f


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
    with _reading(path) as f:
        return {k: plain_attr(v) for k, v in f.attrs.items()}


def projection_labels(path):
    """``(row_labels, col_labels)`` of an HDF5 projection, or ``None`` when it has none."""
    with _reading(path) as f:
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


def _csr(indptr, indices, data, shape, where=None):
    """CSR of stored rows; ``where`` (the file) checks them first: a damaged file's row
    pointers or columns were scipy's ``ValueError`` (an internal error), or a wrong matrix."""
    if where is not None:
        _check_rows(where, indptr, indices, data, shape)
    nnz = int(indptr[-1]) - int(indptr[0])
    idx = np.int32 if max(nnz, shape[1]) < 2**31 else np.int64
    ptr = (np.asarray(indptr, dtype=np.int64) - int(indptr[0])).astype(idx)
    data = np.asarray(data)
    if data.dtype.kind == "u" and data.dtype.itemsize < 4:
        # counts stored narrow (see projection.core.stored_count_dtype) come back as the
        # kernel's int32, so arithmetic on the matrix does not wrap at 65,536
        data = data.astype(np.int32)
    return sp.csr_matrix((data, np.asarray(indices).astype(idx, copy=False), ptr), shape=shape)


def _check_rows(path, indptr, indices, data, shape) -> None:
    """Row pointers ascending over exactly the entries given, columns inside the shape."""
    ptr = np.asarray(indptr, dtype=np.int64)
    n = int(ptr[-1] - ptr[0]) if ptr.size else -1
    if ptr.size != shape[0] + 1 or (np.diff(ptr) < 0).any() or n != len(indices):
        raise InputError(f"{path}: row pointers do not match the stored entries (damaged?)")
    if len(data) != len(indices):
        raise InputError(f"{path}: /data and /indices differ in length (damaged?)")
    cols = np.asarray(indices)
    if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= shape[1]):
        raise InputError(f"{path}: column indices outside 0..{shape[1] - 1} (damaged?)")


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

    with _reading(path) as f:
        n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
        if mirror and is_symmetric(f.attrs):
            where = os.path.dirname(os.path.abspath(os.fspath(path))) if tmpdir is None else tmpdir
            ptr = _symmetric_indptr(path, f, n, nc)
            blocks = iter_mirrored(ptr, f["indices"], f["data"], n, max_entries, where, path)
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
                yield lo + int(a), _csr(p, ind, dat, (int(b - a), nc), where=path)


def read_projection_h5(path, with_labels=False, mirror=True):
    """The whole HDF5 projection as scipy CSR (and its labels or None with ``with_labels``).

    A file with ``storage="symmetric"`` is mirrored to the full matrix unless ``mirror`` is
    False (then the stored upper triangle comes as it is).
    """
    from .symmetric import mirror_csr

    with _reading(path) as f:
        n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
        if mirror and is_symmetric(f.attrs):
            ptr = _symmetric_indptr(path, f, n, nc)
            idx, val = f["indices"][()], f["data"][()]
            _check_rows(path, ptr, idx, val, (n, nc))  # before the mirror's kernel sees them
            mat = _csr(*mirror_csr(ptr, idx, val, (n, nc)), (n, nc))
        else:
            ptr, idx, val = f["indptr"][()], f["indices"][()], f["data"][()]
            mat = _csr(ptr, idx, val, (n, nc), where=path)
        return (mat, _labels(f)) if with_labels else mat
