"""Loss layers: SoftmaxWithLoss, SigmoidCrossEntropyLoss, EuclideanLoss, HingeLoss.

Each produces a scalar top whose default loss weight is 1.  In backward the
loss weight arrives as the top's diff, so a weighted loss needs no special case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ShapeError
from netspec.layers.softmax import SoftmaxParams, softmax, softmax_view
from netspec.spec.schema import doc


@dataclass
class LossParams:
    """Parameters shared by the loss layers (Caffe's LossParameter)."""

    ignore_label: int | None = doc(None, "targets equal to this contribute neither loss nor gradient")
    normalization: Literal["FULL", "VALID", "BATCH_SIZE", "NONE"] | None = doc(
        None, "divide by every position (FULL), the non-ignored ones (VALID), N (BATCH_SIZE) or 1 (NONE); "
              "default: the layer's own")
    normalize: bool | None = doc(None, "legacy: true means VALID, false BATCH_SIZE")


class Loss(Layer):
    """Base of the loss layers: two bottoms (prediction, target), a scalar top."""

    is_loss = True
    num_bottoms = (2, 2)
    label_bottoms = (1,)
    default_normalization = "VALID"

    def normalizer(self, outer: int, inner: int, valid):
        """What the summed loss is divided by, as the loss_param block asks."""
        p = self.block("loss_param")
        mode = p.normalization
        if mode is None:
            mode = self.default_normalization if p.normalize is None else ("VALID" if p.normalize else "BATCH_SIZE")
        if mode == "VALID" and p.ignore_label is not None:
            return self.xp.maximum(valid.sum(), 1).astype(self.dtype)
        return {"FULL": outer * inner, "VALID": outer * inner, "BATCH_SIZE": outer, "NONE": 1}[mode]


def class_labels(layer: Layer, values, classes: int, ignore_label: int | None = None):
    """``(labels as int64, valid)`` from the values of a label blob (class indices stored as floats).

    ``valid`` marks the labels other than ``ignore_label``; a valid one that is
    not a whole number in [0, classes) (1.7, -1, 1e30, NaN) is a DataError
    naming the layer, the bottom and the value, never truncated or wrapped.
    """
    xp = layer.xp
    valid = values != ignore_label if ignore_label is not None else xp.ones(values.shape, dtype=bool)
    bad = valid & ~((values >= 0) & (values < classes) & (values == xp.floor(values)))
    if bool(bad.any()):
        value = values[bad].ravel()[0]  # as the blob holds it: float32 1.7 shows as 1.7
        shown = int(value) if float(value).is_integer() and abs(float(value)) < 2 ** 53 else str(value)
        raise DataError(f"layer '{layer.name}': label {shown} of bottom '{layer.spec.bottoms[1]}' is not a class "
                        f"index 0 to {classes - 1} ({int(xp.count_nonzero(bad))} such labels in the batch)")
    return xp.where(valid, values, 0).astype(xp.int64), valid


@register_layer
class SoftmaxWithLoss(Loss):
    """SoftmaxWithLoss: multinomial logistic loss of the softmax, ``-sum log p[label] / normalizer``.

    Bottoms: scores (N, K, ...) with classes on ``softmax_param.axis``, and
    labels with one integer (stored as float) per position, i.e. N x ... values.
    Tops: the loss (a scalar) and optionally the probabilities.  Positions
    labelled ``ignore_label`` are skipped; the default normalisation is VALID
    (their number).  Gradient: ``(p - onehot(label)) * loss_weight / normalizer``.

    Example::

        - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}
    """

    type = "SoftmaxWithLoss"
    param_blocks = {"softmax_param": SoftmaxParams, "loss_param": LossParams}
    num_tops = (1, 2)

    def top_shapes(self, bottom_shapes):
        outer, classes, inner = softmax_view(bottom_shapes[0], self.block("softmax_param").axis)
        if math.prod(bottom_shapes[1]) != outer * inner:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"{outer * inner} labels (one per position of scores {bottom_shapes[0]} "
                             f"outside the class axis)")
        return [()] + [bottom_shapes[0]] * (len(self.spec.tops) - 1)

    def forward(self, bottom, top):
        xp = self.xp
        outer, classes, inner = softmax_view(bottom[0].shape, self.block("softmax_param").axis)
        if not hasattr(self, "prob") or self.prob.shape != (outer, classes, inner):
            self.prob = xp.empty((outer, classes, inner), dtype=self.dtype)
        softmax(xp, bottom[0].data.reshape(outer, classes, inner), self.prob)
        self.labels, self.valid = class_labels(self, bottom[1].data.reshape(outer, 1, inner), classes,
                                               self.block("loss_param").ignore_label)
        picked = xp.take_along_axis(self.prob, self.labels, axis=1)
        log_p = xp.log(xp.maximum(picked, xp.finfo(self.dtype).tiny))
        self.norm = self.normalizer(outer, inner, self.valid)
        top[0].data[...] = -(log_p * self.valid).sum() / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        grad = bottom[0].diff.reshape(self.prob.shape)
        grad[...] = self.prob
        xp.put_along_axis(grad, self.labels, xp.take_along_axis(grad, self.labels, axis=1) - 1, axis=1)
        grad *= self.valid
        grad *= top[0].diff / self.norm


