"""One sample as bytes: the record format of netspec's LMDB datasets (docs/pages/concepts/file-formats.md).

A record is::

    4 bytes    header length L, unsigned little-endian
    L bytes    header, UTF-8 JSON: {"shape": [C, H, W], "dtype": "uint8", "label": 3, "encoding": "raw"}
    the rest   the payload: the array's bytes in C order ("raw"), or a PNG or JPEG file ("png", "jpg")

Records are stored under the key ``f"{index:08d}"`` (ASCII), so key order is
index order.  Nothing here is pickled: any language with JSON and an image
decoder can read and write the format.  A header is refused unless its dtype
is a number type, its shape three positive sizes of at most MAX_RECORD_VALUES
values in all, and its label an integer in int32's range.
"""

from __future__ import annotations

import json
import math
import struct

import numpy

from netspec.data.images import checked_label, decode_image, encode_image
from netspec.errors import DataError

ENCODINGS = ("raw", "png", "jpg")
KEY_DIGITS = 8
MAX_RECORD_VALUES = 1 << 28  # C x H x W: 256 MiB of uint8, three channels at Pillow's pixel limit
NUMBER_KINDS = "uif"  # the numpy.dtype kinds a record may hold: unsigned, signed, floating
_LENGTH = struct.Struct("<I")


def record_key(index: int) -> bytes:
    """The LMDB key of record ``index``."""
    return f"{index:0{KEY_DIGITS}d}".encode("ascii")


def encode_record(image: numpy.ndarray, label: int, encoding: str = "raw", jpeg_quality: int = 95) -> bytes:
    """The bytes of one record holding ``image`` (uint8, C x H x W with C 1 or 3) and ``label``."""
    if encoding == "raw":
        payload = numpy.ascontiguousarray(image).tobytes()
    else:
        payload = encode_image(image, encoding, jpeg_quality)
    return pack_record(image.shape, image.dtype, label, encoding, payload)


def pack_record(shape, dtype, label: int, encoding: str, payload: bytes) -> bytes:
    """A record from its parts (``payload`` already encoded as ``encoding`` says)."""
    header = json.dumps({"shape": [int(d) for d in shape], "dtype": numpy.dtype(dtype).name,
                         "label": int(label), "encoding": encoding}, separators=(",", ":")).encode("utf-8")
    return _LENGTH.pack(len(header)) + header + payload


def read_header(data: bytes, where: str) -> tuple[dict, memoryview]:
    """The header of a record and a view of its payload; DataError naming ``where`` if malformed."""
    view = memoryview(data)
    if len(view) < _LENGTH.size:
        raise DataError(f"{where}: bad record: {len(view)} bytes, too short for a header")
    (length,) = _LENGTH.unpack_from(view)
    try:
        header = json.loads(bytes(view[_LENGTH.size:_LENGTH.size + length]).decode("utf-8"))
        shape, dtype = tuple(int(d) for d in header["shape"]), numpy.dtype(header["dtype"])
        label, encoding = header["label"], header["encoding"]
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise DataError(f"{where}: bad record header ({type(exc).__name__}: {exc})") from None
    if encoding not in ENCODINGS or not valid_shape(shape):
        raise DataError(f"{where}: bad record header: encoding '{encoding}', shape {list(shape)} "
                        f"(expected one of {', '.join(ENCODINGS)} and [C, H, W] of at most {MAX_RECORD_VALUES} "
                        "values)")
    if dtype.kind not in NUMBER_KINDS:
        raise DataError(f"{where}: bad record header: dtype '{dtype.name}' is not a number type")
    header.update(shape=shape, dtype=dtype, label=checked_label(label, where))
    return header, view[_LENGTH.size + length:]


def valid_shape(shape) -> bool:
    """True for a record shape: three positive sizes (C, H, W) of at most MAX_RECORD_VALUES values in all."""
    return len(shape) == 3 and all(size > 0 for size in shape) and math.prod(shape) <= MAX_RECORD_VALUES


def decode_record(data: bytes, where: str) -> tuple[numpy.ndarray, int]:
    """``(image C x H x W, label)`` from a record's bytes; DataError naming ``where`` if it is damaged."""
    header, payload = read_header(data, where)
    shape, dtype = header["shape"], header["dtype"]
    if header["encoding"] == "raw":
        expected = math.prod(shape) * dtype.itemsize
        if len(payload) != expected:
            raise DataError(f"{where}: bad record: {len(payload)} payload bytes, the header's shape {list(shape)} "
                            f"of {dtype.name} needs {expected}")
        return numpy.frombuffer(payload, dtype=dtype).reshape(shape), header["label"]
    image = decode_image(bytes(payload), where, channels=shape[0], encoding=header["encoding"])
    if image.shape != shape:
        raise DataError(f"{where}: bad record: the image decodes to {list(image.shape)}, the header says "
                        f"{list(shape)}")
    return image, header["label"]
