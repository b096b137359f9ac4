"""LRN: local response normalisation across channels or within each channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy

from netspec import threads
from netspec.engine import kernels, onednn, primitives
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.layers.spatial import pad_hw, require_4d, window
from netspec.spec.schema import doc


@dataclass
class LRNParams:
    """Parameters of LRN."""

    local_size: int = doc(5, "window size n (odd)")
    alpha: float = doc(1.0, "scaling of the summed squares")
    beta: float = doc(0.75, "exponent")
    k: float = doc(1.0, "additive constant (ACROSS_CHANNELS)")
    norm_region: Literal["ACROSS_CHANNELS", "WITHIN_CHANNEL"] = doc("ACROSS_CHANNELS", "where the window lies")


@register_layer
class LRN(Layer):
    """LRN: ``y = x * s^-beta``, Caffe's two variants.

    ACROSS_CHANNELS: ``s = k + alpha/n * sum of x^2 over the n channels centred
    on c`` (zero beyond the edges).  WITHIN_CHANNEL: ``s = 1 + alpha/n^2 * sum
    of x^2 over the n x n window centred on (h, w)`` (zero padding; as Caffe,
    ``k`` is not used).

    Bottom/top: (N, C, H, W).  Not in place.  On the CPU in float32 oneDNN's
    primitives run it; on a GPU, ACROSS_CHANNELS runs as one CUDA kernel a pass.

    Example::

        - name: norm1
          type: LRN
          bottom: pool1
          top: norm1
          lrn_param: {local_size: 5, alpha: 0.0001, beta: 0.75}
    """

    type = "LRN"
    takes_held = True
    fast_records = True
    param_blocks = {"lrn_param": LRNParams}

    def top_shapes(self, bottom_shapes):
        require_4d(bottom_shapes[0], self.type)
        size = self.block("lrn_param").local_size
        if size <= 0 or size % 2 == 0:
            raise ParamError("lrn_param.local_size", f"must be a positive odd number, got {size}")
        return [bottom_shapes[0]]

    def window_sum(self, values):
        """Sum of ``values`` over each position's window (the window is symmetric, so this is self-adjoint)."""
        xp = self.xp
        p = self.block("lrn_param")
        half = (p.local_size - 1) // 2
        n, c, h, w = values.shape
        if p.norm_region == "ACROSS_CHANNELS":
            padded = xp.zeros((n, c + 2 * half, h, w), dtype=values.dtype)
            padded[:, half:half + c] = values
            total = padded[:, :c].copy()
            for offset in range(1, p.local_size):
                total += padded[:, offset:offset + c]
            return total
        padded = pad_hw(xp, values, half, half, half, half)
        total = xp.zeros_like(values)
        for i in range(p.local_size):
            for j in range(p.local_size):
                total += window(padded, (2, i, 1, h), (3, j, 1, w))
        return total

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        p = self.block("lrn_param")
        across = p.norm_region == "ACROSS_CHANNELS"
        self.fast = onednn.attempt_in(self, onednn.layout_of(bottom[0].values), lambda lib, layout:
                                      primitives.LocalResponseNormalization(
                                          lib, bottom[0].shape, across, p.local_size, p.alpha, p.beta,
                                          p.k if across else 1.0, training=not self.inference, layout=layout))
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)
        self.kernel = across and kernels.compiled(self.xp)  # (on a GPU one CUDA kernel a pass)
        if self.kernel:
            self.scale = self.xp.empty(bottom[0].shape, dtype=self.dtype)

    def coefficients(self) -> tuple[float, float]:
        """(constant, multiplier) of ``s = constant + multiplier * window_sum(x^2)``."""
        p = self.block("lrn_param")
        if p.norm_region == "ACROSS_CHANNELS":
            return p.k, p.alpha / p.local_size
        return 1.0, p.alpha / (p.local_size * p.local_size)

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast.forward(bottom[0].values, top[0].values)
            return
        x = bottom[0].data
        constant, multiplier = self.coefficients()
        if self.kernel:
            p = self.block("lrn_param")
            kernels.lrn(x, p.local_size, constant, multiplier, p.beta, self.scale, top[0].data)
            return
        y, self.scale = top[0].data, self.xp.empty_like(x)

        def normalise(part):
            self.scale[part] = constant + multiplier * self.window_sum(x[part] * x[part])
            self.xp.multiply(x[part], self.xp.power(self.scale[part], -self.block("lrn_param").beta), out=y[part])

        self.in_parts(x.shape[0], normalise)

    def in_parts(self, count: int, work) -> None:
        """``work(part)`` over slices of the batch: at once on every core on NumPy (the batch's samples are
        independent), whole on a GPU."""
        if self.xp is numpy:
            threads.in_parts(count, work)
        else:
            work(slice(None))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.fast is not None:
            self.fast.backward(bottom[0].values, top[0].gradient, bottom[0].gradient)
            return
        beta = self.block("lrn_param").beta
        _, multiplier = self.coefficients()
        x, y, dy = bottom[0].data, top[0].data, top[0].diff
        if self.kernel:
            kernels.lrn_backward(x, y, dy, self.scale, self.block("lrn_param").local_size, multiplier, beta,
                                 bottom[0].diff)
            return
        dx = bottom[0].diff

        def differentiate(part):
            spread = self.window_sum(dy[part] * y[part] / self.scale[part])
            dx[part] = dy[part] * self.xp.power(self.scale[part], -beta) - (2 * multiplier * beta) * x[part] * spread

        self.in_parts(x.shape[0], differentiate)
