"""The project's HDF5 layout for networks and inputs (documented in ``docs/formats.md``).

Networks are written in layout version 2 (:mod:`.network_v2`: compact, column-wise,
memory-mappable); version 1 files, described here, are still read.

network.h5 v1 (attrs ``format="mpisdnn.network"``, ``version``, ``neurons``, ``layers``, ``ymax``,
``source``)::

    /layers/indptr   int64 (L, N+1)  per-layer CSR row pointers, layer-local
    /layers/offsets  int64 (L+1,)    start of each layer in indices/data
    /layers/indices  int32 (nnz,)    chunked, gzip
    /layers/data     float32 (nnz,)  chunked, gzip
    /bias            float32 (L, N)

inputs.h5 (attrs ``format="mpisdnn.inputs"``, ``version``, ``rows``, ``neurons``, ``source``)::

    /features/indptr int64 (rows+1,)
    /features/indices int32, /features/data float32   chunked, gzip
    /truth           int64 (C,)      optional, 1-based like the official files

A rank reading layers ``[a, b)`` reads ``offsets[a:b+1]`` and one contiguous slice of
indices/data; a rank reading rows ``[r0, r1)`` of the inputs reads ``indptr[r0:r1+1]`` and one
slice. Nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError, shown
from ._atomic import atomic_h5, h5_attrs
from ._validate import h5_object, hdf5_damage, plain_attr, read_ymax

__all__ = [
    "write_network",
    "read_network",
    "read_network_meta",
    "write_inputs",
    "read_inputs",
    "read_inputs_meta",
    "is_hdf5",
    "NETWORK_FORMAT",
    "INPUTS_FORMAT",
]

NETWORK_FORMAT = "mpisdnn.network"
INPUTS_FORMAT = "mpisdnn.inputs"
VERSION = 1
#: Layout version written for networks by default.
NETWORK_VERSION = 2
_CHUNK = 1 << 18
_COMPRESSION = {"compression": "gzip", "compression_opts": 1, "shuffle": True}


def is_hdf5(path) -> bool:
    """True when ``path`` is a file starting with the HDF5 signature."""
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def _h5py():
    import h5py

    return h5py


def chunked_dataset(group, name, data, chunked=True):
    """Dataset ``name`` holding ``data``: chunked and gzip-compressed unless empty or not
    ``chunked``."""
    data = np.ascontiguousarray(data)
    if chunked and data.size:
        return group.create_dataset(
            name, data=data, chunks=(min(_CHUNK, data.size),), **_COMPRESSION
        )
    return group.create_dataset(name, data=data)


def write_network(path, network, version: int = NETWORK_VERSION) -> None:
    """Write a :class:`~mpisdnn.sdnn.Network` to one HDF5 file (temp name + rename).

    ``version=2`` (default) writes the compact memory-mappable layout, ``version=1`` the
    original chunked CSR layout.
    """
    if version == 2:
        from ..weights import CompactLayer
        from .network_v2 import NetworkWriter

        with NetworkWriter(
            path, network.neurons, network.ymax, str(network.source), network.attrs
        ) as out:
            for w, b in zip(network.layers, network.bias):
                out.add(CompactLayer.from_matrix(w, b))
        return
    if version != 1:
        raise ValueError(f"unknown network layout version {version}")
    n = network.neurons
    nl = len(network.layers)
    indptr = np.empty((nl, n + 1), dtype=np.int64)
    offsets = np.zeros(nl + 1, dtype=np.int64)
    for k, w in enumerate(network.layers):
        indptr[k] = w.indptr
        offsets[k + 1] = offsets[k] + w.nnz
    raw = 12 * int(offsets[-1]) + 12 * nl * (n + 1)
    with atomic_h5(path, _verify_hdf5, int(raw * 1.05) + (1 << 16)) as f:
        sizes = {"neurons": n, "layers": nl, "ymax": float(network.ymax)}
        stamp(f, NETWORK_FORMAT, network.source, {**sizes, **network.attrs})
        g = f.create_group("layers")
        g.create_dataset("indptr", data=indptr, chunks=(1, n + 1), **_COMPRESSION)
        g.create_dataset("offsets", data=offsets)
        total = int(offsets[-1])
        ind = g.create_dataset(
            "indices",
            shape=(total,),
            dtype=np.int32,
            chunks=(max(1, min(_CHUNK, total)),),
            **_COMPRESSION,
        )
        dat = g.create_dataset(
            "data",
            shape=(total,),
            dtype=np.float32,
            chunks=(max(1, min(_CHUNK, total)),),
            **_COMPRESSION,
        )
        for k, w in enumerate(network.layers):
            if w.nnz:
                ind[offsets[k] : offsets[k + 1]] = w.indices.astype(np.int32, copy=False)
                dat[offsets[k] : offsets[k + 1]] = w.data.astype(np.float32, copy=False)
        f.create_dataset(
            "bias", data=network.bias.astype(np.float32), chunks=(1, n), **_COMPRESSION
        )


def _verify_hdf5(tmp) -> None:
    """The written file reopens and every dataset can be read back (a full disk can make
    HDF5 drop writes without an error)."""
    h5py = _h5py()

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.size:
            obj[(slice(-1, None),) * obj.ndim] if obj.ndim else obj[()]

    with h5py.File(tmp, "r") as f:
        f.visititems(visit)


def stamp(f, fmt: str, source, attrs: dict, version: int = VERSION) -> None:
    """Mark the root of a new file as layout ``fmt`` (attributes ``format``, ``version``,
    ``source``), then set the layout's own ``attrs`` (sizes, options)."""
    f.attrs.update(h5_attrs({"format": fmt, "version": version, "source": str(source)}))
    f.attrs.update(h5_attrs(attrs))


