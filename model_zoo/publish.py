"""``netspec zoo publish``: a deploy net and trained weights (and their run folder) become a model in a zoo."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
from dataclasses import dataclass, field

import h5py

from netspec.atomic import write_bytes
from netspec.data.dataset import read_manifest
from netspec.engine.deploy import deploy_net_yaml, derive_deploy_net, finetune_solver, train_net_from_deploy
from netspec.engine.net import Net, compile_net
from netspec.engine.outputs import OutputFolder
from netspec.engine.registry import layer_class, layer_schemas
from netspec.engine.trust import SHARED, Trust
from netspec.engine.weights import weights_origin
from netspec.errors import NetspecError
from netspec.graph.compiler import included
from netspec.model_zoo.card import (
    CARD,
    CaffeOrigin,
    ImportOrigin,
    InputSpec,
    ModelCard,
    ModelFile,
    Provenance,
    card_yaml,
    check_name,
    check_version,
    file_sha256,
    input_shape_problem,
    per_class_figures,
    resize_problem,
)
from netspec.model_zoo.predict import class_count, scores_blob
from netspec.model_zoo.zoo import Zoo, ZooError, write_readme
from netspec.spec.modules import render_net, uses_modules
from netspec.spec.net_spec import NetState, parse_net
from netspec.spec.yaml_lines import load_yaml, read_source
from netspec.spec.yaml_text import config_yaml
from netspec.training import run_folder
from netspec.version import __version__

DEPLOY, WEIGHTS = "deploy.yaml", "weights.h5"  # the names of the two files in a model folder
CONFIGS = {"solver": "solver.yaml", "train_net": "train_net.yaml"}  # and of its training configs, by card field


PYTHON_REFUSAL = "a published model holds none, since the zoo does not carry their modules (it would not run elsewhere)"

@dataclass
class PublishRequest:
    """What ``netspec zoo publish`` was asked."""

    name: str
    net: str | None = None  # default: derived from the run's train net
    weights: str | None = None  # default: the run's latest snapshot
    version: str = "1"
    run_dir: str | None = None
    labels_file: str | None = None
    license: str = "unspecified"
    summary: str = ""
    authors: list[str] = field(default_factory=list)
    scale: float | None = None
    mean_value: list[float] | None = None
    channels: str | None = None
    channel_order: str = "RGB"  # of a 3-channel input when neither channels nor the run's transform_param says
    force: bool = False
    trust: Trust = SHARED  # side_effects: publish a net with layers that write files (its users must allow
    # them too); its Python layers are refused whatever it says, since the zoo does not carry their modules
    train_net: str | None = None  # the train net to include [default: the run's]
    solver: str | None = None  # the solver to include [default: the run's]
    caffe: CaffeOrigin | None = None  # the Caffe Model Zoo directory the net and weights were imported from


def deploy_input(net) -> tuple[str, tuple[int, ...]]:
    """The deploy net's input blob and the shape of one input (C, H, W)."""
    layer = net.data_layer()
    if layer is None or layer.type != "Input":
        raise ZooError(f"the deploy net '{net.name}' must start with an Input layer (no data layers)")
    name = layer.spec.tops[0]
    shape = net.blobs[name].shape[1:]
    if len(shape) != 3:
        raise ZooError(f"the deploy net's input '{name}' has shape {list(net.blobs[name].shape)}; "
                       "a published model takes N x C x H x W images")
    return name, shape


def data_layers(sources: dict) -> tuple:
    """The data layer specs of the run's solver (re-read from where training found it): the train net's in
    TRAIN, and the one its TEST phase read (test net 0's, whose scores the card keeps); None where there is none."""
    from netspec.engine.registry import layer_schemas, solver_types
    from netspec.spec.solver_spec import parse_solver

    solver_file = sources.get("solver")
    if not solver_file or not os.path.isfile(solver_file):
        return None, None
    spec = parse_solver(solver_file, layer_schemas(), list(solver_types()))
    found = []
    for net, phase in ((spec.train_net, "TRAIN"), (spec.test_nets[0] if spec.test_nets else spec.train_net, "TEST")):
        state = NetState(phase=phase)
        found.append(next((layer for layer in net.layers if not layer.bottoms and included(layer, state)), None))
    return tuple(found)


def dataset_sha256(layer) -> str | None:
    """sha256 of what names the layer's data: a dataset's manifest.json, or a list file."""
    for block, key in (("data_param", "source"), ("hdf5_data_param", "source"), ("image_data_param", "source")):
        source = getattr(layer.blocks.get(block), key, None) if block in layer.blocks else None
        if source:
            manifest = os.path.join(source, "manifest.json")
            path = manifest if os.path.isdir(source) else source
            return file_sha256(path) if os.path.isfile(path) else None
    return None


