"""Network HDF5 layout version 2: compact column-wise layers, memory-mapped straight from the file.

Layout (documented in ``docs/formats.md``)::

    attrs: format="mpisdnn.network", version=2, neurons=N, layers=L, ymax, source
    /layer_info/nnz      int64   (L,)  weights per layer
    /layer_info/per_col  int64   (L,)  weights per column when all columns hold the same count,
                                       else -1 (then the layer has a colptr)
    /layer_info/value    float32 (L,)  the weight when all weights of the layer are equal,
                                       else NaN (then the layer has values)
    /layer_info/bias     float32 (L,)  the bias when uniform over the layer, else NaN
    /layers/000001/rows    uint16|uint32|int64 (nnz,)  for every output neuron, its input
                                                       neurons, ascending (CSC of W)
    /layers/000001/colptr  int64 (N+1,)   only when per_col is -1
    /layers/000001/values  float32 (nnz,) only when value is NaN
    /layers/000001/bias    float32 (N,)   only when bias is NaN

Every dataset is contiguous and uncompressed and starts on a 64-byte boundary, so a reader maps
it with ``np.memmap`` at ``dset.id.get_offset()``; the ranks of a node then share one copy in
the page cache. One dataset set per layer lets a writer stream layers in order without
knowing the network's size in advance.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from ..errors import InputError, ShapeError, shown
from ..network import YMAX
from ..weights import CompactLayer, index_dtype, same_bits
from ._atomic import (
    H5_LIBVER,
    OutputError,
    abandon_h5,
    atomic_path,
    check_size,
    h5_attrs,
    no_space,
    output_error,
    reserve,
)
from ._validate import h5_object, hdf5_damage, plain_attr, read_ymax

__all__ = ["NetworkWriter", "map_layers", "read_v2_meta", "layer_group", "VERSION"]

VERSION = 2
NETWORK_FORMAT = "mpisdnn.network"
#: Alignment of every dataset in the file: mapped arrays are aligned for any dtype and SIMD
#: loads, without padding small layers to a page each.
ALIGN = 64
#: Upper bound of HDF5 metadata per layer (group + up to four dataset headers), for reserving.
_META_BYTES = 4096


def create_file(tmp):
    """A new, empty v2 file at ``tmp`` (both writers': :class:`NetworkWriter` and the
    parallel converter's root): datasets :data:`ALIGN`-aligned, no creation order, in the
    checksummed formats (:data:`._atomic.H5_LIBVER`)."""
    import h5py

    return h5py.File(tmp, "w", alignment_threshold=1, alignment_interval=ALIGN,
                     track_order=False, libver=H5_LIBVER)  # fmt: skip


def stamp_file(f, neurons: int, layers: int, ymax: float, source: str, extra=None) -> None:
    """The root attributes of a finished v2 file, then ``extra`` ones, text fixed-length
    (what :func:`.hdf5.stamp` writes, which this module cannot import: hdf5 reads v2)."""
    f.attrs.update(h5_attrs({"format": NETWORK_FORMAT, "version": VERSION, "source": source,
                             "neurons": neurons, "layers": layers, "ymax": ymax}))  # fmt: skip
    f.attrs.update(h5_attrs(extra or {}))


def layer_group(k: int) -> str:
    """HDF5 group of layer ``k`` (0-based): ``layers/000001`` for the first layer."""
    return f"layers/{k + 1:06d}"


class NetworkWriter:
    """Stream a network into a v2 file, one :class:`CompactLayer` at a time.

    Use as a context manager; layers are written as they come (nothing but four numbers per
    layer is kept), and the file appears under ``path`` only when the block ends without an
    error and the written file checks out (size and datasets), else ``path`` is untouched.
    """

    def __init__(self, path, neurons: int, ymax: float = YMAX, source: str = "", attrs=None):
        self.path = os.fspath(path)
        self.neurons = int(neurons)
        self.ymax = float(ymax)
        self.source = str(source)
        self.attrs = dict(attrs or {})
        self._info = {"nnz": [], "per_col": [], "value": [], "bias": []}
        self._ctx = None
        self._f = None
        self._min_size = 0
        self._reserved = 0

    def __enter__(self):
        self._ctx = atomic_path(self.path, verify=self._verify)
        tmp = self._tmp = self._ctx.__enter__()
        try:
            self._f = create_file(tmp)
        except BaseException:
            self._ctx.__exit__(*_exc_info())
            raise
        return self

    def add(self, layer: CompactLayer) -> None:
        """Append the next layer (a failed write raises one :class:`OutputError` line)."""
        try:
            self._add(layer)
        except OutputError:
            raise
        except OSError as exc:
            raise output_error(self.path, exc) from None

    def _add(self, layer: CompactLayer) -> None:
        n = self.neurons
        if layer.neurons != n:
            raise ShapeError(f"{self.path}: layer has N={layer.neurons}, the network N={n}")
        rows = np.ascontiguousarray(layer.rows, dtype=index_dtype(n))
        self._reserve(rows.nbytes + (0 if layer.values is None else 4 * rows.size) + 12 * n)
        g = self._f.create_group(layer_group(len(self._info["nnz"])))
        self._put(g, "rows", rows)
        per_col = -1 if layer.colptr is not None else int(layer.per_col)
        if layer.colptr is not None:
            self._put(g, "colptr", np.ascontiguousarray(layer.colptr, dtype=np.int64))
        value = np.float32(layer.value) if layer.values is None else np.float32(np.nan)
        if layer.values is not None:
            self._put(g, "values", np.ascontiguousarray(layer.values, dtype=np.float32))
        bias = np.asarray(layer.bias, dtype=np.float32).reshape(n)
        uniform = same_bits(bias)
        if uniform:
            bias_value = bias[0]
        else:
            bias_value = np.float32(np.nan)
            self._put(g, "bias", bias)
        for key, v in zip(self._info, (rows.size, per_col, value, bias_value)):
            self._info[key].append(v)

    def _reserve(self, more: int) -> None:
        """Reserve disk space for the next ``more`` bytes plus metadata before HDF5 writes."""
        layers = len(self._info["nnz"]) + 1
        need = int((self._min_size + more) * 1.01) + _META_BYTES * (layers + 4) + (1 << 16)
        if need > self._reserved:
            reserve(self._tmp, need)
            self._reserved = need

    def _put(self, group, name, data):
        try:
            dset = group.create_dataset(name, data=data, track_times=False)
            dset.flush()  # write errors surface here, not in a destructor that cannot report
        except RuntimeError as exc:  # h5py's type for some failed writes
            code = errno.ENOSPC if no_space(exc) else errno.EIO
            raise OSError(code, str(exc).splitlines()[0]) from None
        self._min_size += data.nbytes

    def __exit__(self, exc_type, exc, tb):
        f, self._f = self._f, None
        if exc_type is not None:
            abandon_h5(self._tmp, f)
            return self._ctx.__exit__(exc_type, exc, tb)
        try:
            self._finish(f)
            f.close()
        except BaseException:
            abandon_h5(self._tmp, f)
            return self._ctx.__exit__(*_exc_info())
        return self._ctx.__exit__(None, None, None)

    def _finish(self, f) -> None:
        self._reserve(32 * len(self._info["nnz"]))
        info = f.create_group("layer_info")
        dtypes = {"nnz": np.int64, "per_col": np.int64, "value": np.float32, "bias": np.float32}
        for key, dtype in dtypes.items():
            data = np.asarray(self._info[key], dtype=dtype)
            info.create_dataset(key, data=data, track_times=False)
        stamp_file(f, self.neurons, len(self._info["nnz"]), self.ymax, self.source, self.attrs)
        f.flush()

    def _verify(self, tmp) -> None:
        """The file holds every byte written: a full disk can make HDF5 drop writes silently."""
        import h5py

        check_size(tmp, self._min_size)
        size = os.path.getsize(tmp)
        with h5py.File(tmp, "r") as f:
            if int(f.attrs["layers"]) != len(self._info["nnz"]):
                raise OSError(f"{tmp}: layer count not recorded")
            for k in range(len(self._info["nnz"])):
                for dset in f[layer_group(k)].values():
                    off = dset.id.get_offset()
                    if dset.size and (off is None or off + dset.nbytes > size):
                        raise OSError(28, f"{dset.name} extends past the end of the file")

    @property
    def layers(self) -> int:
        return len(self._info["nnz"])

    @property
    def edges(self) -> int:
        return int(sum(self._info["nnz"]))


def _exc_info():
    import sys

    return sys.exc_info()


def read_v2_meta(path, f) -> dict:
    """Per-layer summary arrays of an open v2 file, validated (one line naming the dataset)."""
    n = _attr_int(path, f, "neurons")
    nl = _attr_int(path, f, "layers", minimum=0)
    out = {"neurons": n, "layers": nl}
    kinds = {"nnz": "i", "per_col": "i", "value": "f", "bias": "f"}
    for key, kind in kinds.items():
        name = f"layer_info/{key}"
        if name not in f:
            raise InputError(f"{path}: dataset /{name} is missing")
        dset = h5_object(path, f, name)
        if dset.dtype.kind not in (kind + ("u" if kind == "i" else "")) or dset.shape != (nl,):
            raise InputError(
                f"{path}: dataset /{name} must be {'integer' if kind == 'i' else 'float'} of "
                f"shape ({nl},), found {dset.dtype} {dset.shape}"
            )
        out[key] = _read_all(path, dset)
    if (out["nnz"] < 0).any() or (out["nnz"] > n * n).any():
        raise InputError(f"{path}: dataset /layer_info/nnz has counts outside 0..N*N")
    fixed = out["per_col"] >= 0
    if (out["per_col"] < -1).any() or (out["per_col"][fixed] * n != out["nnz"][fixed]).any():
        raise InputError(f"{path}: dataset /layer_info/per_col does not match /layer_info/nnz")
    for key in ("value", "bias"):
        if np.isinf(out[key]).any():
            raise InputError(f"{path}: dataset /layer_info/{key} has infinite values")
    return out


def _attr_int(path, f, key, minimum=1) -> int:
    v = f.attrs.get(key)
    if v is None:
        raise InputError(f"{path}: attribute {key} is missing")
    arr = np.asarray(v)
    if arr.shape != () or arr.dtype.kind not in "iu" or int(arr) < minimum:
        raise InputError(
            f"{path}: attribute {key} must be an integer >= {minimum}, found {shown(v)}"
        )
    return int(arr)


def _read_all(path, dset):
    try:
        return dset[()]
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: dataset {dset.name} cannot be read (corrupt?): {exc}") from None


def map_layers(path, layer_start: int = 0, layer_stop=None, validate: bool = True):
    """Layers ``[layer_start, layer_stop)`` of a v2 file as :class:`CompactLayer` records.

    ``rows``, ``colptr``, ``values`` and per-neuron ``bias`` are read-only ``np.memmap`` views
    of the file itself (one map of the file per call): nothing is copied, and the ranks of a
    node that map the same file share its pages in the page cache.

    Parameters
    ----------
    path : path-like
    layer_start, layer_stop : int
        Global, 0-based layer range (default: all layers).
    validate : bool
        Check every layer's indices, order and values (one pass over the mapped data); a
        failure is one :class:`InputError` line naming the dataset.

    Returns
    -------
    meta : dict
        ``neurons``, ``layers``, ``ymax``, ``source``, ``attrs`` (other attributes),
        ``weight_bytes`` (bytes of the mapped range), ``map`` (the underlying memmap).
    layers : list of CompactLayer
    """
    import h5py

    path = os.fspath(path)
    spans = []
    with hdf5_damage(path), h5py.File(path, "r") as f:
        meta = read_v2_meta(path, f)
        n, nl = meta["neurons"], meta["layers"]
        stop = nl if layer_stop is None else int(layer_stop)
        if not 0 <= layer_start <= stop <= nl:
            raise ShapeError(f"{path}: bad layer slice [{layer_start}, {stop}) of {nl}")
        ymax = read_ymax(path, f)
        for k in range(layer_start, stop):
            spans.append(_layer_spans(path, f, k, n, meta))
        attrs = {k: plain_attr(v) for k, v in f.attrs.items()}
    size = os.path.getsize(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size else None
    layers, total = [], 0
    shared_bias = {}
    for k, span in zip(range(layer_start, stop), spans):
        arrays = {}
        for name, (off, dtype, shape) in span.items():
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if nbytes == 0:
                arrays[name] = np.empty(shape, dtype=dtype)
                continue
            if off is None or off + nbytes > size:
                raise InputError(
                    f"{path}: dataset /{layer_group(k)}/{name} lies past the end "
                    f"of the file (truncated?)"
                )
            arrays[name] = mm[off : off + nbytes].view(dtype).reshape(shape)
            total += nbytes
        bias = arrays.get("bias")
        if bias is None:
            b = float(meta["bias"][k])
            bias = shared_bias.get(b)
            if bias is None:
                bias = np.full(n, b, dtype=np.float32)
                bias.flags.writeable = False
                shared_bias[b] = bias
        per_col = int(meta["per_col"][k])
        value = float(meta["value"][k])
        layer = CompactLayer(
            neurons=n,
            rows=arrays["rows"],
            colptr=arrays.get("colptr"),
            per_col=max(per_col, 0),
            values=arrays.get("values"),
            value=0.0 if np.isnan(value) else value,
            bias=bias,
        )
        if validate:
            _check_layer(path, k, layer)
        layers.append(layer)
    source = attrs.pop("source", path)
    for key in ("format", "version", "neurons", "layers", "ymax"):
        attrs.pop(key, None)
    info = {
        "neurons": n,
        "layers": nl,
        "ymax": ymax,
        "source": source,
        "attrs": attrs,
        "weight_bytes": total,
        "map": mm,
        "layer_nnz": meta["nnz"].tolist(),
    }
    return info, layers


def _layer_spans(path, f, k, n, meta):
    """File offset, dtype and shape of every dataset of layer ``k`` (checked against meta)."""
    name = layer_group(k)
    if name not in f:
        raise InputError(f"{path}: group /{name} is missing")
    g = h5_object(path, f, name, "group")
    nnz = int(meta["nnz"][k])
    want = {"rows": ("u", (nnz,))}
    if meta["per_col"][k] < 0:
        want["colptr"] = ("i", (n + 1,))
    if np.isnan(meta["value"][k]):
        want["values"] = ("f", (nnz,))
    if np.isnan(meta["bias"][k]):
        want["bias"] = ("f", (n,))
    spans = {}
    for ds, (kind, shape) in want.items():
        if ds not in g and ds in ("values", "bias"):
            # NaN in /layer_info marks "one per entry/neuron, in the layer's dataset": a NaN
            # written by mistake would otherwise be reported as only a missing dataset
            key = "value" if ds == "values" else "bias"
            raise InputError(
                f"{path}: dataset /{name}/{ds} is missing (/layer_info/{key} of layer {k + 1} "
                f"is NaN, which means the layer's {'weights' if ds == 'values' else 'biases'} "
                f"are in that dataset)"
            )
        if ds not in g:
            raise InputError(f"{path}: dataset /{name}/{ds} is missing")
        dset = h5_object(path, f, f"{name}/{ds}")
        ok_kind = dset.dtype.kind == kind or (ds == "rows" and dset.dtype == np.int64)
        if not ok_kind or dset.shape != shape or dset.dtype.byteorder == ">":
            raise InputError(
                f"{path}: dataset /{name}/{ds} must be {_kind_name(kind)} of shape {shape}, "
                f"found {dset.dtype} {dset.shape}"
            )
        if ds in ("values", "bias") and dset.dtype != np.float32:
            raise InputError(f"{path}: dataset /{name}/{ds} must be float32, found {dset.dtype}")
        if ds == "colptr" and dset.dtype != np.int64:
            raise InputError(f"{path}: dataset /{name}/{ds} must be int64, found {dset.dtype}")
        if dset.chunks is not None or dset.compression is not None:
            raise InputError(f"{path}: dataset /{name}/{ds} is chunked; v2 needs contiguous data")
        spans[ds] = (dset.id.get_offset(), dset.dtype, shape)
    return spans


def _kind_name(kind):
    return {"u": "unsigned integer", "i": "integer", "f": "float"}[kind]


def _check_layer(path, k, layer: CompactLayer) -> None:
    """Indices in range and ascending per column, pointers consistent, values finite."""
    n, name = layer.neurons, layer_group(k)
    rows = layer.rows
    if rows.size and (rows.dtype.kind == "i" or np.iinfo(rows.dtype).max >= n):
        if int(rows.max()) >= n or (rows.dtype.kind == "i" and int(rows.min()) < 0):
            raise InputError(f"{path}: dataset /{name}/rows has an index outside 0..{n - 1}")
    if layer.colptr is not None:
        ptr = layer.colptr
        if ptr[0] != 0 or ptr[-1] != rows.size or (ptr[1:] < ptr[:-1]).any():
            raise InputError(
                f"{path}: dataset /{name}/colptr must rise from 0 to {rows.size} (nnz)"
            )
        inner = np.ones(rows.size, dtype=bool)
        inner[ptr[:-1][ptr[:-1] < rows.size]] = False  # a column's first entry has no left
        if rows.size > 1 and not (rows[1:] > rows[:-1])[inner[1:]].all():
            raise InputError(f"{path}: dataset /{name}/rows is not strictly ascending per column")
    elif layer.per_col > 1:
        r = rows.reshape(n, layer.per_col)
        if not (r[:, 1:] > r[:, :-1]).all():
            raise InputError(f"{path}: dataset /{name}/rows is not strictly ascending per column")
    if layer.values is not None and not np.isfinite(layer.values).all():
        raise InputError(f"{path}: dataset /{name}/values has NaN or infinite weights")
    if not np.isfinite(layer.bias).all():
        raise InputError(f"{path}: dataset /{name}/bias has NaN or infinite values")
