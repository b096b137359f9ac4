"""InnerProduct: a fully connected layer (by oneDNN on the CPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.engine import blas, onednn, primitives
from netspec.engine.fillers import FillerParams
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.spec.schema import doc, required


@dataclass
class InnerProductParams:
    """Parameters of InnerProduct."""

    num_output: int = required(doc="number of outputs")
    bias_term: bool = doc(True, "add a learned bias")
    axis: int = doc(1, "first axis to flatten into the input vector (negative counts from the end)")
    transpose: bool = doc(False, "store weights as (inputs, outputs) instead of (outputs, inputs)")
    weight_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "weight init"})
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "bias init"})


@register_layer
class InnerProduct(Layer):
    """InnerProduct: ``y = x W^T + b`` over the axes from ``axis`` on, flattened.

    Bottom: any shape; axes before ``axis`` are kept, the rest (K values)
    form each input vector.  Top: ``bottom.shape[:axis] + (num_output,)``.
    Learnable: weights (num_output, K) — (K, num_output) with ``transpose`` —
    and bias (num_output,).  Fillers default to constant 0, as in Caffe.
    Not in place.  On the CPU in float32 (without ``transpose``) oneDNN's
    primitives run it (``NETSPEC_ONEDNN=0``: NumPy).

    Example::

        - name: ip1
          type: InnerProduct
          bottom: pool2
          top: ip1
          inner_product_param: {num_output: 500, weight_filler: {type: xavier}}
    """

    type = "InnerProduct"
    param_blocks = {"inner_product_param": InnerProductParams}
    fast_records = True

    @property
    def params(self) -> InnerProductParams:
        """The inner_product_param block."""
        return self.block("inner_product_param")

    def split(self, shape) -> tuple[int, int, int]:
        """(axis, rows M, inputs K) for a bottom shape."""
        axis = canonical_axis(self.params.axis, len(shape), "inner_product_param.axis")
        if self.params.num_output is None or self.params.num_output <= 0:
            raise ParamError("inner_product_param.num_output", "must be a positive integer")
        return axis, math.prod(shape[:axis]), math.prod(shape[axis:])

    def top_shapes(self, bottom_shapes):
        axis = self.split(bottom_shapes[0])[0]
        return [(*bottom_shapes[0][:axis], self.params.num_output)]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        outputs = math.prod(top_shapes[0])
        return 2 * outputs * self.split(bottom_shapes[0])[2] + (outputs if self.params.bias_term else 0)

    def param_shapes(self, bottom_shapes):
        k = self.split(bottom_shapes[0])[2]
        n = self.params.num_output
        shapes = [(k, n) if self.params.transpose else (n, k)]
        return shapes + [(n,)] if self.params.bias_term else shapes

    def param_fillers(self):
        return [self.params.weight_filler, self.params.bias_filler][:len(self.param_shapes_cache)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.fast = self._onednn(bottom[0].shape)

    def _onednn(self, bottom_shape) -> primitives.InnerProduct | None:
        """oneDNN's primitives for this shape, or None when they cannot run it (NumPy does)."""
        if self.params.transpose:
            return None
        _, m, k = self.split(bottom_shape)
        return onednn.attempt(self, lambda lib: primitives.InnerProduct(lib, m, k, self.params.num_output,
                                                                    self.params.bias_term))

    def forward(self, bottom, top):
        _, m, k = self.split(bottom[0].shape)
        out = top[0].data.reshape(m, -1)
        if self.fast is not None:
            bias = self.blobs[1].data if self.params.bias_term else None
            self.fast.forward(bottom[0].data.reshape(m, k), self.blobs[0].data, bias, out)
            return
        blas.product(self.backend, bottom[0].data.reshape(m, k), self.blobs[0].data, out,
                     transpose_b=not self.params.transpose)
        if self.params.bias_term:
            out += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        _, m, k = self.split(bottom[0].shape)
        dy = top[0].diff.reshape(m, -1)
        x = bottom[0].data.reshape(m, k)
        if self.fast is not None:
            bias = self.blobs[1] if self.params.bias_term else None
            self.fast.backward(x, dy, bottom[0].diff.reshape(m, k) if propagate_down[0] else None, self.blobs[0],
                               bias, self.param_propagate_down)
            return
        if self.param_propagate_down[0]:
            if self.params.transpose:
                blas.product(self.backend, x, dy, self.blobs[0].diff, transpose_a=True, add=True)
            else:
                blas.product(self.backend, dy, x, self.blobs[0].diff, transpose_a=True, add=True)
        if self.params.bias_term and self.param_propagate_down[1]:
            blas.sums(self.backend, dy, self.backend.ones(m, self.dtype), self.blobs[1].diff, 0, add=True)
        if propagate_down[0]:
            blas.product(self.backend, dy, self.blobs[0].data, bottom[0].diff.reshape(m, k),
                         transpose_b=self.params.transpose)
