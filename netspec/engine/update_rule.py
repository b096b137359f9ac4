"""The contract of an update rule (SGD and its relatives), shared by the training loop.

The loop in :mod:`netspec.training.solver` does everything that is common to every
rule, in Caffe's order: learning rate from the policy, global-norm clipping,
division by ``iter_size``, weight decay (added to the gradient, or for rules
with ``decoupled_decay`` to the rule's step, times the rate), then the rule,
then ``w -= diff``.
A rule only turns a regularised gradient into the step to subtract, using
the history buffers it declares; the buffers are saved in the solver state
(blob by blob) so that a resumed run continues bit-identically.  What changes
from one iteration to the next (the rate, Adam's bias correction through
:meth:`UpdateRule.rate_factor`) reaches the rule as a value in device memory.

A rule is applied once per learnable blob, or, on a GPU where the rule is
``elementwise`` (each element's step depends on that element's gradient and
history alone: every built-in rule), once per group of blobs sharing
``lr_mult`` and ``decay_mult``, on the group's flat arrays
(:meth:`netspec.Net.learnable_groups`): a few kernels a step however many
blobs the net has.  A rule that needs a whole blob (a per-layer norm, as in
LARS) sets ``elementwise = False``.

On a GPU an element-wise rule may also give its step as CUDA statements
(``step_kernel``: set ``T step`` from the regularised gradient ``g``, the
rate ``rate``, the hyper-parameters named in ``step_hyper`` and its history
buffers by their ``history_names``, updating those; the names ``diff``,
``data``, ``reg``, ``scale``, ``decay``, ``l1``, ``scalars``, ``rate_at`` and
``decay_at`` are the kernel's own): each group's whole update (the
``iter_size`` average, the decay, the rule's step, the decoupled decay,
``w -= step``) is then one kernel instead of several, and
:meth:`UpdateRule.compute_update` is not called there
(:func:`netspec.engine.kernels.update`).  Every built-in rule gives one; a
subclass that overrides ``compute_update`` gives its own or runs its array
code.  ``compute_update`` stays the rule's definition, which the CPU runs, and
the kernel must compute the same values (to the last bits: the GPU's compiler
fuses a product and a sum into one rounding where it can).
"""

from __future__ import annotations

import abc
from typing import ClassVar


class UpdateRule(abc.ABC):
    """Base class of every update rule; subclasses are registered with ``register_solver``."""

    type: ClassVar[str] = ""
    history_names: ClassVar[tuple[str, ...]] = ("history",)
    takes_momentum: ClassVar[bool] = True
    decoupled_decay: ClassVar[bool] = False
    elementwise: ClassVar[bool] = True
    step_kernel: ClassVar[str] = ""
    step_hyper: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        """A subclass that computes its update anew (its own :meth:`compute_update`) without a ``step_kernel`` of
        its own does not inherit its parent's: the GPU then runs its array code, not the parent's step."""
        super().__init_subclass__(**kwargs)
        if "compute_update" in vars(cls) and "step_kernel" not in vars(cls):
            cls.step_kernel, cls.step_hyper = "", ()

    def __init__(self, params, shapes, xp, dtype):
        """``params``: the SolverParams; ``shapes``: of the arrays :meth:`compute_update` is given, by index (one
        per learnable blob in the net's order, or one per group's flat arrays)."""
        self.params = params
        self.history = [[xp.zeros(shape, dtype=dtype) for _ in self.history_names] for shape in shapes]

    @classmethod
    def check(cls, params) -> list[tuple[str, str]]:
        """``(key, message)`` for each hyper-parameter this rule cannot accept."""
        if params.momentum and not cls.takes_momentum:
            return [("momentum", f"{cls.type} takes no momentum; remove it or set it to 0")]
        return []

    def rate_factor(self, iteration: int) -> float:
        """What the rule multiplies the learning rate by at ``iteration`` (from 0): 1, or Adam's bias correction."""
        return 1.0

    @abc.abstractmethod
    def compute_update(self, index: int, diff, rate) -> None:
        """Overwrite ``diff`` (the regularised gradient of group or blob ``index``) with the step to subtract.

        ``rate`` is the learning rate times the ``lr_mult`` and the
        :meth:`rate_factor`, a value on the device (0-d, the arrays' dtype)
        written before each update: the operations of a step are the same at
        every iteration, as a captured CUDA graph needs.  Every rule must
        implement it.
        """
