"""``transform_param``: Caffe's preprocessing of each record on its way into a data layer's top.

For a record (uint8, C x H x W) the output is, in Caffe's order,
``(crop(x) - crop(mean)) * scale``, mirrored left-right when drawn: the crop
is random in TRAIN and centred in TEST, and ``mirror`` flips half the records
at random in either phase.  ``force_gray``/``force_color`` first make the
record one or three channels.  Records hold RGB (as ``netspec convert`` and
Pillow decode them); ``channel_order: BGR`` then swaps a colour record to BGR,
the order Caffe's OpenCV decoding gave the nets it trained.  ``mean_value``
and ``mean_file`` are in the net's order (R, G, B by default; B, G, R with BGR).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.errors import DataError, ParamError
from netspec.spec.schema import FilePath, doc

# ITU-R 601-2 luma, as Pillow's "L" conversion uses
LUMA = numpy.array([0.299, 0.587, 0.114])


@dataclass
class TransformParams:
    """Parameters of transform_param (Caffe's TransformationParameter)."""

    scale: float = doc(1.0, "multiply every value after the mean is subtracted (e.g. 0.00390625 = 1/256)")
    mirror: bool = doc(False, "flip half of the records left-right, at random")
    crop_size: int = doc(0, "take a crop_size square: random in TRAIN, centred in TEST (0: whole record)")
    mean_file: FilePath | None = doc(None, "per-pixel mean, a C x H x W .npy (netspec compute-mean)")
    mean_value: list[float] = doc([], "per-channel mean: one value for all channels, or one per channel")
    force_color: bool = doc(False, "make one-channel records three channels")
    force_gray: bool = doc(False, "make three-channel records one grey channel")
    channel_order: Literal["RGB", "BGR"] = doc("RGB", "channel order of colour records in the net: BGR for nets "
                                                      "trained in Caffe (records are RGB and get swapped)")


class Transformer:
    """Applies ``params`` to records of shape ``record_shape`` in ``phase``.

    Every check that needs the data's shape is made here, so a data layer
    can refuse a bad transform_param at shape inference.
    """

    def __init__(self, params: TransformParams, phase: str, record_shape: tuple[int, int, int]):
        self.params, self.phase = params, phase
        if params.force_color and params.force_gray:
            raise ParamError("transform_param.force_gray", "give force_color or force_gray, not both")
        if params.mean_file and params.mean_value:
            raise ParamError("transform_param.mean_value", "give mean_file or mean_value, not both")
        channels = 3 if params.force_color else 1 if params.force_gray else record_shape[0]
        self.in_shape = (channels, *record_shape[1:])
        crop = params.crop_size
        if crop < 0:
            raise ParamError("transform_param.crop_size", f"must not be negative, got {crop}")
        if crop > min(self.in_shape[1:]):
            raise ParamError("transform_param.crop_size", f"{crop} is larger than the records "
                                                          f"({self.in_shape[1]}x{self.in_shape[2]})")
        self.out_shape = (channels, crop, crop) if crop else self.in_shape
        self.pixel_mean = self._pixel_mean()
        self.channel_mean = self._channel_mean(channels)

    def _pixel_mean(self) -> numpy.ndarray | None:
        p = self.params
        if p.mean_file:
            try:
                mean = numpy.load(p.mean_file, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ParamError("transform_param.mean_file", f"{p.mean_file}: cannot read: {exc}") from None
            if mean.shape != self.in_shape:
                raise ParamError("transform_param.mean_file", f"{p.mean_file} has shape {list(mean.shape)}, "
                                                              f"the records are {list(self.in_shape)}")
            return mean.astype(numpy.float64)
        return None

    def _channel_mean(self, channels: int) -> numpy.ndarray | float:
        p = self.params
        if p.mean_value:
            if len(p.mean_value) not in (1, channels):
                raise ParamError("transform_param.mean_value", f"give 1 value or {channels} (one per channel), "
                                                               f"got {len(p.mean_value)}")
            return numpy.array(p.mean_value, dtype=numpy.float64).reshape(-1, 1, 1) * numpy.ones((channels, 1, 1))
        return 0.0

    def prepare(self, image: numpy.ndarray) -> numpy.ndarray:
        """The record (RGB or grey) with the channels force_color/force_gray ask for, in ``channel_order``."""
        if self.params.force_color and image.shape[0] == 1:
            image = numpy.repeat(image, 3, axis=0)
        if self.params.force_gray and image.shape[0] == 3:
            return numpy.tensordot(LUMA, image, axes=1)[None]
        if self.params.channel_order == "BGR" and image.shape[0] == 3:
            return image[::-1]
        return image

    def shape_error(self, image: numpy.ndarray, where: str) -> DataError:
        """The error for a prepared record (named by ``where``) whose shape is not ``in_shape``."""
        return DataError(f"{where} has shape {list(image.shape)}, but the first record's is {list(self.in_shape)}; "
                         "records must share a shape (convert with --resize)")

    def draw(self, rng: numpy.random.Generator, count: int) -> numpy.ndarray:
        """Random choices for ``count`` records: rows of (crop top, crop left, mirror)."""
        crop = self.params.crop_size
        choices = numpy.zeros((count, 3), dtype=numpy.int64)
        if crop:
            if self.phase == "TRAIN":
                choices[:, 0] = rng.integers(0, self.in_shape[1] - crop + 1, count)
                choices[:, 1] = rng.integers(0, self.in_shape[2] - crop + 1, count)
            else:
                choices[:, 0], choices[:, 1] = (self.in_shape[1] - crop) // 2, (self.in_shape[2] - crop) // 2
        if self.params.mirror:
            choices[:, 2] = rng.integers(0, 2, count)
        return choices

    def apply(self, images: numpy.ndarray, choices: numpy.ndarray, out: numpy.ndarray) -> None:
        """Write the transformed batch ``images`` (N x ``in_shape``, prepared) into ``out`` (N x ``out_shape``).

        ``choices`` come from :meth:`draw`.  Subtracting the mean before
        cropping equals Caffe's cropped mean, and lets the whole batch go at once.
        """
        mean = self.pixel_mean if self.pixel_mean is not None else self.channel_mean
        centred = images - numpy.asarray(mean, dtype=images.dtype)
        height, width = self.out_shape[1:]
        if self.params.crop_size and self.phase == "TRAIN":
            for row, (top, left) in enumerate(choices[:, :2]):
                out[row] = centred[row, :, top:top + height, left:left + width]
        else:
            top, left = (int(c) for c in choices[0, :2]) if len(choices) else (0, 0)
            out[...] = centred[:, :, top:top + height, left:left + width]
        out *= self.params.scale
        flipped = choices[:, 2].astype(bool)
        if flipped.any():
            out[flipped] = out[flipped][..., ::-1]
