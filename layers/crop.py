"""Crop: cut a bottom down to a second bottom's shape from some axis on, at given offsets (FCN's score crops)."""

from __future__ import annotations

from dataclasses import dataclass

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer, canonical_axis
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import doc


@dataclass
class CropParams:
    """Parameters of Crop (Caffe's CropParameter)."""

    axis: int = doc(2, "the first axis cropped; the axes before it keep the first bottom's size")
    offset: list[int] = doc([], "where the crop starts: one offset for every cropped axis, or one each "
                                "(default 0)")


@register_layer
class Crop(Layer):
    """Crop: ``y = x[..., o_a : o_a + R_a, ...]`` over axes ``a >= axis``, R being the reference's shape.

    Bottoms: x, and a reference whose shape the top takes from ``axis`` on
    (its values are not used, and it receives no gradient).  Top: x's axes
    before ``axis``, the reference's after.  x's gradient is the top's in the
    cropped window and zero elsewhere.  Not in place.

    Example (FCN: the upsampled scores cut to the image)::

        - {name: score, type: Crop, bottom: [upscore, data], top: score, crop_param: {axis: 2, offset: 19}}
    """

    type = "Crop"
    param_blocks = {"crop_param": CropParams}
    num_bottoms = (2, 2)
    label_bottoms = (1,)

    def window(self, x_shape, reference_shape) -> tuple[slice, ...]:
        """The index of the cropped window in x (validated)."""
        p = self.block("crop_param")
        if len(x_shape) != len(reference_shape):
            raise ShapeError(f"the bottoms must have as many axes: {tuple(x_shape)} and {tuple(reference_shape)}")
        axis = canonical_axis(p.axis, len(x_shape), "crop_param.axis")
        cropped = len(x_shape) - axis
        if len(p.offset) not in (0, 1, cropped):
            raise ParamError("crop_param.offset", f"give one offset, or one for each of the {cropped} cropped "
                                                  f"axes, not {len(p.offset)}")
        offsets = list(p.offset) * cropped if len(p.offset) == 1 else list(p.offset) or [0] * cropped
        index = [slice(None)] * axis
        for a, offset in zip(range(axis, len(x_shape)), offsets):
            if offset < 0 or offset + reference_shape[a] > x_shape[a]:
                raise ShapeError(f"axis {a}: a crop of {reference_shape[a]} at offset {offset} does not fit in "
                                 f"{x_shape[a]} (bottom shape {tuple(x_shape)})", "crop_param.offset")
            index.append(slice(offset, offset + reference_shape[a]))
        return tuple(index)

    def top_shapes(self, bottom_shapes):
        x, reference = bottom_shapes
        window = self.window(x, reference)
        return [tuple(size if part == slice(None) else part.stop - part.start for size, part in zip(x, window))]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.cut = self.window(bottom[0].shape, bottom[1].shape)
        window = bottom[0].data[self.cut]  # (on oneDNN: a copy of the window on every thread, either way)
        strides = primitives.element_strides
        self.fast, self.fast_back = onednn.attempt(self, lambda lib: (
            primitives.Copy(lib, window.shape, strides(window), strides(top[0].data)),
            primitives.Copy(lib, window.shape, strides(top[0].data), strides(window)))
        ) or (None, None)

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast(bottom[0].data[self.cut], top[0].data)
        else:
            top[0].data[...] = bottom[0].data[self.cut]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 0
            if self.fast_back is not None:
                self.fast_back(top[0].diff, bottom[0].diff[self.cut])
            else:
                bottom[0].diff[self.cut] = top[0].diff
