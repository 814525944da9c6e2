"""Checkpoint / resume of an inference run at layer-group boundaries.

A checkpoint is a directory ``DIR/ckpt-NNNNNN/`` with one ``rank-RRRRR.npz`` per rank (the
rank's live rows: global ids and CSR values after layer ``next_layer - 1``) and a
``manifest.json`` naming the problem (network, inputs and truth: path, size, SHA-256; the
options that change results) and every rank file's size and SHA-256. It is built under a
hidden temporary name and renamed into place only once every rank file and the manifest are
on disk, so a killed run never leaves a checkpoint that looks complete; the previous one is
deleted only after that, and one older checkpoint is always kept so a damaged newest one can
fall back to it.

A resume may use any number of ranks: the live rows are re-partitioned by their non-zeros
and every rank reads only the files that hold its rows. Rows are independent in the layer
recurrence, so continuing from the saved values gives a bit-identical final Y. The
manifest's format and the checks a checkpoint passes before it is trusted are
:mod:`mpisdnn.sdnn.checkpoint_manifest`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, UsageError
from ..formats._atomic import output_errors
from ..parallel import (
    AgreedError,
    agree,
    agree_error,
    agree_root,
    allgather,
    allreduce,
    barrier,
    bcast,
    gather,
    phase,
)
from ..partition import balanced_blocks
from .checkpoint_manifest import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    _check_block_memory,
    _checked_part,
    _sealed,
    _sha256_file,
    _verify,
)

__all__ = [
    "CheckpointStop",
    "Checkpointer",
    "problem_identity",
    "compare_identity",
    "choose_checkpoint",
    "read_live_rows",
    "STOP_FILE",
    "STOP_EXIT_CODE",
]

#: A file in the checkpoint directory that asks a running job to checkpoint and stop (what
#: the sbatch scripts create when Slurm signals the approaching time limit).
STOP_FILE = "STOP"
#: Exit code of a run that stopped after a checkpoint on request (``EX_TEMPFAIL``).
STOP_EXIT_CODE = 75
#: Options recorded in the identity: a resume with other values would compute another Y.
SEMANTIC_OPTIONS = ("layers", "bias", "prune")

#: What this rank was asked since the run started: ``_ASKED`` (SIGUSR1) and ``_TERMINATED``
#: (a SIGTERM deferred to the next boundary), bits of the flag the ranks OR together.
_stop_signalled = 0
_DUE, _ASKED, _TERMINATED = 1, 2, 4


class CheckpointStop(AgreedError):
    """Raised on every rank after the checkpoint that a stop request asked for.

    ``exit_code`` is the same on every rank: 143 when a SIGTERM reached any rank (the job
    was terminated, by ``scancel`` or a time limit: it must not requeue itself), else
    :data:`STOP_EXIT_CODE` (a request: ``SIGUSR1``, ``DIR/STOP``). A launcher that ORs the
    ranks' codes (hydra) then reports that one code, not ``75 | 143 = 207``.
    """

    def __init__(self, message: str, code: int = STOP_EXIT_CODE):
        super().__init__(message, code)


def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
    global _stop_signalled
    _stop_signalled |= _TERMINATED if signum == signal.SIGTERM else _ASKED


def _file_identity(path) -> dict:
    """Path, size and SHA-256 of a file, or of a directory's regular files in name order."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        h, size = hashlib.sha256(), 0
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if os.path.isfile(full):
                h.update(name.encode() + b"\0")
                size += _sha256_file(full, h)[0]
        return {"path": path, "size": size, "sha256": h.hexdigest()}
    if not os.path.isfile(path):
        raise InputError(f"{path}: not found")
    size, digest = _sha256_file(path)
    return {"path": path, "size": size, "sha256": digest}


def problem_identity(network, inputs, truth=None, **options) -> dict:
    """What a checkpoint belongs to: the files (path, size, SHA-256) and result options."""
    return {
        "network": _file_identity(network),
        "inputs": _file_identity(inputs),
        "truth": None if truth is None else _file_identity(truth),
        "options": {k: options.get(k) for k in SEMANTIC_OPTIONS},
    }


