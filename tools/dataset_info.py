"""``netspec data inspect``: what a dataset folder holds, and a grid of sample records with their labels."""

from __future__ import annotations

import math

import numpy

from netspec.data.dataset import Dataset
from netspec.inspect.plots import figure_grid

BAR_WIDTH = 40


def describe(dataset: Dataset) -> list[str]:
    """Lines: count, shapes, dtype, encoding, source hash and a histogram of the labels."""
    m = dataset.manifest
    shapes = ", ".join("x".join(map(str, shape)) for shape in dataset.shapes)
    lines = [f"{dataset.path}: {m['backend'].upper()} dataset of {dataset.count} records",
             f"  record shape (C x H x W): {shapes}; dtype {m['dtype']}; stored {m['encoding']}",
             f"  source list sha256 {m['source_sha256'][:16]}..., converted with {m.get('options', {})}"]
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


def label_name(dataset: Dataset, label: int) -> str:
    """``label`` and its class name when the dataset has one that says more than the number."""
    names = dataset.label_names
    name = names[label] if 0 <= label < len(names) else str(label)
    return str(label) if name == str(label) else f"{label} {name}"


def sample_grid(dataset: Dataset, grid: int, out: str) -> list[int]:
    """Draw ``grid`` x ``grid`` records, evenly spaced through the dataset, into ``out``; return their indices."""
    indices = sorted(set(numpy.linspace(0, dataset.count - 1, min(grid * grid, dataset.count)).round().astype(int)))
    rows = math.ceil(len(indices) / grid)
    figure, axes = figure_grid(rows, grid, cell_size=(1.6, 1.6))
    for cell, index in zip(axes.flat, indices):
        image, label = dataset.record(int(index))
        pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
        cell.imshow(pixels, cmap="gray" if image.shape[0] == 1 else None, vmin=0, vmax=255)
        cell.set_title(label_name(dataset, label), fontsize="small")
    for cell in axes.flat:
        cell.axis("off")
    figure.savefig(out, dpi=100)
    return [int(i) for i in indices]