@contextlib.contextmanager
def reading(path, fmt):
    """``with reading(path, fmt) as f``: :func:`open_layout`, closed at the end, and a
    damaged file's HDF5 errors inside as one line (:func:`._validate.hdf5_damage`)."""
    with hdf5_damage(path), open_layout(path, fmt) as f:
        yield f


def open_layout(path, fmt):
    """``path`` open for reading, checked to be a readable HDF5 file of layout ``fmt``.

    Raises
    ------
    InputError
        One line naming ``path``: missing, a directory, not HDF5, or another layout.
    """
    h5py = _h5py()
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an HDF5 file")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(
            f"{path}: not a readable HDF5 file (truncated or corrupt?): {exc}"
        ) from None
    try:
        found = f.attrs.get("format")
    except (OSError, RuntimeError, TypeError, ValueError) as exc:  # "Unknown string encoding"
        f.close()
        raise InputError(f"{path}: its format attribute cannot be read (damaged?): {exc}") from None
    if isinstance(found, bytes):
        found = found.decode("utf-8", "replace")
    if found != fmt:
        f.close()
        what = "no format attribute" if found is None else f"format attribute {shown(found)}"
        raise InputError(f"{path}: not an {fmt} file ({what})")
    return f


def _read(path, f, name, sel=(), kind=None, ndim=None):
    """Read dataset ``name`` (or a selection), checking its dtype kind and rank first."""
    try:
        dset = h5_object(path, f, name)
    except KeyError:
        raise InputError(f"{path}: dataset /{name} is missing") from None
    if kind is not None and dset.dtype.kind not in kind:
        raise InputError(
            f"{path}: dataset /{name} must hold {_KIND_NAMES[kind]}, found {dset.dtype}"
        )
    if ndim is not None and dset.ndim != ndim:
        raise InputError(f"{path}: dataset /{name} must be {ndim}-D, found shape {dset.shape}")
    try:
        return dset[sel] if sel != () else dset[()]
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: dataset /{name} cannot be read (corrupt?): {exc}") from None


_KIND_NAMES = {"iu": "integers", "f": "floats"}


def _version(path, f) -> int:
    v = f.attrs.get("version", VERSION)
    arr = np.asarray(v)
    if arr.shape != () or arr.dtype.kind not in "iu" or int(arr) not in (1, 2):
        raise InputError(
            f"{path}: unsupported layout version {shown(v)} (this mpisdnn reads 1 and 2)"
        )
    return int(v)


