"""Compiled pieces of the parallel TSV reader (numba; imported lazily by ``tsv_parallel``).

The parser accepts only the plain form of the official files (``int<ws>int<ws>decimal``,
blank lines, CR before LF) and returns ``OTHER`` at anything else, so the caller hands that
block to the serial reader, whose checks name the exact ``file:line``. A value is converted
exactly when its decimal mantissa has at most 15 digits and its power of ten is at most 22
(Clinger's fast path: both operands are exact doubles, so one IEEE multiply or divide is the
correctly rounded result, the same double ``float()`` gives); the float32 is then rounded
from that double, as the serial reader does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._sort_kernels import sort_pairs
from ._tsv_text import MAX_ROWS

#: Status codes of :func:`parse_block`.
OK, OTHER = 0, 1

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_BIG_MANTISSA = 10**15  # below 2**53: exact as a double
_ROW_LIMIT = MAX_ROWS


@njit(cache=True, inline="always")
def _is_blank(ch):
    return ch == 32 or ch == 9 or ch == 13


@njit(cache=True, inline="always")
def _uint(buf, p, end):
    """``(value, position after the separator)`` of an integer field; value -1 if not plain."""
    v = 0
    digits = 0
    while p < end and 48 <= buf[p] <= 57:
        v = v * 10 + (buf[p] - 48)
        digits += 1
        p += 1
    if digits == 0 or digits > 12 or p == end or not (buf[p] == 9 or buf[p] == 32):
        return -1, p
    while p < end and (buf[p] == 9 or buf[p] == 32):
        p += 1
    return v, p


@njit(cache=True, inline="always")
def _mantissa_digits(buf, p, end, mant, sig):
    """The digits at ``p`` appended to ``mant``: ``(mant, significant digits, digits read,
    position after them)``; stops past 15 significant digits (no longer exact in a
    float64: the caller refuses the field)."""
    k = 0
    while p < end and 48 <= buf[p] <= 57:
        if mant or buf[p] != 48:
            sig += 1
        mant = mant * 10 + (buf[p] - 48)
        p += 1
        k += 1
        if sig > 15:
            break
    return mant, sig, k, p


@njit(cache=True, inline="always")
def _decimal(buf, p, end):  # noqa: C901
    """``(value, position of the newline or end)`` of the value field, which must end the
    line (trailing blanks allowed); position -1 when the field is not a plain decimal or
    not exact (see the module docstring)."""
    neg = False
    if p < end and (buf[p] == 45 or buf[p] == 43):
        neg = buf[p] == 45
        p += 1
    mant, sig, whole, p = _mantissa_digits(buf, p, end, 0, 0)
    if sig > 15:
        return 0.0, -1
    frac = 0
    if p < end and buf[p] == 46:
        mant, sig, frac, p = _mantissa_digits(buf, p + 1, end, mant, sig)
        if sig > 15 or frac > 40:
            return 0.0, -1
    if whole == 0 and frac == 0:
        return 0.0, -1
    e10 = 0
    if p < end and (buf[p] == 101 or buf[p] == 69):
        p += 1
        eneg = False
        if p < end and (buf[p] == 45 or buf[p] == 43):
            eneg = buf[p] == 45
            p += 1
        if p == end or buf[p] < 48 or buf[p] > 57:
            return 0.0, -1
        while p < end and 48 <= buf[p] <= 57:
            e10 = e10 * 10 + (buf[p] - 48)
            p += 1
            if e10 > 400:
                return 0.0, -1
        if eneg:
            e10 = -e10
    while p < end and _is_blank(buf[p]):
        p += 1
    if p < end and buf[p] != 10:
        return 0.0, -1
    e10 -= frac
    if mant == 0:
        x = 0.0
    elif e10 > 22 or e10 < -22:
        return 0.0, -1
    elif e10 >= 0:
        x = float(mant) * _POW10[e10]
    else:
        x = float(mant) / _POW10[-e10]
    return (-x if neg else x), p


@njit(cache=True, nogil=True)
def parse_block(buf, n, final, bounds, rows, cols, vals, line_of):  # noqa: C901, PLR0915
    """Parse the whole lines of ``buf[:n]`` into ``rows``, ``cols`` (0-based), ``vals``.

    Parameters
    ----------
    buf : uint8 array
    n : int
        Valid bytes in ``buf``.
    final : bool
        ``buf[:n]`` ends the text: a last line without a newline is parsed too.
    bounds : int64 array
        ``(nrows, ncols)``: upper bounds of the 1-based indices (``nrows`` 0: no bound).
    line_of : int64 array
        When not empty, gets each entry's line (0-based within ``buf``), to name a line.

    Returns
    -------
    status, entries, consumed, lines : int
        ``consumed`` bytes (whole lines) were parsed into ``entries`` entries; ``lines`` is the
        number of newlines in them. ``status`` is ``OTHER`` when a line needs the serial reader.
    """
    limit = n
    if not final:  # whole lines only: an unfinished last line waits for the next block
        while limit > 0 and buf[limit - 1] != 10:
            limit -= 1
    pos = 0
    count = 0
    lines = 0
    vstart = 0
    vlen = 0  # the last value field's text, buf[vstart : vstart + vlen], and its value xc
    xc = 0.0
    while pos < limit:
        start = pos
        # the strict form first (digits TAB digits TAB value: the official files), one
        # pass without the blank handling; any other line takes the general steps below.
        # Written out here: through an inline="always" helper returning the three numbers
        # the loop ran at 680-900 MB/s instead of 1250-1300 (numba 0.6x, measured)
        p = pos
        r = 0
        while p < limit:
            d = np.int64(buf[p]) - 48
            if d < 0 or d > 9:
                break
            r = r * 10 + d
            p += 1
        strict = p > pos and p - pos <= 12 and p < limit and buf[p] == 9
        c = 0
        if strict:
            p += 1
            q = p
            while p < limit:
                d = np.int64(buf[p]) - 48
                if d < 0 or d > 9:
                    break
                c = c * 10 + d
                p += 1
            strict = p > q and p - q <= 12 and p + 1 < limit and buf[p] == 9
            strict = strict and not _is_blank(buf[p + 1])
            p += 1
        if not strict:
            p = pos
            while p < limit and _is_blank(buf[p]):
                p += 1
            if p == limit or buf[p] == 10:  # blank line
                lines += p < limit
                pos = p + 1
                continue
            # two positive integers, each followed by tabs or spaces
            r, p = _uint(buf, p, limit)
            if r < 0:
                return OTHER, count, start, lines
            c, p = _uint(buf, p, limit)
            if c < 0:
                return OTHER, count, start, lines
        if r < 1 or c < 1 or r > _ROW_LIMIT or c > bounds[1] or (bounds[0] > 0 and r > bounds[0]):
            return OTHER, count, start, lines
        # a value whose text repeats the last one's has its value (the files' 1s, 0.0625s)
        j = 0
        if vlen > 0:
            while j < vlen and p + j < limit and buf[p + j] == buf[vstart + j]:
                j += 1
        if vlen > 0 and j == vlen and (p + j == limit or buf[p + j] == 10):
            x = xc
            p += j
        else:
            x, e = _decimal(buf, p, limit)
            if e < 0:
                return OTHER, count, start, lines
            vstart, vlen, xc = p, e - p, x
            p = e
        rows[count] = r - 1
        cols[count] = c - 1
        vals[count] = np.float32(x)
        if line_of.size:
            line_of[count] = lines
        count += 1
        lines += p < limit
        pos = p + 1
    return OK, count, min(pos, limit), lines


@njit(cache=True)
def band_counts(rows, counts, shift, bands, bits):
    """One block's entries per row added to ``counts`` and per band of rows (``row >> shift``)
    to ``bands[band + 1]``; returns whether every value (``bits``: their int32 bits, one per
    entry) has the bits of the first.

    Consecutive entries of one row or one band are counted in a register and added once:
    a counter in memory incremented back to back waits on its own store (the column-ordered
    files put tens of entries of a band in a row; a row-ordered file, a whole row).
    """
    same = True
    n = rows.size
    if n == 0:
        return same
    pr = rows[0]
    pb = pr >> shift
    rc = 0
    bc = 0
    first = bits[0]
    for i in range(n):
        r = rows[i]
        if r != pr:
            counts[pr] += rc
            pr = r
            rc = 0
        rc += 1
        b = r >> shift
        if b != pb:
            bands[pb + 1] += bc
            pb = b
            bc = 0
        bc += 1
        if bits[i] != first:
            same = False
    counts[pr] += rc
    bands[pb + 1] += bc
    return same


@njit(cache=True)
def band_scatter(rows, cols, bits, shift, pos, keys, kept_bits):
    """One block's entries as keys ``row << h | col`` (``h``: half the key's bits) grouped
    by band of rows (``row >> shift``), in file order within a band; ``pos`` (one per band,
    int64): each band's first place, advanced as it fills. ``kept_bits`` (empty: the block's
    values are all one) gets the values' bits in the same order.

    A band is a few hundred rows, so the routing's later scatter of one band into the CSR
    writes as many cache lines as fit in L1 (see ``tsv_parallel.BAND_ROWS``); the bands
    themselves are few enough write streams for this pass to stay cheap.
    """
    with_vals = kept_bits.size > 0
    ks = np.uint64(keys.itemsize * 4)
    pb = np.int64(-1)
    j = np.int64(0)
    for i in range(rows.size):
        r = rows[i]
        b = np.int64(r >> shift)
        if b != pb:  # a run of one band: its place stays in a register
            if pb >= 0:
                pos[pb] = j
            j = pos[b]
            pb = b
        keys[j] = (np.uint64(r) << ks) | np.uint64(cols[i])
        if with_vals:
            kept_bits[j] = bits[i]
        j += 1
    if pb >= 0:
        pos[pb] = j


@njit(cache=True)
def owner_cuts(keys, bits, bands, shift, offsets, cuts, tmp_keys, tmp_bits):
    """Where each rank's entries start in a band-grouped block (``cuts``, P + 1, int64).

    Bands whose rows all belong to one rank need nothing; a band that a row block boundary
    ``B = offsets[k]`` cuts is partitioned stably (rows < B first; file order kept on both
    sides), so every rank's entries are one contiguous run. ``bits``: one value's bits per
    entry (moved along) or one for all; ``tmp_keys``, ``tmp_bits``: room for one band.
    """
    n = keys.size
    nb = bands.size - 1
    nparts = offsets.size - 1
    ks = np.uint64(keys.itemsize * 4)
    per_entry = bits.size == n and n > 1
    cuts[0] = 0
    cuts[nparts] = n
    last_band = np.int64(-1)
    lo = np.int64(0)
    for k in range(1, nparts):
        row = np.int64(offsets[k])
        b = row >> shift
        if b >= nb:
            cuts[k] = n
            continue
        if row == (b << shift):
            cuts[k] = bands[b]
            continue
        if b != last_band:
            lo = bands[b]
            last_band = b
        hi = bands[b + 1]
        # stable partition of [lo, hi) by row < row: the first kept in place, the rest
        # through tmp
        w = lo
        t = 0
        for i in range(lo, hi):
            key = keys[i]
            if np.int64(np.uint64(key) >> ks) < row:
                keys[w] = key
                if per_entry:
                    bits[w] = bits[i]
                w += 1
            else:
                tmp_keys[t] = key
                if per_entry:
                    tmp_bits[t] = bits[i]
                t += 1
        for i in range(t):
            keys[w + i] = tmp_keys[i]
            if per_entry:
                bits[w + i] = tmp_bits[i]
        cuts[k] = w
        lo = w  # the next boundary in this band partitions what is left of it


@njit(cache=True)
def place_keys(keys, bits, row0, fill, indices, data, with_data):
    """Each entry (key ``row << h | col``, ``h``: half the key's bits) at its row's fill
    pointer in this rank's CSR (rows ``[row0, row0 + fill.size)``), in the order given; its
    value's bits too when ``with_data`` (``bits``: one per entry or one for all).

    Returns False (and stops) at an entry outside this rank's rows or past the CSR's end:
    the counts no longer match the entries (a bug; both come from the same parse). A row
    filled past its count spills into the next row, so the caller compares every fill
    pointer with its row's end once all rounds are placed.
    """
    n = keys.size
    nnz = indices.size
    nrows = fill.size
    ks = np.uint64(keys.itemsize * 4)
    mask = (np.uint64(1) << ks) - np.uint64(1)
    one = bits.size != n
    for i in range(n):
        key = np.uint64(keys[i])
        r = np.int64(key >> ks) - row0
        if r < 0 or r >= nrows:
            return False
        j = fill[r]
        if j >= nnz:
            return False
        indices[j] = np.int32(key & mask)
        if with_data:
            data[j] = bits[0] if one else bits[i]
        fill[r] = j + 1
    return True


@njit(cache=True)
def sort_rows(indptr, indices, data):
    """Sort each row's columns (ascending, stable) and return the first duplicate.

    Returns ``(row, col)`` local row and column of a repeated entry, or ``(-1, -1)``.
    """
    nrows = indptr.size - 1
    for r in range(nrows):
        a, b = indptr[r], indptr[r + 1]
        ordered = True
        for j in range(a + 1, b):
            if indices[j] <= indices[j - 1]:
                ordered = False
                break
        if ordered:
            continue
        idx = indices[a:b]
        sort_pairs(idx, data[a:b])
        for j in range(1, b - a):
            if idx[j] == idx[j - 1]:
                return r, idx[j]
    return -1, -1


@njit(cache=True, inline="always")
def _put_int(x, out, pos):
    """Decimal digits of ``x`` (``-`` first when negative) at ``out[pos:]``; returns the
    position after them."""
    if x < 0:
        out[pos] = 45
        pos += 1
        x = -x
    n = 1
    t = x
    while t >= 10:
        t //= 10
        n += 1
    for k in range(n - 1, -1, -1):
        out[pos + k] = 48 + x % 10
        x //= 10
    return pos + n


@njit(cache=True, nogil=True)
def int_lines(rows, cols, vals, sep, tail, out):
    """``row<sep>col[<sep>val]<tail>`` for every entry into ``out`` (room for 20 bytes an
    int, the separators and the tail); no value column when ``vals`` is empty. Returns the
    bytes written."""
    pos = 0
    with_vals = vals.size > 0
    for i in range(rows.size):
        pos = _put_int(rows[i], out, pos)
        out[pos] = sep
        pos = _put_int(cols[i], out, pos + 1)
        if with_vals:
            out[pos] = sep
            pos = _put_int(vals[i], out, pos + 1)
        for b in tail:
            out[pos] = b
            pos += 1
    return pos


@njit(cache=True, nogil=True)
def count_newlines(buf, n):
    """Newlines in ``buf[:n]`` (a block another rank parses: its lines still count)."""
    c = 0
    for x in buf[:n]:  # over a slice, not by index: vectorised (8x: no wrap-around check)
        c += x == 10
    return c


@njit(cache=True, nogil=True)
def parse_layer_text(buf, n, neurons, rows, cols, vals, counts):  # noqa: C901, PLR0915
    """One layer file's whole text ``buf[:n]`` (``row<TAB>col<TAB>value`` lines, 1-based,
    indices at most ``neurons``) into ``rows``, ``cols`` (0-based), ``vals``, with each
    column's entries added to ``counts`` (int64, N, zeroed by the caller).

    Only the strict form the challenge and the generator write (one tab between fields, a
    newline after each line but perhaps the last; the value as :func:`parse_block` takes it)
    is accepted: anything else returns ``OTHER`` and the caller parses the file again with
    :func:`parse_block` / the serial reader, which name the line. A value whose text repeats
    the previous line's (the official files: every weight ``6.250000e-02``) is not parsed
    again: equal text, equal value.

    Returns
    -------
    status, entries, ordered, uniform
        ``ordered``: entries strictly ascending by (column, row), the official order (no
        sort needed, no duplicate possible); ``uniform``: every value equal (same float32).
    """
    pos = 0
    count = 0
    prev_key = -1
    ordered = True
    uniform = True
    vstart = 0
    vlen = 0  # the previous value field's text: buf[vstart : vstart + vlen]
    x32 = np.float32(0.0)
    first = np.float32(0.0)
    first_neg = False
    while pos < n:
        r = 0
        p = pos
        while p < n:
            d = np.int64(buf[p]) - 48
            if d < 0 or d > 9:
                break
            r = r * 10 + d
            p += 1
        if p == pos or p - pos > 10 or p >= n or buf[p] != 9:
            return OTHER, count, ordered, uniform
        p += 1
        q = p
        c = 0
        while p < n:
            d = np.int64(buf[p]) - 48
            if d < 0 or d > 9:
                break
            c = c * 10 + d
            p += 1
        if p == q or p - q > 10 or p >= n or buf[p] != 9:
            return OTHER, count, ordered, uniform
        p += 1
        if r < 1 or c < 1 or r > neurons or c > neurons:
            return OTHER, count, ordered, uniform
        j = 0
        if vlen > 0:
            while j < vlen and p + j < n and buf[p + j] == buf[vstart + j]:
                j += 1
        if j == vlen and vlen > 0 and (p + j == n or buf[p + j] == 10):
            p += j
        else:
            x, e = _decimal(buf, p, n)
            if e < 0:
                return OTHER, count, ordered, uniform
            vstart = p
            vlen = e - p
            x32 = np.float32(x)
            neg = math.copysign(1.0, x) < 0  # the bits, not ==: 0 and -0 are two values
            if count == 0:
                first, first_neg = x32, neg
            elif x32 != first or neg != first_neg:
                uniform = False
            p = e
        key = (c - 1) * neurons + (r - 1)
        if key <= prev_key:
            ordered = False
        prev_key = key
        rows[count] = r - 1
        cols[count] = c - 1
        vals[count] = x32
        counts[c - 1] += 1
        count += 1
        pos = p + 1
    return OK, count, ordered, uniform
