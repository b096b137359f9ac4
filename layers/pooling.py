"""Pooling: MAX or AVE over 2-D windows, with Caffe's ceil rounding and padding rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from netspec.config import doc
from netspec.errors import ParamError, ShapeError
from netspec.layer import Layer
from netspec.layers.spatial import hw, pad_hw, require_4d, window
from netspec.registry import register_layer


@dataclass
class PoolingParams:
    """Parameters of Pooling (Caffe's PoolingParameter, 2-D)."""

    pool: Literal["MAX", "AVE"] = doc("MAX", "MAX or AVE")
    kernel_size: list[int] = doc([], "window size: one value, or (height, width)")
    stride: list[int] = doc([], "stride: one value, or (height, width); default 1")
    pad: list[int] = doc([], "padding: one value, or (height, width); default 0")
    kernel_h: int | None = doc(None, "window height (with kernel_w)")
    kernel_w: int | None = doc(None, "window width")
    stride_h: int | None = doc(None, "stride height (with stride_w)")
    stride_w: int | None = doc(None, "stride width")
    pad_h: int | None = doc(None, "padding height (with pad_w)")
    pad_w: int | None = doc(None, "padding width")
    global_pooling: bool = doc(False, "pool over the whole spatial extent")
    round_mode: Literal["CEIL", "FLOOR"] = doc("CEIL", "how the output size is rounded (Caffe: CEIL)")


@dataclass(frozen=True)
class PoolGeometry:
    """Kernel, stride, padding, output size and the padding needed past the input's far edge."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]
    far_pad: tuple[int, int]


def pool_geometry(p: PoolingParams, shape) -> PoolGeometry:
    """Output size by Caffe's rule: rounded up, and the last window must start inside the padded input."""
    key = "pooling_param"
    if p.global_pooling:
        if p.kernel_size or p.kernel_h is not None:
            raise ParamError(f"{key}.global_pooling", "give global_pooling or kernel_size, not both")
        kernel, stride, pad = tuple(shape[2:]), (1, 1), (0, 0)
    else:
        kernel = hw(p, "kernel_size", key)
        stride, pad = hw(p, "stride", key, 1), hw(p, "pad", key, 0)
    if min(kernel) < 1 or min(stride) < 1 or min(pad) < 0:
        raise ParamError(key, f"kernel and stride must be positive and pad non-negative, got kernel {kernel}, "
                              f"stride {stride}, pad {pad}")
    if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
        raise ParamError(f"{key}.pad", f"pad {pad} must be smaller than the kernel {kernel}")
    out, far = [], []
    for size, k, s, q in zip(shape[2:], kernel, stride, pad):
        if size + 2 * q < k:
            raise ShapeError(f"the {k}-wide window does not fit the padded input ({size} + 2*{q}); "
                             f"bottom shape {tuple(shape)}", f"{key}.kernel_size")
        rounding = math.ceil if p.round_mode == "CEIL" else math.floor
        n = rounding((size + 2 * q - k) / s) + 1
        if q and (n - 1) * s >= size + q:
            n -= 1
        out.append(n)
        far.append(max(0, (n - 1) * s + k - size - q))
    return PoolGeometry(kernel, stride, pad, tuple(out), tuple(far))


@register_layer
class Pooling(Layer):
    """Pooling: the maximum (MAX) or mean (AVE) of each window, per channel.

    Bottom: (N, C, H, W).  Top: (N, C, H', W') with Caffe's rounding
    ``H' = ceil((H + 2*pad - kernel) / stride) + 1``, minus one when the last
    window would start in the padding (``round_mode: FLOOR`` rounds down
    instead).  MAX never picks a padded position; its gradient goes to the
    first maximum of each window.  AVE divides by the window clipped to the
    padded input, so padding counts but the overhang of a ceil-rounded last
    window does not.  ``global_pooling`` pools all of H x W.  Not in place.

    Example::

        - name: pool1
          type: Pooling
          bottom: conv1
          top: pool1
          pooling_param: {pool: MAX, kernel_size: 2, stride: 2}
    """

    type = "Pooling"
    param_blocks = {"pooling_param": PoolingParams}

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        require_4d(shape, self.type)
        return [(*shape[:2], *pool_geometry(self.block("pooling_param"), shape).out)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.geo = pool_geometry(self.block("pooling_param"), bottom[0].shape)
        if self.block("pooling_param").pool == "AVE":
            self.divisor = self.xp.asarray(self.window_sizes(bottom[0].shape), dtype=self.dtype)

    def window_sizes(self, shape):
        """(H', W') count of positions each AVE window covers inside the padded input."""
        counts = []
        for size, k, s, q, n in zip(shape[2:], self.geo.kernel, self.geo.stride, self.geo.pad, self.geo.out):
            starts = [o * s - q for o in range(n)]
            counts.append([min(start + k, size + q) - start for start in starts])
        return self.xp.outer(self.xp.asarray(counts[0]), self.xp.asarray(counts[1]))

    def padded(self, x, value):
        """``x`` padded by ``pad`` before and by ``pad`` or the ceil overhang after."""
        (ph, pw), (fh, fw) = self.geo.pad, self.geo.far_pad
        return pad_hw(self.xp, x, ph, fh, pw, fw, value)

    def offsets(self):
        """Every (i, j) kernel offset in Caffe's scan order."""
        return [(i, j) for i in range(self.geo.kernel[0]) for j in range(self.geo.kernel[1])]

    def forward(self, bottom, top):
        xp, geo = self.xp, self.geo
        out = top[0].data
        if self.block("pooling_param").pool == "MAX":
            padded = self.padded(bottom[0].data, -xp.inf)
            offsets = self.offsets()
            self.argmax = xp.zeros(out.shape, dtype=xp.int8 if len(offsets) < 128 else xp.int32)
            better = xp.empty(out.shape, dtype=bool)
            step = xp.empty_like(self.argmax)
            out[...] = window(padded, 0, 0, *geo.out, *geo.stride)
            for index, (i, j) in enumerate(offsets[1:], start=1):
                view = window(padded, i, j, *geo.out, *geo.stride)
                xp.greater(view, out, out=better)
                # argmax = index where better, kept elsewhere; arithmetic, since a masked copy
                # with an unpredictable mask is several times slower on CPUs
                xp.subtract(index, self.argmax, out=step)
                step *= better
                self.argmax += step
                xp.maximum(out, view, out=out)
        else:
            padded = self.padded(bottom[0].data, 0.0)
            out[...] = 0
            for i, j in self.offsets():
                out += window(padded, i, j, *geo.out, *geo.stride)
            out /= self.divisor

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp, geo = self.xp, self.geo
        n, c, h, w = bottom[0].shape
        grad = xp.zeros((n, c, h + geo.pad[0] + geo.far_pad[0], w + geo.pad[1] + geo.far_pad[1]),
                        dtype=self.dtype)
        dy = top[0].diff
        if self.block("pooling_param").pool == "MAX":
            chosen = xp.empty(dy.shape, dtype=bool)
            share = xp.empty_like(dy)
            for index, (i, j) in enumerate(self.offsets()):
                xp.equal(self.argmax, index, out=chosen)
                xp.multiply(dy, chosen, out=share)
                window(grad, i, j, *geo.out, *geo.stride)[...] += share
        else:
            share = dy / self.divisor
            for i, j in self.offsets():
                window(grad, i, j, *geo.out, *geo.stride)[...] += share
        bottom[0].diff[...] = grad[:, :, geo.pad[0]:geo.pad[0] + h, geo.pad[1]:geo.pad[1] + w]
