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

import numpy as np
from numba import njit

#: Status codes of :func:`parse_block`.
OK, OTHER = 0, 1

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_BIG_MANTISSA = 10**15  # below 2**53: exact as a double
_ROW_LIMIT = 2**31 - 1


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
def row_counts(rows, n, counts):
    """Add the entries of each row in ``rows[:n]`` to ``counts`` (int64, one per row)."""
    for i in range(n):
        counts[rows[i]] += 1


@njit(cache=True)
def pack_by_owner(rows, cols, vals, offsets, send_counts, out, skip):
    """Records ``(row, col, bits of val)`` of one block, grouped by owning rank.

    ``offsets``: the row blocks (P + 1); ``send_counts`` (P, zeroed) gets each rank's count.
    ``out`` (n x 3 int32) receives the records, rank by rank, in file order within a rank.
    ``vals`` holds one value per entry, or one value for all (a block of equal values).
    The entries of rank ``skip`` (this rank: :func:`place_own` places them straight from
    the block) are neither packed nor counted.
    """
    n = rows.size
    nparts = offsets.size - 1
    owner = np.empty(n, dtype=np.int32)
    for i in range(n):
        r = rows[i]
        lo, hi = 0, nparts - 1
        while lo < hi:  # last block whose start is <= r (empty blocks are skipped)
            mid = (lo + hi + 1) // 2
            if offsets[mid] <= r:
                lo = mid
            else:
                hi = mid - 1
        owner[i] = lo
        send_counts[lo] += 1
    send_counts[skip] = 0
    start = np.zeros(nparts, dtype=np.int64)
    for k in range(1, nparts):
        start[k] = start[k - 1] + send_counts[k - 1]
    bits = vals.view(np.int32)
    for i in range(n):
        k = owner[i]
        if k == skip:
            continue
        j = start[k]
        out[j, 0] = rows[i]
        out[j, 1] = cols[i]
        out[j, 2] = bits[i] if bits.size == n else bits[0]
        start[k] = j + 1


@njit(cache=True)
def place_own(rows, cols, vals, row0, fill, ends, indices, data):
    """This rank's entries of one kept block (rows ``[row0, row0 + fill.size)``; the others
    are skipped) straight into its CSR at the rows' fill pointers, in file order: no
    records packed, no copy sent to itself. ``vals``: one per entry or one for all.

    Returns False (and stops) when a row is already full (a bug: see :func:`place_records`).
    """
    n = rows.size
    nrows = fill.size
    bits = vals.view(np.int32)
    one = bits.size != n
    for i in range(n):
        r = np.int64(rows[i]) - row0
        if r < 0 or r >= nrows:
            continue
        j = fill[r]
        if j >= ends[r]:
            return False
        indices[j] = cols[i]
        data[j] = bits[0] if one else bits[i]
        fill[r] = j + 1
    return True


@njit(cache=True)
def _place_flat(records, row0, fill, ends, indices, data):
    """Each record at its row's fill pointer (one loop, no helper: the same loop through an
    ``inline="always"`` helper compiled 5-10x slower, 7-10 s against 0.85 s for 35 M
    records on the loaded 2-core VM, which made routing twice the parse)."""
    n = records.shape[0]
    nrows = fill.size
    for i in range(n):
        r = records[i, 0] - row0
        if r < 0 or r >= nrows:
            return False
        j = fill[r]
        if j >= ends[r]:
            return False
        indices[j] = records[i, 1]
        data[j] = records[i, 2]
        fill[r] = j + 1
    return True


@njit(cache=True)
def place_records(records, row0, fill, ends, indices, data, tmp, direct_rows):
    """Put the received ``records`` (n x 3) into this rank's CSR at the rows' fill pointers.

    Up to ``direct_rows`` rows, one scatter. Above, two: records are first grouped by
    bands of rows (at most 128 bands, so 128 write streams), then placed band by band.
    ``tmp`` (at least n x 3 int32) holds the grouped records.

    Returns False (and stops) when a record's row is not this rank's or its row is already
    full: the counts no longer match the entries (a bug; both come from the same parse).
    """
    n = records.shape[0]
    nrows = fill.size
    if nrows <= direct_rows:
        return _place_flat(records, row0, fill, ends, indices, data)
    shift = 0
    while (nrows >> shift) > 128:
        shift += 1
    nbands = (nrows >> shift) + 1
    start = np.zeros(nbands + 1, dtype=np.int64)
    for i in range(n):
        r = records[i, 0] - row0
        if r < 0 or r >= nrows:
            return False
        start[(r >> shift) + 1] += 1
    for b in range(nbands):
        start[b + 1] += start[b]
    pos = start[:-1].copy()
    for i in range(n):
        b = (records[i, 0] - row0) >> shift
        j = pos[b]
        tmp[j, 0] = records[i, 0]
        tmp[j, 1] = records[i, 1]
        tmp[j, 2] = records[i, 2]
        pos[b] = j + 1
    return _place_flat(tmp[:n], row0, fill, ends, indices, data)


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
        order = np.argsort(indices[a:b], kind="mergesort")
        idx = indices[a:b][order]
        val = data[a:b][order]
        indices[a:b] = idx
        data[a:b] = val
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
    for i in range(n):
        c += buf[i] == 10
    return c


@njit(cache=True, nogil=True)
def parse_layer_text(buf, n, neurons, rows, cols, vals, counts):  # noqa: C901
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
            if count == 0:
                first = x32
            elif x32 != first:
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
