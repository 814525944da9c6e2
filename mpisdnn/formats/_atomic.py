"""Write-to-temp-then-rename, so an interrupted writer never leaves a file that looks complete."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def atomic_path(path):
    """Yield a temporary sibling path; rename it onto ``path`` only if the block succeeds."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
