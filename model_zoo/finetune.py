"""``netspec zoo finetune``: a published model's train net and solver, pointed at a dataset folder.

The model must carry the configs it was trained with (``zoo publish --run``
copies them).  Into ``OUT/finetune/`` go a train net whose data layers read the
dataset as Data layers (the TRAIN phase its ``train/``, the TEST phase its
``val/``, or both the dataset itself), records prepared as the card says
(scale, mean, channel order) and augmented as the model's data layers did, and
a solver with the model's schedule that snapshots into OUT.  When the dataset
has another number of classes, each layer making the class scores a loss
compares with the labels gets that many outputs and a new name, so that
``netspec train --weights`` copies every other layer by name and leaves it at
its fillers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from netspec.atomic import make_folder, write_bytes
from netspec.data.dataset import MANIFEST, read_manifest
from netspec.data.transform import Transformer, TransformParams
from netspec.engine.net import compile_net
from netspec.engine.registry import layer_class, layer_schemas, solver_types
from netspec.errors import ConfigError, DataError, NetspecError, ParamError, Problem
from netspec.model_zoo.card import ModelCard, read_card
from netspec.model_zoo.predict import model_folder
from netspec.model_zoo.zoo import ZooError, include_problems, verify_folder
from netspec.spec.modules import render_net
from netspec.spec.net_spec import LayerSpec, NetConfig, in_phase, parse_net
from netspec.spec.solver_spec import NET_KEYS, TEST_EPOCH, parse_solver
from netspec.spec.yaml_lines import YamlMap, load_yaml, read_source, to_plain
from netspec.spec.yaml_text import config_yaml
from netspec.training import run_folder

FOLDER = "finetune"  # inside the run folder
NET, SOLVER = "train_net.yaml", "solver.yaml"
DATA_BLOCKS = {"Data": "data_param", "HDF5Data": "hdf5_data_param", "ImageData": "image_data_param"}
PREPROCESSING = ("scale", "mean_value", "mean_file", "channel_order")  # transform_param keys the card gives
NEW_NAME = "{}_finetune"  # a re-made layer's name, so that no weights are copied into it


@dataclass
class FineTune:
    """A prepared fine-tuning: what ``netspec train`` runs, and what was changed."""

    solver: str  # OUT/finetune/solver.yaml
    weights: str  # the model's weights, copied into the net by layer name
    out: str  # the run folder
    notes: list[str]  # what was changed, one line each, for people

    @property
    def command(self) -> list[str]:
        """The ``netspec train`` command line that runs it."""
        return ["netspec", "train", self.solver, "--weights", self.weights, "--out", self.out]


def prepare_finetune(model: str, dataset: str, out: str, zoo: str | None = None) -> FineTune:
    """Write a train net and a solver into ``out/finetune/`` that fine-tune ``model`` on ``dataset``.

    ``model`` is a model folder or ``name[@version]`` in ``zoo`` (default: the
    default zoo); ``dataset`` a dataset folder, or a folder of ``train/`` and
    ``val/`` datasets (``netspec convert imageset --val-fraction``); ``out`` the
    run folder of the training, refused when it holds a run already.  A model
    without weights or training configs, a folder that is not a dataset,
    records that do not give the model's input shape, and class scores that
    cannot be traced to one layer each raise a NetspecError naming the file.
    """
    folder = os.path.abspath(model_folder(model, zoo))
    card = read_card(folder)
    _check_model(folder, card)
    out = os.path.abspath(out)
    run_folder.refuse_used(out)
    train, val = train_val_folders(dataset)
    manifests = {train: read_manifest(train), val: read_manifest(val)}
    shapes = {path: record_shape(path, manifest) for path, manifest in manifests.items()}
    classes = class_count(list(manifests.values()))

    where = os.path.join(folder, card.train_net)
    # the same file expanded twice, so the plain layers (rewritten below) and the parsed ones pair by index
    net, spec = render_net(where), parse_net(where, layer_schemas())
    python_layers = [layer.name for layer in spec.layers if layer.type == "Python"]
    if python_layers:
        raise ZooError(f"{where}: Python layer(s) {', '.join(python_layers)}: the zoo does not carry their modules")
    preprocessing = card_preprocessing(card, folder)
    data_indices = [index for index, layer in enumerate(spec.layers) if layer.type in DATA_BLOCKS]
    for index in data_indices:
        layer = spec.layers[index]
        source = train if in_phase(layer, "TRAIN") else val
        check_input(layer, source, shapes[source], preprocessing, card)
        net["layers"][index] = data_layer(net["layers"][index], layer, source, manifests[source], preprocessing)
    if not any(in_phase(spec.layers[index], "TRAIN") for index in data_indices):
        raise ZooError(f"{where}: no data layer ({', '.join(DATA_BLOCKS)}) in the TRAIN phase to read the dataset")
    phases = f"both phases read {train}" if train == val else f"the TRAIN phase reads {train}, the TEST phase {val}"
    notes = [f"{phases} ({classes} classes; Data layers, scale {card.input.scale:g} as the card says)"]
    if scored_classes(card, folder) != classes:
        for head in class_score_layers(spec, where):
            notes += remake(net, head, classes)

    net_file, solver_file = os.path.join(out, FOLDER, NET), os.path.join(out, FOLDER, SOLVER)
    made = f"fine-tuned on {os.path.abspath(dataset)} (netspec zoo finetune)"
    solver = finetune_solver(card, folder, net_file, out)
    tested = any(not in_phase(spec.layers[index], "TRAIN") for index in data_indices)
    if tested and solver.get("test_iter"):
        solver["test_iter"] = [TEST_EPOCH] * (len(solver["test_iter"]) if isinstance(solver["test_iter"], list) else 1)
        notes.append(f"test_iter {TEST_EPOCH}: a test pass scores each of the {manifests[val]['count']} records of "
                     f"{val} once")
    _write(net_file, f"# {card.ref}'s train net, {made}\n" + config_yaml(net))
    solver_text = config_yaml(solver)
    _write(solver_file, f"# {card.ref}'s solver, {made}\n" + solver_text)
    params = parse_solver(solver_file, layer_schemas(), list(solver_types())).params
    length = f"max_iter {params.max_iter}" if params.max_epoch is None else f"max_epoch {params.max_epoch:g}"
    notes.append(f"the solver keeps the model's schedule ({params.type}, base_lr {params.base_lr:g}, {length}); "
                 "netspec train --base-lr and --max-iter change it")
    return FineTune(solver=solver_file, weights=os.path.join(folder, card.weights), out=out, notes=notes)


def _check_model(folder: str, card: ModelCard) -> None:
    """ZooError unless the model is intact and has weights and training configs."""
    problems = verify_folder(folder) + include_problems(folder, card, card.train_net)
    if problems:
        raise ZooError(f"{folder}: the model does not match its card: " + "; ".join(problems))
    if not card.weights:
        raise ZooError(f"{folder}: {card.ref} is a config-only card: it has no weights to fine-tune")
    if not card.train_net or not card.solver:
        raise ZooError(f"{folder}: {card.ref} was published without its training configs (train net and solver): "
                       "publish it from a run (netspec zoo publish --run)")


def train_val_folders(dataset: str) -> tuple[str, str]:
    """``(train, val)``: the dataset folder twice, or its ``train/`` and ``val/`` datasets (absolute)."""
    path = os.path.abspath(dataset)
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path, path
    train, val = os.path.join(path, "train"), os.path.join(path, "val")
    if os.path.exists(os.path.join(train, MANIFEST)) and os.path.exists(os.path.join(val, MANIFEST)):
        return train, val
    raise DataError(f"{dataset}: not a dataset (no {MANIFEST}), nor a folder of train/ and val/ datasets; make one "
                    "with netspec convert imageset")


def record_shape(path: str, manifest: dict) -> tuple[int, ...]:
    """The one shape of a dataset's records (C, H, W); DataError when they have several."""
    if len(manifest["shapes"]) > 1:
        raise DataError(f"{path}: holds records of {len(manifest['shapes'])} shapes; convert the images with "
                        "--resize HxW so that they share one")
    return tuple(manifest["shapes"][0])


