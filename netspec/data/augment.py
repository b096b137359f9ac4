"""Augmentation beyond Caffe's crop and mirror: random resized crops, rotations, colour jitter, random erasing.

Everything works on whole batches: the random choices for a batch are drawn
at once (one row per record, see :data:`COLUMNS`), and each step transforms
every record of the batch in one pass.  The choices come from the data
layer's generator for that batch, so a batch is the same however often, and
after whatever resume, it is made.

- ``random_resized_crop`` takes a box of a random area (``scale``, a fraction
  of the record) and aspect ratio (``ratio``, width / height, drawn on a log
  scale), anywhere in the record, and resizes it to ``crop_size`` (as
  Szegedy et al. 2015 trained GoogLeNet); after 10 draws that do not fit, the
  whole record.
- ``rotation: D`` turns each record about its centre by an angle drawn
  uniformly in [-D, D] degrees; corners that come from outside the record get
  the mean (0 after subtraction).  Boxes and rotations are sampled bilinearly,
  the record's edge pixels extended by half a pixel.
- ``color_jitter`` multiplies brightness, contrast (distance from the
  record's mean grey) and saturation (distance from each pixel's grey) by
  factors drawn in [1 - x, 1 + x], in that order, on the pixel values before
  the mean is subtracted, clipped to [0, 255].
- ``random_erasing`` (Zhong et al. 2017) blanks, with ``probability``, one
  box of a random area (``scale``) and ratio (``ratio``, height / width) of
  the output to ``value`` (0: the mean), after scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy

from netspec.errors import ParamError
from netspec.spec.schema import doc

# the columns of a batch's choices, one row per record
COLUMNS = ("top", "left", "mirror", "box_height", "box_width", "angle", "brightness", "contrast", "saturation",
           "erase", "erase_top", "erase_left", "erase_height", "erase_width")
C = {name: index for index, name in enumerate(COLUMNS)}
TRIES = 10  # draws of a box before giving up on it


@dataclass
class RandomResizedCropParams:
    """A box of random area and shape, resized to crop_size (TRAIN; TEST takes the centred crop)."""

    scale: list[float] = doc([0.08, 1.0], "[min, max] area of the box, as a fraction of the record's")
    ratio: list[float] = doc([0.75, 4 / 3], "[min, max] width / height of the box")


@dataclass
class ColorJitterParams:
    """Random brightness, contrast and saturation (TRAIN)."""

    brightness: float = doc(0.0, "factor drawn in [1 - brightness, 1 + brightness]")
    contrast: float = doc(0.0, "factor drawn in [1 - contrast, 1 + contrast]")
    saturation: float = doc(0.0, "factor drawn in [1 - saturation, 1 + saturation]")


@dataclass
class RandomErasingParams:
    """Blank a random box of the output (TRAIN)."""

    probability: float = doc(0.5, "chance that a record gets a box")
    scale: list[float] = doc([0.02, 0.33], "[min, max] area of the box, as a fraction of the output's")
    ratio: list[float] = doc([0.3, 3.3], "[min, max] height / width of the box")
    value: float = doc(0.0, "the value written into the box (0: the mean, as it is subtracted)")


def check_range(key: str, values: list[float], low: float, high: float | None = None) -> None:
    """``values`` must be [min, max] with low <= min <= max (<= high)."""
    if len(values) != 2 or not low <= values[0] <= values[1] or (high is not None and values[1] > high):
        limit = f" and at most {high}" if high is not None else ""
        raise ParamError(key, f"give [min, max] with {low} <= min <= max{limit}, got {values}")


def check(params) -> None:
    """Refuse augmentation parameters out of range (``params`` is a TransformParams)."""
    if params.random_resized_crop is not None:
        if not params.crop_size:
            raise ParamError("transform_param.random_resized_crop", "needs crop_size, the size it resizes to")
        check_range("transform_param.random_resized_crop.scale", params.random_resized_crop.scale, 1e-6, 1.0)
        check_range("transform_param.random_resized_crop.ratio", params.random_resized_crop.ratio, 1e-6)
    if not 0 <= params.rotation <= 180:
        raise ParamError("transform_param.rotation", f"must be between 0 and 180 degrees, got {params.rotation}")
    jitter = params.color_jitter
    for name in ("brightness", "contrast", "saturation"):
        if jitter is not None and not 0 <= getattr(jitter, name) <= 1:
            raise ParamError(f"transform_param.color_jitter.{name}", f"must be between 0 and 1, got "
                                                                     f"{getattr(jitter, name)}")
    erasing = params.random_erasing
    if erasing is not None:
        if not 0 <= erasing.probability <= 1:
            raise ParamError("transform_param.random_erasing.probability",
                             f"must be between 0 and 1, got {erasing.probability}")
        check_range("transform_param.random_erasing.scale", erasing.scale, 1e-6, 1.0)
        check_range("transform_param.random_erasing.ratio", erasing.ratio, 1e-6)


def draw_boxes(rng: numpy.random.Generator, count: int, height: int, width: int, scale, ratio,
               ratio_is_width: bool) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Boxes of random area and aspect inside ``height`` x ``width``: (heights, widths), 0 where none fit."""
    area = rng.uniform(scale[0], scale[1], (count, TRIES)) * height * width
    aspect = numpy.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), (count, TRIES)))
    if not ratio_is_width:
        aspect = 1 / aspect
    widths = numpy.round(numpy.sqrt(area * aspect))
    heights = numpy.round(numpy.sqrt(area / aspect))
    fits = (widths >= 1) & (widths <= width) & (heights >= 1) & (heights <= height)
    first = numpy.argmax(fits, axis=1)
    found = fits[numpy.arange(count), first]
    return (numpy.where(found, heights[numpy.arange(count), first], 0),
            numpy.where(found, widths[numpy.arange(count), first], 0))


