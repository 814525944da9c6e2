"""Synthetic data: RadiX-Net networks like the official ones, digit-like inputs, graphs."""

from .images import digit_images, digit_rows
from .radixnet import base_layer, radixnet

__all__ = ["base_layer", "digit_images", "digit_rows", "radixnet"]
