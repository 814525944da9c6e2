"""Digit-like 0/1 input images, a stand-in for the challenge's ``sparse-images-{N}.tsv``.

The official inputs are MNIST digits on a sqrt(N) x sqrt(N) canvas (about 106 non-zeros per
row at N=1024, four times as many per size step). We draw hand-written-looking digits as
strokes along jittered polyline/arc templates on a 32 x 32 canvas (spatially correlated ink,
not uniform noise), then scale them up by nearest-neighbour for larger N, which keeps the
density ratio of the official files.

Which inputs survive the challenge networks depends on how much ink they concentrate: the
first RadiX-Net block sums each input over residue classes of its pixel index, so a row keeps
activity only when its strokes are thick enough to beat the bias layer after layer. The
stroke-width mix below is calibrated (``scripts/calibrate_inputs.py``, numbers in
``data/README.md``) so that 60,000 inputs give about the official 1,812 survivors at N=1024,
L=120, and, with a share of bold digits set per N, the official counts at 16384 and 65536:
most digits are thin (ones and sevens the thinnest, as in MNIST), ones and fours a little
larger, and a few percent are bold.

Rows are drawn in fixed blocks of :data:`BLOCK` rows, block ``k`` from its own generator
seeded by ``(seed, k)``, so any row range can be generated alone (by one rank, or streamed)
and gives the same rows as the whole set.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError

__all__ = [
    "digit_images",
    "digit_rows",
    "bold_share_for",
    "BASE_SIDE",
    "BLOCK",
    "BOLD_SHARE",
    "BOLD_SHARES",
]

#: Canvas side of the drawn digits before up-scaling (N=1024).
BASE_SIDE = 32
#: Rows per independently seeded block.
BLOCK = 4096
_POINTS = 120

#: Range of the digits' width as a share of the canvas, per digit 0-9 (ones and fours, whose
#: long vertical strokes decide survival at large N, slightly larger).
SIZE = np.array([[0.6, 0.85]] * 10)
SIZE[[1, 4]] = (0.65, 0.9)
#: Stroke radius range (pixels of the 32 x 32 canvas) of ordinary digits, per digit 0-9.
THIN_RADIUS = np.array(
    [
        [1.1, 1.5],
        [0.7, 1.1],
        [1.1, 1.5],
        [1.1, 1.5],
        [0.7, 1.1],
        [1.1, 1.5],
        [1.1, 1.5],
        [0.7, 1.1],
        [0.8, 1.2],
        [0.7, 1.1],
    ]
)
#: Stroke radius range of bold digits.
BOLD_RADIUS = (1.7, 2.3)
#: Share of bold digits at N=1024 (the calibrated default there).
BOLD_SHARE = 0.0386
#: Calibrated share of bold digits per N, on 60,000 inputs and the seed-1 networks (official
#: at N=1024): bold digits survive less at larger N (larger bias) and thin ones more, and
#: one share left N=16384 at 1,801 survivors (official 1,918) and N=65536 at 2,133 (1,994).
#: Other N interpolate linearly in log N (``bold_share_for``).
BOLD_SHARES = {1024: BOLD_SHARE, 16384: 0.0415, 65536: 0.0343}


def _arc(cx, cy, rx, ry, a0, a1, n=40):
    t = np.linspace(a0, a1, n)
    return np.column_stack([cx + rx * np.cos(t), cy + ry * np.sin(t)])


def _line(x0, y0, x1, y1, n=20):
    t = np.linspace(0.0, 1.0, n)[:, None]
    return np.array([x0, y0]) * (1 - t) + np.array([x1, y1]) * t


_PI = np.pi
_TEMPLATES = {
    0: [_arc(0.5, 0.5, 0.27, 0.38, 0, 2 * _PI, 60)],
    1: [_line(0.52, 0.12, 0.52, 0.88), _line(0.52, 0.12, 0.38, 0.26, 8)],
    2: [
        _arc(0.5, 0.33, 0.25, 0.21, -_PI, 0.25 * _PI),
        _line(0.68, 0.48, 0.25, 0.86),
        _line(0.25, 0.86, 0.78, 0.86),
    ],
    3: [
        _arc(0.48, 0.31, 0.24, 0.19, -0.9 * _PI, 0.5 * _PI),
        _arc(0.48, 0.68, 0.27, 0.19, -0.5 * _PI, 0.9 * _PI),
    ],
    4: [
        _line(0.64, 0.12, 0.22, 0.62),
        _line(0.22, 0.62, 0.82, 0.62),
        _line(0.64, 0.12, 0.64, 0.88),
    ],
    5: [
        _line(0.74, 0.13, 0.33, 0.13, 12),
        _line(0.33, 0.13, 0.3, 0.46, 12),
        _arc(0.48, 0.64, 0.26, 0.23, -0.75 * _PI, 0.8 * _PI),
    ],
    6: [
        _arc(0.62, 0.5, 0.32, 0.38, -0.55 * _PI, -1.0 * _PI),
        _arc(0.5, 0.66, 0.22, 0.21, 0, 2 * _PI),
    ],
    7: [_line(0.22, 0.14, 0.78, 0.14), _line(0.78, 0.14, 0.42, 0.88)],
    8: [_arc(0.5, 0.31, 0.2, 0.18, 0, 2 * _PI), _arc(0.5, 0.68, 0.24, 0.2, 0, 2 * _PI)],
    9: [_arc(0.5, 0.33, 0.22, 0.2, 0, 2 * _PI), _line(0.72, 0.35, 0.6, 0.88)],
}


def _resample(strokes, n=_POINTS):
    """``n`` points spread evenly by arc length over a digit's strokes."""
    pts = np.concatenate(strokes)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    # Jumps between strokes are not ink.
    breaks = np.cumsum([len(s) for s in strokes])[:-1] - 1
    seg[breaks] = 0.0
    s = np.concatenate(([0.0], np.cumsum(seg)))
    t = np.linspace(0.0, s[-1], n)
    return np.column_stack([np.interp(t, s, pts[:, 0]), np.interp(t, s, pts[:, 1])])


