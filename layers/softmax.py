"""Softmax along one axis, and its logarithm (LogSoftmax)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.spec.schema import doc


@dataclass
class SoftmaxParams:
    """Parameters of Softmax (and of SoftmaxWithLoss's softmax)."""

    axis: int = doc(1, "axis holding the classes")


def softmax_view(shape, axis_param: int) -> tuple[int, int, int]:
    """x viewed as (outer, classes, inner) for the softmax axis."""
    axis = canonical_axis(axis_param, len(shape), "softmax_param.axis")
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def softmax(xp, x, out) -> None:
    """Write the softmax of (outer, classes, inner) ``x`` over axis 1 into ``out``, stably."""
    xp.subtract(x, x.max(axis=1, keepdims=True), out=out)
    xp.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)


def log_softmax(xp, x, out) -> None:
    """Write the log-softmax of (outer, classes, inner) ``x`` over axis 1 into ``out``, stably."""
    xp.subtract(x, x.max(axis=1, keepdims=True), out=out)
    out -= xp.log(xp.exp(out).sum(axis=1, keepdims=True))


@register_layer
class Softmax(Layer):
    """Softmax: ``y_k = exp(x_k) / sum_j exp(x_j)`` along ``axis``.

    Bottom/top: any shape.  Not in place.  On the CPU in float32 oneDNN's softmax runs it.

    Example::

        - {name: prob, type: Softmax, bottom: fc8, top: prob}
    """

    type = "Softmax"
    param_blocks = {"softmax_param": SoftmaxParams}
    fast_records = True
    log = False  # (LogSoftmax: the logarithm of the softmax)

    def top_shapes(self, bottom_shapes):
        softmax_view(bottom_shapes[0], self.block("softmax_param").axis)
        return [bottom_shapes[0]]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        view = softmax_view(bottom[0].shape, self.block("softmax_param").axis)
        self.fast = onednn.attempt(self, lambda lib: primitives.Softmax(lib, view, 1, log=self.log))

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast.forward(bottom[0].data, top[0].data)
            return
        view = softmax_view(bottom[0].shape, self.block("softmax_param").axis)
        (log_softmax if self.log else softmax)(self.xp, bottom[0].data.reshape(view), top[0].data.reshape(view))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and self.fast is not None:
            self.fast.backward(None, top[0].data, top[0].diff, bottom[0].diff)
        elif propagate_down[0]:
            view = softmax_view(bottom[0].shape, self.block("softmax_param").axis)
            y, dy, dx = top[0].data.reshape(view), top[0].diff.reshape(view), bottom[0].diff.reshape(view)
            if self.log:
                self.xp.subtract(dy, self.xp.exp(y) * dy.sum(axis=1, keepdims=True), out=dx)
            else:
                self.xp.multiply(y, dy - (dy * y).sum(axis=1, keepdims=True), out=dx)


@register_layer
class LogSoftmax(Softmax):
    """LogSoftmax: ``y_k = x_k - log sum_j exp(x_j)`` along ``axis``, computed as ``x_k - m - log sum_j exp(x_j -
    m)`` with ``m`` the maximum (PyTorch's ``log_softmax``, ONNX's LogSoftmax): the logarithm of Softmax's
    output, without its rounding to 0 for the unlikely classes.  The gradient is ``dy_k - exp(y_k) sum_j dy_j``.

    Bottom/top: any shape.  Not in place.  On the CPU in float32 oneDNN's log-softmax runs it.

    Example::

        - {name: log_prob, type: LogSoftmax, bottom: fc8, top: log_prob, softmax_param: {axis: 1}}
    """

    type = "LogSoftmax"
    log = True
