"""Fast formatting of ``row<TAB>col<TAB>value`` lines for :func:`mpisdnn.formats.tsv.write_triples`.

A numba loop writes the digits straight into a byte buffer: 60,000 official-size inputs of
N=65536 are 424 M lines, which ``np.savetxt`` (an object array, one Python format per line)
can neither hold in memory nor write in useful time.
"""

from __future__ import annotations

import numpy as np


def format_lines(rows, cols, value: bytes) -> bytes:
    """``row\\tcol\\tvalue\\n`` for each pair (1-based ints already), all with one value text."""
    kernel = _kernel()
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    tail = np.frombuffer(b"\t" + value + b"\n", dtype=np.uint8)
    # at most 19 digits per int, a tab, the tail
    out = np.empty(rows.size * (2 * 19 + 1 + tail.size), dtype=np.uint8)
    used = kernel(rows, cols, tail, out)
    return out[:used].tobytes()


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import numba

        @numba.njit(cache=True, nogil=True)
        def put(x, out, pos):
            # digits of x (>= 0), most significant first
            n = 1
            t = x
            while t >= 10:
                t //= 10
                n += 1
            for k in range(n - 1, -1, -1):
                out[pos + k] = 48 + x % 10
                x //= 10
            return pos + n

        @numba.njit(cache=True, nogil=True)
        def fmt(rows, cols, tail, out):
            pos = 0
            for i in range(rows.size):
                pos = put(rows[i], out, pos)
                out[pos] = 9
                pos = put(cols[i], out, pos + 1)
                for b in tail:
                    out[pos] = b
                    pos += 1
            return pos

        _KERNEL = fmt
    return _KERNEL
