"""The update of one run, in Caffe's order: clip, normalise, regularise, the rule's step, apply.

An :class:`Optimizer` owns the update rule (``solvers/``), the pipeline
around it, and its state (the rule's history buffers): the loop only calls
:meth:`Optimizer.step` once per iteration, and snapshots hold what
:meth:`Optimizer.state` returns.
"""

from __future__ import annotations

import math

import numpy

from netspec.errors import StateError


class Optimizer:
    """Updates the learnable blobs of a net (``Net.learnable_params()``) with one update rule.

    ``params`` are the solver's (clip_gradients, iter_size, weight_decay,
    regularization_type and the rule's own); ``rule_cls`` is the registered
    update rule; ``backend`` and ``dtype`` are the net's.
    """

    def __init__(self, rule_cls, params, learnable, backend, dtype):
        self.params = params
        self.learnable = learnable
        self.backend = backend
        self.rule = rule_cls(params, [lp.blob.shape for lp in learnable], backend.xp, dtype)

    def step(self, rate: float, iteration: int, measure: bool = False) -> list[tuple[str, float, float]]:
        """Clip, normalise, regularise and apply the rule's step to every learnable blob.

        ``rate`` is the policy's learning rate at ``iteration``.  With
        ``measure``, return ``(layer[index], mean |w|, ||step|| / ||w||)`` for each blob.
        """
        p, xp = self.params, self.backend.xp
        if p.clip_gradients >= 0:
            self._clip(p.clip_gradients)
        decoupled = self.rule.decoupled_decay
        ratios = []
        for index, lp in enumerate(self.learnable):
            diff, data = lp.blob.diff, lp.blob.data
            if p.iter_size > 1:
                diff *= 1.0 / p.iter_size
            decay = p.weight_decay * lp.decay_mult
            if decay and not decoupled:
                diff += decay * self._regularizer(data)
            self.rule.compute_update(index, diff, rate * lp.lr_mult, iteration)
            if decay and decoupled:
                diff += (rate * lp.lr_mult * decay) * self._regularizer(data)
            if measure:
                weight_norm = float(xp.linalg.norm(data))
                ratio = float(xp.linalg.norm(diff)) / weight_norm if weight_norm else math.inf
                ratios.append((f"{lp.layer}[{lp.index}]", float(xp.abs(data).mean()), ratio))
            data -= diff
        return ratios

    def _clip(self, limit: float) -> None:
        """Scale the diffs so that their global L2 norm is at most ``limit``, computed on the device (a GPU is not
        waited for): the scale is 1 when the norm is within the limit."""
        xp = self.backend.xp
        norm = xp.sqrt(sum((xp.vdot(lp.blob.diff, lp.blob.diff).astype(numpy.float64) for lp in self.learnable),
                           xp.zeros((), numpy.float64)))
        scale = xp.where(norm > limit, limit / xp.maximum(norm, numpy.finfo(numpy.float64).tiny), 1.0)
        for lp in self.learnable:
            lp.blob.diff *= scale.astype(lp.blob.diff.dtype)

    def _regularizer(self, data):
        """The decay's direction: ``w`` for L2, ``sign(w)`` for L1."""
        return data if self.params.regularization_type == "L2" else self.backend.xp.sign(data)

    def state(self) -> dict[str, dict[int, dict]]:
        """The rule's history on the host: ``{layer: {blob index: {buffer name: array}}}``."""
        history: dict[str, dict[int, dict]] = {}
        for lp, buffers in zip(self.learnable, self.rule.history):
            history.setdefault(lp.layer, {})[lp.index] = {
                name: self.backend.to_host(buffer) for name, buffer in zip(self.rule.history_names, buffers)}
        return history

    def history_shapes(self) -> dict[str, dict[int, tuple]]:
        """``{layer: {blob index: shape}}`` of every learnable blob, the shape of each of its history buffers."""
        shapes: dict[str, dict[int, tuple]] = {}
        for lp in self.learnable:
            shapes.setdefault(lp.layer, {})[lp.index] = tuple(lp.blob.shape)
        return shapes

    def load_state(self, history: dict, path: str) -> None:
        """Take back what :meth:`state` returned (read from the solver state ``path``, named in errors).

        The buffers' shapes are the net's: :func:`netspec.training.solver_state.read_history` checked them.
        """
        for lp, buffers in zip(self.learnable, self.rule.history):
            saved = history.get(lp.layer, {}).get(lp.index)
            if saved is None or any(name not in saved for name in self.rule.history_names):
                raise StateError(f"{path}: no update history for layer '{lp.layer}' blob {lp.index}")
            for name, buffer in zip(self.rule.history_names, buffers):
                buffer[...] = self.backend.asarray(saved[name], dtype=buffer.dtype)
