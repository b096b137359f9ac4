"""RMSProp (Tieleman and Hinton), in Caffe's formulation."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class RMSProp(UpdateRule):
    """RMSProp: the rate is divided by a running root-mean-square of the gradient.

    ``h = rms_decay * h + (1 - rms_decay) * g^2``, then ``w = w - rate * g / (sqrt(h) + delta)``.
    Hyper-parameters: ``base_lr``, ``rms_decay`` (0.99), ``delta``; ``momentum`` must be 0.
    """

    type = "RMSProp"
    step_hyper = ("rms_decay", "delta")
    step_kernel = ("history = history * (T)rms_decay + (T)(1.0 - rms_decay) * g * g; "
                   "step = g * (rate / (sqrt(history) + (T)delta));")
    takes_momentum = False

    def compute_update(self, index, diff, rate):
        (history,) = self.history[index]
        decay = self.params.rms_decay
        history *= decay
        history += (1.0 - decay) * diff * diff
        diff *= rate / (history ** 0.5 + self.params.delta)
