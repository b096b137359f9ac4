"""``netspec compute-mean``: the per-pixel mean of a dataset's records, streamed (memory stays flat)."""

from __future__ import annotations

import numpy

from netspec.data.dataset import Dataset
from netspec.errors import DataError


def compute_mean(path: str, advance=lambda: None) -> numpy.ndarray:
    """The mean record (float32, C x H x W) of the dataset folder ``path``; ``advance`` is called per record."""
    dataset = Dataset(path)
    try:
        if len(dataset.shapes) != 1:
            raise DataError(f"{path}: records of {len(dataset.shapes)} shapes have no per-pixel mean; convert with "
                            "--resize so that they share one")
        total = numpy.zeros(dataset.shapes[0], dtype=numpy.float64)
        for image, _ in dataset.records():
            total += image
            advance()
    finally:
        dataset.close()
    return (total / dataset.count).astype(numpy.float32)

