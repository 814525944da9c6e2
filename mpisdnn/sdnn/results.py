"""Results out of an inference run: the categories file and the final activations.

Both are written under a temporary name and renamed once complete, so a killed run never
leaves a file that looks finished. Output paths are checked before the run starts, with
every other command's outputs (:func:`mpisdnn.paths.prepare_outputs`).

The final activations (``--output-y``) use the inputs layout of ``docs/formats.md``
(``format="mpisdnn.inputs"``, CSR under ``/features``), with ``kind="activations"`` and
``layers`` (layers applied) as extra attributes, so
:func:`mpisdnn.formats.read_inputs` reads them back, and a later run can even continue from
them. Ranks write their own row block in turn into one file: no rank ever holds more than
its own block.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError
from ..formats._atomic import output_errors
from ..parallel import agree, agree_root, allgather

__all__ = ["write_categories_file", "write_final_y"]


def write_categories_file(comm, path, categories) -> None:
    """Rank 0 writes the official categories TSV (1-based rows, one per line)."""
    from ..formats.tsv import write_categories

    agree_root(comm, write_categories, path, np.asarray(categories, dtype=np.int64))


def write_final_y(comm, path, y_local, row_offset: int, g_rows: int, layers: int) -> None:
    """Write the global final ``Y`` (rows x N, CSR) from every rank's block of rows.

    Collective. Blocks must be contiguous and in rank order (what :func:`infer` returns).
    """
    y = sp.csr_matrix(y_local, dtype=np.float32)
    y.sort_indices()
    n = y.shape[1]
    counts = np.array(allgather(comm, (int(row_offset), y.shape[0], int(y.nnz))), np.int64)
    order_ok = bool(np.all(counts[:-1, 0] + counts[:-1, 1] == counts[1:, 0]))
    if not order_ok or counts[0, 0] != 0 or counts[:, 1].sum() != g_rows:
        agree(comm, _fail, "--output-y: row blocks are not contiguous in rank order")
    nnz_off = np.concatenate(([0], np.cumsum(counts[:, 2])))
    path = os.path.abspath(os.fspath(path))
    # One temporary sibling for every rank (unique per host, process and run, created with
    # O_EXCL by rank 0); renamed onto ``path`` when complete.
    tmp = agree_root(comm, _new_temp, path)
    total = _file_bytes(int(g_rows), int(nnz_off[-1]))
    done = False
    try:
        agree_root(comm, _create, path, tmp, int(g_rows), n, int(nnz_off[-1]), int(layers))
        for rank in range(comm.size):
            # One writer at a time: plain HDF5 files have no parallel writers.
            if comm.rank == rank:
                agree(comm, _write_block, path, tmp, y, int(row_offset), int(nnz_off[rank]), total)
            else:
                agree(comm, lambda: None)
        agree_root(comm, _finish, path, tmp)
        done = True
    finally:
        if not done and comm.rank == 0 and os.path.exists(tmp):
            _discard(tmp)


def _fail(message):
    raise UsageError(message)


def _new_temp(path) -> str:
    from ..formats._atomic import output_error, refuse_stream, temp_name

    refuse_stream(path, "--output-y")  # never replaces /dev/null, a FIFO, /dev/stdout
    tmp = temp_name(path)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise output_error(path, exc) from None
    return tmp


def _file_bytes(rows: int, nnz: int) -> int:
    """Upper bound of the file's size: the three datasets plus room for HDF5's metadata."""
    return 8 * (rows + 1) + 8 * nnz + (1 << 16)


def _create(path, tmp, rows, n, nnz, layers):
    import h5py

    from ..formats._atomic import H5_LIBVER, abandon_h5, reserve

    with output_errors(path):
        f = h5py.File(tmp, "w", libver=H5_LIBVER)
        try:
            # HDF5 cannot survive a full disk (it crashes when the file closes): the blocks the
            # whole file needs are reserved first, so a full disk fails here, cleanly
            reserve(tmp, _file_bytes(rows, nnz))
            _create_datasets(f, rows, n, nnz, layers)
            f.flush()
            f.close()
        except BaseException:
            abandon_h5(tmp, f)
            raise


def _create_datasets(f, rows, n, nnz, layers):
    from ..formats.hdf5 import INPUTS_FORMAT, stamp

    attrs = {"rows": rows, "neurons": n, "kind": "activations", "layers": layers}
    stamp(f, INPUTS_FORMAT, "mpisdnn infer --output-y", attrs)
    g = f.create_group("features")
    g.create_dataset("indptr", shape=(rows + 1,), dtype=np.int64)
    g.create_dataset("indices", shape=(nnz,), dtype=np.int32)
    g.create_dataset("data", shape=(nnz,), dtype=np.float32)


def _finish(path, tmp) -> None:
    """Free the reserved blocks past the end, sync, then rename onto ``path``."""
    from ..formats._atomic import _fsync

    with output_errors(path):
        os.truncate(tmp, os.path.getsize(tmp))
        _fsync(tmp)
        os.replace(tmp, path)


def _discard(tmp) -> None:
    try:
        os.truncate(tmp, 0)  # gives the space back even if something still holds it open
        os.remove(tmp)
    except OSError:
        pass


def _write_block(path, tmp, y, row_offset, nnz_offset, total_bytes):
    import h5py

    from ..formats._atomic import abandon_h5, reserve

    with output_errors(path):
        reserve(tmp, total_bytes)  # again: closing an HDF5 file may give blocks past its end back
        f = h5py.File(tmp, "r+")
        try:
            _write_rows(f, y, row_offset, nnz_offset)
            f.flush()
            f.close()
        except BaseException:
            abandon_h5(tmp, f)
            raise


def _write_rows(f, y, row_offset, nnz_offset):
    g = f["features"]
    r0, r1 = row_offset, row_offset + y.shape[0]
    g["indptr"][r0 + 1 : r1 + 1] = y.indptr[1:].astype(np.int64) + nnz_offset
    if r0 == 0:
        g["indptr"][0] = 0
    if y.nnz:
        g["indices"][nnz_offset : nnz_offset + y.nnz] = y.indices.astype(np.int32)
        g["data"][nnz_offset : nnz_offset + y.nnz] = y.data
