"""Blob: an array of values (``data``) and of gradients (``diff``) of one shape."""

from __future__ import annotations

import math


class Blob:
    """Data and diff arrays of the same shape on one device.

    Layers that work in place receive the same Blob as bottom and top.  Shared
    parameters are Blobs whose arrays are views of the owner's arrays.
    """

    __slots__ = ("name", "xp", "dtype", "data", "diff")

    def __init__(self, shape, xp, dtype, name: str = ""):
        self.name = name
        self.xp = xp
        self.dtype = dtype
        try:
            self.data = xp.zeros(tuple(shape), dtype=dtype)
            self.diff = xp.zeros(tuple(shape), dtype=dtype)
        except MemoryError:
            asked = 2 * math.prod(shape) * xp.dtype(dtype).itemsize
            raise MemoryError(f"blob '{name}' {list(shape)} needs {asked:,} bytes (data and diff)") from None

    @property
    def shape(self) -> tuple[int, ...]:
        """The blob's shape."""
        return tuple(self.data.shape)

    @property
    def count(self) -> int:
        """Number of elements."""
        return math.prod(self.data.shape)

    def reshape(self, shape) -> None:
        """Give the blob a new shape, reallocating only when the element count grows or shrinks."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return
        if math.prod(shape) == self.count:
            self.data = self.data.reshape(shape)
            self.diff = self.diff.reshape(shape)
        else:
            self.data = self.xp.zeros(shape, dtype=self.dtype)
            self.diff = self.xp.zeros(shape, dtype=self.dtype)

    def share(self, owner: Blob) -> None:
        """Make this blob a view of ``owner`` (same memory for data and diff; shape kept if counts agree)."""
        shape = self.shape
        self.data = owner.data.reshape(shape)
        self.diff = owner.diff.reshape(shape)

    def share_data(self, owner: Blob) -> None:
        """Make this blob's data the same array as ``owner``'s (the diff stays its own)."""
        self.data = owner.data

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self.shape})"
