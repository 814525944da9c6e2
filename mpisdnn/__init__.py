"""mpisdnn: MPI-parallel sparse DNN inference (Graph Challenge) and graph projection.

Heavy or optional packages (numba, cupy, mpi4py's MPI runtime) are imported lazily, so
``import mpisdnn`` is cheap and works anywhere.
"""

__version__ = "0.1.0"

from .errors import BackendError, InputError, MpisdnnError, ShapeError, UsageError  # noqa: E402
from .partition import balanced_blocks, even_blocks  # noqa: E402
from .sdnn import (  # noqa: E402
    CompactLayer,
    InferenceResult,
    InferOptions,
    Network,
    WeightStore,
    categories_of,
    infer,
    reference_inference,
    reference_layer,
)

__all__ = [
    "BackendError",
    "CompactLayer",
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
    "reference_inference",
    "reference_layer",
]
