"""Loss layers: SoftmaxWithLoss, SigmoidCrossEntropyLoss, EuclideanLoss, HingeLoss, ContrastiveLoss,
InfogainLoss, MultinomialLogisticLoss.

Each produces a scalar top whose default loss weight is 1.  In backward the
loss weight arrives as the top's diff, so a weighted loss needs no special case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.data.files import regular_file
from netspec.engine import kernels
from netspec.engine.layer import Layer, canonical_axis, checked_indices
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ParamError, ShapeError
from netspec.layers.softmax import SoftmaxParams, softmax, softmax_view
from netspec.spec.schema import FilePath, doc

FLT_MIN = float(numpy.finfo(numpy.float32).tiny)  # SoftmaxWithLoss's floor under p before its log, any dtype (Caffe)


@dataclass
class LossParams:
    """Parameters shared by the loss layers (Caffe's LossParameter)."""

    ignore_label: int | None = doc(None, "targets equal to this contribute neither loss nor gradient")
    normalization: Literal["FULL", "VALID", "BATCH_SIZE", "NONE"] | None = doc(
        None, "divide by every position (FULL), the non-ignored ones (VALID), N (BATCH_SIZE) or 1 (NONE); "
              "default: the layer's own")
    normalize: bool | None = doc(None, "legacy: true means VALID, false BATCH_SIZE")


class Loss(Layer):
    """Base of the loss layers: two bottoms (prediction, target) unless a layer says more, a scalar top."""

    is_loss = True
    num_bottoms = (2, 2)
    label_bottoms = (1,)
    default_normalization = "VALID"

    def normalizer(self, outer: int, inner: int, valid):
        """What the summed loss is divided by, as the loss_param block asks (and, as ``averaged_over``, the
        items that makes its mean of: the valid labels themselves where none of them is)."""
        p = self.block("loss_param")
        mode = p.normalization
        if mode is None:
            mode = self.default_normalization if p.normalize is None else ("VALID" if p.normalize else "BATCH_SIZE")
        if mode == "VALID" and p.ignore_label is not None:
            self.averaged_over = valid.sum()
            return self.xp.maximum(self.averaged_over, 1).astype(self.dtype)
        self.averaged_over = {"FULL": outer * inner, "VALID": outer * inner, "BATCH_SIZE": outer, "NONE": 1}[mode]
        return self.averaged_over


def check_first_axes(layer: Layer, bottom_shapes) -> None:
    """Caffe's LossLayer::Reshape check: the data and label bottoms (the first two) have the same first axis."""
    data, label = bottom_shapes[:2]
    if not data or not label or data[0] != label[0]:
        raise ShapeError(f"bottoms '{layer.spec.bottoms[0]}' {data} and '{layer.spec.bottoms[1]}' {label} must have "
                         "the same first axis (Caffe: the data and label should have the same first dimension)")


def class_labels(layer: Layer, values, classes: int, ignore_label: int | None = None):
    """``(labels as int64, valid)`` from the values of a label blob (class indices stored as floats).

    ``valid`` marks the labels other than ``ignore_label``; a valid one that is
    not a whole number in [0, classes) (1.7, -1, 1e30, NaN) is a DataError
    naming the layer, the bottom and the value, never truncated or wrapped.
    """
    xp = layer.xp
    valid = values != ignore_label if ignore_label is not None else xp.ones(values.shape, dtype=bool)
    return checked_indices(layer, values, classes, label_problem(layer, classes), valid), valid


def label_problem(layer: Layer, classes: int):
    """What a label check of ``layer`` says of a label that is no class index (its value, how many such)."""
    def describe(value, count: int) -> str:
        return (f"layer '{layer.name}': label {value} of bottom '{layer.spec.bottoms[1]}' is not a class index 0 to "
                f"{classes - 1} ({count} such labels in the batch)")

    return describe


@dataclass
class LabelSmoothingParams:
    """Label smoothing for SoftmaxWithLoss."""

    epsilon: float = doc(0.0, "the share of the target moved from the labelled class to all K classes evenly "
                              "(PyTorch's label_smoothing)")


@register_layer
class SoftmaxWithLoss(Loss):
    """SoftmaxWithLoss: multinomial logistic loss of the softmax, ``-sum log p[label] / normalizer``.

    Bottoms: scores (N, K, ...) with classes on ``softmax_param.axis``, and
    labels with one integer (stored as float) per position, i.e. N x ... values
    with the first axis N (Caffe's LossLayer check, as in every loss here).
    Tops: the loss (a scalar) and optionally the probabilities.  Positions
    labelled ``ignore_label`` are skipped; the default normalisation is VALID
    (their number).  Gradient: ``(p - t) * loss_weight / normalizer`` with the
    target ``t = onehot(label)``, or with ``label_smoothing_param.epsilon``
    ``t = (1 - epsilon) onehot(label) + epsilon / K`` (the loss is then
    ``-sum_k t_k log p_k``).

    Example::

        - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}
    """

    type = "SoftmaxWithLoss"
    param_blocks = {"softmax_param": SoftmaxParams, "loss_param": LossParams,
                    "label_smoothing_param": LabelSmoothingParams}
    num_tops = (1, 2)

    def top_shapes(self, bottom_shapes):
        check_first_axes(self, bottom_shapes)
        outer, classes, inner = softmax_view(bottom_shapes[0], self.block("softmax_param").axis)
        if math.prod(bottom_shapes[1]) != outer * inner:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"{outer * inner} labels (one per position of scores {bottom_shapes[0]} "
                             f"outside the class axis)")
        if not 0 <= self.block("label_smoothing_param").epsilon <= 1:
            raise ParamError("label_smoothing_param.epsilon", "must be between 0 and 1, got "
                                                              f"{self.block('label_smoothing_param').epsilon}")
        return [()] + [bottom_shapes[0]] * (len(self.spec.tops) - 1)

    def forward(self, bottom, top):
        xp = self.xp
        outer, classes, inner = softmax_view(bottom[0].shape, self.block("softmax_param").axis)
        if not hasattr(self, "prob") or self.prob.shape != (outer, classes, inner):
            self.prob = xp.empty((outer, classes, inner), dtype=self.dtype)
        scores, values = bottom[0].data.reshape(outer, classes, inner), bottom[1].data.reshape(outer, 1, inner)
        epsilon, ignore = self.block("label_smoothing_param").epsilon, self.block("loss_param").ignore_label
        if kernels.compiled(xp):
            losses, self.labels, self.valid, bad = kernels.softmax_loss(
                xp.ascontiguousarray(scores), xp.ascontiguousarray(values), self.prob, epsilon, ignore, FLT_MIN)
            self.backend.check_later(bad, values, label_problem(self, classes))
        else:
            softmax(xp, scores, self.prob)
            self.labels, self.valid = class_labels(self, values, classes, ignore)
            log_prob = xp.log(xp.maximum(self.prob, FLT_MIN))
            log_p = xp.take_along_axis(log_prob, self.labels, axis=1)
            if epsilon:
                log_p = (1 - epsilon) * log_p + epsilon * log_prob.mean(axis=1, keepdims=True)
            losses = -log_p * self.valid
        self.norm = self.normalizer(outer, inner, self.valid)
        xp.divide(losses.sum(), self.norm, out=top[0].data)
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        grad = bottom[0].diff.reshape(self.prob.shape)
        epsilon = self.block("label_smoothing_param").epsilon
        if kernels.compiled(xp):
            scale = (top[0].diff / self.norm).astype(self.dtype, copy=False).reshape(1)
            kernels.softmax_loss_backward(self.prob, self.labels, self.valid, epsilon, scale, grad)
            return
        grad[...] = self.prob - epsilon / self.prob.shape[1]
        xp.put_along_axis(grad, self.labels, xp.take_along_axis(grad, self.labels, axis=1) - (1 - epsilon), axis=1)
        grad *= self.valid
        grad *= top[0].diff / self.norm


