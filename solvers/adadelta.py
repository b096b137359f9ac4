"""AdaDelta (Zeiler), in Caffe's formulation."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class AdaDelta(UpdateRule):
    """AdaDelta: steps scaled by the ratio of running RMS of past steps to running RMS of gradients.

    With ``m = momentum`` as the decay:
    ``a = m * a + (1 - m) * g^2``; ``u = g * sqrt((b + delta) / (a + delta))``;
    ``b = m * b + (1 - m) * u^2``; ``w = w - rate * u``.  Caffe keeps ``base_lr``
    (usually 1.0) as a final scale.  Hyper-parameters: ``base_lr``, ``momentum``, ``delta``.
    """

    type = "AdaDelta"
    history_names = ("gradient_square", "update_square")
    step_hyper = ("momentum", "delta")
    step_kernel = ("gradient_square = gradient_square * (T)momentum + (T)(1.0 - momentum) * g * g; "
                   "step = g * sqrt((update_square + (T)delta) / (gradient_square + (T)delta)); "
                   "update_square = update_square * (T)momentum + (T)(1.0 - momentum) * step * step; step *= rate;")

    def compute_update(self, index, diff, rate):
        gradients, updates = self.history[index]
        m, delta = self.params.momentum, self.params.delta
        gradients *= m
        gradients += (1.0 - m) * diff * diff
        diff *= ((updates + delta) / (gradients + delta)) ** 0.5
        updates *= m
        updates += (1.0 - m) * diff * diff
        diff *= rate
