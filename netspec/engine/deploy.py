"""A deploy net derived from a train/val net, as DIGITS made them; and the inverse, a train/val net made from a
deploy net (an imported classifier's) for fine-tuning.

The TEST phase of the net is taken; each data layer becomes an ``Input`` of
its first top (the images), sized from what the layer produces or from a
given shape; its other tops (the labels) are gone, and so is every layer that
reads them (losses, accuracy) or that only fed a loss which is not the main
one (GoogLeNet's auxiliary classifiers).  The main loss, the one with the
largest weight (the last of equals), names the output: a ``Softmax`` (``prob``)
follows it for SoftmaxWithLoss, a ``Sigmoid`` for SigmoidCrossEntropyLoss.
"""

from __future__ import annotations

import copy
import os

from netspec.engine.net import compile_net
from netspec.engine.registry import layer_class, layer_schemas
from netspec.engine.trust import LIBRARY, Trust
from netspec.graph.compiler import included
from netspec.spec.modules import render_net
from netspec.spec.net_spec import LayerSpec, NetState, parse_net
from netspec.spec.yaml_text import config_yaml

# the layer a deploy net ends with, by the type of the loss it replaces
OUTPUT_LAYERS = {"SoftmaxWithLoss": "Softmax", "SigmoidCrossEntropyLoss": "Sigmoid"}


def derive_deploy_net(path: str, input_shape: tuple[int, ...] | None = None, batch_size: int = 1,
                      stages: list[str] | None = None, level: int | None = None, trust: Trust = LIBRARY) -> dict:
    """The deploy net of the train/val net file ``path``, as plain data ready for YAML.

    ``input_shape`` (C, H, W) sizes the input; without it the data layer's
    TEST top says, which needs its data to be there (else the data layer's error) and the net compiled under
    ``trust`` (its Python layers are refused unless it allows them).
    """
    spec = parse_net(path, layer_schemas())
    state = NetState(phase="TEST", stage=list(stages if stages is not None else spec.state.stage),
                     level=spec.state.level if level is None else level)
    written = render_net(path)
    chosen = [(layer, entry) for layer, entry in zip(spec.layers, written["layers"]) if included(layer, state)]
    shapes = _input_shapes([layer for layer, _ in chosen], spec, state, input_shape, trust)

    layers, gone = [], set()
    for layer, entry in chosen:
        if not layer.bottoms and layer.type != "Input" and layer_class(layer.type).feeds_net:
            layers.append((layer, {"name": layer.name, "type": "Input", "top": layer.tops[0],
                                   "input_param": {"shape": {"dim": [batch_size, *shapes[layer.tops[0]]]}}}))
            gone.update(layer.tops[1:])
        elif layer_class(layer.type).is_loss or gone.intersection(layer.bottoms):
            gone.update(top for top in layer.tops if top not in layer.bottoms)
            layers.append((layer, None))
        else:
            entry = {key: value for key, value in copy.deepcopy(entry).items() if key not in ("include", "exclude")}
            layers.append((layer, entry))

    main_loss = _main_loss([layer for layer, _ in chosen])
    if main_loss is None:
        kept = [entry for _, entry in layers if entry is not None]
    else:
        output = main_loss.bottoms[0]
        kept = _feeding(output, [(layer, entry) for layer, entry in layers if entry is not None])
        head = OUTPUT_LAYERS.get(main_loss.type)
        if head:
            kept.append({"name": "prob", "type": head, "bottom": output, "top": "prob"})
    return {"name": written.get("name", spec.name), "layers": kept}


TRAIN_BATCH = 32  # the batch of a train/val net made from a deploy net (fine-tuning changes the data layers' source)


