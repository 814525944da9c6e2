"""The official Graph Challenge TSV files: ``row<TAB>col<TAB>value``, 1-based.

The files themselves: layers (``n{N}-l{k}.tsv``) and network directories, inputs
(``sparse-images-{N}.tsv``), categories, and their writers. The text grammar they share (one
C-level parse plus vectorised checks; a line-by-line pass only when the fast pass finds
something wrong, to name the exact ``file:line``; byte ranges, so ranks can split one large
file) is :mod:`mpisdnn.formats._tsv_text`, whose public names are re-exported here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, ShapeError
from ._atomic import atomic_path

# The text grammar (file checks, parsing, line numbers): its public names are this module's,
# and the parallel and archive readers and scripts/bench_formats.py reach the private ones
# they share as ``tsv.X``.
from ._tsv_text import (
    MAX_ROWS,
    UTF8_BOM,
    _floats,
    _fmt,
    _line_of,
    _read_bytes,
    _show,
    _to_csr,
    _triples,
    check_last_line,
    cut_short_warning,
    duplicate_message,
    line_range,
    read_triples,
    read_triples_range,
    regular_file_size,
    unterminated_line,
    written,
)
from ._tsv_text import _fast_parse as _fast_parse
from ._tsv_text import _lines_before as _lines_before
from ._validate import check_memory

__all__ = [
    "read_triples",
    "read_triples_range",
    "read_weight_compact",
    "is_layer_file",
    "scan_network_dir",
    "read_weight_tsv",
    "read_network_tsv",
    "read_images_tsv",
    "read_categories",
    "regular_file_size",
    "cut_short_warning",
    "unterminated_line",
    "write_triples",
    "write_categories",
    "layer_file",
    "DEFAULT_BIAS",
    "check_image_entries",
    "check_layer_entries",
    "check_last_line",
    "line_range",
    "written",
]

#: Bias of the official networks per neuron count.
DEFAULT_BIAS = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}


def layer_bias(source, neurons: int, bias=None) -> float:
    """``bias``, or the official one for N; one :class:`InputError` line naming ``source``
    where N has none."""
    if bias is not None:
        return bias
    if neurons not in DEFAULT_BIAS:
        raise InputError(f"{source}: no official bias for N={neurons}; pass --bias")
    return DEFAULT_BIAS[neurons]


def read_weight_tsv(path, neurons: int) -> sp.csr_matrix:
    """Read one ``n{N}-l{k}.tsv`` layer as an ``N x N`` float32 CSR matrix."""
    rows, cols, vals = read_triples(path, neurons, neurons)
    check_layer_entries(path, rows.size)
    return _to_csr(rows, cols, vals, (neurons, neurons), path)


def check_layer_entries(name, count: int) -> None:
    """Refuse a layer file without weights: an empty or blank file is a download or an
    unpacking cut short, not a layer (it would zero every row and still convert and
    run). A network built in Python may still hold an empty layer."""
    if count == 0:
        raise InputError(f"{name}: no weights (an empty layer file: cut short?)")


def read_weight_compact(path, neurons: int, bias):
    """Read one layer file straight into column-wise :class:`CompactLayer` form.

    The official files are already in column order, so this is one parse, one ordering
    check and no sort; other files are sorted. A duplicate ``(row, column)`` names its line.
    """
    text = _read_bytes(path)
    rows, cols, vals = _triples(path, text, neurons, neurons, 0)
    return compact_from_triples(path, text, rows, cols, vals, neurons, bias)


def compact_from_triples(path, text, rows, cols, vals, neurons: int, bias):
    """A :class:`CompactLayer` from one layer's 0-based entries (copied: the arrays may be a
    parser's reused buffers). ``text`` (bytes or uint8 array, the file's text) names the
    line of a duplicate entry."""
    from ..weights import CompactLayer, index_dtype, same_bits

    check_layer_entries(path, len(rows))
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    key = cols * neurons + rows
    order = None
    if key.size > 1 and not (key[1:] > key[:-1]).all():
        order = np.argsort(key, kind="stable")
        key = key[order]
        dup = np.flatnonzero(key[1:] == key[:-1])
        if dup.size:
            i = int(order[dup[0] + 1])
            raise InputError(duplicate_message(path, rows, cols, i, text))
        rows, cols, vals = rows[order], cols[order], vals[order]
    counts = np.bincount(cols, minlength=neurons)
    fixed = bool(np.all(counts == counts[0])) if counts.size else True
    uniform = same_bits(vals)
    colptr = None
    if not fixed:
        colptr = np.zeros(neurons + 1, dtype=np.int64)
        np.cumsum(counts, out=colptr[1:])
    return CompactLayer(
        neurons=neurons,
        rows=rows.astype(index_dtype(neurons)),
        colptr=colptr,
        per_col=int(counts[0]) if fixed and counts.size else 0,
        values=None if uniform else np.array(vals, dtype=np.float32),
        value=float(vals[0]) if uniform else 0.0,
        bias=np.full(neurons, bias, dtype=np.float32),
    )


def compact_from_ordered(rows, counts, vals, uniform: bool, neurons: int, bias):
    """A :class:`CompactLayer` from entries already in (column, row) order without a
    repeat (what :func:`~mpisdnn.formats._tsv_kernels.parse_layer_text` found): ``counts``
    holds each column's entries, ``uniform`` whether all of ``vals`` are equal. The same
    layer :func:`compact_from_triples` builds, without its sort and checks."""
    from ..weights import CompactLayer, index_dtype

    fixed = bool(counts.size == 0 or (counts == counts[0]).all())
    colptr = None
    if not fixed:
        colptr = np.zeros(neurons + 1, dtype=np.int64)
        np.cumsum(counts, out=colptr[1:])
    uniform = uniform and vals.size > 0
    return CompactLayer(
        neurons=neurons,
        rows=rows.astype(index_dtype(neurons)),
        colptr=colptr,
        per_col=int(counts[0]) if fixed and counts.size else 0,
        values=None if uniform else np.array(vals, dtype=np.float32),
        value=float(vals[0]) if uniform else 0.0,
        bias=np.full(neurons, bias, dtype=np.float32),
    )


def layer_file(directory, neurons: int, layer: int) -> Path:
    """Path of official layer ``layer`` (1-based) of an ``N``-neuron network directory."""
    return Path(directory) / f"n{neurons}-l{layer}.tsv"


_LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv$")


def is_layer_file(name: str) -> bool:
    """Whether ``name`` looks like a layer file ``n{N}-l{k}.tsv``."""
    return _LAYER_RE.match(name) is not None


def scan_network_dir(directory, layers=None):
    """Check a layer directory and return ``(N, L)``.

    The files must be ``n{N}-l1.tsv`` .. ``n{N}-l{L}.tsv`` for one N, with no gap, no
    ``l0``, no name with leading zeros (``l01`` would duplicate ``l1``): a directory that an
    interrupted writer or two mixed runs left behind is refused rather than half used.
    ``layers`` (the run's depth) must not exceed L.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory of n{{N}}-l{{k}}.tsv layer files")
    found = {}
    for entry in sorted(os.listdir(directory)):
        m = _LAYER_RE.match(entry)
        if not m:
            continue
        n_text, k_text = m.groups()
        if k_text != str(int(k_text)) or n_text != str(int(n_text)) or int(k_text) < 1:
            raise InputError(
                f"{directory / entry}: bad layer file name (layers are numbered 1, 2, ... "
                f"without leading zeros)"
            )
        found.setdefault(int(n_text), set()).add(int(k_text))
    if not found:
        raise InputError(f"{directory}: no n{{N}}-l{{k}}.tsv layer files found")
    if len(found) > 1:
        raise InputError(f"{directory}: layer files for several sizes {sorted(found)}")
    neurons, present = next(iter(found.items()))
    top = max(present)
    if len(present) != top:
        gap = min(set(range(1, top + 1)) - present)
        raise InputError(
            f"{layer_file(directory, neurons, gap)}: missing layer file (the directory has "
            f"layers up to {top}; incomplete or mixed output?)"
        )
    if layers is not None and layers > top:
        raise InputError(
            f"{layer_file(directory, neurons, top + 1)}: missing layer file (asked for "
            f"{layers} layers, the directory has {top})"
        )
    return neurons, top


def _scan_network_dir(directory):
    neurons, top = scan_network_dir(directory)
    return neurons, set(range(1, top + 1))


def read_network_tsv(directory, layers=None, neurons=None, bias=None, layer_start=0):
    """Read an official network directory ``neuron{N}/n{N}-l{k}.tsv``.

    Parameters
    ----------
    directory : path-like
    layers : int, optional
        How many layers to use (the first ``layers`` files, as the challenge does for L=120 and
        480). Default: all files ``n{N}-l1.tsv`` .. ``n{N}-l{L}.tsv``.
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
    from ..network import Network

    found_n, top = scan_network_dir(directory, layers)
    if neurons is not None and neurons != found_n:
        raise ShapeError(f"{directory}: files are for N={found_n}, expected N={neurons}")
    neurons = found_n
    if layers is None:
        layers = top
    bias = layer_bias(directory, neurons, bias)
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


def check_image_entries(path, entries: int) -> None:
    """Refuse an inputs TSV without entries when the row count comes from the file.

    Without entries the file gives no row count: an empty (or truncated-to-nothing) download
    would otherwise run as zero inputs and "pass".
    """
    if entries == 0:
        raise InputError(f"{path}: no entries (expected `row<TAB>col<TAB>value` lines)")


def read_images_tsv(path, neurons: int, rows=None) -> sp.csr_matrix:
    """Read ``sparse-images-{N}.tsv`` as a ``rows x N`` float32 CSR matrix.

    ``rows`` defaults to the largest row index present (60,000 for the official files).
    """
    r, c, v = read_triples(path, rows, neurons, MAX_ROWS)
    if rows is None:
        check_image_entries(path, r.size)
    nrows = rows if rows is not None else int(r.max()) + 1
    # one stray huge row id must not size the row pointers (16 B per row while building)
    check_memory(16 * (nrows + 1), f"{path}: {nrows} rows (the largest row id)")
    return _to_csr(r, c, v, (nrows, neurons), path)


def read_categories(path) -> np.ndarray:
    """Read a truth file (one 1-based row index per line) as a sorted int64 array (after a
    UTF-8 byte-order mark, as the inputs reader reads its file)."""
    text = _read_bytes(path)
    if text.startswith(UTF8_BOM):
        text = text[len(UTF8_BOM) :]
    if not text.strip():
        return np.empty(0, dtype=np.int64)
    vals = _floats(text)
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
    # the values are read as float64: past 2**53 a row id rounds to another one, and past
    # 2**63 the cast wraps to a negative one; no run has more rows than MAX_ROWS anyway
    big = np.flatnonzero(vals > MAX_ROWS)
    if big.size:
        lineno = _line_of(text, int(big[0]))
        raw = text.splitlines()[lineno - 1].strip()
        raise InputError(
            f"{path}:{lineno}: category {_show(raw)} is beyond the largest supported row "
            f"count {MAX_ROWS}"
        )
    return np.unique(vals.astype(np.int64))


def write_triples(path, mat) -> None:
    """Write a sparse matrix as a 1-based ``row col value`` TSV file (temp name + rename).

    Entries go column-major, like the official files; the text is :func:`triples_text`'s. A
    name ending in ``.gz`` is written gzip-compressed (:func:`.gz.gzip_writer`), like the
    published ``sparse-images-{N}.tsv.gz``.
    """
    from .gz import gzip_writer

    gz = os.fspath(path).endswith(".gz")
    with atomic_path(path) as tmp, (gzip_writer(tmp) if gz else open(tmp, "wb")) as fh:
        for chunk in triples_text(mat):
            fh.write(chunk)


def triples_text(mat):
    """The official-format text of a sparse matrix, in chunks of bytes (a generator).

    Entries go column-major, like the official files. When every value is the same (the
    official inputs are all 1, the layers all 1/16), lines are formatted in column chunks by
    a numba loop (``_tsv_write``): 60,000 inputs of N=65536 are 424 M lines, far too many for
    the object array ``np.savetxt`` formats. An integral value is written as an integer
    (``1``, as in the official ``sparse-images-{N}.tsv``), any other as ``%.6e``.
    """
    import io

    csc = sp.csc_matrix(mat)
    csc.sort_indices()
    vals = csc.data
    if vals.size == 0:
        return
    v = vals[0]
    if not np.all(vals == v):
        coo = csc.tocoo()  # column-major already: CSC order
        rows, cols = coo.row + 1, coo.col + 1
        table = np.column_stack([rows, cols, coo.data]).astype(object)
        out = io.BytesIO()
        np.savetxt(out, table, fmt="%d\t%d\t%.6e")
        yield out.getvalue()
        return
    from ._tsv_write import format_lines

    text = (f"{int(v)}" if float(v).is_integer() else f"{float(v):.6e}").encode()
    step = 1 << 22  # entries per chunk: ~100 MB of temporaries
    for lo in range(0, vals.size, step):
        hi = min(lo + step, vals.size)
        # 1-based column of entry p: the number of column starts <= p
        cols = np.searchsorted(csc.indptr, np.arange(lo, hi), side="right")
        yield format_lines(csc.indices[lo:hi] + 1, cols, text)


def write_categories(path, categories) -> None:
    """Write 1-based category row indices, one per line (temp name + rename)."""
    cats = np.asarray(categories, dtype=np.int64)
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        if cats.size:
            np.savetxt(fh, cats, fmt="%d")
