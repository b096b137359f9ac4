"""``netspec convert digit-pairs``: pairs of scikit-learn's 8x8 digits, labelled same or different, for siamese nets.

Each record stacks two digits as two channels (``pair_data``, (2, 8, 8)) and says
whether they show the same digit (``sim``: 1) or not (0); half the pairs are
alike.  Training pairs are drawn from the digits' training split and test
pairs from its test split (the split of ``netspec convert digits``), so no
test digit is ever seen in training.  The same seed writes the same pairs.
"""

from __future__ import annotations

import numpy

from netspec.data.hdf5 import write_splits
from netspec.tools.digits import load_digits, split


def make_pairs(images: numpy.ndarray, labels: numpy.ndarray, count: int,
               rng: numpy.random.Generator) -> dict[str, numpy.ndarray]:
    """``count`` pairs of rows of ``images``, alike and unlike in turn.

    Returns ``{"pair_data": (count, 2, 8, 8), "sim": (count,)}``.
    """
    first = rng.integers(0, len(labels), count)
    pools = {(label, alike): numpy.flatnonzero((labels == label) == alike)
             for label in numpy.unique(labels) for alike in (True, False)}
    second = numpy.array([rng.choice(pools[labels[row], i % 2 == 0]) for i, row in enumerate(first)])
    data = numpy.concatenate([images[first], images[second]], axis=1)
    return {"pair_data": data, "sim": (labels[first] == labels[second]).astype(numpy.float32)}


def convert_digit_pairs(out_dir: str, train: int = 10_000, test: int = 2_000, seed: int = 0) -> dict[str, int]:
    """Write train.h5/test.h5 (datasets ``pair_data`` and ``sim``) and their list files to ``out_dir``.

    Returns the number of pairs written per split.
    """
    images, labels = load_digits()
    rng = numpy.random.default_rng(seed)
    train_rows, test_rows = split(labels)
    return write_splits(out_dir, {
        "train": make_pairs(images[train_rows], labels[train_rows], train, rng),
        "test": make_pairs(images[test_rows], labels[test_rows], test, rng)})