@register_layer
class SigmoidCrossEntropyLoss(Loss):
    """SigmoidCrossEntropyLoss: ``-sum [t log s(x) + (1 - t) log(1 - s(x))] / normalizer``.

    Bottoms: scores and targets in [0, 1] of the same count.  Top: the loss.
    Default normalisation BATCH_SIZE (divide by N), as Caffe.  Computed
    stably as ``max(x, 0) - x t + log(1 + exp(-|x|))``; gradient
    ``(s(x) - t) * loss_weight / normalizer``.  A target whose whole part
    (truncated, as Caffe casts it) is ``ignore_label`` counts neither way.

    Example::

        - {name: loss, type: SigmoidCrossEntropyLoss, bottom: [scores, targets], top: loss}
    """

    type = "SigmoidCrossEntropyLoss"
    param_blocks = {"loss_param": LossParams}
    default_normalization = "BATCH_SIZE"

    def top_shapes(self, bottom_shapes):
        check_first_axes(self, bottom_shapes)
        if math.prod(bottom_shapes[0]) != math.prod(bottom_shapes[1]):
            raise ShapeError(f"scores {bottom_shapes[0]} and targets {bottom_shapes[1]} must have as many values")
        return [()]

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        ignore = self.block("loss_param").ignore_label
        # Caffe compares the target cast to int (truncated), so a soft target 0.5 is ignored with ignore_label 0
        self.valid = xp.trunc(t) != ignore if ignore is not None else xp.ones(x.shape, dtype=bool)
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
        check_first_axes(self, bottom_shapes)
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
        check_first_axes(self, bottom_shapes)
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