def train_net_from_deploy(net: dict) -> dict:
    """A train/val net for fine-tuning a classifier given as the deploy net ``net`` (plain data, such as
    ``netspec import onnx`` writes): its ``Input`` becomes a Data layer in each phase (sources ``train`` and
    ``val``, which ``netspec zoo finetune`` points at a dataset), giving the labels too; a final Softmax or
    LogSoftmax gives way to a SoftmaxWithLoss on the scores it read, with an Accuracy in the TEST phase.
    ValueError where the net has no single image Input."""
    layers = copy.deepcopy(net["layers"])
    inputs = [layer for layer in layers if layer["type"] == "Input"]
    if len(inputs) != 1 or len(inputs[0]["input_param"]["shape"][0]["dim"]) != 4:
        raise ValueError("a classifier to fine-tune takes one image input (an Input of N, C, H, W)")
    image = inputs[0]["top"][0] if isinstance(inputs[0]["top"], list) else inputs[0]["top"]
    data = [{"name": f"{image}_{phase.lower()}", "type": "Data", "top": [image, "label"], "include": {"phase": phase},
             "data_param": {"source": {"TRAIN": "train", "TEST": "val"}[phase], "batch_size": TRAIN_BATCH}}
            for phase in ("TRAIN", "TEST")]
    body = [layer for layer in layers if layer["type"] != "Input"]
    scores = body[-1]["top"][0] if isinstance(body[-1]["top"], list) else body[-1]["top"]
    if body[-1]["type"] in ("Softmax", "LogSoftmax"):
        bottom = body.pop()["bottom"]
        scores = bottom[0] if isinstance(bottom, list) else bottom
    heads = [{"name": "loss", "type": "SoftmaxWithLoss", "bottom": [scores, "label"], "top": "loss"},
             {"name": "accuracy", "type": "Accuracy", "bottom": [scores, "label"], "top": "accuracy",
              "include": {"phase": "TEST"}}]
    return {"name": net.get("name", "net"), "layers": data + body + heads}


def finetune_solver(net_file: str) -> dict:
    """A solver for fine-tuning ``net_file`` made by :func:`train_net_from_deploy`: SGD at a small rate with
    momentum, testing every epoch's worth of batches over the whole validation set."""
    return {"net": net_file, "type": "SGD", "base_lr": 0.001, "momentum": 0.9, "weight_decay": 5e-4,
            "lr_policy": "step", "gamma": 0.1, "stepsize": 2000, "max_iter": 5000, "test_iter": "epoch",
            "test_interval": 500, "display": 50, "snapshot": 1000, "snapshot_prefix": "finetune"}


def deploy_net_yaml(net: dict, source: str) -> str:
    """The YAML text of a derived deploy net, saying which file it came from."""
    return f"# The deploy net of {os.path.basename(source)}, derived by netspec.\n" + config_yaml(net)


def _input_shapes(layers: list[LayerSpec], spec, state: NetState, input_shape,
                  trust: Trust) -> dict[str, tuple[int, ...]]:
    """The shape of one input (no batch axis) for the first top of every data layer."""
    tops = [layer.tops[0] for layer in layers if not layer.bottoms and layer.type != "Input"]
    if input_shape is not None:
        return {top: tuple(input_shape) for top in tops}
    graph = compile_net(spec, phase=state.phase, stages=state.stage, level=state.level, trust=trust)
    return {top: graph.blob_shapes[top][1:] for top in tops}


def _main_loss(layers: list[LayerSpec]) -> LayerSpec | None:
    """The loss layer with the largest weight (the last of equals), or None."""
    best, best_weight = None, 0.0
    for layer in layers:
        if layer_class(layer.type).is_loss:
            weight = layer.loss_weight[0] if layer.loss_weight else 1.0
            if weight >= best_weight and weight > 0:
                best, best_weight = layer, weight
    return best


def _feeding(output: str, layers: list[tuple[LayerSpec, dict]]) -> list[dict]:
    """The entries of the layers that ``output`` depends on, in file order."""
    needed, kept = {output}, []
    for layer, entry in reversed(layers):
        if needed.intersection(layer.tops):
            kept.append(entry)
            needed.update(layer.bottoms)
    return kept[::-1]
