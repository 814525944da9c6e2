"""Sparse DNN inference (Graph Challenge): network container, reference semantics, engine."""

from .engine import InferenceResult, infer
from .network import Network
from .options import InferOptions
from .reference import categories_of, reference_inference, reference_layer
from .weights import CompactLayer, InMemoryStore, WeightStore

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
