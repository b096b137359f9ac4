"""Using a published model: ``netspec.model_zoo.load`` and ``netspec predict``.

Inputs are prepared as the TEST phase of training prepared its data: images
are decoded (RGB or grey) and resized as ``netspec convert`` resized the
training images (to the card's ``resize``, stretched or ``keep_aspect``), then
go through the TEST phase of transform_param with the data layers' own code
(:class:`~netspec.data.transform.Transformer`): the centre ``crop_size``
square, swapped to BGR for a BGR card, ``(x - mean) * scale``.  A card without
``resize`` (published before it was recorded) has images resized straight to
its input's H x W, and the note on resized inputs says so.  A ``.npy`` input
holds raw pixel values as decoding and resizing would give them (C x H x W, or
N x C x H x W, RGB for colour) and gets the same transform.
"""

from __future__ import annotations

import os
import warnings

import numpy

from netspec.data.files import regular_file
from netspec.data.images import decode_image, read_image_file, resized
from netspec.data.transform import Transformer, TransformParams
from netspec.engine.net import Net, load_net
from netspec.engine.trust import SHARED, Trust
from netspec.errors import DataError
from netspec.model_zoo.card import CARD, ModelCard, read_card
from netspec.model_zoo.zoo import Zoo, ZooError, verify_folder


def model_folder(name_or_path: str, zoo: str | None = None) -> str:
    """A model folder given directly, or ``name[@version]`` found in the zoo.

    A name that is also a folder without a card (a project folder named like its model) is looked up in the zoo.
    """
    if os.path.isfile(os.path.join(name_or_path, CARD)):
        return name_or_path
    if os.sep in name_or_path or (os.path.exists(name_or_path) and not os.path.isdir(name_or_path)):
        raise ZooError(f"{name_or_path}: not a model folder (no {CARD})")
    zoo_ = Zoo(zoo)
    try:
        return zoo_.folder(*zoo_.resolve(name_or_path))
    except ZooError as exc:
        if os.path.isdir(name_or_path):
            raise ZooError(f"{name_or_path}: not a model folder (no {CARD}), and {exc}") from None
        raise


def load(name_or_path: str, zoo: str | None = None, device: str = "cpu", batch_size: int | None = None,
         dtype=numpy.float32, trust: Trust = SHARED, allow_missing_weights: bool = False) -> Model:
    """The model, ready to predict: its deploy net with its weights (frozen: :meth:`netspec.Net.freeze`), and its
    card; every file is verified first.

    ``name_or_path`` is a model folder or ``name[@version]`` in the zoo;
    ``batch_size`` sets the input's first axis (default: the deploy net's).
    ``netspec.model_zoo.load("digits").predict("digit.png")`` is the whole of using one.

    A model is someone else's code: by default (``trust``: :meth:`Trust.shared
    <netspec.engine.trust.Trust.shared>`) a deploy net with layers that write files or with Python layers (their
    modules' code would run) is refused; a trust allowing side effects lets its files go inside the current
    directory (or anywhere, with ``outputs_anywhere``).  Weights that leave a learnable layer at its fillers are
    refused unless ``allow_missing_weights``.
    """
    folder = model_folder(name_or_path, zoo)
    card = read_card(folder)
    problems = verify_folder(folder)
    if problems:
        raise ZooError(f"{folder}: the model does not match its card: " + "; ".join(problems))
    if not card.weights:
        raise ZooError(f"{card.ref} is a config-only card: it has no weights to predict with")
    net = load_net(os.path.join(folder, card.deploy_net), "TEST", device, batch_size=batch_size or None, trust=trust,
                   dtype=dtype, inference=True, reuse_memory=True)
    scores = scores_blob(net, os.path.join(folder, card.deploy_net))
    names, classes = card.input.label_names, class_count(net, scores)
    if names and len(names) != classes:  # (publish refuses it; a card written by hand or changed may not)
        raise ZooError(f"{os.path.join(folder, CARD)}: its label_names name {len(names)} classes but the deploy net "
                       f"scores {classes} ('{scores}')")
    report = net.load_weights(os.path.join(folder, card.weights))
    if report.missing and not allow_missing_weights:
        raise ZooError(f"{os.path.join(folder, card.weights)}: holds no weights for layer(s) "
                       f"{', '.join(report.missing)} of the deploy net, so its predictions would be meaningless; "
                       "pass --allow-missing-weights to predict anyway")
    net.freeze()
    return Model(net, card, folder)


