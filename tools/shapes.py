"""``netspec convert shapes``: generated grey images of rectangles, discs and triangles, labelled per pixel.

A segmentation dataset that needs no download, for the FCN-style example
(configs/fcn_shapes): each image holds one to three shapes of random size,
place and brightness on a noisy background, later shapes covering earlier
ones.  Every pixel's label is what it shows: 0 background, 1 rectangle,
2 disc, 3 triangle.  The same seed writes the same images.
"""

from __future__ import annotations

import numpy

from netspec.data.hdf5 import write_splits

CLASSES = ("background", "rectangle", "disc", "triangle")


def shape_mask(kind: int, size: int, rng: numpy.random.Generator) -> numpy.ndarray:
    """A boolean (size, size) mask of one shape of class ``kind`` with random size and place."""
    y, x = numpy.mgrid[0:size, 0:size] + 0.5
    extent = rng.uniform(0.15, 0.35) * size
    cy, cx = rng.uniform(extent, size - extent, 2)
    if kind == 1:
        half_h, half_w = extent * rng.uniform(0.5, 1.0, 2)
        return (abs(y - cy) <= half_h) & (abs(x - cx) <= half_w)
    if kind == 2:
        return (y - cy) ** 2 + (x - cx) ** 2 <= extent ** 2
    # an upright isosceles triangle: apex at the top, base at the bottom
    rise = (y - (cy - extent)) / (2 * extent)
    return (rise >= 0) & (rise <= 1) & (abs(x - cx) <= rise * extent)


def make_shapes(count: int, size: int, seed: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``(images (count, 1, size, size) float32 in [0, 1], labels (count, 1, size, size) float32)``."""
    rng = numpy.random.default_rng(seed)
    images = rng.uniform(0.0, 0.3, (count, 1, size, size)).astype(numpy.float32)
    labels = numpy.zeros((count, 1, size, size), numpy.float32)
    for image, label in zip(images, labels):
        for _ in range(rng.integers(1, 4)):
            kind = int(rng.integers(1, len(CLASSES)))
            mask = shape_mask(kind, size, rng)
            image[0][mask] = rng.uniform(0.5, 1.0)
            label[0][mask] = kind
    return images, labels


def convert_shapes(out_dir: str, train: int = 2000, test: int = 400, size: int = 32, seed: int = 0) -> dict[str, int]:
    """Write train.h5/test.h5 (datasets ``data`` and ``label``) and their list files to ``out_dir``.

    Returns the number of images written per split.
    """
    splits = {}
    for name, count, split_seed in (("train", train, seed), ("test", test, seed + 1)):
        images, labels = make_shapes(count, size, split_seed)
        splits[name] = {"data": images, "label": labels}
    return write_splits(out_dir, splits)
