"""The confusion matrix of `netspec test --report`: its table, and its picture (`-o FILE.png`) read back pixel by pixel."""

from __future__ import annotations

import os
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from netspec.errors import NetspecError
from netspec.inspect.confusion import GRID_MOST, Confusion, check_png

# rows: labels, columns: predictions; the row-normalised shares order the cells otherwise than the counts do
MATRIX = [[90, 10, 0],   # shares 0.9, 0.1, 0
          [1, 1, 2],     # 0.25, 0.25, 0.5: a count of 2 outshades the 10 above
          [0, 0, 5]]     # 0, 0, 1


def fill(picture, row: int, column: int) -> tuple[int, int, int]:
    """The colour a cell is filled with: the most common pixel inside its outline (its count covers less)."""
    return Counter(map(tuple, inside(picture, row, column).tolist())).most_common(1)[0][0]


def inside(picture, row: int, column: int) -> np.ndarray:
    """The pixels of a cell inside its outline, one RGB row each."""
    left, top, right, bottom = picture.cell_box(row, column)
    return np.asarray(picture.image)[top + 1:bottom - 1, left + 1:right - 1].reshape(-1, 3)


def lightness(colour: tuple[int, int, int]) -> float:
    r, g, b = colour
    return 0.299 * r + 0.587 * g + 0.114 * b


def inked(picture, row: int, column: int) -> bool:
    """Whether anything (a count) is drawn inside the cell, besides its fill."""
    return len(np.unique(inside(picture, row, column), axis=0)) > 1


def test_cells_are_shaded_by_each_labels_share_not_by_the_count():
    confusion = Confusion.of(["cat", "dog", "bird"], MATRIX)
    picture = confusion.picture("TinyNet")
    shares = np.array(MATRIX) / np.array(MATRIX).sum(axis=1, keepdims=True)
    assert confusion.shares() == pytest.approx(shares)
    cells = [(r, c) for r in range(3) for c in range(3)]
    light = {cell: lightness(fill(picture, *cell)) for cell in cells}
    assert fill(picture, 2, 0) == (255, 255, 255) and light[2, 2] < 100  # no share: white; all of them: dark
    for a in cells:
        for b in cells:
            if shares[a] < shares[b]:
                assert light[a] > light[b], (a, b)
            elif shares[a] == shares[b]:
                assert fill(picture, *a) == fill(picture, *b), (a, b)
    assert light[1, 2] < light[0, 1]  # 2 of 4 records is darker than 10 of 100


def test_the_picture_grows_with_the_classes_and_writes_counts_where_they_fit():
    rng = np.random.default_rng(0)
    pictures = {}
    for classes in (2, 3, 10, 30, 60, 100):
        matrix = rng.integers(0, 9, (classes, classes)) + np.diag(np.full(classes, 1000))
        pictures[classes] = Confusion.of([f"c{k}" for k in range(classes)], matrix).picture("Net")
    widths = [picture.image.width for picture in pictures.values()]
    heights = [picture.image.height for picture in pictures.values()]
    assert heights == sorted(set(heights)) and widths == sorted(widths), (widths, heights)  # (the title may be wider
    assert widths[-1] > 4 * widths[0]                                                      # than a small grid)
    cells = [picture.cell for picture in pictures.values()]
    assert cells == sorted(cells, reverse=True) and cells[-1] < cells[0]
    assert inked(pictures[10], 0, 0) and inked(pictures[10], 0, 1)  # 1000 and a digit fit in a large cell
    assert not inked(pictures[100], 0, 0) and inked(pictures[100], 0, 1)  # a small cell: the digit, not 1000
    image = pictures[100].image
    assert image.width * image.height < 2000 * 2000


def test_long_names_are_cut_and_many_classes_drawn_without_names():
    short = Confusion.of(["a", "b"], [[1, 0], [0, 1]]).picture("Net")
    long = Confusion.of(["a" * 40, "b"], [[1, 0], [0, 1]]).picture("Net")
    longer = Confusion.of(["a" * 400, "b"], [[1, 0], [0, 1]]).picture("Net")
    assert short.left < long.left == longer.left  # cut to one width, with an ellipsis
    assert longer.image.size == long.image.size
    many = Confusion.of([f"class {k}" for k in range(600)], np.eye(600, dtype=int)).picture("Net")
    assert many.cell < 7 and many.left < short.left  # too small a cell for any name: none beside the grid


def test_the_png_is_written_atomically_never_through_a_link(tmp_path):
    confusion = Confusion.of(["cat", "dog", "bird"], MATRIX)
    out = tmp_path / "confusion.png"
    picture = confusion.write_png(str(out), "TinyNet")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == picture.image.size and image.mode == "RGB"
        assert np.array_equal(np.asarray(image), np.asarray(picture.image))
    with Image.open(out) as image:
        image.verify()
    assert [name for name in os.listdir(tmp_path) if name != "confusion.png"] == []  # no temporary left
    target = tmp_path / "elsewhere.txt"
    target.write_text("kept")
    os.symlink(target, tmp_path / "link.png")
    confusion.write_png(str(tmp_path / "link.png"), "TinyNet")
    assert not (tmp_path / "link.png").is_symlink() and target.read_text() == "kept"


def test_bad_files_and_matrices_are_refused_naming_them(tmp_path):
    confusion = Confusion.of(["cat", "dog", "bird"], MATRIX)
    for name in ("confusion.jpg", "confusion", "png"):
        out = str(tmp_path / name)
        with pytest.raises(NetspecError, match=f"^{re.escape(out)}: the confusion matrix is drawn as PNG: give a "
                                               r"\.png file$"):
            confusion.write_png(out, "TinyNet")
    assert os.listdir(tmp_path) == []
    (tmp_path / "file").write_text("")
    out = str(tmp_path / "file" / "confusion.png")
    with pytest.raises(NetspecError) as info:
        confusion.write_png(out, "TinyNet")
    assert str(info.value).startswith(f"{out}: cannot write: ") and "\n" not in str(info.value)
    check_png("big.png", GRID_MOST)
    with pytest.raises(NetspecError, match=f"big.png: {GRID_MOST + 1} classes are too many to draw"):
        check_png("big.png", GRID_MOST + 1)
    with pytest.raises(ValueError, match="a confusion of 3 classes needs a 3 x 3 matrix"):
        Confusion.of(["cat", "dog", "bird"], [[1, 2], [3, 4]])


def test_the_table_says_recall_is_each_class_accuracy():
    confusion = Confusion.of(["cat", "dog", "bird"], MATRIX)
    lines = confusion.text().splitlines()
    assert lines[0].split() == ["class", "records", "precision", "recall", "(accuracy)"]
    assert lines[2].split() == ["dog", "4", "0.091", "0.250"]  # 1 of 11 predicted dogs; 1 of 4 dogs
    assert confusion.figures()["recall"] == pytest.approx([0.9, 0.25, 1.0])
    assert confusion.accuracy() == pytest.approx(96 / 109)
    assert Confusion.of(["a", "b"], [[0, 0], [0, 0]]).accuracy() is None
