"""Sparse DNN inference (Graph Challenge): network container, reference semantics, engine."""

from .engine import InferenceResult, infer
from .network import Network
from .reference import categories_of, reference_inference, reference_layer

__all__ = [
    "InferenceResult",
    "Network",
    "categories_of",
    "infer",
    "reference_inference",
    "reference_layer",
]
