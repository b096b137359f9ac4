"""The communicator a layer and the loop talk to: which rank this process is, and the collectives.

:class:`SingleProcess` is the communicator of an ordinary run.  A distributed
run passes one with the same methods over several processes
(:class:`netspec.training.distributed.MPICommunicator`); layers that need the
other ranks (a data layer's share, synchronised BatchNorm) use only these.
"""

from __future__ import annotations

import numpy


class SingleProcess:
    """The communicator of an ordinary run: one rank, every collective leaves its values as they are."""

    rank = 0
    size = 1
    seconds = 0.0

    def allreduce_mean(self, array: numpy.ndarray, what: str) -> None:
        """Replace ``array`` by its mean over the ranks: here, itself."""

    def broadcast(self, array: numpy.ndarray, what: str) -> None:
        """Give every rank rank 0's ``array``: here, nothing to do."""

    def broadcast_object(self, value, what: str):
        """Rank 0's ``value``: here, ``value``."""
        return value

    def gather_object(self, value, what: str) -> list:
        """Every rank's ``value``, in rank order (on rank 0; None elsewhere)."""
        return [value]
