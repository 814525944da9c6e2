"""A checkpoint's manifest and rank files, checked before anything is trusted.

What :mod:`mpisdnn.sdnn.checkpoint` writes and reads back: the manifest's format, version
and checksum (:func:`_sealed`), and the checks a resume runs on a checkpoint before it sizes
or reads anything from it (:func:`_verify`: the manifest's every count, one rank file per
writing rank with its size and SHA-256; :func:`_checked_part`: a rank file's arrays against
its entry and the run). Split from :mod:`mpisdnn.sdnn.checkpoint`, which writes the
checkpoints and chooses the one to resume from.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ..errors import InputError

MANIFEST_FORMAT = "mpisdnn.checkpoint"
#: Version 2 adds ``checksum`` (SHA-256 of the manifest's other entries); version 1
#: manifests are still read, and checked against their files like version 2.
MANIFEST_VERSION = 2
_READ_VERSIONS = (1, 2)


def _sha256_file(path, h=None) -> tuple[int, str]:
    h = h or hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


#: Bytes a resumed rank holds per row of its block, live or not (row lengths, row pointers
#: and the final Y's row pointers: three int64 arrays).
BLOCK_BYTES_PER_ROW = 24


def _check_block_memory(where, block_rows: int, g_rows: int) -> None:
    from ..system import available_memory, format_size

    need = block_rows * BLOCK_BYTES_PER_ROW
    avail = available_memory()
    if need > avail:
        raise InputError(
            f"{where}: manifest g_rows {g_rows} would give a rank a block of {block_rows} rows "
            f"({format_size(need)}, more than the {format_size(avail)} available); "
            f"the manifest is damaged or the inputs are too many for these ranks"
        )


def _checked_part(path, entry: dict, neurons: int, g_rows: int):
    """``(gid, indptr)`` of one rank file, after checking its arrays against its manifest
    entry and the run (ids inside ``g_rows``, ascending; columns inside ``neurons``)."""
    try:
        with np.load(path) as z:
            gid, indptr, indices = z["gid"], z["indptr"], z["indices"]
            data_size = z["data"].size
    except (OSError, ValueError, KeyError):
        raise InputError(f"{path}: not a checkpoint rank file (damaged)") from None
    rows, nnz = entry["rows"], entry["nnz"]
    ok = (
        gid.ndim == 1 and gid.size == rows and gid.dtype.kind == "i"
        and indptr.ndim == 1 and indptr.size == rows + 1 and indptr.dtype.kind == "i"
        and indices.size == nnz == data_size and indices.dtype.kind == "i"
    )  # fmt: skip
    ok = ok and int(indptr[0]) == 0 and int(indptr[-1]) == nnz
    ok = ok and bool(np.all(np.diff(indptr) >= 0))
    if ok and rows:
        ok = int(gid[0]) == entry["gid_first"] and int(gid[-1]) == entry["gid_last"]
        ok = ok and 0 <= int(gid[0]) and int(gid[-1]) < g_rows and bool(np.all(np.diff(gid) > 0))
    if ok and nnz:
        ok = 0 <= int(indices.min()) and int(indices.max()) < neurons
    if not ok:
        raise InputError(f"{path}: arrays disagree with the manifest or the run (damaged)")
    return np.asarray(gid, np.int64), np.asarray(indptr, np.int64)


def _digest(manifest: dict) -> str:
    """SHA-256 of a manifest's entries other than ``checksum`` (canonical JSON)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _sealed(manifest: dict) -> dict:
    """``manifest`` with its own ``checksum``: an edited or damaged manifest is refused."""
    return {**manifest, "checksum": _digest(manifest)}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: The manifest entries that must be whole numbers, and their least values.
_COUNTS = {"sequence": 1, "next_layer": 0, "layers": 1, "g_rows": 0, "neurons": 1,
           "written_ranks": 1}  # fmt: skip
_FILE_COUNTS = {"size": 0, "rows": 0, "nnz": 0, "gid_first": -1, "gid_last": -1}


