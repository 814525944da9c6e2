"""Compiled pieces of the graph text readers (numba; imported lazily by ``.text``).

One grammar per separator mode, applied byte by byte (see ``.text`` for the rules):

``SEP_BYTE``   fields split at one byte (tab, comma, semicolon), nothing else;
``BLANKS``     fields split at runs of spaces and tabs, leading and trailing blanks ignored;
``COLONS``     fields split at ``::`` (MovieLens ``ratings.dat``).

A line ends at ``\\n``; one ``\\r`` before it belongs to the line ending. Lines holding only
spaces, tabs or ``\\r`` are blank and skipped. Integers are parsed exactly (int64, with the
overflow detected, never through a float); values by Clinger's fast path (at most 15
significant digits and a power of ten within 22: one exact IEEE operation gives the correctly
rounded double, as ``float()`` does) and the rest are flagged for numpy's correctly rounded
conversion.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: Separator modes.
SEP_BYTE, BLANKS, COLONS = 0, 1, 2
#: Status codes: every line parsed; a field that is not a (canonical) integer where one was
#: needed; a line with another number of fields; a value that is not a number; an id outside
#: the caller's index range (:func:`numeric_lines` with a ``limit``).
OK, TEXT, COUNT, VALUE, WIDE = 0, 1, 2, 3, 4
#: Integer field codes of :func:`int_field`.
INT_OK, INT_NOT, INT_OVERFLOW = 0, 1, 2

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_UPOW10 = np.array([10**k for k in range(20)], dtype=np.uint64)
_MAX_EXACT = np.uint64(2**53)
_U63 = np.uint64(2**63)


@njit(cache=True, inline="always")
def _blank(ch):
    return ch == 32 or ch == 9 or ch == 13


@njit(cache=True, inline="always")
def line_end(buf, p, hi):
    """Position of the ``\\n`` ending the line at ``p`` (``hi`` when the text ends first)."""
    while p < hi and buf[p] != 10:
        p += 1
    return p


@njit(cache=True, inline="always")
def content_end(buf, p, e):
    """The line ``[p, e)`` without the ``\\r`` of a CRLF ending."""
    if e > p and buf[e - 1] == 13:
        return e - 1
    return e


@njit(cache=True, inline="always")
def is_blank_line(buf, p, e):
    for q in range(p, e):
        if not _blank(buf[q]):
            return False
    return True


@njit(cache=True, inline="always")
def field_end(buf, p, e, mode, sep):
    """End of the field starting at ``p`` on the line ending at ``e``."""
    if mode == SEP_BYTE:
        while p < e and buf[p] != sep:
            p += 1
    elif mode == BLANKS:
        while p < e and not (buf[p] == 32 or buf[p] == 9):
            p += 1
    else:
        while p < e and not (buf[p] == 58 and p + 1 < e and buf[p + 1] == 58):
            p += 1
    return p


@njit(cache=True, inline="always")
def next_field(buf, p, e, mode):
    """Start of the next field after the separator at ``p`` (``-1``: the line ended)."""
    if p >= e:
        return -1
    if mode == SEP_BYTE:
        return p + 1
    if mode == BLANKS:
        while p < e and (buf[p] == 32 or buf[p] == 9):
            p += 1
        return p if p < e else -1
    return p + 2


@njit(cache=True, inline="always")
def int_field(buf, s, t, strict):
    """``(code, value)`` of the integer ``buf[s:t]``: ``-?digits``, canonical (no leading
    zero, no ``-0``) when ``strict``; ``INT_OVERFLOW`` past int64. Digits accumulate in a
    uint64 (19 digits always fit), so the overflow test is one comparison at the end, not a
    division per digit."""
    if s >= t:
        return INT_NOT, 0
    neg = buf[s] == 45
    p = s + 1 if neg else s
    if p >= t:
        return INT_NOT, 0
    if strict and buf[p] == 48 and (t - p > 1 or neg):
        return INT_NOT, 0
    u = np.uint64(0)
    nd = 0
    while p < t:
        d = np.int64(buf[p]) - 48
        if d < 0 or d > 9:
            return INT_NOT, 0
        if nd < 19:
            u = u * np.uint64(10) + np.uint64(d)
        nd += 1
        p += 1
    if nd > 19 or u > _U63 or (u == _U63 and not neg):
        # the leading zeros of a non-strict field do not count
        if nd > 19 and not strict:
            return _long_int(buf, s, t, neg)
        return INT_OVERFLOW, 0
    if neg:
        return INT_OK, -np.int64(u - np.uint64(1)) - 1
    return INT_OK, np.int64(u)


@njit(cache=True)
def _long_int(buf, s, t, neg):
    """A non-canonical integer with more than 19 digits (leading zeros): parsed again."""
    p = s + 1 if neg else s
    while p < t - 1 and buf[p] == 48:
        p += 1
    if t - p > 19:
        return INT_OVERFLOW, 0
    u = np.uint64(0)
    while p < t:
        u = u * np.uint64(10) + np.uint64(buf[p] - 48)
        p += 1
    if u > _U63 or (u == _U63 and not neg):
        return INT_OVERFLOW, 0
    if neg:
        return INT_OK, -np.int64(u - np.uint64(1)) - 1
    return INT_OK, np.int64(u)


@njit(cache=True, inline="always")
def _digits(buf, p, t, mant, sig):
    k = 0
    while p < t and 48 <= buf[p] <= 57:
        if mant or buf[p] != 48:
            sig += 1
        if sig <= 15:
            mant = mant * 10 + (buf[p] - 48)
        p += 1
        k += 1
    return mant, sig, k, p


@njit(cache=True)
def float_field(buf, s, t):  # noqa: C901 - one number grammar
    """``(code, value)`` of the number ``buf[s:t]`` (blanks around it allowed): code 0 exact,
    1 not a number, 2 a number that needs the correctly rounded slow conversion."""
    while s < t and _blank(buf[s]):
        s += 1
    while t > s and _blank(buf[t - 1]):
        t -= 1
    if s >= t:
        return 1, 0.0
    p = s
    neg = False
    if buf[p] == 45 or buf[p] == 43:
        neg = buf[p] == 45
        p += 1
    mant, sig, whole, p = _digits(buf, p, t, np.int64(0), 0)
    frac = 0
    dropped = max(sig - 15, 0)  # integer digits past 15 scale the mantissa
    if p < t and buf[p] == 46:
        mant, sig2, frac, p = _digits(buf, p + 1, t, mant, sig)
        if sig2 > 15:
            return 2 if _number_rest(buf, p, t) else 1, 0.0
        sig = sig2
    if whole == 0 and frac == 0:
        # inf / nan / other words: numpy decides (it refuses words, reads inf and nan)
        return 2 if _word_number(buf, s, t) else 1, 0.0
    e10 = 0
    if p < t and (buf[p] == 101 or buf[p] == 69):
        p += 1
        eneg = False
        if p < t and (buf[p] == 45 or buf[p] == 43):
            eneg = buf[p] == 45
            p += 1
        if p >= t or buf[p] < 48 or buf[p] > 57:
            return 1, 0.0
        while p < t and 48 <= buf[p] <= 57:
            if e10 < 100000:
                e10 = e10 * 10 + (buf[p] - 48)
            p += 1
        if eneg:
            e10 = -e10
    if p != t:
        return 1, 0.0
    if dropped:
        return 2, 0.0
    e10 -= frac
    if mant == 0:
        x = 0.0
    elif e10 > 22 or e10 < -22:
        return 2, 0.0
    elif e10 >= 0:
        x = float(mant) * _POW10[e10]
    else:
        x = float(mant) / _POW10[-e10]
    return 0, (-x if neg else x)


@njit(cache=True)
def _number_rest(buf, p, t):
    """Whether ``buf[p:t]`` is an optional exponent and nothing else (a long mantissa's tail)."""
    if p < t and (buf[p] == 101 or buf[p] == 69):
        p += 1
        if p < t and (buf[p] == 45 or buf[p] == 43):
            p += 1
        if p >= t:
            return False
        while p < t:
            if buf[p] < 48 or buf[p] > 57:
                return False
            p += 1
    return p == t


@njit(cache=True)
def _word_number(buf, s, t):
    """``inf``/``nan`` spellings (numpy converts them; the caller refuses non-finite)."""
    p = s
    if buf[p] == 45 or buf[p] == 43:
        p += 1
    n = t - p
    if n != 3 and n != 8:
        return False
    c = buf[p] | 32
    return c == 105 or c == 110  # 'i' (inf, infinity) or 'n' (nan): numpy checks the rest


@njit(cache=True, nogil=True)
def count_fields(buf, p, e, mode, sep):
    """Fields from ``p`` to the line end ``e`` (for a message about too many)."""
    k = 0
    while True:
        t = field_end(buf, p, e, mode, sep)
        k += 1
        q = next_field(buf, t, e, mode)
        if q < 0:
            return k
        p = q


@njit(cache=True, inline="always")
def after_bom(buf, p):
    """Whether ``p`` is the end of a leading UTF-8 byte-order mark: where
    ``text.data_start`` puts the first line of such a file, so a line start there."""
    return p == 3 and buf[0] == 0xEF and buf[1] == 0xBB and buf[2] == 0xBF


@njit(cache=True, nogil=True)
def first_line_at(buf, lo, hi):
    """The first line start at or after ``lo`` (a range's first whole line; the end of a
    leading byte-order mark counts, :func:`after_bom`)."""
    if lo == 0 or after_bom(buf, lo):
        return lo
    p = lo
    while p < hi and buf[p - 1] != 10 and not after_bom(buf, p):
        p += 1
    return p


@njit(cache=True, inline="always")
def _fast_uint(buf, p, hi, strict):
    """Digits at ``p`` as ``(value, digits, position after them)``; -1 digits when a
    canonical (``strict``) integer has a leading zero."""
    u = np.uint64(0)
    nd = 0
    if strict and p + 1 < hi and buf[p] == 48 and 48 <= buf[p + 1] <= 57:
        return u, -1, p
    while p < hi and 48 <= buf[p] <= 57 and nd < 19:
        u = u * np.uint64(10) + np.uint64(buf[p] - 48)
        nd += 1
        p += 1
    if p < hi and 48 <= buf[p] <= 57:
        return u, -1, p  # 20 digits or more: the general path decides
    return u, nd, p


@njit(cache=True, inline="always")
def _after_field(buf, p, hi, mode, sep, last):
    """Position of the next field after the field that ended at ``p`` (``last``: the line
    end's position after the newline); -1 when what follows is not plain."""
    if last:
        if mode == BLANKS:
            while p < hi and (buf[p] == 32 or buf[p] == 9):
                p += 1
        if p < hi and buf[p] == 13:
            p += 1
        if p >= hi:
            return hi
        return p + 1 if buf[p] == 10 else -1
    if p >= hi:
        return -1
    if mode == SEP_BYTE:
        return p + 1 if buf[p] == sep else -1
    if mode == BLANKS:
        if not (buf[p] == 32 or buf[p] == 9):
            return -1
        while p < hi and (buf[p] == 32 or buf[p] == 9):
            p += 1
        return p if p < hi and buf[p] != 10 and buf[p] != 13 else -1
    if p + 1 < hi and buf[p] == 58 and buf[p + 1] == 58:
        return p + 2
    return -1


@njit(cache=True, inline="always")
def _clinger(m, e10, neg):
    """``(ok, value)`` of ``(-1 if neg) * m * 10**e10`` when ``m <= 2**53`` and ``|e10| <=
    22``: one exact IEEE operation, the correctly rounded double (Clinger's fast path);
    ``ok`` False otherwise (the caller's slower path decides)."""
    if m > _MAX_EXACT:
        return False, 0.0
    if m == 0:
        x = 0.0
    elif e10 > 22 or e10 < -22:
        return False, 0.0
    elif e10 >= 0:
        x = float(m) * _POW10[e10]
    else:
        x = float(m) / _POW10[-e10]
    return True, (-x if neg else x)


@njit(cache=True, inline="always")
def _fast_float(buf, p, hi):
    """``(ok, value, position after)`` of a plain decimal ``-?d+(.d*)?([eE][+-]?d+)?`` whose
    digits form an integer of at most 2**53 (so exact as a double) and whose power of ten is
    within 22: one exact IEEE operation, the correctly rounded value (Clinger). Matrix
    Market's ``4.000000000000000e+00`` (16 digits, from scipy's mmwrite) qualifies."""
    neg = False
    if p < hi and buf[p] == 45:
        neg = True
        p += 1
    m = np.uint64(0)
    nd = 0
    while p < hi and 48 <= buf[p] <= 57:
        if nd >= 19:
            return False, 0.0, p
        m = m * np.uint64(10) + np.uint64(buf[p] - 48)
        nd += 1
        p += 1
    if nd == 0:
        return False, 0.0, p
    nf = 0
    if p < hi and buf[p] == 46:
        p += 1
        while p < hi and 48 <= buf[p] <= 57:
            if nd >= 19:
                return False, 0.0, p
            m = m * np.uint64(10) + np.uint64(buf[p] - 48)
            nd += 1
            nf += 1
            p += 1
    e = 0
    if p < hi and (buf[p] == 101 or buf[p] == 69):
        p += 1
        eneg = False
        if p < hi and (buf[p] == 45 or buf[p] == 43):
            eneg = buf[p] == 45
            p += 1
        if p >= hi or not (48 <= buf[p] <= 57):
            return False, 0.0, p
        while p < hi and 48 <= buf[p] <= 57:
            if e < 1000:
                e = e * 10 + (buf[p] - 48)
            p += 1
        if eneg:
            e = -e
    ok, x = _clinger(m, e - nf, neg)
    return ok, x, p


@njit(cache=True, inline="always")
def _fast_line(buf, p, hi, mode, sep, ncols, strict):
    """One plain line at ``p`` in a single pass: ``(ok, row, col, value, next line)``.
    Anything unusual (a sign, a blank line, CR inside, exponents, long numbers, a fourth
    field) returns ``ok = False`` and the general parser takes the line."""
    if mode == BLANKS:
        while p < hi and (buf[p] == 32 or buf[p] == 9):
            p += 1
    r, nd, q = _fast_uint(buf, p, hi, strict)
    if nd <= 0 or r >= _U63:
        return False, 0, 0, 0.0, p
    q = _after_field(buf, q, hi, mode, sep, False)
    if q < 0:
        return False, 0, 0, 0.0, p
    c, nd, q = _fast_uint(buf, q, hi, strict)
    if nd <= 0 or c >= _U63:
        return False, 0, 0, 0.0, p
    if ncols == 2:
        q = _after_field(buf, q, hi, mode, sep, True)
        return q >= 0, np.int64(r), np.int64(c), 0.0, q
    if ncols != 3:
        return False, 0, 0, 0.0, p
    q = _after_field(buf, q, hi, mode, sep, False)
    if q < 0:
        return False, 0, 0, 0.0, p
    ok, x, q = _fast_float(buf, q, hi)
    if not ok:
        return False, 0, 0, 0.0, p
    q = _after_field(buf, q, hi, mode, sep, True)
    return q >= 0, np.int64(r), np.int64(c), x, q


#: Bytes past a line start that :func:`_safe_line` may read (its loops are bounded: two ids
#: of at most 20 digits, a value of at most 19 digits, a sign, a point, a 4-digit exponent,
#: a line ending and one look-ahead each: under 80); lines nearer the text's end take the
#: checked :func:`_fast_line`.
SAFE_TAIL = 128


@njit(cache=True, inline="always")
def _u(buf, p):
    """``buf[p]`` by an unsigned index: no negative-index wrap-around (the caller knows
    ``0 <= p < buf.size``)."""
    return buf[np.uint64(p)]


@njit(cache=True, inline="always")
def _safe_uint(buf, p, strict):
    """:func:`_fast_uint` without bounds checks (at most 20 bytes read past ``p``)."""
    u = np.uint64(0)
    nd = 0
    ch = _u(buf, p)
    if strict and ch == 48 and 48 <= _u(buf, p + 1) <= 57:
        return u, -1, p
    while 48 <= ch <= 57:
        if nd == 19:
            return u, -1, p  # 20 digits or more: the general path decides
        u = u * np.uint64(10) + np.uint64(ch - 48)
        nd += 1
        p += 1
        ch = _u(buf, p)
    return u, nd, p


@njit(cache=True, inline="always")
def _safe_float(buf, p):  # noqa: C901 - one number grammar
    """:func:`_fast_float` without bounds checks, the same values (an exponent of more than
    4 digits goes to the checked path, which gives the same result)."""
    neg = False
    ch = _u(buf, p)
    if ch == 45:
        neg = True
        p += 1
        ch = _u(buf, p)
    m = np.uint64(0)
    nd = 0
    nf = 0
    while 48 <= ch <= 57:
        if nd == 19:
            return False, 0.0, p
        m = m * np.uint64(10) + np.uint64(ch - 48)
        nd += 1
        p += 1
        ch = _u(buf, p)
    if nd == 0:
        return False, 0.0, p
    if ch == 46:
        p += 1
        ch = _u(buf, p)
        while 48 <= ch <= 57:
            if nd == 19:
                return False, 0.0, p
            m = m * np.uint64(10) + np.uint64(ch - 48)
            nd += 1
            nf += 1
            p += 1
            ch = _u(buf, p)
    e = 0
    if ch == 101 or ch == 69:
        p += 1
        ch = _u(buf, p)
        eneg = ch == 45
        if ch == 45 or ch == 43:
            p += 1
            ch = _u(buf, p)
        ne = 0
        while 48 <= ch <= 57:
            if ne == 4:
                return False, 0.0, p
            e = e * 10 + (ch - 48)
            ne += 1
            p += 1
            ch = _u(buf, p)
        if ne == 0:
            return False, 0.0, p
        if eneg:
            e = -e
    ok, x = _clinger(m, e - nf, neg)
    return ok, x, p


@njit(cache=True, inline="always")
def _safe_line(buf, p, sep, ncols, strict):
    """:func:`_fast_line` of a line whose fields are split by exactly one ``sep`` byte and
    that ends right after its last field, without bounds checks (``p + SAFE_TAIL <=
    buf.size``): 2x faster; it accepts a subset of what :func:`_fast_line` does and gives
    the same values, so a line it refuses goes to that one."""
    r, nd, q = _safe_uint(buf, p, strict)
    if nd <= 0 or r >= _U63 or _u(buf, q) != sep:
        return False, 0, 0, 0.0, p
    c, nd, q = _safe_uint(buf, q + 1, strict)
    if nd <= 0 or c >= _U63:
        return False, 0, 0, 0.0, p
    x = 0.0
    if ncols == 3:
        if _u(buf, q) != sep:
            return False, 0, 0, 0.0, p
        ok, x, q = _safe_float(buf, q + 1)
        if not ok:
            return False, 0, 0, 0.0, p
    elif ncols != 2:
        return False, 0, 0, 0.0, p
    if _u(buf, q) == 13:
        q += 1
    if _u(buf, q) != 10:
        return False, 0, 0, 0.0, p
    return True, np.int64(r), np.int64(c), x, q + 1


@njit(cache=True)
def _plain_line(buf, p, end, mode, sep, ncols, strict):
    """:func:`_safe_line` where it may read (one-byte separators: ``sep``, or a single
    space in ``BLANKS`` mode), else or where it refuses the line :func:`_fast_line`.

    Compiled apart, not inlined into :func:`numeric_lines`: it depends only on the text's
    type, so the parser's int64 and int32 variants share it, which cut a fresh install's
    compile of the two from 45 s to 17 s for a parse about 8 % slower (0.27 against 0.25 s
    CPU per 157 MB)."""
    if mode != COLONS and p + SAFE_TAIL <= buf.size:
        ok, r, c, x, q = _safe_line(buf, p, sep if mode == SEP_BYTE else 32, ncols, strict)
        if ok:
            return ok, r, c, x, q
    return _fast_line(buf, p, end, mode, sep, ncols, strict)


@njit(cache=True, inline="always")
def _shifted(v, shift, limit):
    """``(in range, v - shift)``: whether the id less ``shift`` is in ``0..limit - 1``;
    ``(True, v)`` when ``limit`` is 0 (ids kept as they are)."""
    if limit == 0:
        return True, v
    v -= shift
    return 0 <= v < limit, v


@njit(cache=True, inline="always")
def _shifted2(r, c, shift, limit):
    """:func:`_shifted` of a row and a column id: ``(field out of range or -1, r, c)``."""
    ok_r, r = _shifted(r, shift, limit)
    ok_c, c = _shifted(c, shift, limit)
    return -1 if ok_r and ok_c else (0 if not ok_r else 1), r, c


@njit(cache=True, nogil=True)
def numeric_lines(buf, lo, hi, mode, sep, ncols, strict, rows, cols, vals, slow, shift,  # noqa: C901, PLR0913
                  limit):  # fmt: skip
    """Parse the lines starting in ``[lo, hi)`` as ``id id [value ...]`` with integer ids.

    ``ncols`` fields per line exactly; the first two integers (exact int64; canonical when
    ``strict``), the third a value (when ``ncols >= 3``; a fourth field, a ratings file's
    timestamp, must exist and is not read). Entries go to ``rows``,
    ``cols``, ``vals``; the index of every value that needs numpy's slow conversion goes to
    ``slow`` (its field start and end in ``slow[:, 1:]``). Plain lines take one pass
    (:func:`_fast_line`); the others the general field-by-field path, with the same result.
    With ``limit > 0`` the ids are stored less ``shift``, and one outside ``0..limit - 1``
    stops the parse with ``WIDE`` (so ``rows``/``cols`` may be narrower than int64: the
    collective loader parses straight into 4-byte indices); ``limit = 0`` stores them as
    they are.

    Returns
    -------
    status, entries, position, slow count, field
        ``position`` is the start of the line that stopped the parse (``status != OK``), and
        ``field`` the 0-based field at fault (or the number of fields for ``COUNT``).
    """
    p = first_line_at(buf, lo, len(buf))
    n = 0
    nslow = 0
    end = len(buf)
    while p < hi:
        ok, r, c, x, q = _plain_line(buf, p, end, mode, sep, ncols, strict)
        if ok:
            bad, r, c = _shifted2(r, c, shift, limit)
            if bad >= 0:
                return WIDE, n, p, nslow, bad
            rows[n] = r
            cols[n] = c
            if ncols >= 3:
                vals[n] = x
            n += 1
            p = q
            continue
        start = p
        e = line_end(buf, p, len(buf))
        nxt = e + 1
        e = content_end(buf, p, e)
        if is_blank_line(buf, p, e):
            p = nxt
            continue
        if mode == BLANKS:
            while p < e and (buf[p] == 32 or buf[p] == 9):
                p += 1
        k = 0
        while True:
            t = field_end(buf, p, e, mode, sep)
            if k < 2:
                code, v = int_field(buf, p, t, strict)
                if code != INT_OK:
                    return TEXT, n, start, nslow, k
                ok_v, v = _shifted(v, shift, limit)
                if not ok_v:
                    return WIDE, n, start, nslow, k
                if k == 0:
                    rows[n] = v
                else:
                    cols[n] = v
            elif k == 2:
                code, x = float_field(buf, p, t)
                if code == 1:
                    return VALUE, n, start, nslow, k
                if code == 2:
                    if nslow >= slow.shape[0]:
                        return VALUE, n, start, nslow, -1  # too many: caller goes slow
                    slow[nslow, 0] = n
                    slow[nslow, 1] = p
                    slow[nslow, 2] = t
                    nslow += 1
                vals[n] = x
            k += 1
            q = next_field(buf, t, e, mode)
            if q < 0:
                break
            if k >= ncols:
                k += count_fields(buf, q, e, mode, sep)
                break
            p = q
        if k != ncols:
            return COUNT, n, start, nslow, k
        n += 1
        p = nxt
    return OK, n, p, nslow, 0


@njit(cache=True, nogil=True)
def line_starts(buf, lo, hi):
    """Positions ``p`` in ``[lo, hi)`` (``hi <= buf.size``) that start a line: ``p == 0`` or
    ``buf[p - 1]`` a newline (the lines :func:`numeric_lines` parses for that range)."""
    if lo >= hi:
        return 0
    n = 1 if lo == 0 else 0
    if lo <= 3 < hi and after_bom(buf, 3):
        n += 1  # the first line of a file with a byte-order mark (an upper bound from 0)
    # over a slice, not by index: numba then drops the negative-index check per byte and
    # LLVM vectorises the loop (8x: 0.01 s instead of 0.08 s for 157 MB)
    for x in buf[max(lo, 1) - 1 : hi - 1]:
        n += x == 10
    return n


@njit(cache=True, nogil=True)
def count_lines(buf, lo, hi):
    """Newlines in ``buf[lo:hi]`` (an upper bound of the records there, less one)."""
    c = 0
    for x in buf[lo:hi]:  # a slice: vectorised (see line_starts)
        c += x == 10
    return c


@njit(cache=True, nogil=True)
def split_fields(buf, lo, hi, mode, sep, ncols, starts, ends, lines):  # noqa: C901
    """Field boundaries of every line starting in ``[lo, hi)``: ``starts[i, j]``,
    ``ends[i, j]`` for the ``ncols`` fields of record ``i``, ``lines[i]`` its line start.

    Returns ``(status, records, position, fields)``: ``COUNT`` at the first line with
    another number of fields (``fields`` found, counted up to ``ncols + 1``).
    """
    p = first_line_at(buf, lo, len(buf))
    n = 0
    while p < hi:
        start = p
        e = line_end(buf, p, len(buf))
        nxt = e + 1
        e = content_end(buf, p, e)
        if is_blank_line(buf, p, e):
            p = nxt
            continue
        if mode == BLANKS:
            while p < e and (buf[p] == 32 or buf[p] == 9):
                p += 1
        k = 0
        while True:
            t = field_end(buf, p, e, mode, sep)
            if k < ncols:
                starts[n, k] = p
                ends[n, k] = t
            k += 1
            q = next_field(buf, t, e, mode)
            if q < 0:
                break
            if k >= ncols:
                k += count_fields(buf, q, e, mode, sep)
                break
            p = q
        if k != ncols:
            return COUNT, n, start, k
        lines[n] = start
        n += 1
        p = nxt
    return OK, n, p, 0


@njit(cache=True, nogil=True)
def int_column(buf, starts, ends, strict, out):
    """Every field as an exact integer: ``(code, first field at fault)``; ``INT_OK`` when
    all are (canonical, with ``strict``)."""
    for i in range(starts.size):
        code, v = int_field(buf, starts[i], ends[i], strict)
        if code != INT_OK:
            return code, i
        out[i] = v
    return INT_OK, -1


@njit(cache=True, nogil=True)
def float_column(buf, starts, ends, out, slow):
    """Every field as a number: ``(status, first bad field, slow count)``; the fields that
    need numpy's slow conversion are listed in ``slow``."""
    nslow = 0
    for i in range(starts.size):
        code, x = float_field(buf, starts[i], ends[i])
        if code == 1:
            return VALUE, i, nslow
        if code == 2:
            slow[nslow] = i
            nslow += 1
        out[i] = x
    return OK, -1, nslow


@njit(cache=True, nogil=True)
def gather_fixed(buf, starts, ends, width, out):
    """Fields copied into the rows of a ``(n, width)`` byte matrix, zero padded."""
    for i in range(starts.size):
        s = starts[i]
        for j in range(ends[i] - s):
            out[i, j] = buf[s + j]


@njit(cache=True, nogil=True)
def has_byte(buf, starts, ends, byte):
    """Index of the first field holding ``byte`` (-1: none)."""
    for i in range(starts.size):
        for q in range(starts[i], ends[i]):
            if buf[q] == byte:
                return i
    return -1


@njit(cache=True, nogil=True)
def coo_to_csr(nr, rows, cols, vals, weighted, idx, val, counts):
    """Canonical CSR of triples (rows in ``0..nr-1``): columns sorted per row, repeated
    entries added in file order, zero sums dropped (a zero weight is not an edge).

    ``idx`` and ``val`` (the size of ``rows``; ``val`` empty unless ``weighted``) and
    ``counts`` (``nr + 1``, zeros) are the caller's buffers, so it chooses their pages.
    Returns ``(indptr, entries, duplicates)``: the CSR is ``indptr``, ``idx[:entries]``,
    ``val[:entries]``; ``duplicates`` counts merged entries. (The collective loader runs
    the same three steps split between the ranks of a node: :func:`scatter_rows` per rank's
    share of the triples, :func:`canonical_rows` per rank's block of rows.)
    """
    n = rows.size
    for i in range(n):
        counts[rows[i] + 1] += 1
    for r in range(nr):
        counts[r + 1] += counts[r]
    scatter_rows(rows, cols, vals, weighted, 0, counts[:-1].copy(), idx, val)
    out, dups = canonical_rows(counts, 0, nr, idx, val, weighted)
    counts[nr] = out
    return counts, out, dups


@njit(cache=True, nogil=True)
def scatter_rows(rows, cols, vals, weighted, base, fill, idx, val):
    """The counting sort's placement: entry ``i`` (ids from ``base``) goes to ``fill[rows[i]
    - base]``, which moves on (so each row keeps its entries in the order given)."""
    for i in range(rows.size):
        r = rows[i] - base
        q = fill[r]
        idx[q] = cols[i] - base
        if weighted:
            val[q] = vals[i]
        fill[r] = q + 1


@njit(cache=True, nogil=True)
def canonical_rows(indptr, r0, r1, idx, val, weighted):
    """Rows ``r0..r1-1`` of a row-sorted CSR made canonical in place: columns sorted (stable,
    so repeats add in the order given), repeats added, zero sums dropped, the kept entries
    packed from ``indptr[r0]`` on.

    ``indptr[r]`` for ``r0 <= r < r1`` becomes the row's start in the packed entries (each
    is read before it is overwritten; ``indptr[r1]`` is only read). Returns ``(end,
    duplicates)``: the packed entries end at ``end``; ``duplicates`` counts merged entries.
    """
    out = indptr[r0]
    dups = 0
    for r in range(r0, r1):
        a, b = indptr[r], indptr[r + 1]
        ordered = True
        for q in range(a + 1, b):
            if idx[q] <= idx[q - 1]:
                ordered = False
                break
        if not ordered:
            # Gathers and copies written out: numba's fancy indexing and slice assignment
            # compile 1.4 s more (their shape checks format error strings) and run no faster.
            order = np.argsort(idx[a:b], kind="mergesort")
            n = b - a
            seg_i = np.empty(n, idx.dtype)
            for k in range(n):
                seg_i[k] = idx[a + order[k]]
            for k in range(n):
                idx[a + k] = seg_i[k]
            if weighted:
                seg_v = np.empty(n, val.dtype)
                for k in range(n):
                    seg_v[k] = val[a + order[k]]
                for k in range(n):
                    val[a + k] = seg_v[k]
        q = a
        indptr[r] = out  # the row's start in the packed arrays
        while q < b:
            c = idx[q]
            w = val[q] if weighted else 1.0
            q2 = q + 1
            while q2 < b and idx[q2] == c:
                if weighted:
                    w += val[q2]
                dups += 1
                q2 += 1
            if w != 0.0:
                idx[out] = c
                if weighted:
                    val[out] = w
                out += 1
            q = q2
    return out, dups


@njit(cache=True, nogil=True)
def triple_facts(rows, cols, vals, weighted):
    """One pass over parsed triples: ``(row min, row max, column min, column max, weights
    all finite, weights all whole numbers, zero weights)`` (the extremes of an empty part
    are ``(int64 max, int64 min)``)."""
    big = np.iinfo(np.int64).max
    rlo, rhi, clo, chi = big, -big - 1, big, -big - 1
    finite, whole, zeros = True, True, 0
    for i in range(rows.size):
        r = rows[i]
        c = cols[i]
        rlo = min(rlo, r)
        rhi = max(rhi, r)
        clo = min(clo, c)
        chi = max(chi, c)
        if weighted:
            x = vals[i]
            if not np.isfinite(x):
                finite = False
            elif x != np.floor(x):
                whole = False
            if x == 0.0:
                zeros += 1
    return rlo, rhi, clo, chi, finite, whole, zeros


@njit(cache=True, nogil=True)
def mark_seen(col, lo, seen):
    """``seen[x - lo] = 1`` for every ``x`` of ``col`` (all in ``lo..lo + seen.size - 1``)."""
    for x in col:
        seen[x - lo] = 1


@njit(cache=True, nogil=True)
def row_order(rows):
    """``(non-decreasing, first, last)`` of ``rows`` (``(True, 0, -1)`` when empty): whether
    file order is already row order, so the counting sort has nothing to move."""
    if rows.size == 0:
        return True, 0, -1
    for i in range(1, rows.size):
        if rows[i] < rows[i - 1]:
            return False, rows[0], rows[-1]
    return True, rows[0], rows[-1]


@njit(cache=True, nogil=True)
def row_counts_nonzero(rows, vals, counts):
    """``counts[r] += 1`` for every entry of a non-zero weight (a zero is not an edge)."""
    for i in range(rows.size):
        if vals[i] != 0.0:
            counts[rows[i]] += 1


@njit(cache=True, nogil=True)
def scatter_nonzero(rows, cols, vals, fill, idx, val):
    """:func:`scatter_rows` (ids from 0, weighted) of the entries of non-zero weight."""
    for i in range(rows.size):
        x = vals[i]
        if x != 0.0:
            r = rows[i]
            q = fill[r]
            idx[q] = cols[i]
            val[q] = x
            fill[r] = q + 1


@njit(cache=True, nogil=True)
def mirror_counts(rows, cols, vals, weighted, counts):
    """``counts[c] += 1`` for the mirror ``(c, r)`` of every stored off-diagonal entry ``(r,
    c)`` of a symmetric file (ids from 0) whose weight is not zero."""
    for i in range(rows.size):
        if rows[i] != cols[i] and (not weighted or vals[i] != 0.0):
            counts[cols[i]] += 1


@njit(cache=True, nogil=True)
def scatter_mirrors(rows, cols, vals, weighted, sign, fill, idx, val):
    """The counting sort's placement of the mirrors ``(c, r)`` (weight ``sign * w``) of the
    off-diagonal entries of non-zero weight, in the order given."""
    for i in range(rows.size):
        r, c = rows[i], cols[i]
        if r != c and (not weighted or vals[i] != 0.0):
            q = fill[c]
            idx[q] = r
            if weighted:
                val[q] = sign * vals[i]
            fill[c] = q + 1


@njit(cache=True, nogil=True)
def row_counts(rows, base, counts):
    """``counts[r - base] += 1`` for every entry (``counts`` zeros, one per row)."""
    for r in rows:
        counts[r - base] += 1


@njit(cache=True, nogil=True)
def record_offset(buf, lo, i):
    """Start of the ``i``-th (0-based) non-blank line starting at or after ``lo``."""
    p = first_line_at(buf, lo, len(buf))
    k = 0
    while p < len(buf):
        e = line_end(buf, p, len(buf))
        if not is_blank_line(buf, p, content_end(buf, p, e)):
            if k == i:
                return p
            k += 1
        p = e + 1
    return p


@njit(cache=True, nogil=True)
def distinct_in_range(col, lo, span):
    """Distinct values of ``col``, all in ``[lo, lo + span)``."""
    seen = np.zeros(span, np.bool_)
    count = 0
    for x in col:
        j = x - lo
        if not seen[j]:
            seen[j] = True
            count += 1
    return count


@njit(cache=True, nogil=True)
def _numeric_chunk(buf, bounds, i, per, mode, sep, ncols, strict, rows, cols, vals, slow, out,  # noqa: PLR0913
                   shift, limit):  # fmt: skip
    """Chunk ``i`` of :func:`numeric_chunks` (and of its one-thread twin)."""
    o = out[i, 5]
    st, n, pos, ns, f = numeric_lines(
        buf, bounds[i], bounds[i + 1], mode, sep, ncols, strict, rows[o:], cols[o:],
        vals[o:] if vals.size else vals, slow[i * per : (i + 1) * per], shift, limit,
    )
    out[i, 0] = st
    out[i, 1] = n
    out[i, 2] = pos
    out[i, 3] = ns
    out[i, 4] = f


@njit(cache=True, nogil=True, parallel=True)
def numeric_chunks(buf, bounds, mode, sep, ncols, strict, rows, cols, vals, slow, out, shift,  # noqa: PLR0913
                   limit):  # fmt: skip
    """:func:`numeric_lines` over the chunks ``[bounds[i], bounds[i+1])`` in parallel (one
    thread each), every chunk writing from its own offset ``out[i, 5]`` (lines counted
    before, so the records land in file order). ``out[i]`` gets the chunk's ``(status,
    entries, position, slow count, field)``; ``slow`` is split evenly between the chunks;
    ``shift`` and ``limit`` as in :func:`numeric_lines`.
    """
    nch = bounds.size - 1
    per = slow.shape[0] // nch
    for i in prange(nch):  # the index cast: one _numeric_chunk for both compile passes
        _numeric_chunk(buf, bounds, np.int64(i), per, mode, sep, ncols, strict, rows, cols, vals,
                       slow, out, shift, limit)  # fmt: skip


@njit(cache=True, nogil=True, parallel=True)
def chunk_lines(buf, bounds, counts):
    """Lines starting in every chunk (exact upper bounds of their records: blank lines are
    the only lines that hold none), in parallel."""
    for i in prange(bounds.size - 1):
        counts[i] = line_starts(buf, bounds[i], bounds[i + 1])


# One thread: the same loops without prange. A process's first call of a parallel=True
# function starts numba's threading layer (0.4-0.5 s measured on the 2-core VM, against
# mmread's 0.7 s for a whole 275 MB file), which a rank of a multi-rank read never uses.
@njit(cache=True, nogil=True)
def numeric_chunks_1(buf, bounds, mode, sep, ncols, strict, rows, cols, vals, slow, out,  # noqa: PLR0913
                     shift, limit):  # fmt: skip
    """:func:`numeric_chunks` on the calling thread."""
    nch = bounds.size - 1
    per = slow.shape[0] // nch
    for i in range(nch):
        _numeric_chunk(buf, bounds, i, per, mode, sep, ncols, strict, rows, cols, vals, slow, out,
                       shift, limit)  # fmt: skip


@njit(cache=True, nogil=True)
def chunk_lines_1(buf, bounds, counts):
    """:func:`chunk_lines` on the calling thread."""
    for i in range(bounds.size - 1):
        counts[i] = line_starts(buf, bounds[i], bounds[i + 1])
