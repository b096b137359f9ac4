"""``netspec convert digits``: scikit-learn's bundled 8x8 handwritten digits as HDF5 train/test sets.

The data ships inside scikit-learn (1,797 images of 10 classes, 0-16 grey
levels), so the quickstart needs no download.  The split is fixed: 36 images
of each class form the test set (360), the rest the training set (1,437).
Pixels are scaled to [0, 1]; labels are the digit values.
"""

from __future__ import annotations

import numpy

from netspec.data.hdf5 import write_splits
from netspec.errors import DataError

TEST_PER_CLASS = 36
SPLIT_SEED = 0


def load_digits():
    """``(images (N, 1, 8, 8) float32 in [0, 1], labels (N,) float32)`` from scikit-learn."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError("the digits dataset ships with scikit-learn: pip install -e '.[examples]'") from None
    digits = sklearn_digits()
    images = (digits.images / 16.0).astype(numpy.float32)[:, None]
    return images, digits.target.astype(numpy.float32)


def split(labels: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Fixed train/test row indices: TEST_PER_CLASS rows of each class (chosen with a fixed seed) are test."""
    rng = numpy.random.default_rng(SPLIT_SEED)
    test = numpy.concatenate([rng.permutation(numpy.flatnonzero(labels == c))[:TEST_PER_CLASS]
                              for c in numpy.unique(labels)])
    train = numpy.setdiff1d(numpy.arange(len(labels)), test)
    return rng.permutation(train), numpy.sort(test)


def convert_digits(out_dir: str) -> dict[str, int]:
    """Write train.h5/test.h5 (datasets ``data`` and ``label``) and their list files train.txt/test.txt.

    Returns the number of rows written per split.
    """
    images, labels = load_digits()
    train, test = split(labels)
    return write_splits(out_dir, {"train": {"data": images[train], "label": labels[train]},
                                  "test": {"data": images[test], "label": labels[test]}})
