"""``netspec data inspect``: what a dataset folder holds, a grid of sample records with their labels, the full check.

The full check (``--verify``) reads every record in a child process: liblmdb
meets some damaged pages with a failed assertion that aborts the process
reading them, and that must not be the one that reports it.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import signal
import tempfile

import numpy

from netspec.atomic import atomic_path
from netspec.data.dataset import Dataset, shapes_text
from netspec.data.files import one_line, writing
from netspec.data.transform import Transformer, TransformParams
from netspec.engine.registry import layer_schemas
from netspec.errors import DataError, NetspecError
from netspec.graph.compiler import included
from netspec.inspect.plots import figure_grid
from netspec.spec.net_spec import NetState, parse_net

BAR_WIDTH = 40


def options_text(options: dict | None) -> str:
    """How a dataset was converted, as ``key value`` pairs (a switch by its name alone; settings not used left
    out)."""
    parts = []
    for key, value in (options or {}).items():
        if value is True:
            parts.append(key)
        elif isinstance(value, list):
            parts.append(f"{key} {'x'.join(map(str, value))}")
        elif value is not None and value is not False:
            parts.append(f"{key} {value}")
    return ", ".join(parts) or "no settings recorded"


def describe(dataset: Dataset) -> list[str]:
    """Lines: count, shapes, dtype, encoding, source hash and a histogram of the labels."""
    m = dataset.manifest
    lines = [f"{dataset.path}: {m['backend'].upper()} dataset of {dataset.count} records",
             f"  record shape (C x H x W): {shapes_text(dataset.shapes)}; dtype {m['dtype']}; stored {m['encoding']}",
             f"  source list sha256 {m['source_sha256'][:16]}..., converted with {options_text(m.get('options'))}"]
    counts = {int(label): count for label, count in m["label_counts"].items()}
    if counts:
        lines.append(f"  labels ({len(counts)}):")
        largest = max(counts.values())
        width = max(len(label_name(dataset, label)) for label in counts)
        count_width = len(str(largest))
        for label, count in sorted(counts.items()):
            bar = "#" * max(1, round(BAR_WIDTH * count / largest))
            lines.append(f"    {label_name(dataset, label).ljust(width)}  {count:>{count_width}}  {bar}")
    return lines


def verify_in_child(dataset: Dataset, advance=lambda: None) -> None:
    """:meth:`Dataset.verify` in a child process, calling ``advance`` once per record read.

    Its DataError is raised here; a child that dies (liblmdb's abort on a damaged page) is a DataError
    naming the record it was reading, with the last line the child wrote on stderr.
    """
    context = multiprocessing.get_context("spawn")  # a fresh process: LMDB environments do not survive fork()
    receiver, sender = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile() as stderr:
        child = context.Process(target=_verify_child, args=(dataset.path, sender, stderr.name))
        child.start()
        sender.close()
        reached, problem = 0, None
        with receiver:
            while (message := _receive(receiver)) is not None:
                if message is True:
                    reached += 1
                    advance()
                else:
                    problem = message
        child.join()
        last_words = stderr.read().decode(errors="replace").strip().splitlines()[-1:]
    if problem is not None:
        raise DataError(problem)
    if child.exitcode:
        death = f"killed the reader ({signal.Signals(-child.exitcode).name})" if child.exitcode < 0 else \
            f"stopped the reader (exit status {child.exitcode})"
        raise DataError(f"{dataset.where(reached)}: damaged: reading it {death}" +
                        "".join(f": {one_line(line)}" for line in last_words))


def _receive(receiver):
    """The next message from the child, or None when it has gone."""
    try:
        return receiver.recv()
    except EOFError:
        return None


def _verify_child(path: str, sender, stderr: str) -> None:
    """In the child: verify ``path``, sending True per record and the DataError's message if there is one."""
    os.dup2(os.open(stderr, os.O_WRONLY), 2)  # liblmdb's last words, for the parent to quote
    try:
        dataset = Dataset(path)
        dataset.verify(lambda: sender.send(True))
    except DataError as exc:
        sender.send(str(exc))


def label_name(dataset: Dataset, label: int) -> str:
    """``label`` and its class name when the dataset has one that says more than the number."""
    names = dataset.label_names
    name = names[label] if 0 <= label < len(names) else str(label)
    return str(label) if name == str(label) else f"{label} {name}"


def spread(dataset: Dataset, count: int) -> list[int]:
    """Up to ``count`` record indices, evenly spaced through the dataset."""
    return sorted({int(i) for i in numpy.linspace(0, dataset.count - 1, min(count, dataset.count)).round()})


def show(cell, image: numpy.ndarray, title: str) -> None:
    """Draw a C x H x W image of pixel values (0-255) into a grid cell."""
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    cell.imshow(numpy.clip(pixels, 0, 255).astype(numpy.uint8), cmap="gray" if image.shape[0] == 1 else None,
                vmin=0, vmax=255)
    cell.set_title(title, fontsize="small")


def save_grid(figure, axes, out: str) -> None:
    """Write the grid of samples to ``out`` atomically (in the format its extension names), cells without axes."""
    for cell in axes.flat:
        cell.axis("off")
    with writing(out), atomic_path(out) as temporary:
        figure.savefig(temporary, dpi=100, format=os.path.splitext(out)[1][1:] or "png")


def sample_grid(dataset: Dataset, grid: int, out: str) -> list[int]:
    """Draw ``grid`` x ``grid`` records, evenly spaced through the dataset, into ``out``; return their indices."""
    indices = spread(dataset, grid * grid)
    figure, axes = figure_grid(math.ceil(len(indices) / grid), grid, cell_size=(1.6, 1.6))
    for cell, index in zip(axes.flat, indices):
        image, label = dataset.record(index)
        show(cell, image, label_name(dataset, label))
    save_grid(figure, axes, out)
    return indices


def train_transform(net_file: str) -> TransformParams:
    """The transform_param of the TRAIN data layer of a net file."""
    spec = parse_net(net_file, layer_schemas())
    state = NetState(phase="TRAIN", stage=list(spec.state.stage), level=spec.state.level)
    for layer in spec.layers:
        if not layer.bottoms and included(layer, state) and "transform_param" in layer.blocks:
            return layer.blocks["transform_param"]
    raise NetspecError(f"{net_file}: no TRAIN data layer with a transform_param")


def augmented_grid(dataset: Dataset, params: TransformParams, rows: int, draws: int, out: str,
                   seed: int = 0) -> list[int]:
    """Draw ``rows`` records, each as stored and as ``draws`` TRAIN transforms, into ``out``; return the indices.

    Shown as pixels: the mean and scale are left out, and BGR is shown as RGB.
    """
    shown = dataclasses.replace(params, mean_file=None, mean_value=[], scale=1.0, channel_order="RGB")
    indices = spread(dataset, rows)
    first, _ = dataset.record(indices[0])
    transform = Transformer(shown, "TRAIN", first.shape)
    figure, axes = figure_grid(len(indices), draws + 1, cell_size=(1.6, 1.6))
    images = numpy.empty((len(indices), *transform.in_shape), dtype=numpy.float32)
    labels = []
    for row, index in enumerate(indices):
        record, label = dataset.record(index)
        labels.append(label)
        image = transform.prepare(record)
        if image.shape != transform.in_shape:
            raise transform.shape_error(image, dataset.where(index))
        images[row] = image
    rng = numpy.random.default_rng(seed)
    batches = []
    for _ in range(draws):
        batch = numpy.empty((len(indices), *transform.out_shape), dtype=numpy.float32)
        transform.apply(images, transform.draw(rng, len(indices)), batch)
        batches.append(batch)
    for row, label in enumerate(labels):
        show(axes[row, 0], images[row], label_name(dataset, label))
        for column, batch in enumerate(batches, 1):
            show(axes[row, column], batch[row], f"draw {column}")
    save_grid(figure, axes, out)
    return indices
