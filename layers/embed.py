"""Embed: a learned vector for each integer index (a lookup table, Caffe's EmbedLayer)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.engine.fillers import FillerParams
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.layers.selection import add_rows, row_indices, take_rows
from netspec.spec.schema import doc, required


@dataclass
class EmbedParams:
    """Parameters of Embed."""

    num_output: int = required(doc="length of each embedding vector")
    input_dim: int = required(doc="number of rows: the indices run from 0 to input_dim - 1 (the vocabulary size)")
    bias_term: bool = doc(True, "add a learned bias")
    weight_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "weight init"})
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "bias init"})


@register_layer
class Embed(Layer):
    """Embed: ``y[..., :] = W[x[...], :] + b``, one learned row of W per integer index.

    Bottom: indices of any shape, whole numbers 0 to ``input_dim - 1`` stored
    as floats (anything else is a DataError naming the layer and the value).
    Top: ``bottom.shape + (num_output,)``.  Learnable: weights
    (input_dim, num_output) and bias (num_output,).  Fillers default to
    constant 0, as in Caffe.  The gradient of a row of W sums the top's
    gradients at every position holding its index; the indices take none.
    It equals an InnerProduct on one-hot vectors, without building them.
    Not in place.

    Example::

        - name: embed
          type: Embed
          bottom: words
          top: vectors
          embed_param: {num_output: 256, input_dim: 10000, weight_filler: {type: uniform, min: -0.1, max: 0.1}}
    """

    type = "Embed"
    param_blocks = {"embed_param": EmbedParams}
    label_bottoms = (0,)

    @property
    def params(self) -> EmbedParams:
        """The embed_param block."""
        return self.block("embed_param")

    def top_shapes(self, bottom_shapes):
        for key in ("num_output", "input_dim"):
            value = getattr(self.params, key)
            if value is None or value <= 0:
                raise ParamError(f"embed_param.{key}", f"must be a positive integer, got {value}")
        return [(*bottom_shapes[0], self.params.num_output)]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        return math.prod(top_shapes[0]) if self.params.bias_term else 0  # the lookup itself is a copy

    def param_shapes(self, bottom_shapes):
        n = self.params.num_output
        shapes = [(self.params.input_dim, n)]
        return shapes + [(n,)] if self.params.bias_term else shapes

    def param_fillers(self):
        return [self.params.weight_filler, self.params.bias_filler][:len(self.param_shapes_cache)]

    def forward(self, bottom, top):
        self.indices = row_indices(self, bottom[0].data, self.params.input_dim, 0,
                                   f"the embedding (input_dim {self.params.input_dim})")
        take_rows(self, self.blobs[0].data, self.indices, top[0].data,
                  self.blobs[1].data if self.params.bias_term else None)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(-1, self.params.num_output)
        if self.param_propagate_down[0]:
            add_rows(self, self.blobs[0].diff, self.indices, dy)
        if self.params.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = 0
