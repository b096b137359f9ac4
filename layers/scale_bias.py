"""Scale and Bias: a learned (or second-bottom) per-position multiplier or offset, broadcast."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy

from netspec.engine import onednn, primitives
from netspec.engine.fillers import FillerParams, constant
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.spec.schema import doc


def broadcast_shape(x_shape, axis: int, num_axes: int, key: str, operand=None):
    """The operand's shape and ``(outer, dim, inner)`` for x viewed as (outer, dim, inner)."""
    if operand is not None:
        start = canonical_axis(axis, len(x_shape), f"{key}.axis") if x_shape else 0
        shape = tuple(operand)
        if tuple(x_shape[start:start + len(shape)]) != shape:
            raise ShapeError(f"second bottom of shape {shape} does not match bottom shape {tuple(x_shape)} "
                             f"from axis {start}", f"{key}.axis")
    else:
        start = canonical_axis(axis, len(x_shape), f"{key}.axis")
        if num_axes < -1:
            raise ShapeError(f"num_axes must be -1 or more, got {num_axes}", f"{key}.num_axes")
        end = len(x_shape) if num_axes == -1 else start + num_axes
        if end > len(x_shape):
            raise ShapeError(f"axis {start} + num_axes {num_axes} exceeds the bottom's {len(x_shape)} axes",
                             f"{key}.num_axes")
        shape = tuple(x_shape[start:end])
    outer = math.prod(x_shape[:start])
    dim = math.prod(shape)
    return shape, (outer, dim, math.prod(x_shape) // max(outer * dim, 1))


class BroadcastOperand(Layer):
    """Base of Scale and Bias: an operand spanning some axes of x, learned or given as a second bottom."""

    block_name = ""
    num_bottoms = (1, 2)
    inplace_ok = True

    def operand(self, bottom_shapes):
        """Operand shape and the (outer, dim, inner) view of the first bottom."""
        p = self.block(self.block_name)
        given = bottom_shapes[1] if len(bottom_shapes) > 1 else None
        return broadcast_shape(bottom_shapes[0], p.axis, p.num_axes, self.block_name, given)

    def top_shapes(self, bottom_shapes):
        self.operand(bottom_shapes)
        return [bottom_shapes[0]]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.view = self.operand([b.shape for b in bottom])[1]
        self.bottom_shape = bottom[0].shape


@dataclass
class ScaleParams:
    """Parameters of Scale."""

    axis: int = doc(1, "first axis of the bottom the scale applies to")
    num_axes: int = doc(1, "how many axes the learned scale spans (-1: to the end; 0: a scalar)")
    filler: FillerParams = field(default_factory=lambda: constant(1.0),
                                 metadata={"doc": "scale init (default constant 1)"})
    bias_term: bool = doc(False, "also learn a bias of the same shape")
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "bias init"})


