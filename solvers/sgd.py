"""SGD with momentum, in Caffe's formulation (the learning rate lives inside the history)."""

from __future__ import annotations

from netspec.engine.registry import register_solver
from netspec.engine.update_rule import UpdateRule


@register_solver
class SGD(UpdateRule):
    """SGD: stochastic gradient descent with momentum.

    ``h = momentum * h + rate * g``, then ``w = w - h``, where ``g`` is the
    gradient after clipping, ``iter_size`` averaging and weight decay, and
    ``rate`` is the policy's learning rate times the blob's ``lr_mult``.  As in
    Caffe the rate is inside the history, so changing it changes only the new
    contributions.  Hyper-parameters: ``base_lr``, ``momentum`` (0: plain SGD).
    """

    type = "SGD"
    step_hyper = ("momentum",)
    step_kernel = ("history = history * (T)momentum + rate * g; step = history;")

    def compute_update(self, index, diff, rate):
        (history,) = self.history[index]
        history *= self.params.momentum
        history += rate * diff
        diff[...] = history