LOG_THRESHOLD = 1e-20  # Caffe's kLOG_THRESHOLD: probabilities are clipped to it before their log


ROW_DOTS = getattr(numpy, "vecdot", None)  # NumPy 2: the dot product of each row of two arrays (BLAS's on the CPU)


@dataclass
class ContrastiveLossParams:
    """Parameters of ContrastiveLoss (Caffe's ContrastiveLossParameter)."""

    margin: float = doc(1.0, "dissimilar pairs closer than this are pushed apart")
    legacy_version: bool = doc(False, "hinge on the squared distance, max(margin - d^2, 0), as the first "
                                      "version of the layer did, instead of max(margin - d, 0)^2")


@register_layer
class ContrastiveLoss(Loss):
    """ContrastiveLoss: ``sum_n [y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2] / (2N)``, ``d_n = ||a_n - b_n||``.

    Bottoms: a and b, (N, C) or (N, C, 1, 1) each (Caffe's legacy accessors
    read missing axes as 1; a height or width other than 1 is refused, as
    Caffe refuses it), and the similarity labels y, (N,) to (N, 1, 1, 1): a
    label whose integer part is non-zero marks a similar pair, 0 a
    dissimilar one (Caffe's ``static_cast<int>``).
    Top: the loss.  With ``legacy_version`` the dissimilar term is
    ``max(margin - d_n^2, 0)``.  a and b receive the gradient (``+-(a_n - b_n)
    / N`` for similar pairs, ``-+(margin - d_n)(a_n - b_n) / (d_n N)`` for
    dissimilar ones within the margin), y none.  That gradient is the exact
    one; Caffe divides by ``d_n + 1e-4`` where it is divided by ``d_n`` here.

    Example::

        - {name: loss, type: ContrastiveLoss, bottom: [feat, feat_p, sim], top: loss,
           contrastive_loss_param: {margin: 1.0}}
    """

    type = "ContrastiveLoss"
    param_blocks = {"contrastive_loss_param": ContrastiveLossParams}
    num_bottoms = (3, 3)
    label_bottoms = (2,)

    def top_shapes(self, bottom_shapes):
        a, b, y = bottom_shapes
        for name, shape in zip(self.spec.bottoms, (a, b)):
            if not shape or len(shape) > 4 or math.prod(shape[2:]) != 1:
                raise ShapeError(f"bottom '{name}' has shape {shape}: the features of a pair must be (N, C) or "
                                 "(N, C, 1, 1) (Caffe checks that height and width are 1)")
        if a[0] != b[0] or math.prod(a) != math.prod(b):
            raise ShapeError(f"bottoms '{self.spec.bottoms[0]}' {a} and '{self.spec.bottoms[1]}' {b} must hold "
                             "the same number of pairs (first axis) with as many values each")
        if not y or len(y) > 4 or y[0] != a[0] or math.prod(y) != a[0]:
            raise ShapeError(f"similarity bottom '{self.spec.bottoms[2]}' has shape {y}: expected one label "
                             f"per pair ({a[0]}), shaped (N,) to (N, 1, 1, 1)")
        return [()]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        # a - b (kept for backward) and its rows' squared lengths in arrays kept from pass to pass
        shape = (bottom[0].shape[0], math.prod(bottom[0].shape[1:]))
        dtype = numpy.result_type(bottom[0].data.dtype, bottom[1].data.dtype)
        difference = getattr(self, "difference", None)
        if difference is None or difference.shape != shape or difference.dtype != dtype:
            self.difference = self.xp.empty(shape, dtype=dtype)
            self.dist_sq = self.xp.empty(shape[0], dtype=dtype)

    def forward(self, bottom, top):
        xp = self.xp
        p = self.block("contrastive_loss_param")
        n = bottom[0].shape[0]
        xp.subtract(bottom[0].data.reshape(self.difference.shape), bottom[1].data.reshape(self.difference.shape),
                    out=self.difference)
        if ROW_DOTS is not None and not self.backend.is_gpu:
            ROW_DOTS(self.difference, self.difference, out=self.dist_sq)  # a dot product a row: no squares array
        else:
            self.dist_sq = (self.difference * self.difference).sum(axis=1)
        self.similar = xp.trunc(bottom[2].data.reshape(n)) != 0
        if p.legacy_version:
            apart = xp.maximum(p.margin - self.dist_sq, 0)
        else:
            apart = xp.maximum(p.margin - xp.sqrt(self.dist_sq), 0) ** 2
        top[0].data[...] = xp.where(self.similar, self.dist_sq, apart).sum() / (2 * n)

    def backward(self, top, propagate_down, bottom):
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp = self.xp
        p = self.block("contrastive_loss_param")
        n = bottom[0].shape[0]
        if p.legacy_version:
            apart = xp.where(p.margin - self.dist_sq > 0, -1.0, 0.0)
        else:
            dist = xp.sqrt(self.dist_sq)
            within = (p.margin - dist > 0) & (dist > 0)  # at d = 0, a - b is 0: no direction, no gradient
            apart = xp.where(within, -(p.margin - dist) / xp.where(within, dist, 1), 0.0)
        coefficient = xp.where(self.similar, 1.0, apart).astype(self.dtype)[:, None] * (top[0].diff / n)
        for sign, blob, wanted in zip((1, -1), bottom, propagate_down):
            if wanted:  # (a blob's diff is C-contiguous: the reshape is a view of it)
                xp.multiply(sign * coefficient, self.difference, out=blob.diff.reshape(self.difference.shape))


