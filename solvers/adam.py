"""Adam (Kingma and Ba), in Caffe's formulation."""

from __future__ import annotations

import math

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class Adam(UpdateRule):
    """Adam: steps from running means of the gradient and of its square.

    With ``b1 = momentum``, ``b2 = momentum2`` and ``t = iteration + 1``:
    ``m = b1 * m + (1 - b1) * g``; ``v = b2 * v + (1 - b2) * g^2``;
    ``w = w - rate * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + delta)``.
    As in Caffe the bias correction is applied to the rate and ``delta`` is not
    corrected.  Hyper-parameters: ``base_lr``, ``momentum`` (0.9 usual),
    ``momentum2`` (0.999), ``delta`` (1e-8).
    """

    type = "Adam"
    history_names = ("mean", "mean_square")
    step_hyper = ("momentum", "momentum2", "delta")
    step_kernel = ("mean = mean * (T)momentum + (T)(1.0 - momentum) * g; "
                   "mean_square = mean_square * (T)momentum2 + (T)(1.0 - momentum2) * g * g; "
                   "step = rate * mean / (sqrt(mean_square) + (T)delta);")

    @classmethod
    def check(cls, params) -> list[tuple[str, str]]:
        """Both decays below 1 (at 1 the bias correction divides by zero; above, it takes a negative root)."""
        problems = super().check(params)
        for key in ("momentum", "momentum2"):
            if getattr(params, key) >= 1:
                problems.append((key, f"{cls.type} needs {key} below 1, got {getattr(params, key)}"))
        if params.momentum2 < 0:
            problems.append(("momentum2", f"must not be negative, got {params.momentum2}"))
        return problems

    def rate_factor(self, iteration):
        """The bias correction ``sqrt(1 - b2^t) / (1 - b1^t)``."""
        b1, b2, t = self.params.momentum, self.params.momentum2, iteration + 1
        return math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)

    def compute_update(self, index, diff, rate):
        mean, square = self.history[index]
        b1, b2 = self.params.momentum, self.params.momentum2
        mean *= b1
        mean += (1.0 - b1) * diff
        square *= b2
        square += (1.0 - b2) * diff * diff
        diff[...] = rate * mean / (square ** 0.5 + self.params.delta)
