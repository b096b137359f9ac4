"""Deconvolution: the transpose of Convolution (its input's gradient as a forward pass), by col2im or oneDNN."""

from __future__ import annotations

import math

from netspec.engine import blas, onednn, primitives
from netspec.engine.layer import Layer, weighted_flops
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.layers.convolution import (
    ConvGeometry,
    ConvolutionParams,
    check_channels,
    col2im,
    conv_geometry,
    for_device,
    im2col,
    spatial_params,
)
from netspec.layers.spatial import hw, require_4d


@register_layer
class Deconvolution(Layer):
    """Deconvolution: learned 2-D upsampling, the transpose of a convolution (Caffe's Deconvolution).

    ``y`` is what the input gradient of a convolution with the same
    ``convolution_param`` would be if ``x`` were its output gradient: each
    input value spreads its kernel, scaled, over the output.

    Bottom: (N, C, H, W).  Top: (N, num_output, H', W') with
    ``H' = stride*(H-1) + dilation*(kernel-1) + 1 - 2*pad``.  Learnable:
    weights (C, num_output/group, kh, kw), as in Caffe, and a bias
    (num_output,) if ``bias_term``.  With ``weight_filler: {type: bilinear}``,
    ``kernel_size: 2f - f%2``, ``stride: f`` and ``pad: ceil((f-1)/2)``
    (and ``group`` = channels = num_output, lr_mult 0) it is FCN's fixed
    bilinear upsampling by ``f``.  Not in place.  On the CPU in float32 it
    runs as oneDNN's convolution primitives with their roles swapped.

    Example::

        - name: upscore
          type: Deconvolution
          bottom: score
          top: upscore
          param: {lr_mult: 0}
          convolution_param: {num_output: 21, group: 21, kernel_size: 64, stride: 32, bias_term: false,
                              weight_filler: {type: bilinear}}
    """

    type = "Deconvolution"
    param_blocks = {"convolution_param": ConvolutionParams}

    @property
    def params(self) -> ConvolutionParams:
        """The convolution_param block."""
        return self.block("convolution_param")

    def output_shape(self, shape) -> tuple[int, int, int, int]:
        """The top's shape for a bottom shape (validated)."""
        require_4d(shape, self.type)
        p = self.params
        check_channels(p, shape[1])
        kernel, pad, stride, dilation = spatial_params(p)
        out = [s * (size - 1) + d * (k - 1) + 1 - 2 * q
               for size, k, q, s, d in zip(shape[2:], kernel, pad, stride, dilation)]
        if min(out) < 1:
            raise ShapeError(f"the output would be {out[0]}x{out[1]}: padding {pad} removes more than the "
                             f"upsampled bottom {shape} holds", "convolution_param.pad")
        return (shape[0], p.num_output, *out)

    def geometry(self, shape) -> ConvGeometry:
        """The geometry of the convolution this layer transposes: from the top's shape back to the bottom's."""
        return conv_geometry(self.params, self.output_shape(shape))

    def top_shapes(self, bottom_shapes):
        return [self.output_shape(bottom_shapes[0])]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        # the transposed convolution's multiply-adds (one weight row per input value), and the bias per output
        return weighted_flops(bottom_shapes[0], param_shapes[:1]) + (
            math.prod(top_shapes[0]) if len(param_shapes) > 1 else 0)

    def param_shapes(self, bottom_shapes):
        p = self.params
        kernel = hw(p, "kernel_size", "convolution_param")
        shapes = [(bottom_shapes[0][1], p.num_output // max(p.group, 1), *kernel)]
        return shapes + [(p.num_output,)] if p.bias_term else shapes

    def param_fillers(self):
        return [self.params.weight_filler, self.params.bias_filler][:len(self.param_shapes_cache)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.geo = for_device(self.geometry(bottom[0].shape), self.xp)
        p = self.params
        # the convolution from the top's shape to the bottom's, its passes used the other way round
        self.fast = onednn.attempt(self, lambda lib: primitives.Convolution(
            lib, top[0].shape, self.blobs[0].shape, bottom[0].shape, p.group, self.geo.stride, self.geo.pad,
            self.geo.dilation, bias=False))

    def grouped_weights(self):
        """Weights as (G, C/G, O/G*kh*kw)."""
        weights = self.blobs[0].data
        return weights.reshape(self.params.group, weights.shape[0] // self.params.group, -1)

    def forward(self, bottom, top):
        x, y = bottom[0].data, top[0].data
        if self.fast is not None:
            self.fast.backward_data(x, self.blobs[0].data, y)
        else:
            xp, g = self.xp, self.params.group
            x_cols = xp.ascontiguousarray(x.transpose(self.geo.order)).reshape(g, x.shape[1] // g, -1)
            grouped = self.grouped_weights()
            cols = xp.empty((g, grouped.shape[2], x_cols.shape[2]), dtype=self.dtype)
            for group in range(g):
                blas.product(self.backend, grouped[group], x_cols[group], cols[group], transpose_a=True)
            rest = self.geo.arranged(x.shape[0], 1, *self.geo.out)[1:]
            y[...] = col2im(xp, cols.reshape(y.shape[1], *self.geo.kernel, *rest), y.shape, self.geo)
        if self.params.bias_term:
            y += self.blobs[1].data.reshape(1, -1, 1, 1)

    def backward(self, top, propagate_down, bottom):
        xp, g = self.xp, self.params.group
        x, dy = bottom[0].data, top[0].diff
        weights = self.blobs[0]
        if self.params.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=(0, 2, 3))
        if self.fast is not None:
            if self.param_propagate_down[0]:
                dw = xp.empty_like(weights.diff)
                self.fast.backward_weights(dy, x, dw, None)
                weights.diff += dw
            if propagate_down[0]:
                self.fast.forward(dy, weights.data, None, bottom[0].diff)
            return
        cols = im2col(xp, dy, self.geo)
        cols = cols.reshape(g, -1, cols[0, 0, 0].size)
        if self.param_propagate_down[0]:
            x_cols = xp.ascontiguousarray(x.transpose(self.geo.order)).reshape(g, x.shape[1] // g, -1)
            grad = weights.diff.reshape(g, x.shape[1] // g, -1)
            for group in range(g):
                blas.product(self.backend, x_cols[group], cols[group], grad[group], transpose_b=True, add=True)
        if propagate_down[0]:
            grouped = self.grouped_weights()
            out = xp.empty((g, grouped.shape[1], cols.shape[2]), dtype=self.dtype)
            for group in range(g):
                blas.product(self.backend, grouped[group], cols[group], out[group])
            out = out.reshape(x.shape[1], -1)
            rest = self.geo.arranged(x.shape[0], 1, *self.geo.out)[1:]
            bottom[0].diff[...] = out.reshape(x.shape[1], *rest).transpose(self.geo.inverse)
