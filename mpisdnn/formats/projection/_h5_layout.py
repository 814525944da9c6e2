"""The HDF5 projection layout: format names, version, alignment and chunk sizes, attributes.

What every HDF5 projection file shares, written and read alike: the ``format`` and ``version``
attributes of the output and of its rank parts, where a direct-written part's array starts
(``ALIGN_BASE``), the chunk of the compressed datasets, the ``--compress`` filters, and the
``/labels`` group. Split from :mod:`mpisdnn.formats.projection.h5`, which re-exports the
public names.
"""

from __future__ import annotations

import numpy as np

from ...errors import UsageError

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


def _attrs(meta: dict) -> dict:
    # HDF5 attributes have no None. Text stays variable-length (h5py's str), unlike the sdnn
    # files' (_atomic.h5_attrs): a projection is read by other tools, where plain h5py reads
    # a fixed-length string as bytes, and f.attrs["storage"] == "symmetric" would be False
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


def _part_attrs(meta, nnz) -> dict:
    return {
        "format": PART_FORMAT,
        "version": VERSION,
        "row_start": meta["row_start"],
        "row_stop": meta["row_stop"],
        "nnz": nnz,
    }


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
