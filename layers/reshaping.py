"""Flatten, Reshape, Permute, Tile and Silence: changing a blob's shape or axis order, repeating it, or consuming
it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.data import BlobShape
from netspec.spec.schema import doc, required


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

    Bottom: any shape.  Top: e.g. (N, C, H, W) becomes (N, C*H*W); with
    ``end_axis`` just before ``axis`` nothing merges and an axis of 1 comes
    in at ``axis``, as in Caffe.  Not in place.

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
        if end < start - 1:  # (Caffe's: end_axis just before axis flattens nothing, inserting an axis of 1)
            raise ShapeError(f"end_axis {p.end_axis} comes before axis {p.axis} - 1", "flatten_param.end_axis")
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


@dataclass
class PermuteParams:
    """Parameters of Permute (as in the SSD branch of Caffe)."""

    order: list[int] = doc([], "the bottom's axes in the top's order; axes left out follow in their order")


@register_layer
class Permute(Layer):
    """Permute: ``y = x.transpose(order)``, the axes in a new order (``[0, 2, 3, 1]``: NCHW to NHWC).

    Bottom: any shape.  Top: the bottom's axes in ``order``.  Not in place.

    Example::

        - {name: loc_perm, type: Permute, bottom: loc, top: loc_perm, permute_param: {order: [0, 2, 3, 1]}}
    """

    type = "Permute"
    param_blocks = {"permute_param": PermuteParams}

    def axes(self, ndim: int) -> tuple[int, ...]:
        """The full, validated order of the axes."""
        order = [canonical_axis(axis, ndim, "permute_param.order") for axis in self.block("permute_param").order]
        if len(set(order)) != len(order):
            raise ParamError("permute_param.order", f"names an axis twice: {order}")
        return tuple(order) + tuple(axis for axis in range(ndim) if axis not in order)

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        return [tuple(shape[axis] for axis in self.axes(len(shape)))]

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.transpose(self.axes(bottom[0].data.ndim))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            order = self.axes(bottom[0].data.ndim)
            bottom[0].diff[...] = top[0].diff.transpose(tuple(order.index(axis) for axis in range(len(order))))


@dataclass
class TileParams:
    """Parameters of Tile."""

    axis: int = doc(1, "the axis repeated")
    tiles: int = required(doc="how many copies of the bottom follow one another along ``axis`` (Caffe: required)")


@register_layer
class Tile(Layer):
    """Tile: the bottom repeated ``tiles`` times along ``axis``, copies one after another (``numpy.tile``).

    Bottom: any shape.  Top: the same with ``axis`` ``tiles`` times longer.
    The gradient sums the copies'.  Not in place.

    Example::

        - {name: tiled, type: Tile, bottom: gate, top: tiled, tile_param: {axis: 1, tiles: 64}}
    """

    type = "Tile"
    param_blocks = {"tile_param": TileParams}

    def top_shapes(self, bottom_shapes):
        p = self.block("tile_param")
        shape = list(bottom_shapes[0])
        axis = canonical_axis(p.axis, len(shape), "tile_param.axis")
        if p.tiles < 1:
            raise ParamError("tile_param.tiles", f"must be at least 1, got {p.tiles}")
        shape[axis] *= p.tiles
        return [tuple(shape)]

    def split(self, shape) -> tuple[int, int, int]:
        """``(outer, tiles, inner)``: a top viewed as the copies of the bottom along ``axis``."""
        p = self.block("tile_param")
        axis = canonical_axis(p.axis, len(shape), "tile_param.axis")
        return math.prod(shape[:axis]), p.tiles, math.prod(shape[axis:])

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.copies = outer, tiles, inner = self.split(bottom[0].shape)
        # on oneDNN: one copy on every thread from the bottom read again for each tile (a stride of 0)
        self.fast = onednn.attempt(self, lambda lib: primitives.Copy(lib, self.copies, (inner, 0, 1),
                                                                   (tiles * inner, inner, 1)))

    def forward(self, bottom, top):
        outer, tiles, inner = self.copies
        if self.fast is not None:
            self.fast(bottom[0].data, top[0].data)
        else:
            self.xp.copyto(top[0].data.reshape(outer, tiles, inner), bottom[0].data.reshape(outer, 1, inner))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:  # (the sum written into the diff, a view of it: no temporary)
            outer, tiles, inner = self.copies
            top[0].diff.reshape(outer, tiles, inner).sum(axis=1, out=bottom[0].diff.reshape(outer, inner))


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
