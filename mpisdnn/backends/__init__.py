"""Compute backends behind one declared interface (:class:`Backend`), chosen by name.

``reference`` (plain scipy, MATLAB semantics) is always available; ``cpu`` is the fused numba
kernel; ``gpu`` runs CUDA kernels on CuPy arrays. Heavy imports happen only when a backend is
asked for, so ``import mpisdnn`` works on a machine with neither numba nor cupy.
"""

from __future__ import annotations

from ..errors import BackendError
from .base import Backend

__all__ = ["Backend", "create", "get", "available", "NAMES", "HELP"]

# The names live in a leaf module so that the options (sdnn/options.py) validate against
# them without importing this package, whose get() imports the options.
from .names import HELP, NAMES


def _backend_class(name: str) -> type[Backend]:
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend
    if name == "gpu":
        from .gpu import GpuBackend

        return GpuBackend
    raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")


def create(options, comm=None) -> Backend:
    """The backend ``options.backend`` configured from :class:`~mpisdnn.InferOptions`."""
    from ..parallel import get_comm

    return _backend_class(options.backend).from_options(options, get_comm(comm))


def get(name: str, comm=None, **options) -> Backend:
    """Shorthand: the backend ``name`` with :class:`~mpisdnn.InferOptions` fields ``options``.

    A misspelled option raises :class:`~mpisdnn.UsageError`.
    """
    from ..sdnn.options import InferOptions

    if name not in NAMES:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    return create(InferOptions(backend=name).replace(**options), comm)


def available() -> dict:
    """Map backend name to ``True`` or the reason it cannot run here."""
    out = {"reference": True}
    try:
        import numba  # noqa: F401

        out["cpu"] = True
    except ImportError as exc:
        out["cpu"] = f"numba missing: {exc}"
    try:
        from ._cuda_arrays import device_count

        out["gpu"] = True if device_count() > 0 else "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        out["gpu"] = f"numba-cuda unavailable: {type(exc).__name__}"
    return out
