"""Following one test output across test passes: its best value, and how long since it improved.

``snapshot_best`` and ``early_stop`` each keep an :class:`OutputWatch`; its
state travels in the solver state, so a resumed run remembers the best value.
"""

from __future__ import annotations

import math


class OutputWatch:
    """The best value of test net ``test_net``'s ``output`` under ``mode`` (max or min).

    A value improves on the best when it is better by more than ``min_delta``;
    ``stale`` counts the test passes since the last improvement.
    """

    def __init__(self, output: str, mode: str, test_net: int = 0, min_delta: float = 0.0):
        self.output, self.mode, self.test_net, self.min_delta = output, mode, test_net, min_delta
        self.best: float | None = None
        self.best_iter: int | None = None
        self.stale = 0

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
        value = results[self.test_net][self.output]
        if self.improves(value):
            self.best, self.best_iter, self.stale = value, iteration, 0
            return True
        self.stale += 1
        return False

    def state(self) -> dict:
        """What a resumed run needs (JSON-ready)."""
        return {"best": self.best, "best_iter": self.best_iter, "stale": self.stale}

    def restore(self, state: dict) -> None:
        """Take back what :meth:`state` returned."""
        self.best, self.best_iter, self.stale = state["best"], state["best_iter"], int(state["stale"])
