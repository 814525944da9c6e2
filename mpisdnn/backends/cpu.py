"""Fused CPU backend: feature-major 16-row tiles, several layers per pass, dead rows dropped.

Design (measured in ``docs/performance.md``):

* **Tiles.** Rows of Y are processed 16 at a time, feature-major, so each multiply-add is one
  16-lane vector operation (``_simd``), computed column by column from W in CSC ("pull"):
  bias, ReLU and clip happen in the register and every output column is stored once. scipy and
  SuiteSparse:GraphBLAS need four passes per layer (multiply, bias, select, min).
* **Layer groups.** A chunk of up to 256 rows stays in its thread's tiles (L2-sized) for a
  whole *group* of layers; rows that die are repacked out after every layer, so the tiles stay
  full. Between groups the survivors of all chunks are regrouped, which is also where the
  engine can rebalance ranks.
* **No compaction copies.** Each chunk writes its output rows into its own slot of a reserved
  output buffer (``rows x N`` entries of address space, of which only the written pages become
  memory), and the next group reads the rows in place through (start, length) pairs.

Rows never interact, so results are bit-identical for any chunking, thread or rank count.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import BackendError
from ._cpu_prepare import PreparedNetwork, _CompactList
from ._cpu_rows import Rows, _drop_pages, _join_rows, _merge_pieces, _owned, _reserve
from .base import STAT_KEYS, Backend

#: Largest rows-per-chunk, in tiles of 16 rows (256 rows: two tile sets fit in L2 at N=1024).
CHUNK_TILES = 16
#: Most bytes of the two ping-pong tile sets of one chunk: at large N a chunk has fewer tiles
#: so that a tile and its output stay in the last-level cache through a layer group (a
#: 16-row tile is 4.3 MB at N=65536; 16 of them streamed every layer from DRAM ran 1.5x
#: slower than one at a time). 1024 -> 16 tiles, 4096 -> 7, 16384 and up -> 1.
CHUNK_BYTES = 4 << 20
#: Rows with fewer non-zeros than this share of N run in the push kernel (row by row, layer
#: after layer while they stay that sparse) instead of tiles, from ``PUSH_NEURONS``: a row's
#: state then stays in L1/L2 where a 16-row tile (4 MiB at N=65536) streams from L3. Measured
#: (``docs/performance.md``): 1.25x faster at N=16384, 2x at 65536, even at 4096, and 1.3x
#: slower at N=1024, where the tiles fit in L2.
SPARSE_DENSITY = 0.5
PUSH_NEURONS = 8192
#: From ``PUSH_NEURONS``, a call with at most this many dense rows per thread runs them one
#: at a time (``_kernels.pull_rows``, the tile kernel with one lane): a tile of 1-2 rows (the
#: deduplicated tail of a challenge network: every survivor at YMAX, 1-2 kept rows per rank)
#: streams 16 lanes of 8 MiB ping-pong tiles per layer at N=65536 for one or two useful
#: ones, and pushing them needs a transposed plan per layer. Measured at N=65536, one
#: thread, loaded machine (``docs/performance.md``).
FEW_ROWS = 4
#: Address space reserved for one group's output at most, in entries (8 bytes each); larger
#: groups are run in batches. Untouched pages cost no memory, so this can be generous.
OUTPUT_RESERVE = 1 << 30
#: A group whose input (owned by this backend) exceeds this many bytes runs in
#: ``RELEASE_SPLIT`` launches, returning the input's memory launch by launch: the peak is then
#: about 1.25 layer outputs instead of 2 (the input and the output of the group).
RELEASE_BYTES = 32 << 20
RELEASE_SPLIT = 4
#: From this many neurons the ranks split the column-set search of each layer group and
#: exchange the sets (``share_preparation``): ~0.1 ms per layer at N=1024, less than the
#: exchange; ~1.7 ms at N=65536, as much as a steady-state layer of a few dozen rows.
SHARED_SETS_NEURONS = 8192
#: Columns of the kernels' per-layer statistics, in the order of ``base.STAT_KEYS``.
STAT_COLS = len(STAT_KEYS)


def _search_sets(net) -> None:
    """Compile the column-set search of a layer that is not laid out as a radix-net's (a
    layer file cut short, a user's own network; ``_kernels.column_sets``' general path) on a
    two-column layer in each index form the network's layers can take. Layer 0 (what the
    other warm-up steps run) is a radix-net's in the official files, and the sets of the
    other layers are found inside the timed loop: one irregular layer there compiled the
    search in part 1 (1.96 s of a 0.04 s part 1 at N=1024, 2,000 inputs)."""
    from . import _kernels

    store = getattr(net, "store", None)
    if store is None or len(store) == 0:
        return
    rdt = np.asarray(store.layer(0).rows).dtype
    per_word = max(1, 8 // rdt.itemsize)  # a fixed width of 8 bytes: compared as words
    for per_col in (per_word, 1):
        rows = np.arange(2 * per_col, dtype=rdt)[::-1].copy()
        _kernels.column_sets(rows, None, per_col, None, 2)


class CpuBackend(Backend):
    """Numba backend. ``threads`` sets numba's thread count (default: all cores / local ranks)."""

    name = "cpu"
    fuses_layers = True

    def __init__(
        self,
        threads=None,
        chunk_tiles=CHUNK_TILES,
        output_reserve=OUTPUT_RESERVE,
        share_sets=True,
        chunk_bytes=CHUNK_BYTES,
        sparse_density=None,
        rotate=True,
    ):
        try:
            import numba

            from . import _kernels
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            raise BackendError(f"backend 'cpu' needs numba: {exc}") from None
        self._numba = numba
        self._k = _kernels
        if threads:
            numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
        self.threads = numba.get_num_threads()
        self.chunk_tiles = max(1, int(chunk_tiles))
        self.output_reserve = max(1, int(output_reserve))
        #: Sum each set of columns with identical inputs and weights once (ablation switch).
        self.share_sets = bool(share_sets)
        #: Lay radix-net tiles out by residue (``_kernels.tile_layout``; ablation switch).
        self.rotate = bool(rotate)
        self.chunk_bytes = max(1, int(chunk_bytes))
        #: Rows with fewer non-zeros than this share of N run in the push kernel (0: never;
        #: None: ``SPARSE_DENSITY`` from ``PUSH_NEURONS`` neurons, else 0).
        self.sparse_density = None if sparse_density is None else float(sparse_density)
        self._n = 1024  # features of the last network seen (sizes chunks in ideal_tiles)
        self._buf = None

    @classmethod
    def from_options(cls, options, comm):
        from ..system import default_threads, local_ranks

        threads = options.threads or default_threads(local_ranks(comm))
        return cls(
            threads,
            options.chunk_tiles,
            options.output_reserve,
            sparse_density=options.push_density,
        )

    def _few_rows_path(self, n: int) -> bool:
        """Whether a call with few dense rows runs them one at a time (the pull kernel):
        from ``PUSH_NEURONS``, unless a ``sparse_density`` is set."""
        return self.sparse_density is None and n >= PUSH_NEURONS

    def push_density(self, n: int) -> float:
        """The ``sparse_density`` in force for ``n`` neurons."""
        if self.sparse_density is not None:
            return self.sparse_density
        return SPARSE_DENSITY if n >= PUSH_NEURONS else 0.0

    def describe(self):
        return {
            "name": self.name,
            "threads": self.threads,
            "chunk_rows": self.chunk_tiles * 16,
            "chunk_bytes": self.chunk_bytes,
            "share_sets": self.share_sets,
            "rotate": self.rotate,
            "push_density": self.push_density(self._n),
        }

    def tiles_per_chunk(self, n: int) -> int:
        """Tiles per chunk at ``n`` features: ``chunk_tiles``, fewer when the chunk's two tile
        sets would exceed ``chunk_bytes``."""
        from . import _kernels

        per_tile = 2 * _kernels.padded(int(n)) * 16 * 4
        return max(1, min(self.chunk_tiles, self.chunk_bytes // max(1, per_tile)))

    # -- representation ------------------------------------------------------------------
    def to_device(self, mat):
        return mat if isinstance(mat, Rows) else Rows.from_csr(mat)

    def to_host(self, mat, consume=False):
        """CSR of the rows. With ``consume`` (the caller drops ``mat``), rows in this backend's
        own output buffer give their memory back while being copied: no moment with two
        full copies of a (possibly largest) final output."""
        if not isinstance(mat, Rows):
            return sp.csr_matrix(mat)
        return mat.to_csr(release=consume and _owned(mat) and mat.packed_in_order())

    def row_nnz(self, y):
        return np.asarray(y.lens, dtype=np.int64)

    def take_rows(self, y, rows):
        return y.take(rows)

    def row_view(self, y):
        """The rows' own buffers (no copy: a check for identical rows reads them in place)."""
        y = self.to_device(y)
        return y.starts, y.lens, y.indices, y.data

    def row_work(self, y):
        """Cost of each row in the next layers: a tile costs the same whatever its density."""
        return np.ones(y.shape[0], dtype=np.int64)

    def ideal_tiles(self, nrows: int) -> int:
        """Tiles one layer needs for ``nrows`` freshly grouped rows (partial tiles included)."""
        bounds = chunk_bounds(int(nrows), self.threads, self.tiles_per_chunk(self._n))
        return int(((np.diff(bounds) + 15) // 16).sum())

    def prepare_layer(self, layer):
        """CSR of one layer, what :meth:`layer` takes (the fused path uses
        :meth:`prepare_network`)."""
        return layer.to_csr()

    def share_preparation(self, net, k0, k1, comm):
        """Split the column-set search of a group's layers over the ranks (from
        ``SHARED_SETS_NEURONS`` neurons)."""
        if comm.size > 1 and net.share_sets and net.neurons >= SHARED_SETS_NEURONS:
            net.sets_over(k0, k1, comm)

    def prepare_network(self, store):
        """The store wrapped for lazy, per-group preparation (nothing is copied here).

        An in-memory store converts its CSR layers to compact form on first use; that
        one-off conversion is done here, before the timed loop (a mapped store needs none).
        """
        from ..weights import HeldStore, InMemoryStore

        self._n = int(store.neurons)
        if isinstance(store, InMemoryStore):
            for k in range(len(store)):
                store.layer(k)
        else:
            # The engine releases a block right after preparing it: hold its layers now
            # (views of a map, or the arrays a streaming store read), never re-read them.
            store = HeldStore(store)
        return PreparedNetwork(store, self.share_sets, self.rotate)

    def warmup(self, net):
        """Compile the kernels on a one-row problem (kept out of the timings)."""
        for step in self.warmup_steps(net):
            step()

    def warmup_steps(self, net):
        """The warm-up's independent steps: the tile kernel, the pull kernel (only where a
        call can take it), the push kernel's path and the CSR gather, each on a one-row
        problem (a first run's ranks compile different ones at once)."""
        n = net.neurons
        if len(net) == 0:
            return []

        def tiny():
            return Rows(np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int32),
                        np.ones(1, np.float32), n)  # fmt: skip

        def dense():
            return Rows(np.zeros(1, np.int64), np.full(1, n, np.int64),
                        np.arange(n, dtype=np.int32), np.ones(n, np.float32), n)  # fmt: skip

        # Every path the run can take: a one-row problem would only take the push kernel
        # from PUSH_NEURONS, and the tile kernel would then compile inside the timed loop;
        # below PUSH_NEURONS no call takes the pull kernel (11 s of a first run's compiling).
        steps = [lambda: self._tile_layers(tiny(), net, 0, 1, True)]
        if self._few_rows_path(n):
            steps.append(lambda: self._pull_rows(dense(), net, 0, 1, True, _NO_WEIGHTS))
        steps += [lambda: self.run_layers(tiny(), net, 0, 1, True), lambda: tiny().to_csr()]
        if self.share_sets:
            steps.append(lambda: _search_sets(net))
        return steps

    # -- compute -------------------------------------------------------------------------
    def layer(self, y, w, bias, ymax):
        """One layer (the generic per-layer interface; the engine uses :meth:`run_layers`)."""
        from ..weights import CompactLayer

        y = self.to_device(y)
        w = w.to_csr() if isinstance(w, Rows) else w
        n = w.shape[1]
        layer = CompactLayer.from_matrix(w, np.broadcast_to(bias, (n,)))
        net = PreparedNetwork(_CompactList([layer], n, ymax), self.share_sets, self.rotate)
        out, _, _ = self.run_layers(y, net, 0, 1, prune=False)
        return out

    def run_layers(self, y, net, k0, k1, prune=True, consume=False, weights=None):
        """Layers ``[k0, k1)`` of ``net`` (a :class:`PreparedNetwork`) on the rows of ``y``.

        Rows sparser than ``sparse_density`` (non-zeros / N) go row by row through the push
        kernel, layer after layer while they stay that sparse; the others, and those that
        became denser, run the rest of the group in tiles. Every path gives the same bits.
        See :meth:`_tile_layers` for the arguments and the result.
        """
        net.retain(k0, k1)
        n = net.neurons
        nrows = y.shape[0]
        rw = _row_weights(weights, nrows)
        limit = int(np.ceil(self.push_density(n) * n))
        sparse = np.asarray(y.lens) < limit
        few = self._few_rows_path(n) and nrows <= FEW_ROWS * self.threads
        if few and k1 > k0 and nrows and not sparse.any():
            return self._pull_rows(y, net, k0, k1, prune, rw)
        if k1 <= k0 or nrows == 0 or not sparse.any():
            return self._tile_layers(y, net, k0, k1, prune, consume, rw)
        nl = k1 - k0
        stats = np.zeros((nl, STAT_COLS), np.int64)
        pieces = []  # (index in y, rows)
        pushed = np.flatnonzero(sparse)
        out, stop = self._push_group(y.take(pushed), net, k0, k1, limit, stats, _sub(rw, pushed))
        if not sparse.all():
            dense = np.flatnonzero(~sparse)
            o, kp, st = self._tile_layers(
                y.take(dense), net, k0, k1, prune, consume, _sub(rw, dense)
            )
            pieces.append((dense[kp], o))
            stats += _table(st)
        for s in np.unique(stop):
            sel = np.flatnonzero(stop == s)
            if s == nl:
                if prune:
                    sel = sel[out.lens[sel] > 0]
                pieces.append((pushed[sel], out.take(sel)))
                continue
            # Rows that became dense: the rest of the group in tiles.
            o, kp, st = self._tile_layers(
                out.take(sel), net, k0 + int(s), k1, prune, False, _sub(rw, pushed[sel])
            )
            pieces.append((pushed[sel[kp]], o))
            stats[s:] += _table(st)
        keep, rows = _join_rows(pieces, n)
        return rows, keep, _stats(stats)

    def _push_group(self, y, net, k0, k1, limit, stats, rw):
        """Layers ``[k0, k1)`` with :func:`~mpisdnn.backends._kernels.push_group` on rows
        that are all sparser than ``limit``; returns their state and where each stopped.
        Adds the pushed layers' active rows, non-zeros, tile equivalents and rows to
        ``stats``."""
        n = net.neurons
        nrows = y.shape[0]
        plan = net.push_group(k0, k1)
        bias = net.bias(k0, k1)
        scratch = self._k.push_scratch(self.threads, n)
        st = np.zeros((self.threads, k1 - k0, STAT_COLS), np.int64)
        out_len = np.zeros(nrows, np.int64)
        stop = np.zeros(nrows, np.int64)
        per_batch = max(1, self.output_reserve // n)
        # Row ``r`` of a batch is written at ``r * n`` of the batch's own buffer.
        starts = (np.arange(nrows, dtype=np.int64) % per_batch) * n
        parts = []
        for r0 in range(0, nrows, per_batch):
            r1 = min(nrows, r0 + per_batch)
            oi, od = _reserve((r1 - r0) * n)
            with self._numba.parallel_chunksize(4):
                self._k.push_group(
                    y.starts[r0:r1],
                    y.lens[r0:r1],
                    y.indices,
                    y.data,
                    *plan,
                    bias,
                    np.float32(net.ymax),
                    n,
                    limit,
                    scratch,
                    oi,
                    od,
                    starts[r0:r1],
                    out_len[r0:r1],
                    stop[r0:r1],
                    st,
                    _sub(rw, slice(r0, r1)),
                )
            parts.append((r0, r1, oi, od))
        st = st.sum(axis=0)
        stats[:, [0, 1, 3]] += st[:, [0, 1, 3]]
        # Pushed rows count as the tiles they would have filled: the engine splits a group's
        # time over its layers by tiles and sizes the next group by tiles against rows.
        lanes = self._k.LANES
        stats[:, 2] += (st[:, 2] + lanes - 1) // lanes
        return _merge_pieces(parts, starts, out_len, n), stop

    def _pull_rows(self, y, net, k0, k1, prune, rw):
        """Layers ``[k0, k1)`` for a few dense rows, one at a time
        (:func:`~mpisdnn.backends._kernels.pull_rows`); the result of :meth:`_tile_layers`."""
        n = net.neurons
        nrows = y.shape[0]
        group = net.group(k0, k1)
        buf = np.zeros((self.threads, 2, n), np.float32)
        st = np.zeros((self.threads, k1 - k0, STAT_COLS), np.int64)
        starts = np.arange(nrows, dtype=np.int64) * n
        out_len = np.zeros(nrows, np.int64)
        oi, od = _reserve(nrows * n)
        self._k.pull_rows(
            y.starts, y.lens, y.indices, y.data, group, np.float32(net.ymax), n,
            bool(prune), buf, oi, od, starts, out_len, st, rw,
        )  # fmt: skip
        stats = st.sum(axis=0)
        stats[:, 2] = (stats[:, 2] + self._k.LANES - 1) // self._k.LANES  # as tiles
        out = Rows(starts, out_len, oi, od, n)
        keep = np.flatnonzero(out_len > 0) if prune else np.arange(nrows, dtype=np.int64)
        if keep.size < nrows:
            out = out.take(keep)
        return out, keep, _stats(stats)

    def _tile_layers(self, y, net, k0, k1, prune=True, consume=False, rw=None):
        """Layers ``[k0, k1)`` of ``net`` in tiles, on the rows of ``y``.

        With ``consume`` the caller promises never to use ``y`` again: when its rows live in
        this backend's own output buffer, their memory is returned as the rows are used.
        ``rw``: int64 weight of each row in the ``active`` and ``nnz`` statistics (empty or
        ``None``: 1 each).

        Returns
        -------
        out : Rows
            The rows that are still alive (all rows when ``prune`` is false), in input order.
        keep : ndarray of int64
            Index in ``y`` of each row of ``out``.
        stats : dict of ndarray
            Per layer: ``active`` rows, ``nnz`` and ``tiles`` computed.
        """
        k = self._k
        n = net.neurons
        nrows = y.shape[0]
        nl = k1 - k0
        stats = np.zeros((nl, STAT_COLS), np.int64)
        if nrows == 0 or nl <= 0:
            empty = Rows(
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                np.zeros(0, np.int32),
                np.zeros(0, np.float32),
                n,
            )
            return empty, np.zeros(0, np.int64), _stats(stats)
        self._n = n
        rw = _row_weights(rw, nrows)
        ct = self.tiles_per_chunk(n)
        bounds = chunk_bounds(nrows, self.threads, ct)
        buf = self._scratch(n, int(np.diff(bounds).max()))
        group = net.group(k0, k1)
        lay = net.layout(k0)
        out_start = np.zeros(nrows, np.int64)
        out_len = np.zeros(nrows, np.int64)
        # Batches of chunks whose reserved output fits ``output_reserve`` entries.
        per_batch = max(1, self.output_reserve // max(1, n * (ct * 16)))
        release = consume and _owned(y) and 8 * y.nnz >= RELEASE_BYTES and y.packed_in_order()
        pieces = []
        for b0 in range(0, bounds.size - 1, per_batch):
            b1 = min(bounds.size - 1, b0 + per_batch)
            oi, od = _reserve(int(bounds[b1] - bounds[b0]) * n)
            base = (bounds[b0:b1] - bounds[b0]) * n
            st = np.zeros((b1 - b0, nl, STAT_COLS), np.int64)
            launches = np.linspace(b0, b1, (RELEASE_SPLIT if release else 1) + 1).astype(int)
            for l0, l1 in zip(launches[:-1], launches[1:]):
                if l1 <= l0:
                    continue
                with self._numba.parallel_chunksize(1):  # dynamic: chunks die at different layers
                    k.tile_group(
                        y.starts,
                        y.lens,
                        y.indices,
                        y.data,
                        bounds[l0 : l1 + 1],
                        group,
                        np.float32(net.ymax),
                        n,
                        bool(prune),
                        buf,
                        base[l0 - b0 : l1 - b0],
                        oi,
                        od,
                        out_start,
                        out_len,
                        st[l0 - b0 : l1 - b0],
                        lay,
                        rw,
                    )
                if release:  # those rows are in the tiles' output now: free their input
                    r0, r1 = int(bounds[l0]), int(bounds[l1])
                    hi = y.starts[r1] if r1 < nrows else y.starts[-1] + y.lens[-1]
                    _drop_pages(y.indices, int(y.starts[r0]), int(hi))
                    _drop_pages(y.data, int(y.starts[r0]), int(hi))
            stats += st.sum(axis=0)
            pieces.append((int(bounds[b0]), int(bounds[b1]), oi, od))
        out = _merge_pieces(pieces, out_start, out_len, n)
        keep = np.flatnonzero(out_len > 0) if prune else np.arange(nrows, dtype=np.int64)
        if keep.size < nrows:
            out = out.take(keep)
        return out, keep, _stats(stats)

    def _scratch(self, n, rows):
        """Per-thread ping-pong tile buffers, kept across calls (only ever grown)."""
        from . import _kernels

        tiles = (rows + 15) // 16
        size = tiles * _kernels.padded(n) * 16
        b = self._buf
        if b is None or b.shape[0] < self.threads or b.shape[2] < size:
            # Zeroed once: the padding slots are never written, and kernels zero what they use.
            self._buf = b = np.zeros((self.threads, 2, size), np.float32)
        return b


def _row_weights(weights, nrows):
    """The kernels' form of per-row statistics weights: int64, empty when all are 1."""
    if weights is None:
        return _NO_WEIGHTS
    w = np.ascontiguousarray(weights, np.int64)
    if w.size == 0 or (w.size == nrows and bool((w == 1).all())):
        return _NO_WEIGHTS
    if w.size != nrows:
        raise ValueError(f"{w.size} row weights for {nrows} rows")
    return w


def _sub(rw, sel):
    """The weights of the rows ``sel`` (empty stays empty: every row counts once)."""
    return rw if rw.size == 0 else np.ascontiguousarray(rw[sel])


_NO_WEIGHTS = np.zeros(0, np.int64)


def _stats(st):
    return {key: st[:, i].copy() for i, key in enumerate(STAT_KEYS)}


def _table(st):
    return np.stack([st[key] for key in STAT_KEYS], axis=1)


def chunk_bounds(nrows: int, threads: int, max_tiles: int) -> np.ndarray:
    """Row boundaries of the chunks a group is split into (pure).

    Many rows: chunks of ``max_tiles`` tiles, scheduled dynamically. Few rows (the long tail
    of survivors): a multiple of ``threads`` chunks of near-equal tile counts, so no thread
    idles while another finishes a big chunk.
    """
    tiles = (nrows + 15) // 16
    if tiles == 0:
        return np.zeros(1, np.int64)
    threads = max(1, int(threads))
    if tiles >= 8 * threads * max_tiles:
        nchunks = (tiles + max_tiles - 1) // max_tiles
    else:
        nchunks = threads * max(1, -(-tiles // (threads * max_tiles)))
        nchunks = min(nchunks, tiles)
    t_bounds = (np.arange(nchunks + 1, dtype=np.int64) * tiles) // nchunks
    return np.minimum(t_bounds * 16, nrows).astype(np.int64)
