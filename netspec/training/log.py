"""Where a training run reports: console lines, a live progress bar on a terminal, and metrics.jsonl."""

from __future__ import annotations

import sys

from netspec.training import run_folder
from netspec.training.tensorboard import TensorBoardEvents, summary_writer_class


def format_value(value: float) -> str:
    """A metric as the log shows it: 4 significant digits."""
    return f"{value:.4g}"


def format_outputs(results: dict[str, float], loss_weights: dict[str, float]) -> str:
    """``name = value`` pairs; a loss also shows its weighted contribution, as Caffe does."""
    parts = []
    for name, value in results.items():
        weight = loss_weights.get(name, 0.0)
        text = f"{name} = {format_value(value)}"
        if weight:
            text += f" (* {format_value(weight)} = {format_value(weight * value)} loss)"
        parts.append(text)
    return ", ".join(parts)


class TrainingLog:
    """Reports events of a run.

    Lines go to ``stream``; when it is a terminal, a live progress bar with
    the ETA (rich) sits under them.  With ``run_dir`` every display and test
    event is also appended to the run folder's metrics.jsonl (see
    :mod:`netspec.training.run_folder`), and with ``tensorboard`` its scalars
    to TensorBoard event files there (:mod:`netspec.training.tensorboard`;
    without tensorboardX that is refused here, before training).  Set
    ``iterations_per_epoch`` when the train data's size is known, and lines
    show the epoch beside the iteration.  A resumed run sets ``kept_events``
    to the events metrics.jsonl keeps from its first iteration on (see
    :func:`netspec.training.run_folder.truncate_metrics`): TensorBoard hides
    the earlier event files from that step on, so they are written again.
    """

    def __init__(self, run_dir: str | None = None, stream=None, progress: bool | None = None,
                 quiet: bool = False, tensorboard: bool = False):
        self.stream = stream or sys.stdout
        self.run_dir = run_dir
        self.quiet = quiet
        self.show_progress = self.stream.isatty() if progress is None else progress
        self.progress = None
        self.metrics = None
        self.tensorboard = tensorboard
        if self.tensorboard:
            summary_writer_class()  # a missing library is reported now, not at the first event
        self.events: TensorBoardEvents | None = None
        self.kept_events: list[dict] = []
        self.iterations_per_epoch: float | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, first_iter: int, max_iter: int) -> None:
        """Open metrics.jsonl (for appending: a resumed run adds to it), the event file and the progress bar."""
        if self.run_dir:
            self.metrics = run_folder.open_metrics(self.run_dir)
        if self.run_dir and self.tensorboard:
            self.events = TensorBoardEvents(run_folder.tensorboard_folder(self.run_dir), purge_step=first_iter)
            for event in self.kept_events:
                self.events.record(event)
        if self.show_progress and not self.quiet:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     console=Console(file=self.stream), transient=True)
            self.task = self.progress.add_task("train", total=max_iter, completed=first_iter)
            self.progress.start()

    def close(self) -> None:
        """Stop the progress bar and close metrics.jsonl and the event file."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.events is not None:
            self.events.close()
            self.events = None

    # ---- events --------------------------------------------------------------------------
    def message(self, text: str) -> None:
        """A line of text (above the progress bar on a terminal)."""
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def advance(self, iteration: int) -> None:
        """Move the progress bar to ``iteration``."""
        if self.progress is not None:
            self.progress.update(self.task, completed=iteration)

    def record(self, event: dict) -> None:
        """Append one event to metrics.jsonl, and its scalars to the event file."""
        if self.metrics is not None:
            run_folder.write_event(self.metrics, event)
        if self.events is not None:
            self.events.record(event)

    def where(self, iteration: int) -> str:
        """``iter N``, with the epoch when it is known."""
        epoch = self.epoch(iteration)
        return f"iter {iteration}" + (f" (epoch {epoch:.2f})" if epoch is not None else "")

    def epoch(self, iteration: int) -> float | None:
        """Passes over the train data completed after ``iteration`` iterations, when known."""
        return iteration / self.iterations_per_epoch if self.iterations_per_epoch else None

    def _event(self, iteration: int, phase: str, lr: float) -> dict:
        event = {"iter": iteration, "phase": phase, "lr": lr}
        if self.iterations_per_epoch:
            event["epoch"] = self.epoch(iteration)
        return event

    def train(self, iteration: int, lr: float, smoothed_loss: float, outputs: dict[str, float],
              loss_weights: dict[str, float], images_per_s: float, communication_ms: float | None = None) -> None:
        """A display event: smoothed loss, rate, speed (of all ranks together) and the train net's outputs.

        ``communication_ms``: in a distributed run, the mean time per iteration spent in collectives.
        """
        speed = f", {images_per_s:.0f} img/s" if images_per_s else ""
        if communication_ms is not None:
            speed += f" ({communication_ms:.1f} ms/iter communicating)"
        self.message(f"{self.where(iteration)}: loss = {format_value(smoothed_loss)}, lr = {lr:.6g}{speed}"
                     + (f" | {format_outputs(outputs, loss_weights)}" if outputs else ""))
        extra = {"communication_ms": communication_ms} if communication_ms is not None else {}
        self.record({**self._event(iteration, "TRAIN", lr), "smoothed_loss": smoothed_loss,
                     "images_per_s": images_per_s, **extra, **outputs})

    def test(self, iteration: int, net_index: int, lr: float, results: dict[str, float],
             loss_weights: dict[str, float], per_class: dict[str, list[float | None]] | None = None) -> None:
        """A test event: each output of test net ``net_index`` averaged over its batches, and ``per_class``
        accuracies where the net has them (:mod:`netspec.training.per_class`)."""
        label = "test" if net_index == 0 else f"test net {net_index}"
        self.message(f"{self.where(iteration)}: {label}: "
                     f"{format_outputs(results, loss_weights) or 'no scalar outputs'}")
        self.record({**self._event(iteration, "TEST", lr), **({"test_net": net_index} if net_index else {}),
                     **results, **({"per_class": per_class} if per_class else {})})

    def blob_magnitudes(self, iteration: int, magnitudes: list[tuple[str, float, float]]) -> None:
        """``--debug-info``: mean |data| and |diff| of every blob after forward and backward."""
        for name, data, diff in magnitudes:
            self.message(f"{self.where(iteration)} debug: blob {name}: mean |data| = {format_value(data)}, "
                         f"mean |diff| = {format_value(diff)}")

    def update_ratios(self, iteration: int, ratios: list[tuple[str, float, float]]) -> None:
        """``--debug-info``: each learnable blob's mean |w| and ||update|| / ||w||."""
        for name, weight, ratio in ratios:
            self.message(f"{self.where(iteration)} debug: param {name}: mean |w| = {format_value(weight)}, "
                         f"update/weight = {format_value(ratio)}")
