"""ArgMax: indices (or values) of the top k entries."""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.spec.schema import doc


@dataclass
class ArgMaxParams:
    """Parameters of ArgMax."""

    out_max_val: bool = doc(False, "also output the values (without axis) or only the values (with axis)")
    top_k: int = doc(1, "how many of the largest entries")
    axis: int | None = doc(None, "axis to search; default: all but the first, per instance")


@register_layer
class ArgMax(Layer):
    """ArgMax: the indices of the ``top_k`` largest entries, largest first; of equal entries the one of the larger
    index first (Caffe's order).

    Without ``axis`` each instance (all axes after the first, flattened) is
    searched and the top is (N, 1, top_k), or (N, 2, top_k) with indices then
    values when ``out_max_val``, followed by axes of 1 up to the bottom's
    count (a 4-axis bottom gives (N, 1, top_k, 1)), as Caffe shapes it.
    With ``axis`` that axis shrinks to ``top_k`` and holds indices, or the
    values when ``out_max_val``.  No gradient.

    Example::

        - {name: pred, type: ArgMax, bottom: prob, top: pred, argmax_param: {top_k: 5}}
    """

    type = "ArgMax"
    param_blocks = {"argmax_param": ArgMaxParams}

    def top_shapes(self, bottom_shapes):
        p = self.block("argmax_param")
        shape = bottom_shapes[0]
        if p.axis is not None:
            axis = canonical_axis(p.axis, len(shape), "argmax_param.axis")
            self.check_k(shape[axis])
            return [shape[:axis] + (p.top_k,) + shape[axis + 1:]]
        self.check_k(math.prod(shape[1:]))
        return [(shape[0], 2 if p.out_max_val else 1, p.top_k) + (1,) * (len(shape) - 3)]

    def check_k(self, size: int) -> None:
        """top_k must be between 1 and the searched size."""
        k = self.block("argmax_param").top_k
        if not 1 <= k <= size:
            raise ParamError("argmax_param.top_k", f"must be between 1 and {size}, got {k}")

    def forward(self, bottom, top):
        xp = self.xp
        p = self.block("argmax_param")
        x = bottom[0].data
        if p.axis is not None:
            axis = canonical_axis(p.axis, x.ndim, "argmax_param.axis")
            index = largest_first(xp, x, axis).take(xp.arange(p.top_k), axis=axis)
            top[0].data[...] = xp.take_along_axis(x, index, axis=axis) if p.out_max_val else index
            return
        flat = x.reshape(x.shape[0], -1)
        index = largest_first(xp, flat, 1)[:, :p.top_k]
        out = top[0].data.reshape(x.shape[0], -1, p.top_k)
        out[:, 0] = index
        if p.out_max_val:
            out[:, 1] = xp.take_along_axis(flat, index, axis=1)


def largest_first(xp, x, axis: int):
    """The indices along ``axis`` that sort ``x`` from the largest, equal values the larger index first (Caffe's
    ``std::greater`` on (value, index) pairs): a stable sort of the axis reversed, mapped back."""
    size = x.shape[axis]
    return size - 1 - xp.argsort(-xp.flip(x, axis=axis), axis=axis, kind="stable")
