"""The CPU backend's per-layer-group preparation: what the tile and push kernels read.

:class:`PreparedNetwork` wraps a weight store and builds, on demand and per layer group, the
numba typed lists of :func:`~mpisdnn.backends._kernels.tile_group` and
:func:`~mpisdnn.backends._kernels.push_group`, each layer's column sets and push plans, and
keeps them under :data:`DERIVED_BYTES`. Split from :mod:`mpisdnn.backends.cpu` (which runs the
groups) so that the backend reads as the layer loop's steps; nothing here runs a layer.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PreparedNetwork", "DERIVED_BYTES"]


#: Derived per-layer data (column sets, push plans) a :class:`PreparedNetwork` keeps across
#: layer groups before it drops all but the current group's.
DERIVED_BYTES = 64 << 20


def _nbytes(value) -> int:
    """Bytes of an array or a tuple of arrays (what is derived for one layer)."""
    return sum(getattr(a, "nbytes", 0) for a in (value if isinstance(value, tuple) else (value,)))


class PreparedNetwork:
    """A store's layers as the tile kernel reads them, prepared lazily per layer group.

    The kernel reads each :class:`~mpisdnn.sdnn.weights.CompactLayer`'s arrays in place
    (``uint16``/``uint32`` row indices, a scalar weight, a fixed count per column), so a
    memory-mapped store shared by the ranks of a node is never copied. What is derived per
    layer (its :func:`~mpisdnn.backends._kernels.column_sets`, O(N) memory, O(nnz) time) is
    built when a group asks for the layer and kept while all layers' derived data stays under
    :data:`DERIVED_BYTES`; past it, what the next group no longer needs is dropped, so a rank
    holds private data for about one group of layers.
    """

    def __init__(self, store, share_sets=True, rotate=True):
        self.store = store
        self.rotate = bool(rotate)
        self.neurons = int(store.neurons)
        self.ymax = float(store.ymax)
        self.layers = len(store)
        self.share_sets = bool(share_sets)
        self._derived = {}
        #: Bytes of ``_derived`` and ``_groups``, kept up to date as they change.
        self._kept = 0
        #: ``(typed lists, bytes they hold)`` per layer group ``(k0, k1)``, kept like the
        #: derived data.
        self._groups = {}
        self._bias = None

    def __len__(self):
        return self.layers

    def group(self, k0, k1):
        """Typed lists of layers ``[k0, k1)`` for :func:`~mpisdnn.backends._kernels.tile_group`."""
        if (k0, k1) in self._groups:
            return self._groups[(k0, k1)][0]
        from . import _kernels

        self.retain(k0, k1)
        layers = [self.store.layer(k) for k in range(k0, k1)]
        # One index type per group (typed lists are homogeneous); stores give one anyway.
        rdt = np.result_type(*[np.asarray(lay.rows).dtype for lay in layers])
        got = {key: _typed_list() for key in ("rows", "cp", "cd", "reps", "sptr", "scols")}
        per_col = np.zeros(len(layers), np.int64)
        wv = np.zeros(len(layers), np.float32)
        bias = np.empty((len(layers), self.neurons), np.float32)
        # What the lists hold counts against the cap too (rows of a streamed store would
        # otherwise stay alive past --weight-memory); counted from the arrays, not by
        # iterating the typed lists from Python (numba compiles that per element type,
        # about 0.25 s each, in every process).
        held = bias.nbytes
        for i, (k, lay) in enumerate(zip(range(k0, k1), layers)):
            rows = np.asarray(lay.rows)
            rows = rows if rows.dtype == rdt else rows.astype(rdt)
            sets = self.sets(k)
            colptr, per_col[i] = _columns(lay)
            wv[i] = np.float32(lay.value) if lay.values is None else 0.0
            bias[i] = lay.bias
            arrays = (rows, _or_empty(colptr, np.int64), _or_empty(lay.values, np.float32))
            for key, arr in zip(("rows", "cp", "cd"), arrays):
                got[key].append(_kernels.read_only(arr))
                held += arr.nbytes
            for key, arr in zip(("reps", "sptr", "scols"), sets):
                got[key].append(arr)
        out = (
            got["rows"],
            got["cp"],
            per_col,
            got["cd"],
            wv,
            got["reps"],
            got["sptr"],
            got["scols"],
            bias,
        )
        self._groups[(k0, k1)] = (out, held)
        self._kept += held
        return out

    def retain(self, k0, k1):
        """Drop what was derived for layers outside ``[k0, k1)``, and the typed lists of other
        groups, once all that is kept passes :data:`DERIVED_BYTES`.

        A stage of a pipeline runs the same layers once per micro-batch: below the cap their
        column sets, push plans and typed lists are built once, not once per batch (at N=1024
        they were most of a later stage's time); past it a rank holds one group's worth.
        """
        if self._kept > DERIVED_BYTES:
            self._derived = {k: v for k, v in self._derived.items() if k0 <= k < k1}
            self._groups = {key: g for key, g in self._groups.items() if key == (k0, k1)}
            self._kept = sum(_nbytes(v) for d in self._derived.values() for v in d.values())
            self._kept += sum(held for _, held in self._groups.values())
        if self._bias is not None and self._bias[0] != (k0, k1):
            self._bias = None

    def _keep(self, k, name, value):
        """Keep ``value`` as what was derived for layer ``k`` under ``name``; returns it."""
        d = self._derived.setdefault(k, {})
        self._kept += _nbytes(value) - _nbytes(d.get(name))
        d[name] = value
        return value

    def sets(self, k):
        """Layer ``k``'s :func:`~mpisdnn.backends._kernels.column_sets` (built on demand)."""
        got = self._derived.get(k, {}).get("sets")
        if got is None:
            from . import _kernels

            lay = self.store.layer(k)
            colptr, per_col = _columns(lay)
            got = self._keep(
                k,
                "sets",
                _kernels.column_sets(
                    np.asarray(lay.rows),
                    colptr,
                    per_col,
                    lay.values,
                    self.neurons,
                    self.share_sets,
                ),
            )
        return got

    def layout(self, k):
        """The :func:`~mpisdnn.backends._kernels.tile_layout` of a group starting at layer ``k``
        (rotated by residue for a radix-net from ``ROTATE_NEURONS``, unless disabled)."""
        from . import _kernels

        if not self.rotate:
            return _kernels.tile_layout(self.neurons)
        _, sptr, scols = self.sets(k)
        return _kernels.layout_for_sets(self.neurons, sptr, scols)

    def sets_over(self, k0, k1, comm):
        """Column sets of layers ``[k0, k1)``, each rank finding those of every ``size``-th
        layer, then all-gathered (collective; sets do not depend on who found them)."""
        self.retain(k0, k1)
        todo = [k for k in range(k0, k1) if "sets" not in self._derived.get(k, {})]
        mine = {k: _pack_sets(self.sets(k), self.neurons) for k in todo[comm.rank :: comm.size]}
        from ..parallel import allgather

        for part in allgather(comm, mine):
            for k, sets in part.items():
                self._keep(k, "sets", _unpack_sets(sets, self.neurons))

    def push_plan(self, k):
        """Layer ``k``'s :func:`~mpisdnn.backends._kernels.push_plan` (built on demand)."""
        got = self._derived.get(k, {}).get("push")
        if got is None:
            from . import _kernels

            lay = self.store.layer(k)
            reps, sptr, scols = self.sets(k)
            colptr, per_col = _columns(lay)
            got = _kernels.push_plan(
                reps,
                sptr,
                scols,
                np.asarray(lay.rows),
                colptr,
                per_col,
                lay.values,
                lay.value,
                lay.bias,
                self.neurons,
            )
            self._keep(k, "push", got)
        return got

    def bias(self, k0, k1):
        """Biases of layers ``[k0, k1)`` as one float32 ``(layers, n)`` array (the tile
        group's, or built alone for a group that only pushes rows)."""
        if (k0, k1) in self._groups:
            return self._groups[(k0, k1)][0][-1]
        if self._bias is None or self._bias[0] != (k0, k1):
            out = np.empty((k1 - k0, self.neurons), np.float32)
            for i, k in enumerate(range(k0, k1)):
                out[i] = self.store.layer(k).bias
            self._bias = ((k0, k1), out)
        return self._bias[1]

    def push_group(self, k0, k1):
        """Typed lists of layers ``[k0, k1)`` for :func:`~mpisdnn.backends._kernels.push_group`."""
        self.retain(k0, k1)
        shape = np.zeros((k1 - k0, 4), np.int64)
        lists = [_typed_list() for _ in range(6)]
        for i, k in enumerate(range(k0, k1)):
            shape[i], *arrays = self.push_plan(k)
            _, sptr, scols = self.sets(k)
            for lst, arr in zip(lists, (*arrays, sptr, scols)):
                lst.append(arr)
        return (shape, *lists)


def _pack_sets(sets, n):
    """Column sets as the ranks exchange them: ``d`` alone for the strided sets ``{q + i d}``
    of a radix-net (what :func:`~mpisdnn.backends._kernels.column_sets` returns for them,
    rebuilt exactly by :func:`_unpack_sets`), the arrays otherwise."""
    reps = sets[0]
    d = int(reps.size)
    if 0 < d < n and n % d == 0 and int(reps[-1]) == d - 1:
        strided = _unpack_sets(d, n)
        if all(np.array_equal(a, b) for a, b in zip(sets, strided)):
            return d
    return sets


def _unpack_sets(packed, n):
    if not isinstance(packed, int):
        return packed
    from . import _kernels

    return _kernels.strided_sets(packed, n)


_LIST_CACHE_ON = False


def _typed_list():
    """An empty numba typed list (the kernels take a group's layers as typed lists).

    numba compiles its typed-list primitives afresh in every process (about 0.7 s of CPU, half
    the start-up of a small run, paid by every rank of every run) because they are not cached
    on disk; switching their cache on makes every later process load them instead."""
    global _LIST_CACHE_ON
    from numba import typed

    if not _LIST_CACHE_ON:
        _LIST_CACHE_ON = True
        from numba.typed import typedlist

        for name in ("_make_list", "_append"):
            func = getattr(typedlist, name, None)
            if hasattr(func, "enable_caching"):
                func.enable_caching()
    return typed.List()


def _columns(lay):
    """``(colptr, per_col)`` as the kernels take them: a fixed count ``per_col > 0`` and no
    pointers, or pointers and ``per_col = 0``. A layer without any weight stores a fixed
    count of 0, which the kernels would read as "use the pointers" (an empty array)."""
    if lay.colptr is not None:
        return lay.colptr, 0
    if int(lay.per_col) > 0:
        return None, int(lay.per_col)
    return lay.colptr_array(), 0


def _or_empty(arr, dtype):
    if arr is None:
        return np.zeros(0, dtype)
    a = np.asarray(arr)
    return a if a.dtype == dtype else a.astype(dtype)


class _CompactList:
    """The smallest weight store: a list of compact layers (the per-layer interface)."""

    def __init__(self, layers, neurons, ymax):
        self._layers, self.neurons, self.ymax = list(layers), int(neurons), float(ymax)

    def __len__(self):
        return len(self._layers)

    def layer(self, k):
        return self._layers[k]
