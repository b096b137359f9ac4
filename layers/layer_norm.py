"""LayerNorm: each example normalised over its last axes, then scaled and shifted per position (transformers')."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy

from netspec.engine import onednn, primitives
from netspec.engine.fillers import FillerParams, constant
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.spec.schema import doc


@dataclass
class LayerNormParams:
    """Parameters of LayerNorm."""

    axis: int = doc(-1, "the first normalised axis: the statistics are taken over it and every later axis")
    eps: float = doc(1e-5, "added to the variance")
    elementwise_affine: bool = doc(True, "learn a scale and a shift for each normalised position")
    scale_filler: FillerParams = field(default_factory=lambda: constant(1.0),
                                       metadata={"doc": "scale init (default constant 1)"})
    shift_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "shift init (constant 0)"})


@register_layer
class LayerNorm(Layer):
    """LayerNorm: ``y = (x - mean) / sqrt(var + eps) * g + b`` over the axes from ``axis`` on (Ba et al. 2016).

    The mean and (biased) variance are each example's, over the normalised
    axes, in TRAIN and TEST alike.  Learnable with ``elementwise_affine``:
    ``g`` (default 1) and ``b`` (default 0), of the normalised axes' shape.
    Bottom/top: any shape.  Not in place.  On the CPU in float32 oneDNN's
    layer normalization runs it (``NETSPEC_ONEDNN=0``: NumPy).

    Example (a transformer's, over the width of (N, T, D) tokens)::

        - {name: ln1, type: LayerNorm, bottom: tokens, top: ln1, layer_norm_param: {axis: -1}}
    """

    type = "LayerNorm"
    param_blocks = {"layer_norm_param": LayerNormParams}

    def normalised(self, shape) -> tuple[int, ...]:
        """The normalised axes' shape."""
        return tuple(shape[canonical_axis(self.block("layer_norm_param").axis, len(shape), "layer_norm_param.axis"):])

    def top_shapes(self, bottom_shapes):
        self.normalised(bottom_shapes[0])
        return [bottom_shapes[0]]

    def param_shapes(self, bottom_shapes):
        shape = self.normalised(bottom_shapes[0])
        return [shape, shape] if self.block("layer_norm_param").elementwise_affine else []

    def param_fillers(self):
        p = self.block("layer_norm_param")
        return [p.scale_filler, p.shift_filler] if p.elementwise_affine else []

    def rows(self, shape) -> tuple[int, int]:
        """x viewed as (examples, values normalised together)."""
        width = math.prod(self.normalised(shape))
        return math.prod(shape) // width, width

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        rows, width = self.rows(bottom[0].shape)
        flags = (onednn.NORMALIZE_SCALE | onednn.NORMALIZE_SHIFT) if self.blobs else 0
        self.fast = onednn.attempt(self, lambda lib: primitives.LayerNormalization(
            lib, rows, width, self.block("layer_norm_param").eps, flags))
        if self.fast is not None:  # each row's statistics, which forward writes for backward
            self.statistics = {onednn.ARG_MEAN: numpy.empty(rows, self.dtype),
                               onednn.ARG_VARIANCE: numpy.empty(rows, self.dtype)}
        else:  # the normalised input, which forward writes for backward
            self.normalised_x = self.xp.empty((rows, width), dtype=self.dtype)

    def affine(self, width: int) -> dict[int, numpy.ndarray]:
        """The scale and shift as oneDNN arguments, (width,) each (none without ``elementwise_affine``)."""
        return {arg: blob.data.reshape(width) for arg, blob in zip((onednn.ARG_SCALE, onednn.ARG_SHIFT), self.blobs)}

    def forward(self, bottom, top):
        xp = self.xp
        rows, width = self.rows(bottom[0].shape)
        x, out = bottom[0].data.reshape(rows, width), top[0].data.reshape(rows, width)
        if self.fast is not None:
            self.fast.forward(x, out, {**self.statistics, **self.affine(width)})
            return
        normalised = self.normalised_x
        xp.subtract(x, x.mean(axis=1, keepdims=True), out=normalised)
        variance = xp.square(normalised).mean(axis=1, keepdims=True)  # (reductions: a CUDA graph captures them)
        self.inv_std = 1 / xp.sqrt(variance + self.block("layer_norm_param").eps)
        normalised *= self.inv_std
        if self.blobs:
            xp.multiply(normalised, self.blobs[0].data.reshape(1, width), out=out)
            out += self.blobs[1].data.reshape(1, width)
        else:
            out[...] = normalised

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0] and not any(self.param_propagate_down):
            return
        xp = self.xp
        rows, width = self.rows(bottom[0].shape)
        dy = top[0].diff.reshape(rows, width)
        if self.fast is not None:
            x = bottom[0].data.reshape(rows, width)
            dx = bottom[0].diff.reshape(rows, width) if propagate_down[0] else None
            self.fast.backward_into(dy, dx, {onednn.ARG_SRC: x, **self.statistics, **self.affine(width)}, self.blobs,
                                    self.param_propagate_down)
            return
        y = self.normalised_x
        if self.blobs:
            if self.param_propagate_down[0]:
                self.blobs[0].diff += (dy * y).sum(axis=0).reshape(self.blobs[0].shape)
            if self.param_propagate_down[1]:
                self.blobs[1].diff += dy.sum(axis=0).reshape(self.blobs[1].shape)
            dy = dy * self.blobs[0].data.reshape(1, width)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(rows, width)
            xp.multiply(y, (dy * y).mean(axis=1, keepdims=True), out=dx)
            xp.subtract(dy, dx, out=dx)
            dx -= dy.mean(axis=1, keepdims=True)
            dx *= self.inv_std
