"""Using a published model: ``netspec.model_zoo.load`` and ``netspec predict``.

Inputs are prepared as the card says, with the same code as training's
transform_param: images are decoded (RGB or grey) and resized to its H x W,
swapped to BGR for a BGR card, then ``(x - mean) * scale``.  A ``.npy`` input
holds raw pixel values as decoding would give them (C x H x W, or
N x C x H x W, RGB for colour) and gets the same treatment.
"""

from __future__ import annotations

import os

import numpy

from netspec.data.images import decode_image, resized
from netspec.data.transform import Transformer, TransformParams
from netspec.engine.net import Net, compile_net
from netspec.engine.registry import layer_schemas
from netspec.errors import DataError
from netspec.model_zoo.card import CARD, ModelCard, read_card
from netspec.model_zoo.zoo import Zoo, ZooError, verify_folder
from netspec.spec.net_spec import parse_net


def model_folder(name_or_path: str, zoo: str | None = None) -> str:
    """A model folder given directly, or ``name[@version]`` found in the zoo."""
    if os.path.isfile(os.path.join(name_or_path, CARD)):
        return name_or_path
    if os.path.exists(name_or_path) or os.sep in name_or_path:
        raise ZooError(f"{name_or_path}: not a model folder (no {CARD})")
    zoo_ = Zoo(zoo)
    return zoo_.folder(*zoo_.resolve(name_or_path))


def load(name_or_path: str, zoo: str | None = None, device: str = "cpu", batch_size: int | None = None,
         dtype=numpy.float32) -> tuple[Net, ModelCard]:
    """A ready deploy net with the model's weights, and its card; every file is verified first.

    ``name_or_path`` is a model folder or ``name[@version]`` in the zoo;
    ``batch_size`` sets the input's first axis (default: the deploy net's).
    """
    folder = model_folder(name_or_path, zoo)
    card = read_card(folder)
    problems = verify_folder(folder)
    if problems:
        raise ZooError(f"{folder}: the model does not match its card: " + "; ".join(problems))
    if not card.weights:
        raise ZooError(f"{card.ref} is a config-only card: it has no weights to predict with")
    spec = parse_net(os.path.join(folder, card.deploy_net), layer_schemas())
    if batch_size:
        for layer in spec.layers:
            if layer.type == "Input":
                layer.blocks["input_param"].shape[0].dim[0] = batch_size
                break
    net = Net(compile_net(spec, phase="TEST"), device=device, dtype=dtype)
    net.load_weights(os.path.join(folder, card.weights))
    return net, card


def transformer(card: ModelCard, folder: str) -> Transformer:
    """The card's preprocessing as a Transformer (the same code that prepared the training data)."""
    spec = card.input
    mean_file = os.path.join(folder, spec.mean_file) if spec.mean_file else None
    order = "BGR" if spec.channels == "BGR" else "RGB"
    return Transformer(TransformParams(scale=spec.scale, mean_value=list(spec.mean_value), mean_file=mean_file,
                                       channel_order=order), "TEST", tuple(spec.shape))


def read_inputs(paths: list[str], card: ModelCard) -> list[tuple[str, numpy.ndarray]]:
    """``(name, raw C x H x W array)`` for every image file or every row of every .npy."""
    shape = tuple(card.input.shape)
    inputs = []
    for path in paths:
        if path.lower().endswith(".npy"):
            try:
                array = numpy.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: cannot read: {exc}") from None
            rows = [array] if array.ndim == 3 else list(array) if array.ndim == 4 else None
            if rows is None or any(row.shape != shape for row in rows):
                raise DataError(f"{path}: holds an array of shape {list(array.shape)}; the model takes "
                                f"{list(shape)} (or N x {list(shape)})")
            inputs += [(path if len(rows) == 1 else f"{path}[{i}]", row) for i, row in enumerate(rows)]
            continue
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror}") from None
        image = decode_image(data, path, channels=1 if card.input.channels == "GRAY" else 3)
        if image.shape[1:] != shape[1:]:
            image = resized(image, shape[1:])
        inputs.append((path, image))
    return inputs


def probabilities(net: Net) -> numpy.ndarray:
    """The net's class scores as probabilities (a Softmax output is taken as it is)."""
    output = net.outputs[0]
    values = net.backend.to_host(net.blobs[output].data).reshape(net.blobs[output].shape[0], -1).astype(numpy.float64)
    producer = next(node for node in net.nodes if output in node.tops)
    if producer.layer.type == "Softmax":
        return values
    shifted = numpy.exp(values - values.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def predict(net: Net, card: ModelCard, folder: str, inputs: list[tuple[str, numpy.ndarray]],
            top_k: int = 5) -> list[dict]:
    """Top-k classes of each input: ``{"input", "predictions": [{"label", "name", "probability"}]}``.

    ``folder`` is the model's folder (for its mean file).
    """
    prepare = transformer(card, folder)
    input_blob = net.data_layer().spec.tops[0]
    batch = net.blobs[input_blob].shape[0]
    results = []
    for start in range(0, len(inputs), batch):
        chunk = inputs[start:start + batch]
        images = numpy.zeros((batch, *prepare.in_shape), dtype=net.dtype)
        images[:len(chunk)] = [prepare.prepare(image) for _, image in chunk]
        data = numpy.empty((batch, *prepare.out_shape), dtype=net.dtype)
        prepare.apply(images, prepare.draw(numpy.random.default_rng(0), batch), data)
        net.blobs[input_blob].data[...] = net.backend.asarray(data)
        net.forward()
        for (name, _), row in zip(chunk, probabilities(net)):
            best = numpy.argsort(-row, kind="stable")[:top_k]
            names = card.input.label_names
            results.append({"input": name, "predictions": [
                {"label": int(i), "name": names[i] if i < len(names) else str(int(i)), "probability": float(row[i])}
                for i in best]})
    return results