def class_count(manifests: list[dict]) -> int:
    """The classes of a dataset's parts: as many as they name, or their largest label + 1."""
    named = max(len(manifest.get("label_names") or []) for manifest in manifests)
    largest = max(int(label) for manifest in manifests for label in manifest["label_counts"])
    return max(named, largest + 1)


def card_preprocessing(card: ModelCard, folder: str) -> dict:
    """The transform_param values of :data:`PREPROCESSING` that the card's input gives (others: the defaults)."""
    values = {"scale": card.input.scale}
    if card.input.mean_file:
        values["mean_file"] = os.path.join(folder, card.input.mean_file)
    elif card.input.mean_value:
        values["mean_value"] = list(card.input.mean_value)
    if card.input.channels == "BGR":
        values["channel_order"] = "BGR"
    return values


def data_layer(plain: dict, layer: LayerSpec, source: str, manifest: dict, preprocessing: dict) -> dict:
    """A Data layer reading the dataset ``source`` in place of the data layer ``plain`` (``layer`` parsed).

    Its augmentation (crop, mirror, ...) stays; the preprocessing is the card's.  A Data layer keeps its other
    settings; in the TRAIN phase records are shuffled (over the whole dataset unless it gives a shuffle_buffer).
    """
    augmentation = {key: value for key, value in plain.get("transform_param", {}).items() if key not in PREPROCESSING}
    transform = {**augmentation, **preprocessing}
    params = dict(plain.get("data_param", {})) if layer.type == "Data" else {}
    batch = layer.blocks[DATA_BLOCKS[layer.type]].batch_size
    params.update(source=source, batch_size=batch if in_phase(layer, "TRAIN") else min(batch, manifest["count"]),
                  backend=manifest["backend"].upper())
    if in_phase(layer, "TRAIN"):
        params["shuffle_buffer"] = params.get("shuffle_buffer") or manifest["count"]
    kept = {key: plain[key] for key in ("top", "include", "exclude") if key in plain}
    return {"name": plain["name"], "type": "Data", **kept, "transform_param": transform, "data_param": params}


