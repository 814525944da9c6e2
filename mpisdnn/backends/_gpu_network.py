"""The GPU backend's weights: a network's layers packed for the kernels, on the device.

:class:`GpuNetwork` keeps the layers resident on the device when they fit, else streams a
group's layers host -> device into one of two slots while the previous group runs in the
other; :func:`column_sets` gives what the kernels sum once per set of equal columns. Split
from :mod:`mpisdnn.backends.gpu` (which re-exports both and runs the groups).
"""

from __future__ import annotations

import numpy as np

from ..errors import BackendError

__all__ = ["GpuNetwork", "column_sets"]


def column_sets(layer, n, share=True):
    """A layer's column sets for the kernels: ``(stride, reps, sptr, scols)``.

    Output columns with the same inputs and the same weights (a radix-net's 16 columns
    ``{q, q + N/16, ...}``) have the same sum, bit for bit: the kernels sum each set once and
    write it to every member with the member's own bias. Found exactly by the cpu backend's
    :func:`~mpisdnn.backends._kernels.column_sets`. ``stride > 0``: the sets are
    ``{q + i stride}`` for ``q < stride`` (members need no table: ``sptr``/``scols`` are
    ``None``); a layer without equal columns is the stride ``N`` (every set one column), and
    so is every layer with ``share=False`` (the ablation: every column summed on its own)."""
    from . import _kernels

    if layer.colptr is not None:
        colptr, per_col = layer.colptr, 0
    elif int(layer.per_col) > 0:
        colptr, per_col = None, int(layer.per_col)
    else:
        colptr, per_col = layer.colptr_array(), 0
    reps, sptr, scols = _kernels.column_sets(
        np.asarray(layer.rows), colptr, per_col, layer.values, n, bool(share)
    )
    d = int(reps.size)
    if (d and n % d == 0 and sptr.size == d + 1 and np.array_equal(reps, np.arange(d))
            and np.array_equal(scols, _kernels.strided_sets(d, n)[2])):
        return d, np.asarray(reps, np.int64), None, None
    return 0, np.asarray(reps, np.int64), np.asarray(sptr, np.int64), np.asarray(scols)


