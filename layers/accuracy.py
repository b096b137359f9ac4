"""Accuracy: the fraction of positions whose label is among the top-k scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.losses import class_labels
from netspec.layers.softmax import softmax_view
from netspec.spec.schema import doc


@dataclass
class AccuracyParams:
    """Parameters of Accuracy."""

    top_k: int = doc(1, "a position counts as right when its label is among the k highest scores")
    axis: int = doc(1, "axis holding the classes")
    ignore_label: int | None = doc(None, "positions with this label are not counted")


@register_layer
class Accuracy(Layer):
    """Accuracy: fraction of non-ignored positions whose label scores among the ``top_k`` best.

    Caffe's rule: a label counts as in the top k when fewer than k other
    classes score at least as high (``>=``), so a tie counts against it: a
    net whose classes all score the same is right nowhere (but with top_k
    equal to the class count).  A label whose own score is NaN counts as
    right, as in Caffe (no score is ``>=`` NaN).  Bottoms: scores (N, K, ...)
    with classes on ``axis``, labels (one per position).  Tops: the accuracy
    (a scalar; 0 when every label is ignored) and optionally per-class
    accuracies (K,; 0 for a class no label names).  With that second top the
    layer also keeps the batch's ``class_hits`` and ``class_counts`` (K,), so
    that a test pass can give each class's accuracy over all its records
    (training's metrics do).  No gradient; usually TEST only.

    Example::

        - name: accuracy
          type: Accuracy
          bottom: [ip2, label]
          top: accuracy
          include: {phase: TEST}
    """

    type = "Accuracy"
    param_blocks = {"accuracy_param": AccuracyParams}
    num_bottoms = (2, 2)
    num_tops = (1, 2)
    label_bottoms = (0, 1)

    def view(self, shape):
        """(outer, classes, inner) for the scores."""
        return softmax_view(shape, self.block("accuracy_param").axis)

    def top_shapes(self, bottom_shapes):
        outer, classes, inner = self.view(bottom_shapes[0])
        k = self.block("accuracy_param").top_k
        if not 1 <= k <= classes:
            raise ParamError("accuracy_param.top_k", f"must be between 1 and the {classes} classes, got {k}")
        if math.prod(bottom_shapes[1]) != outer * inner:
            raise ShapeError(f"label bottom '{self.spec.bottoms[1]}' has shape {bottom_shapes[1]}: expected "
                             f"{outer * inner} labels for scores {bottom_shapes[0]}")
        return [()] + [(classes,)] * (len(self.spec.tops) - 1)

    def forward(self, bottom, top):
        xp = self.xp
        p = self.block("accuracy_param")
        outer, classes, inner = self.view(bottom[0].shape)
        scores = bottom[0].data.reshape(outer, classes, inner)
        safe, valid = class_labels(self, bottom[1].data.reshape(outer, 1, inner), classes, p.ignore_label)
        label_scores = xp.take_along_axis(scores, safe, axis=1)
        at_least = (scores >= label_scores).sum(axis=1, keepdims=True)  # (the label's own class among them)
        correct = (at_least <= p.top_k) & valid
        self.averaged_over = valid.sum()
        top[0].data[...] = correct.sum() / xp.maximum(self.averaged_over, 1)  # (on the device: no wait for it)
        if len(top) > 1:
            labelled = (safe == xp.arange(classes).reshape(1, classes, 1)) & valid  # (one-hot: sizes never read)
            self.class_counts = labelled.sum(axis=(0, 2))
            self.class_hits = (labelled & correct).sum(axis=(0, 2))
            top[1].data[...] = xp.where(self.class_counts > 0, self.class_hits / xp.maximum(self.class_counts, 1), 0)

    def backward(self, top, propagate_down, bottom):
        pass