@dataclass
class InfogainLossParams:
    """Parameters of InfogainLoss (Caffe's InfogainLossParameter)."""

    source: FilePath | None = doc(None, "the K x K matrix H as a .npy file (any shape of K*K values); "
                                        "not read when H is given as a third bottom")
    axis: int = doc(1, "axis of the prediction holding the K classes")


@register_layer
class InfogainLoss(Loss):
    """InfogainLoss: ``-sum_n sum_k H[label_n, k] log(max(p_nk, 1e-20)) / normalizer``, p the softmax.

    Bottoms: scores (N, K, ...) with the classes on ``infogain_loss_param.axis``,
    labels with one integer (stored as float) per position outside that axis,
    and optionally H (K*K values, row = true label).  Without a third bottom H
    is read from ``infogain_loss_param.source``, a .npy file (relative paths
    are read against the net file's folder); a Caffe .binaryproto must be
    converted to .npy first.  As in current Caffe the softmax is taken inside
    the layer: the scores are not probabilities.  Tops: the loss and
    optionally the probabilities.  ``loss_param``'s ``ignore_label`` and
    ``normalization`` (default VALID) act as in SoftmaxWithLoss; with H the
    identity the two layers agree.  The deprecated ``normalize`` is refused,
    as in Caffe.  Gradient, to the scores only:
    ``(p_nk sum_j H[label_n, j] - H[label_n, k]) * loss_weight / normalizer``.

    Example::

        - {name: loss, type: InfogainLoss, bottom: [fc8, label], top: loss,
           infogain_loss_param: {source: infogain_H.npy}}
    """

    type = "InfogainLoss"
    param_blocks = {"infogain_loss_param": InfogainLossParams, "loss_param": LossParams}
    num_bottoms = (2, 3)
    num_tops = (1, 2)
    label_bottoms = (1, 2)

    def view(self, shape) -> tuple[int, int, int]:
        """The scores as (outer, classes, inner) for ``infogain_loss_param.axis``."""
        axis = canonical_axis(self.block("infogain_loss_param").axis, len(shape), "infogain_loss_param.axis")
        return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])

    def source_matrix(self, classes: int) -> numpy.ndarray:
        """H from ``infogain_loss_param.source`` as a (classes, classes) float64 array, read once."""
        path = self.block("infogain_loss_param").source
        if path is None:
            raise ParamError("infogain_loss_param.source", "give the infogain matrix H: a .npy file here, "
                                                           "or a third bottom")
        if getattr(self, "source_h", None) is None:
            try:
                regular_file(path)
                with open(path, "rb") as file:
                    is_npy = file.read(6) == b"\x93NUMPY"
                if not is_npy:
                    raise DataError(f"{path}: not a .npy file (convert a Caffe .binaryproto to .npy first)")
                h = numpy.load(path, mmap_mode="r", allow_pickle=False)  # its shape first, then its values
            except DataError as exc:
                raise ParamError("infogain_loss_param.source", str(exc)) from None
            except (OSError, ValueError) as exc:
                raise ParamError("infogain_loss_param.source", f"{path}: cannot read: {exc}") from None
            if h.dtype.kind not in "uif":
                raise ParamError("infogain_loss_param.source", f"{path}: not an array of numbers ({h.dtype})")
            self.source_h = h
        if self.source_h.size != classes * classes:
            raise ShapeError(f"{path} holds H of shape {list(self.source_h.shape)}: the scores have {classes} "
                             f"classes, so H needs {classes} x {classes} values", "infogain_loss_param.source")
        self.source_h = numpy.array(self.source_h, dtype=numpy.float64)  # its values, read once
        return self.source_h.reshape(classes, classes)

    def top_shapes(self, bottom_shapes):
        if self.block("loss_param").normalize is not None:
            raise ParamError("loss_param.normalize", "InfogainLoss takes normalization, not the deprecated "
                                                     "normalize (Caffe refuses it too)")
        check_first_axes(self, bottom_shapes)
        outer, classes, inner = self.view(bottom_shapes[0])
        if math.prod(bottom_shapes[1]) != outer * inner:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"{outer * inner} labels (one per position of scores {bottom_shapes[0]} "
                             f"outside the class axis)")
        if len(bottom_shapes) == 3:
            if math.prod(bottom_shapes[2]) != classes * classes:
                raise ShapeError(f"infogain bottom '{self.spec.bottoms[2]}' has shape {bottom_shapes[2]}: the "
                                 f"scores have {classes} classes, so H needs {classes} x {classes} values")
        else:
            self.source_matrix(classes)
        return [()] + [bottom_shapes[0]] * (len(self.spec.tops) - 1)

    def setup(self, bottom, top, backend, dtype):
        super().setup(bottom, top, backend, dtype)
        if len(bottom) == 2:
            self.h = backend.asarray(self.source_matrix(self.view(bottom[0].shape)[1]), dtype=dtype)

    def forward(self, bottom, top):
        xp = self.xp
        outer, classes, inner = self.view(bottom[0].shape)
        h = bottom[2].data.reshape(classes, classes) if len(bottom) == 3 else self.h
        if not hasattr(self, "prob") or self.prob.shape != (outer, classes, inner):
            self.prob = xp.empty((outer, classes, inner), dtype=self.dtype)
        softmax(xp, bottom[0].data.reshape(outer, classes, inner), self.prob)
        self.labels, self.valid = class_labels(self, bottom[1].data.reshape(outer, 1, inner), classes,
                                               self.block("loss_param").ignore_label)
        self.rows = xp.moveaxis(h[self.labels[:, 0, :]], -1, 1)  # H[label_n] at each position, (outer, K, inner)
        self.row_sums = h.sum(axis=1)[self.labels]  # sum_j H[label_n, j], (outer, 1, inner)
        log_p = xp.log(xp.maximum(self.prob, LOG_THRESHOLD))
        self.norm = self.normalizer(outer, inner, self.valid)
        top[0].data[...] = -(self.rows * log_p * self.valid).sum() / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        grad = bottom[0].diff.reshape(self.prob.shape)
        self.xp.multiply(self.prob, self.row_sums, out=grad)
        grad -= self.rows
        grad *= self.valid
        grad *= top[0].diff / self.norm