class GpuNetwork:
    """A network's layers packed for the kernels: device-resident or streamed in two slots.

    Only one column per column set is stored (:func:`column_sets`: N/16 of a radix-net's
    columns, so its weights take 1/16 of the device memory and of the sums). Per layer ``k``
    the kernels read a row of the table ``lt`` (int64, ``_cuda_kernels.layer_of``: index,
    value and colptr offsets, fixed count per stored column or -1, has values, sets per staged
    batch, bias offset, sets, member stride, member-table offsets) and ``lv[k]`` (the single
    weight value). A *slot* holds the arrays and the tables of a run of consecutive layers,
    offsets relative to the slot.
    """

    def __init__(self, backend, store, resident_bytes=None):
        self.be = backend
        self.neurons = n = int(store.neurons)
        self.ymax = float(store.ymax)
        self.layers = [store.layer(k) for k in range(len(store))]
        if n > np.iinfo(np.int32).max:
            raise BackendError(f"backend 'gpu': {n} neurons exceed the int32 index range")
        self.index_dtype = np.uint16 if n <= 1 << 16 else np.uint32
        self.sets = [column_sets(layer, n, backend.column_sets) for layer in self.layers]
        #: Column sets per layer (the kernels' "columns").
        self.nsets = [int(st[1].size) for st in self.sets]
        self.sizes = [self._layer_bytes(k) for k in range(len(self.layers))]
        total = sum(self.sizes)
        budget = resident_bytes if resident_bytes is not None else backend.weight_budget()
        self.resident = total <= budget
        self.weight_bytes = total
        backend.counters["weights"] = "resident" if self.resident else "streamed"
        self.slots = []
        self._current = None
        self._tables = {}
        if self.resident and self.layers:
            self.slots.append(self._fill_slot(None, 0, len(self.layers)))

    def __len__(self):
        return len(self.layers)

    def _layer_bytes(self, k):
        """Device bytes of layer ``k`` as packed: its sets' columns, bias and member table."""
        layer, (stride, reps, _, _) = self.layers[k], self.sets[k]
        entries = int(np.diff(layer.colptr_array())[reps].sum())
        isz = np.dtype(self.index_dtype).itemsize
        bias = np.asarray(layer.bias, np.float32).view(np.uint32)
        b = entries * isz + 4 * (1 if bias.size and (bias == bias[0]).all() else self.neurons)
        if layer.values is not None:
            b += 4 * entries
        if layer.colptr is not None:
            b += 8 * (reps.size + 1)
        if stride == 0:
            b += 8 * (reps.size + 1) + isz * self.neurons
        return b

    def _set_columns(self, k):
        """Layer ``k``'s stored columns (one per set): ``(rows, values or None, colptr or
        None, counts)``."""
        layer, reps = self.layers[k], self.sets[k][1]
        rows = np.asarray(layer.rows)
        if layer.colptr is None:
            per = int(layer.per_col)
            counts = np.full(reps.size, per, np.int64)
            if per == 0:
                return rows[:0], None, None, counts
            vals = None
            if layer.values is not None:
                vals = np.asarray(layer.values, np.float32).reshape(-1, per)[reps].ravel()
            return rows.reshape(-1, per)[reps].ravel(), vals, None, counts
        cp = np.asarray(layer.colptr, np.int64)
        counts = cp[reps + 1] - cp[reps]
        scp = np.zeros(reps.size + 1, np.int64)
        np.cumsum(counts, out=scp[1:])
        idx = np.repeat(cp[reps] - scp[:-1], counts) + np.arange(int(scp[-1]), dtype=np.int64)
        vals = None if layer.values is None else np.asarray(layer.values, np.float32)[idx]
        return rows[idx], vals, scp, counts

    def _pack(self, k0, k1):
        """Host arrays and tables for layers ``[k0, k1)`` (offsets from 0)."""
        from ._cuda_kernels import LAYER_FIELDS

        shared = self.be.k.shared_entries
        lt = np.zeros((max(1, k1 - k0), LAYER_FIELDS), np.int64)
        lv = np.zeros(max(1, k1 - k0), np.float32)
        idx, val, cps, bias, mps, mcs = [], [], [], [], [], []
        eo = vo = co = mo = mco = bo = 0
        for i, k in enumerate(range(k0, k1)):
            layer = self.layers[k]
            stride, reps, sptr, scols = self.sets[k]
            rows, vals, scp, counts = self._set_columns(k)
            longest = int(counts.max()) if counts.size else 0
            cb = max(1, min(64, shared // max(1, longest)))
            fixed = int(layer.per_col) if layer.colptr is None else -1
            hasval = int(vals is not None)
            b = np.asarray(layer.bias, np.float32)
            uniform = b.size > 0 and bool((b.view(np.uint32) == b[:1].view(np.uint32)).all())
            if uniform:  # one bias for the layer (the challenge's): stored once, step 0
                b = b[:1]
            step = int(not uniform)
            lt[i] = (eo, vo, co, fixed, hasval, cb, bo, reps.size, stride, mo, mco, step)
            lv[i] = np.float32(layer.value)
            idx.append(rows.astype(self.index_dtype, copy=False))
            eo += rows.size
            if vals is not None:
                val.append(vals)
                vo += vals.size
            if scp is not None:
                cps.append(scp)
                co += scp.size
            if stride == 0:
                mps.append(sptr)
                mcs.append(scols.astype(self.index_dtype, copy=False))
                mo += sptr.size
                mco += scols.size
            bias.append(b)
            bo += b.size

        def cat(parts, dtype):
            return np.concatenate(parts) if parts else np.zeros(1, dtype)

        return {
            "wi": cat(idx, self.index_dtype),
            "wv": cat(val, np.float32),
            "wcp": cat(cps, np.int64),
            "bias": cat(bias, np.float32),
            "mp": cat(mps, np.int64),
            "mc": cat(mcs, self.index_dtype),
            "lt": lt,
            "lv": lv,
        }

    def _fill_slot(self, slot, k0, k1, stream=None):
        """Layers ``[k0, k1)`` into a slot: synchronously (resident), or on ``stream``."""
        host = self._pack(k0, k1)
        arr = self.be.arrays
        tables = (host.pop("lt"), host.pop("lv"))
        if stream is None:
            dev = {key: arr.upload(a) for key, a in host.items()}
            return {"k0": k0, "k1": k1, "dev": dev, "tables": tables, "ready": None}
        # Streamed: reuse the victim slot's buffers when big enough, copy asynchronously
        # from pinned staging buffers (pageable memory would make the copy synchronous).
        dev = slot["dev"] if slot is not None else {}
        staged = slot["pinned"] if slot is not None else {}
        if slot is not None and slot["ready"] is not None:
            slot["ready"].synchronize()  # its pinned buffers may still be in flight
        for key, a in host.items():
            if key not in dev or dev[key].size < a.size:
                dev[key] = arr.empty(a.size, a.dtype)
                staged[key] = arr.pinned_empty(a.size, a.dtype)
            pin = staged[key]
            pin[: a.size] = a
            arr.upload_into(dev[key], pin[: a.size], stream)
        ev = arr.event()
        arr.record(ev, stream)
        return {"k0": k0, "k1": k1, "dev": dev, "pinned": staged, "tables": tables, "ready": ev}

    def group(self, k0, k1, max_group):
        """Device arrays ``(wi, wv, wcp, bias, lt, lv, mp, mc)`` for layers ``[k0, k1)``."""
        arr = self.be.arrays
        slot = next((s for s in self.slots if s["k0"] <= k0 and k1 <= s["k1"]), None)
        if slot is None:  # not prefetched: the first group, or a longer one than guessed
            slot = self._load(k0, min(len(self), k0 + max(k1 - k0, max_group)), avoid=None)
            self.be.counters["weight_loads"] += 1
        if slot["ready"] is not None:
            arr.wait(arr.stream, slot["ready"])
        self._current = slot
        key = (id(slot), k0, k1)
        tables = self._tables.get(key)
        if tables is None:
            # The slot's whole tables go up once (a slot refilled by streaming is a new dict);
            # a group's are views of them: no upload per group.
            whole = slot.get("ktables")
            if whole is None:
                whole = slot["ktables"] = tuple(arr.for_kernel(arr.upload(t))
                                                for t in slot["tables"])
            a, b = k0 - slot["k0"], k1 - slot["k0"]
            tables = (whole[0][a:b], whole[1][a:b])
            if self.resident:  # streamed slots change content: cache only resident tables
                self._tables[key] = tables
        # The kernels' views of the slot's arrays, made once per slot: numba converts a CuPy
        # argument at every launch (tens of microseconds each), its own arrays faster.
        d = slot.get("kdev")
        if d is None:
            d = slot["kdev"] = {k: arr.for_kernel(v) for k, v in slot["dev"].items()}
        return d["wi"], d["wv"], d["wcp"], d["bias"], tables[0], tables[1], d["mp"], d["mc"]

    def prefetch(self, k1, max_group):
        """Start copying the layers from ``k1`` on into the slot not in use (second stream)."""
        if self.resident or k1 >= len(self):
            return
        end = min(len(self), k1 + max_group)
        if any(s["k0"] <= k1 and end <= s["k1"] for s in self.slots):
            return  # the longest next group is already there
        self._load(k1, end, avoid=self._current)
        self.be.counters["weight_prefetches"] += 1

    def _load(self, k0, k1, avoid):
        arr = self.be.arrays
        victim = None
        if len(self.slots) >= 2:
            victim = next(s for s in self.slots if s is not avoid)
            self.slots.remove(victim)
            # Kernels queued so far may read the victim: copies wait for them.
            done = arr.event()
            arr.record(done, arr.stream)
            arr.wait(arr.copy_stream, done)
        slot = self._fill_slot(victim, k0, k1, stream=arr.copy_stream)
        self.slots.append(slot)
        return slot