class Model:
    """A published model loaded for use: ``net`` (its deploy net, weights loaded), ``card`` and ``folder``."""

    def __init__(self, net: Net, card: ModelCard, folder: str):
        self.net, self.card, self.folder = net, card, folder

    def predict(self, inputs, top_k: int = 5):
        """The top-k classes of an image file, a raw pixel array (C x H x W), or a list or batch of them.

        One input gives one ``{"input", "predictions": [{"label", "name",
        "probability"}]}``; a list, an N x C x H x W array or a .npy file of
        several rows gives a list.
        Images of another size or colour are converted as the card says, with a warning.
        """
        single = isinstance(inputs, (str, os.PathLike)) or (isinstance(inputs, numpy.ndarray) and inputs.ndim == 3)
        items = [inputs] if single else list(inputs)
        prepared, adjustments = [], Adjustments(self.card)
        for index, item in enumerate(items):
            if isinstance(item, numpy.ndarray):
                prepared += check_array(item, f"input {index}", self.card)
            else:
                prepared += read_inputs([os.fspath(item)], self.card, adjustments)[0]
        if adjustments:
            warnings.warn(str(adjustments), stacklevel=2)
        results = self.classify(prepared, top_k)
        return results[0] if single and len(results) == 1 else results

    def classify(self, inputs: list[tuple[str, numpy.ndarray]], top_k: int = 5) -> list[dict]:
        """Top-k classes of raw inputs as :func:`read_inputs` gives them."""
        prepare = transformer(self.card, self.folder)
        input_blob = self.net.data_layer().spec.tops[0]
        batch = self.net.blobs[input_blob].shape[0]
        results = []
        for start in range(0, len(inputs), batch):
            chunk = inputs[start:start + batch]
            images = numpy.zeros((batch, *prepare.in_shape), dtype=self.net.dtype)
            images[:len(chunk)] = [prepare.prepare(image) for _, image in chunk]
            data = numpy.empty((batch, *prepare.out_shape), dtype=self.net.dtype)
            prepare.apply(images, prepare.draw(numpy.random.default_rng(0), batch), data)
            self.net.blobs[input_blob].data[...] = self.net.backend.asarray(data)
            self.net.forward()
            for (name, _), row in zip(chunk, probabilities(self.net)):
                if not numpy.isfinite(row).all():
                    raise DataError(f"{name}: the model's output is NaN or infinite for this input")
                results.append({"input": name, "predictions": self._top(row, top_k)})
        return results

    def close(self) -> None:
        """Close the deploy net: files its layers wrote (with ``allow_side_effects``) are moved into place."""
        self.net.close()

    def _top(self, row: numpy.ndarray, top_k: int) -> list[dict]:
        names = self.card.input.label_names
        return [{"label": int(i), "name": names[i] if i < len(names) else str(int(i)), "probability": float(row[i])}
                for i in numpy.argsort(-row, kind="stable")[:top_k]]


def image_shape(card: ModelCard) -> tuple[int, int, int]:
    """(C, H, W) of an image before the card's transform: the size its TEST phase read, else its input's."""
    spec = card.input
    return (spec.shape[0], *spec.resize) if spec.resize else tuple(spec.shape)


def transformer(card: ModelCard, folder: str) -> Transformer:
    """The card's TEST-phase transform_param as a Transformer (the code that prepared the validation data)."""
    spec = card.input
    mean_file = os.path.join(folder, spec.mean_file) if spec.mean_file else None
    order = "BGR" if spec.channels == "BGR" else "RGB"
    return Transformer(TransformParams(scale=spec.scale, mean_value=list(spec.mean_value), mean_file=mean_file,
                                       crop_size=spec.crop_size, channel_order=order), "TEST", image_shape(card))


