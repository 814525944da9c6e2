"""The official Graph Challenge TSV files: ``row<TAB>col<TAB>value``, 1-based.

Parsing is one C-level pass (``np.fromstring`` over the whole file) plus vectorised checks; a
line-by-line pass runs only when the fast pass finds something wrong, to name the exact line.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError
from ._atomic import atomic_path

__all__ = [
    "read_triples",
    "read_weight_tsv",
    "read_network_tsv",
    "read_images_tsv",
    "read_categories",
    "write_triples",
    "write_categories",
    "layer_file",
    "DEFAULT_BIAS",
]

#: Bias of the official networks per neuron count.
DEFAULT_BIAS = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}


def _read_bytes(path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a TSV file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _fast_parse(text: bytes, ncols: int):
    if not text.strip():
        return np.empty((0, ncols))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            flat = np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if flat.size % ncols or not _fields_per_line_ok(text, ncols):
        return None  # blank or ragged lines: let the slow pass name the line
    return flat.reshape(-1, ncols)


def _fields_per_line_ok(text: bytes, ncols: int) -> bool:
    """Whether every line holds exactly ``ncols`` whitespace-separated fields (vectorised)."""
    b = np.frombuffer(text, dtype=np.uint8)
    newline = b == 10
    space = newline | (b == 9) | (b == 32) | (b == 13)
    starts = ~space
    starts[1:] &= space[:-1]
    line_ids = np.searchsorted(np.flatnonzero(newline), np.flatnonzero(starts))
    counts = np.bincount(line_ids)
    return bool(counts.size) and bool((counts == ncols).all())


def _slow_parse(path, text: bytes, ncols: int) -> np.ndarray:
    rows = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != ncols:
            raise InputError(
                f"{path}:{lineno}: expected {ncols} tab-separated columns, found {len(fields)}: "
                f"{_show(raw)}"
            )
        try:
            rows.append([float(f) for f in fields])
        except ValueError:
            raise InputError(f"{path}:{lineno}: non-numeric field: {_show(raw)}") from None
    return np.array(rows, dtype=np.float64).reshape(-1, ncols)


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _line_of(text: bytes, index: int) -> int:
    """1-based line number of the ``index``-th non-blank line."""
    count = -1
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            count += 1
            if count == index:
                return lineno
    return index + 1


def read_triples(path, nrows=None, ncols=None):
    """Read a 1-based ``row col value`` TSV file and validate it.

    Parameters
    ----------
    path : path-like
        The TSV file.
    nrows, ncols : int, optional
        Upper bounds for the row and column indices (e.g. N); checked when given.

    Returns
    -------
    rows, cols : ndarray of int64
        Zero-based indices.
    vals : ndarray of float32

    Raises
    ------
    InputError
        Naming the file and line: wrong column count, non-numeric field, index that is not a
        positive integer or exceeds the bound, NaN or infinite value.
    """
    text = _read_bytes(path)
    table = _fast_parse(text, 3)
    if table is None:
        table = _slow_parse(path, text, 3)
    idx = table[:, :2]
    vals = table[:, 2]
    bad = ~np.isfinite(idx).all(axis=1) | (idx != np.floor(idx)).any(axis=1) | (idx < 1).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{path}:{_line_of(text, i)}: row and column must be positive 1-based integers, "
            f"got {_fmt(idx[i, 0])} {_fmt(idx[i, 1])}"
        )
    for axis, bound, name in ((0, nrows, "row"), (1, ncols, "column")):
        if bound is not None and idx.shape[0]:
            over = np.flatnonzero(idx[:, axis] > bound)
            if over.size:
                i = int(over[0])
                raise InputError(
                    f"{path}:{_line_of(text, i)}: {name} index {_fmt(idx[i, axis])} exceeds "
                    f"the size {bound}"
                )
    nonfinite = np.flatnonzero(~np.isfinite(vals))
    if nonfinite.size:
        i = int(nonfinite[0])
        raise InputError(f"{path}:{_line_of(text, i)}: value is {vals[i]} (must be finite)")
    return (
        idx[:, 0].astype(np.int64) - 1,
        idx[:, 1].astype(np.int64) - 1,
        vals.astype(np.float32),
    )


def _fmt(x: float) -> str:
    return str(int(x)) if np.isfinite(x) and x == int(x) else repr(float(x))


def _to_csr(rows, cols, vals, shape, path) -> sp.csr_matrix:
    mat = sp.coo_matrix((vals, (rows, cols)), shape=shape).tocsr()
    if mat.nnz != vals.size:
        raise InputError(f"{path}: duplicate (row, column) entries")
    mat.sort_indices()
    return mat


def read_weight_tsv(path, neurons: int) -> sp.csr_matrix:
    """Read one ``n{N}-l{k}.tsv`` layer as an ``N x N`` float32 CSR matrix."""
    rows, cols, vals = read_triples(path, neurons, neurons)
    return _to_csr(rows, cols, vals, (neurons, neurons), path)


def layer_file(directory, neurons: int, layer: int) -> Path:
    """Path of official layer ``layer`` (1-based) of an ``N``-neuron network directory."""
    return Path(directory) / f"n{neurons}-l{layer}.tsv"


_LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv$")


def _scan_network_dir(directory):
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory of n{{N}}-l{{k}}.tsv layer files")
    found = {}
    for entry in os.listdir(directory):
        m = _LAYER_RE.match(entry)
        if m:
            found.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if not found:
        raise InputError(f"{directory}: no n{{N}}-l{{k}}.tsv layer files found")
    if len(found) > 1:
        raise InputError(f"{directory}: layer files for several sizes {sorted(found)}")
    neurons, layers = next(iter(found.items()))
    return neurons, layers


def read_network_tsv(directory, layers=None, neurons=None, bias=None, layer_start=0):
    """Read an official network directory ``neuron{N}/n{N}-l{k}.tsv``.

    Parameters
    ----------
    directory : path-like
    layers : int, optional
        How many layers to use (the first ``layers`` files, as the challenge does for L=120 and
        480). Default: all consecutive files from ``n{N}-l1.tsv``.
    neurons : int, optional
        Expected N; default taken from the file names.
    bias : float, optional
        Bias for every neuron; default the official value for N.
    layer_start : int
        First layer (0-based) to read, for a rank that holds a slice of layers.

    Returns
    -------
    Network
    """
    from ..sdnn.network import Network

    found_n, present = _scan_network_dir(directory)
    if neurons is not None and neurons != found_n:
        raise ShapeError(f"{directory}: files are for N={found_n}, expected N={neurons}")
    neurons = found_n
    if layers is None:
        layers = 0
        while layers + 1 in present:
            layers += 1
    missing = [k for k in range(1, layers + 1) if k not in present]
    if missing:
        raise InputError(f"{layer_file(directory, neurons, missing[0])}: missing layer file")
    if bias is None:
        if neurons not in DEFAULT_BIAS:
            raise InputError(f"{directory}: no official bias for N={neurons}; pass --bias")
        bias = DEFAULT_BIAS[neurons]
    mats = [
        read_weight_tsv(layer_file(directory, neurons, k + 1), neurons)
        for k in range(layer_start, layers)
    ]
    bias_arr = np.full((len(mats), neurons), bias, dtype=np.float32)
    return Network(
        mats,
        bias_arr,
        neurons=neurons,
        total_layers=layers,
        layer_start=layer_start,
        source=os.fspath(directory),
    )


def read_images_tsv(path, neurons: int, rows=None) -> sp.csr_matrix:
    """Read ``sparse-images-{N}.tsv`` as a ``rows x N`` float32 CSR matrix.

    ``rows`` defaults to the largest row index present (60,000 for the official files).
    """
    r, c, v = read_triples(path, rows, neurons)
    nrows = rows if rows is not None else (int(r.max()) + 1 if r.size else 0)
    return _to_csr(r, c, v, (nrows, neurons), path)


def read_categories(path) -> np.ndarray:
    """Read a truth file (one 1-based row index per line) as a sorted int64 array."""
    text = _read_bytes(path)
    if not text.strip():
        return np.empty(0, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            vals = np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            vals = None
    nlines = sum(1 for line in text.splitlines() if line.strip())
    if vals is None or vals.size != nlines:
        for lineno, raw in enumerate(text.splitlines(), start=1):
            fields = raw.split()
            if raw.strip() and (len(fields) != 1 or not fields[0].isdigit()):
                raise InputError(
                    f"{path}:{lineno}: expected one positive integer per line, got {_show(raw)}"
                )
        raise InputError(f"{path}: malformed categories file")
    bad = np.flatnonzero(~np.isfinite(vals) | (vals < 1) | (vals != np.floor(vals)))
    if bad.size:
        raise InputError(
            f"{path}:{_line_of(text, int(bad[0]))}: category must be a positive 1-based "
            f"integer, got {_fmt(vals[bad[0]])}"
        )
    return np.unique(vals.astype(np.int64))


def write_triples(path, mat) -> None:
    """Write a sparse matrix as a 1-based ``row col value`` TSV file (temp name + rename)."""
    coo = sp.coo_matrix(mat)
    order = np.lexsort((coo.row, coo.col))  # column-major like the official files
    rows = coo.row[order] + 1
    cols = coo.col[order] + 1
    vals = coo.data[order]
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        if rows.size:
            np.savetxt(fh, np.column_stack([rows, cols, vals]).astype(object), fmt="%d\t%d\t%.6e")


def write_categories(path, categories) -> None:
    """Write 1-based category row indices, one per line (temp name + rename)."""
    cats = np.asarray(categories, dtype=np.int64)
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        if cats.size:
            np.savetxt(fh, cats, fmt="%d")
