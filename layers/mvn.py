"""MVN: mean-variance normalisation of each instance (and channel)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.spec.schema import doc


@dataclass
class MVNParams:
    """Parameters of MVN."""

    normalize_variance: bool = doc(True, "also divide by the standard deviation")
    across_channels: bool = doc(False, "normalise over (C, H, W) per instance instead of (H, W) per channel")
    eps: float = doc(1e-9, "added to the standard deviation")


@register_layer
class MVN(Layer):
    """MVN: ``y = (x - mean) / (std + eps)`` over each (N, C) slice, or each N with ``across_channels``.

    ``std`` is the biased standard deviation; without ``normalize_variance``
    only the mean is subtracted.  The gradient is exact (Caffe's drops the
    eps terms; the difference is of order eps).

    Bottom: (N, C, ...) of at most 4 axes.  Top: (N, C, H, W), missing axes
    as 1 ((N, C) gives (N, C, 1, 1)), as Caffe shapes it.  Not in place.

    Example::

        - {name: mvn1, type: MVN, bottom: data, top: mvn1}
    """

    type = "MVN"
    param_blocks = {"mvn_param": MVNParams}

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        if not 2 <= len(shape) <= 4:
            raise ShapeError(f"MVN needs 2 to 4 axes (N, C, H, W, as Caffe's), got shape {shape}")
        return [tuple(shape) + (1,) * (4 - len(shape))]

    def rows(self, shape) -> tuple[int, int]:
        """x viewed as (rows, values per row)."""
        keep = 1 if self.block("mvn_param").across_channels else 2
        rows = math.prod(shape[:keep])
        return rows, math.prod(shape) // rows

    def forward(self, bottom, top):
        p = self.block("mvn_param")
        rows, per_row = self.rows(bottom[0].shape)
        x = bottom[0].data.reshape(rows, per_row)
        centred = x - x.mean(axis=1, keepdims=True)
        out = top[0].data.reshape(rows, per_row)
        if not p.normalize_variance:
            out[...] = centred
            return
        self.std = self.xp.sqrt((centred * centred).mean(axis=1, keepdims=True))
        self.xp.divide(centred, self.std + p.eps, out=out)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        p = self.block("mvn_param")
        rows, per_row = self.rows(bottom[0].shape)
        dy = top[0].diff.reshape(rows, per_row)
        grad = bottom[0].diff.reshape(rows, per_row)
        centred_dy = dy - dy.mean(axis=1, keepdims=True)
        if not p.normalize_variance:
            grad[...] = centred_dy
            return
        y = top[0].data.reshape(rows, per_row)
        mean_dy_y = (dy * y).mean(axis=1, keepdims=True)
        std = self.xp.maximum(self.std, self.xp.finfo(self.dtype).tiny)
        grad[...] = centred_dy / (self.std + p.eps) - y * mean_dy_y / std
