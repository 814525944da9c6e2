"""The projection writers' owner tags, kept importable here; they live in :mod:`mpisdnn.leftovers`.

``remove_stale`` here is :func:`mpisdnn.leftovers.remove_stale_tagged` (a directory and a
name prefix), not :func:`mpisdnn.leftovers.remove_stale` (an output path and an age).
"""

from __future__ import annotations

from ..leftovers import is_stale, owner_tag
from ..leftovers import remove_stale_tagged as remove_stale

__all__ = ["owner_tag", "is_stale", "remove_stale"]
