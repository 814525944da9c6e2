"""Graph projection ``H = A^T A`` (or ``A A^T``) with the usual weightings, across MPI ranks.

Entry points: :func:`project` (collective, streams to a file or memory), :func:`project_matrix`
(serial, returns scipy CSR), :func:`read_graph`/:func:`write_graph` (inputs),
:func:`read_projection`/:func:`iter_projection` (outputs). See docs/projection.md.
"""

from ..formats.projection import (
    Graph,
    iter_projection,
    projection_labels,
    projection_meta,
    read_graph,
    read_projection,
    write_graph,
)
from .core import (
    SYMMETRIC_WEIGHTINGS,
    WEIGHTINGS,
    ProjectionMatrix,
    ProjectionOptions,
    ProjectionResult,
    SerialComm,
    check_options,
    peak_rss_bytes,
    project,
    project_matrix,
)

__all__ = [
    "Graph",
    "ProjectionMatrix",
    "ProjectionOptions",
    "ProjectionResult",
    "SYMMETRIC_WEIGHTINGS",
    "SerialComm",
    "WEIGHTINGS",
    "check_options",
    "iter_projection",
    "peak_rss_bytes",
    "project",
    "project_matrix",
    "projection_labels",
    "projection_meta",
    "read_graph",
    "read_projection",
    "write_graph",
]
