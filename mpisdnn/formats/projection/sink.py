"""The declared interface of the projection's writers (:class:`Sink`).

The driver (:func:`mpisdnn.projection.project`) hands every finished chunk of this rank's
rows to one sink and knows nothing else of the format: HDF5, Matrix Market, TSV/CSV and
Parquet writers, memory, no output, and the upper-triangle top-k heaps all implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Sink"]


class Sink(ABC):
    """Where a rank's rows of the projection go, chunk by chunk (collective at the end).

    A sink is made on every rank at once (``make_sink``, collective where the format needs
    it), receives the rank's chunks in row order through :meth:`write` (or, where
    :attr:`staged`, :meth:`append_blocks` straight from the kernel's work buffer), and is
    closed by :meth:`finish` on every rank, or dropped by :meth:`abort` on any error (no
    half-written output that looks complete).
    """

    #: The sink takes the kernel's blocks in place (:meth:`append_blocks`): memory and the
    #: HDF5 writer with its own thread.
    staged = False
    #: The kernel offers the entries to per-row heaps instead of emitting them (top-k from
    #: the upper triangle): the driver hands nothing over per chunk.
    offered = False
    #: Seconds a writer thread spent writing, and the driver waited for a free buffer.
    write_seconds = 0.0
    wait_seconds = 0.0

    @abstractmethod
    def write(self, row_start, counts, indices, data) -> None:
        """Rows ``row_start, row_start + 1, ...`` with ``counts[i]`` entries each, whose
        columns and values are ``indices`` and ``data`` (in row order)."""

    def append_blocks(self, counts, idx, val, blk_cap, blk_cnt) -> None:
        """A chunk as the kernel left it: block ``j``'s ``blk_cnt[j]`` entries start at
        ``blk_cap[j]`` of ``idx``/``val`` (only where :attr:`staged`)."""
        raise NotImplementedError(f"{type(self).__name__} takes whole chunks (write)")

    @abstractmethod
    def finish(self, comm, totals) -> None:
        """Close the output (collective): ``totals`` holds the global ``nnz``."""

    @abstractmethod
    def abort(self) -> None:
        """Drop the output after an error: no partial file is left looking complete."""
