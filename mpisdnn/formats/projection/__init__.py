"""Every file format of graph projection, readers and writers, in one place.

========================  ===================================================================
module                    formats
========================  ===================================================================
:mod:`.graph`             the inputs: Matrix Market, TSV/CSV edge lists, ratings files, graph
                          HDF5 (``mpisdnn.graph``); :class:`Graph`, ``read_graph``,
                          ``write_graph``; integer text lines (``format_triples``)
:mod:`.output`            the outputs' front door: ``output_format``, ``make_sink`` (one sink
                          a format: text, HDF5, Parquet, memory, none), the streamed Matrix
                          Market / TSV writer (per-rank parts assembled at the close), and
                          ``read_projection`` for every format
:mod:`.h5`                the HDF5 layout (``mpisdnn.projection``): one file, or rank parts
                          under ``OUT.parts/`` with an index of virtual datasets; its
                          leftovers; ``iter_projection``
:mod:`.parquet`           a Parquet dataset directory of per-rank parts (optional pyarrow)
:mod:`.symmetric`         full rows from a stored upper triangle (``storage="symmetric"``)
========================  ===================================================================

Outputs appear whole or not at all: temporary and part names carry the writer's owner tag
(:func:`mpisdnn.leftovers.owner_tag`), so a rerun removes what a killed run left
(:func:`mpisdnn.formats.projection.h5.clean_leftovers`); whole files are renamed into place
once every rank is done. Like all of :mod:`mpisdnn.formats`, nothing here imports the
projection computation (``mpisdnn.projection``), which re-exports the public names.
"""

from .graph import Graph, read_graph, write_graph
from .output import iter_projection, projection_labels, projection_meta, read_projection

__all__ = [
    "Graph",
    "iter_projection",
    "projection_labels",
    "projection_meta",
    "read_graph",
    "read_projection",
    "write_graph",
]
