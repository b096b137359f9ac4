"""Parameter: a learnable blob as a top, for layers that take their weights as bottoms (Caffe's ParameterLayer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.layers.data import BlobShape


@dataclass
class ParameterParams:
    """Parameters of Parameter."""

    shape: BlobShape = field(default_factory=BlobShape, metadata={"doc": "the shape of the learnable blob"})


@register_layer
class Parameter(Layer):
    """Parameter: ``y = P``, a learnable blob P of ``parameter_param.shape`` given to other layers as a top.

    Bottoms: none.  Top: P's values, of its shape.  Learnable: P, which
    starts at 0 (Caffe's ParameterParameter has no filler; load weights or
    train it).  The top's gradient is P's: backward adds the top's diff to
    P's (so ``iter_size`` accumulates, as for every parameter), and ``param``
    entries (lr_mult, decay_mult, a shared name) apply as to any layer's
    blob.  The top is a copy of P made each forward pass, so a layer working
    in place on it cannot change P.

    Example::

        - {name: centres, type: Parameter, top: centres, parameter_param: {shape: {dim: [10, 64]}}}
        - {name: scaled, type: Scale, bottom: [features, centres], top: scaled, scale_param: {axis: 1}}
    """

    type = "Parameter"
    feeds_net = False
    param_blocks = {"parameter_param": ParameterParams}
    num_bottoms = (0, 0)

    def shape(self) -> tuple[int, ...]:
        """P's shape, validated."""
        dims = self.block("parameter_param").shape.dim
        if not dims or any(d <= 0 for d in dims):
            raise ParamError("parameter_param.shape", f"give the blob's shape with positive dims, e.g. shape: "
                                                      f"{{dim: [10, 64]}}; got {dims}")
        return tuple(dims)

    def top_shapes(self, bottom_shapes):
        return [self.shape()]

    def param_shapes(self, bottom_shapes):
        return [self.shape()]

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down[0]:
            self.blobs[0].diff += top[0].diff
