"""Compute backends behind one small interface, chosen by name.

``reference`` (plain scipy, MATLAB semantics) is always available; ``cpu`` is the fused numba
kernel; ``gpu`` runs on CuPy. Heavy imports happen only when a backend is asked for, so
``import mpisdnn`` works on a machine with neither numba nor cupy.
"""

from __future__ import annotations

from ..errors import BackendError
from .base import Backend

__all__ = ["Backend", "get", "available", "NAMES"]

NAMES = ("cpu", "reference", "gpu")


def get(name: str, **options) -> Backend:
    """Instantiate the backend called ``name`` (``cpu``, ``reference`` or ``gpu``)."""
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend(**options)
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(**options)
    if name == "gpu":
        from .gpu import GpuBackend

        return GpuBackend(**options)
    raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")


def available() -> dict:
    """Map backend name to ``True`` or the reason it cannot run here."""
    out = {"reference": True}
    try:
        import numba  # noqa: F401

        out["cpu"] = True
    except ImportError as exc:
        out["cpu"] = f"numba missing: {exc}"
    try:
        import cupy

        out["gpu"] = True if cupy.cuda.runtime.getDeviceCount() > 0 else "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        out["gpu"] = f"cupy unavailable: {type(exc).__name__}"
    return out