_SHAPES = np.stack([_resample(_TEMPLATES[d]) for d in range(10)])  # (10, P, 2)


def _draw(rng, digits, radius, side):
    """Draw ``digits`` with stroke ``radius`` (pixels) on a ``side x side`` canvas (0/1 CSR)."""
    count = digits.size
    pts = _SHAPES[digits] - 0.5  # (B, P, 2) centred
    ang = rng.normal(0.0, 0.15, count)
    shear = rng.normal(0.0, 0.15, count)
    sx = rng.uniform(SIZE[digits, 0], SIZE[digits, 1])
    sy = sx * rng.uniform(0.9, 1.1, count)
    c, s = np.cos(ang), np.sin(ang)
    a11, a12 = c * sx, (-s + shear * c) * sy
    a21, a22 = s * sx, (c + shear * s) * sy
    x = a11[:, None] * pts[..., 0] + a12[:, None] * pts[..., 1]
    y = a21[:, None] * pts[..., 0] + a22[:, None] * pts[..., 1]
    # Smooth wobble along the stroke, like a hand.
    phase = rng.uniform(0, 2 * np.pi, (count, 2))
    t = np.linspace(0, 2 * np.pi, pts.shape[1])
    x += 0.02 * np.sin(2 * t[None, :] + phase[:, :1])
    y += 0.02 * np.sin(3 * t[None, :] + phase[:, 1:])
    shift = rng.normal(0.0, 0.04, (count, 2))
    px = (x + 0.5 + shift[:, :1]) * side
    py = (y + 0.5 + shift[:, 1:]) * side
    r = np.broadcast_to(np.asarray(radius, dtype=float), (count,))
    # Thin and bold digits are rasterised apart: each with a window just wide enough.
    reach = np.ceil(r).astype(np.int64) + 1
    parts = [
        _raster(px[reach == w], py[reach == w], r[reach == w], w, side) for w in np.unique(reach)
    ]
    ids = [np.flatnonzero(reach == w) for w in np.unique(reach)]
    img = np.concatenate([ids[k][a] for k, (a, _) in enumerate(parts)] or [np.zeros(0, int)])
    pix = np.concatenate([b for _, b in parts] or [np.zeros(0, np.int64)])
    m = sp.coo_matrix(
        (np.ones(img.size, dtype=np.float32), (img, pix)), shape=(count, side * side)
    ).tocsr()
    m.data[:] = 1.0  # duplicates were summed
    return m