def compare_identity(recorded: dict, where: str) -> None:
    """Raise one clear :class:`InputError` when a recorded file changed since the checkpoint."""
    for key in ("network", "inputs", "truth"):
        rec = recorded.get(key)
        if rec is None:
            continue
        if not os.path.exists(rec["path"]):
            raise InputError(f"{where}: the checkpoint's {key} {rec['path']} no longer exists")
        now = _file_identity(rec["path"])
        if now["size"] != rec["size"] or now["sha256"] != rec["sha256"]:
            raise InputError(
                f"{where}: the {key} {rec['path']} changed since the checkpoint was written "
                f"(size {rec['size']} -> {now['size']}, SHA-256 differs); resume needs the "
                f"same network, inputs and truth"
            )


class Checkpointer:
    """Writes checkpoints every ``every`` seconds at layer-group boundaries (collective).

    Parameters
    ----------
    comm : mpi4py communicator
    directory : path-like
        Where the checkpoints go (created).
    every : float
        Seconds between checkpoints (0: only when a stop is requested).
    identity : dict
        :func:`problem_identity` of the run (computed on rank 0, broadcast).
    g_rows, layers, neurons : int
        Global inputs, network depth and width.
    """

    @phase("checkpoint")
    def __init__(self, comm, directory, every, identity, g_rows, layers, neurons):
        self.comm = comm
        self.dir = os.path.abspath(os.fspath(directory))
        self.every = float(every)
        self.identity = identity
        self.g_rows, self.layers, self.neurons = int(g_rows), int(layers), int(neurons)
        self.last = time.monotonic()
        self.saved: list = []
        self.seconds = 0.0
        if comm.rank == 0:
            os.makedirs(self.dir, exist_ok=True)
        barrier(comm)
        global _stop_signalled
        _stop_signalled = 0
        for sig in (signal.SIGUSR1,):
            try:
                signal.signal(sig, _on_signal)
            except ValueError:  # not the main thread (embedded use): the file still works
                pass

    @phase("checkpoint")
    def __call__(self, be, y, gid, next_layer):
        """The engine's boundary hook: checkpoint when due; stop after it when asked to."""
        if next_layer >= self.layers:
            return
        due = _stop_signalled
        if self.comm.rank == 0:
            if self.every > 0 and time.monotonic() - self.last >= self.every:
                due |= _DUE
            if os.path.exists(os.path.join(self.dir, STOP_FILE)):
                due |= _ASKED
        due = allreduce(self.comm, due, "bor")
        if not due:
            return
        t0 = time.perf_counter()
        name = self.save(be.to_host(y), gid, next_layer)
        self.seconds += time.perf_counter() - t0
        self.last = time.monotonic()
        if due & _TERMINATED:
            # Every rank ends as terminated, also those the signal did not reach.
            from .._signals import TERMINATED, note_termination

            note_termination()
            code = TERMINATED
        else:
            code = STOP_EXIT_CODE
        if due & (_ASKED | _TERMINATED):
            if self.comm.rank == 0:
                # The request is answered: a later run (the resume) must not stop on it.
                try:
                    os.remove(os.path.join(self.dir, STOP_FILE))
                except OSError:
                    pass
            raise CheckpointStop(
                f"stopped on request after layer {next_layer}; checkpoint {name} written; "
                f"continue with: mpisdnn infer --resume {self.dir}",
                code,
            )

    @phase("checkpoint")
    def save(self, host: sp.csr_matrix, gid: np.ndarray, next_layer: int) -> str:
        """Write one complete checkpoint (collective); returns its directory name.

        Raises
        ------
        AgreedError
            On every rank when any rank could not write (full disk, file size limit): one
            line naming the checkpoint; its temporary directory is removed and the earlier
            checkpoints are kept, so ``--resume`` continues from the last complete one.
        """
        comm = self.comm
        seq = bcast(comm, _next_sequence(self.dir) if comm.rank == 0 else None)
        name = f"ckpt-{seq:06d}"
        final = os.path.join(self.dir, name)
        tmp = None
        try:
            tmp = agree_root(comm, _new_temp_dir, self.dir, name)
            entry = agree(comm, self._write_part, tmp, final, sp.csr_matrix(host), gid)
            entries = gather(comm, entry)
            agree_root(comm, self._publish, tmp, name, seq, next_layer, entries)
        except AgreedError:
            if comm.rank == 0 and tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        barrier(comm)
        size = entry["size"]
        self.saved.append(
            {"name": name, "next_layer": int(next_layer), "bytes": allreduce(comm, size)}
        )
        return name

    def _write_part(self, tmp, final, host, gid) -> dict:
        """Write this rank's rows into ``tmp``; returns its manifest entry."""
        gid = np.asarray(gid, dtype=np.int64)
        # A backend may keep a few empty rows until compaction pays; an empty row stays empty
        # (no bias without Y W != 0), so only the live rows are saved.
        live = np.diff(host.indptr) > 0
        if not live.all():
            host, gid = host[live], gid[live]
        fname = f"rank-{self.comm.rank:05d}.npz"
        path = os.path.join(tmp, fname)
        with output_errors(final), open(path, "wb") as f:
            np.savez(
                f,
                gid=gid,
                indptr=host.indptr.astype(np.int64),
                indices=host.indices.astype(np.int32),
                data=host.data.astype(np.float32),
            )
            f.flush()
            os.fsync(f.fileno())
        size, digest = _sha256_file(path)
        return {
            "name": fname,
            "size": size,
            "sha256": digest,
            "rows": int(gid.size),
            "nnz": int(host.nnz),
            "gid_first": int(gid[0]) if gid.size else -1,
            "gid_last": int(gid[-1]) if gid.size else -1,
        }

    def _publish(self, tmp, name, seq, next_layer, entries) -> None:
        """Rank 0: write the manifest, rename the checkpoint into place, drop old ones."""
        manifest = _sealed(
            {
                "format": MANIFEST_FORMAT,
                "version": MANIFEST_VERSION,
                "sequence": seq,
                "next_layer": int(next_layer),
                "layers": self.layers,
                "g_rows": self.g_rows,
                "neurons": self.neurons,
                "written_ranks": self.comm.size,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "identity": self.identity,
                "files": entries,
            }
        )
        final = os.path.join(self.dir, name)
        with output_errors(final), open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        # Keep this one and the one before it (the fallback when this one is damaged).
        for old in _complete(self.dir)[:-2]:
            shutil.rmtree(os.path.join(self.dir, old), ignore_errors=True)

    @phase("checkpoint")
    def describe(self) -> dict:
        """What the report records about the checkpoints of this run."""
        return {
            "directory": self.dir,
            "every_seconds": self.every,
            "count": len(self.saved),
            "seconds": float(allreduce(self.comm, self.seconds, "max")),
            "saved": self.saved,
        }


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _complete(directory) -> list:
    """Names of the renamed (complete) checkpoints in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("ckpt-") and n[5:].isdigit())


def _new_temp_dir(directory, name) -> str:
    """A fresh temporary directory for checkpoint ``name``, named by the one rule of
    :func:`~mpisdnn.formats._atomic.temp_name`; the half-written checkpoints of killed runs
    go first (this run holds the directory's lock: no other writer is in it)."""
    from ..formats._atomic import temp_name

    for old in os.listdir(directory):
        if old.startswith(".ckpt-"):
            shutil.rmtree(os.path.join(directory, old), ignore_errors=True)
    tmp = temp_name(os.path.join(directory, name), "tmpdir")
    with output_errors(os.path.join(directory, name)):  # a full disk: one line, agreed
        os.makedirs(tmp)
    return tmp


def _next_sequence(directory) -> int:
    done = _complete(directory)
    return int(done[-1][5:]) + 1 if done else 1


@phase("checkpoint")
def choose_checkpoint(comm, directory) -> tuple[dict, list]:
    """The newest undamaged checkpoint in ``directory`` and warnings about skipped ones.

    Rank 0 checks the manifests and checksums; every rank gets the result, or the same
    one-line error when no checkpoint is usable.
    """

    def pick():
        d = os.path.abspath(os.fspath(directory))
        if not os.path.isdir(d):
            raise UsageError(f"{d}: no such checkpoint directory")
        names = _complete(d)
        if not names:
            raise InputError(f"{d}: no complete checkpoint (none was written, or all are partial)")
        warnings = []
        for name in reversed(names):
            try:
                return _verify(d, name), warnings
            except InputError as exc:
                warnings.append(f"checkpoint {name} is damaged ({exc}); trying the previous one")
        raise InputError(f"{d}: every checkpoint is damaged ({'; '.join(warnings)})")

    return agree_root(comm, pick)


@phase("checkpoint")
def read_live_rows(comm, manifest) -> dict:
    """This rank's share of a checkpoint's live rows under a new partition (collective).

    The global rows are cut into ``comm.size`` contiguous blocks balanced by the live rows'
    non-zeros; every rank reads only the rank files that overlap its block.

    Returns
    -------
    dict
        ``y`` (live rows, CSR float32, ascending global id), ``gid``, ``row_offset`` and
        ``block_rows`` (the rank's block of global rows) and ``g_rows``.
    """
    where, files = manifest["path"], manifest["files"]
    g_rows, n = int(manifest["g_rows"]), int(manifest["neurons"])
    mine = [(i, e) for i, e in enumerate(files) if i % comm.size == comm.rank]
    gids, nnzs = [], []

    def read_mine():
        for _, e in mine:
            gid, indptr = _checked_part(os.path.join(where, e["name"]), e, n, g_rows)
            gids.append(gid)
            nnzs.append(np.diff(indptr))

    agree(comm, read_mine)
    parts = allgather(
        comm,
        (
            [i for i, _ in mine],
            np.concatenate(gids) if gids else np.zeros(0, np.int64),
            np.concatenate(nnzs) if nnzs else np.zeros(0, np.int64),
        )
    )
    parts.sort(key=lambda p: p[0][0] if p[0] else 1 << 62)
    gid_all = np.concatenate([p[1] for p in parts])
    nnz_all = np.concatenate([p[2] for p in parts])
    order = np.argsort(gid_all, kind="stable")
    gid_all, nnz_all = gid_all[order], nnz_all[order]
    if gid_all.size > 1 and not np.all(gid_all[1:] > gid_all[:-1]):
        agree_error(comm, InputError(f"{where}: a row is saved in two rank files (damaged)"))
    off = balanced_blocks(nnz_all, comm.size)
    bounds = np.array(
        [0] + [int(gid_all[o]) if o < gid_all.size else g_rows for o in off[1:-1]] + [g_rows],
        dtype=np.int64,
    )
    # A rank's block is sized by g_rows (its rows, live or not): checked against memory
    # before anything of that size exists (a manifest naming 2^40 inputs asked for TiB).
    agree(comm, _check_block_memory, where, int(np.diff(bounds).max()), g_rows)
    r0, r1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    ys, gs = [], []
    for e in files:
        if e["rows"] == 0 or e["gid_last"] < r0 or e["gid_first"] >= r1:
            continue
        with np.load(os.path.join(where, e["name"])) as z:
            gid = z["gid"]
            m = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=(gid.size, n))
        sel = np.flatnonzero((gid >= r0) & (gid < r1))
        ys.append(m[sel])
        gs.append(gid[sel])
    y = sp.vstack(ys, format="csr") if ys else sp.csr_matrix((0, n), dtype=np.float32)
    gid = np.concatenate(gs) if gs else np.zeros(0, np.int64)
    order = np.argsort(gid, kind="stable")
    y = sp.csr_matrix(y[order], dtype=np.float32)
    return {"y": y, "gid": gid[order], "row_offset": r0, "block_rows": r1 - r0, "g_rows": g_rows}
