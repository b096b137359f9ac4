"""Blob: an array of values (``data``) and of gradients (``diff``) of one shape."""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import numpy


class Held(Protocol):
    """A copy of a blob's data or diff that a fast path keeps in a layout of its own (oneDNN's channel blocks),
    and which may hold newer values than the plain array."""

    def plain_access(self, array) -> None:
        """Called before ``array`` (the plain one) is handed out: bring it up to date; from then on it is the
        array that holds the latest values (its reader may write it)."""

    def overwrite(self) -> None:
        """The plain array is about to be written whole: it holds the latest values from then on (nothing is
        copied into it)."""


class Blob:
    """Data and diff arrays of the same shape on one device.

    Layers that work in place receive the same Blob as bottom and top.  Shared
    parameters are Blobs whose arrays are views of the owner's arrays.  The
    diff is made (zeros) when it is first asked for: a net makes those its
    backward pass uses at setup, and blobs no backward pass reaches (an
    inference net's, the data's) never hold one.

    ``data`` and ``diff`` are plain C-order arrays to every reader.  Between
    layers whose fast paths compute in another layout, a net lets the blob
    hold them in that layout instead (``held_data``, ``held_diff``: see
    :class:`Held`); reading the plain array then copies the newer values back
    first.
    """

    __slots__ = ("name", "xp", "dtype", "_data", "_diff", "held_data", "held_diff")

    def __init__(self, shape, xp, dtype, name: str = "", data=None):
        """A blob of zeros, or whose data is ``data`` (an array of ``shape`` the caller owns: another blob's,
        or a view of a buffer the net shares between blobs)."""
        self.name = name
        self.xp = xp
        self.dtype = dtype
        self.held_data: Held | None = None
        self.held_diff: Held | None = None
        self._data = self._zeros(tuple(shape), "data") if data is None else self._checked(data, "data", tuple(shape))
        self._diff = None

    def _zeros(self, shape: tuple[int, ...], what: str):
        """A zero array of ``shape``; MemoryError naming the blob and the bytes when the device has no room."""
        try:
            return self.xp.zeros(shape, dtype=self.dtype)
        except MemoryError:
            asked = math.prod(shape) * numpy.dtype(self.dtype).itemsize
            raise MemoryError(f"blob '{self.name}' {list(shape)} needs {asked:,} bytes for its {what}") from None

    @property
    def data(self):
        """The values, a plain array (up to date with a held copy first)."""
        if self.held_data is not None:
            self.held_data.plain_access(self._data)
        return self._data

    @data.setter
    def data(self, array) -> None:
        """Give the blob another array for its values: a C-contiguous one of its shape and dtype on its device
        (ValueError otherwise; ``blob.data[...] = values`` copies any values that convert)."""
        if array is self._data:  # (``blob.data += x`` sets the array it read, written in place: nothing to do)
            return
        array = self._checked(array, "data", self.shape)
        if self.held_data is not None:  # (the new array holds the values now)
            self.held_data.overwrite()
        self._data = array

    def _checked(self, array, what: str, shape: tuple[int, ...]):
        """``array``, if it can be the blob's ``what`` (data or diff) of ``shape`` (a NumPy scalar, for a blob of
        no axes on the CPU, as an array); else ValueError naming the blob and what is wrong with it."""
        if isinstance(array, numpy.generic) and self.xp is numpy:  # (a Python layer's loss, say)
            array = numpy.asarray(array)
        dtype, kind = numpy.dtype(self.dtype), _kind(self.xp.ndarray)
        problem = (f"a {_kind(type(array))} where its device takes a {kind}" if not isinstance(array, self.xp.ndarray)
                   else f"a {array.dtype} array" if array.dtype != dtype
                   else f"an array of shape {list(array.shape)}" if tuple(array.shape) != shape
                   else "an array that is not C-contiguous" if not array.flags.c_contiguous else None)
        if problem is not None:
            raise ValueError(f"blob '{self.name}' takes a C-contiguous {dtype} {kind} of shape {list(shape)} for its "
                             f"{what}, got {problem} (blob.{what}[...] = values copies them in)")
        return array

    @property
    def diff(self):
        """The gradient, a plain array (made, zeros, the first time it is asked for; up to date with a held copy
        first)."""
        if self._diff is None:
            self._diff = self._zeros(self._data.shape, "diff")
        if self.held_diff is not None:
            self.held_diff.plain_access(self._diff)
        return self._diff

    @diff.setter
    def diff(self, array) -> None:
        """Give the blob another array for its gradient (as :attr:`data`'s setter)."""
        if array is self._diff and array is not None:
            return
        array = self._checked(array, "diff", self.shape)
        if self.held_diff is not None:
            self.held_diff.overwrite()
        self._diff = array

    @property
    def values(self) -> BlobArray:
        """The data as a fast path takes it: held in its layout where the blob holds it so."""
        return BlobArray(self, False)

    @property
    def gradient(self) -> BlobArray:
        """The diff as a fast path takes it: held in its layout where the blob holds it so."""
        return BlobArray(self, True)

    @property
    def has_diff(self) -> bool:
        """Whether the gradient array has been made."""
        return self._diff is not None

    @property
    def shape(self) -> tuple[int, ...]:
        """The blob's shape."""
        return tuple(self._data.shape)

    @property
    def count(self) -> int:
        """Number of elements."""
        return math.prod(self._data.shape)

    def reshape(self, shape) -> None:
        """Give the blob a new shape, reallocating only when the element count grows or shrinks."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return
        if math.prod(shape) == self.count:
            self._data = self.data.reshape(shape)
            if self._diff is not None:
                self._diff = self.diff.reshape(shape)
        else:
            self._data = self._zeros(shape, "data")
            self._diff = None
        self.held_data = self.held_diff = None  # (held in the old shape's layout)

    def share(self, owner: Blob) -> None:
        """Make this blob a view of ``owner`` (same memory for data and diff; shape kept if counts agree)."""
        shape = self.shape
        self.data = owner.data.reshape(shape)
        self.diff = owner.diff.reshape(shape)

    def shares_data(self, other: Blob) -> bool:
        """Whether this blob's data is ``other``'s own array (a Split top the net lets read its bottom's, or a sum
        written over a bottom: :attr:`netspec.engine.net.Net.aliases`)."""
        return self._data is other._data

    def share_data(self, owner: Blob) -> None:
        """Make this blob's data the same array as ``owner``'s (the diff stays its own)."""
        self.data = owner.data

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self.shape})"


def _kind(array_type: type) -> str:
    """A type's name as its library writes it (``numpy.ndarray``, ``cupy.ndarray``; ``list``)."""
    library = array_type.__module__.split(".")[0]
    return array_type.__name__ if library == "builtins" else f"{library}.{array_type.__name__}"


class BlobArray(NamedTuple):
    """One of a blob's two arrays (the diff, or the data) as a fast path reads or writes it: the copy the blob
    holds in the path's layout, when it holds one, else the plain array."""

    blob: Blob
    is_diff: bool

    @property
    def held(self) -> Held | None:
        """The copy the blob holds in a layout of its own, or None."""
        return self.blob.held_diff if self.is_diff else self.blob.held_data

    def array(self):
        """The plain array, up to date."""
        return self.blob.diff if self.is_diff else self.blob.data

    def stored(self):
        """The plain array as it stands (not brought up to date: for the held copy's own copies)."""
        blob = self.blob
        if self.is_diff and blob._diff is None:
            blob._diff = blob._zeros(blob.shape, "diff")
        return blob._diff if self.is_diff else blob._data

    def overwritten(self):
        """The plain array for a writer of every element: the held copy's values are dropped, not copied back."""
        held = self.held
        if held is not None:
            held.overwrite()
        return self.stored()