@register_layer
class Scale(BroadcastOperand):
    """Scale: ``y = x * s (+ b)``, ``s`` broadcast over the axes it does not span.

    Bottoms: x, and optionally the scale itself as a second bottom (then
    nothing is learned for it).  ``s`` spans ``num_axes`` axes from ``axis``
    (``(C,)`` by default: one factor per channel).  Learnable: the scale
    (unless given as a bottom) and, with ``bias_term``, a bias of its shape.
    Runs in place (keeps a copy of the input).

    Example::

        - {name: scale1, type: Scale, bottom: bn1, top: bn1, scale_param: {bias_term: true}}
    """

    type = "Scale"
    takes_held = True
    fast_records = True
    param_blocks = {"scale_param": ScaleParams}
    block_name = "scale_param"

    def param_shapes(self, bottom_shapes):
        shape = self.operand(bottom_shapes)[0]
        learned = [] if len(bottom_shapes) > 1 else [shape]
        return learned + ([shape] if self.block("scale_param").bias_term else [])

    def param_fillers(self):
        p = self.block("scale_param")
        learned = [] if len(self.spec.bottoms) > 1 else [p.filler]
        return learned + ([p.bias_filler] if p.bias_term else [])

    def scale_blob(self, bottom):
        """The blob holding the scale: the second bottom or the first learnable blob."""
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.fast = self._onednn(bottom[0].shape, onednn.layout_of(bottom[0].values))
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)

    def per_channel(self) -> bool:
        """Whether the layer learns one factor per channel: a (C,) scale over axis 1 of its bottom."""
        return (len(self.spec.bottoms) == 1 and self.view[:2] == tuple(self.bottom_shape[:2])
                and self.blobs[0].shape == (self.bottom_shape[1],))

    def _onednn(self, shape, layout) -> primitives.Normalization | None:
        """A learned scale per channel (axis 1) on oneDNN: a batch normalisation with mean 0, variance 1, eps 0
        and the given statistics is exactly ``y = s * x + b``, and its backward gives all three gradients (in
        ``layout``, the bottom's, where it is held in one)."""
        p = self.block("scale_param")
        if not 2 <= len(shape) <= 5 or not self.per_channel():
            return None
        flags = onednn.NORMALIZE_GLOBAL_STATS | onednn.NORMALIZE_SCALE | (onednn.NORMALIZE_SHIFT if p.bias_term
                                                                           else 0)
        self.identity = {onednn.ARG_MEAN: numpy.zeros(shape[1], self.dtype),
                         onednn.ARG_VARIANCE: numpy.ones(shape[1], self.dtype)}
        return onednn.attempt_in(self, layout, lambda lib, layout: primitives.Normalization(
            lib, shape, 0.0, flags, keeps_input=not self.inference, layout=layout))

    def forward(self, bottom, top):
        if self.fast is not None:  # (which keeps the input itself)
            shift = {onednn.ARG_SHIFT: self.blobs[1].data} if self.block("scale_param").bias_term else {}
            self.fast.forward(bottom[0].values, top[0].values, {onednn.ARG_SCALE: self.blobs[0].data, **shift,
                                                                **self.identity})
            return
        outer, dim, inner = self.view
        scale = self.scale_blob(bottom).data.reshape(1, dim, 1)
        x = bottom[0].data.reshape(outer, dim, inner)
        out = top[0].data.reshape(outer, dim, inner)
        self.input = x.copy() if top[0] is bottom[0] else x
        self.xp.multiply(x, scale, out=out)
        if self.block("scale_param").bias_term:
            out += self.blobs[-1].data.reshape(1, dim, 1)

    def backward(self, top, propagate_down, bottom):
        if self.fast is not None:
            self.fast.backward_into(top[0].gradient, bottom[0].gradient if propagate_down[0] else None,
                                    {onednn.ARG_SCALE: self.blobs[0].data, **self.identity}, self.blobs,
                                    self.param_propagate_down)
            return
        outer, dim, inner = self.view
        dy = top[0].diff.reshape(outer, dim, inner)
        scale_blob = self.scale_blob(bottom)
        learned_scale = len(bottom) == 1
        if self.block("scale_param").bias_term and self.param_propagate_down[-1]:
            self.blobs[-1].diff += dy.sum(axis=(0, 2)).reshape(self.blobs[-1].shape)
        scale_grad = (dy * self.input).sum(axis=(0, 2)).reshape(scale_blob.shape)
        if learned_scale and self.param_propagate_down[0]:
            self.blobs[0].diff += scale_grad
        if not learned_scale and propagate_down[1]:
            bottom[1].diff[...] = scale_grad
        if propagate_down[0]:
            self.xp.multiply(dy, scale_blob.data.reshape(1, dim, 1), out=bottom[0].diff.reshape(outer, dim, inner))


@dataclass
class BiasParams:
    """Parameters of Bias."""

    axis: int = doc(1, "first axis of the bottom the bias applies to")
    num_axes: int = doc(1, "how many axes the learned bias spans (-1: to the end; 0: a scalar)")
    filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "bias init (constant 0)"})


@register_layer
class Bias(BroadcastOperand):
    """Bias: ``y = x + b``, ``b`` broadcast over the axes it does not span.

    Bottoms: x, and optionally the bias itself as a second bottom (then
    nothing is learned).  ``b`` spans ``num_axes`` axes from ``axis`` (one
    value per channel by default).  Runs in place.

    Example::

        - {name: bias1, type: Bias, bottom: conv1, top: conv1}
    """

    type = "Bias"
    param_blocks = {"bias_param": BiasParams}
    block_name = "bias_param"

    def param_shapes(self, bottom_shapes):
        return [] if len(bottom_shapes) > 1 else [self.operand(bottom_shapes)[0]]

    def param_fillers(self):
        return [self.block("bias_param").filler][:len(self.param_shapes_cache)]

    def forward(self, bottom, top):
        outer, dim, inner = self.view
        bias = (bottom[1] if len(bottom) > 1 else self.blobs[0]).data.reshape(1, dim, 1)
        self.xp.add(bottom[0].data.reshape(outer, dim, inner), bias, out=top[0].data.reshape(outer, dim, inner))

    def backward(self, top, propagate_down, bottom):
        outer, dim, inner = self.view
        dy = top[0].diff.reshape(outer, dim, inner)
        if len(bottom) > 1:
            if propagate_down[1]:
                bottom[1].diff[...] = dy.sum(axis=(0, 2)).reshape(bottom[1].shape)
        elif self.param_propagate_down[0]:
            self.blobs[0].diff += dy.sum(axis=(0, 2)).reshape(self.blobs[0].shape)
        if propagate_down[0] and top[0] is not bottom[0]:
            bottom[0].diff[...] = top[0].diff