def dataset_label_names(layer) -> list[str]:
    """The label names in the manifest of the dataset a Data layer reads, or []."""
    source = getattr(layer.blocks.get("data_param"), "source", None)
    if not source or not os.path.isfile(os.path.join(source, "manifest.json")):
        return []
    return [str(name) for name in read_manifest(source).get("label_names") or []]


def untold_preprocessing(request: PublishRequest) -> str | None:
    """What a card published from a run cannot know of its input's preprocessing, as a note: the run's data layer
    reads values as they are stored (no transform_param: HDF5Data, Input), so the card takes images as they are,
    unless ``--scale`` or ``--mean-value`` says otherwise; None where it knows."""
    if request.run_dir is None or request.scale is not None or request.mean_value is not None:
        return None
    layer, test_layer = data_layers(run_folder.read_sources(request.run_dir))
    layer = test_layer or layer
    if layer is None or "transform_param" in layer_class(layer.type).param_blocks:
        return None
    return (f"layer '{layer.name}' ({layer.type}) of the run reads values as they are stored, so the card feeds "
            "images as they are (pixels 0 to 255, scale 1, no mean): if the stored values are scaled otherwise, "
            "publish again with --force, --scale and --mean-value (netspec convert digits stores values in [0, 1]: "
            "--scale 1/255)")


def image_size(layer, shape: tuple[int, ...]) -> dict:
    """The card's resize, keep_aspect and crop_size for the images the data layer ``layer`` reads: a Data layer's
    dataset's record size and whether ``netspec convert --keep-aspect`` made it, ImageData's new size, and the
    deploy net's input ``shape`` (C, H, W) for a layer without transform_param (its rows reach the net as they
    are); {} when the layer does not say (a dataset of several sizes or gone, ImageData keeping each size)."""
    size, keep_aspect = None, False
    if "transform_param" not in layer_class(layer.type).param_blocks:
        size = shape[1:]
    elif layer.type == "Data" and os.path.isfile(os.path.join(layer.blocks["data_param"].source, "manifest.json")):
        manifest = read_manifest(layer.blocks["data_param"].source)
        options = manifest.get("options") if isinstance(manifest.get("options"), dict) else {}
        if len(manifest["shapes"]) == 1:
            size, keep_aspect = manifest["shapes"][0][1:], bool(options.get("resize") and options.get("keep_aspect"))
    elif layer.type == "ImageData" and layer.blocks["image_data_param"].new_height:
        size = [layer.blocks["image_data_param"].new_height, layer.blocks["image_data_param"].new_width]
    if size is None:
        return {}
    transform = layer.blocks.get("transform_param")
    return {"resize": list(size), "keep_aspect": keep_aspect, "crop_size": transform.crop_size if transform else 0}


def last_test_figures(run_dir: str) -> tuple[dict[str, float], dict[str, list[float | None]]]:
    """The outputs of the run's last test pass of test net 0, and each class's accuracy in it by Accuracy top
    (:mod:`netspec.training.per_class`; {} when the net has none)."""
    path = run_folder.metrics_path(run_dir)
    if not os.path.isfile(path):
        raise ZooError(f"{run_dir}: no {run_folder.METRICS} (is it a run folder of netspec train?)")
    tests = [e for e in run_folder.read_metrics(path) if e["phase"] == "TEST" and not e.get("test_net")]
    if not tests:
        return {}, {}
    last = tests[-1]
    return ({k: float(last[k]) for k in run_folder.event_outputs(last) if isinstance(last[k], (int, float))},
            per_class_figures(last.get("per_class")))