class Adjustments:
    """What reading the inputs changed to fit the model: sizes and colours, said once."""

    def __init__(self, card: ModelCard):
        self.card = card
        self.resized: list[tuple[str, tuple[int, ...]]] = []
        self.converted: list[str] = []

    def __str__(self) -> str:
        spec = self.card.input
        height, width = image_shape(self.card)[1:]
        changes = []
        if self.resized:
            name, size = self.resized[0]
            was = f"{name} was {size[0]}x{size[1]}"
            how = (f"{' keeping their aspect' if spec.keep_aspect else ''}, like its training images ({was})"
                   if spec.resize else f" ({was}; the card does not say how its training images were resized or "
                                       "cropped)")
            changes.append(f"resized {len(self.resized)} input(s) {'' if spec.resize else 'straight '}to "
                           f"{height}x{width}{how}")
        if self.converted:
            kind = "colour to grey" if spec.shape[0] == 1 else "grey to colour"
            changes.append(f"converted {len(self.converted)} from {kind} ({self.converted[0]})")
        crop = " (a centre crop)" if spec.crop_size else ""
        return (f"note: {' and '.join(changes)}: the model takes {'x'.join(map(str, spec.shape))} {spec.channels} "
                f"images{crop}")

    def __bool__(self) -> bool:
        return bool(self.resized or self.converted)


def check_array(array: numpy.ndarray, name: str, card: ModelCard) -> list[tuple[str, numpy.ndarray]]:
    """``(name, row)`` for a raw C x H x W array or each row of an N x C x H x W one, of the card's
    :func:`image_shape`."""
    shape = image_shape(card)
    rows = [array] if array.ndim == 3 else list(array) if array.ndim == 4 else None
    if rows is None or any(row.shape != shape for row in rows):
        raise DataError(f"{name}: holds an array of shape {list(array.shape)}; the model takes "
                        f"{list(shape)} (or N x {list(shape)})")
    if array.dtype.kind not in "biuf" or not numpy.isfinite(array).all():
        raise DataError(f"{name}: holds values that are not finite numbers ({array.dtype})")
    return [(name if len(rows) == 1 else f"{name}[{i}]", row) for i, row in enumerate(rows)]


def read_inputs(paths: list[str], card: ModelCard,
                adjustments: Adjustments | None = None) -> tuple[list[tuple[str, numpy.ndarray]], Adjustments]:
    """``(name, raw C x H x W array)`` for every image file or every row of every .npy, and what was adjusted.

    Images of another size are resized, and colour ones made grey (or grey
    ones colour), as the card says (:func:`image_input`); ``str(adjustments)`` says so in one line.
    """
    adjustments = Adjustments(card) if adjustments is None else adjustments
    inputs = []
    for path in paths:
        if path.lower().endswith(".npy"):
            regular_file(path)
            try:  # mapped, not read: its shape is checked against the card before its values are used
                array = numpy.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: cannot read: {exc}") from None
            inputs += check_array(array, path, card)
            continue
        inputs.append(image_input(read_image_file(path), path, card, adjustments))
    return inputs, adjustments


def image_input(data: bytes, name: str, card: ModelCard, adjustments: Adjustments) -> tuple[str, numpy.ndarray]:
    """``(name, raw C x H x W array)`` of the image file bytes ``data``, made grey or colour and resized to the
    card's :func:`image_shape` as ``netspec convert`` resized the training images (noted in ``adjustments``);
    DataError naming ``name`` when they are not an image."""
    shape = image_shape(card)
    image = decode_image(data, name)
    if image.shape[0] != shape[0]:
        adjustments.converted.append(name)
        image = decode_image(data, name, channels=shape[0])
    if image.shape[1:] != shape[1:]:
        adjustments.resized.append((name, image.shape[1:]))
        image = resized(image, shape[1:], card.input.keep_aspect)
    return name, image


def scores_blob(net: Net, where: str) -> str:
    """The blob holding a deploy net's class scores: its first output; ZooError (naming ``where``) without one."""
    if not net.outputs:
        raise ZooError(f"{where}: the deploy net has no output (every top is read by another layer), so it "
                       "scores nothing")
    return net.outputs[0]


def class_count(net: Net, scores: str) -> int:
    """How many classes a deploy net's ``scores`` blob scores (:func:`scores_blob`): the size of its second axis,
    which label names name (1 for a blob of one axis)."""
    shape = net.blobs[scores].shape
    return shape[1] if len(shape) > 1 else 1


def probabilities(net: Net) -> numpy.ndarray:
    """The net's class scores as probabilities (a Softmax or Sigmoid output is taken as it is)."""
    output = net.outputs[0]
    values = net.backend.to_host(net.blobs[output].data).reshape(net.blobs[output].shape[0], -1).astype(numpy.float64)
    producer = next(node for node in net.nodes if output in node.tops)
    if producer.layer.type in ("Softmax", "Sigmoid"):  # already probabilities (a Sigmoid's: one per class)
        return values
    shifted = numpy.exp(values - values.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
