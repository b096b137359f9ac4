"""Flatten, Reshape and Silence: changing a blob's shape, or consuming it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.layers.data import BlobShape
from netspec.spec.schema import doc


class Reshaping(Layer):
    """Base of the layers whose top holds the bottom's values in another shape."""

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)


@dataclass
class FlattenParams:
    """Parameters of Flatten."""

    axis: int = doc(1, "first axis to flatten")
    end_axis: int = doc(-1, "last axis to flatten")


@register_layer
class Flatten(Reshaping):
    """Flatten: merges axes ``axis`` through ``end_axis`` into one.

    Bottom: any shape.  Top: e.g. (N, C, H, W) becomes (N, C*H*W).  Not in place.

    Example::

        - {name: flat, type: Flatten, bottom: pool5, top: flat}
    """

    type = "Flatten"
    param_blocks = {"flatten_param": FlattenParams}

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        p = self.block("flatten_param")
        start = canonical_axis(p.axis, len(shape), "flatten_param.axis")
        end = canonical_axis(p.end_axis, len(shape), "flatten_param.end_axis")
        if end < start:
            raise ShapeError(f"end_axis {p.end_axis} comes before axis {p.axis}", "flatten_param.end_axis")
        return [shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]]


@dataclass
class ReshapeParams:
    """Parameters of Reshape."""

    shape: BlobShape = field(default_factory=BlobShape,
                             metadata={"doc": "new dims: 0 copies the bottom's dim, -1 is inferred"})
    axis: int = doc(0, "first bottom axis replaced")
    num_axes: int = doc(-1, "how many bottom axes are replaced (-1: all from axis)")


@register_layer
class Reshape(Reshaping):
    """Reshape: the bottom's values in a new shape (Caffe's rules: 0 copies a dim, one -1 is inferred).

    Only the axes ``[axis, axis + num_axes)`` are replaced by ``shape.dim``.
    Bottom/top: same element count.  Not in place.

    Example::

        - {name: r, type: Reshape, bottom: x, top: y, reshape_param: {shape: {dim: [0, -1]}}}
    """

    type = "Reshape"
    param_blocks = {"reshape_param": ReshapeParams}

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        p = self.block("reshape_param")
        key = "reshape_param"
        start = canonical_axis(p.axis, len(shape) + 1, f"{key}.axis")
        end = len(shape) if p.num_axes == -1 else start + p.num_axes
        if p.num_axes < -1 or end > len(shape):
            raise ShapeError(f"axis {p.axis} with num_axes {p.num_axes} does not fit a {len(shape)}-axis bottom",
                             f"{key}.num_axes")
        dims = list(p.shape.dim)
        if dims.count(-1) > 1:
            raise ShapeError("at most one dim may be -1", f"{key}.shape")
        for i, d in enumerate(dims):
            if d == 0:
                if start + i >= len(shape):
                    raise ShapeError(f"dim {i} is 0 (copy) but the bottom has no axis {start + i}", f"{key}.shape")
                dims[i] = shape[start + i]
            elif d < -1:
                raise ShapeError(f"dims must be positive, 0 or -1, got {d}", f"{key}.shape")
        new = list(shape[:start]) + dims + list(shape[end:])
        total = math.prod(shape)
        if -1 in new:
            known = math.prod(d for d in new if d != -1)
            if known == 0 or total % known:
                raise ShapeError(f"cannot infer the -1 dim: {total} values do not divide by {known}", f"{key}.shape")
            new[new.index(-1)] = total // known
        if math.prod(new) != total:
            raise ShapeError(f"the bottom {shape} has {total} values but shape {tuple(new)} holds {math.prod(new)}",
                             f"{key}.shape")
        return [tuple(new)]


@register_layer
class Silence(Layer):
    """Silence: consumes bottoms so they are not net outputs; their gradient is zero.

    Bottoms: any number.  Tops: none.

    Example::

        - {name: quiet, type: Silence, bottom: unused}
    """

    type = "Silence"
    num_bottoms = (1, None)
    num_tops = (0, 0)

    def top_shapes(self, bottom_shapes):
        return []

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for blob, wanted in zip(bottom, propagate_down):
            if wanted:
                blob.diff[...] = 0
