"""Which format a file's name asks for: the one table of extensions the writers choose by.

The projection's outputs and the graph writer pick their format by the output's name, and
a name that gives none is refused rather than written as HDF5 (``H.tsv.gz`` was); the
network, inputs and activations files are always HDF5, and a name that says another format
(``sparse-images-1024.tsv``) is refused the same way.
"""

from __future__ import annotations

import os

__all__ = ["EXTENSIONS", "format_of_name", "names_another_format"]

#: The extensions (lower case) of each format a writer can choose by name.
EXTENSIONS = {
    "h5": (".h5", ".hdf5", ".hdf", ".he5"),
    "mtx": (".mtx", ".mm"),
    "csv": (".csv",),
    "tsv": (".tsv", ".txt"),
    "parquet": (".parquet", ".pq"),
}
#: Names of what no writer here makes: compressed text, archives, JSON.
_OTHER = (".gz", ".tgz", ".tar", ".zip", ".bz2", ".xz", ".zst", ".json")


def format_of_name(path, formats=tuple(EXTENSIONS)) -> str | None:
    """The one of ``formats`` that ``path``'s name ends in, or ``None``."""
    lower = os.fspath(path).lower().rstrip("/")
    for fmt in formats:
        if lower.endswith(EXTENSIONS[fmt]):
            return fmt
    return None


def names_another_format(path) -> bool:
    """Whether ``path``'s name says a format other than HDF5 (text, Parquet, an archive)."""
    lower = os.fspath(path).lower().rstrip("/")
    others = tuple(f for f in EXTENSIONS if f != "h5")
    return format_of_name(path, others) is not None or lower.endswith(_OTHER)
