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
import secrets
import sys

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, UsageError
from ..formats._atomic import atomic_path
from .io import _parse_table, _read_bytes, format_triples

__all__ = [
    "PROJECTION_FORMAT",
    "OUTPUT_FORMATS",
    "output_format",
    "make_sink",
    "MemorySink",
    "NullSink",
    "H5Sink",
    "TextSink",
    "read_projection",
    "iter_projection",
    "projection_meta",
]

PROJECTION_FORMAT = "mpisdnn.projection"
PART_FORMAT = "mpisdnn.projection.part"
VERSION = 1
OUTPUT_FORMATS = ("auto", "h5", "mtx", "tsv")
_H5_CHUNK = 1 << 18
#: Entries formatted at once by the text writers (bounds their temporary strings).
_TEXT_PIECE = 1 << 18


def output_format(path, fmt="auto") -> str:
    """``h5``, ``mtx`` or ``tsv`` for an output path (by extension when ``fmt`` is auto)."""
    if fmt != "auto":
        if fmt not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format {fmt!r} (h5, mtx or tsv)")
        return fmt
    lower = os.fspath(path).lower()
    if lower.endswith((".mtx", ".mm")):
        return "mtx"
    if lower.endswith((".tsv", ".txt", ".csv")):
        return "tsv"
    return "h5"


def make_sink(path, comm, meta: dict, fmt="auto", index_base=0):
    """The sink for ``path`` (``None``: compute only, write nothing)."""
    if path is None:
        return NullSink()
    fmt = output_format(path, fmt)
    if fmt == "h5":
        return H5Sink(path, comm, meta)
    return TextSink(path, comm, meta, fmt, index_base)


class NullSink:
    """Discards the rows (``--output`` omitted: measure the computation alone)."""

    def write(self, row_start, counts, indices, data) -> None:
        pass

    def finish(self, comm, totals) -> None:
        pass

    def abort(self) -> None:
        pass


class MemorySink:
    """Keeps this rank's rows in memory; :meth:`matrix` returns them as one CSR block.

    The final arrays are allocated once at the rank's entry bound (virtual memory: only the
    pages written are ever resident) and shrunk in place at the end, so every entry is
    written exactly once into memory that stays, and scipy gets exact-size arrays (no copy).
    """

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
        from ._kernels import gather_blocks

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


_MADV_NOHUGEPAGE = 15
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_libc = None


def _madvise(arr: np.ndarray, start: int, count, advice: int) -> None:
    """``madvise`` on the pages under ``arr[start:start+count]``; best effort (no-op where the
    call or the advice is unavailable)."""
    global _libc
    if count is None:
        count = arr.size - start
    if count <= 0 or not arr.flags.c_contiguous or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        page = 4096
        lo = arr.ctypes.data + start * arr.itemsize
        hi = lo + count * arr.itemsize
        lo = lo & ~(page - 1)
        _libc.madvise(lo, (hi - lo + page - 1) & ~(page - 1), advice)
    except (OSError, AttributeError, ValueError):  # pragma: no cover - best effort
        pass


def populate(arr: np.ndarray, start: int = 0, count=None) -> None:
    """Fault in ``arr[start:start+count]`` with one ``madvise(MADV_POPULATE_WRITE)``.

    Page faults taken one by one inside the kernel cost several times more than one bulk
    populate on some virtual machines (first touch of memory the host has not backed yet).
    """
    _madvise(arr, start, count, _MADV_POPULATE_WRITE)


def small_pages(arr: np.ndarray) -> None:
    """Ask for 4 KiB pages under ``arr`` (numpy asks for transparent huge pages above 4 MiB).

    On virtual machines that hand freed memory back to the host (free page reporting), a
    first-touched huge page costs the host a 2 MiB allocation: measured here, populating
    2 GiB of such memory took 7-8.7 s with huge pages and 0.7 s without (0.37 vs 0.19 s when
    the memory was recently used). Large results are written once, so small pages are the
    steady choice.
    """
    _madvise(arr, 0, None, _MADV_NOHUGEPAGE)


def _token(comm) -> str:
    return comm.bcast(secrets.token_hex(4) if comm.rank == 0 else None, root=0)


def _h5py():
    import h5py

    return h5py


