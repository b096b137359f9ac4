"""A classifier's per-class figures on its test data: the confusion matrix, each class's precision and recall.

``netspec test --report`` asks.  The classifier is the net's first Accuracy
layer (else its first SoftmaxWithLoss): its scores and labels are read after
each forward pass, the prediction being the first class of the highest score;
labels equal to its ``ignore_label`` are left out.  A class's recall (its
hits over its records) is its accuracy in Caffe's sense, as Accuracy's
second top gives it (top_k 1, ties aside).  ``netspec test --report -o FILE.png`` draws the
matrix with Pillow (:meth:`Confusion.picture`).
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy
from PIL import Image, ImageDraw, ImageFont

from netspec.atomic import write_bytes
from netspec.data.files import writing
from netspec.errors import ConfigError, NetspecError

SCORED = {"Accuracy": "accuracy_param", "SoftmaxWithLoss": "softmax_param"}  # layer type -> its axis block

# The picture: a cell's colour runs from SHADE_NONE (no record of its label predicted as its class) to SHADE_ALL
# (every one); a cell is CELL_SCALE / sqrt(classes) pixels a side, at most CELL_MOST, the grid at most GRID_MOST
# (the grid grows with the classes, less and less), so at most GRID_MOST classes are drawn
SHADE_NONE, SHADE_ALL = (255, 255, 255), (8, 48, 107)
GRID_LINE, ZERO_COUNT = (214, 214, 214), (150, 150, 150)
CELL_MOST, CELL_SCALE, GRID_MOST = 44, 140, 4000
NAME_PIXELS = 120  # the most a class name takes beside the grid; a longer one is cut with an ellipsis
MARGIN, GAP = 12, 6
LINE = "Agy"  # letters as tall and as deep as most
TITLE_SIZE, TEXT_SIZE, TEXT_LEAST = 14, 12, 7  # font sizes in pixels (Pillow 10.1 and later: before, one size)


class Confusion:
    """The confusion matrix of a net's classifier (rows: labels, columns: predictions), filled pass by pass."""

    def __init__(self, net):
        """Find ``net``'s classifier and its class names (the data layer's label names, else the numbers); the
        matrix starts empty."""
        node = next((node for kind in SCORED for node in net.nodes if node.layer.type == kind), None)
        if node is None:
            raise ConfigError(f"net '{net.name}' has no Accuracy or SoftmaxWithLoss layer to report on")
        layer = net.layer_by_name[node.name]
        self.scores, self.labels = node.bottoms[0], node.bottoms[1]
        self.axis = layer.block(SCORED[node.layer.type]).axis % len(net.blobs[self.scores].shape)
        loss = layer.block("loss_param") if "loss_param" in layer.param_blocks else None
        self.ignore = loss.ignore_label if loss is not None else layer.block("accuracy_param").ignore_label
        self.classes = net.blobs[self.scores].shape[self.axis]
        self.matrix = numpy.zeros((self.classes, self.classes), dtype=numpy.int64)
        source = net.data_layer()
        names = source.label_names(self.labels) if source is not None else None
        self.names = names if names and len(names) == self.classes else [str(k) for k in range(self.classes)]

    @classmethod
    def of(cls, names: list[str], matrix) -> Confusion:
        """A confusion whose counts are already known (rows: labels, columns: predictions), its classes named
        ``names``; it reads no net (:meth:`add` needs one built by ``Confusion(net)``)."""
        counts = numpy.array(matrix, dtype=numpy.int64)
        if counts.shape != (len(names), len(names)):
            raise ValueError(f"a confusion of {len(names)} classes needs a {len(names)} x {len(names)} matrix, "
                             f"not {counts.shape}")
        confusion = cls.__new__(cls)
        confusion.scores = confusion.labels = confusion.axis = confusion.ignore = None
        confusion.classes, confusion.matrix, confusion.names = len(names), counts, [str(name) for name in names]
        return confusion

    def add(self, net) -> None:
        """Count the pass ``net`` just ran (this net, or the same net built for another batch size: one read of
        the scores and labels)."""
        backend = net.backend
        predicted = numpy.argmax(backend.to_host(net.blobs[self.scores].data), axis=self.axis).reshape(-1)
        labels = backend.to_host(net.blobs[self.labels].data).reshape(-1)
        kept = labels != self.ignore if self.ignore is not None else numpy.ones(labels.shape, dtype=bool)
        numpy.add.at(self.matrix, (labels[kept].astype(numpy.int64), predicted[kept]), 1)

    def figures(self) -> dict:
        """Every class's records, precision and recall (None where no record was predicted or labelled as it),
        and the matrix, as JSON-ready data.  Recall, hits over the class's records, is the class's accuracy."""
        hits, labelled, predicted = numpy.diag(self.matrix), self.matrix.sum(axis=1), self.matrix.sum(axis=0)
        return {"classes": self.names, "records": labelled.tolist(),
                "precision": [float(h / p) if p else None for h, p in zip(hits, predicted)],
                "recall": [float(h / n) if n else None for h, n in zip(hits, labelled)],
                "confusion": self.matrix.tolist()}

    def text(self, widest: int = 20) -> str:
        """The figures as a table, then the matrix when it has at most ``widest`` classes."""
        figures = self.figures()
        width = max(len("class"), *map(len, self.names))
        lines = [f"{'class':<{width}}  {'records':>8}  {'precision':>9}  {'recall (accuracy)':>17}"]
        for name, count, precision, recall in zip(self.names, figures["records"], figures["precision"],
                                                  figures["recall"]):
            shown = [f"{value:.3f}" if value is not None else "-" for value in (precision, recall)]
            lines.append(f"{name:<{width}}  {count:>8}  {shown[0]:>9}  {shown[1]:>17}")
        if self.classes > widest:
            return "\n".join(lines + [f"(the {self.classes} x {self.classes} confusion matrix is in --json and "
                                      "-o FILE.png)"])
        cell = max(len(str(self.matrix.max())), *map(len, self.names))
        lines.append("confusion (rows: labels, columns: predictions):")
        lines.append(" " * width + "".join(f"  {name:>{cell}}" for name in self.names))
        for name, row in zip(self.names, self.matrix):
            lines.append(f"{name:<{width}}" + "".join(f"  {count:>{cell}}" for count in row))
        return "\n".join(lines)


    def accuracy(self) -> float | None:
        """The share of every record counted that was predicted as its label (None before any was)."""
        total = int(self.matrix.sum())
        return float(numpy.trace(self.matrix) / total) if total else None

    def shares(self) -> numpy.ndarray:
        """The matrix normalised by row: each label's share of records predicted as each class (a label with no
        record: a row of zeros)."""
        return self.matrix / numpy.maximum(self.matrix.sum(axis=1, keepdims=True), 1)

    def picture(self, net: str) -> Picture:
        """The matrix drawn: a grid of cells shaded by :meth:`shares`, each with its count where that fits, the
        class names along both axes (cut with an ellipsis where long, left out where cells are too small for
        them), and a title with the net's name and the accuracy."""
        check_png(None, self.classes)
        total, hits = int(self.matrix.sum()), int(numpy.trace(self.matrix))
        title = (f"net '{net}': accuracy {self.accuracy():.4f}, {hits:,} of {total:,} records" if total
                 else f"net '{net}': no records counted")
        cell = max(1, min(CELL_MOST, round(CELL_SCALE / self.classes ** 0.5), GRID_MOST // self.classes))
        title_font, font = _font(TITLE_SIZE), _font(TEXT_SIZE)
        small = next((small for small in map(_font, range(TEXT_SIZE, TEXT_LEAST - 1, -1))
                      if _height(small) + 2 <= cell), None)  # (the largest that fits a cell; None: none does)
        names = [_cut(name, small, NAME_PIXELS) for name in self.names] if small else []
        widest = max((_width(small, name) for name in names), default=0)
        upright = widest + 4 <= cell  # column names fit under their columns unturned
        beside = widest + GAP if names else 0  # room for the row names left of the grid
        below = (_height(small) if upright else widest) + GAP if names else 0  # for the column names under it
        side, axis = cell * self.classes, _height(font)
        left, top = MARGIN + axis + GAP + beside, MARGIN + _height(title_font) + 2 * GAP
        image = Image.new("RGB", (max(left + side, MARGIN + _width(title_font, title)) + MARGIN,
                                  top + side + below + GAP + axis + MARGIN), "white")
        draw = ImageDraw.Draw(image)
        _write(draw, (MARGIN, MARGIN), title, title_font, "black")
        picture = Picture(image, left, top, cell)
        self._cells(draw, picture, small)
        for k, name in enumerate(names):  # rows: right-aligned beside the grid; columns: below it
            x, y = left + k * cell, top + k * cell
            _write(draw, (left - GAP - _width(small, name), y + cell / 2), name, small, "black", middle=True)
            if upright:
                _write(draw, (x + cell / 2 - _width(small, name) / 2, top + side + GAP), name, small, "black")
            else:  # (turned to read upwards, ending at the grid)
                strip = Image.new("RGB", (widest, cell), "white")
                _write(ImageDraw.Draw(strip), (widest - _width(small, name), cell / 2), name, small, "black",
                       middle=True)
                image.paste(strip.rotate(90, expand=True), (x, top + side + GAP))
        _write(draw, (left + side / 2 - _width(font, "prediction") / 2, top + side + below + GAP), "prediction",
               font, "black")
        strip = Image.new("RGB", (_width(font, "label"), axis), "white")
        _write(ImageDraw.Draw(strip), (0, 0), "label", font, "black")
        image.paste(strip.rotate(90, expand=True), (MARGIN, round(top + side / 2 - strip.width / 2)))
        return picture

    def _cells(self, draw, picture: Picture, font) -> None:
        """Shade the grid's cells, each with its count in ``font`` where that fits (None: no counts)."""
        shares, cell = self.shares(), picture.cell
        for (row, column), count in numpy.ndenumerate(self.matrix):
            x, y, _, _ = picture.cell_box(row, column)
            share = shares[row, column]
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=_shade(share),
                           outline=GRID_LINE if cell >= 6 else None)
            if font is not None and _width(font, str(count)) + 4 <= cell:
                colour = "white" if share > 0.5 else "black" if count else ZERO_COUNT
                _write(draw, (x + cell / 2, y + cell / 2), str(count), font, colour, centred=True)

    def write_png(self, out: str, net: str) -> Picture:
        """Write :meth:`picture` to the PNG file ``out`` atomically (never through a link there); a NetspecError
        naming ``out`` when it is no .png or cannot be written."""
        check_png(out, self.classes)
        picture, buffer = self.picture(net), io.BytesIO()
        picture.image.save(buffer, format="PNG")
        with writing(out):
            write_bytes(out, buffer.getvalue())
        return picture


@dataclasses.dataclass(frozen=True)
class Picture:
    """A drawn confusion matrix, and where its grid lies: its top-left corner and the side of a cell, in pixels."""

    image: Image.Image
    left: int
    top: int
    cell: int

    def cell_box(self, row: int, column: int) -> tuple[int, int, int, int]:
        """The pixels of the cell of label ``row`` predicted as ``column``: left, top, right, bottom (the last two
        just outside it)."""
        x, y = self.left + column * self.cell, self.top + row * self.cell
        return x, y, x + self.cell, y + self.cell


def check_png(out: str | None, classes: int | None = None) -> None:
    """A NetspecError naming ``out`` unless it names a .png file, or when a matrix of ``classes`` is too large to
    draw."""
    if out is not None and os.path.splitext(out)[1].lower() != ".png":
        raise NetspecError(f"{out}: the confusion matrix is drawn as PNG: give a .png file")
    if classes is not None and classes > GRID_MOST:
        raise NetspecError(f"{out or 'the picture'}: {classes} classes are too many to draw (at most {GRID_MOST}); "
                           "--json holds the matrix")


def _shade(share: float) -> tuple[int, int, int]:
    """The colour of a cell holding ``share`` (0 to 1) of its label's records."""
    return tuple(round(none + (full - none) * share) for none, full in zip(SHADE_NONE, SHADE_ALL))


def _font(size: int):
    """Pillow's own font at ``size`` pixels (a fixed size before Pillow 10.1, whose default font cannot scale)."""
    try:
        return ImageFont.load_default(size=max(size, 1))
    except TypeError:
        return ImageFont.load_default()


def _box(font, text: str) -> tuple[int, int, int, int]:
    """The box ``text`` covers drawn at (0, 0) in ``font``: left, top, right, bottom."""
    if hasattr(font, "getbbox"):
        return font.getbbox(text)
    return (0, 0, *font.getsize(text))  # (Pillow before 9.2's bitmap font)


def _width(font, text: str) -> int:
    """How many pixels wide ``text`` is in ``font``."""
    left, _, right, _ = _box(font, text)
    return right - left


def _height(font) -> int:
    """How tall a line of ``font`` is, accents and descenders included."""
    _, top, _, bottom = _box(font, LINE)
    return bottom - top


def _cut(text: str, font, room: int) -> str:
    """``text``, cut with an ellipsis to fit ``room`` pixels."""
    if _width(font, text) <= room:
        return text
    while text and _width(font, text + "…") > room:
        text = text[:-1]
    return text + "…"


def _write(draw, at, text: str, font, colour, centred: bool = False, middle: bool = False) -> None:
    """Draw ``text`` with its ink's top-left corner at ``at`` (its centre with ``centred``; its left middle with
    ``middle``)."""
    left, top, right, bottom = _box(font, text)
    x, y = (at[0] - (right - left) / 2, at[1] - (bottom - top) / 2) if centred else at
    if middle:  # (by a line's height, so that names of one row share a baseline whatever their letters)
        _, top, _, bottom = _box(font, LINE)
        y = at[1] - (bottom - top) / 2
    draw.text((round(x - left), round(y - top)), text, font=font, fill=colour)
