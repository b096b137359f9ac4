"""Following one test output across test passes: its best value, and how long since it improved.

``snapshot_best`` and ``early_stop`` each keep an :class:`OutputWatch`; its
state travels in the solver state, so a resumed run remembers the best value.
"""

from __future__ import annotations

import math

from netspec.errors import did_you_mean
from netspec.training.log import format_value


def watches(params) -> tuple[OutputWatch | None, OutputWatch | None]:
    """The watches a solver's ``snapshot_best`` and ``early_stop`` ask for (None where not asked)."""
    best = plateau = None
    if params.snapshot_best:
        best = OutputWatch(params.snapshot_best.output, params.snapshot_best.mode, params.snapshot_best.test_net)
    if params.early_stop:
        e = params.early_stop
        plateau = OutputWatch(e.output, e.mode, e.test_net, e.min_delta)
    return best, plateau


def unwatchable_outputs(params, test_nets) -> list[tuple[str, str]]:
    """``(key, message)`` for each of ``snapshot_best``/``early_stop`` not naming a one-value test net output."""
    problems = []
    for key in ("snapshot_best", "early_stop"):
        watch = getattr(params, key)
        if watch is None:
            continue
        net = test_nets[watch.test_net]
        scalars = [name for name in net.outputs if net.blobs[name].count == 1]
        if watch.output not in scalars:
            problems.append((key, f"test net {watch.test_net} has no one-value output '{watch.output}'"
                                  f"{did_you_mean(watch.output, scalars)} (it has: {', '.join(scalars) or 'none'})"))
    return problems


class OutputWatch:
    """The best value of test net ``test_net``'s ``output`` under ``mode`` (max or min).

    A value improves on the best when it is better by more than ``min_delta``;
    ``stale`` counts the test passes since the last improvement.  A pass at
    an iteration already counted (a resumed run testing again where its
    state was written) changes nothing.
    """

    def __init__(self, output: str, mode: str, test_net: int = 0, min_delta: float = 0.0):
        self.output, self.mode, self.test_net, self.min_delta = output, mode, test_net, min_delta
        self.best: float | None = None
        self.best_iter: int | None = None
        self.stale = 0
        self.last_iter: int | None = None  # the iteration of the last pass counted

    def improves(self, value: float) -> bool:
        """True when ``value`` beats the best so far by more than ``min_delta`` (the first finite value does)."""
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if self.mode == "max" else self.best - value
        return gain > self.min_delta

    def update(self, iteration: int, results: dict[int, dict[str, float]]) -> bool:
        """Take one test pass's results (``{test net: {output: value}}``); True when the value improved."""
        if self.last_iter is not None and iteration <= self.last_iter:
            return False
        self.last_iter = iteration
        value = results[self.test_net][self.output]
        if self.improves(value):
            self.best, self.best_iter, self.stale = value, iteration, 0
            return True
        self.stale += 1
        return False

    def plateau_message(self, iteration: int) -> str:
        """Why training stops early at ``iteration``: no improvement in ``stale`` test passes."""
        best = f"{format_value(self.best)} at iteration {self.best_iter}" if self.best is not None else "none"
        return (f"early stop at iteration {iteration}: test {self.output} has not improved by more than "
                f"{format_value(self.min_delta)} in {self.stale} test passes (best {best})")

    def state(self) -> dict:
        """What a resumed run needs (JSON-ready)."""
        return {"best": self.best, "best_iter": self.best_iter, "stale": self.stale, "last_iter": self.last_iter}

    def restore(self, state: dict) -> None:
        """Take back what :meth:`state` returned (``last_iter`` None from states written before it was kept)."""
        self.best, self.best_iter, self.stale = state["best"], state["best_iter"], int(state["stale"])
        self.last_iter = None if state.get("last_iter") is None else int(state["last_iter"])
