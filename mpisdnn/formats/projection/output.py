"""Projection outputs: streaming writers (HDF5 CSR, Matrix Market, TSV) and readers.

Every writer is a *sink*: the driver hands it each finished chunk of rows (``write``), and a
collective ``finish`` makes the final file appear at once (temp name + rename), only when every
rank is done. Layouts are documented in docs/projection.md.

HDF5 (``format="mpisdnn.projection"``): with one rank one self-contained file; with ``P > 1``
ranks each rank streams ``OUT.parts/<run>-r<rank>.h5`` and rank 0 writes the index ``OUT``:
global ``/indptr``, the part table, and virtual datasets ``/indices`` and ``/data`` over the
parts, so plain h5py reads it as one matrix. :func:`read_projection` and
:func:`iter_projection` read either kind (and the text formats).
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ... import parallel
from ...errors import InputError, UsageError
from ...leftovers import owner_tag
from ...system import small_pages
from .._atomic import owned_name
from ..tsv import _read_bytes
from .graph import _mtx_header, format_triples
from .h5 import (
    COMPRESSIONS,
    PROJECTION_FORMAT,
    _csr,
    _DeferredWrites,
    _disk_errors,
    iter_projection,
    make_h5_sink,
    projection_labels,
    projection_meta,
    read_projection_h5,
    start_output,
)
from .sink import Sink
from .text import is_int_text

__all__ = [
    "COMPRESSIONS",
    "PROJECTION_FORMAT",
    "OUTPUT_FORMATS",
    "output_format",
    "make_sink",
    "Sink",
    "MemorySink",
    "NullSink",
    "TextSink",
    "read_projection",
    "iter_projection",
    "projection_labels",
    "projection_meta",
]

OUTPUT_FORMATS = ("auto", "h5", "mtx", "tsv", "csv", "parquet")
#: Entries formatted at once by the text writers (bounds their temporary strings).
_TEXT_PIECE = 1 << 18


def output_format(path, fmt="auto", strict=True) -> str:
    """``h5``, ``mtx``, ``tsv``, ``csv`` or ``parquet`` for an output path (by extension when
    auto). A name that says none of them is refused (``strict``, for a file to be written:
    ``H.tsv.gz`` or ``H.xyz`` was written as HDF5 without a word) or read as HDF5."""
    if fmt != "auto":
        if fmt not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format {fmt} (h5, mtx, tsv, csv or parquet)")
        return fmt
    from ..names import format_of_name

    fmt = format_of_name(path)
    if fmt is None and strict:
        raise UsageError(
            f"-o {os.fspath(path)}: its name gives no output format: end it in .h5, .mtx, "
            ".tsv, .csv or .parquet, or give --output-format"
        )
    return fmt or "h5"


def make_sink(path, comm, meta: dict, fmt="auto", index_base=0, labels=None, compress=None,
              max_batch=0) -> Sink:  # fmt: skip
    """The sink for ``path`` (``None``: compute only, write nothing).

    ``labels`` (one array, the node ids of the projected side) names rows and columns in the
    output; ``compress`` applies to HDF5 and Parquet; ``max_batch`` is the largest number of
    entries one chunk can hand over.
    """
    if path is None:
        return NullSink()
    fmt = output_format(path, fmt)
    if compress not in (None, "none") and fmt not in ("h5", "parquet"):
        raise UsageError(f"--compress applies to HDF5 and Parquet outputs, not {fmt}")
    if fmt == "h5":
        return make_h5_sink(path, comm, meta, labels, compress, max_batch)
    if fmt == "parquet":
        from .parquet import ParquetSink

        return ParquetSink(path, comm, meta, labels, compress, index_base)
    return TextSink(path, comm, meta, fmt, index_base, labels)


class NullSink(Sink):
    """Discards the rows (``--output`` omitted: measure the computation alone)."""

    def write(self, row_start, counts, indices, data) -> None:
        pass

    def finish(self, comm, totals) -> None:
        pass

    def abort(self) -> None:
        pass


class MemorySink(Sink):
    """Keeps this rank's rows in memory; :meth:`matrix` returns them as one CSR block.

    The final arrays are allocated once at the rank's entry bound (virtual memory: only the
    pages written are ever resident) and shrunk in place at the end, so every entry is
    written exactly once into memory that stays, and scipy gets exact-size arrays (no copy).
    """

    staged = True

    def __init__(self, n_cols: int, capacity: int, idx_dtype, val_dtype):
        self.n_cols = n_cols
        self.counts = []
        self.indices = np.empty(max(int(capacity), 1), dtype=idx_dtype)
        self.data = np.empty(max(int(capacity), 1), dtype=val_dtype)
        small_pages(self.indices)
        small_pages(self.data)
        self.nnz = 0

    def append_blocks(self, counts, idx, val, blk_cap, blk_cnt) -> None:
        """Copy a chunk's blocks (regions of the work buffer) behind the rows so far."""
        from .._gather import gather_blocks

        self.counts.append(np.asarray(counts, dtype=np.int64).copy())
        # pages are first touched by the parallel copy: with small pages that is as fast as a
        # bulk populate ahead of it (measured), and it spreads the faults over the threads
        self.nnz = int(gather_blocks(idx, val, blk_cap, blk_cnt, self.indices, self.data, self.nnz))

    def write(self, row_start, counts, indices, data) -> None:  # pragma: no cover - unused
        k = int(indices.size)
        self.counts.append(np.asarray(counts, dtype=np.int64).copy())
        self.indices[self.nnz : self.nnz + k] = indices
        self.data[self.nnz : self.nnz + k] = data
        self.nnz += k

    def finish(self, comm, totals) -> None:
        pass

    def abort(self) -> None:
        self.counts = []

    def matrix(self) -> sp.csr_matrix:
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        nnz = self.nnz
        idx = np.int32 if max(nnz, self.n_cols) < 2**31 else np.int64
        indptr = np.zeros(counts.size + 1, dtype=idx)
        np.cumsum(counts, out=indptr[1:])
        indices, data = self.indices, self.data
        self.indices = self.data = None
        # shrink in place (realloc of a large block is an mremap: no copy, tail returned)
        indices.resize(max(nnz, 1), refcheck=False)
        data.resize(max(nnz, 1), refcheck=False)
        indices, data = indices[:nnz], data[:nnz]
        return sp.csr_matrix(
            (data, indices.astype(idx, copy=False), indptr), shape=(counts.size, self.n_cols)
        )


