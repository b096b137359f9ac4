"""AdaGrad (Duchi et al.), in Caffe's formulation."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class AdaGrad(UpdateRule):
    """AdaGrad: each weight's rate shrinks with its accumulated squared gradient.

    ``h = h + g^2``, then ``w = w - rate * g / (sqrt(h) + delta)``.
    Hyper-parameters: ``base_lr``, ``delta``; ``momentum`` must be 0.
    """

    type = "AdaGrad"
    step_hyper = ("delta",)
    step_kernel = ("history += g * g; step = g * (rate / (sqrt(history) + (T)delta));")
    takes_momentum = False

    def compute_update(self, index, diff, rate):
        (history,) = self.history[index]
        history += diff * diff
        diff *= rate / (history ** 0.5 + self.params.delta)
