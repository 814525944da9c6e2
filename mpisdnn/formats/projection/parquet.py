"""Parquet projection output: one dataset directory of per-rank part files (optional pyarrow).

``H.parquet/`` holds ``part-r00000.parquet`` ... (one per rank, written in parallel, rows in
order), each with columns ``u``, ``v`` (indices plus the input's index base, int32/int64) and
``weight``, plus ``u_label`` / ``v_label`` when the input had its own ids. Beside them, not
among them: ``_mpisdnn.json`` (shape, nnz, options, ``index_base``) and
``_labels/labels.parquet`` (all node labels), which dataset readers skip (leading
underscore) and a ``H.parquet/*.parquet`` glob does not match. pandas
(``pd.read_parquet("H.parquet")``), pyarrow (``pq.read_table``) and DuckDB
(``read_parquet('H.parquet/*.parquet')``) read it as one table.

The directory is built under a temporary name and renamed into place when every rank is done;
a previous dataset at the same path is replaced only then.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from ... import parallel
from ...errors import InputError, UsageError
from ...leftovers import owner_tag
from .._atomic import owned_name
from .sink import Sink

__all__ = ["ParquetSink", "read_projection_parquet"]

#: Where the node labels go: beside the data files, never matched by ``H.parquet/*.parquet``.
_LABELS = ("_labels", "labels.parquet")
_CODECS = {None: "snappy", "none": "none", "zstd": "zstd", "gzip": "gzip"}


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(
            "Parquet output needs the optional package pyarrow (pip install 'mpisdnn[parquet]')"
        ) from None
    return pa, pq


class ParquetSink(Sink):
    """Streams rows as a Parquet edge list; ``finish`` publishes the dataset directory."""

    def __init__(self, path, comm, meta: dict, labels=None, compress=None, index_base=0):
        pa, pq = _pyarrow()
        if compress not in _CODECS:
            raise UsageError(f"--compress {compress} is not a Parquet codec (zstd, gzip, none)")
        self.path = os.path.abspath(os.fspath(path)).rstrip("/")
        self.meta = dict(meta)
        self.meta.pop("budget_entries", None)
        self.meta.pop("expected_entries", None)
        self.meta["compression"] = _CODECS[compress]
        self.base = 0 if labels is not None else int(index_base)
        self.meta["index_base"] = self.base
        # Rank 0 creates the directory, so it carries rank 0's owner tag: a run that finds it
        # after a crash can prove it a leftover (the one naming rule of formats._atomic).
        token, tag0 = parallel.bcast(
            comm, (os.urandom(4).hex(), owner_tag()) if comm.rank == 0 else None
        )
        self.tmpdir = owned_name(self.path, token, ".tmp", owner=tag0)
        if comm.rank == 0:
            os.makedirs(self.tmpdir)
        parallel.barrier(comm)
        self.rank = comm.rank
        self.labels = None if labels is None else pa.array(np.asarray(labels).tolist())
        self.nnz = 0
        idx = pa.from_numpy_dtype(np.dtype(meta["index_dtype"]))
        fields = [
            ("u", idx),
            ("v", idx),
            ("weight", pa.from_numpy_dtype(np.dtype(meta["value_dtype"]))),
        ]
        if self.labels is not None:
            fields += [("u_label", self.labels.type), ("v_label", self.labels.type)]
        self.schema = pa.schema(fields)
        self.file = os.path.join(self.tmpdir, f"part-r{comm.rank:05d}.parquet")
        self.writer = pq.ParquetWriter(self.file, self.schema, compression=_CODECS[compress])

    def write(self, row_start, counts, indices, data) -> None:
        pa, _ = _pyarrow()
        counts = np.asarray(counts, dtype=np.int64)
        if indices.size == 0:
            return
        rows = np.repeat(np.arange(row_start, row_start + counts.size, dtype=indices.dtype), counts)
        cols = [pa.array(rows), pa.array(np.asarray(indices)), pa.array(np.asarray(data))]
        if self.labels is not None:
            cols += [self.labels.take(cols[0]), self.labels.take(cols[1])]
        if self.base:
            cols[0] = pa.array(rows + self.base)
            cols[1] = pa.array(np.asarray(indices) + self.base)
        self.writer.write_table(pa.Table.from_arrays(cols, schema=self.schema))
        self.nnz += int(indices.size)

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def finish(self, comm, totals) -> None:
        from ...parallel import agree

        agree(comm, self.writer.close)
        total = int(sum(parallel.allgather(comm, self.nnz)))
        try:
            agree(comm, self._publish if comm.rank == 0 else _nothing, total)
        except BaseException:
            if comm.rank == 0:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise

    def _publish(self, total: int) -> None:
        pa, pq = _pyarrow()
        meta = {k: v for k, v in self.meta.items() if k not in ("row_start", "row_stop")}
        meta["nnz"] = total
        with open(os.path.join(self.tmpdir, "_mpisdnn.json"), "w") as fh:
            json.dump(meta, fh, default=_plain)
        if self.labels is not None:
            os.makedirs(os.path.join(self.tmpdir, "_labels"))
            pq.write_table(pa.table({"label": self.labels}), os.path.join(self.tmpdir, *_LABELS))
        old = None
        if os.path.lexists(self.path):
            if not os.path.isdir(self.path) or not os.path.exists(
                os.path.join(self.path, "_mpisdnn.json")
            ):
                raise InputError(f"{self.path}: exists and is not an mpisdnn Parquet dataset")
            old = self.tmpdir + ".old"
            os.replace(self.path, old)
        os.replace(self.tmpdir, self.path)
        if old:
            shutil.rmtree(old, ignore_errors=True)


def _nothing(*_):
    return None


def _plain(v):
    return v.item() if isinstance(v, np.generic) else str(v)


def read_projection_parquet(path, with_labels=False):
    """The whole Parquet projection as scipy CSR (and its labels, or None, with ``with_labels``)."""
    import scipy.sparse as sp

    pa, pq = _pyarrow()
    path = os.fspath(path)
    meta_file = os.path.join(path, "_mpisdnn.json")
    if not os.path.isfile(meta_file):
        raise InputError(f"{path}: not an mpisdnn Parquet projection (no _mpisdnn.json)")
    with open(meta_file) as fh:
        meta = json.load(fh)
    n = int(meta["rows"])
    files = sorted(f for f in os.listdir(path) if f.endswith(".parquet") and f[0] not in "._")
    table = pq.read_table([os.path.join(path, f) for f in files], columns=["u", "v", "weight"])
    if table.num_rows != int(meta["nnz"]):
        raise InputError(
            f"{path}: holds {table.num_rows} entries, _mpisdnn.json says {meta['nnz']}"
        )
    base = int(meta.get("index_base", 0))
    u = table["u"].to_numpy() - base
    v = table["v"].to_numpy() - base
    w = table["weight"].to_numpy()
    mat = sp.csr_matrix((w, (u, v)), shape=(n, int(meta["cols"])))
    mat.sort_indices()
    if not with_labels:
        return mat
    labels = None
    lab = os.path.join(path, *_LABELS)
    if not os.path.isfile(lab):  # written by an earlier version
        lab = os.path.join(path, "_labels.parquet")
    if os.path.isfile(lab):
        arr = pq.read_table(lab)["label"].to_numpy(zero_copy_only=False)
        arr = arr.astype(str) if arr.dtype == object else arr
        labels = (arr, arr)
    return mat, labels