def _raster(px, py, r, reach, side):
    """Canvas pixels within ``r`` of each stroke point: (digit index, pixel index) pairs,
    sorted, each once.

    One pass per window offset over all points (the same float operations as testing every
    window cell of every point at once, so the same pixels), marking a dense boolean canvas:
    half the time of the (digits, points, window, window) arrays it replaces, whose pairs
    were mostly duplicates summed away later.
    """
    count = px.shape[0]
    canvas = np.zeros((count, side * side), dtype=bool)
    fx, fy = np.floor(px), np.floor(py)
    r2 = (r**2)[:, None]
    rows = np.broadcast_to(np.arange(count)[:, None], px.shape)
    for ox in range(-reach, reach + 1):
        cx = fx + ox
        dx2 = (cx + 0.5 - px) ** 2
        inx = (cx >= 0) & (cx < side)
        for oy in range(-reach, reach + 1):
            cy = fy + oy
            ok = (dx2 + (cy + 0.5 - py) ** 2 <= r2) & inx & (cy >= 0) & (cy < side)
            canvas[rows[ok], (cy[ok] * side + cx[ok]).astype(np.int64)] = True
    img, pix = np.nonzero(canvas)
    return img, pix.astype(np.int64)


def _upscale(m, side, factor):
    """Nearest-neighbour up-scaling of flattened ``side x side`` images by ``factor``."""
    if factor == 1:
        return m
    coo = m.tocoo()
    r, c = np.divmod(coo.col, side)
    big = side * factor
    d = np.arange(factor)
    rr = (r[:, None, None] * factor + d[None, :, None]).repeat(factor, axis=2)
    cc = (c[:, None, None] * factor + d[None, None, :]).repeat(factor, axis=1)
    cols = (rr * big + cc).reshape(coo.col.size, -1)
    rows = np.repeat(coo.row, factor * factor)
    out = sp.csr_matrix(
        (np.ones(rows.size, dtype=np.float32), (rows, cols.ravel())), shape=(m.shape[0], big * big)
    )
    out.sort_indices()
    return out


def _radii(rng, digits, bold_share):
    """Stroke radius per digit: thin per-digit ranges, a ``bold_share`` of bold ones."""
    u = rng.random(digits.size)
    bold = rng.random(digits.size) < bold_share
    lo, hi = THIN_RADIUS[digits, 0], THIN_RADIUS[digits, 1]
    b_lo, b_hi = BOLD_RADIUS
    return np.where(bold, b_lo + (b_hi - b_lo) * u, lo + (hi - lo) * u)


def _block(seed, k, rows, factor, bold_share):
    rng = np.random.default_rng([seed, k])
    digits = rng.integers(0, 10, BLOCK)
    radius = _radii(rng, digits, bold_share)
    # The whole block is drawn, then sliced: a row depends on its block only.
    small = _draw(rng, digits, radius, BASE_SIDE)[rows]
    return _upscale(small, BASE_SIDE, factor)


def bold_share_for(neurons: int) -> float:
    """The calibrated bold share at ``neurons`` (:data:`BOLD_SHARES`, interpolated in log N,
    the nearest end beyond them)."""
    ns = sorted(BOLD_SHARES)
    x = np.log2(max(int(neurons), 1))
    return float(np.interp(x, np.log2(ns), [BOLD_SHARES[k] for k in ns]))


