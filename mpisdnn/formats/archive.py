"""Networks as published: ``neuron{N}.tar.gz`` read as a stream (never unpacked to disk), or
the unpacked ``neuron{N}/`` directory; one layer file's text parsed by the compiled parser.

:func:`network_layers` yields the layer files of either source in the order they can be read
(a directory: by layer number; an archive: in archive order, which for the official archives
is not the layer order), each as ``(k, name, reader)``; :func:`parse_layer` turns one layer's
text into a :class:`~mpisdnn.weights.CompactLayer`. :func:`check_layer_set` names the missing,
repeated or foreign layer of a source once every member has been seen.

A tar archive is read with a small header reader (``tarfile.TarInfo.frombuf`` for each
512-byte header, GNU long names and pax ``path``/``size`` records) over the inflated stream
of :mod:`.gz`, so member data goes straight from the inflater into the parser's buffer.
"""

from __future__ import annotations

import os
import re
import sys
import tarfile

import numpy as np

from ..errors import InputError

__all__ = [
    "is_network_archive",
    "network_layers",
    "parse_layer",
    "LayerText",
    "layer_number",
    "check_layer_set",
    "read_network_archive",
    "read_first_layer",
]

_LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv$")
_BLOCK = 512


def is_network_archive(path) -> bool:
    """Whether ``path`` is a file that is a tar archive, gzip-compressed or not."""
    from .gz import is_gzip, open_bytes

    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    if is_gzip(path):
        return True  # a gzip network can only be a tar.gz; its members are checked as read
    try:
        with open_bytes(path) as fh:
            head = fh.read(_BLOCK)
    except OSError:
        return False
    if len(head) < _BLOCK:  # cut inside its first header: the reader names the cut
        return path.endswith((".tar", ".tar.gz", ".tgz"))
    return head[257:262] == b"ustar"


def layer_number(name: str):
    """``(N, k)`` of a layer file name ``n{N}-l{k}.tsv`` (any directory), else ``None``.

    Raises
    ------
    InputError
        For a name with leading zeros or layer 0 (``l01`` would duplicate ``l1``).
    """
    base = name.rsplit("/", 1)[-1]
    m = _LAYER_RE.match(base)
    if not m:
        return None
    n_text, k_text = m.groups()
    if k_text != str(int(k_text)) or n_text != str(int(n_text)) or int(k_text) < 1:
        raise InputError(
            f"{name}: bad layer file name (layers are numbered 1, 2, ... without leading zeros)"
        )
    return int(n_text), int(k_text)


class _MemberReader:
    """``readinto`` over the next ``size`` bytes of ``stream`` (one tar member's data)."""

    def __init__(self, stream, size, where):
        self.stream, self.left, self.where = stream, int(size), where
        self.size = int(size)

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        want = min(len(view), self.left)
        got = 0
        while got < want:
            n = self.stream.readinto(view[got:want])
            if not n:
                raise InputError(f"{self.where}: truncated archive (ends inside this member)")
            got += n
        self.left -= got
        return got

    def read(self, n=-1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        buf = bytearray(n)
        got = self.readinto(buf)
        return bytes(buf[:got])

    def skip(self) -> None:
        buf = bytearray(min(self.left, 1 << 20) or 1)
        while self.left:
            self.readinto(memoryview(buf)[: min(self.left, len(buf))])


def _read_exact(stream, n, path, what):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            break
        got += k
    if got and got < n:
        raise InputError(f"{path}: truncated archive (ends inside {what})")
    return bytes(buf[:got])


def _pax(data: bytes) -> dict:
    """``path`` and ``size`` of a pax extended header (records ``LEN key=value\\n``)."""
    out = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def tar_members(stream, path):
    """Yield ``(name, reader)`` for each regular file of the tar ``stream``, in order.

    ``reader`` (``readinto``, ``read``, ``size``) is valid until the next member is asked
    for; what the caller left unread is skipped.

    Raises
    ------
    InputError
        One line naming ``path``: a damaged header, an archive that ends inside a header or
        a member (truncated), or no end-of-archive marker.
    """
    long_name = None
    pax = {}
    while True:
        head = _read_exact(stream, _BLOCK, path, "a header")
        if not head:
            raise InputError(f"{path}: truncated archive (no end-of-archive marker)")
        if head == bytes(_BLOCK):
            return  # end-of-archive marker (what follows is padding)
        try:
            info = tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise InputError(f"{path}: not a tar archive or damaged header ({exc})") from None
        size = int(pax.get("size", info.size))
        name = pax.get("path", long_name or info.name)
        reader = _MemberReader(stream, size, f"{path}: {name}")
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.XGLTYPE):
            data = reader.read()
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif info.type == tarfile.XHDTYPE:
                pax = _pax(data)
        else:
            long_name, pax = None, {}
            if info.type in tarfile.REGULAR_TYPES:
                yield name, reader
            reader.skip()
        pad = -size % _BLOCK
        if pad and len(_read_exact(stream, pad, path, "padding")) < pad:
            raise InputError(f"{path}: truncated archive (ends inside {name})")


