"""Nesterov's accelerated gradient, in Caffe's formulation."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class Nesterov(UpdateRule):
    """Nesterov: momentum with a look-ahead correction.

    ``h' = momentum * h + rate * g``, then ``w = w - ((1 + momentum) * h' - momentum * h)``.
    Hyper-parameters: ``base_lr``, ``momentum``.
    """

    type = "Nesterov"
    step_hyper = ("momentum",)
    step_kernel = ("const T previous = history; history = history * (T)momentum + rate * g; "
                   "step = (T)(1.0 + momentum) * history - (T)momentum * previous;")

    def compute_update(self, index, diff, rate):
        (history,) = self.history[index]
        momentum = self.params.momentum
        previous = history.copy()
        history *= momentum
        history += rate * diff
        diff[...] = (1.0 + momentum) * history - momentum * previous
