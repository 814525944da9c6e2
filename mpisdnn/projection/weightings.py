"""The projection's weightings, one record each: what the kernel computes for it, what it
reads, how it is stored and what its diagonal is.

:data:`WEIGHTINGS` (name -> :class:`Weighting`) is the one list: the options validate
against it, the driver dispatches the kernel through it, the command line offers its keys.
A new weighting is one record here (:func:`register`) plus its test; the numba kernels
keep dispatching on the integer :attr:`Weighting.mode` (no Python objects in nopython
code), so a weighting whose per-entry formula is new also needs a kernel mode.
Formulas: docs/projection.md.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

__all__ = [
    "Weighting",
    "WEIGHTINGS",
    "SYMMETRIC_WEIGHTINGS",
    "COUNTING_MODES",
    "register",
    "factors",
    "diagonal_count",
]

# The kernel modes (mpisdnn/projection/_kernels.py: COUNT ... BCOSINE, in this order). Kept
# here as plain ints so that the options and the command line need not import numba.
COUNT, RATIO, JACCARD, OVERLAP, PRODUCT, NEWMAN, HIVE, COSINE, BCOSINE = range(9)
#: Kernel modes that accumulate integer counts (the others accumulate float64 sums).
COUNTING_MODES = (COUNT, RATIO, JACCARD, OVERLAP, BCOSINE)


@dataclass(frozen=True)
class Weighting:
    """One weighting of ``H[u, v]`` (``B`` is the oriented ``m x n`` input, ``N(u)`` the
    neighbours of ``u``, ``c`` the count of shared neighbours).

    Attributes
    ----------
    name : str
        The ``weight=`` / ``--weight`` value.
    mode : int
        The kernel's per-entry formula (one of the modes above).
    diagonal : callable
        ``diagonal(b, deg, kfac, nrm) -> float64 array``: ``H[u, u]`` in closed form (the
        report counts self-loops whether the kernel visits the diagonal or not).
    symmetric : bool
        ``H[u, v] == H[v, u]`` (``triangle="upper"``, symmetric storage, upper top-k).
    binary_mode : int or None
        The mode used when every input weight is 1 (cosine: integer counts, same bits).
    reads_values : bool
        The kernel reads ``B``'s weights (else only its pattern).
    squares : bool
        :func:`factors` computes ``sum_k B[k, u]^2`` per column for :attr:`norms`.
    per_k : callable or None
        ``per_k(b) -> float64 array``: a factor per input row ``k`` (newman).
    norms : callable or None
        ``norms(deg, squares) -> float64 array``: a norm per output column (cosine).
    counts : bool
        The weight is the count itself: stored as integers (uint16 in HDF5 where it fits).
    positive : bool
        Needs positive input weights (hive: ``A[k,u] + A[k,v] > 0``).
    float_range : bool
        Sums of products of weights: refused before computing where they overflow float64.
    """

    name: str
    mode: int
    diagonal: Callable
    symmetric: bool = True
    binary_mode: int | None = None
    reads_values: bool = False
    squares: bool = False
    per_k: Callable | None = None
    norms: Callable | None = None
    counts: bool = False
    positive: bool = False
    float_range: bool = False

    def kernel_mode(self, b) -> int:
        """The kernel mode for the oriented input ``b`` (:attr:`binary_mode` where every
        weight is 1)."""
        if self.binary_mode is not None and np.all(b.data == 1):
            return self.binary_mode
        return self.mode


def _squares(b, n):
    """``sum_k B[k, u]^2`` per column ``u``, added in ascending ``k`` like the kernel's
    diagonal (in CSR order), so ``H[u, u]`` of cosine is the kernel's value."""
    from . import _kernels as K

    return K.axis_sums(b.indptr, b.indices, b.data, n, True, True)[1]


def _newman_per_k(b):
    deg_k = np.diff(b.indptr)
    return np.where(deg_k > 1, 1.0 / np.maximum(deg_k - 1, 1), 0.0)


def _newman_diagonal(b, d, kfac, nrm):
    # sum over the neighbours k of u of 1 / (deg(k) - 1)
    rows = np.repeat(np.arange(b.shape[0]), np.diff(b.indptr))
    return np.bincount(b.indices, weights=kfac[rows], minlength=d.size)


def _cosine_diagonal(b, d, kfac, nrm):
    # the kernel's value: the sum of squares over the square of its root, not always 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return _squares(b, d.size) / (nrm * nrm)


#: The weightings by name, in the order the command line lists them.
WEIGHTINGS: dict[str, Weighting] = {}


def register(w: Weighting) -> Weighting:
    """Add ``w`` to :data:`WEIGHTINGS` (a name is registered once)."""
    if w.name in WEIGHTINGS:
        raise ValueError(f"weighting {w.name!r} is already registered")
    WEIGHTINGS[w.name] = w
    return w


