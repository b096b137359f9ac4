"""Weight fillers with Caffe's definitions.

Fan-in of a blob of shape ``(out, in, ...)`` is ``count / out`` and fan-out is
``count / in``, as in Caffe.  Weight fillers run on the host with a numpy generator
so that initial weights do not depend on the device; DummyData's refills draw
on the device (:class:`netspec.engine.backend.DeviceGenerator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.errors import ParamError
from netspec.spec.schema import doc

FILLER_TYPES = ("constant", "uniform", "randint", "gaussian", "xavier", "msra", "bilinear", "positive_unitball")


@dataclass
class FillerParams:
    """How to initialise a blob (Caffe's FillerParameter)."""

    type: Literal[FILLER_TYPES] = doc("constant", "filler type")
    value: float = doc(0.0, "constant: the value")
    min: float = doc(0.0, "uniform, randint: lower bound")
    max: float = doc(1.0, "uniform: upper bound; randint: one past the largest value (class labels: the class "
                          "count; at most 2**32 past min)")
    mean: float = doc(0.0, "gaussian: mean")
    std: float = doc(1.0, "gaussian: standard deviation")
    sparse: int = doc(-1, "gaussian: expected non-zeros per output (-1: dense)")
    variance_norm: Literal["FAN_IN", "FAN_OUT", "AVERAGE"] = doc(
        "FAN_IN", "xavier/msra: which fan the variance is scaled by")


def constant(value: float = 0.0) -> FillerParams:
    """A constant filler (the default for biases)."""
    return FillerParams(type="constant", value=value)


def _fan(shape, norm: str) -> float:
    count = math.prod(shape)
    fan_in = count / shape[0] if shape else 1
    fan_out = count / shape[1] if len(shape) > 1 else count
    if norm == "FAN_OUT":
        return fan_out
    if norm == "AVERAGE":
        return (fan_in + fan_out) / 2
    return fan_in


def fill(params: FillerParams, shape, rng, dtype=numpy.float32, key: str = "filler", out=None):
    """An array of ``shape`` filled as ``params`` says, drawn from ``rng``: a NumPy generator gives a host
    array, a :class:`netspec.engine.backend.DeviceGenerator` a device array (constant and bilinear fills are
    host arrays either way).  ``out`` (C-contiguous, of ``shape`` and ``dtype``) takes the values of a uniform or
    gaussian filler, and of a randint filler drawn on the device, and is then returned: DummyData refills its
    tops in place."""
    shape = tuple(shape)
    kind = params.type
    if kind == "constant":
        return numpy.full(shape, params.value, dtype=dtype)
    if kind == "uniform":  # (in place: a large draw allocates once)
        values = rng.random(shape, dtype=dtype, out=out)
        if params.max - params.min != 1 or params.min:  # (no launch on a GPU for a product by 1 and a sum with 0:
            values *= params.max - params.min           # the draws are never -0, which adding 0 would make +0)
            values += params.min
        return values
    if kind == "randint":  # whole numbers min, min+1, ..., max-1: random class labels for DummyData
        whole = all(float(bound).is_integer() and abs(bound) <= 2 ** 53 for bound in (params.min, params.max))
        if not (whole and 0 < params.max - params.min <= 2 ** 32):
            raise ParamError(key, f"randint needs whole numbers min < max (at most 2**53, and 2**32 apart), got "
                                  f"min {float(params.min)} and max {float(params.max)}")
        if isinstance(rng, numpy.random.Generator):  # (its integers are of an integer type only)
            return rng.integers(int(params.min), int(params.max), size=shape).astype(dtype)
        return rng.integers(int(params.min), int(params.max), size=shape, dtype=dtype, out=out)
    if kind == "gaussian":
        values = rng.standard_normal(shape, dtype=dtype, out=out)
        if params.std != 1 or params.mean:  # (as uniform's; a draw of exactly -0, one in 2**53, now stays -0)
            values *= params.std
            values += params.mean
        if params.sparse >= 0:
            if len(shape) < 2:
                raise ParamError(key, "a sparse gaussian filler needs a blob of at least 2 axes")
            values *= rng.random(shape) < params.sparse / shape[0]
        return values
    if kind == "xavier":
        scale = math.sqrt(3.0 / _fan(shape, params.variance_norm))
        return rng.uniform(-scale, scale, size=shape).astype(dtype)
    if kind == "msra":
        std = math.sqrt(2.0 / _fan(shape, params.variance_norm))
        return rng.normal(0.0, std, size=shape).astype(dtype)
    if kind == "bilinear":
        return _bilinear(shape, key).astype(dtype)
    # positive_unitball: non-negative rows that sum to one
    values = rng.uniform(0.0, 1.0, size=shape)
    rows = values.reshape(shape[0], -1) if shape else values.reshape(1, -1)
    rows /= rows.sum(axis=1, keepdims=True)
    return rows.reshape(shape).astype(dtype)


def _bilinear(shape, key: str) -> numpy.ndarray:
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ParamError(key, "the bilinear filler needs a 4-axis blob with square kernels")
    size = shape[3]
    factor = math.ceil(size / 2)
    center = (2 * factor - 1 - factor % 2) / (2.0 * factor)
    ramp = 1 - numpy.abs(numpy.arange(size) / factor - center)
    kernel = numpy.outer(ramp, ramp)
    return numpy.broadcast_to(kernel, shape).copy()