@register_layer
class MultinomialLogisticLoss(Loss):
    """MultinomialLogisticLoss: ``-sum_n log(max(p[n, label_n], 1e-20)) / N``.

    Bottoms: probabilities p (N, K, ...), flattened to (N, K*...) as Caffe
    does, and labels (N values, integers stored as floats indexing that
    flattened row).  Top: the loss.  The probabilities come from elsewhere
    (a Softmax before it); SoftmaxWithLoss is the stable fused form.
    Gradient, to p only: ``-loss_weight / (N max(p[n, label_n], 1e-20))`` at
    each label, 0 elsewhere.

    Example::

        - {name: loss, type: MultinomialLogisticLoss, bottom: [prob, label], top: loss}
    """

    type = "MultinomialLogisticLoss"

    def top_shapes(self, bottom_shapes):
        check_first_axes(self, bottom_shapes)
        if math.prod(bottom_shapes[1]) != bottom_shapes[0][0]:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"one label per instance of '{self.spec.bottoms[0]}' {bottom_shapes[0]}")
        return [()]

    def forward(self, bottom, top):
        xp = self.xp
        n = bottom[0].shape[0]
        p = bottom[0].data.reshape(n, -1)
        self.labels, _ = class_labels(self, bottom[1].data.reshape(n, 1), p.shape[1])
        self.picked = xp.maximum(xp.take_along_axis(p, self.labels, axis=1), LOG_THRESHOLD)
        top[0].data[...] = -xp.log(self.picked).sum() / n

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        n = bottom[0].shape[0]
        grad = bottom[0].diff.reshape(n, -1)
        grad[...] = 0
        xp.put_along_axis(grad, self.labels, -(top[0].diff / n) / self.picked, axis=1)
