"""mpisdnn: MPI-parallel sparse DNN inference (Graph Challenge) and graph projection.

Heavy or optional packages (numba, cupy, mpi4py's MPI runtime) are imported lazily, so
``import mpisdnn`` is cheap and works anywhere.
"""

__version__ = "0.1.0"

from .errors import BackendError, InputError, MpisdnnError, ShapeError, UsageError  # noqa: E402

# The rest is imported on first use (PEP 562): ``python -m mpisdnn`` must reach its SIGINT
# handler before numpy and scipy load, or a Ctrl-C in the first 0.3 s prints a traceback.
_LAZY = {
    "balanced_blocks": ".partition",
    "even_blocks": ".partition",
    "CompactLayer": ".sdnn",
    "InferenceResult": ".sdnn",
    "InferOptions": ".sdnn",
    "Network": ".sdnn",
    "WeightStore": ".sdnn",
    "categories_of": ".sdnn",
    "infer": ".sdnn",
    "reference_inference": ".sdnn",
    "reference_layer": ".sdnn",
    "Graph": ".projection",
    "project_matrix": ".projection",
    "read_graph": ".projection",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendError",
    "CompactLayer",
    "Graph",
    "InferOptions",
    "WeightStore",
    "InferenceResult",
    "InputError",
    "MpisdnnError",
    "Network",
    "ShapeError",
    "UsageError",
    "__version__",
    "balanced_blocks",
    "categories_of",
    "even_blocks",
    "infer",
    "project_matrix",
    "read_graph",
    "reference_inference",
    "reference_layer",
]
