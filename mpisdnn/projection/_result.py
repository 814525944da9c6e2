"""What a projection returns: ProjectionResult, ProjectionMatrix and their pandas edge frames.

Split from :mod:`mpisdnn.projection.core`, which re-exports the names
(:mod:`mpisdnn.projection` the public ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError


@dataclass
class ProjectionResult:
    """What one projection did, on every rank (global numbers are the same on all ranks).

    ``matrix`` is this rank's block of rows ``[row_start, row_stop)`` when the output went to
    memory (``project_matrix`` returns the whole matrix), else ``None``. ``labels`` are the
    ids of the projected nodes (rows and columns of H) when the input had its own ids
    (:meth:`Graph.from_edges`, text ids), else ``None``; :meth:`to_pandas` names the
    entries by them, like networkx's ``to_pandas_edgelist``.
    """

    shape: tuple
    nnz: int
    diagonal: int
    row_start: int
    row_stop: int
    options: dict
    seconds: dict
    ranks: dict
    threads: int
    index_dtype: str
    value_dtype: str
    matrix: sp.csr_matrix | None = None
    extra: dict = field(default_factory=dict)
    labels: np.ndarray | None = None

    def to_scipy(self) -> sp.csr_matrix:
        """This rank's rows of H as plain scipy CSR (``row_start`` is its first row)."""
        if self.matrix is None:
            raise UsageError("the projection went to a file (output=...), not to memory")
        return sp.csr_matrix(self.matrix)

    def to_pandas(self, source="source", target="target", weight="weight"):
        """This rank's entries as a pandas DataFrame ``source, target, weight``, the nodes
        named by their ids (indices where the input had none), in row order."""
        return edge_frame(self.to_scipy(), self.labels, self.row_start, source, target, weight)

    @property
    def nnz_with_self_loops(self) -> int:
        return self.nnz if self.options["self_loops"] == "keep" else self.nnz + self.diagonal

    @property
    def nnz_without_self_loops(self) -> int:
        return self.nnz - self.diagonal if self.options["self_loops"] == "keep" else self.nnz


class ProjectionMatrix(sp.csr_matrix):
    """scipy CSR with the projected nodes' ids (``labels``, or None) and :meth:`to_pandas`."""

    labels = None

    def __init__(self, arg1, shape=None, dtype=None, copy=False, labels=None, **kwargs):
        super().__init__(arg1, shape=shape, dtype=dtype, copy=copy, **kwargs)
        self.labels = labels

    def to_scipy(self) -> sp.csr_matrix:
        """The same matrix as a plain scipy ``csr_matrix``."""
        return sp.csr_matrix(self)

    def to_pandas(self, source="source", target="target", weight="weight"):
        """Entries as a DataFrame ``source, target, weight`` named by the ids (networkx's
        ``to_pandas_edgelist``)."""
        return edge_frame(self, self.labels, 0, source, target, weight)


def edge_frame(mat, labels, row_start, source="source", target="target", weight="weight"):
    """A pandas DataFrame of the entries of ``mat`` (rows from ``row_start``), ids by
    ``labels`` where given. pandas is imported here only (it is not a dependency)."""
    try:
        import pandas as pd
    except ImportError:
        raise UsageError("to_pandas() needs pandas (pip install pandas)") from None
    coo = sp.coo_matrix(mat)
    u = coo.row.astype(np.int64) + int(row_start)
    v = coo.col.astype(np.int64)
    if labels is not None:
        labels = np.asarray(labels)
        u, v = labels[u], labels[v]
    return pd.DataFrame({source: u, target: v, weight: coo.data})
