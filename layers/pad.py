"""Pad: a bottom grown along its last axes by a constant, its mirror image or its edge values (ONNX's Pad; the
asymmetric padding TensorFlow's "SAME" convolutions need)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import Limit, doc


@dataclass
class PadParams:
    """Parameters of Pad."""

    axis: int = doc(2, "the first axis padded; before and after give one size for each axis from there on (or one "
                       "for all)")
    before: list[int] = doc([], "positions added before each padded axis (default 0)")
    after: list[int] = doc([], "positions added after each padded axis (default 0)")
    mode: Literal["CONSTANT", "REFLECT", "EDGE"] = doc("CONSTANT", "CONSTANT: ``value``; REFLECT: the values "
                                                                   "mirrored about the edge, the edge not repeated; "
                                                                   "EDGE: the edge value repeated")
    value: Limit = doc(0.0, "CONSTANT's value (-.inf before a MAX pooling)")


@register_layer
class Pad(Layer):
    """Pad: ``x`` grown by ``before[i]`` positions before and ``after[i]`` after each axis from ``axis`` on.

    Bottom: any shape.  Top: the padded shape.  CONSTANT fills with
    ``value``; REFLECT mirrors the values next to the edge (numpy.pad's
    "reflect", ONNX's "reflect": at most ``size - 1`` each side); EDGE repeats
    the edge.  The gradient of x is the top's in x's window plus, for REFLECT
    and EDGE, the gradients of the positions copied from it.  Not in place.

    Example (TensorFlow's "SAME" for a 3x3 stride-2 convolution of an even map)::

        - {name: pad1, type: Pad, bottom: x, top: padded, pad_param: {axis: 2, before: 0, after: 1}}
    """

    type = "Pad"
    param_blocks = {"pad_param": PadParams}

    def widths(self, shape) -> list[tuple[int, int]]:
        """``(before, after)`` of every axis of a bottom of ``shape`` (validated)."""
        p = self.block("pad_param")
        axis = canonical_axis(p.axis, len(shape), "pad_param.axis")
        padded = len(shape) - axis
        sizes = {}
        for key in ("before", "after"):
            given = list(getattr(p, key))
            if len(given) not in (0, 1, padded):
                raise ParamError(f"pad_param.{key}", f"give one size, or one for each of the {padded} padded axes, "
                                                     f"not {len(given)}")
            if any(size < 0 for size in given):
                raise ParamError(f"pad_param.{key}", f"sizes must not be negative, got {given}")
            sizes[key] = given * padded if len(given) == 1 else given or [0] * padded
        widths = [(0, 0)] * axis + list(zip(sizes["before"], sizes["after"]))
        if p.mode == "REFLECT":
            for a, (size, (before, after)) in enumerate(zip(shape, widths)):
                if max(before, after) > size - 1:
                    raise ShapeError(f"axis {a} of {size}: REFLECT pads at most {size - 1} each side, not "
                                     f"{max(before, after)}", "pad_param")
        return widths

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        return [tuple(size + before + after for size, (before, after) in zip(shape, self.widths(shape)))]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.width = self.widths(bottom[0].shape)
        self.window = tuple(slice(before, before + size) for size, (before, _) in zip(bottom[0].shape, self.width))

    def forward(self, bottom, top):
        p = self.block("pad_param")
        if p.mode == "CONSTANT":
            top[0].data[...] = p.value
            top[0].data[self.window] = bottom[0].data
        else:
            top[0].data[...] = self.xp.pad(bottom[0].data, self.width, mode=p.mode.lower())

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        mode, xp = self.block("pad_param").mode, self.xp
        grad = top[0].diff
        for axis, ((before, after), size) in enumerate(zip(self.width, bottom[0].shape)):
            if not before and not after:
                continue
            core = _along(grad, axis, before, before + size).copy()
            head, tail = _along(grad, axis, 0, before), _along(grad, axis, before + size, before + size + after)
            if mode == "EDGE":
                _along(core, axis, 0, 1)[...] += head.sum(axis=axis, keepdims=True)
                _along(core, axis, size - 1, size)[...] += tail.sum(axis=axis, keepdims=True)
            elif mode == "REFLECT":  # (position before - j was copied to j, size - 2 - j to before + size + j)
                _along(core, axis, 1, before + 1)[...] += xp.flip(head, axis=axis)
                _along(core, axis, size - 1 - after, size - 1)[...] += xp.flip(tail, axis=axis)
            grad = core
        bottom[0].diff[...] = grad


def _along(array, axis: int, start: int, stop: int):
    """The view of ``array`` from ``start`` to ``stop`` along ``axis``."""
    return array[(slice(None),) * axis + (slice(start, stop),)]
