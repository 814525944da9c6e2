"""Graph projection ``H = A^T A`` (or ``A A^T``) with the usual weightings, across MPI ranks.

Entry points: :func:`project` (collective, streams to a file or memory), :func:`project_matrix`
(serial, returns scipy CSR), :func:`read_graph`/:func:`write_graph` (inputs),
:func:`read_projection`/:func:`iter_projection` (outputs). See docs/projection.md.
"""

from .core import (
    SYMMETRIC_WEIGHTINGS,
    WEIGHTINGS,
    ProjectionOptions,
    ProjectionResult,
    SerialComm,
    check_options,
    peak_rss_bytes,
    project,
    project_matrix,
)
from .io import Graph, read_graph, write_graph
from .output import iter_projection, projection_labels, projection_meta, read_projection

__all__ = [
    "Graph",
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
