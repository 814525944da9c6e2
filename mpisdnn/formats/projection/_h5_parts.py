"""Rank parts of a multi-rank HDF5 projection and their index: names, creation, leftovers.

Every rank streams its rows into ``OUT.parts/<run>-r<rank>.h5`` (``.data.h5``), named by the
run's token and the writer's owner tag (:class:`_PartNames`); at the close rank 0 gathers the
part table and writes the index ``OUT`` (global ``/indptr``, ``/parts``, virtual datasets over
the parts) and removes the parts the replaced index named (:func:`_finish_index`). Before a
run, :func:`clean_leftovers` removes what crashed writers of the same output left. Split from
:mod:`mpisdnn.formats.projection.h5`.
"""

from __future__ import annotations

import os
import secrets

import numpy as np

from ... import parallel
from .._atomic import H5_LIBVER, atomic_path
from ._h5_layout import _attrs, _h5py, _s, _write_labels


def _remove_empty_dir(path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _remove(path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _token(comm) -> str:
    return parallel.bcast(comm, secrets.token_hex(4) if comm.rank == 0 else None)


def start_output(path, comm) -> str:
    """Collective start of an output: rank 0 cleans up leftovers of crashed runs of ``path``,
    then every rank gets the run's token."""
    if comm.rank == 0:
        clean_leftovers(path)
    return _token(comm)


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
    kwargs = {"libver": H5_LIBVER, **kwargs}
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
    with atomic_path(path) as tmp, h5py.File(tmp, "w", libver=H5_LIBVER) as f:
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
