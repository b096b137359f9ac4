"""Concat, Slice and Split: joining blobs along an axis, cutting one apart, and fanning one out."""

from __future__ import annotations

from dataclasses import dataclass

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import doc


def _index(axis: int, start: int, stop: int):
    return (slice(None),) * axis + (slice(start, stop),)


def given_axis(block, prefix: str, legacy: str, ndim: int) -> int:
    """The axis a Concat or Slice block names: ``axis``, or Caffe's older ``concat_dim``/``slice_dim`` (a
    non-negative axis; giving both is refused, as Caffe refuses it)."""
    older = getattr(block, legacy)
    if older is None:
        return canonical_axis(block.axis, ndim, f"{prefix}.axis")
    if block.axis != 1:
        raise ParamError(f"{prefix}.{legacy}", f"give axis or {legacy}, not both")
    if not 0 <= older < ndim:
        raise ParamError(f"{prefix}.{legacy}", f"must be an axis 0 to {ndim - 1} of the {ndim}-axis bottom, "
                                               f"got {older}")
    return older


@dataclass
class ConcatParams:
    """Parameters of Concat."""

    axis: int = doc(1, "axis to join along (negative counts from the end)")
    concat_dim: int | None = doc(None, "Caffe's older name of the axis (not negative), instead of axis")


@register_layer
class Concat(Layer):
    """Concat: joins its bottoms along ``axis``; every other axis must agree.

    Bottoms: two or more.  Top: the bottoms' shape with ``axis`` summed.
    Not in place.

    Example::

        - {name: inception_out, type: Concat, bottom: [b1, b2, b3, b4], top: out}
    """

    type = "Concat"
    param_blocks = {"concat_param": ConcatParams}
    num_bottoms = (1, None)

    def top_shapes(self, bottom_shapes):
        first = bottom_shapes[0]
        axis = self.join_axis(bottom_shapes)
        for name, shape in zip(self.spec.bottoms[1:], bottom_shapes[1:]):
            if len(shape) != len(first) or any(a != b for i, (a, b) in enumerate(zip(shape, first)) if i != axis):
                raise ShapeError(f"cannot concatenate along axis {axis}: bottom '{self.spec.bottoms[0]}' is "
                                 f"{first} but '{name}' is {shape} (all axes but {axis} must agree)")
        total = sum(shape[axis] for shape in bottom_shapes)
        return [first[:axis] + (total,) + first[axis + 1:]]

    def join_axis(self, bottom_shapes) -> int:
        """The axis the bottoms join along (not negative)."""
        return given_axis(self.block("concat_param"), "concat_param", "concat_dim", len(bottom_shapes[0]))

    def boundaries(self, bottom):
        """(axis, [(start, stop)] per bottom)."""
        axis = self.join_axis([blob.shape for blob in bottom])
        spans, start = [], 0
        for blob in bottom:
            spans.append((start, start + blob.shape[axis]))
            start += blob.shape[axis]
        return axis, spans

    def forward(self, bottom, top):
        axis, spans = self.boundaries(bottom)
        for blob, (start, stop) in zip(bottom, spans):
            top[0].data[_index(axis, start, stop)] = blob.data

    def backward(self, top, propagate_down, bottom):
        axis, spans = self.boundaries(bottom)
        for blob, (start, stop), wanted in zip(bottom, spans, propagate_down):
            if wanted:
                blob.diff[...] = top[0].diff[_index(axis, start, stop)]


@dataclass
class SliceParams:
    """Parameters of Slice."""

    axis: int = doc(1, "axis to cut along (negative counts from the end)")
    slice_dim: int | None = doc(None, "Caffe's older name of the axis (not negative), instead of axis")
    slice_point: list[int] = doc([], "increasing cut positions, one fewer than the tops; none: equal parts")


@register_layer
class Slice(Layer):
    """Slice: cuts its bottom along ``axis`` at ``slice_point`` (or into equal parts).

    Bottom: any shape.  Tops: one per piece.  Not in place.

    Example::

        - name: split_pair
          type: Slice
          bottom: pair
          top: [left, right]
          slice_param: {axis: 1, slice_point: [3]}
    """

    type = "Slice"
    param_blocks = {"slice_param": SliceParams}
    num_tops = (1, None)

    def pieces(self, shape):
        """(axis, [(start, stop)] per top)."""
        p = self.block("slice_param")
        axis = given_axis(p, "slice_param", "slice_dim", len(shape))
        count, size = len(self.spec.tops), shape[axis]
        if p.slice_point:
            points = list(p.slice_point)
            if len(points) != count - 1:
                raise ShapeError(f"{len(points)} slice points for {count} tops (need {count - 1})",
                                 "slice_param.slice_point")
            if any(b <= a for a, b in zip([0] + points, points + [size])):
                raise ShapeError(f"slice points {points} must increase strictly within (0, {size})",
                                 "slice_param.slice_point")
        else:
            if size % count:
                raise ShapeError(f"axis {axis} of size {size} does not split into {count} equal parts",
                                 "slice_param.slice_point")
            points = [size // count * i for i in range(1, count)]
        edges = [0] + points + [size]
        return axis, list(zip(edges[:-1], edges[1:]))

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        axis, spans = self.pieces(shape)
        return [shape[:axis] + (stop - start,) + shape[axis + 1:] for start, stop in spans]

    def forward(self, bottom, top):
        axis, spans = self.pieces(bottom[0].shape)
        for blob, (start, stop) in zip(top, spans):
            blob.data[...] = bottom[0].data[_index(axis, start, stop)]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            axis, spans = self.pieces(bottom[0].shape)
            for blob, (start, stop) in zip(top, spans):
                bottom[0].diff[_index(axis, start, stop)] = blob.diff


@register_layer
class Split(Layer):
    """Split: copies its bottom to every top; the bottom's gradient is the sum of the tops'.

    The net inserts one wherever a blob feeds several layers, so writing it by
    hand is rarely needed.  Bottom: any shape.  Tops: copies (the bottom's data
    itself for tops no layer changes in place).  Not in place.

    Example::

        - {name: fork, type: Split, bottom: x, top: [x_a, x_b]}
    """

    type = "Split"
    takes_held = True
    fast_records = True
    num_tops = (1, None)

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]] * len(self.spec.tops)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        shape = bottom[0].shape  # copies forward, the sum of the tops' gradients backward, on every thread
        self.fast, self.fast_copy = onednn.attempt_in(self, onednn.layout_of(bottom[0].values), lambda lib, layout: (
            primitives.Sum(lib, shape, [1.0] * len(top), layout), primitives.Sum(lib, shape, [1.0], layout))
        ) or (None, None)
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)

    def forward(self, bottom, top):
        for blob in top:
            if blob.shares_data(bottom[0]):  # the net shares the bottom's data with tops nothing changes in place
                continue
            if self.fast is not None:
                self.fast_copy([bottom[0].values], blob.values)
            else:
                blob.data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and self.fast is not None:
            self.fast([blob.gradient for blob in top], bottom[0].gradient)
        elif propagate_down[0]:
            grad = bottom[0].diff
            grad[...] = top[0].diff
            for blob in top[1:]:
                grad += blob.diff
