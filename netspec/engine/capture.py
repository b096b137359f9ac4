"""CUDA graphs: device work captured once and launched again, with none of its Python run again.

A static net asks the GPU for the same work at every iteration: the same
kernels on the same arrays.  Where a small net's time is the host's (Python
and one launch per kernel), capturing that work once as a CUDA graph and
launching the graph each iteration leaves the host one call.  A graph keeps
what each call had at the capture (array addresses, numbers, cuBLAS's alpha
and beta), so:

- the arrays the work uses keep their memory from launch to launch: those made
  before the capture stay where they are, and those made during it come from a
  memory pool of the graph's own, which nothing else takes from;
- values that change between launches are read from device memory written
  before each launch: the learning rates (the optimizer's), and the offsets of
  the random draws (:class:`Recording`), from the same counts an eager pass
  would use, so that a graphed run draws what an eager one does;
- nothing in the work reads the device on the host or copies to it (CUDA
  refuses both while a stream captures): data layers copying batches from the
  host run before each launch, outside the graph.

The checks the work defers (:meth:`netspec.engine.backend.Backend.check_later`)
are noted again at each launch, so a bad label in any launch is raised at the
next read, as it is eagerly.  The backend's work must run on a stream that
can capture (:meth:`Graph.stream_for`): the null stream cannot.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy

from netspec.errors import first_line

OFFSET_SLOTS = 1024  # random draws a captured stretch of work may make


class CaptureError(Exception):
    """Work that could not be captured: the message says why, in a line."""


class Recording:
    """What a capture notes on its backend as the work asks for it (``backend.capture`` while it runs): the
    random draws, each one's offset to be read from a slot of :attr:`table` (filled before each launch), and the
    deferred checks."""

    def __init__(self, backend):
        self.table = backend.xp.zeros(OFFSET_SLOTS, dtype=numpy.uint64)  # (made before the capture)
        self.draws: list[str] = []  # the stream of each draw, in order
        self.offsets: list[int] = []  # each draw's offset at the capture: the first launch's
        self.checks: list[tuple] = []  # (number, describe, marks) of each deferred check

    def draw(self, name: str, offset: int):
        """The slot (a 0-d device array) a draw of stream ``name`` reads its offset from; ``offset`` is its
        value for the launch the capture stands for."""
        slot = len(self.draws)
        if slot == OFFSET_SLOTS:
            raise CaptureError(f"it makes more than {OFFSET_SLOTS} random draws")
        self.draws.append(name)
        self.offsets.append(offset)
        return self.table[slot]


class Graph:
    """``work()`` captured on ``backend`` (its result kept in :attr:`result`: device arrays each launch writes
    again), launched with :meth:`launch`.

    The capture does none of the work: the first launch does the work of the pass the capture stands for (the
    random draws counted as it asked for them), each later one the next pass's.  Whatever the work raises, the
    capture ends, the backend's draw counts go back to what they were, and CaptureError says what was
    refused; the work then runs again eagerly as if never captured (host state the work changed apart).
    """

    def __init__(self, backend, work: Callable[[], object]):
        xp = backend.xp
        self.backend = backend
        stream = xp.cuda.get_current_stream()
        self.pool = xp.cuda.MemoryPool()  # (the graph's own: kept while the graph lives)
        recording = Recording(backend)
        draws = dict(backend.draws)
        backend.capture = recording
        try:
            with xp.cuda.using_allocator(self.pool.malloc):
                stream.begin_capture()
                try:
                    self.result = work()
                finally:
                    graph = _end_capture(stream)
            if graph is None:
                raise CaptureError("CUDA ended the capture without a graph (invalidated, or not instantiated)")
        except Exception as exc:  # (CUDA's refusals come as RuntimeError, NotImplementedError, CUDARuntimeError...)
            backend.draws = draws
            if isinstance(exc, CaptureError):
                raise
            raise CaptureError(f"{type(exc).__name__}: {first_line(exc)}") from exc
        finally:
            backend.capture = None
        self.graph, self.recording, self._pending = graph, recording, recording.offsets
        backend.graph_pools.append(self.pool)

    def launch(self) -> None:
        """Do the work again: its draws' offsets written first (the next draws of each stream, counted), its
        deferred checks noted, then the graph launched, all on the current stream."""
        recording, backend = self.recording, self.backend
        offsets, self._pending = self._pending, None
        if offsets is None:
            offsets = [backend.next_offset(name) for name in recording.draws]
        if offsets:
            backend.upload(numpy.array(offsets, dtype=numpy.uint64), recording.table[:len(offsets)])
        backend.note_checks(recording.checks)
        self.graph.launch()

    @staticmethod
    def stream_for(backend):
        """Make a stream that can capture the current one of this thread (after waiting for the work queued on
        the one before, which it does not wait for), unless the current one can already; return it."""
        xp = backend.xp
        current = xp.cuda.get_current_stream()
        if current.ptr not in (0, 1, 2):  # (the default streams: CUDA's null one, legacy or per thread)
            return current
        backend.synchronize()
        stream = xp.cuda.Stream(non_blocking=True)
        stream.use()
        return stream


def _end_capture(stream):
    """End the capture on ``stream``: its graph, or None where CUDA invalidated it."""
    try:
        return stream.end_capture()
    except RuntimeError:  # (CUDA's cudaErrorStreamCaptureInvalidated: what was refused is the error to give)
        return None

