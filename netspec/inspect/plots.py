"""Pictures of training: curves from metrics.jsonl files, and a solver's learning-rate schedule.

matplotlib is an optional dependency (the ``plot`` extra); it is imported
only when a picture is drawn.
"""

from __future__ import annotations

import io
import itertools
import math
import os

from netspec.atomic import write_bytes
from netspec.data.files import writing
from netspec.errors import NetspecError
from netspec.solvers.lr_policies import learning_rate
from netspec.training.run_folder import event_outputs, read_metrics

MAX_POINTS = 20001
PICTURE_FORMATS = ("png", "svg", "pdf")  # what -o may name (by its extension)
LINE_STYLES = ("-", "--", ":", "-.")


def figure_grid(rows: int, columns: int, cell_size: tuple[float, float], **subplots):
    """A matplotlib Figure (no pyplot, no display needed) and its ``rows`` x ``columns`` array of axes."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise NetspecError("plotting needs matplotlib: python3 -m pip install 'netspec[plot]'") from None
    figure = Figure(figsize=(cell_size[0] * columns, cell_size[1] * rows), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False, **subplots)


def _figure(rows: int):
    """A wide Figure with ``rows`` stacked axes sharing the x axis."""
    figure, axes = figure_grid(rows, 1, cell_size=(8, 3), sharex=True)
    return figure, axes[:, 0]


def _picture_format(out: str | os.PathLike) -> str:
    """The format ``out`` names by its extension; a NetspecError naming it unless one of PICTURE_FORMATS."""
    extension = os.path.splitext(os.fspath(out))[1].lower().lstrip(".")
    if extension not in PICTURE_FORMATS:
        raise NetspecError(f"{out}: choose a .png, .svg or .pdf file")
    return extension


def _save(figure, out: str | os.PathLike, picture_format: str) -> None:
    """Write ``figure`` to ``out`` atomically, never through a link there; a NetspecError naming ``out`` when it
    cannot be written."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=picture_format, dpi=100)
    with writing(os.fspath(out)):
        write_bytes(out, buffer.getvalue())


def _number(value) -> float:
    """A metric value as a float (metrics.jsonl writes non-finite values as strings)."""
    return float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else math.nan


def _run_labels(paths: list[str]) -> list[str]:
    """Each file's run folder name, or its whole path where two runs share a name."""
    names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    return [name if names.count(name) == 1 else p for name, p in zip(names, paths)]


def plot_metrics(paths: list[str], out: str | os.PathLike):
    """Draw train loss, test outputs and learning rate against iterations, one colour per run, into ``out``.

    Returns the matplotlib Figure.
    """
    picture_format = _picture_format(out)
    runs = [read_metrics(path) for path in paths]
    for path, events in zip(paths, runs):
        if not events:
            raise NetspecError(f"{path}: no training events in the file")
    figure, (loss_axes, test_axes, lr_axes) = _figure(3)
    for label, events, colour in zip(_run_labels(paths), runs, _colours(len(runs))):
        train = [e for e in events if e["phase"] == "TRAIN"]
        loss_axes.plot([e["iter"] for e in train], [_number(e.get("smoothed_loss")) for e in train],
                       color=colour, label=label)
        tests = [e for e in events if e["phase"] == "TEST"]
        series = sorted({(e.get("test_net", 0), key) for e in tests for key in event_outputs(e)})
        for style, (net, key) in zip(itertools.cycle(LINE_STYLES), series):
            points = [(e["iter"], _number(e[key])) for e in tests if e.get("test_net", 0) == net and key in e]
            name = key if net == 0 else f"{key} (test net {net})"
            test_axes.plot(*zip(*points), linestyle=style, marker=".", color=colour, label=f"{label}: {name}")
        lr_axes.plot([e["iter"] for e in events], [_number(e.get("lr")) for e in events], color=colour, label=label)
    for axes, title in ((loss_axes, "train loss (smoothed)"), (test_axes, "test outputs"), (lr_axes, "learning rate")):
        axes.set_title(title, loc="left")
        axes.grid(alpha=0.3)
        if axes.has_data():
            axes.legend(fontsize="small")
    lr_axes.set_xlabel("iteration")
    _save(figure, out, picture_format)
    return figure


def _colours(count: int) -> list:
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return [palette(i % 10) for i in range(count)]


def schedule(params) -> tuple[list[int], list[float]]:
    """Iterations from 0 to ``max_iter`` (at most MAX_POINTS, evenly spread) and the rate at each."""
    last = params.max_iter
    count = min(last + 1, MAX_POINTS)
    iterations = sorted({round(i * last / (count - 1)) for i in range(count)} | {params.warmup_iter})
    return iterations, [learning_rate(params, it) for it in iterations]


def plot_learning_rate(params, out: str | os.PathLike, title: str) -> tuple[list[int], list[float]]:
    """Draw the rate ``params`` gives at every iteration into ``out``; return the points drawn."""
    picture_format = _picture_format(out)
    iterations, rates = schedule(params)
    figure, (axes,) = _figure(1)
    axes.plot(iterations, rates)
    axes.set_title(title, loc="left")
    axes.set_xlabel("iteration")
    axes.set_ylabel("learning rate")
    axes.grid(alpha=0.3)
    _save(figure, out, picture_format)
    return iterations, rates
