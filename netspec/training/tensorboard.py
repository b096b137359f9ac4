"""TensorBoard event files of a run: the scalars of its metrics events, written through tensorboardX.

tensorboardX is optional (the ``tensorboard`` extra) and imported only by a
run that asks for events (``netspec train --tensorboard`` or the solver's
``tensorboard: true``).  :class:`netspec.training.log.TrainingLog` hands
every event it appends to metrics.jsonl to :class:`TensorBoardEvents` too, so
the two hold the same numbers.

Tags, at the event's iteration as the step::

    lr                      the learning rate of each display event
    train/smoothed_loss     the loss averaged over average_loss iterations
    train/<output>          each output of the train net (train/loss, ...)
    test/<output>           each output of the first test net (test/accuracy, ...)
    test<K>/<output>        each output of test net K >= 1 (test1/accuracy, ...)

A tag keeps letters, digits and ``_ - . /``; tensorboardX turns any other character into ``_``.
"""

from __future__ import annotations

import os

from netspec.atomic import make_folder
from netspec.errors import EventsError, NetspecError
from netspec.training import run_folder

FLUSH_SECONDS = 5  # how often the writer flushes the event file: TensorBoard rereads a folder every 5 seconds


def summary_writer_class() -> type:
    """tensorboardX's SummaryWriter, imported on first use; NetspecError saying how to install it when missing."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise NetspecError("TensorBoard event files (--tensorboard, or tensorboard: true in the solver) need "
                           "tensorboardX: pip install -e '.[tensorboard]'") from None
    return SummaryWriter


def scalars(event: dict) -> dict[str, float]:
    """The TensorBoard tags and values of one metrics event (module docstring)."""
    if event["phase"] == "TRAIN":
        values = {"lr": event["lr"], "train/smoothed_loss": event["smoothed_loss"]}
        values.update({f"train/{name}": event[name] for name in run_folder.event_outputs(event)})
        return values
    group = f"test{event.get('test_net') or ''}"
    return {f"{group}/{name}": event[name] for name in run_folder.event_outputs(event)}


class TensorBoardEvents:
    """Writes the scalars of a run's events into an event file of ``folder`` (the run folder's tensorboard/).

    Each run (and each resumed run) adds its own file, named by the time and
    its process.  ``purge_step`` is the iteration this run starts at:
    TensorBoard hides what earlier files hold from that step on, as a
    resumed run drops the events it logs again from metrics.jsonl.

    tensorboardX writes the events from a thread of its own and flushes the
    file every ``FLUSH_SECONDS`` (its ``flush()`` would not wait for the
    events still queued), so a TensorBoard watching the folder shows the run
    as it goes; :meth:`close` writes all that is pending.
    """

    def __init__(self, folder: str, purge_step: int):
        writer_class = summary_writer_class()
        self.folder = folder
        try:
            make_folder(folder)
        except OSError as exc:
            raise NetspecError(f"cannot write TensorBoard events: {exc.strerror}") from None
        self.writer = writer_class(logdir=folder, purge_step=purge_step, flush_secs=FLUSH_SECONDS,
                                   filename_suffix=f".{os.getpid()}")

    def record(self, event: dict) -> None:
        """Add the scalars of one event at its iteration; EventsError once tensorboardX's writer thread has died
        (a full disk ends it), before its queue fills and a call blocks training for good."""
        for tag, value in scalars(event).items():
            if not self._writing():
                raise EventsError(f"{self.folder}: TensorBoard's event writer has stopped (a full disk?), so the "
                                  f"events of iteration {event['iter']} cannot be written. Training stopped")
            self.writer.add_scalar(tag, float(value), event["iter"])

    def close(self) -> None:
        """Write what is pending and close the event file (a writer that has died is left: closing it would wait
        for it forever)."""
        if self._writing():
            self.writer.close()

    def _writing(self) -> bool:
        """Whether tensorboardX's thread that writes the event file still runs (True where it cannot be seen)."""
        event_writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        worker = getattr(event_writer, "_worker", None)  # (tensorboardX 2.x's own; no public way to ask)
        return worker is None or worker.is_alive()
