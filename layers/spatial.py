"""Helpers shared by the 2-D spatial layers (Convolution, Pooling, LRN): geometry and window slices."""

from __future__ import annotations

from netspec.errors import ParamError, ShapeError


def hw(block, name: str, prefix: str, default: int | None = None) -> tuple[int, int]:
    """``(h, w)`` from ``name`` (one or two values) or ``<stem>_h``/``<stem>_w`` (kernel_size: kernel_h)."""
    values = getattr(block, name)
    stem = name.removesuffix("_size")
    h, w = getattr(block, f"{stem}_h"), getattr(block, f"{stem}_w")
    key = f"{prefix}.{name}"
    if h is not None or w is not None:
        if values:
            raise ParamError(key, f"give {name} or {stem}_h/{stem}_w, not both")
        if h is None or w is None:
            raise ParamError(f"{prefix}.{stem}_h", f"give both {stem}_h and {stem}_w")
        return h, w
    if not values:
        if default is None:
            raise ParamError(key, f"missing {name} (or {name}_h and {name}_w)")
        return default, default
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise ParamError(key, f"give one or two values (height, width); netspec's spatial layers are 2-D, "
                          f"got {len(values)}")


def require_4d(shape: tuple, layer_type: str) -> None:
    """Raise ShapeError unless ``shape`` is (N, C, H, W)."""
    if len(shape) != 4:
        raise ShapeError(f"{layer_type} needs a 4-axis bottom (N, C, H, W), got shape {shape}")


def window(x, *spans: tuple[int, int, int, int]):
    """The view of ``x`` that one offset of every sliding window sees (a view, so also writable).

    Each span is ``(axis, offset, stride, size)``: along ``axis``, the ``size``
    elements starting at ``offset``, ``stride`` apart; other axes are whole.
    """
    index = [slice(None)] * x.ndim
    for axis, offset, stride, size in spans:
        index[axis] = slice(offset, offset + stride * (size - 1) + 1, stride)
    return x[tuple(index)]


def pad_hw(xp, x, top: int, bottom: int, left: int, right: int, value: float = 0.0):
    """``x`` padded on its last two axes (no copy when no padding is asked)."""
    if not (top or bottom or left or right):
        return x
    n, c, h, w = x.shape
    out = xp.full((n, c, h + top + bottom, w + left + right), value, dtype=x.dtype)
    out[:, :, top:top + h, left:left + w] = x
    return out
