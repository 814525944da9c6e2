"""The challenge's files: the official files a data folder holds, and the cache.

:func:`find_sources` finds, for one N, the network (archive or unpacked directory), the
inputs and the truth files in the layout the challenge publishes; the cache holds each
official network converted once (re-used while its source's size and modification time
match) and what :mod:`mpisdnn.sdnn.challenge` generates when a file is missing (a seeded
RadiX-Net, digit-like inputs as an official-format TSV), each with a ``.source.json`` that
says what it was made from. ``opts`` is a :class:`~mpisdnn.sdnn.challenge.ChallengeOptions`.
Split from :mod:`mpisdnn.sdnn.challenge` (which runs the configurations and re-exports the
public names defined here).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from ..parallel import agree, agree_root, gather, log, phase

__all__ = ["PUBLISHED_FAN_IN", "Sources", "find_sources", "truth_layers", "truth_mismatch",
           "unlike_published"]

_TRUTH_NAME = re.compile(r"neuron(\d+)-l(\d+)-categories\.tsv(\.gz)?$")


@dataclass(frozen=True)
class Sources:
    """The official files ``DATA_DIR`` has for one N (``None`` where missing).

    ``network`` is the archive or the directory (``network_layers``: the layer files a
    directory holds from ``n{N}-l1.tsv`` on, ``None`` for an archive until it is converted);
    ``truth`` maps L to its categories file; ``notes``: one line for each file passed over
    or found incomplete (an unpacking cut short), for the sitting to print.
    """

    neurons: int
    network: str | None
    network_layers: int | None
    inputs: str | None
    truth: dict
    notes: tuple = ()


def _folders(data_dir) -> list:
    return [d for d in (data_dir, os.path.join(data_dir, "dnn"), os.path.join(data_dir, "mnist"))
            if os.path.isdir(d)]  # fmt: skip


def _layer_files(d, n: int) -> int:
    k = 0
    while os.path.isfile(os.path.join(d, f"n{n}-l{k + 1}.tsv")):
        k += 1
    return k


def _past_gap(d, n: int, k: int) -> int:
    """Layer files of ``d`` numbered past the first missing one, ``n{n}-l{k + 1}.tsv``."""
    name = re.compile(rf"n{n}-l(\d+)\.tsv$")
    try:
        found = [name.match(e) for e in os.listdir(d)]
    except OSError:
        return 0
    return sum(1 for m in found if m and int(m.group(1)) > k + 1)


def _short_directory(d, n: int, k: int, past: int) -> str:
    """What a directory of ``k`` consecutive layer files (``past`` more after the gap)
    lacks, for a note."""
    after = f"; {past} layer files numbered after it are not used" if past else ""
    return f"{d} holds {k} layer files (n{n}-l{k + 1}.tsv is missing{after})"


def _whole_text_of(tsv_path, gz_path) -> str | None:
    """``None`` when ``tsv_path`` can be the whole text of ``gz_path`` by the size its gzip
    trailer gives (modulo 2**32, as gzip keeps it), else the note that it is not."""
    from ..formats import gz

    if not gz.is_gzip(gz_path):
        return None
    try:
        size, isize = os.path.getsize(tsv_path), gz.trailer_size(gz_path)
    except OSError:
        return None
    if size % 2**32 == isize:
        return None
    return (f"{tsv_path} ({size:,} bytes) is not the whole text of {gz_path} (its gzip "
            f"trailer says {isize:,} bytes, modulo 2**32: a decompression cut short?): "
            f"reading {gz_path}")  # fmt: skip


def find_sources(data_dir, neurons: int, layers: int | None = None) -> Sources:
    """The official files for ``neurons`` in ``data_dir`` (or its ``dnn/``, ``mnist/``).

    An unpacked ``neuron{N}/`` directory is preferred to the archive when it has layer files,
    unless it has fewer than ``layers`` (the most the sitting asks for) and the archive is
    there: an unpacking cut short gives way to the archive it came from. ``sparse-images-
    {N}.tsv`` is preferred to its ``.gz``, unless its size is not the one the ``.gz``'s
    trailer gives (a decompression cut short). Truth files may be ``.tsv`` or ``.tsv.gz``.
    Each file passed over, or a directory found short, gets a line in ``notes``.
    """
    n = int(neurons)
    folders = _folders(os.fspath(data_dir))
    unpacked = layers_found = inputs = archive = None
    truth, notes = {}, []
    for d in folders:
        here = os.path.join(d, f"neuron{n}")
        k = _layer_files(here, n) if unpacked is None and os.path.isdir(here) else 0
        if k:
            unpacked, layers_found = here, k
        if archive is None and os.path.isfile(os.path.join(d, f"neuron{n}.tar.gz")):
            archive = os.path.join(d, f"neuron{n}.tar.gz")
        text, packed = (os.path.join(d, f"sparse-images-{n}.tsv{z}") for z in ("", ".gz"))
        if inputs is None and os.path.isfile(text):
            inputs = text
            if os.path.isfile(packed):
                note = _whole_text_of(text, packed)
                if note:
                    inputs = packed
                    notes.append(note)
        elif inputs is None and os.path.isfile(packed):
            inputs = packed
        pattern = os.path.join(glob.escape(d), f"neuron{n}-l*-categories.tsv")
        for path in sorted(glob.glob(pattern) + glob.glob(pattern + ".gz")):
            got = truth_layers(path)
            if got is not None and got[0] == n:
                truth.setdefault(got[1], path)
    net = unpacked if unpacked is not None else archive
    if unpacked is not None:
        past = _past_gap(unpacked, n, layers_found)
        short = _short_directory(unpacked, n, layers_found, past)
        if layers is not None and layers_found < layers and archive is not None:
            notes.append(f"{short}, fewer than the {layers} asked: using {archive}")
            net, layers_found = archive, None
        elif layers is not None and layers_found < layers:
            notes.append(f"{short}: configurations of more layers run a generated network")
        elif past:
            notes.append(short)
    return Sources(n, net, layers_found, inputs, truth, tuple(notes))


def truth_layers(path) -> tuple | None:
    """``(N, L)`` from an official truth file's name (``neuron{N}-l{L}-categories.tsv``),
    or ``None`` for any other name."""
    m = _TRUTH_NAME.search(os.path.basename(os.fspath(path)))
    return (int(m.group(1)), int(m.group(2))) if m else None


def truth_mismatch(path, layers: int, neurons: int | None = None) -> str | None:
    """The warning line for a truth file whose name names another configuration than the
    run's (``None`` when it agrees or names none)."""
    got = truth_layers(path)
    if got is None:
        return None
    n, ell = got
    if ell != layers:
        return (
            f"mpisdnn: warning: {path} is named for {ell} layers, the run has {layers} "
            f"(--layers defaults to all the network's layers; pass --layers {ell})"
        )
    if neurons is not None and n != neurons:
        return f"mpisdnn: warning: {path} is named for N={n}, the network has N={neurons}"
    return None


