"""Resize: a 2-D map scaled to a new height and width, by its nearest values or bilinearly (ONNX's Resize and
Upsample, PyTorch's interpolate)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.engine import blas
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.layers.spatial import require_4d
from netspec.spec.schema import doc


@dataclass
class ResizeParams:
    """Parameters of Resize."""

    height: int | None = doc(None, "output height (with width; or scale)")
    width: int | None = doc(None, "output width")
    scale: list[float] = doc([], "factor: one, or (height, width); the output is floor(input * scale), and the "
                                 "positions are mapped back by it (with height and width too: only that)")
    mode: Literal["NEAREST", "LINEAR"] = doc("NEAREST", "NEAREST: each output takes one input value; LINEAR: "
                                                        "bilinear between the four around it")
    coordinates: Literal["HALF_PIXEL", "PYTORCH_HALF_PIXEL", "ALIGN_CORNERS", "ASYMMETRIC"] = doc(
        "HALF_PIXEL", "where output position o lies in the input: HALF_PIXEL (o + 0.5) / scale - 0.5 (PyTorch's "
                      "align_corners=False); PYTORCH_HALF_PIXEL the same but 0 for an output of 1; ALIGN_CORNERS "
                      "o * (in - 1) / (out - 1); ASYMMETRIC o / scale")
    nearest: Literal["ROUND_PREFER_FLOOR", "ROUND_PREFER_CEIL", "FLOOR", "CEIL"] = doc(
        "ROUND_PREFER_FLOOR", "NEAREST: how a position between two inputs is rounded")


def source_positions(size: int, out: int, scale: float, coordinates: str):
    """Where each of ``out`` outputs lies along an input axis of ``size`` (float64)."""
    o = numpy.arange(out, dtype=numpy.float64)
    if coordinates == "ALIGN_CORNERS":
        return o * (size - 1) / (out - 1) if out > 1 else numpy.zeros(out)
    if coordinates == "ASYMMETRIC":
        return o / scale
    positions = (o + 0.5) / scale - 0.5
    return numpy.zeros(out) if coordinates == "PYTORCH_HALF_PIXEL" and out == 1 else positions


ROUNDING = {"ROUND_PREFER_FLOOR": lambda x: numpy.ceil(x - 0.5), "ROUND_PREFER_CEIL": lambda x: numpy.floor(x + 0.5),
            "FLOOR": numpy.floor, "CEIL": numpy.ceil}


def interpolation(size: int, out: int, scale: float, p: ResizeParams) -> tuple[list, list, numpy.ndarray]:
    """Along one axis: the input indices each output reads (one list for NEAREST, two for LINEAR), their weights
    (LINEAR: the second's), and the (out, size) matrix taking the input to the output."""
    positions = source_positions(size, out, scale, p.coordinates)
    matrix = numpy.zeros((out, size))
    rows = numpy.arange(out)
    if p.mode == "NEAREST":
        index = numpy.clip(ROUNDING[p.nearest](positions), 0, size - 1).astype(numpy.int64)
        matrix[rows, index] = 1
        return [index], [], matrix
    low = numpy.floor(positions)
    weight = positions - low
    first = numpy.clip(low, 0, size - 1).astype(numpy.int64)
    second = numpy.clip(low + 1, 0, size - 1).astype(numpy.int64)
    numpy.add.at(matrix, (rows, first), 1 - weight)
    numpy.add.at(matrix, (rows, second), weight)
    return [first, second], weight, matrix


@register_layer
class Resize(Layer):
    """Resize: the (H, W) maps of (N, C, H, W) scaled to ``height`` x ``width`` (or by ``scale``).

    Output position ``o`` lies at ``coordinates``' place in the input:
    NEAREST takes the input there (rounded by ``nearest``), LINEAR the
    bilinear mix of the two inputs around it along each axis (the edge value
    beyond the edges).  That is ONNX's Resize (and its ``coordinate_
    transformation_mode`` and ``nearest_mode``), and PyTorch's
    ``interpolate``: ``mode='nearest'`` is NEAREST, ASYMMETRIC, FLOOR;
    ``'bilinear'`` is LINEAR, HALF_PIXEL (ALIGN_CORNERS with
    ``align_corners=True``).  The gradient goes back through the same weights.
    Not in place.

    Example (a segmentation head's 2x bilinear upsampling)::

        - {name: up, type: Resize, bottom: score, top: up, resize_param: {scale: 2, mode: LINEAR}}
    """

    type = "Resize"
    param_blocks = {"resize_param": ResizeParams}

    def geometry(self, shape) -> tuple[tuple[int, int], tuple[float, float]]:
        """``((height, width), (scale_h, scale_w))`` for a bottom of ``shape`` (validated)."""
        require_4d(shape, self.type)
        p = self.block("resize_param")
        scale = list(p.scale)
        if len(scale) not in (0, 1, 2) or any(not math.isfinite(s) or s <= 0 for s in scale):
            raise ParamError("resize_param.scale", f"give one positive factor, or two (height, width), got {scale}")
        scale = scale * 2 if len(scale) == 1 else scale
        if (p.height is None) != (p.width is None):
            raise ParamError("resize_param.height", "give height and width together")
        if p.height is None and not scale:
            raise ParamError("resize_param", "give height and width, or scale")
        out = ((p.height, p.width) if p.height is not None
               else tuple(int(math.floor(size * s)) for size, s in zip(shape[2:], scale)))
        if min(out) < 1:
            raise ParamError("resize_param", f"the output would be {out[0]}x{out[1]}")
        return out, tuple(scale) if scale else tuple(o / size for o, size in zip(out, shape[2:]))

    def top_shapes(self, bottom_shapes):
        return [(*bottom_shapes[0][:2], *self.geometry(bottom_shapes[0])[0])]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        (out_h, out_w), (scale_h, scale_w) = self.geometry(bottom[0].shape)
        p = self.block("resize_param")
        h, w = bottom[0].shape[2:]
        self.rows = self._on_device(interpolation(h, out_h, scale_h, p), (-1, 1))
        self.columns = self._on_device(interpolation(w, out_w, scale_w, p), (-1,))

    def _on_device(self, taken, weight_shape):
        """An axis' :func:`interpolation` on the device, its weights shaped to broadcast along that axis."""
        indices, weight, matrix = taken
        xp = self.xp
        return ([xp.asarray(index) for index in indices], xp.asarray(weight, dtype=self.dtype).reshape(weight_shape),
                xp.asarray(matrix, dtype=self.dtype))

    def _along(self, x, axis: int, taken):
        indices, weight, _ = taken
        if len(indices) == 1:
            return self.xp.take(x, indices[0], axis=axis)
        first, second = (self.xp.take(x, index, axis=axis) for index in indices)
        return first + (second - first) * weight

    def forward(self, bottom, top):
        top[0].data[...] = self._along(self._along(bottom[0].data, 2, self.rows), 3, self.columns)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:  # (the transposes of the two interpolation matrices: no scattered adds)
            blas.separable(self.backend, self.rows[2].T, top[0].diff, self.columns[2], bottom[0].diff)