def place(rng: numpy.random.Generator, sizes: numpy.ndarray, room: int) -> numpy.ndarray:
    """A random start for each size so that it fits in ``room``."""
    return numpy.floor(rng.uniform(0, 1, len(sizes)) * (room - sizes + 1))


def jitter(images: numpy.ndarray, choices: numpy.ndarray, luma: numpy.ndarray) -> None:
    """Brightness, contrast and saturation of raw pixel values (N x C x H x W), in place."""
    def factor(name):
        return choices[:, C[name]].astype(images.dtype).reshape(-1, 1, 1, 1)

    _scale_about(images, 0.0, factor("brightness"))
    _scale_about(images, _grey(images, luma).mean(axis=(1, 2, 3), keepdims=True), factor("contrast"))
    if images.shape[1] == 3:
        _scale_about(images, _grey(images, luma), factor("saturation"))


def _grey(images: numpy.ndarray, luma: numpy.ndarray) -> numpy.ndarray:
    """The grey of each pixel (N x 1 x H x W): the luma of colour records, grey records as they are."""
    if images.shape[1] != 3:
        return images
    return numpy.tensordot(images, luma.astype(images.dtype), axes=([1], [0]))[:, None]


def _scale_about(images: numpy.ndarray, reference, factor: numpy.ndarray) -> None:
    """Multiply each record's distance from ``reference`` by its factor, in place, clipped to [0, 255]."""
    images -= reference
    images *= factor
    images += reference
    numpy.clip(images, 0, 255, out=images)


def warp(images: numpy.ndarray, choices: numpy.ndarray, out: numpy.ndarray) -> None:
    """Each record's box (rotated by its angle, mirrored when drawn) resampled bilinearly into ``out``."""
    count, channels, height, width = images.shape
    out_height, out_width = out.shape[2:]
    v = (numpy.arange(out_height) + 0.5) / out_height
    u = (numpy.arange(out_width) + 0.5) / out_width
    u = numpy.where(choices[:, C["mirror"], None] > 0, 1 - u, u)[:, None, :]  # N x 1 x W
    v = v[None, :, None]
    box_h, box_w = choices[:, C["box_height"], None, None], choices[:, C["box_width"], None, None]
    x = (u - 0.5) * box_w  # from the box centre
    y = (v - 0.5) * box_h
    angle = numpy.radians(choices[:, C["angle"], None, None])
    cos, sin = numpy.cos(angle), numpy.sin(angle)
    centre_x = choices[:, C["left"], None, None] + box_w / 2
    centre_y = choices[:, C["top"], None, None] + box_h / 2
    xs = centre_x + cos * x - sin * y - 0.5  # in pixel-centre coordinates
    ys = centre_y + sin * x + cos * y - 0.5
    # a point on the record (within half a pixel of its edge pixels) takes the nearest edge value; beyond, the mean
    on_record = (xs >= -0.5) & (xs <= width - 0.5) & (ys >= -0.5) & (ys <= height - 0.5)
    xs, ys = numpy.clip(xs, 0, width - 1), numpy.clip(ys, 0, height - 1)
    x0, y0 = numpy.floor(xs), numpy.floor(ys)
    fx, fy = (xs - x0).astype(out.dtype), (ys - y0).astype(out.dtype)
    flat = images.reshape(count, channels, height * width)
    out[...] = 0
    for dy, dx, weight in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx), (1, 0, fy * (1 - fx)),
                           (1, 1, fy * fx)):
        row, column = (y0 + dy).astype(numpy.int64), (x0 + dx).astype(numpy.int64)
        inside = (row >= 0) & (row < height) & (column >= 0) & (column < width)
        index = numpy.where(inside, row * width + column, 0).reshape(count, 1, -1)
        picked = numpy.take_along_axis(flat, numpy.broadcast_to(index, (count, channels, index.shape[2])), axis=2)
        out += picked.reshape(out.shape) * (weight * (inside & on_record))[:, None]


def erase(out: numpy.ndarray, choices: numpy.ndarray, value: float) -> None:
    """Write ``value`` into each record's erasing box, where one was drawn."""
    for row in numpy.flatnonzero(choices[:, C["erase"]] > 0):
        top, left, height, width = (int(choices[row, C[name]]) for name in
                                    ("erase_top", "erase_left", "erase_height", "erase_width"))
        out[row, :, top:top + height, left:left + width] = value