def publish(request: PublishRequest, zoo: Zoo) -> ModelCard:
    """Build the model folder, check the weights load into the deploy net, and install it into ``zoo``."""
    check_name(request.name)
    check_version(request.version)
    zoo.refuse_existing(request.name, request.version, request.force)
    if request.run_dir is None and (request.net is None or request.weights is None):
        raise ZooError("give the deploy net (--net) and the weights (--weights), or the run folder (--run) they "
                       "come from")
    sources = run_folder.read_sources(request.run_dir) if request.run_dir else {}
    deploy = request.net or run_deploy_net(request.run_dir, sources)
    weights = request.weights or run_weights(request.run_dir)
    net_label = request.net or "the deploy net derived from the run"
    trust = dataclasses.replace(request.trust, python_layers=False, python_refusal=PYTHON_REFUSAL)
    graph = compile_net(parse_net(deploy, layer_schemas()), phase="TEST", trust=trust, where=net_label)
    net = Net(graph, output_folder=OutputFolder(remedy="since its users run it in folders of their own"))
    report = net.load_weights(weights)
    missing = [name for name in report.missing if net.params.get(name)]
    if missing:
        raise ZooError(f"{weights} does not hold the weights of layer(s) {', '.join(missing)} of the deploy "
                       f"net {request.net or '(derived from the run)'}")
    input_name, shape = deploy_input(net)
    shape_problem = input_shape_problem(list(shape))
    if shape_problem:
        raise ZooError(f"{net_label}: the input '{input_name}' {shape_problem}")
    staged = zoo.staging_folder(request.name)
    try:
        text = None if request.net else deploy  # (the deploy net derived from the run)
        if request.net and uses_modules(load_yaml(*read_source(request.net))):
            text = config_yaml(render_net(request.net))  # (modules and includes expanded: it reads no other file)
        if text is None:
            shutil.copyfile(request.net, os.path.join(staged, DEPLOY))
        else:
            with open(os.path.join(staged, DEPLOY), "w", encoding="utf-8") as handle:
                handle.write(text)
        shutil.copyfile(weights, os.path.join(staged, WEIGHTS))
        card = _build_card(request, net, shape, sources, staged)
        with open(os.path.join(staged, CARD), "w", encoding="utf-8") as handle:
            handle.write(card_yaml(card))
        write_readme(staged, card)
    except OSError as exc:  # (a full disk, a zoo made read-only)
        shutil.rmtree(staged, ignore_errors=True)
        raise ZooError(f"{zoo.root}: cannot publish {request.name}@{request.version}: {exc.strerror or exc}; the "
                       "zoo is as it was") from None
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    try:
        zoo.install(staged, force=request.force)
    except OSError as exc:
        shutil.rmtree(staged, ignore_errors=True)
        raise ZooError(f"{zoo.root}: cannot install {request.name}@{request.version}: {exc.strerror or exc}; "
                       "netspec zoo verify says what the zoo holds") from None
    return card


def run_deploy_net(run_dir: str, sources: dict) -> str:
    """The deploy net (YAML text) derived from the train net the run read, where it read it (its data's paths
    resolve there), while that file still holds the text the run trained (its copy in RUN/config/)."""
    train_net = sources.get("train_net")
    copy = run_folder.config_copy(run_dir, sources, train_net)
    if copy is not None and os.path.isfile(train_net) and read_source(train_net)[0] != read_source(copy)[0]:
        raise ZooError(f"{run_dir}: its train net {train_net} has changed since the run trained it; give the deploy "
                       f"net with --net (netspec deploy-net {copy} --input-shape C,H,W derives it from the copy the "
                       "run kept)")
    if not train_net or not os.path.isfile(train_net):
        where = f"its train net {train_net} is gone" if train_net else "it does not name a train net file"
        raise ZooError(f"{run_dir}: cannot derive the deploy net from the run ({where}); give it with --net")
    try:
        return deploy_net_yaml(derive_deploy_net(train_net), train_net)
    except NetspecError as exc:
        raise ZooError(f"{run_dir}: cannot derive the deploy net from the run's train net ({exc}); give it with "
                       "--net") from None


def run_weights(run_dir: str) -> str:
    """The weights of the run's latest snapshot."""
    weights = run_folder.last_snapshot_weights(run_dir)
    if weights is None:
        raise ZooError(f"{run_dir}: no snapshot weights (*_iter_N.weights.h5) to publish; give them with --weights")
    return weights