for _w in (
    Weighting("count", COUNT, lambda b, d, kfac, nrm: d, counts=True),
    Weighting("product", PRODUCT, lambda b, d, kfac, nrm: _squares(b, d.size),
              reads_values=True, float_range=True),
    Weighting("ratio", RATIO, lambda b, d, kfac, nrm: d / max(b.shape[0], 1)),
    Weighting("jaccard", JACCARD, lambda b, d, kfac, nrm: np.ones_like(d)),
    Weighting("overlap", OVERLAP, lambda b, d, kfac, nrm: np.ones_like(d)),
    Weighting("newman", NEWMAN, _newman_diagonal, per_k=_newman_per_k),
    Weighting("cosine", COSINE, _cosine_diagonal, binary_mode=BCOSINE, reads_values=True,
              squares=True, norms=lambda deg, sq: np.sqrt(sq), float_range=True),
    Weighting("hive", HIVE, lambda b, d, kfac, nrm: d / 2, symmetric=False,
              reads_values=True, positive=True),
):  # fmt: skip
    register(_w)


class _Symmetric(Set):
    """The names of the symmetric weightings: a live view of :data:`WEIGHTINGS`."""

    def __contains__(self, name) -> bool:
        w = WEIGHTINGS.get(name)
        return w is not None and w.symmetric

    def __iter__(self):
        return (name for name, w in WEIGHTINGS.items() if w.symmetric)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"SYMMETRIC_WEIGHTINGS({', '.join(self)})"


#: Weightings with ``H[u, v] == H[v, u]`` (the ones ``triangle="upper"`` allows).
SYMMETRIC_WEIGHTINGS = _Symmetric()


def weighting(name: str) -> Weighting:
    """The record of ``name``; :class:`UsageError` for an unknown one."""
    try:
        return WEIGHTINGS[name]
    except KeyError:
        raise UsageError(
            f"unknown weight {name!r}; choose one of {', '.join(WEIGHTINGS)}"
        ) from None


def factors(w: Weighting, b, n: int):
    """``(values, deg, kfac, nrm)`` of the oriented input ``b`` for ``w``: weights, output
    column degrees, per-k factors and column norms, each only where ``w`` reads it
    (1-entry placeholders otherwise)."""
    from . import _kernels as K

    b_val = b.data.astype(np.float64, copy=False) if w.reads_values else np.zeros(1, np.float64)
    deg_u, sq = K.axis_sums(b.indptr, b.indices, b.data, n, True, w.squares)
    kfac = w.per_k(b) if w.per_k is not None else np.zeros(1, np.float64)
    nrm = w.norms(deg_u, sq) if w.norms is not None else np.ones(1, np.float64)
    return b_val, deg_u, kfac, nrm


def diagonal_count(w: Weighting, b, deg_u, kfac, min_weight=None, nrm=None) -> int:
    """Entries ``H[u, u]`` that exist and pass ``min_weight`` (whether written or not).

    Computed from the input directly (``H[u, u]`` has closed forms), so the report can give
    nnz with and without self-loops even when the kernel never visits the diagonal.
    """
    exists = deg_u > 0
    if min_weight is not None:
        exists &= w.diagonal(b, deg_u.astype(np.float64), kfac, nrm) >= min_weight
    return int(np.count_nonzero(exists))


def check_input(w: Weighting, g, onto: str) -> None:
    """Refuse an input ``w`` cannot weigh: non-positive weights for :attr:`~Weighting.positive`,
    sums that overflow float64 (and cosine norms that underflow) for
    :attr:`~Weighting.float_range`."""
    if w.positive and g.matrix.nnz and g.matrix.data.min() <= 0:
        raise UsageError(f"--weight {w.name} needs positive weights (A[k,u] + A[k,v] > 0)")
    if w.float_range:
        _check_float_range(g, onto, w.name, w.squares)


def _check_float_range(g, onto: str, weight: str, norms: bool) -> None:
    """Weights that would overflow float64, refused before computing (and, with ``norms``,
    norms that underflow to 0).

    By Cauchy-Schwarz ``|H[u,v]| <= sqrt(H[u,u] H[v,v])``, so every weight is finite when the
    diagonal ``H[u,u] = sum_k A[k,u]^2`` is (checked in float64, as the kernel adds).
    """
    from . import _kernels as K

    a = g.matrix
    degree, diag = K.axis_sums(a.indptr, a.indices, a.data, a.shape[1], onto == "cols", True)
    if not np.isfinite(diag).all():
        u = int(np.flatnonzero(~np.isfinite(diag))[0])
        raise UsageError(
            f"{g.source or 'graph'}: --weight {weight} overflows float64 (the sum of squared "
            f"weights of node {u} is infinite); scale the weights down"
        )
    if norms:
        tiny = (degree > 0) & (diag == 0)
        if tiny.any():
            u = int(np.flatnonzero(tiny)[0])
            raise UsageError(
                f"{g.source or 'graph'}: --weight {weight}: the sum of squared weights of node "
                f"{u} underflows to 0 in float64; scale the weights up"
            )
