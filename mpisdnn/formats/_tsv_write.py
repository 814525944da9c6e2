"""Fast formatting of integer text lines (``row<TAB>col<TAB>value`` and the like) for
:func:`mpisdnn.formats.tsv.write_triples` and the projection text writers.

A numba loop (:func:`mpisdnn.formats._tsv_kernels.int_lines`, imported on first use) writes
the digits straight into a byte buffer: 60,000 official-size inputs of N=65536 are 424 M
lines, which ``np.savetxt`` (an object array, one Python format per line) can neither hold in
memory nor write in useful time.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.empty(0, np.int64)


def format_int_lines(rows, cols, vals=None, sep: str = "\t", tail: bytes = b"\n") -> bytes:
    """``row<sep>col[<sep>val]<tail>`` for each entry of the int64 columns (signed; ``vals``
    None: two columns)."""
    from ._tsv_kernels import int_lines

    rows = np.ascontiguousarray(rows, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    vals = _EMPTY if vals is None else np.ascontiguousarray(vals, dtype=np.int64)
    end = np.frombuffer(tail, dtype=np.uint8)
    # at most 20 characters per int (a sign and 19 digits), a separator after each but the last
    width = 3 if vals.size else 2
    out = np.empty(rows.size * (21 * width - 1 + end.size), dtype=np.uint8)
    used = int_lines(rows, cols, vals, np.uint8(ord(sep)), end, out)
    return out[:used].tobytes()


def format_lines(rows, cols, value: bytes) -> bytes:
    """``row\\tcol\\tvalue\\n`` for each pair (1-based ints already), all with one value text."""
    return format_int_lines(rows, cols, None, "\t", b"\t" + value + b"\n")