@register_layer
class SigmoidCrossEntropyLoss(Loss):
    """SigmoidCrossEntropyLoss: ``-sum [t log s(x) + (1 - t) log(1 - s(x))] / normalizer``.

    Bottoms: scores and targets in [0, 1] of the same count.  Top: the loss.
    Default normalisation BATCH_SIZE (divide by N), as Caffe.  Computed
    stably as ``max(x, 0) - x t + log(1 + exp(-|x|))``; gradient
    ``(s(x) - t) * loss_weight / normalizer``.

    Example::

        - {name: loss, type: SigmoidCrossEntropyLoss, bottom: [scores, targets], top: loss}
    """

    type = "SigmoidCrossEntropyLoss"
    param_blocks = {"loss_param": LossParams}
    default_normalization = "BATCH_SIZE"

    def top_shapes(self, bottom_shapes):
        if math.prod(bottom_shapes[0]) != math.prod(bottom_shapes[1]):
            raise ShapeError(f"scores {bottom_shapes[0]} and targets {bottom_shapes[1]} must have as many values")
        return [()]

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        ignore = self.block("loss_param").ignore_label
        self.valid = t != ignore if ignore is not None else xp.ones(x.shape, dtype=bool)
        losses = xp.maximum(x, 0) - x * t + xp.log1p(xp.exp(-xp.abs(x)))
        self.norm = self.normalizer(x.shape[0], x.size // x.shape[0], self.valid)
        top[0].data[...] = (losses * self.valid).sum() / self.norm

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        sigmoid = 0.5 * self.xp.tanh(0.5 * x) + 0.5
        bottom[0].diff[...] = (sigmoid - t) * self.valid * (top[0].diff / self.norm)


@register_layer
class EuclideanLoss(Layer):
    """EuclideanLoss: ``sum ||a - b||^2 / (2N)``.

    Bottoms: a and b with the same number of values (N = a's first axis).
    Top: the loss.  Both bottoms receive a gradient (``+-(a - b) / N``).

    Example::

        - {name: loss, type: EuclideanLoss, bottom: [pred, target], top: loss}
    """

    type = "EuclideanLoss"
    is_loss = True
    num_bottoms = (2, 2)

    def top_shapes(self, bottom_shapes):
        if math.prod(bottom_shapes[0]) != math.prod(bottom_shapes[1]):
            raise ShapeError(f"bottoms {bottom_shapes[0]} and {bottom_shapes[1]} must have as many values")
        return [()]

    def forward(self, bottom, top):
        self.difference = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        top[0].data[...] = (self.difference * self.difference).sum() / (2 * bottom[0].shape[0])

    def backward(self, top, propagate_down, bottom):
        scale = top[0].diff / bottom[0].shape[0]
        for sign, blob, wanted in zip((1, -1), bottom, propagate_down):
            if wanted:
                blob.diff[...] = (sign * scale * self.difference).reshape(blob.shape)


@dataclass
class HingeLossParams:
    """Parameters of HingeLoss."""

    norm: Literal["L1", "L2"] = doc("L1", "L1: sum of hinges; L2: sum of squared hinges")


@register_layer
class HingeLoss(Layer):
    """HingeLoss: one-versus-all hinge, ``sum_n sum_k max(0, 1 - d_nk * x_nk)^p / N``.

    ``d_nk`` is +1 for the true class and -1 for the others; p is 1 (L1) or 2 (L2).
    Bottoms: scores (N, K, ...) flattened to (N, K*...), labels (N).
    Top: the loss.

    Example::

        - {name: loss, type: HingeLoss, bottom: [ip2, label], top: loss, hinge_loss_param: {norm: L2}}
    """

    type = "HingeLoss"
    param_blocks = {"hinge_loss_param": HingeLossParams}
    is_loss = True
    num_bottoms = (2, 2)
    label_bottoms = (1,)

    def top_shapes(self, bottom_shapes):
        if math.prod(bottom_shapes[1]) != bottom_shapes[0][0]:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"one label per instance ({bottom_shapes[0][0]})")
        return [()]

    def forward(self, bottom, top):
        xp = self.xp
        n = bottom[0].shape[0]
        x = bottom[0].data.reshape(n, -1)
        labels, _ = class_labels(self, bottom[1].data.reshape(n, 1), x.shape[1])
        self.sign = xp.ones(x.shape, dtype=self.dtype)
        xp.put_along_axis(self.sign, labels, -1, axis=1)
        self.margin = xp.maximum(0, 1 + self.sign * x)
        power = 1 if self.block("hinge_loss_param").norm == "L1" else 2
        top[0].data[...] = (self.margin ** power).sum() / n

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].shape[0]
        local = (self.margin > 0) if self.block("hinge_loss_param").norm == "L1" else 2 * self.margin
        bottom[0].diff[...] = (self.sign * local * (top[0].diff / n)).reshape(bottom[0].shape)