class LayerText:
    """One layer file of a network source: its layer ``k`` (1-based), ``name`` for messages
    and a ``reader`` (``readinto``) of its text, ``size`` bytes."""

    __slots__ = ("k", "neurons", "name", "reader", "size")

    def __init__(self, k, neurons, name, reader, size):
        self.k, self.neurons, self.name, self.reader, self.size = k, neurons, name, reader, size


def network_layers(source, wanted=None):
    """Yield a :class:`LayerText` for every layer file of ``source`` whose layer ``k``
    satisfies ``wanted(k)`` (all by default), in the order the source is read.

    ``source``: a ``neuron{N}/`` directory (layers in number order; its set is checked
    first, :func:`~mpisdnn.formats.tsv.scan_network_dir`) or a ``neuron{N}.tar[.gz]``
    archive (archive order). After an archive's last member, call :func:`check_layer_set`
    with the numbers seen. Members that are not layer files (a README) are skipped.
    """
    from . import tsv

    source = os.fspath(source)
    if os.path.isdir(source):
        neurons, top = tsv.scan_network_dir(source)
        for k in range(1, top + 1):
            if wanted is None or wanted(k):
                path = tsv.layer_file(source, neurons, k)
                with open(path, "rb") as fh:
                    yield LayerText(k, neurons, os.fspath(path), fh, os.path.getsize(path))
        return
    from .gz import open_bytes

    with open_bytes(source) as stream:
        for name, reader in tar_members(stream, source):
            nk = layer_number(name)
            if nk is None:
                continue
            if wanted is None or wanted(nk[1]):
                yield LayerText(nk[1], nk[0], f"{source}: {name}", reader, reader.size)


def check_layer_set(source, seen, layers=None):
    """``(N, L)`` of an archive whose layer files were ``seen`` (``[(N, k), ...]`` in
    archive order); one :class:`InputError` line for a repeated layer, a layer of another
    N, a gap (naming the first missing layer) or fewer than ``layers``."""
    if not seen:
        raise InputError(f"{source}: no n{{N}}-l{{k}}.tsv layer files found in the archive")
    neurons = seen[0][0]
    present = set()
    for n, k in seen:
        if n != neurons:
            raise InputError(
                f"{source}: n{n}-l{k}.tsv is a layer of N={n}; the archive's first layer "
                f"is of N={neurons} (mixed archive?)"
            )
        if k in present:
            raise InputError(f"{source}: n{n}-l{k}.tsv appears twice in the archive")
        present.add(k)
    top = max(present)
    if len(present) != top:
        gap = min(set(range(1, top + 1)) - present)
        raise InputError(
            f"{source}: n{neurons}-l{gap}.tsv: missing layer file (the archive has layers up "
            f"to {top}; incomplete archive?)"
        )
    if layers is not None and layers > top:
        raise InputError(
            f"{source}: n{neurons}-l{top + 1}.tsv: missing layer file (asked for {layers} "
            f"layers, the archive has {top})"
        )
    return neurons, top


class LayerParser:
    """Parses layer texts with the compiled parser, reusing its buffers from layer to layer
    (a rank's memory is one layer's text and entries, whatever the network's size)."""

    def __init__(self):
        self.buf = np.empty(0, np.uint8)
        self.out = None

    def text(self, item: LayerText) -> np.ndarray:
        """The whole text of ``item`` in the reused buffer (a view of ``size`` bytes)."""
        if self.buf.size < item.size + 1:
            self.buf = np.empty(item.size + 1, np.uint8)
        view = self.buf[: item.size]
        got = 0
        mv = memoryview(view)
        while got < item.size:
            n = item.reader.readinto(mv[got:])
            if not n:
                raise InputError(f"{item.name}: file shrank while read")
            got += n
        if item.size >= 2 and view[0] == 0x1F and view[1] == 0x8B:
            # a gzip layer file (a directory's, named .tsv, or an archive's member): what
            # the serial reader inflates too (a gzip file is told by its magic bytes)
            from .gz import inflate_bytes

            raw = inflate_bytes(view.tobytes(), item.name)
            if self.buf.size < len(raw) + 1:
                self.buf = np.empty(len(raw) + 1, np.uint8)
            view = self.buf[: len(raw)]
            view[:] = np.frombuffer(raw, np.uint8)
        return view

    def __call__(self, item: LayerText, bias):
        """The layer ``item`` as a :class:`~mpisdnn.weights.CompactLayer`."""
        return parse_layer(self.text(item), item.name, item.neurons, bias, self)