def _attrs(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        if v is None:
            v = ""  # HDF5 attributes have no None
        out[k] = v
    return out


class H5Sink:
    """Streams rows into an HDF5 CSR (one file, or one part per rank plus an index)."""

    def __init__(self, path, comm, meta: dict):
        h5py = _h5py()
        self.path = os.fspath(path)
        self.meta = dict(meta)
        self.single = comm.size == 1
        self.rank = comm.rank
        self.token = _token(comm)
        directory = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        if self.single:
            self.final = self.path
        else:
            self.parts_dir = os.path.join(directory, base + ".parts")
            os.makedirs(self.parts_dir, exist_ok=True)
            self.part_name = f"{self.token}-r{comm.rank:05d}.h5"
            self.final = os.path.join(self.parts_dir, self.part_name)
        self.tmp = os.path.join(
            os.path.dirname(os.path.abspath(self.final)),
            f".{os.path.basename(self.final)}.tmp-{os.getpid()}",
        )
        # chunk size from this rank's entry bound (small outputs stay small on disk) and from
        # the memory budget (the chunk cache holds about one chunk per dataset)
        budget = int(self.meta.pop("budget_entries", _H5_CHUNK * 4))
        expected = int(self.meta.pop("expected_entries", _H5_CHUNK))
        chunk = (int(min(_H5_CHUNK, max(1024, min(expected, budget // 16)))),)
        self.f = h5py.File(self.tmp, "w", rdcc_nbytes=16 * chunk[0], rdcc_nslots=521)
        self.nnz = 0
        self.row0 = None
        self.rows = 0
        n = int(meta["rows"])
        self.idx_dtype = np.dtype(meta["index_dtype"])
        self.val_dtype = np.dtype(meta["value_dtype"])
        if self.single:
            self.f.attrs.update(_attrs(self.meta))
            self.indptr = self.f.create_dataset("indptr", shape=(n + 1,), dtype=np.int64)
            self.indptr[0] = 0
        else:
            self.indptr = self.f.create_dataset(
                "indptr", shape=(1,), maxshape=(None,), dtype=np.int64, chunks=chunk
            )
            self.indptr[0] = 0
        self.ind = self.f.create_dataset(
            "indices", shape=(0,), maxshape=(None,), dtype=self.idx_dtype, chunks=chunk
        )
        self.dat = self.f.create_dataset(
            "data", shape=(0,), maxshape=(None,), dtype=self.val_dtype, chunks=chunk
        )

    def write(self, row_start, counts, indices, data) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if self.row0 is None:
            self.row0 = int(row_start)
        ptr = self.nnz + np.cumsum(counts)
        k = int(indices.size)
        if self.single:
            lo = int(row_start) + 1
            self.indptr[lo : lo + counts.size] = ptr
        else:
            self.indptr.resize((self.rows + 1 + counts.size,))
            self.indptr[self.rows + 1 :] = ptr
        self.rows += counts.size
        if k:
            self.ind.resize((self.nnz + k,))
            self.dat.resize((self.nnz + k,))
            self.ind[self.nnz :] = indices.astype(self.idx_dtype, copy=False)
            self.dat[self.nnz :] = data.astype(self.val_dtype, copy=False)
        self.nnz += k

    def abort(self) -> None:
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)

    def finish(self, comm, totals) -> None:
        from ..parallel import agree

        def close_part():
            if self.single:
                self.f.attrs["nnz"] = self.nnz
            else:
                self.f.attrs.update(
                    format=PART_FORMAT,
                    version=VERSION,
                    row_start=self.meta["row_start"],
                    row_stop=self.meta["row_stop"],
                    nnz=self.nnz,
                )
            self.f.close()
            os.replace(self.tmp, self.final)

        agree(comm, close_part)
        if self.single:
            return
        table = comm.gather(
            (self.part_name, int(self.meta["row_start"]), int(self.meta["row_stop"]), self.nnz),
            root=0,
        )
        agree(comm, self._write_index if comm.rank == 0 else _nothing, table)

    def _write_index(self, table) -> None:
        h5py = _h5py()
        n = int(self.meta["rows"])
        names = [t[0] for t in table]
        row_off = np.array([t[1] for t in table] + [table[-1][2]], dtype=np.int64)
        nnz = np.array([t[3] for t in table], dtype=np.int64)
        nnz_off = np.concatenate(([0], np.cumsum(nnz)))
        total = int(nnz_off[-1])
        rel = os.path.basename(self.parts_dir)
        with atomic_path(self.path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs.update(_attrs(self.meta))
            for key in ("row_start", "row_stop"):
                del f.attrs[key]
            f.attrs["nnz"] = total
            f.attrs["parts"] = len(table)
            g = f.create_group("parts")
            g.create_dataset("files", data=np.array([f"{rel}/{x}" for x in names], dtype="S"))
            g.create_dataset("rows", data=row_off)
            g.create_dataset("nnz", data=nnz_off)
            indptr = f.create_dataset("indptr", shape=(n + 1,), dtype=np.int64)
            indptr[0] = 0
            for p, name in enumerate(names):
                a, b = int(row_off[p]), int(row_off[p + 1])
                if b <= a:
                    continue
                with h5py.File(os.path.join(self.parts_dir, name), "r") as part:
                    step = 1 << 22
                    for lo in range(0, b - a, step):
                        hi = min(b - a, lo + step)
                        indptr[a + lo + 1 : a + hi + 1] = (
                            part["indptr"][lo + 1 : hi + 1] + nnz_off[p]
                        )
            for ds, dtype in (("indices", self.idx_dtype), ("data", self.val_dtype)):
                if total == 0:
                    f.create_dataset(ds, shape=(0,), dtype=dtype)
                    continue
                layout = h5py.VirtualLayout(shape=(total,), dtype=dtype)
                for p, name in enumerate(names):
                    if nnz[p]:
                        src = h5py.VirtualSource(f"{rel}/{name}", ds, shape=(int(nnz[p]),))
                        layout[int(nnz_off[p]) : int(nnz_off[p + 1])] = src
                f.create_virtual_dataset(ds, layout, fillvalue=0)
        # parts of earlier runs into the same output are no longer referenced
        for entry in os.listdir(self.parts_dir):
            if entry.endswith(".h5") and not entry.startswith(self.token + "-"):
                try:
                    os.remove(os.path.join(self.parts_dir, entry))
                except OSError:
                    pass


def _nothing(*_):
    return None


class TextSink:
    """Streams rows as text to a per-rank part; ``finish`` assembles one file in parallel.

    Matrix Market (``mtx``: 1-based, ``integer`` or ``real`` ``general``) or a TSV edge list
    (``u<TAB>v<TAB>weight`` with a ``# mpisdnn projection ...`` first line giving the shape).
    """

    def __init__(self, path, comm, meta: dict, fmt: str, index_base: int = 0):
        self.path = os.fspath(path)
        self.meta = dict(meta)
        self.fmt = fmt
        self.base = 1 if fmt == "mtx" else int(index_base)
        self.token = _token(comm)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        name = os.path.basename(self.path)
        self.part = os.path.join(directory, f".{name}.{self.token}-r{comm.rank:05d}.part")
        self.fh = open(self.part, "wb")
        self.nnz = 0
        # formatting temporaries take ~80 bytes per entry: pieces of 1/8 of a chunk keep them
        # within the chunk's own budget
        budget = int(self.meta.pop("budget_entries", 8 * _TEXT_PIECE))
        self.meta.pop("expected_entries", None)
        self.piece = int(min(_TEXT_PIECE, max(1024, budget // 8)))

    def write(self, row_start, counts, indices, data) -> None:
        ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        for lo in range(0, int(indices.size), self.piece):
            hi = min(int(indices.size), lo + self.piece)
            rows = row_start + np.searchsorted(ends, np.arange(lo, hi), side="right")
            self.fh.write(format_triples(rows, indices[lo:hi], data[lo:hi], self.base))
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
            return (
                f"%%MatrixMarket matrix coordinate {field} general\n"
                f"% mpisdnn projection {desc}\n"
                f"{m['rows']} {m['cols']} {total}\n"
            ).encode()
        return (
            f"# mpisdnn projection rows={m['rows']} cols={m['cols']} nnz={total} "
            f"base={self.base} value={np.dtype(m['value_dtype']).name} {desc}\n"
        ).encode()

    def finish(self, comm, totals) -> None:
        from ..parallel import agree

        def close():
            self.fh.close()
            return os.path.getsize(self.part)

        size = agree(comm, close)
        sizes = comm.allgather(size)
        total = int(sum(comm.allgather(self.nnz)))
        header = self._header(total)
        directory = os.path.dirname(os.path.abspath(self.path))
        tmp = os.path.join(directory, f".{os.path.basename(self.path)}.{self.token}.tmp")

        def create():
            if comm.rank == 0:
                with open(tmp, "wb") as fh:
                    fh.write(header)
                    fh.truncate(len(header) + sum(sizes))

        agree(comm, create)
        offset = len(header) + sum(sizes[: comm.rank])

        def copy():
            _copy_into(self.part, tmp, offset, size)
            os.remove(self.part)

        try:
            agree(comm, copy)
        except Exception:
            if comm.rank == 0 and os.path.exists(tmp):
                os.remove(tmp)
            raise

        def rename():
            if comm.rank == 0:
                os.replace(tmp, self.path)

        agree(comm, rename)


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


def _open_projection(path):
    h5py = _h5py()
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file: {exc}") from None
    fmt = f.attrs.get("format")
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt != PROJECTION_FORMAT:
        f.close()
        raise InputError(f"{path}: not an {PROJECTION_FORMAT} file (format is {fmt!r})")
    if "parts" in f:
        base = os.path.dirname(os.path.abspath(path))
        files = [x.decode() if isinstance(x, bytes) else str(x) for x in f["parts/files"][()]]
        nnz = np.diff(f["parts/nnz"][()])
        for name, k in zip(files, nnz):
            full = os.path.join(base, name)
            if not os.path.exists(full):
                f.close()
                raise InputError(f"{path}: part file {full} is missing")
            with h5py.File(full, "r") as part:
                if int(part.attrs.get("nnz", -1)) != int(k):
                    f.close()
                    raise InputError(
                        f"{full}: holds {part.attrs.get('nnz')} entries, index says {k}"
                    )
    return f


def _plain(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def projection_meta(path) -> dict:
    """Attributes of an HDF5 projection output (rows, cols, nnz, weight, onto, ...)."""
    with _open_projection(path) as f:
        return {k: _plain(v) for k, v in f.attrs.items()}


def _csr(indptr, indices, data, shape):
    nnz = int(indptr[-1]) - int(indptr[0])
    idx = np.int32 if max(nnz, shape[1]) < 2**31 else np.int64
    ptr = (np.asarray(indptr, dtype=np.int64) - int(indptr[0])).astype(idx)
    return sp.csr_matrix((data, np.asarray(indices).astype(idx, copy=False), ptr), shape=shape)


def iter_projection(path, max_entries: int = 1 << 24):
    """Stream an HDF5 projection as ``(row_start, csr_block)`` pairs of about ``max_entries``.

    Blocks hold whole rows (a row larger than ``max_entries`` comes alone), so the memory used
    is bounded by the block size, whatever the size of the file.
    """
    from .plan import chunk_rows

    with _open_projection(path) as f:
        n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
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


def read_projection(path, fmt="auto") -> sp.csr_matrix:
    """Read a whole projection output (HDF5, Matrix Market or TSV) as one scipy CSR matrix.

    Index arrays are int32 below 2**31 entries and int64 from there on. Values keep their
    type (integer counts stay integers). Use :func:`iter_projection` for outputs larger than
    memory.
    """
    path = os.fspath(path)
    fmt = output_format(path, fmt)
    if fmt == "h5":
        with _open_projection(path) as f:
            n, nc = int(f.attrs["rows"]), int(f.attrs["cols"])
            return _csr(f["indptr"][()], f["indices"][()], f["data"][()], (n, nc))
    return _read_text_projection(path, fmt)


def _read_text_projection(path, fmt):
    text = _read_bytes(path)
    nl = text.find(b"\n")
    head = text[: nl if nl >= 0 else len(text)].decode("utf-8", "replace").split()
    if fmt == "mtx":
        if len(head) != 5 or head[0] != "%%MatrixMarket":
            raise InputError(f"{path}:1: not a Matrix Market file")
        integer = head[3] == "integer"
        pos, lineno, size_line = nl + 1, 1, None
        while pos < len(text):  # the size line: first line after the '%' comments
            end = text.find(b"\n", pos)
            end = len(text) if end < 0 else end
            lineno += 1
            line = text[pos:end].strip()
            pos = end + 1
            if line and not line.startswith(b"%"):
                size_line = line
                break
        if size_line is None:
            raise InputError(f"{path}: missing the size line")
        nr, nc, nnz = (int(x) for x in size_line.split())
        base = 1
        table, _ = _parse_table(path, text[pos:], (3,), comment=b"%", line_offset=lineno)
    else:
        fields = dict(x.split("=", 1) for x in head[1:] if "=" in x)
        if head[:3] != ["#", "mpisdnn", "projection"] or "rows" not in fields:
            raise InputError(f"{path}:1: not an mpisdnn projection TSV (no '# mpisdnn' header)")
        nr, nc, nnz = int(fields["rows"]), int(fields["cols"]), int(fields["nnz"])
        base = int(fields.get("base", 0))
        integer = fields.get("value", "float64").startswith("int")
        table, _ = _parse_table(path, text, (3,))
    if table.shape[0] != nnz:
        raise InputError(f"{path}: header says {nnz} entries, found {table.shape[0]}")
    rows = table[:, 0].astype(np.int64) - base
    cols = table[:, 1].astype(np.int64) - base
    vals = table[:, 2].astype(np.int64) if integer else table[:, 2]
    order = np.lexsort((cols, rows))
    if not (np.diff(order) == 1).all():
        rows, cols, vals = rows[order], cols[order], vals[order]
    counts = np.bincount(rows, minlength=nr) if rows.size else np.zeros(nr, np.int64)
    indptr = np.concatenate(([0], np.cumsum(counts)))
    return _csr(indptr, cols, vals, (nr, nc))
