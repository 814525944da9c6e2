"""In-memory network: a list of CSR weight layers plus a bias per layer and neuron."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .errors import InputError, ShapeError, UsageError, shown

__all__ = ["Network", "YMAX"]

#: Activation ceiling of the challenge (``Y(Y > YMAX) = YMAX``).
YMAX = 32.0


@dataclass
class Network:
    """Weights and biases of a sparse DNN, possibly only a slice of its layers.

    Attributes
    ----------
    layers : list of scipy.sparse.csr_matrix
        ``N x N`` float32 weight matrices with int32 indices, in layer order.
    bias : ndarray of float32, shape (len(layers), N)
        Bias per layer and neuron.
    neurons : int
    total_layers : int
        Depth of the whole network (``layer_start + len(layers) <= total_layers``).
    layer_start : int
        Index of ``layers[0]`` in the whole network (0 unless this is a slice).
    ymax : float
    source : str
        Provenance (file or generator description).
    """

    layers: list
    bias: np.ndarray
    neurons: int
    total_layers: int | None = None
    layer_start: int = 0
    ymax: float = YMAX
    source: str = ""
    attrs: dict = field(default_factory=dict)

    def __post_init__(self):
        n = self.neurons = _count("neurons", self.neurons)
        self.layer_start = _count("layer_start", self.layer_start)
        if self.total_layers is None:
            self.total_layers = self.layer_start + len(self.layers)
        self.total_layers = _count("total_layers", self.total_layers)
        if self.layer_start + len(self.layers) > self.total_layers:
            raise ShapeError(
                f"Network: layers {self.layer_start + 1}..{self.layer_start + len(self.layers)} "
                f"lie beyond total_layers = {self.total_layers}"
            )
        y = self.ymax
        if isinstance(y, (str, bytes, bool)) or not isinstance(y, numbers.Real) or not (
            math.isfinite(y) and y > 0
        ):  # as a file's ymax attribute (formats._validate): NaN clipped every value to NaN
            raise InputError(f"Network: ymax must be a finite number > 0, got {shown(y)}")
        self.ymax = float(y)
        self.bias = np.asarray(self.bias, dtype=np.float32)
        if self.bias.shape != (len(self.layers), n):
            raise ShapeError(
                f"bias has shape {self.bias.shape}, expected ({len(self.layers)}, {n})"
            )
        for k, w in enumerate(self.layers):
            if w.shape != (n, n):
                raise ShapeError(
                    f"layer {self.layer_start + k + 1} has shape {w.shape}, expected ({n}, {n})"
                )
        # one weight per (row, column), repeats summed (a layer as MATLAB's sparse() builds
        # it): the reference multiplied a repeat's products apart, and `edges` counted them
        self.layers = [as_csr32(w) for w in self.layers]

    @property
    def edges(self) -> int:
        """Total number of weights (DNN edges) in the layers held."""
        return int(sum(w.nnz for w in self.layers))

    def __len__(self) -> int:
        return len(self.layers)

    def head(self, layers: int) -> Network:
        """The first ``layers`` layers (the challenge's L=120/480 use a network's first files)."""
        if layers > len(self.layers):
            raise ShapeError(f"asked for {layers} layers, the network has {len(self.layers)}")
        return Network(
            self.layers[:layers],
            self.bias[:layers],
            self.neurons,
            total_layers=layers,
            layer_start=self.layer_start,
            ymax=self.ymax,
            source=self.source,
            attrs=dict(self.attrs),
        )


def _count(name, value) -> int:
    """``value`` as an int >= 0 (numpy integers too; not 16.5, which ``int()`` made 16)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise UsageError(f"Network: {name} must be an integer >= 0, got {shown(value)}")
    return int(value)


def as_csr32(mat) -> sp.csr_matrix:
    """CSR with float32 data, sorted columns and each column of a row once, repeats summed
    (in float32, in stored order: scipy's ``sum_duplicates``, MATLAB's ``sparse``); scipy
    picks the index dtype. The caller's arrays are never changed (a copy where anything is
    done: ``csr_matrix`` of a float32 CSR shares them). Weights and Y0 both come this way:
    a Y0 holding a repeated column gave the backends and the reference different rows."""
    m = sp.csr_matrix(mat, dtype=np.float32)
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    return m
