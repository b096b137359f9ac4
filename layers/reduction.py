"""Reduction: SUM, ASUM, SUMSQ or MEAN over all axes from ``axis`` on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.spec.schema import doc


@dataclass
class ReductionParams:
    """Parameters of Reduction."""

    operation: Literal["SUM", "ASUM", "SUMSQ", "MEAN"] = doc("SUM", "SUM, ASUM (of |x|), SUMSQ (of x^2) or MEAN")
    axis: int = doc(0, "first axis reduced; every later axis is reduced too")
    coeff: float = doc(1.0, "multiplier on the result")


@register_layer
class Reduction(Layer):
    """Reduction: ``y = coeff * op(x[..., :])`` over the axes from ``axis`` to the end.

    Bottom: any shape.  Top: ``bottom.shape[:axis]`` (a scalar for axis 0).
    Not in place.

    Example::

        - {name: total, type: Reduction, bottom: x, top: total, reduction_param: {operation: SUMSQ, axis: 1}}
    """

    type = "Reduction"
    param_blocks = {"reduction_param": ReductionParams}

    def split(self, shape) -> tuple[int, int]:
        """(kept values, reduced values per kept value)."""
        axis = canonical_axis(self.block("reduction_param").axis, len(shape), "reduction_param.axis")
        return math.prod(shape[:axis]), math.prod(shape[axis:])

    def top_shapes(self, bottom_shapes):
        axis = canonical_axis(self.block("reduction_param").axis, len(bottom_shapes[0]), "reduction_param.axis")
        return [bottom_shapes[0][:axis]]

    def forward(self, bottom, top):
        p = self.block("reduction_param")
        rows, per_row = self.split(bottom[0].shape)
        x = bottom[0].data.reshape(rows, per_row)
        if p.operation == "ASUM":
            x = self.xp.abs(x)
        elif p.operation == "SUMSQ":
            x = x * x
        reduced = x.mean(axis=1) if p.operation == "MEAN" else x.sum(axis=1)
        top[0].data[...] = (p.coeff * reduced).reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        p = self.block("reduction_param")
        rows, per_row = self.split(bottom[0].shape)
        x = bottom[0].data.reshape(rows, per_row)
        dy = top[0].diff.reshape(rows, 1) * p.coeff
        if p.operation == "ASUM":
            dy = dy * ((x > 0) * 1 - (x < 0))  # (Caffe's sign: 0 for NaN)
        elif p.operation == "SUMSQ":
            dy = dy * 2 * x
        elif p.operation == "MEAN":
            dy = dy / per_row
        bottom[0].diff[...] = self.xp.broadcast_to(dy, x.shape).reshape(bottom[0].shape)
