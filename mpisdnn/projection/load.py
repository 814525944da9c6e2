"""Collective input loading: every rank ends up with the whole graph.

HDF5 graphs are read by every rank directly (parallel reads of one file); text inputs are
parsed once on rank 0 and broadcast as arrays, so a bad line is reported once, by rank 0.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..formats.projection.graph import Graph, detect_format, read_graph
from ..parallel import agree, bcast_array

__all__ = ["load_graph"]

def load_graph(comm, path, fmt="auto", **options):
    """Read ``path`` on the ranks that need to and give every rank the :class:`Graph`.

    Returns
    -------
    (Graph, str)
        The graph and the format it was read as.
    """
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "h5" or comm.size == 1:
        return agree(comm, read_graph, path, fmt, **options), fmt

    def read():
        return read_graph(path, fmt, **options) if comm.rank == 0 else None

    g = agree(comm, read)
    head = (
        (g.matrix.shape, g.weighted, g.source, g.row_labels, g.col_labels)
        if comm.rank == 0
        else None
    )
    shape, weighted, source, row_labels, col_labels = comm.bcast(head, root=0)
    m = g.matrix if comm.rank == 0 else None
    indptr = bcast_array(comm, m.indptr if m is not None else None)
    indices = bcast_array(comm, m.indices if m is not None else None)
    if weighted:
        data = bcast_array(comm, m.data if m is not None else None)
    else:
        data = np.ones(indices.size, dtype=np.float64)
    mat = sp.csr_matrix((data, indices, indptr), shape=shape)
    return Graph(mat, weighted, source, row_labels, col_labels), fmt
