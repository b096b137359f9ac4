"""``transform_param``: Caffe's preprocessing of each record on its way into a data layer's top.

For a record (uint8, C x H x W) the output is, in Caffe's order,
``(crop(x) - crop(mean)) * scale``, mirrored left-right when drawn: the crop
is random in TRAIN and centred in TEST, and ``mirror`` flips half the records
at random in either phase.  ``force_gray``/``force_color`` first make the
record one or three channels.  Records hold RGB (as ``netspec convert`` and
Pillow decode them); ``channel_order: BGR`` then swaps a colour record to BGR,
the order Caffe's OpenCV decoding gave the nets it trained.  ``mean_value``
and ``mean_file`` are in the net's order (R, G, B by default; B, G, R with BGR).
Random resized crops, rotations, colour jitter and random erasing (TRAIN
only) are in :mod:`netspec.data.augment`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.atomic import atomic_open
from netspec.data import augment
from netspec.data.augment import ColorJitterParams, RandomErasingParams, RandomResizedCropParams
from netspec.data.files import regular_file, writing
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
    random_resized_crop: RandomResizedCropParams | None = doc(
        None, "TRAIN: a box of random area and shape resized to crop_size, e.g. {scale: [0.08, 1]}")
    rotation: float = doc(0.0, "TRAIN: turn records by a random angle in [-rotation, rotation] degrees")
    color_jitter: ColorJitterParams | None = doc(
        None, "TRAIN: random brightness, contrast, saturation, e.g. {brightness: 0.4, contrast: 0.4, saturation: 0.4}")
    random_erasing: RandomErasingParams | None = doc(
        None, "TRAIN: blank a random box of the output, e.g. {probability: 0.5}")


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
        augment.check(params)
        training = phase == "TRAIN"
        self.resized_crop = params.random_resized_crop if training else None
        self.color_jitter = params.color_jitter if training else None
        self.random_erasing = params.random_erasing if training else None
        self.rotation = params.rotation if training else 0.0
        self.luma = LUMA[::-1] if params.channel_order == "BGR" else LUMA
        self.pixel_mean = self._pixel_mean()
        self.channel_mean = self._channel_mean(channels)

    def _pixel_mean(self) -> numpy.ndarray | None:
        p = self.params
        if p.mean_file:
            try:
                regular_file(p.mean_file)
                with open(p.mean_file, "rb") as handle:
                    if handle.read(6) != b"\x93NUMPY":  # (NumPy would speak of pickles, and of allowing them)
                        raise DataError(f"{p.mean_file}: not a .npy file" + (
                            f" but a Caffe mean: netspec convert caffe-mean {p.mean_file} -o mean.npy makes one"
                            if p.mean_file.endswith(".binaryproto") else ""))
                mean = numpy.load(p.mean_file, mmap_mode="r", allow_pickle=False)  # its shape first, then its values
            except DataError as exc:
                raise ParamError("transform_param.mean_file", str(exc)) from None
            except (OSError, ValueError) as exc:
                raise ParamError("transform_param.mean_file", f"{p.mean_file}: cannot read: {exc}") from None
            if not isinstance(mean, numpy.ndarray) or mean.dtype.kind not in "uif":
                raise ParamError("transform_param.mean_file", f"{p.mean_file}: not a .npy array of numbers")
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
        """Random choices for ``count`` records: a row each, with the columns of :data:`augment.COLUMNS`."""
        crop, (height, width), (out_height, out_width) = self.params.crop_size, self.in_shape[1:], self.out_shape[1:]
        choices = numpy.zeros((count, len(augment.COLUMNS)))
        column = augment.C
        if crop and self.phase == "TRAIN" and self.resized_crop is None:
            choices[:, column["top"]] = rng.integers(0, height - crop + 1, count)
            choices[:, column["left"]] = rng.integers(0, width - crop + 1, count)
        elif crop:
            choices[:, column["top"]], choices[:, column["left"]] = (height - crop) // 2, (width - crop) // 2
        if self.params.mirror:
            choices[:, column["mirror"]] = rng.integers(0, 2, count)
        choices[:, column["box_height"]], choices[:, column["box_width"]] = out_height, out_width
        if self.resized_crop is not None:
            box = augment.draw_boxes(rng, count, height, width, self.resized_crop.scale, self.resized_crop.ratio,
                                     ratio_is_width=True)
            boxes = [numpy.where(box[0] > 0, box[0], height), numpy.where(box[0] > 0, box[1], width)]
            choices[:, column["box_height"]], choices[:, column["box_width"]] = boxes
            choices[:, column["top"]] = augment.place(rng, boxes[0], height)
            choices[:, column["left"]] = augment.place(rng, boxes[1], width)
        if self.rotation:
            choices[:, column["angle"]] = rng.uniform(-self.rotation, self.rotation, count)
        for name in ("brightness", "contrast", "saturation"):
            amount = getattr(self.color_jitter, name) if self.color_jitter is not None else 0.0
            choices[:, column[name]] = rng.uniform(1 - amount, 1 + amount, count) if amount else 1.0
        if self.random_erasing is not None:
            erasing = self.random_erasing
            drawn = rng.uniform(0, 1, count) < erasing.probability
            heights, widths = augment.draw_boxes(rng, count, out_height, out_width, erasing.scale, erasing.ratio,
                                                 ratio_is_width=False)
            choices[:, column["erase"]] = drawn & (heights > 0)
            choices[:, column["erase_height"]], choices[:, column["erase_width"]] = heights, widths
            choices[:, column["erase_top"]] = augment.place(rng, heights, out_height)
            choices[:, column["erase_left"]] = augment.place(rng, widths, out_width)
        return choices

    def apply(self, images: numpy.ndarray, choices: numpy.ndarray, out: numpy.ndarray) -> None:
        """Write the transformed batch ``images`` (N x ``in_shape``, prepared) into ``out`` (N x ``out_shape``).

        ``choices`` come from :meth:`draw`.  Subtracting the mean before
        cropping equals Caffe's cropped mean, and lets the whole batch go at once.
        """
        if self.color_jitter is not None:
            images = images.copy()
            augment.jitter(images, choices, self.luma)
        mean = self.pixel_mean if self.pixel_mean is not None else self.channel_mean
        centred = images - numpy.asarray(mean, dtype=images.dtype)
        if self.resized_crop is not None or self.rotation:
            augment.warp(centred, choices, out)
        else:
            self._crop_and_mirror(centred, choices, out)
        out *= self.params.scale
        if self.random_erasing is not None:
            augment.erase(out, choices, self.random_erasing.value)

    def _crop_and_mirror(self, centred: numpy.ndarray, choices: numpy.ndarray, out: numpy.ndarray) -> None:
        height, width = self.out_shape[1:]
        corners = choices[:, [augment.C["top"], augment.C["left"]]].astype(numpy.int64)
        if self.params.crop_size and self.phase == "TRAIN":
            for row, (top, left) in enumerate(corners):
                out[row] = centred[row, :, top:top + height, left:left + width]
        else:
            top, left = (int(c) for c in corners[0]) if len(corners) else (0, 0)
            out[...] = centred[:, :, top:top + height, left:left + width]
        flipped = choices[:, augment.C["mirror"]].astype(bool)
        if flipped.any():
            out[flipped] = out[flipped][..., ::-1]


def save_mean(mean: numpy.ndarray, out: str) -> None:
    """Write ``mean`` to the .npy file ``out`` atomically (transform_param.mean_file reads it).

    The bytes are made in memory and written by Python: numpy.save into a file writes through C stdio,
    which loses a failed write (a full disk) without a word.
    """
    buffer = io.BytesIO()
    numpy.save(buffer, mean)
    with writing(out), atomic_open(out, "wb") as handle:
        handle.write(buffer.getvalue())
