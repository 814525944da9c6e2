"""Readers and writers: official challenge TSV files and the project's HDF5 layout."""

from .hdf5 import (
    read_inputs,
    read_inputs_meta,
    read_network,
    read_network_meta,
    write_inputs,
    write_network,
)
from .tsv import (
    read_categories,
    read_images_tsv,
    read_network_tsv,
    read_triples,
    write_categories,
    write_triples,
)

__all__ = [
    "read_categories",
    "read_images_tsv",
    "read_inputs",
    "read_inputs_meta",
    "read_network",
    "read_network_meta",
    "read_network_tsv",
    "read_triples",
    "write_categories",
    "write_inputs",
    "write_network",
    "write_triples",
]
