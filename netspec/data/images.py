"""Image files: reading, decoding and encoding with Pillow, resizing, and Caffe's list files of ``path label`` lines.

Pixels are uint8 arrays in C x H x W order (one grey or three RGB channels).
An image file must be a regular file of at most MAX_IMAGE_FILE_BYTES, and an
image of more than Pillow's ``Image.MAX_IMAGE_PIXELS`` (about 89 million)
pixels is refused as a decompression bomb.  Labels are Caffe's: integers in
int32's range (:func:`checked_label`).
"""

from __future__ import annotations

import io
import os
import warnings

import numpy
from PIL import Image, UnidentifiedImageError

from netspec.data.files import one_line, read_text_lines, regular_file
from netspec.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
PIL_FORMATS = {"png": "PNG", "jpg": "JPEG"}
MAX_IMAGE_FILE_BYTES = 1 << 29  # an uncompressed RGBA image at Pillow's pixel limit needs 358 MB
LABEL_MIN, LABEL_MAX = -(1 << 31), (1 << 31) - 1


def checked_label(value, where: str) -> int:
    """``value`` (a Python or NumPy integer) as a label; DataError naming ``where`` unless it is an int32."""
    value = value.item() if isinstance(value, numpy.generic) else value
    if isinstance(value, bool) or not isinstance(value, int) or not LABEL_MIN <= value <= LABEL_MAX:
        raise DataError(f"{where}: the label {value!r} is not an integer in [{LABEL_MIN}, {LABEL_MAX}]")
    return value


def read_image_file(path: str) -> bytes:
    """The bytes of the image file ``path``; DataError naming it when it is not a readable, non-empty regular file."""
    regular_file(path, MAX_IMAGE_FILE_BYTES)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    if not data:
        raise DataError(f"{path}: empty file")
    return data


def encode_image(image: numpy.ndarray, encoding: str, jpeg_quality: int = 95) -> bytes:
    """``image`` (uint8, C x H x W) as PNG or JPEG file bytes."""
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    buffer = io.BytesIO()
    options = {"quality": jpeg_quality} if encoding == "jpg" else {}
    Image.fromarray(numpy.ascontiguousarray(pixels)).save(buffer, format=PIL_FORMATS[encoding], **options)
    return buffer.getvalue()


def decode_image(data: bytes, where: str, channels: int | None = None, encoding: str | None = None) -> numpy.ndarray:
    """Image file bytes as uint8 C x H x W (``channels`` 1: grey, 3: RGB, None: grey stays grey).

    ``encoding`` ("png" or "jpg"), when known, spares Pillow trying other formats.  Whatever Pillow raises
    on a malformed file, or on one over its pixel limit, is a DataError naming ``where``.
    """
    formats = (PIL_FORMATS[encoding],) if encoding else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # Pillow only warns up to twice the limit
            with Image.open(io.BytesIO(data), formats=formats) as image:
                if channels is None:
                    channels = 1 if image.mode in ("1", "L", "I;16", "I", "F") else 3
                mode = "L" if channels == 1 else "RGB"
                pixels = numpy.asarray(image if image.mode == mode else image.convert(mode))
    except Exception as exc:  # noqa: BLE001 - Pillow's decoders raise many types on malformed files
        reason = "not an image" if isinstance(exc, UnidentifiedImageError) else f"cannot decode: {one_line(exc)}"
        raise DataError(f"{where}: {reason}") from None
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


def resized(image: numpy.ndarray, size: tuple[int, int], keep_aspect: bool = False) -> numpy.ndarray:
    """``image`` (C x H x W) resized to ``size`` (H, W) with bilinear filtering; with ``keep_aspect`` scaled as
    one (its short side to the size's, rounded) and then cropped about its centre to ``size``."""
    height, width = size
    if keep_aspect:
        scale = max(height / image.shape[1], width / image.shape[2])
        cover = (max(height, round(image.shape[1] * scale)), max(width, round(image.shape[2] * scale)))
        scaled = resized(image, cover)
        top, left = (cover[0] - height) // 2, (cover[1] - width) // 2
        return scaled[:, top:top + height, left:left + width]
    channels = [numpy.asarray(Image.fromarray(plane).resize((width, height), Image.BILINEAR)) for plane in image]
    return numpy.stack(channels)


def inside_root(root: str, relative: str, where: str) -> str:
    """``root/relative``, refusing a path that leaves ``root``."""
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.isabs(relative) or os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) != \
            os.path.abspath(root):
        raise DataError(f"{where}: '{relative}' is outside the root folder {root}")
    return path


def read_list_file(root: str, list_file: str) -> list[tuple[str, int]]:
    """``(path, label)`` from Caffe's list file of ``relative/path label`` lines."""
    lines = read_text_lines(list_file, "the list file")
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{list_file}:{number}"
        relative, _, label = line.strip().rpartition(" ")
        if not relative:
            raise DataError(f"{where}: expected 'relative/path label', got '{line.strip()}' (no label)")
        try:
            value = int(label)
        except ValueError:
            raise DataError(f"{where}: the label '{label}' is not an integer") from None
        if not 0 <= value <= LABEL_MAX:
            raise DataError(f"{where}: the label {value} is outside [0, {LABEL_MAX}]")
        items.append((inside_root(root, relative.strip(), where), value))
    if not items:
        raise DataError(f"{list_file}: the list names no image")
    return items
