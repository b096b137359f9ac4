"""Reading Caffe's binary ``.caffemodel`` (a NetParameter in protobuf wire format) without protobuf.

Only what weights need is decoded: each layer's name and blobs (shape and
float or double data), from current ``layer`` entries (field 100) and legacy
V1 ``layers`` entries (field 2).  Field numbers follow caffe.proto:

- NetParameter: name 1, layers 2 (V1LayerParameter), layer 100 (LayerParameter)
- LayerParameter: name 1, type 2, blobs 7;  V1LayerParameter: name 4, type 5, blobs 6
- BlobProto: num 1, channels 2, height 3, width 4, data 5, shape 7 (BlobShape: dim 1), double_data 8
"""

from __future__ import annotations

import math

import numpy

from netspec.data.files import regular_file
from netspec.errors import DataError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
MAX_AXES = 32  # of a blob's shape: Caffe's kMaxBlobAxes


def _varint(data: bytes, position: int, where: str) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if position >= len(data):
            raise DataError(f"{where}: truncated (a number runs past the end)")
        byte = data[position]
        result |= (byte & 0x7F) << shift
        position += 1
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise DataError(f"{where}: malformed number")


def fields(data: bytes, where: str):
    """``(field number, wire type, value)`` of every field of one message, in order."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position, where)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, position = _varint(data, position, where)
        elif wire == LENGTH:
            length, position = _varint(data, position, where)
            if position + length > len(data):
                raise DataError(f"{where}: truncated (field {number} wants {length} bytes, "
                                f"{len(data) - position} remain)")
            value, position = data[position:position + length], position + length
        elif wire in (FIXED32, FIXED64):
            size = 4 if wire == FIXED32 else 8
            if position + size > len(data):
                raise DataError(f"{where}: truncated")
            value, position = data[position:position + size], position + size
        else:
            raise DataError(f"{where}: not a protobuf message (wire type {wire} at byte {position})")
        yield number, wire, value


def _packed_ints(value, wire, where) -> list[int]:
    if wire == VARINT:
        return [value]
    out, position = [], 0
    while position < len(value):
        number, position = _varint(value, position, where)
        out.append(number)
    return out


def _float_bytes(number: int, wire: int, value, where: str) -> bytes:
    """The bytes of the values of a BlobProto's ``data`` (field 5, float32) or ``double_data`` (8, float64):
    packed, or one fixed-size value; any other wire type or a length that is no whole number of values is a
    DataError."""
    size, name = (4, "data") if number == 5 else (8, "double_data")
    fixed = FIXED32 if number == 5 else FIXED64
    if (wire == LENGTH and len(value) % size == 0) or wire == fixed:
        return value
    found = f"{len(value)} bytes" if wire == LENGTH else f"wire type {wire}"
    raise DataError(f"{where}: its {name} field holds no {size}-byte floats ({found})")


def read_blob(data: bytes, where: str) -> numpy.ndarray:
    """One BlobProto as an array of its shape (legacy num/channels/height/width when it has no shape).  The values'
    bytes are gathered as they come, so a blob written one value a field takes no more memory than a packed one."""
    legacy, shape, floats, doubles = {}, None, bytearray(), bytearray()
    for number, wire, value in fields(data, where):
        if number in (1, 2, 3, 4) and wire == VARINT:
            legacy[number] = value
        elif number == 7 and wire == LENGTH:
            shape = [d for n, w, v in fields(value, where) if n == 1 for d in _packed_ints(v, w, where)]
        elif number in (5, 8):
            (floats if number == 5 else doubles).extend(_float_bytes(number, wire, value, where))
    values = numpy.frombuffer(floats, "<f4") if floats else numpy.frombuffer(doubles, "<f8")
    values = values.astype(numpy.float64)
    if not numpy.isfinite(values).all():
        raise DataError(f"{where}: holds NaN or infinite values")
    if shape is not None and len(shape) > MAX_AXES:
        raise DataError(f"{where}: the blob's shape has {len(shape)} axes, more than Caffe's {MAX_AXES}")
    if shape is None:
        shape = [legacy.get(i, 1) for i in (1, 2, 3, 4)] if legacy else [values.size]
    if math.prod(shape) != values.size or any(d >= 1 << 31 for d in shape):
        raise DataError(f"{where}: the blob's shape {shape} holds {math.prod(shape)} values, "
                        f"the data has {values.size}")
    return values.reshape(shape)


MAX_MEAN_BYTES = 256 << 20  # of a mean file: ImageNet's 3 x 256 x 256 mean is 768 KB


def read_mean(path: str) -> numpy.ndarray:
    """A Caffe mean file (a .binaryproto: one BlobProto, 1 x C x H x W) as a C x H x W float32 array; DataError
    naming it when it is not one."""
    regular_file(path, MAX_MEAN_BYTES)  # (a FIFO would be waited on forever)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    mean = read_blob(data, path)
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim != 3 or not mean.size:
        raise DataError(f"{path}: not a Caffe mean image (a BlobProto of 1 x C x H x W values), but of shape "
                        f"{list(mean.shape)}")
    return mean.astype(numpy.float32)


def read_caffemodel(path: str) -> dict[str, list[numpy.ndarray]]:
    """``{layer name: [blob arrays]}`` for every layer of a .caffemodel that has blobs."""
    regular_file(path)  # (a FIFO would be waited on forever)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    layers: dict[str, list[numpy.ndarray]] = {}
    for number, wire, value in fields(data, path):
        if wire != LENGTH or number not in (2, 100):
            continue
        name_field, blob_field = (1, 7) if number == 100 else (4, 6)
        name, blobs = None, []
        for inner, inner_wire, inner_value in fields(value, path):
            if inner == name_field and inner_wire == LENGTH:
                name = inner_value.decode("utf-8", errors="replace")
            elif inner == blob_field and inner_wire == LENGTH:
                blobs.append(inner_value)
        if name is None:
            raise DataError(f"{path}: a layer without a name")
        if blobs:
            layers[name] = [read_blob(b, f"{path} layer '{name}' blob {i}") for i, b in enumerate(blobs)]
    if not layers:
        raise DataError(f"{path}: no layer with weights (is it a .caffemodel?)")
    return layers