def _attr_int(path, f, key, minimum=1) -> int:
    v = f.attrs.get(key)
    arr = np.asarray(v) if v is not None else None
    if arr is None or arr.shape != () or arr.dtype.kind not in "iu" or int(arr) < minimum:
        raise InputError(
            f"{path}: attribute {key} must be an integer >= {minimum}, found {shown(v)}"
        )
    return int(arr)


def network_version(path) -> int:
    """Layout version (1 or 2) of a network file."""
    with reading(os.fspath(path), NETWORK_FORMAT) as f:
        return _version(path, f)


def read_network_meta(path) -> dict:
    """Attributes of a network file: ``neurons``, ``layers``, ``ymax``, ``source``,
    ``version`` and ``layer_nnz`` (weights per layer)."""
    from .network_v2 import read_v2_meta

    path = os.fspath(path)
    with reading(path, NETWORK_FORMAT) as f:
        meta = {k: plain_attr(v) for k, v in f.attrs.items()}
        meta["version"] = _version(path, f)
        if meta["version"] == 2:
            meta["layer_nnz"] = read_v2_meta(path, f)["nnz"].tolist()
        else:
            offsets = _read(path, f, "layers/offsets", kind="iu", ndim=1)
            meta["layer_nnz"] = np.diff(offsets).tolist()
    return meta


def read_network(path, layers=None, layer_start=0, layer_stop=None):
    """Read a network file (layout v1 or v2), or a contiguous slice of its layers.

    Parameters
    ----------
    path : path-like
    layers : int, optional
        Use only the first ``layers`` layers of the file (L=120 from a deeper file).
    layer_start, layer_stop : int, optional
        Slice ``[layer_start, layer_stop)`` of those layers to read (a rank's layer slice).

    Returns
    -------
    Network
        float32 scipy CSR layers with int32 sorted indices, whatever the file's layout.
    """
    path = os.fspath(path)
    with reading(path, NETWORK_FORMAT) as f:
        version = _version(path, f)
        nl_file = _attr_int(path, f, "layers")
        total = nl_file if layers is None else int(layers)
        if not 0 < total <= nl_file:
            raise ShapeError(f"{path}: asked for {total} layers, the file has {nl_file}")
        stop = total if layer_stop is None else int(layer_stop)
        if not 0 <= layer_start <= stop <= total:
            raise ShapeError(f"{path}: bad layer slice [{layer_start}, {stop}) of {total}")
        if version == 1:
            return _read_network_v1(path, f, total, layer_start, stop)
    return _read_network_v2(path, total, layer_start, stop)


def _read_network_v2(path, total, layer_start, stop):
    from ..network import Network
    from .network_v2 import map_layers

    info, compact = map_layers(path, layer_start, stop)
    n = info["neurons"]
    mats = [layer.to_csr() for layer in compact]
    for m in mats:
        m.indices = m.indices.astype(np.int32, copy=False)
        m.indptr = m.indptr.astype(np.int32 if m.nnz < 2**31 else np.int64, copy=False)
    bias = np.array([layer.bias for layer in compact], dtype=np.float32).reshape(len(mats), n)
    del compact
    info.pop("map")
    return Network(
        mats,
        bias,
        n,
        total_layers=total,
        layer_start=layer_start,
        ymax=info["ymax"],
        source=info["source"],
        attrs=info["attrs"],
    )


