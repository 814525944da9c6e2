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

_LAZY = {
    "open_weight_store": "weight_store",
    "HDF5WeightStore": "weight_store",
    "map_layers": "network_v2",
    "NetworkWriter": "network_v2",
    "network_archive": "archive_write",
    "read_network_archive": "archive",
}


def __getattr__(name):
    # Lazy: the weight stores are only needed by inference on a v2 file.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HDF5WeightStore",
    "NetworkWriter",
    "map_layers",
    "network_archive",
    "open_weight_store",
    "read_categories",
    "read_images_tsv",
    "read_inputs",
    "read_inputs_meta",
    "read_network",
    "read_network_archive",
    "read_network_meta",
    "read_network_tsv",
    "read_triples",
    "write_categories",
    "write_inputs",
    "write_network",
    "write_triples",
]
