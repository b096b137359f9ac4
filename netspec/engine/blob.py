"""Blob: an array of values (``data``) and of gradients (``diff``) of one shape."""

from __future__ import annotations

import math


class Blob:
    """Data and diff arrays of the same shape on one device.

    Layers that work in place receive the same Blob as bottom and top.  Shared
    parameters are Blobs whose arrays are views of the owner's arrays.  The
    diff is made (zeros) when it is first asked for: a net makes those its
    backward pass uses at setup, and blobs no backward pass reaches (an
    inference net's, the data's) never hold one.
    """

    __slots__ = ("name", "xp", "dtype", "data", "_diff")

    def __init__(self, shape, xp, dtype, name: str = "", data=None):
        """A blob of zeros, or whose data is ``data`` (an array of ``shape`` the caller owns: another blob's,
        or a view of a buffer the net shares between blobs)."""
        self.name = name
        self.xp = xp
        self.dtype = dtype
        if data is not None and tuple(data.shape) != tuple(shape):
            raise ValueError(f"blob '{name}' is {list(shape)} but the array given for its data {list(data.shape)}")
        self.data = self._zeros(tuple(shape), "data") if data is None else data
        self._diff = None

    def _zeros(self, shape: tuple[int, ...], what: str):
        """A zero array of ``shape``; MemoryError naming the blob and the bytes when the device has no room."""
        try:
            return self.xp.zeros(shape, dtype=self.dtype)
        except MemoryError:
            asked = math.prod(shape) * self.xp.dtype(self.dtype).itemsize
            raise MemoryError(f"blob '{self.name}' {list(shape)} needs {asked:,} bytes for its {what}") from None

    @property
    def diff(self):
        """The gradient array (made, zeros, the first time it is asked for)."""
        if self._diff is None:
            self._diff = self._zeros(self.data.shape, "diff")
        return self._diff

    @diff.setter
    def diff(self, array) -> None:
        self._diff = array

    @property
    def has_diff(self) -> bool:
        """Whether the gradient array has been made."""
        return self._diff is not None

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
            if self._diff is not None:
                self._diff = self._diff.reshape(shape)
        else:
            self.data = self._zeros(shape, "data")
            self._diff = None

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
