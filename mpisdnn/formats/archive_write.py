"""Networks written as the challenge publishes them: ``neuron{N}.tar.gz``, one
``neuron{N}/n{N}-l{k}.tsv`` member per layer, streamed (no layer file on disk).

What :mod:`.archive` reads, written: the layers go into a tar stream (``tarfile`` in its
streaming mode) inside one gzip stream (:func:`.gz.gzip_writer`: ISA-L's threaded writer when
installed). The archive is written to a temporary sibling and renamed when whole, like every
output.
"""

from __future__ import annotations

import io
import tarfile
import time
from contextlib import contextmanager, suppress

from ._atomic import atomic_path
from .gz import gzip_writer
from .tsv import triples_text

__all__ = ["network_archive", "ARCHIVE_RATIO"]

#: Text bytes per archive byte, for the disk check before writing (ISA-L level 1 on the
#: official layers: 6.7; kept low so the check errs on the safe side).
ARCHIVE_RATIO = 5.0


class _Members:
    """The open archive's layer writer (what :func:`network_archive` yields)."""

    def __init__(self, tar, neurons: int, mtime: int):
        self._tar, self._n, self._mtime = tar, neurons, mtime

    def add(self, k: int, matrix) -> int:
        """Append layer ``k`` (1-based) as ``neuron{N}/n{N}-l{k}.tsv``; returns its text bytes."""
        text = b"".join(triples_text(matrix))
        info = tarfile.TarInfo(f"neuron{self._n}/n{self._n}-l{int(k)}.tsv")
        info.size, info.mode, info.mtime = len(text), 0o644, self._mtime
        self._tar.addfile(info, io.BytesIO(text))
        return len(text)


@contextmanager
def network_archive(path, neurons: int, threads: int | None = None):
    """Write ``neuron{N}.tar.gz`` layer by layer: a context manager yielding a writer whose
    ``add(k, matrix)`` appends layer ``k`` (1-based, any scipy sparse matrix).

    Parameters
    ----------
    path : str or os.PathLike
        The archive to write (replaced only when it is complete).
    neurons : int
        N, which names the folder and the members (``neuron{N}/n{N}-l{k}.tsv``).
    threads : int, optional
        Compression threads (default: the CPUs this process may use).

    Examples
    --------
    >>> with network_archive("neuron1024.tar.gz", 1024) as out:  # doctest: +SKIP
    ...     for k, layer in enumerate(layers, 1):
    ...         out.add(k, layer.to_csc())
    """
    n = int(neurons)
    mtime = int(time.time())
    with atomic_path(path) as tmp:
        gz = gzip_writer(tmp, threads)
        whole, tar = False, None
        try:
            tar = tarfile.open(fileobj=gz, mode="w|", format=tarfile.GNU_FORMAT)
            folder = tarfile.TarInfo(f"neuron{n}")
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(folder)
            yield _Members(tar, n, mtime)
            tar.close()  # the end blocks: only on success
            whole = True
        finally:
            # The gzip trailer only on success too; an error here propagates through
            # atomic_path, which removes the temporary: no archive that looks complete.
            if whole:
                gz.close()
            else:  # closed all the same (the file is removed): no late write from __del__
                with suppress(Exception):
                    if tar is not None:
                        tar.close()
                with suppress(Exception):
                    gz.close()
