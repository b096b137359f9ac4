"""Element-wise arithmetic: AbsVal, Power, Exp, Log.

Each maps every value independently, so the top has the bottom's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.layers.activations import Elementwise
from netspec.spec.schema import doc


@register_layer
class AbsVal(Elementwise):
    """AbsVal: ``y = |x|``; the gradient is ``sign(x)`` (0 where x is 0 or NaN, as Caffe's sign).

    Bottom/top: any shape.  Not in place.

    Example::

        - {name: abs1, type: AbsVal, bottom: x, top: absx}
    """

    type = "AbsVal"

    def forward(self, bottom, top):
        self.xp.abs(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = bottom[0].data
            self.xp.multiply(top[0].diff, (x > 0) * 1 - (x < 0), out=bottom[0].diff)


@dataclass
class PowerParams:
    """Parameters of Power."""

    power: float = doc(1.0, "exponent")
    scale: float = doc(1.0, "multiplier applied first")
    shift: float = doc(0.0, "offset applied after scaling")


@register_layer
class Power(Elementwise):
    """Power: ``y = (shift + scale * x) ^ power``.

    Where ``power * scale`` is 0 the input is not read, as in Caffe: ``y`` is
    1 (power 0) or ``shift ^ power`` (scale 0), even where x is infinite or
    NaN, and the gradient is 0.  Bottom/top: any shape.  Not in place.

    Example::

        - {name: square, type: Power, bottom: x, top: x2, power_param: {power: 2}}
    """

    type = "Power"
    param_blocks = {"power_param": PowerParams}

    def forward(self, bottom, top):
        p = self.block("power_param")
        if p.power * p.scale == 0:
            top[0].data[...] = 1.0 if p.power == 0 else self.xp.power(self.xp.asarray(p.shift, self.dtype), p.power)
            return
        self.xp.power(p.shift + p.scale * bottom[0].data, p.power, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            p = self.block("power_param")
            if p.power * p.scale == 0:
                bottom[0].diff[...] = 0
                return
            base = p.shift + p.scale * bottom[0].data
            grad = p.power * p.scale * self.xp.power(base, p.power - 1)
            self.xp.multiply(top[0].diff, grad, out=bottom[0].diff)


@dataclass
class BaseScaleShiftParams:
    """Parameters of Exp and Log: a base and an affine map of x."""

    base: float = doc(-1.0, "base (-1: e)")
    scale: float = doc(1.0, "multiplier on x")
    shift: float = doc(0.0, "offset added to scale * x")


class BaseScaleShift(Elementwise):
    """Base of Exp and Log: checks the base and gives its natural logarithm."""

    block_name = ""

    @property
    def params(self) -> BaseScaleShiftParams:
        """The exp_param or log_param block."""
        return self.block(self.block_name)

    def ln_base(self) -> float:
        """ln(base), 1 for base -1 (e)."""
        base = self.params.base
        if base == -1:
            return 1.0
        if base <= 0:
            raise ParamError(f"{self.block_name}.base", f"base must be positive (or -1 for e), got {base}")
        return math.log(base)

    def top_shapes(self, bottom_shapes):
        self.ln_base()
        return [bottom_shapes[0]]


@register_layer
class Exp(BaseScaleShift):
    """Exp: ``y = base ^ (shift + scale * x)`` (base -1 means e), computed as Caffe does:
    ``base^shift * exp(ln(base) * scale * x)`` (so an overflow of one factor is not undone by the other).

    Bottom/top: any shape.  Runs in place.

    Example::

        - {name: exp1, type: Exp, bottom: x, top: ex, exp_param: {base: 2}}
    """

    type = "Exp"
    param_blocks = {"exp_param": BaseScaleShiftParams}
    block_name = "exp_param"
    inplace_ok = True

    def forward(self, bottom, top):
        p, xp = self.params, self.xp
        xp.exp(self.ln_base() * p.scale * bottom[0].data, out=top[0].data)
        if p.shift:
            top[0].data[...] *= xp.exp(xp.asarray(self.ln_base() * p.shift, dtype=self.dtype))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            factor = self.ln_base() * self.params.scale
            self.xp.multiply(top[0].diff, top[0].data * factor, out=bottom[0].diff)


@register_layer
class Log(BaseScaleShift):
    """Log: ``y = log_base(shift + scale * x)`` (base -1 means e).

    Bottom/top: any shape.  Not in place.

    Example::

        - {name: log1, type: Log, bottom: x, top: logx}
    """

    type = "Log"
    param_blocks = {"log_param": BaseScaleShiftParams}
    block_name = "log_param"

    def top_shapes(self, bottom_shapes):
        if self.ln_base() == 0:
            raise ParamError("log_param.base", "base 1 has no logarithms (every power of 1 is 1)")
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        p = self.params
        self.xp.log(p.shift + p.scale * bottom[0].data, out=top[0].data)
        top[0].data /= self.ln_base()

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            p = self.params
            denominator = (p.shift + p.scale * bottom[0].data) * self.ln_base()
            self.xp.multiply(top[0].diff, p.scale / denominator, out=bottom[0].diff)