def _check_manifest(manifest, where: str) -> None:
    """Refuse a manifest that is not one this module wrote for a run that can continue: its
    checksum, every count (a whole number in range: ``next_layer`` inside the run's layers,
    every file's rows inside ``g_rows``), and one rank file per writing rank, in rank order.
    Nothing here is trusted to size anything before it passed."""
    if not isinstance(manifest, dict):
        raise InputError(f"{where}: manifest is not a JSON object")
    version = manifest.get("version")
    if manifest.get("format") != MANIFEST_FORMAT or version not in _READ_VERSIONS:
        raise InputError(f"{where}: not an {MANIFEST_FORMAT} v{MANIFEST_VERSION} manifest")
    if version >= 2 and manifest.get("checksum") != _digest(manifest):
        raise InputError(f"{where}: manifest checksum differs from its contents (edited?)")
    _check_counts(manifest, _COUNTS, f"{where}:")
    layers, nl, g_rows = manifest["layers"], manifest["next_layer"], manifest["g_rows"]
    if nl >= layers:
        raise InputError(
            f"{where}: manifest next_layer {nl} is outside the run's {layers} layers "
            f"(0 to {layers - 1})"
        )
    options = (manifest.get("identity") or {}).get("options") or {}
    if options.get("layers") not in (None, layers):
        raise InputError(
            f"{where}: manifest layers {layers} differ from the run's --layers "
            f"{_shown(options.get('layers'))}"
        )
    files = manifest.get("files")
    if not isinstance(files, list) or len(files) != manifest["written_ranks"]:
        raise InputError(
            f"{where}: manifest lists {len(files) if isinstance(files, list) else 'no'} rank "
            f"files for {manifest['written_ranks']} ranks"
        )
    rows = 0
    for rank, entry in enumerate(files):
        _check_entry(entry, rank, g_rows, where)
        rows += entry["rows"]
    if rows > g_rows:
        raise InputError(f"{where}: manifest lists {rows} live rows of {g_rows} inputs")


def _check_counts(record: dict, counts: dict, prefix: str) -> None:
    """Each ``counts`` key of ``record`` a whole number at least its bound (one line)."""
    for key, least in counts.items():
        value = record.get(key)
        if not _whole(value) or value < least:
            raise InputError(
                f"{prefix} manifest entry {key} must be a whole number >= {least}, "
                f"got {_shown(value)}"
            )


def _check_entry(entry, rank: int, g_rows: int, where: str) -> None:
    name = f"rank-{rank:05d}.npz"
    if not isinstance(entry, dict) or entry.get("name") != name:
        raise InputError(f"{where}: manifest file entry {rank} is not {name}")
    _check_counts(entry, _FILE_COUNTS, f"{where}: {name}:")
    if not isinstance(entry.get("sha256"), str):
        raise InputError(f"{where}: {name}: manifest entry sha256 missing")
    first, last = entry["gid_first"], entry["gid_last"]
    if entry["rows"] and not 0 <= first <= last < g_rows:
        raise InputError(
            f"{where}: {name}: rows {first} to {last} are outside the run's {g_rows} inputs"
        )


def _shown(value) -> str:
    """A manifest value in a message: JSON as it was written, not a Python repr."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = "an unreadable value"
    return text if len(text) <= 40 else text[:37] + "..."


def _verify(directory, name) -> dict:
    """The manifest of one checkpoint after checking it (:func:`_check_manifest`) and every
    rank file; raises :class:`InputError` when damaged."""
    where = os.path.join(directory, name)
    try:
        with open(os.path.join(where, "manifest.json")) as f:
            manifest = json.load(f)
    except OSError as exc:
        raise InputError(f"{where}: manifest unreadable ({_reason(exc)})") from None
    except ValueError:
        raise InputError(f"{where}: manifest unreadable (not JSON)") from None
    _check_manifest(manifest, where)
    listed = {entry["name"] for entry in manifest["files"]}
    try:
        present = {n for n in os.listdir(where) if n.startswith("rank-") and n.endswith(".npz")}
    except OSError as exc:
        raise InputError(f"{where}: unreadable ({_reason(exc)})") from None
    if present - listed:
        raise InputError(
            f"{where}: holds {sorted(present - listed)[0]}, which its manifest does not list "
            f"(a rank's rows would be lost)"
        )
    for entry in manifest["files"]:
        path = os.path.join(where, entry["name"])
        if not os.path.isfile(path):
            raise InputError(f"{path}: missing")
        size, digest = _sha256_file(path)
        if size != entry["size"] or digest != entry["sha256"]:
            raise InputError(f"{path}: size or SHA-256 differs from the manifest (damaged)")
    manifest["path"] = where
    return manifest


def _reason(exc: OSError) -> str:
    """An OS error's reason in words (``Read-only file system``), without ``[Errno N]``."""
    return exc.strerror or type(exc).__name__
