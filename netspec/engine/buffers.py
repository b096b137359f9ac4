"""The buffers of a memory plan (:mod:`netspec.graph.memory`) on a device, and the blobs' views of flat buffers."""

from __future__ import annotations

import math

from netspec.graph.memory import Plan


class SharedBuffers:
    """The buffers ``plan`` shares between blobs (``shapes[name]`` their shapes), each made, zeros, when its
    first blob asks; ``what`` names the arrays in messages ("data", "diff")."""

    def __init__(self, plan: Plan, shapes: dict[str, tuple], xp, dtype, what: str):
        self.plan, self.shapes, self.xp, self.dtype, self.what = plan, shapes, xp, dtype, what
        self.buffers: dict[int, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.plan.buffer_of

    def view(self, name: str):
        """Blob ``name``'s array: a view of its buffer (MemoryError naming the blob when the device has no room)."""
        return flat_view(self.buffer(name), 0, self.shapes[name])

    def buffer(self, name: str):
        """The whole buffer blob ``name`` shares, flat (made, zeros, when first asked for)."""
        index = self.plan.buffer_of[name]
        if index not in self.buffers:
            size = self.plan.buffers[index]
            try:
                self.buffers[index] = self.xp.zeros(size, dtype=self.dtype)
            except MemoryError:
                raise MemoryError(f"blob '{name}' {list(self.shapes[name])} needs {size * self.dtype.itemsize:,} "
                                  f"bytes for the {self.what} buffer it shares with other blobs") from None
        return self.buffers[index]

    def nbytes(self, name: str) -> int:
        """The bytes of the buffer blob ``name`` shares."""
        return self.plan.buffers[self.plan.buffer_of[name]] * self.dtype.itemsize


def flat_view(buffer, offset: int, shape: tuple):
    """The elements of the flat ``buffer`` (or of any contiguous array, read flat) from ``offset`` on, viewed with
    ``shape``."""
    return buffer.reshape(-1)[offset:offset + math.prod(shape)].reshape(shape)
