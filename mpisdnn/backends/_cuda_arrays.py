"""The thin array layer of the ``gpu`` backend: CuPy on a real GPU, numba device arrays otherwise.

The backend only needs a handful of operations (allocate, copy in and out, streams, events,
memory info); both implementations provide them with the same names, so one backend class runs
on a GPU with CuPy's memory pool and streams, on a GPU without CuPy, and under numba-cuda's
simulator in CI (where CuPy cannot work). Kernels accept either kind of array: numba reads
CuPy arrays through ``__cuda_array_interface__``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_arrays", "device_count"]


def device_count() -> int:
    """CUDA devices this process sees (the simulator shows one); 0 when CUDA is unusable."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy or no driver: ask numba
        pass
    try:
        from numba import cuda

        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA at all
        return 0


def _shape(shape):
    """A shape with at least one element per axis (``n`` or a tuple)."""
    if isinstance(shape, tuple):
        return tuple(max(1, int(d)) for d in shape)
    return max(1, int(shape))


def make_arrays(device: int, prefer_cupy: bool = True):
    """The array layer for ``device``: :class:`CupyArrays` when CuPy works, else numba's."""
    from ._cuda_arith import simulated

    if prefer_cupy and not simulated():
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            return CupyArrays(device)
        except Exception:  # noqa: BLE001 - CuPy missing or broken: numba arrays still work
            pass
    return NumbaArrays(device)


class _Arrays:
    """What both array layers share: kernels and transfers run in order on ``stream``, weight
    uploads that overlap them on ``copy_stream``."""

    #: Reads back to the host so far (:meth:`download`: each one waits for the stream).
    reads = 0

    def record(self, event, stream):
        event.record(stream)

    def elapsed(self, start, end) -> float:
        """Seconds from event ``start`` to event ``end`` (waits for ``end``)."""
        end.synchronize()
        return self._milliseconds(start, end) / 1e3

    def synchronize(self):
        self.stream.synchronize()
        self.copy_stream.synchronize()

    def multiprocessors(self) -> int:
        """Streaming multiprocessors of the current device (1 where it cannot be read)."""
        try:
            return max(1, int(self.cuda.get_current_device().MULTIPROCESSOR_COUNT))
        except Exception:  # noqa: BLE001 - the simulator's device has no such attribute
            return 1

    def l2_bytes(self) -> int:
        """L2 cache of the current device in bytes (0 where it cannot be read)."""
        try:
            return max(0, int(self.cuda.get_current_device().L2_CACHE_SIZE))
        except Exception:  # noqa: BLE001 - the simulator's device has no such attribute
            return 0


class NumbaArrays(_Arrays):
    """numba-cuda device arrays and streams (also what the CUDA simulator provides)."""

    kind = "numba"

    def __init__(self, device: int):
        from numba import cuda

        from ._cuda_arith import simulated

        self.cuda = cuda
        cuda.select_device(int(device))
        self.kind = "simulator" if simulated() else "numba"
        self.stream = cuda.stream()
        self.copy_stream = cuda.stream()

    @property
    def launch_stream(self):
        return self.stream

    def empty(self, n, dtype):
        return self.cuda.device_array(max(1, int(n)), dtype=dtype, stream=self.stream)

    def upload(self, host):
        return self.cuda.to_device(np.ascontiguousarray(host), stream=self.stream)

    def zeros(self, shape, dtype):
        return self.upload(np.zeros(_shape(shape), dtype))

    def for_kernel(self, dev):
        """The array as kernels take it fastest (numba's own arrays: as they are)."""
        return dev

    def upload_into(self, dev, host, stream):
        dev[: host.size].copy_to_device(host, stream=stream)

    def download(self, dev, count=None):
        self.reads += 1
        view = dev if count is None else dev[:count]
        out = view.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return out

    def pinned_empty(self, n, dtype):
        try:
            return self.cuda.pinned_array(max(1, int(n)), dtype=dtype)
        except Exception:  # noqa: BLE001 - pinning is an optimisation only
            return np.empty(max(1, int(n)), dtype=dtype)

    def event(self):
        if self.kind == "simulator":  # its events take no arguments and keep no time
            return self.cuda.event()
        return self.cuda.event(timing=True)

    def wait(self, stream, event):
        event.wait(stream)

    def _milliseconds(self, start, end) -> float:
        if self.kind == "simulator":
            return 0.0
        return float(self.cuda.event_elapsed_time(start, end))

    def mem_info(self):
        try:
            free, total = self.cuda.current_context().get_memory_info()
            return int(free), int(total)
        except Exception:  # noqa: BLE001 - the simulator may not know
            return 0, 0

    def device_name(self) -> str:
        try:
            name = self.cuda.get_current_device().name
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001
            return "unknown"


class CupyArrays(_Arrays):
    """CuPy arrays from its memory pool, CuPy streams handed to numba as external streams."""

    kind = "cupy"

    def __init__(self, device: int):
        import cupy as cp
        import cupyx
        from numba import cuda

        self.cp, self.cupyx, self.cuda = cp, cupyx, cuda
        self.device = int(device)
        cp.cuda.Device(self.device).use()
        cuda.select_device(self.device)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self._launch = cuda.external_stream(self.stream.ptr)
        try:
            from numba.cuda.core import config

            # Every array and kernel of the backend is ordered on its one stream: numba's
            # per-argument synchronisation of the exporting stream would only add host waits.
            config.CUDA_ARRAY_INTERFACE_SYNC = False
        except ImportError:  # older numba-cuda layout: keep the (correct, slower) default
            pass

    @property
    def launch_stream(self):
        return self._launch

    def empty(self, n, dtype):
        with self.stream:
            return self.cp.empty(max(1, int(n)), dtype=dtype)

    def upload(self, host):
        with self.stream:
            return self.cp.asarray(np.ascontiguousarray(host))

    def for_kernel(self, dev):
        """A numba view of a CuPy array (same memory; it keeps the CuPy array alive): numba
        converts CuPy arguments through ``__cuda_array_interface__`` at every launch
        (numba-cuda issue 578), so arrays passed to many launches are converted once."""
        return self.cuda.as_cuda_array(dev, sync=False)

    def zeros(self, shape, dtype):
        """Zeros set on the device, on the stream (no host copy, no host wait)."""
        with self.stream:
            return self.cp.zeros(_shape(shape), dtype=dtype)

    def upload_into(self, dev, host, stream):
        dev[: host.size].set(host, stream=stream)

    def download(self, dev, count=None):
        self.reads += 1
        view = dev if count is None else dev[:count]
        return view.get(stream=self.stream)

    def pinned_empty(self, n, dtype):
        return self.cupyx.empty_pinned(max(1, int(n)), dtype=dtype)

    def event(self):
        return self.cp.cuda.Event()

    def wait(self, stream, event):
        stream.wait_event(event)

    def _milliseconds(self, start, end) -> float:
        return float(self.cp.cuda.get_elapsed_time(start, end))

    def mem_info(self):
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def device_name(self) -> str:
        props = self.cp.cuda.runtime.getDeviceProperties(self.device)
        return props["name"].decode(errors="replace")
