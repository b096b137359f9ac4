"""``netspec compute-mean``: the per-pixel mean of a dataset's records, streamed (memory stays flat)."""

from __future__ import annotations

import io

import numpy

from netspec.atomic import atomic_open
from netspec.data.dataset import Dataset
from netspec.data.files import writing
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


def save_mean(mean: numpy.ndarray, out: str) -> None:
    """Write ``mean`` to the .npy file ``out`` atomically (transform_param.mean_file reads it).

    The bytes are made in memory and written by Python: numpy.save into a file writes through C stdio,
    which loses a failed write (a full disk) without a word.
    """
    buffer = io.BytesIO()
    numpy.save(buffer, mean)
    with writing(out), atomic_open(out, "wb") as handle:
        handle.write(buffer.getvalue())