# ------------------------------------------------------------------------------ the cache
def _stamp(source) -> dict:
    """What identifies a source's version: size and modification time (a directory: its
    layer files')."""
    source = os.fspath(source)
    if os.path.isdir(source):
        names = [e for e in os.scandir(source) if e.name.endswith(".tsv") and e.is_file()]
        st = [e.stat() for e in names]
        return {"files": len(st), "size": sum(s.st_size for s in st),
                "mtime_ns": max((s.st_mtime_ns for s in st), default=0)}  # fmt: skip
    st = os.stat(source)
    return {"files": 1, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _meta_path(path) -> str:
    return os.fspath(path) + ".source.json"


def _read_meta(path) -> dict | None:
    import json

    try:
        with open(_meta_path(path), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    return meta if os.path.isfile(path) else None


def _write_meta(path, meta: dict) -> None:
    from ..reporting.schema import write_json

    write_json(_meta_path(path), meta)


def _network_layers(path) -> int:
    from ..formats import hdf5

    return int(hdf5.read_network_meta(path)["layers"])


@phase("load")
def official_network(comm, opts, src: Sources, convert) -> tuple:
    """``(v2 path, layers, converted now?)`` of the official network, converted once into the
    cache (collective); ``(None, 0, False)`` without one."""
    if src.network is None:
        return None, 0, False
    path = os.path.join(opts.cache_dir, f"neuron{src.neurons}.h5")
    stamp = {"source": os.path.abspath(src.network), **_stamp(src.network)}
    meta = agree_root(comm, _read_meta, path)
    if meta is not None and meta.get("stamp") == stamp:
        return path, int(meta["layers"]), False
    log(comm, f"mpisdnn challenge: converting {src.network} -> {path} (once; re-used later)")
    agree_root(comm, os.makedirs, opts.cache_dir, exist_ok=True)
    convert(comm, src.network, path)
    layers = agree_root(comm, _network_layers, path)
    agree_root(comm, _write_meta, path, {"stamp": stamp, "layers": layers})
    return path, layers, True


#: Weights per neuron in every layer of the challenge's networks (32 per row and column).
PUBLISHED_FAN_IN = 32


def unlike_published(path, neurons: int, layers: int) -> str | None:
    """The note for a converted official network whose first ``layers`` layers do not have
    the challenge's :data:`PUBLISHED_FAN_IN` weights per neuron (a layer file cut short by
    an unpacking, or not the published network), else ``None``."""
    from ..formats import hdf5

    nnz = hdf5.read_network_meta(path)["layer_nnz"][:layers]
    want = PUBLISHED_FAN_IN * int(neurons)
    for k, got in enumerate(nnz, start=1):
        if int(got) != want:
            return (f"layer {k} of the official network has {int(got):,} weights, the "
                    f"challenge's layers have {PUBLISHED_FAN_IN} per neuron ({want:,}): not "
                    f"the network as published (a layer file cut short?)")  # fmt: skip
    return None


@phase("load")
def generated_network(comm, opts, n: int, layers: int) -> str:
    """A seeded RadiX-Net of at least ``layers`` layers from the cache, generated (rank 0,
    the deepest asked for) when missing."""
    want = max(layers, *[ell for ell in opts.layers])
    pattern = os.path.join(glob.escape(opts.cache_dir), f"generated-n{n}-l*-s{opts.seed}.h5")

    def find():
        for path in sorted(glob.glob(pattern)):
            meta = _read_meta(path)
            if meta and meta.get("layers", 0) >= layers and meta.get("seed") == opts.seed:
                return path
        return None

    path = agree_root(comm, find)
    if path is not None:
        return path
    path = os.path.join(opts.cache_dir, f"generated-n{n}-l{want}-s{opts.seed}.h5")
    log(comm, f"mpisdnn challenge: generating a {n} x {want} network -> {path}")
    agree_root(comm, _generate_network, path, n, want, opts.seed, opts.progress, comm.size,
               idle=True)  # fmt: skip
    return path


def _generate_network(path, n, layers, seed, progress, size):
    from ..formats.network_v2 import NetworkWriter
    from ..generate.radixnet import radixnet_layers
    from ..network import YMAX
    from ..progress import Heartbeat

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    source = f"mpisdnn generate network --neurons {n} --layers {layers} --seed {seed}"
    with Heartbeat(_Rank0(), f"generating {n} x {layers} network", progress) as beat:
        with NetworkWriter(path, n, YMAX, source) as out:
            for k, layer in enumerate(radixnet_layers(n, layers, seed)):
                beat.say(f"layer {k + 1}/{layers}")
                out.add(layer)
    _write_meta(path, {"layers": layers, "seed": seed, "neurons": n})


class _Rank0:
    rank = 0


@phase("load")
def generated_inputs(comm, opts, n: int) -> str:
    """Digit-like inputs for ``n`` as an official-format TSV in the cache, generated when
    missing (every rank draws its share of the rows; rank 0 writes)."""
    from ..generate import digit_images
    from ..progress import Heartbeat

    path = os.path.join(opts.cache_dir, f"generated-images-{n}-{opts.inputs}-s{opts.seed}.tsv")
    want = {"rows": opts.inputs, "seed": opts.seed, "neurons": n}
    meta = agree_root(comm, _read_meta, path)
    if meta is not None and all(meta.get(k) == v for k, v in want.items()):
        return path
    log(comm, f"mpisdnn challenge: generating {opts.inputs} inputs for N={n} -> {path}")
    agree_root(comm, os.makedirs, opts.cache_dir, exist_ok=True)
    start = opts.inputs * comm.rank // comm.size
    stop = opts.inputs * (comm.rank + 1) // comm.size
    with Heartbeat(comm, f"generating {opts.inputs} inputs", opts.progress):
        mine = agree(comm, digit_images, stop - start, n, opts.seed, start)
        parts = gather(comm, mine)
        del mine
        agree_root(comm, _write_inputs, path, parts, want, idle=True)
    return path


def _write_inputs(path, parts, meta):
    import scipy.sparse as sp

    from ..formats.tsv import write_triples

    y = parts[0] if len(parts) == 1 else sp.vstack(parts, format="csr")
    del parts[:]
    write_triples(path, y)
    _write_meta(path, meta)