def _entries(holder, nbytes):
    cap = nbytes // 5 + 2  # the shortest line is "1 1 1\n"
    out = getattr(holder, "out", None)
    if out is None or out[0].size < cap:
        out = (np.empty(cap, np.int32), np.empty(cap, np.int32), np.empty(cap, np.float32))
        if holder is not None:
            holder.out = out
    return out


def parse_layer(text: np.ndarray, name: str, neurons: int, bias, holder=None):
    """One layer file's ``text`` (uint8 array) as a column-wise
    :class:`~mpisdnn.weights.CompactLayer`.

    The layer parser (``_tsv_kernels.parse_layer_text``, 3x the general parser's rate)
    takes the strict official form in (column, row) order; other text goes to the general
    compiled parser (``_tsv_kernels.parse_block``), and what that does not accept to the
    serial reader, whose checks name the exact line. Entries out of column order are
    sorted, and a duplicate ``(row, column)`` names its line.
    """
    from . import _tsv_kernels as K
    from . import tsv

    rows, cols, vals = _entries(holder, text.size)
    counts = np.zeros(neurons, np.int64)
    status, count, ordered, uniform = K.parse_layer_text(
        text, text.size, neurons, rows, cols, vals, counts
    )
    if status == K.OK and ordered:  # the official form and order: no sort, no repeat
        tsv.check_layer_entries(name, count)
        if text.size and text[-1] != 10:
            tsv.check_last_line(name, text[-64:].tobytes())
        return tsv.compact_from_ordered(
            rows[:count], counts, vals[:count], uniform, neurons, bias
        )
    bounds = np.array([neurons, neurons], dtype=np.int64)
    status, count, used, _ = K.parse_block(
        text, text.size, True, bounds, rows, cols, vals, np.empty(0, np.int64)
    )
    if status != K.OK or used != text.size:
        raw = text.tobytes()
        r, c, v = tsv._triples(name, raw, neurons, neurons, 0)
        if raw and not raw.endswith(b"\n"):
            tsv.check_last_line(name, raw)
        return tsv.compact_from_triples(name, raw, r, c, v, neurons, bias)
    if text.size and text[-1] != 10:
        tsv.check_last_line(name, text[-64:].tobytes())
    return tsv.compact_from_triples(
        name, text, rows[:count], cols[:count], vals[:count], neurons, bias
    )


def read_first_layer(source, bias=None):
    """The first layer file of a TSV network ``source`` in the order it is read (an
    archive's first member, whatever its number; a directory's layer 1) as a one-layer
    :class:`~mpisdnn.weights.CompactStore`, the rest of the source not read: what a run's
    :func:`~mpisdnn.formats.network_read.read_network_compact` gives, for one layer.

    What a warm-up needs: every layer of a network gives the kernels the same types. Layer
    1 is not asked for, because the official archives list their layers in no order (in
    ``neuron1024.tar.gz`` it is the 70th of 120 members), and finding it in
    ``neuron65536.tar.gz`` can mean inflating most of 17 GB.
    """
    from ..network import YMAX
    from ..weights import CompactStore
    from .tsv import layer_bias

    layers = network_layers(source)
    try:
        for item in layers:
            b = layer_bias(source, item.neurons, bias)
            return CompactStore([LayerParser()(item, b)], item.neurons, YMAX,
                                source=os.fspath(source))  # fmt: skip
    finally:
        layers.close()  # an archive's stream and its inflating thread end here
    raise InputError(f"{source}: no n{{N}}-l{{k}}.tsv layer files found")


def read_network_archive(path, layers=None, neurons=None, bias=None, layer_start=0):
    """:func:`~mpisdnn.formats.tsv.read_network_tsv` for a ``neuron{N}.tar.gz`` (read as a
    stream, in one pass): a :class:`~mpisdnn.network.Network` of layers
    ``[layer_start, layers)``."""
    from ..errors import ShapeError
    from ..network import Network
    from .tsv import layer_bias

    archive = sys.modules[__name__]

    parser = archive.LayerParser()
    got, seen = {}, []
    for item in archive.network_layers(path):
        seen.append((item.neurons, item.k))
        if item.k <= layer_start or (layers is not None and item.k > layers):
            continue
        if item.neurons != seen[0][0]:
            continue  # a foreign layer: check_layer_set names it (not its missing bias)
        if neurons is not None and item.neurons != neurons:
            raise ShapeError(f"{path}: files are for N={item.neurons}, expected N={neurons}")
        got[item.k] = parser(item, layer_bias(path, item.neurons, bias))
    found_n, top = archive.check_layer_set(path, seen, layers)
    layers = top if layers is None else layers
    mats = [got[k].to_csr() for k in range(layer_start + 1, layers + 1)]
    b = layer_bias(path, found_n, bias)
    return Network(
        mats,
        np.full((len(mats), found_n), b, dtype=np.float32),
        neurons=found_n,
        total_layers=layers,
        layer_start=layer_start,
        source=os.fspath(path),
    )