def _build_card(request: PublishRequest, net, shape, sources: dict, staged: str) -> ModelCard:
    preprocessing, provenance, metrics, extra, labels, size = {}, Provenance(), {}, {}, [], {}
    channel_order, per_class = request.channel_order, {}
    if request.run_dir:
        metrics, per_class = last_test_figures(request.run_dir)
        layer, test_layer = data_layers(sources)
        test_layer = test_layer or layer  # predict prepares images as validation did, with its transform_param
        transform = test_layer.blocks.get("transform_param") if test_layer is not None else None
        if transform is not None:
            preprocessing = {"scale": transform.scale, "mean_value": list(transform.mean_value)}
            channel_order = transform.channel_order
            if transform.mean_file:
                shutil.copyfile(transform.mean_file, os.path.join(staged, "mean.npy"))
                preprocessing["mean_file"] = "mean.npy"
        size = image_size(test_layer, shape) if test_layer is not None else {}
        provenance.dataset_sha256 = dataset_sha256(layer) if layer is not None else None
        labels = dataset_label_names(layer) if layer is not None else []
        extra = _copy_training_configs(request.run_dir, sources, staged)
    for key, path in (("train_net", request.train_net), ("solver", request.solver)):
        if path:
            shutil.copyfile(path, os.path.join(staged, CONFIGS[key]))
            extra[key] = CONFIGS[key]
    if request.scale is not None:
        preprocessing["scale"] = request.scale
    if request.mean_value is not None:
        preprocessing["mean_value"] = request.mean_value
    if request.labels_file:
        labels = _label_names(request.labels_file)
    _check_label_count(labels, net, request)
    with h5py.File(os.path.join(staged, WEIGHTS), "r") as handle:
        origin = weights_origin(handle)
        imported = origin.get("format") == "onnx"
        provenance.iterations = None if request.caffe or imported else int(handle.attrs.get("iteration", 0))
        provenance.config_hash = str(handle.attrs.get("config_hash", ""))
    provenance.caffe = request.caffe
    if imported:
        provenance.imported = ImportOrigin(format="onnx", file=origin.get("file", ""), sha256=origin.get("sha256", ""),
                                           producer=origin.get("producer", ""),
                                           opset=int(origin["opset"]) if origin.get("opset") else None)
        if not request.run_dir and not extra:
            extra = _fine_tuning_configs(staged)

    provenance.netspec_version = __version__
    provenance.date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    channels = request.channels or ("GRAY" if shape[0] == 1 else channel_order)
    spec = InputSpec(shape=list(shape), channels=channels, label_names=labels, **preprocessing, **size)
    if resize_problem(spec):  # a deploy net (--net) that does not take what the run's TEST phase made: not recorded
        spec = dataclasses.replace(spec, resize=None, keep_aspect=False, crop_size=0)
    card = ModelCard(name=request.name, version=request.version, summary=request.summary, license=request.license,
                     authors=list(request.authors), deploy_net=DEPLOY, weights=WEIGHTS, input=spec,
                     metrics=metrics, per_class=per_class, provenance=provenance, **extra)
    card.files = [ModelFile(path=name, size=os.path.getsize(os.path.join(staged, name)),
                            sha256=file_sha256(os.path.join(staged, name))) for name in sorted(os.listdir(staged))]
    return card


def _fine_tuning_configs(staged: str) -> dict[str, str]:
    """For an imported classifier: a train/val net made from its deploy net and a solver, written into ``staged``
    so that ``netspec zoo finetune`` can train it (the card's fields naming them)."""
    train = train_net_from_deploy(render_net(os.path.join(staged, DEPLOY)))
    write_bytes(os.path.join(staged, CONFIGS["train_net"]),
                ("# made from the deploy net for fine-tuning (the Data layers' sources are placeholders)\n"
                 + config_yaml(train)).encode("utf-8"))
    solver = config_yaml(finetune_solver(CONFIGS["train_net"]))
    write_bytes(os.path.join(staged, CONFIGS["solver"]), solver.encode("utf-8"))
    return dict(CONFIGS)


def _check_label_count(labels: list[str], net, request: PublishRequest) -> None:
    """Label names, when there are any, must name exactly the classes the net scores."""
    output = scores_blob(net, request.net or "the deploy net derived from the run")
    classes = class_count(net, output)
    if labels and len(labels) != classes:
        where = request.labels_file or "the run's dataset manifest"
        raise ZooError(f"{where} names {len(labels)} classes but the deploy net scores {classes} ('{output}'); "
                       "set the last layer's num_output to the number of classes and train again, or give the "
                       "label names that match with --labels")


def _copy_training_configs(run_dir: str, sources: dict, staged: str) -> dict[str, str]:
    """Copy the run's solver and train net (from RUN_DIR/config) as solver.yaml and train_net.yaml; a train net
    that includes other files is expanded from the file the run read, while that still holds what it trained
    (else it is left out: the model reads no file but its own)."""
    copied = {}
    for key, target in CONFIGS.items():
        copy = run_folder.config_copy(run_dir, sources, sources.get(key))
        if not copy:
            continue
        text = read_source(copy)[0]
        if key == "train_net" and "include" in (load_yaml(text, copy) or {}):
            original = sources[key]
            if not os.path.isfile(original) or read_source(original)[0] != text:
                continue
            text = config_yaml(render_net(original))
        with open(os.path.join(staged, target), "w", encoding="utf-8") as handle:
            handle.write(text)
        copied[key] = target
    return copied


def _label_names(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError as exc:
        raise NetspecError(f"{path}: cannot read the label names: {exc.strerror}") from None