def check_input(layer: LayerSpec, source: str, shape: tuple[int, ...], preprocessing: dict, card: ModelCard) -> None:
    """DataError unless the records of ``source`` reach the net in the model's input shape through ``layer``'s
    transform (its crop included)."""
    defaults = {key: getattr(TransformParams(), key) for key in PREPROCESSING}
    params = dataclasses.replace(layer.blocks.get("transform_param") or TransformParams(),
                                 **{**defaults, **preprocessing})
    phase = "TRAIN" if in_phase(layer, "TRAIN") else "TEST"
    try:
        given = list(Transformer(params, phase, shape).out_shape)
    except ParamError as exc:
        raise DataError(f"{source}: cannot feed layer '{layer.name}': {exc}") from None
    if given != card.input.shape:
        height, width = card.input.shape[1:]
        gray = " --gray" if card.input.shape[0] == 1 and shape[0] == 3 else ""
        raise DataError(f"{source}: records of shape {list(shape)} reach the net as {given} through layer "
                        f"'{layer.name}', but {card.ref} takes {card.input.shape} (C, H, W); convert the images "
                        f"with netspec convert imageset --resize {height}x{width}{gray}")


def scored_classes(card: ModelCard, folder: str) -> int:
    """How many classes the model scores: the channels of its deploy net's first output (shapes only, no weights
    loaded)."""
    graph = compile_net(parse_net(os.path.join(folder, card.deploy_net), layer_schemas()), phase="TEST")
    return graph.blob_shapes[graph.outputs[0]][1] if graph.outputs else len(card.input.label_names)


