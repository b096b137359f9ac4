"""Dynamic loss scaling, for ``precision: fp16-mixed``: gradients large enough for float16's operands.

float16 keeps 10 bits of significand but only 5 of exponent: values below
2**-24 vanish and values past 65,504 become infinite.  A net's gradients are
often far smaller than its activations, so the products that take them as
float16 operands would lose them.  The loss's gradient is therefore seeded
with a scale (``2**16`` at first) instead of 1, so that every gradient
backward makes is that many times larger, and each parameter's gradient is
divided by it before the update, which sees the true values (the weights and
their gradients are float32 throughout).  Where the scaled gradients
overflowed (a parameter's gradient holds an infinity or a NaN), the update is
skipped, the history left as it was (an update rule that counts its updates,
Adam's bias correction, counts only those made), and the scale halved; after
``GROWTH_INTERVAL`` updates in a row without overflow it doubles again.  An
overflow at the lowest scale, 1, is one the scale cannot cure: training stops
there (:class:`netspec.errors.DivergedError`, naming the last snapshot).
The scale, the count since its last change and the updates skipped are part
of the solver's state, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import math

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000  # updates without overflow after which the scale doubles
LOWEST_SCALE = 1.0


class LossScale:
    """The scale of one run's loss and the updates made since it last changed."""

    def __init__(self) -> None:
        self.scale = INITIAL_SCALE
        self.good_updates = 0
        self.skipped = 0  # the updates skipped so far

    def unscale(self, backend, diffs: list) -> bool:
        """Divide every gradient in ``diffs`` (the parameters' diff arrays, float32) by the scale; return whether
        all of them are finite (one read of the device)."""
        if not diffs:  # (a net whose parameters all have lr_mult 0)
            return True
        xp = backend.xp
        for diff in diffs:
            diff *= 1.0 / self.scale
        finite = xp.stack([xp.isfinite(diff).all() for diff in diffs]).all()
        return bool(backend.to_host(finite))

    def after(self, finite: bool) -> bool:
        """Follow an update's outcome: halve the scale after an overflow (``finite`` False), double it after
        GROWTH_INTERVAL finite ones in a row; return False where an overflow came at the lowest scale."""
        if finite:
            self.good_updates += 1
            if self.good_updates >= GROWTH_INTERVAL:
                self.scale, self.good_updates = self.scale * 2, 0
            return True
        if self.scale <= LOWEST_SCALE:
            return False
        self.scale, self.good_updates, self.skipped = max(self.scale / 2, LOWEST_SCALE), 0, self.skipped + 1
        return True

    def state(self) -> dict:
        """What a snapshot keeps (JSON data)."""
        return {"scale": self.scale, "good_updates": self.good_updates, "skipped": self.skipped}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`'s data (ValueError for a scale that is not a power of two from the lowest
        up, or a count that is not a whole number from 0 up: a state edited by hand)."""
        scale, counts = state["scale"], (state["good_updates"], state["skipped"])
        power = isinstance(scale, float) and math.isfinite(scale) and scale >= LOWEST_SCALE and \
            math.frexp(scale)[0] == 0.5
        if not (power and all(type(count) is int and count >= 0 for count in counts)):
            raise ValueError(f"a loss scale of {scale!r} after {counts[0]!r} updates, {counts[1]!r} skipped")
        self.scale, (self.good_updates, self.skipped) = scale, counts