def _read_network_v1(path, f, total, layer_start, stop):
    from ..network import Network

    n = _attr_int(path, f, "neurons")
    nl_file = _attr_int(path, f, "layers")
    ymax = read_ymax(path, f)
    offsets = _read(path, f, "layers/offsets", kind="iu", ndim=1)
    if offsets.shape != (nl_file + 1,):
        raise ShapeError(f"{path}: /layers/offsets has shape {offsets.shape}")
    if offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise InputError(f"{path}: dataset /layers/offsets must rise from 0")
    indptr = _read(path, f, "layers/indptr", np.s_[layer_start:stop], kind="iu", ndim=2)
    if indptr.shape != (stop - layer_start, n + 1):
        raise ShapeError(
            f"{path}: /layers/indptr has shape {indptr.shape}, expected "
            f"({stop - layer_start}, {n + 1})"
        )
    lo, hi = int(offsets[layer_start]), int(offsets[stop])
    indices = _read(path, f, "layers/indices", np.s_[lo:hi], kind="iu", ndim=1)
    data = _read(path, f, "layers/data", np.s_[lo:hi], kind="f", ndim=1)
    if indices.size != hi - lo or data.size != hi - lo:
        raise ShapeError(f"{path}: /layers/indices or /layers/data shorter than offsets say")
    bias = _read(path, f, "bias", np.s_[layer_start:stop], kind="f", ndim=2)
    if bias.shape != (stop - layer_start, n):
        raise ShapeError(f"{path}: /bias has shape {bias.shape}")
    if not np.isfinite(bias).all():
        raise InputError(f"{path}: dataset /bias has NaN or infinite values")
    source = plain_attr(f.attrs.get("source", path))
    extra = {
        k: plain_attr(v)
        for k, v in f.attrs.items()
        if k not in {"format", "version", "neurons", "layers", "ymax", "source"}
    }
    mats = []
    for k in range(stop - layer_start):
        a, b = int(offsets[layer_start + k]) - lo, int(offsets[layer_start + k + 1]) - lo
        ptr = indptr[k]
        if ptr[0] != 0 or ptr[-1] != b - a or (np.diff(ptr) < 0).any():
            raise ShapeError(
                f"{path}: dataset /layers/indptr: layer {layer_start + k + 1} is inconsistent"
            )
        ind = indices[a:b]
        if ind.size and (ind.min() < 0 or ind.max() >= n):
            raise ShapeError(
                f"{path}: dataset /layers/indices: layer {layer_start + k + 1} has a column "
                f"index out of range"
            )
        dat = data[a:b].astype(np.float32, copy=False)
        if not np.isfinite(dat).all():
            raise InputError(
                f"{path}: dataset /layers/data: layer {layer_start + k + 1} has NaN or "
                f"infinite weights"
            )
        mats.append(sp.csr_matrix((dat, ind.astype(np.int32), ptr), shape=(n, n)))
    return Network(
        mats,
        bias,
        n,
        total_layers=total,
        layer_start=layer_start,
        ymax=ymax,
        source=source,
        attrs=extra,
    )


def write_inputs(path, features, truth=None, source="") -> None:
    """Write input features (CSR, rows x N) and optional 1-based truth (temp name + rename)."""
    y = sp.csr_matrix(features, dtype=np.float32)
    y.sort_indices()
    raw = 8 * (y.shape[0] + 1) + 8 * y.nnz + 8 * (0 if truth is None else np.size(truth))
    with atomic_h5(path, _verify_hdf5, int(raw * 1.05) + (1 << 16)) as f:
        stamp(f, INPUTS_FORMAT, source, {"rows": y.shape[0], "neurons": y.shape[1]})
        g = f.create_group("features")
        g.create_dataset("indptr", data=y.indptr.astype(np.int64))
        chunked_dataset(g, "indices", y.indices.astype(np.int32))
        chunked_dataset(g, "data", y.data.astype(np.float32))
        if truth is not None:
            f.create_dataset("truth", data=np.asarray(truth, dtype=np.int64))
        f.flush()


def _check_indptr(path, indptr, rows, nnz=None) -> None:
    if indptr.shape != (rows + 1,):
        raise ShapeError(f"{path}: dataset /features/indptr has shape {indptr.shape}, rows={rows}")
    if indptr[0] != 0:
        raise InputError(f"{path}: dataset /features/indptr must start at 0, found {indptr[0]}")
    if (np.diff(indptr) < 0).any():
        raise InputError(f"{path}: dataset /features/indptr is not non-decreasing")
    if nnz is not None and indptr[-1] != nnz:
        raise InputError(
            f"{path}: dataset /features/indptr ends at {indptr[-1]} but /features/indices "
            f"holds {nnz} entries"
        )