#: Bytes per row while a row of the inputs is made: ~110 non-zeros per 1024 neurons (more
#: for bold digits), 8 bytes each, about 3 copies while drawing, upscaling and stacking.
BYTES_PER_ROW_PER_1024 = 110 * 8 * 3


def _check_memory(count: int, neurons: int) -> None:
    """Refuse inputs that would not fit the memory available now, before making any."""
    from ..formats._validate import check_memory

    need = BYTES_PER_ROW_PER_1024 * (neurons / 1024) * count
    check_memory(need, f"{count} inputs of {neurons} neurons")


def digit_images(
    count: int, neurons: int, seed: int = 0, start: int = 0, bold_share: float | None = None
) -> sp.csr_matrix:
    """Rows ``[start, start + count)`` of the digit-like 0/1 input set for ``seed``.

    Parameters
    ----------
    count : int
        Number of inputs (60,000 like the official files).
    neurons : int
        N; must be a square ``(32 * 2**j) ** 2`` (1024, 4096, 16384, 65536, ...).
    seed : int
    start : int
        First row: a row range gives the same rows as slicing the whole set, so ranks or a
        stream can each generate their own part.
    bold_share : float, optional
        Share of bold digits in [0, 1] (default: the share calibrated for ``neurons``,
        :func:`bold_share_for`).

    Returns
    -------
    scipy.sparse.csr_matrix
        ``count x N`` float32, all values 1, sorted column indices.
    """
    side = int(round(np.sqrt(neurons)))
    if side * side != neurons or side % BASE_SIDE or (side // BASE_SIDE) & (side // BASE_SIDE - 1):
        raise UsageError(f"inputs need N = (32 * 2**j)**2 (1024, 4096, ...), got {neurons}")
    if count < 0 or start < 0:
        raise UsageError(f"count and start must be >= 0, got {count}, {start}")
    if bold_share is None:
        bold_share = bold_share_for(neurons)
    if not 0.0 <= bold_share <= 1.0:
        raise UsageError(f"bold share must be in [0, 1], got {bold_share}")
    _check_memory(count, neurons)
    factor = side // BASE_SIDE
    parts = []
    stop = start + count
    for k in range(start // BLOCK, -(-stop // BLOCK)):
        lo, hi = max(start, k * BLOCK) - k * BLOCK, min(stop, (k + 1) * BLOCK) - k * BLOCK
        parts.append(_block(seed, k, slice(lo, hi), factor, bold_share))
    if not parts:
        return sp.csr_matrix((0, neurons), dtype=np.float32)
    out = sp.vstack(parts, format="csr").astype(np.float32, copy=False)
    out.sort_indices()
    return out


def digit_rows(rows, neurons: int, seed: int = 0, bold_share: float | None = None) -> sp.csr_matrix:
    """The given rows (0-based, any order) of the set :func:`digit_images` draws for ``seed``.

    Each needed block is drawn once and only its wanted rows are scaled up, so a sample of
    rows spread over 60,000 costs a few block draws, not a set (used to check a run's
    categories on sampled rows against the reference).
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return sp.csr_matrix((0, neurons), dtype=np.float32)
    if rows.min() < 0:
        raise UsageError(f"rows must be >= 0, got {rows.min()}")
    side = int(round(np.sqrt(neurons)))
    digit_images(0, neurons)  # validates N
    share = bold_share_for(neurons) if bold_share is None else bold_share
    parts, order = [], []
    for k in np.unique(rows // BLOCK):
        mine = np.flatnonzero(rows // BLOCK == k)
        parts.append(_block(seed, int(k), rows[mine] - k * BLOCK, side // BASE_SIDE, share))
        order.append(mine)
    out = sp.vstack(parts, format="csr")[np.argsort(np.concatenate(order))]
    out = sp.csr_matrix(out, dtype=np.float32)
    out.sort_indices()
    return out
