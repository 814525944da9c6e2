"""Sparse DNN inference (Graph Challenge): network container, reference semantics, engine."""

from ..network import Network
from ..weights import CompactLayer, InMemoryStore, WeightStore
from .engine import InferenceResult, infer
from .options import InferOptions
from .reference import categories_of, reference_inference, reference_layer

__all__ = [
    "CompactLayer",
    "InMemoryStore",
    "InferOptions",
    "InferenceResult",
    "WeightStore",
    "Network",
    "categories_of",
    "infer",
    "reference_inference",
    "reference_layer",
]
