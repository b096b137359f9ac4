"""Which records make each batch, and making batches ahead in a background thread.

Everything about batch ``k`` (its records and its random crops and flips) is
a pure function of the layer's seed and ``k``.  So the order does not depend
on thread timing, a resumed run only needs ``(seed, next batch)``, and
several processes can each read their share (``rank`` of ``world_size``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy

from netspec.errors import DataError


class RecordOrder:
    """The record index at every position of an endless pass over a dataset, for one of several readers.

    The pass is one stream for all ``world_size`` readers: epoch after epoch
    of the ``count`` records.  Reader ``rank`` takes the stream positions
    ``rank, rank + world_size, ...``, so the readers' batch ``k`` of ``B``
    records together are the stream's records ``k * B * world_size`` onwards,
    exactly the batch ``k`` of a single reader with batch ``B * world_size``.
    Within each epoch the readers' records are disjoint and cover the dataset.

    ``shuffle``: "none" reads in key order; "epoch" permutes the records anew
    each epoch; an integer S cuts them into blocks of S consecutive records and
    each epoch visits the blocks in a random order, shuffling within each
    (reads stay local; a streaming shuffle).
    """

    def __init__(self, count: int, seed: int, shuffle: str | int = "none", rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is not in 0..{world_size - 1}")
        if count < world_size:
            raise DataError(f"{count} records cannot be split over {world_size} processes")
        self.count, self.seed, self.shuffle, self.rank, self.world_size = count, seed, shuffle, rank, world_size
        self._epochs: dict[int, numpy.ndarray] = {}

    def epoch_order(self, epoch: int) -> numpy.ndarray:
        """Record indices in the order epoch ``epoch`` of the stream reads them."""
        if epoch not in self._epochs:
            rng = numpy.random.default_rng([self.seed, epoch])
            if self.shuffle == "none":
                order = numpy.arange(self.count)
            elif self.shuffle == "epoch":
                order = rng.permutation(self.count)
            else:
                blocks = [numpy.arange(start, min(start + self.shuffle, self.count))
                          for start in range(0, self.count, self.shuffle)]
                order = numpy.concatenate([rng.permutation(blocks[b]) for b in rng.permutation(len(blocks))])
            self._epochs = {e: o for e, o in self._epochs.items() if e >= epoch - 1}
            self._epochs[epoch] = order
        return self._epochs[epoch]

    def indices(self, start: int, count: int) -> numpy.ndarray:
        """Record indices at this reader's positions ``start .. start + count - 1``."""
        positions = self.rank + self.world_size * numpy.arange(start, start + count)
        epochs, offsets = numpy.divmod(positions, self.count)
        indices = numpy.empty(count, dtype=numpy.int64)
        for epoch in numpy.unique(epochs):
            chosen = epochs == epoch
            indices[chosen] = self.epoch_order(int(epoch))[offsets[chosen]]
        return indices


class Prefetcher:
    """Calls ``make(k)`` for k = start, start + 1, ... in a background thread, ``depth`` batches ahead.

    :meth:`next` returns the batches in order; an exception raised by
    ``make`` is raised again by :meth:`next`.  ``depth`` 0 makes each batch
    when it is asked for.  :meth:`close` stops the thread.
    """

    def __init__(self, make: Callable[[int], object], depth: int, start: int = 0):
        self.make, self.depth = make, depth
        self.thread: threading.Thread | None = None
        self.restart(start)

    def restart(self, start: int) -> None:
        """Drop what was made ahead and continue from batch ``start``."""
        self.close()
        self.next_batch = start
        if self.depth > 0:
            self.queue: queue.Queue = queue.Queue(self.depth)
            self.stopping = threading.Event()
            self.thread = threading.Thread(target=self._run, args=(start,), daemon=True, name="netspec-prefetch")
            self.thread.start()

    def _run(self, batch: int) -> None:
        while not self.stopping.is_set():
            try:
                item = (self.make(batch), None)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                item = (None, exc)
            while not self.stopping.is_set():
                try:
                    self.queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return
            batch += 1

    def next(self):
        """The next batch, in order."""
        if self.thread is None:
            result = self.make(self.next_batch)
        else:
            result, error = self.queue.get()
            if error is not None:
                self.close()
                raise error
        self.next_batch += 1
        return result

    def close(self) -> None:
        """Stop the background thread (if any) and wait for it."""
        if self.thread is not None:
            self.stopping.set()
            self.thread.join()
            self.thread = None