def read_inputs_meta(path) -> dict:
    """``rows``, ``neurons``, the full ``indptr`` (for partitioning) and ``has_truth``.

    Validates the layout: integer ``indptr`` from 0, non-decreasing, ending at the number of
    stored entries; integer indices, float data, 1-D integer truth.
    """
    path = os.fspath(path)
    with reading(path, INPUTS_FORMAT) as f:
        rows = _attr_int(path, f, "rows", minimum=0)
        neurons = _attr_int(path, f, "neurons")
        indptr = _read(path, f, "features/indptr", kind="iu", ndim=1)
        for name, kind in (("features/indices", "iu"), ("features/data", "f")):
            if name not in f:
                raise InputError(f"{path}: dataset /{name} is missing")
            dset = h5_object(path, f, name)
            if dset.dtype.kind not in kind or dset.ndim != 1:
                raise InputError(
                    f"{path}: dataset /{name} must be 1-D {_KIND_NAMES[kind]}, found "
                    f"{dset.dtype} {dset.shape}"
                )
        nnz = f["features/indices"].shape[0]
        if f["features/data"].shape[0] != nnz:
            raise InputError(f"{path}: dataset /features/data length differs from indices")
        _check_indptr(path, indptr, rows, nnz)
        if "truth" in f:
            _check_truth(path, f, rows)
        return {
            "rows": rows,
            "neurons": neurons,
            "indptr": indptr.astype(np.int64),
            "has_truth": "truth" in f,
            "source": plain_attr(f.attrs.get("source", "")),
        }


def _check_truth(path, f, rows):
    dset = h5_object(path, f, "truth")
    if dset.ndim != 1:
        raise InputError(f"{path}: dataset /truth must be 1-D, found shape {dset.shape}")
    truth = _read(path, f, "truth")
    if dset.dtype.kind == "f":
        if not np.isfinite(truth).all() or (truth != np.floor(truth)).any():
            raise InputError(f"{path}: dataset /truth must hold integers, found {truth.dtype}")
    elif dset.dtype.kind not in "iu":
        raise InputError(f"{path}: dataset /truth must hold integers, found {dset.dtype}")
    if truth.size and (truth.min() < 1 or truth.max() > rows):
        raise InputError(f"{path}: dataset /truth has row numbers outside 1..{rows}")
    return truth.astype(np.int64)


def read_inputs(path, row_start=0, row_stop=None, with_truth=True):
    """Read rows ``[row_start, row_stop)`` of an inputs file.

    Returns
    -------
    features : scipy.sparse.csr_matrix
        float32, ``(row_stop - row_start) x N``.
    truth : ndarray of int64 or None
        The whole truth vector (1-based), when stored and asked for.
    """
    path = os.fspath(path)
    with reading(path, INPUTS_FORMAT) as f:
        rows = _attr_int(path, f, "rows", minimum=0)
        n = _attr_int(path, f, "neurons")
        stop = rows if row_stop is None else int(row_stop)
        if not 0 <= row_start <= stop <= rows:
            raise ShapeError(f"{path}: bad row range [{row_start}, {stop}) of {rows}")
        ptr = _read(
            path, f, "features/indptr", np.s_[row_start : stop + 1], kind="iu", ndim=1
        ).astype(np.int64)
        if ptr.size != stop - row_start + 1:
            raise ShapeError(f"{path}: /features/indptr is shorter than rows={rows}")
        if row_start == 0 and ptr[0] != 0:
            raise InputError(f"{path}: dataset /features/indptr must start at 0, found {ptr[0]}")
        if (np.diff(ptr) < 0).any() or ptr[0] < 0:
            raise InputError(f"{path}: dataset /features/indptr is not non-decreasing")
        lo, hi = int(ptr[0]), int(ptr[-1])
        indices = _read(path, f, "features/indices", np.s_[lo:hi], kind="iu", ndim=1)
        data = _read(path, f, "features/data", np.s_[lo:hi], kind="f", ndim=1)
        if indices.size != hi - lo or data.size != hi - lo:
            raise ShapeError(f"{path}: /features data shorter than indptr says")
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            raise ShapeError(f"{path}: dataset /features/indices out of range for N={n}")
        data = data.astype(np.float32)
        if not np.isfinite(data).all():
            raise InputError(f"{path}: dataset /features/data has NaN or infinite values")
        truth = None
        if with_truth and "truth" in f:
            truth = _check_truth(path, f, rows)
    feats = sp.csr_matrix((data, indices.astype(np.int32), ptr - lo), shape=(stop - row_start, n))
    return feats, truth
