"""Image files: decoding and encoding with Pillow, resizing, and Caffe's list files of ``path label`` lines.

Pixels are uint8 arrays in C x H x W order (one grey or three RGB channels).
"""

from __future__ import annotations

import io
import os

import numpy
from PIL import Image, UnidentifiedImageError

from netspec.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
PIL_FORMATS = {"png": "PNG", "jpg": "JPEG"}


def encode_image(image: numpy.ndarray, encoding: str, jpeg_quality: int = 95) -> bytes:
    """``image`` (uint8, C x H x W) as PNG or JPEG file bytes."""
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    buffer = io.BytesIO()
    options = {"quality": jpeg_quality} if encoding == "jpg" else {}
    Image.fromarray(numpy.ascontiguousarray(pixels)).save(buffer, format=PIL_FORMATS[encoding], **options)
    return buffer.getvalue()


def decode_image(data: bytes, where: str, channels: int | None = None, encoding: str | None = None) -> numpy.ndarray:
    """Image file bytes as uint8 C x H x W (``channels`` 1: grey, 3: RGB, None: grey stays grey).

    ``encoding`` ("png" or "jpg"), when known, spares Pillow trying other formats.
    """
    formats = (PIL_FORMATS[encoding],) if encoding else None
    try:
        with Image.open(io.BytesIO(data), formats=formats) as image:
            if channels is None:
                channels = 1 if image.mode in ("1", "L", "I;16", "I", "F") else 3
            mode = "L" if channels == 1 else "RGB"
            pixels = numpy.asarray(image if image.mode == mode else image.convert(mode))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        reason = "not an image" if isinstance(exc, UnidentifiedImageError) else f"cannot decode: {exc}"
        raise DataError(f"{where}: {reason}") from None
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


def resized(image: numpy.ndarray, size: tuple[int, int]) -> numpy.ndarray:
    """``image`` (C x H x W) resized to ``size`` (H, W) with bilinear filtering."""
    height, width = size
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
    try:
        with open(list_file, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise DataError(f"{list_file}: cannot read the list file: {exc.strerror}") from None
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
        if value < 0:
            raise DataError(f"{where}: the label {value} is negative")
        items.append((inside_root(root, relative.strip(), where), value))
    if not items:
        raise DataError(f"{list_file}: the list names no image")
    return items