class TextSink(_DeferredWrites):
    """Streams rows as text to a per-rank part; ``finish`` assembles one file in parallel.

    Written by hand, not by ``scipy.io.mmwrite``: the output can be larger than memory (it is
    streamed chunk by chunk), every rank writes its own part, and the header, whose entry
    count is known only at the end, is put in front when the parts are assembled.

    Matrix Market (``mtx``: 1-based, ``integer`` or ``real`` ``general``), a TSV edge list
    (``u<TAB>v<TAB>weight`` with a ``# mpisdnn projection ...`` first line giving the shape)
    or the same as CSV (``csv``: RFC 4180, ids quoted where they hold ``,``, ``"`` or a line
    break). With ``labels`` the TSV/CSV name nodes by their original ids, and every format
    lists the ids in ``# label <index> <id>`` (``% label ...``) comment lines after the first
    line (text ids as JSON strings, so any id survives). Ids that TSV cannot hold (a tab or
    a line break) are refused with one line naming the id.
    """

    def __init__(self, path, comm, meta: dict, fmt: str, index_base: int = 0, labels=None):
        self.path = os.fspath(path)
        self.meta = dict(meta)
        self.fmt = fmt
        self.labels = None if labels is None else np.asarray(labels)
        if self.labels is not None and fmt == "tsv":
            _tsv_safe(self.labels, self.path)
        self.base = 1 if fmt == "mtx" else int(index_base)
        self.symmetric = self.meta.get("storage") == "symmetric"
        if self.symmetric and fmt != "mtx":
            raise UsageError(f"--storage symmetric is for .h5 and .mtx outputs, not {fmt}")
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self.token = start_output(self.path, comm)
        # the assembled file is created by rank 0: every rank names it with rank 0's tag
        self.tag0 = parallel.bcast(comm, owner_tag() if comm.rank == 0 else None)
        self.part = owned_name(self.path, f"{self.token}-r{comm.rank:05d}", ".part")
        self.fh = open(self.part, "wb")
        self.nnz = 0
        self.ranks = comm.size
        # formatting temporaries take ~80 bytes per entry: pieces of 1/8 of a chunk keep them
        # within the chunk's own budget
        budget = int(self.meta.pop("budget_entries", 8 * _TEXT_PIECE))
        self.meta.pop("expected_entries", None)
        self.piece = int(min(_TEXT_PIECE, max(1024, budget // 8)))

    def write(self, row_start, counts, indices, data) -> None:
        self._deferred(self._write, row_start, counts, indices, data)

    def _drop_files(self) -> None:
        try:
            self.fh.close()  # its buffered lines fail again: nothing to keep
        except OSError:
            pass
        if os.path.exists(self.part):
            os.remove(self.part)

    def _close_part_files(self) -> None:
        self.fh.close()  # buffered lines are written here

    def _write(self, row_start, counts, indices, data) -> None:
        ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        for lo in range(0, int(indices.size), self.piece):
            hi = min(int(indices.size), lo + self.piece)
            rows = row_start + np.searchsorted(ends, np.arange(lo, hi), side="right")
            if self.labels is not None and self.fmt in ("tsv", "csv"):
                self.fh.write(
                    _labelled_triples(self.labels, rows, indices[lo:hi], data[lo:hi], self.fmt)
                )
            elif self.symmetric:  # Matrix Market keeps the lower triangle: (v, u), v >= u
                self.fh.write(format_triples(indices[lo:hi], rows, data[lo:hi], self.base))
            else:
                sep = "," if self.fmt == "csv" else "\t"
                self.fh.write(format_triples(rows, indices[lo:hi], data[lo:hi], self.base, sep))
        self.nnz += int(indices.size)

    def abort(self) -> None:
        try:
            self.fh.close()
        finally:
            if os.path.exists(self.part):
                os.remove(self.part)

    def _header(self, total: int) -> bytes:
        m = self.meta
        desc = " ".join(
            f"{k}={m[k]}"
            for k in ("weight", "onto", "triangle", "self_loops", "min_weight", "top_k")
            if m.get(k) is not None
        )
        if self.fmt == "mtx":
            field = "integer" if np.dtype(m["value_dtype"]).kind in "iu" else "real"
            symmetry = "symmetric" if self.symmetric else "general"
            return (
                f"%%MatrixMarket matrix coordinate {field} {symmetry}\n"
                f"% mpisdnn projection {desc}\n" + self._label_lines("%", 1) +
                f"{m['rows']} {m['cols']} {total}\n"
            ).encode()  # fmt: skip
        kind = "" if self.labels is None else f" labels={_label_kind(self.labels)}"
        return (
            f"# mpisdnn projection rows={m['rows']} cols={m['cols']} nnz={total} "
            f"base={self.base} value={np.dtype(m['value_dtype']).name}{kind} {desc}\n"
            + self._label_lines("#", self.base)
        ).encode()

    def _label_lines(self, mark: str, base: int) -> str:
        if self.labels is None:
            return ""
        return "".join(
            f"{mark} label {i + base} {_label_text(x)}\n"
            for i, x in enumerate(self.labels.tolist())
        )

    def finish(self, comm, totals) -> None:
        try:
            self._finish(comm)
        except BaseException:
            self.abort()  # this rank's part goes whatever failed (a full disk, an interrupt)
            raise

    def _finish(self, comm) -> None:
        from ...parallel import agree

        def close():
            self._close_part()
            return os.path.getsize(self.part)

        size = agree(comm, close)
        sizes = parallel.allgather(comm, size)
        total = int(sum(parallel.allgather(comm, self.nnz)))
        header = self._header(total)
        tmp = owned_name(self.path, self.token, ".tmp", owner=self.tag0)

        def create():
            if comm.rank == 0:
                with _disk_errors(self.path), open(tmp, "wb") as fh:
                    fh.write(header)
                    fh.truncate(len(header) + sum(sizes))

        offset = len(header) + sum(sizes[: comm.rank])

        def copy():
            with _disk_errors(self.path):
                _copy_into(self.part, tmp, offset, size)
            os.remove(self.part)

        try:
            agree(comm, create)
            agree(comm, copy)
        except Exception:
            if comm.rank == 0 and os.path.exists(tmp):
                os.remove(tmp)
            raise

        def rename():
            if comm.rank == 0:
                os.replace(tmp, self.path)

        agree(comm, rename)


def _label_kind(labels) -> str:
    return "str" if np.asarray(labels).dtype.kind in "USO" else "int"


def _label_text(x) -> str:
    """A label in a ``# label`` line: integers as they are, text as a JSON string."""
    import json

    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return json.dumps(str(x), ensure_ascii=False)


def _tsv_safe(labels, path) -> None:
    """TSV fields cannot hold a tab or a line break: such an id is refused, never mangled."""
    if labels.dtype.kind not in "USO":
        return
    for x in labels.tolist():
        if any(c in x for c in "\t\n\r"):
            raise UsageError(
                f"{path}: id {json_show(x)} holds a tab or a line break, which TSV cannot hold; "
                "write .csv, .parquet or .h5"
            )


def json_show(x) -> str:
    import json

    return json.dumps(str(x), ensure_ascii=False)


def _csv_field(x) -> str:
    s = str(x)
    if any(c in s for c in ',"\r\n') or s != s.strip(" ") and s:
        return '"' + s.replace('"', '""') + '"'
    return s


def _labelled_triples(labels, rows, cols, vals, fmt="tsv") -> bytes:
    """``label_u<sep>label_v<sep>weight`` lines (ids written as given, values as numbers);
    CSV fields quoted per RFC 4180 where needed."""
    vals = np.asarray(vals)
    v = vals.tolist() if vals.dtype.kind in "iu" else [repr(x) for x in vals.tolist()]
    lu, lv = labels[rows].tolist(), labels[np.asarray(cols, dtype=np.int64)].tolist()
    if fmt == "csv":
        if labels.dtype.kind in "USO":
            lu, lv = [_csv_field(x) for x in lu], [_csv_field(x) for x in lv]
        return "".join(map("{},{},{}\n".format, lu, lv, v)).encode()
    return "".join(map("{}\t{}\t{}\n".format, lu, lv, v)).encode()


def _copy_into(src: str, dst: str, offset: int, size: int) -> None:
    """Copy all of ``src`` into ``dst`` at ``offset`` (kernel-side when possible)."""
    with open(src, "rb") as fin, open(dst, "r+b") as fout:
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                while done < size:
                    n = os.copy_file_range(
                        fin.fileno(), fout.fileno(), size - done, done, offset + done
                    )
                    if n == 0:
                        break
                    done += n
            except OSError:
                done = 0
        fin.seek(done)
        fout.seek(offset + done)
        while done < size:
            block = fin.read(min(1 << 24, size - done))
            if not block:
                break
            fout.write(block)
            done += len(block)
    if done != size:
        raise InputError(f"{dst}: short copy of {src} ({done} of {size} bytes)")


# --- readers ---------------------------------------------------------------------------------


def read_projection(path, fmt="auto", with_labels=False, mirror=True):
    """Read a whole projection output (HDF5, Matrix Market or TSV) as one scipy CSR matrix.

    Index arrays are int32 below 2**31 entries and int64 from there on. Values keep their
    type (integer counts stay integers; counts an HDF5 file stores as uint16 come back
    int32). Use :func:`iter_projection` for outputs larger than memory. With ``with_labels``
    returns ``(matrix, labels)`` where ``labels`` is ``(row_labels, col_labels)`` for outputs
    of inputs with their own ids, else ``None``.
    Outputs written with ``storage="symmetric"`` come back as the full matrix; ``mirror=False``
    gives an HDF5 file's stored upper triangle instead.
    """
    path = os.fspath(path)
    fmt = output_format(path, fmt, strict=False)
    if fmt == "h5":
        return read_projection_h5(path, with_labels, mirror)
    if fmt == "parquet":
        from .parquet import read_projection_parquet

        return read_projection_parquet(path, with_labels)
    mat, labels = _read_text_projection(path, fmt)
    return (mat, labels) if with_labels else mat


def _text_labels(text: bytes, mark: bytes, kind: str | None):
    """Labels from ``<mark> label <i> <id>`` comment lines (None when there are none); text
    ids are JSON strings (plain text in files of earlier versions)."""
    import json

    key = mark + b" label "
    if key not in text[: 1 << 16]:
        return None
    out, quoted = [], False
    for line in text.split(b"\n"):
        if line.startswith(key):
            rest = line[len(key) :].rstrip(b"\r").split(b" ", 1)[1].decode("utf-8")
            if rest.startswith('"'):
                rest, quoted = json.loads(rest), True
            out.append(rest)
        elif line and not line.startswith(mark) and out:
            break
    if kind == "int" or (kind is None and not quoted and all(is_int_text(x) for x in out)):
        return np.array([int(x) for x in out], dtype=np.int64)
    wide = max((len(x) for x in out), default=1) > 256
    return np.array(out, dtype=object if wide else str)


def _mmread(path, text: bytes):
    """The entries of a Matrix Market file already read, by ``scipy.io.mmread``
    (fast_matrix_market from scipy 1.12 on); its ``Line N: problem`` errors become
    ``path:N: problem``."""
    import io
    import re

    import scipy.io

    try:
        mat = scipy.io.mmread(io.BytesIO(text))
    except ValueError as exc:
        where = re.match(r"Line (\d+): (.*)", str(exc), re.S)
        raise InputError(f"{path}:{where[1]}: {where[2]}" if where else f"{path}: {exc}") from None
    if not sp.issparse(mat):
        raise InputError(f"{path}:1: not a coordinate Matrix Market file")
    return mat.tocoo()


def _labelled_table(path, text: bytes, labels, fmt):
    """Rows of ``id_u id_v weight`` records mapped back to indices through ``labels``."""
    import csv
    import io

    index = {str(x): i for i, x in enumerate(labels.tolist())}
    rows, cols, vals = [], [], []
    body = io.StringIO(text.decode("utf-8"), newline="")
    delim = "," if fmt == "csv" else "\t"
    reader = csv.reader(body, delimiter=delim, quoting=csv.QUOTE_MINIMAL if fmt == "csv"
                        else csv.QUOTE_NONE)  # fmt: skip
    leading = True  # the '# ...' lines (header, labels) come first; ids may start with '#'
    for parts in reader:
        if leading and (not parts or parts[0].startswith("#")):
            continue
        leading = False
        if not parts:
            continue
        if len(parts) != 3 or parts[0] not in index or parts[1] not in index:
            raise InputError(
                f"{path}:{reader.line_num}: expected 'id{delim}id{delim}weight' with known ids"
            )
        rows.append(index[parts[0]])
        cols.append(index[parts[1]])
        vals.append(float(parts[2]))
    table = np.empty((len(rows), 3))
    table[:, 0], table[:, 1], table[:, 2] = rows, cols, vals
    return table


def _read_text_projection(path, fmt):
    text = _read_bytes(path, what="a graph file")
    if fmt == "mtx":
        _field, _symmetry, _size, body, _line = _mtx_header(path, text)
        labels = _text_labels(text[:body], b"%", None)  # comments in front of the size line
        coo = _mmread(path, text)
        (nr, nc), rows, cols, vals = coo.shape, coo.row, coo.col, coo.data
        rows, cols = rows.astype(np.int64), cols.astype(np.int64)
    else:
        (nr, nc), rows, cols, vals, labels = _read_tsv_projection(path, text, fmt)
    order = np.lexsort((cols, rows))
    if not (np.diff(order) == 1).all():
        rows, cols, vals = rows[order], cols[order], vals[order]
    counts = np.bincount(rows, minlength=nr) if rows.size else np.zeros(nr, np.int64)
    indptr = np.concatenate(([0], np.cumsum(counts)))
    return _csr(indptr, cols, vals, (nr, nc)), (None if labels is None else (labels, labels))


def _read_tsv_projection(path, text: bytes, fmt="tsv"):
    """``(shape, rows, cols, values, labels)`` of a TSV or CSV projection output."""
    nl = text.find(b"\n")
    head = text[: nl if nl >= 0 else len(text)].decode("utf-8", "replace").split()
    fields = dict(x.split("=", 1) for x in head[1:] if "=" in x)
    if head[:3] != ["#", "mpisdnn", "projection"] or "rows" not in fields:
        raise InputError(f"{path}:1: not an mpisdnn projection TSV (no '# mpisdnn' header)")
    nr, nc, nnz = int(fields["rows"]), int(fields["cols"]), int(fields["nnz"])
    base = int(fields.get("base", 0))
    integer = fields.get("value", "float64").startswith("int")
    labels = None
    if "labels" in fields:
        labels = _text_labels(text, b"#", fields["labels"])
        table, base = _labelled_table(path, text, labels, fmt), 0
        rows = table[:, 0].astype(np.int64)
        cols = table[:, 1].astype(np.int64)
        vals = table[:, 2]
    else:
        rows, cols, vals = _numeric_text(path, text, "comma" if fmt == "csv" else "tab")
        rows, cols = rows - base, cols - base
    if rows.size != nnz:
        raise InputError(f"{path}: header says {nnz} entries, found {rows.size}")
    vals = vals.astype(np.int64) if integer else vals
    return (nr, nc), rows, cols, vals, labels


def _numeric_text(path, text: bytes, sep: str):
    """The ``u v weight`` records of an unlabelled text output (after its comment lines)."""
    from . import _text_kernels as K
    from .edgelist import TextPlan, parse_numeric_range
    from .text import Dialect, data_start

    start = data_start(text)
    if start >= len(text):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    plan = TextPlan(start, Dialect(sep), 3, None, True)
    part = parse_numeric_range(path, text, 0, len(text), plan, strict=False)
    if part.status != K.OK:
        raise InputError(f"{path}:{part.line}: expected 'u v weight' with integer indices")
    return part.rows, part.cols, part.vals
