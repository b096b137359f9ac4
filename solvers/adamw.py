"""AdamW: Adam with decoupled weight decay (Loshchilov and Hutter)."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.solvers.adam import Adam


@register_solver
class AdamW(Adam):
    """AdamW: Adam whose weight decay acts on the weights, not through the gradient's moments.

    The moments ``m`` and ``v`` see the gradient ``g`` alone, and the decay is
    added to the step with the same rate (as PyTorch's AdamW does), with
    ``d = weight_decay * decay_mult``:
    ``m = b1 * m + (1 - b1) * g``; ``v = b2 * v + (1 - b2) * g^2``;
    ``w = w - rate * (sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + delta) + d * w)``
    (``d * sign(w)`` with regularization_type L1).  Hyper-parameters: those of
    Adam, and ``weight_decay`` (0.01 to 0.1 usual, larger than for Adam).
    """

    type = "AdamW"
    decoupled_decay = True
