"""Element-wise activations: ReLU, PReLU, ELU, Sigmoid, TanH, BNLL, Threshold, Clip, and the later ReLU6,
HardSigmoid, HardSwish, Swish and GELU.

Each maps every value independently, so the top has the bottom's shape.
Those whose gradient can be computed from the output run in place.  On the
CPU in float32, those whose formula oneDNN's eltwise primitive has run
there (:class:`OneDnnElementwise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from netspec.engine import kernels, onednn, primitives
from netspec.engine.fillers import FillerParams, constant
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import Limit, doc


class Elementwise(Layer):
    """Base of the element-wise layers: one bottom, one top of the same shape."""

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]


class OneDnnElementwise(Elementwise):
    """Base of the activations oneDNN's eltwise primitive computes with the same formula, forward and backward.

    On the CPU in float32 (and oneDNN loaded) they run there, as
    :meth:`onednn_algorithm` says, else on :meth:`numpy_forward` and
    :meth:`numpy_backward`.  An algorithm whose backward reads the output
    (``..._USE_DST``) lets the layer run in place.
    """

    takes_held = True
    fast_records = True

    def onednn_algorithm(self) -> tuple[int, float, float] | None:
        """oneDNN's algorithm and its alpha and beta for this layer's parameters; None where it has none."""
        raise NotImplementedError

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        algorithm = self.onednn_algorithm()
        self.fast = None if algorithm is None else onednn.attempt_in(
            self, onednn.layout_of(bottom[0].values),
            lambda lib, layout: primitives.Elementwise(lib, bottom[0].shape, *algorithm, layout=layout))
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast.forward(bottom[0].values, top[0].values)
        else:
            self.numpy_forward(bottom, top)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.fast is not None:
            self.fast.backward(bottom[0].values, top[0].values, top[0].gradient, bottom[0].gradient)
        else:
            self.numpy_backward(top, bottom)

    def numpy_forward(self, bottom, top) -> None:
        """The top's data from the bottom's, off oneDNN."""
        raise NotImplementedError

    def numpy_backward(self, top, bottom) -> None:
        """The bottom's diff from the top's, off oneDNN."""
        raise NotImplementedError


@dataclass
class ReLUParams:
    """Parameters of ReLU."""

    negative_slope: float = doc(0.0, "slope for negative inputs (leaky ReLU)")


@register_layer
class ReLU(OneDnnElementwise):
    """ReLU: ``y = max(x, 0) + negative_slope * min(x, 0)``.

    The gradient is ``dy`` where the input is positive, ``negative_slope * dy``
    elsewhere (Caffe's rule, decided by the input: with a negative slope the
    layer keeps a copy of it, the output's sign no longer telling).
    Bottom/top: any shape.  Runs in place.  On oneDNN (float32) unless the slope is negative.

    Example::

        - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
    """

    type = "ReLU"
    param_blocks = {"relu_param": ReLUParams}
    inplace_ok = True

    def onednn_algorithm(self):
        slope = self.block("relu_param").negative_slope
        return (onednn.ELTWISE_RELU_USE_DST, slope, 0.0) if slope >= 0 else None  # (from the output: no slope < 0)

    def numpy_forward(self, bottom, top):
        slope = self.block("relu_param").negative_slope
        x = bottom[0].data
        if slope < 0:
            self.input = x.copy()  # (in place the output overwrites it, and its sign is not the input's)
        if slope:
            self.xp.copyto(top[0].data, self.xp.where(x > 0, x, x * slope))
        else:
            self.xp.maximum(x, 0, out=top[0].data)

    def numpy_backward(self, top, bottom):
        slope = self.block("relu_param").negative_slope
        y = self.input if slope < 0 else top[0].data  # (for a slope >= 0, y > 0 exactly where x > 0)
        if kernels.compiled(self.xp):
            kernels.relu_backward(top[0].diff, y, slope, bottom[0].diff)
        elif slope:
            self.xp.copyto(bottom[0].diff, self.xp.where(y > 0, top[0].diff, top[0].diff * slope))
        else:
            self.xp.multiply(top[0].diff, y > 0, out=bottom[0].diff)


@dataclass
class PReLUParams:
    """Parameters of PReLU."""

    filler: FillerParams = field(default_factory=lambda: constant(0.25),
                                 metadata={"doc": "slope init (default constant 0.25)"})
    channel_shared: bool = doc(False, "one slope for all channels")


@register_layer
class PReLU(Elementwise):
    """PReLU: ``y = max(x, 0) + a_c * min(x, 0)`` with a learned slope per channel (axis 1).

    Bottom/top: (N, C, ...).  Learnable: slopes (C,), or (1,) with
    ``channel_shared``.  Runs in place (keeps a copy of the input).

    Example::

        - {name: prelu1, type: PReLU, bottom: conv1, top: conv1}
    """

    type = "PReLU"
    param_blocks = {"prelu_param": PReLUParams}
    inplace_ok = True

    def param_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        if len(shape) < 2:
            raise ShapeError(f"PReLU needs a bottom with a channel axis, got shape {shape}")
        return [(1,) if self.block("prelu_param").channel_shared else (shape[1],)]

    def param_fillers(self):
        return [self.block("prelu_param").filler]

    def slopes(self, ndim: int):
        """Slopes shaped to broadcast over (N, C, ...)."""
        a = self.blobs[0].data
        return a.reshape((1, a.shape[0]) + (1,) * (ndim - 2))

    def forward(self, bottom, top):
        x = bottom[0].data
        self.input = x.copy()
        a = self.slopes(x.ndim)
        self.xp.copyto(top[0].data, self.xp.where(x > 0, x, x * a))

    def backward(self, top, propagate_down, bottom):
        x, dy = self.input, top[0].diff
        negative = x <= 0
        if self.param_propagate_down[0]:
            grad = dy * x * negative
            axes = (0,) + tuple(range(2, x.ndim))
            if self.block("prelu_param").channel_shared:
                self.blobs[0].diff += grad.sum()
            else:
                self.blobs[0].diff += grad.sum(axis=axes)
        if propagate_down[0]:  # (Caffe's (x > 0) + a (x <= 0): 0 where x is NaN)
            self.xp.multiply(dy, (x > 0) + negative * self.slopes(x.ndim), out=bottom[0].diff)


@dataclass
class ELUParams:
    """Parameters of ELU."""

    alpha: float = doc(1.0, "scale of the negative part")


@register_layer
class ELU(OneDnnElementwise):
    """ELU: ``y = x`` for x > 0, ``alpha * (exp(x) - 1)`` otherwise.

    The gradient is ``dy`` where the input is positive, ``dy * (y + alpha)``
    elsewhere (Caffe's rule, decided by the input: with a negative alpha the
    layer keeps a copy of it).  Bottom/top: any shape.  Runs in place.  On
    oneDNN (float32) unless alpha is negative.

    Example::

        - {name: elu1, type: ELU, bottom: conv1, top: conv1, elu_param: {alpha: 1.0}}
    """

    type = "ELU"
    param_blocks = {"elu_param": ELUParams}
    inplace_ok = True

    def onednn_algorithm(self):
        alpha = self.block("elu_param").alpha
        return (onednn.ELTWISE_ELU_USE_DST, alpha, 0.0) if alpha >= 0 else None  # (from the output: no alpha < 0)

    def numpy_forward(self, bottom, top):
        alpha = self.block("elu_param").alpha
        x = bottom[0].data
        if alpha < 0:
            self.input = x.copy()  # (in place the output overwrites it, and its sign is not the input's)
        self.xp.copyto(top[0].data, self.xp.where(x > 0, x, alpha * self.xp.expm1(self.xp.minimum(x, 0))))

    def numpy_backward(self, top, bottom):
        alpha = self.block("elu_param").alpha
        y, dy = top[0].data, top[0].diff
        positive = (self.input if alpha < 0 else y) > 0  # (for alpha >= 0, y > 0 exactly where x > 0)
        self.xp.copyto(bottom[0].diff, self.xp.where(positive, dy, dy * (y + alpha)))


@register_layer
class Sigmoid(OneDnnElementwise):
    """Sigmoid: ``y = 1 / (1 + exp(-x))``.

    Bottom/top: any shape.  Runs in place.  On oneDNN (float32).

    Example::

        - {name: sig1, type: Sigmoid, bottom: ip1, top: ip1}
    """

    type = "Sigmoid"
    inplace_ok = True

    def onednn_algorithm(self):
        return onednn.ELTWISE_LOGISTIC_USE_DST, 0.0, 0.0

    def numpy_forward(self, bottom, top):
        xp = self.xp
        out = top[0].data
        xp.multiply(bottom[0].data, 0.5, out=out)
        xp.tanh(out, out=out)
        out *= 0.5
        out += 0.5

    def numpy_backward(self, top, bottom):
        y = top[0].data
        self.xp.multiply(top[0].diff, y * (1 - y), out=bottom[0].diff)


@register_layer
class TanH(OneDnnElementwise):
    """TanH: ``y = tanh(x)``.

    Bottom/top: any shape.  Runs in place.  On oneDNN (float32).

    Example::

        - {name: tanh1, type: TanH, bottom: ip1, top: ip1}
    """

    type = "TanH"
    inplace_ok = True

    def onednn_algorithm(self):
        return onednn.ELTWISE_TANH_USE_DST, 0.0, 0.0

    def numpy_forward(self, bottom, top):
        self.xp.tanh(bottom[0].data, out=top[0].data)

    def numpy_backward(self, top, bottom):
        y = top[0].data
        self.xp.multiply(top[0].diff, 1 - y * y, out=bottom[0].diff)


@register_layer
class BNLL(OneDnnElementwise):
    """BNLL (binomial normal log-likelihood): ``y = log(1 + exp(x))``, computed as Caffe does:
    ``max(x, 0) + log(1 + exp(-|x|))`` (0 where exp(-|x|) is below the dtype's precision).

    Bottom/top: any shape.  Not in place.  On oneDNN (float32, its soft_relu).

    Example::

        - {name: bnll1, type: BNLL, bottom: x, top: y}
    """

    type = "BNLL"

    def onednn_algorithm(self):
        return onednn.ELTWISE_SOFT_RELU, 1.0, 0.0  # (alpha: the slope inside, log(1 + exp(alpha x)) / alpha)

    def numpy_forward(self, bottom, top):
        x = bottom[0].data
        self.xp.add(self.xp.maximum(x, 0), self.xp.log(1 + self.xp.exp(-self.xp.abs(x))), out=top[0].data)

    def numpy_backward(self, top, bottom):
        sigmoid = 0.5 * self.xp.tanh(0.5 * bottom[0].data) + 0.5
        self.xp.multiply(top[0].diff, sigmoid, out=bottom[0].diff)


@dataclass
class ThresholdParams:
    """Parameters of Threshold."""

    threshold: float = doc(0.0, "values above it become 1, the rest 0")


@register_layer
class Threshold(Elementwise):
    """Threshold: ``y = 1 if x > threshold else 0``; its gradient is zero everywhere it exists.

    Bottom/top: any shape.  Runs in place.

    Example::

        - {name: binary, type: Threshold, bottom: prob, top: mask, threshold_param: {threshold: 0.5}}
    """

    type = "Threshold"
    param_blocks = {"threshold_param": ThresholdParams}
    inplace_ok = True

    def forward(self, bottom, top):
        self.xp.greater(bottom[0].data, self.block("threshold_param").threshold, out=top[0].data,
                        casting="unsafe")

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 0


@dataclass
class ClipParams:
    """Parameters of Clip."""

    min: Limit = doc(-math.inf, "lower bound")
    max: Limit = doc(math.inf, "upper bound")


@register_layer
class Clip(Elementwise):
    """Clip: ``y = min(max(x, min), max)``; the gradient passes where ``min <= x <= max``.  A NaN input gives
    ``min`` (Caffe's ``std::max(min, std::min(x, max))``) and no gradient.

    Bottom/top: any shape.  Not in place.

    Example::

        - {name: relu6, type: Clip, bottom: x, top: y, clip_param: {min: 0, max: 6}}
    """

    type = "Clip"
    param_blocks = {"clip_param": ClipParams}

    def top_shapes(self, bottom_shapes):
        p = self.block("clip_param")
        if p.min > p.max:
            raise ParamError("clip_param.min", f"min {p.min} is above max {p.max}")
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        p = self.block("clip_param")
        x = bottom[0].data
        self.xp.copyto(top[0].data, self.xp.where(self.xp.isnan(x), p.min, self.xp.clip(x, p.min, p.max)))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            p = self.block("clip_param")
            x = bottom[0].data
            self.xp.multiply(top[0].diff, (x >= p.min) & (x <= p.max), out=bottom[0].diff)


@register_layer
class ReLU6(OneDnnElementwise):
    """ReLU6: ``y = min(max(x, 0), 6)`` (MobileNet's); the gradient passes where ``0 < y < 6``.

    Bottom/top: any shape.  Runs in place.  On oneDNN (float32, its clip_v2).

    Example::

        - {name: relu6, type: ReLU6, bottom: conv1, top: conv1}
    """

    type = "ReLU6"
    inplace_ok = True

    def onednn_algorithm(self):
        return onednn.ELTWISE_CLIP_V2_USE_DST, 0.0, 6.0

    def numpy_forward(self, bottom, top):
        self.xp.clip(bottom[0].data, 0, 6, out=top[0].data)

    def numpy_backward(self, top, bottom):
        y = top[0].data
        self.xp.multiply(top[0].diff, (y > 0) & (y < 6), out=bottom[0].diff)


@dataclass
class HardSigmoidParams:
    """Parameters of HardSigmoid."""

    alpha: float = doc(1 / 6, "slope (1/6: PyTorch's and MobileNetV3's; ONNX's default is 0.2)")
    beta: float = doc(0.5, "offset")


@register_layer
class HardSigmoid(OneDnnElementwise):
    """HardSigmoid: ``y = min(max(alpha * x + beta, 0), 1)``; the gradient is ``alpha`` where ``0 < y < 1``.

    Bottom/top: any shape.  Runs in place.  On oneDNN (float32).

    Example::

        - {name: gate, type: HardSigmoid, bottom: se_fc2, top: se_fc2}
    """

    type = "HardSigmoid"
    param_blocks = {"hard_sigmoid_param": HardSigmoidParams}
    inplace_ok = True

    def onednn_algorithm(self):
        p = self.block("hard_sigmoid_param")
        return onednn.ELTWISE_HARDSIGMOID, p.alpha, p.beta

    def reshape(self, bottom, top):
        # oneDNN's hardsigmoid takes the input in backward, which running in place overwrites: the gradient is
        # taken from the output instead, as a clip's to [0, 1] (passing where 0 < y < 1) times alpha
        super().reshape(bottom, top)
        self.clip = None if self.fast is None else onednn.attempt(
            self, lambda lib: primitives.Elementwise(lib, bottom[0].shape, onednn.ELTWISE_CLIP_V2_USE_DST, 0.0, 1.0))
        if self.clip is None:
            self.fast = None

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and self.fast is not None:
            self.clip.backward(bottom[0].data, top[0].data, top[0].diff, bottom[0].diff)
            bottom[0].diff *= self.block("hard_sigmoid_param").alpha
        else:
            super().backward(top, propagate_down, bottom)

    def numpy_forward(self, bottom, top):
        p = self.block("hard_sigmoid_param")
        out = top[0].data
        self.xp.multiply(bottom[0].data, p.alpha, out=out)
        out += p.beta
        self.xp.clip(out, 0, 1, out=out)

    def numpy_backward(self, top, bottom):
        y = top[0].data
        alpha = self.block("hard_sigmoid_param").alpha
        self.xp.multiply(top[0].diff, alpha * ((y > 0) & (y < 1)), out=bottom[0].diff)


@register_layer
class HardSwish(OneDnnElementwise):
    """HardSwish: ``y = x * min(max(x + 3, 0), 6) / 6`` (MobileNetV3's); the gradient is 0 below -3, 1 above 3,
    ``(2x + 3) / 6`` between.

    Bottom/top: any shape.  Not in place.  On oneDNN (float32).

    Example::

        - {name: hswish1, type: HardSwish, bottom: conv1, top: act1}
    """

    type = "HardSwish"

    def onednn_algorithm(self):
        return onednn.ELTWISE_HARDSWISH, 1 / 6, 0.5  # (x * min(max(alpha x + beta, 0), 1))

    def numpy_forward(self, bottom, top):
        x = bottom[0].data
        self.xp.multiply(x, self.xp.clip(x + 3, 0, 6) / 6, out=top[0].data)

    def numpy_backward(self, top, bottom):
        x = bottom[0].data
        slope = self.xp.where(x < -3, 0.0, self.xp.where(x > 3, 1.0, (2 * x + 3) / 6))
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@dataclass
class SwishParams:
    """Parameters of Swish."""

    beta: float = doc(1.0, "the sigmoid's slope (1: SiLU)")


@register_layer
class Swish(OneDnnElementwise):
    """Swish: ``y = x * sigmoid(beta * x)`` (Caffe's Swish; with ``beta: 1``, SiLU).

    The gradient is ``sigmoid(beta x) + beta * y * (1 - sigmoid(beta x))``.
    Bottom/top: any shape.  Not in place.  On oneDNN (float32).

    Example::

        - {name: swish1, type: Swish, bottom: conv1, top: act1, swish_param: {beta: 1}}
    """

    type = "Swish"
    param_blocks = {"swish_param": SwishParams}

    def gate(self, x):
        """``sigmoid(beta * x)``, computed through tanh (no overflow)."""
        return 0.5 * self.xp.tanh(0.5 * self.block("swish_param").beta * x) + 0.5

    def onednn_algorithm(self):
        return onednn.ELTWISE_SWISH, self.block("swish_param").beta, 0.0

    def numpy_forward(self, bottom, top):
        x = bottom[0].data
        self.xp.multiply(x, self.gate(x), out=top[0].data)

    def numpy_backward(self, top, bottom):
        gate = self.gate(bottom[0].data)
        beta = self.block("swish_param").beta
        self.xp.multiply(top[0].diff, gate + beta * top[0].data * (1 - gate), out=bottom[0].diff)


# W. J. Cody's rational approximations of erf and erfc ("Rational Chebyshev approximations for the error function",
# Math. Comp. 23 (1969), the coefficients of his CALERF): (numerator, denominator), highest power first.
ERF_NEAR_ZERO = ((1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
                  3.20937758913846947e03),
                 (1.0, 2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
                  2.84423683343917062e03))  # erf(x) = x P(x^2) / Q(x^2) for |x| <= 0.46875
ERFC_MIDDLE = ((2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
                2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03,
                1.23033935479799725e03),
               (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
                3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03,
                1.23033935480374942e03))  # erfc(y) = exp(-y^2) P(y) / Q(y) for 0.46875 < y <= 4
ERFC_TAIL = ((1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
              1.60837851487422766e-2, 6.58749161529837803e-4),
             (1.0, 2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
              2.33520497626869185e-3))  # erfc(y) = exp(-y^2) / y (1/sqrt(pi) - P(1/y^2) / (y^2 Q(1/y^2))) beyond 4
ERF_BLOCK = 1 << 16  # values computed at once: the temporaries of a block stay in the processor's cache


def _rational(xp, t, coefficients):
    """``P(t) / Q(t)`` for ``coefficients`` (P's, Q's), by Horner's rule."""
    values = []
    for polynomial in coefficients:
        value = xp.full_like(t, polynomial[0])
        for c in polynomial[1:]:
            value *= t
            value += c
        values.append(value)
    numerator, denominator = values
    numerator /= denominator
    return numerator


def erf(xp, x):
    """The error function of every value of ``x`` (NumPy has none), to double precision in float64 (in float32, to
    float32's): Cody's approximations above, a block of values at a time.  Each block takes every value through
    all three ranges (clamped to each) and keeps the right one, so no step's size depends on the values and a GPU
    never waits for a count."""
    flat = xp.ravel(x)
    result = xp.empty_like(flat)
    for start in range(0, flat.size, ERF_BLOCK):
        z, out = flat[start:start + ERF_BLOCK], result[start:start + ERF_BLOCK]
        y = xp.abs(z)
        s = xp.minimum(y, 0.46875)
        near = s * _rational(xp, s * s, ERF_NEAR_ZERO)
        m = xp.clip(y, 0.46875, 4.0)
        middle = 1 - xp.exp(-m * m) * _rational(xp, m, ERFC_MIDDLE)
        t = xp.clip(y, 4.0, 6.0)  # (beyond 6, erf is 1 to double precision; NaN stays NaN)
        inverse = 1 / (t * t)
        tail = 1 - xp.exp(-t * t) / t * (1 / math.sqrt(math.pi) - inverse * _rational(xp, inverse, ERFC_TAIL))
        out[...] = xp.where(y <= 0.46875, near, xp.where(y <= 4, middle, tail))
        xp.copysign(out, z, out=out)
    return result.reshape(x.shape)


@dataclass
class GELUParams:
    """Parameters of GELU."""

    approximate: Literal["none", "tanh"] = doc("none", "none: the exact x * Phi(x), Phi through erf; tanh: "
                                                       "the tanh approximation (PyTorch's names)")


TANH_SCALE, TANH_CUBIC = math.sqrt(2 / math.pi), 0.044715


@register_layer
class GELU(OneDnnElementwise):
    """GELU (Gaussian error linear unit, BERT's and ViT's): ``y = x * Phi(x)``, ``Phi`` the standard normal
    distribution function ``(1 + erf(x / sqrt(2))) / 2``; the gradient is ``Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi)``.

    With ``approximate: tanh``, ``Phi(x)`` is taken as ``(1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2`` (GPT-2's),
    and the gradient is that formula's.  PyTorch's ``nn.GELU(approximate=...)``; Caffe has no GELU.
    Bottom/top: any shape.  Not in place.  On the CPU in float32 oneDNN's primitives run it
    (``NETSPEC_ONEDNN=0``: NumPy, with erf to double precision in float64).

    Example::

        - {name: gelu1, type: GELU, bottom: fc1, top: act1, gelu_param: {approximate: none}}
    """

    type = "GELU"
    param_blocks = {"gelu_param": GELUParams}

    @property
    def tanh(self) -> bool:
        """True for the tanh approximation."""
        return self.block("gelu_param").approximate == "tanh"

    def onednn_algorithm(self):
        return onednn.ELTWISE_GELU_TANH if self.tanh else onednn.ELTWISE_GELU_ERF, 0.0, 0.0

    def numpy_forward(self, bottom, top):
        xp, x = self.xp, bottom[0].data
        if self.tanh:
            self.cdf = 0.5 * xp.tanh(TANH_SCALE * (x + TANH_CUBIC * x * x * x)) + 0.5
        else:
            self.cdf = 0.5 * erf(xp, x * math.sqrt(0.5)) + 0.5
        xp.multiply(x, self.cdf, out=top[0].data)

    def numpy_backward(self, top, bottom):
        x = bottom[0].data
        cdf = self.cdf  # Phi(x) from forward (or its tanh approximation)
        if self.tanh:  # d tanh(u) = 1 - tanh(u)^2 = 4 Phi (1 - Phi)
            slope = cdf + 2 * TANH_SCALE * x * cdf * (1 - cdf) * (1 + 3 * TANH_CUBIC * x * x)
        else:
            slope = cdf + x * self.xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)
