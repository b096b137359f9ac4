"""The update of one run, in Caffe's order: clip, normalise, regularise, the rule's step, apply.

An :class:`Optimizer` owns the update rule (``solvers/``), the pipeline
around it, and its state (the rule's history buffers): the loop only calls
:meth:`Optimizer.step` once per iteration, and snapshots hold what
:meth:`Optimizer.state` returns.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy

from netspec.engine import kernels
from netspec.engine.buffers import flat_view
from netspec.engine.net import LearnableParam
from netspec.errors import StateError, TrainingError


class Segment(NamedTuple):
    """What one call of the rule updates: the flat arrays of a group of blobs that share multipliers, or, for a
    rule that is not element-wise, one blob's."""

    data: object
    diff: object
    lr_mult: float
    decay_mult: float


class Optimizer:
    """Updates the learnable blobs of a net (``Net.learnable_groups()``) with one update rule.

    ``params`` are the solver's (clip_gradients, iter_size, weight decay,
    regularization_type and the rule's own); ``rule_cls`` is the registered
    update rule; ``backend`` and ``dtype`` are the net's.

    ``fused`` (by default on a GPU, for an element-wise rule) runs the
    update once per group, on its flat arrays: a few kernels a step however
    many blobs the net has.  Otherwise it runs once per blob, on views of
    the same arrays: on a CPU each blob's arrays then stay in the cache
    (a ResNet-50 step: 55 ms blob by blob, 86 ms by group).
    """

    def __init__(self, rule_cls, params, groups, backend, dtype, fused: bool | None = None):
        self.params = params
        self.backend = backend
        self.fused = backend.is_gpu and rule_cls.elementwise if fused is None else fused
        if self.fused and not rule_cls.elementwise:
            raise ValueError(f"{rule_cls.type} is not element-wise: it cannot update a group of blobs at once")
        self.places: list[tuple[LearnableParam, int, int]] = []  # each blob, its segment and its offset there
        self.segments: list[Segment] = []
        for group in groups:
            if self.fused:
                self.places += [(param, len(self.segments), offset) for param, offset in group.members]
                self.segments.append(Segment(group.data, group.diff, group.lr_mult, group.decay_mult))
                continue
            for param, _ in group.members:
                self.places.append((param, len(self.segments), 0))
                self.segments.append(Segment(param.blob.data, param.blob.diff, param.lr_mult, param.decay_mult))
        self.bound = [(param, param.blob.data, param.blob.diff) for param, _, _ in self.places]
        self.rule = rule_cls(params, [segment.data.shape for segment in self.segments], backend.xp, dtype)
        # each segment's rate for the rule, then its decoupled decay's: written before each step, read on the device
        self.scalars = backend.xp.zeros(2 * len(self.segments), dtype=dtype)
        self.dtype = dtype

    def step(self, rate: float, iteration: int, measure: bool = False) -> list[tuple[str, float, float]]:
        """Clip, normalise, regularise and apply the rule's step to every learnable blob.

        ``rate`` is the policy's learning rate at ``iteration``.  With
        ``measure``, return ``(layer[index], mean |w|, ||step|| / ||w||)`` for each blob.
        """
        self.set_rates(rate, iteration)
        return self.apply(measure)

    def set_rates(self, rate: float, iteration: int) -> None:
        """Write the step's rates (the policy's ``rate`` at ``iteration`` times each group's multipliers, and the
        rule's factor) where :meth:`apply` reads them on the device: the first half of :meth:`step`, on the host
        (a captured graph's launch makes the second)."""
        self._check_bound()
        p = self.params
        factor = self.rule.rate_factor(iteration)
        rates = [rate * segment.lr_mult * factor for segment in self.segments]
        decays = [rate * segment.lr_mult * p.weight_decay * segment.decay_mult for segment in self.segments]
        self.backend.upload(numpy.array(rates + decays, dtype=self.dtype), self.scalars)

    def apply(self, measure: bool = False) -> list[tuple[str, float, float]]:
        """The second half of :meth:`step`, on the device alone: clip, normalise, regularise and apply the rule's
        step with the rates :meth:`set_rates` wrote (the same operations at every step)."""
        p = self.params
        if p.clip_gradients >= 0:
            self._clip(p.clip_gradients)
        decoupled = self.rule.decoupled_decay
        count = len(self.segments)
        ratios = []
        one_kernel = bool(self.rule.step_kernel) and kernels.compiled(self.backend.xp)
        for index, segment in enumerate(self.segments):
            diff, data = segment.diff, segment.data
            decay = p.weight_decay * segment.decay_mult
            if one_kernel:
                self._update_in_one_kernel(index, diff, data, decay)
            else:
                if p.iter_size > 1:
                    diff *= 1.0 / p.iter_size
                if decay and not decoupled:
                    diff += decay * self._regularizer(data)
                self.rule.compute_update(index, diff, self.scalars[index:index + 1].reshape(()))
                if decay and decoupled:
                    diff += self.scalars[count + index:count + index + 1].reshape(()) * self._regularizer(data)
                data -= diff
            if measure:
                ratios += [self._ratio(param) for param, place, _ in self.places if place == index]
        return ratios

    def _update_in_one_kernel(self, index: int, diff, data, decay: float) -> None:
        """What :meth:`apply` does to segment ``index`` (``decay``: its weight decay), as one kernel (a rule's
        ``step_kernel``, on a GPU)."""
        p, rule = self.params, self.rule
        decay_at = len(self.segments) + index if decay and rule.decoupled_decay else None  # (its rate in scalars)
        kernels.update(rule.type, rule.step_kernel, dict(zip(rule.history_names, rule.history[index])),
                       diff, data, self.scalars, index, decay_at, 1.0 / p.iter_size,
                       0.0 if rule.decoupled_decay else decay, p.regularization_type == "L1",
                       {name: getattr(p, name) for name in rule.step_hyper})

    def _check_bound(self) -> None:
        """Raise TrainingError when a layer has given a learnable blob other arrays than those the update
        writes (they would never train)."""
        for param, data, diff in self.bound:
            if param.blob.data is not data or param.blob.diff is not diff:
                raise TrainingError(f"layer '{param.layer}' replaced the arrays of its learnable blob {param.index}, "
                                    "so the update would no longer reach it: a layer writes into blob.data and "
                                    "blob.diff (blob.data[...] = ...), never assigns them")

    def _ratio(self, param: LearnableParam) -> tuple[str, float, float]:
        """``(layer[index], mean |w|, ||step|| / ||w||)`` of a blob whose diff holds the step just subtracted from
        its data (``w``: the weights before it)."""
        xp, data = self.backend.xp, param.blob.data + param.blob.diff
        weight_norm = float(xp.linalg.norm(data))
        ratio = float(xp.linalg.norm(param.blob.diff)) / weight_norm if weight_norm else math.inf
        return f"{param.layer}[{param.index}]", float(xp.abs(data).mean()), ratio

    def _clip(self, limit: float) -> None:
        """Scale the diffs so that their global L2 norm is at most ``limit``, computed on the device (a GPU is not
        waited for): the scale is 1 when the norm is within the limit."""
        xp = self.backend.xp
        norm = xp.sqrt(sum((xp.vdot(segment.diff, segment.diff).astype(numpy.float64) for segment in self.segments),
                           xp.zeros((), numpy.float64)))
        scale = xp.where(norm > limit, limit / xp.maximum(norm, numpy.finfo(numpy.float64).tiny), 1.0)
        for diff in (segment.diff for segment in self.segments):
            diff *= scale.astype(diff.dtype)

    def _regularizer(self, data):
        """The decay's direction: ``w`` for L2, ``sign(w)`` for L1."""
        return data if self.params.regularization_type == "L2" else self.backend.xp.sign(data)

    def history_of(self, param: LearnableParam, segment: int, offset: int) -> list:
        """Views of the rule's history buffers over one blob (its shape)."""
        return [flat_view(buffer, offset, param.blob.shape) for buffer in self.rule.history[segment]]

    def state(self) -> dict[str, dict[int, dict]]:
        """The rule's history on the host: ``{layer: {blob index: {buffer name: array}}}``."""
        history: dict[str, dict[int, dict]] = {}
        for param, segment, offset in self.places:
            history.setdefault(param.layer, {})[param.index] = {
                name: self.backend.to_host(view)
                for name, view in zip(self.rule.history_names, self.history_of(param, segment, offset))}
        return history

    def history_shapes(self) -> dict[str, dict[int, tuple]]:
        """``{layer: {blob index: shape}}`` of every learnable blob, the shape of each of its history buffers."""
        shapes: dict[str, dict[int, tuple]] = {}
        for param, _, _ in self.places:
            shapes.setdefault(param.layer, {})[param.index] = tuple(param.blob.shape)
        return shapes

    def load_state(self, history: dict, path: str) -> None:
        """Take back what :meth:`state` returned (read from the solver state ``path``, named in errors).

        The buffers' shapes are the net's: :func:`netspec.training.solver_state.read_history` checked them.
        """
        for param, segment, offset in self.places:
            saved = history.get(param.layer, {}).get(param.index)
            if saved is None or any(name not in saved for name in self.rule.history_names):
                raise StateError(f"{path}: no update history for layer '{param.layer}' blob {param.index}")
            for name, view in zip(self.rule.history_names, self.history_of(param, segment, offset)):
                view[...] = self.backend.asarray(saved[name], dtype=view.dtype)