def class_score_layers(spec: NetConfig, where: str) -> list[LayerSpec]:
    """The layers making the class scores that the TRAIN phase's losses compare with labels.

    From each such loss, its scores are followed back through layers of one
    input to the first learnable layer with a ``num_output``; a ZooError
    naming ``where`` says where that fails.
    """
    layers = [layer for layer in spec.layers if in_phase(layer, "TRAIN")]
    heads: list[LayerSpec] = []
    for index, loss in enumerate(layers):
        kind = layer_class(loss.type)
        if not (kind.is_loss and kind.label_bottoms):
            continue
        for blob in (blob for j, blob in enumerate(loss.bottoms) if j not in kind.label_bottoms):
            head = _scores_maker(layers[:index], blob, loss, where)
            if head.name not in [each.name for each in heads]:
                heads.append(head)
    if not heads:
        raise ZooError(f"{where}: no loss compares class scores with labels (as SoftmaxWithLoss does), so the layer "
                       "making the scores cannot be found")
    return heads


def _scores_maker(before: list[LayerSpec], blob: str, loss: LayerSpec, where: str) -> LayerSpec:
    """The last layer of ``before`` making ``blob`` that has a num_output, through layers of one input."""
    for layer in reversed(before):
        if blob not in layer.tops:
            continue
        if num_output_block(layer):
            return layer
        if len(layer.bottoms) != 1:
            raise ZooError(f"{where}: cannot tell which layer makes the class scores of loss '{loss.name}': they come "
                           f"through layer '{layer.name}' ({layer.type}), which has {len(layer.bottoms)} inputs")
        blob = layer.bottoms[0]
    raise ZooError(f"{where}: no learnable layer with a num_output makes the class scores of loss '{loss.name}'")


def num_output_block(layer: LayerSpec) -> str | None:
    """The parameter block holding a learnable layer's ``num_output``, or None."""
    if not layer_class(layer.type).learnable:
        return None
    return next((name for name, params in layer.blocks.items() if hasattr(params, "num_output")), None)


def remake(net: dict, head: LayerSpec, classes: int) -> list[str]:
    """Give the layers named as ``head`` (in any phase) ``classes`` outputs and a new name, unless they have that
    many; the note saying so, or none."""
    block = num_output_block(head)
    outputs = head.blocks[block].num_output
    if outputs == classes:
        return []
    new_name = NEW_NAME.format(head.name)
    for layer in net["layers"]:
        if layer["name"] == head.name:
            layer["name"] = new_name
            layer.setdefault(block, {})["num_output"] = classes
    return [f"{head.name} re-made for {classes} classes as {new_name} (the model's has {outputs}; its weights start "
            "from fillers)"]


def finetune_solver(card: ModelCard, folder: str, net_file: str, out: str) -> dict:
    """The model's solver (as plain data) training ``net_file``, its snapshots in ``out``."""
    path = os.path.join(folder, card.solver)
    text, filename = read_source(path)
    tree = load_yaml(text, filename)
    if not isinstance(tree, YamlMap):
        raise ConfigError(Problem("a solver file must be a mapping (base_lr, max_iter, net, ...)", file=path, line=1))
    solver = {key: value for key, value in to_plain(tree).items() if key not in NET_KEYS}
    prefix = os.path.basename(str(solver.get("snapshot_prefix") or "")) or card.name
    return {"net": net_file, **solver, "snapshot_prefix": os.path.join(out, prefix)}


def _write(path: str, text: str) -> None:
    """Write a config file, its folder made first; NetspecError naming it when that fails."""
    try:
        make_folder(os.path.dirname(path))
        write_bytes(path, text.encode("utf-8"))
    except OSError as exc:
        raise NetspecError(f"{path}: cannot write it: {exc.strerror}") from None
