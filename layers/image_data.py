"""ImageData: batches decoded straight from image files named in a list file (Caffe's form)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from netspec.data.images import decode_image, read_image_file, read_list_file, resized
from netspec.data.transform import TransformParams
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ParamError
from netspec.layers.record_data import RecordBatches
from netspec.spec.schema import FilePath, doc, required


class ImageFiles:
    """The images of a list file as records: ``record(i)`` decodes (and resizes) file i."""

    def __init__(self, list_file: str, root: str, size: tuple[int, int] | None, color: bool):
        self.items = read_list_file(root, list_file)
        self.count, self.size, self.channels = len(self.items), size, 3 if color else 1

    def where(self, index: int) -> str:
        return self.items[index][0]

    def record(self, index: int):
        path, label = self.items[index]
        image = decode_image(read_image_file(path), path, self.channels)
        return (resized(image, self.size) if self.size else image), label

    def close(self) -> None:
        """Nothing stays open between records."""


@dataclass
class ImageDataParams:
    """Parameters of ImageData."""

    source: FilePath = required(doc="list file of 'relative/path label' lines")
    batch_size: int = required(doc="images per batch")
    root_folder: FilePath | None = doc(None, "folder the paths are relative to (default: the list file's folder)")
    new_height: int = doc(0, "resize every image to this height (0: keep; give new_width too)")
    new_width: int = doc(0, "resize every image to this width (0: keep; give new_height too)")
    is_color: bool = doc(True, "decode as RGB (false: one grey channel)")
    shuffle: bool = doc(False, "visit the images in a new random order every epoch")
    prefetch: int = doc(4, "batches decoded ahead in a background thread (0: none)")


@register_layer
class ImageData(RecordBatches):
    """ImageData: batches of images decoded from files, as Caffe's ImageData layer.

    ``source`` lists ``relative/path label`` lines; paths are relative to
    ``root_folder`` (default: the list file's folder) and may not leave it.
    Every image is decoded (Pillow), resized to ``new_height`` x
    ``new_width`` when given, and passed through ``transform_param``.  All
    images must share one shape after resizing.  A background thread decodes
    ``prefetch`` batches ahead; with ``shuffle`` each epoch has a new order,
    the same for a given seed.

    Tops: ``data`` (batch_size, C, H, W) and optionally ``label`` (batch_size).

    Example::

        - name: data
          type: ImageData
          top: [data, label]
          transform_param: {scale: 0.00390625, crop_size: 224, mirror: true}
          image_data_param: {source: train.txt, batch_size: 32, new_height: 256, new_width: 256, shuffle: true}
    """

    type = "ImageData"
    param_blocks = {"image_data_param": ImageDataParams, "transform_param": TransformParams}
    data_block = "image_data_param"

    def check_params(self):
        super().check_params()
        p = self.block("image_data_param")
        if bool(p.new_height) != bool(p.new_width) or p.new_height < 0 or p.new_width < 0:
            raise ParamError("image_data_param.new_height", "give new_height and new_width together, both positive "
                                                            f"(got {p.new_height} x {p.new_width})")

    def open_source(self):
        p = self.block("image_data_param")
        root = p.root_folder or os.path.dirname(os.path.abspath(p.source))
        size = (p.new_height, p.new_width) if p.new_height else None
        try:
            return ImageFiles(p.source, root, size, p.is_color)
        except DataError as exc:
            raise ParamError("image_data_param.source", str(exc)) from None

    def record_shape(self):
        files = self.open_source()
        try:
            return tuple(files.record(0)[0].shape)
        except DataError as exc:
            raise ParamError("image_data_param.source", str(exc)) from None

    def shuffle_mode(self):
        return "epoch" if self.block("image_data_param").shuffle else "none"
