"""Dropout: random zeroing in TRAIN with inverted scaling, identity in TEST."""

from __future__ import annotations

from dataclasses import dataclass

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.spec.schema import doc


@dataclass
class DropoutParams:
    """Parameters of Dropout."""

    dropout_ratio: float = doc(0.5, "probability of zeroing each value")


@register_layer
class Dropout(Layer):
    """Dropout: in TRAIN ``y = x * m / (1 - p)`` with ``m ~ Bernoulli(1 - p)``; in TEST ``y = x``.

    Bottom/top: any shape.  Runs in place.

    Example::

        - {name: drop6, type: Dropout, bottom: fc6, top: fc6, dropout_param: {dropout_ratio: 0.5}}
    """

    type = "Dropout"
    param_blocks = {"dropout_param": DropoutParams}
    inplace_ok = True

    def top_shapes(self, bottom_shapes):
        ratio = self.block("dropout_param").dropout_ratio
        if not 0 <= ratio < 1:
            raise ParamError("dropout_param.dropout_ratio", f"must be in [0, 1), got {ratio}")
        return [bottom_shapes[0]]

    @property
    def records(self) -> bool:
        return self.phase != "TRAIN" and self.spec.tops == self.spec.bottoms  # (nothing to run: in place, y = x)

    def forward(self, bottom, top):
        if self.phase != "TRAIN":
            if top[0] is not bottom[0]:
                top[0].data[...] = bottom[0].data
            return
        ratio = self.block("dropout_param").dropout_ratio
        self.keep = self.backend.random_at_least(bottom[0].shape, ratio, self.dtype, self.name)
        self._masked(bottom[0].data, top[0].data)

    def _masked(self, values, out) -> None:
        """``out = values * keep / (1 - ratio)`` with this pass's mask (``keep``, booleans)."""
        self.xp.multiply(values, self.keep, out=out)
        out *= self.dtype.type(1.0 / (1.0 - self.block("dropout_param").dropout_ratio))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.phase == "TRAIN":
            self._masked(top[0].diff, bottom[0].diff)
        elif top[0] is not bottom[0]:
            bottom[0].diff[...] = top[0].diff
