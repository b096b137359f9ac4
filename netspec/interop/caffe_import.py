"""``netspec import caffe``: Caffe's .prototxt nets (current ``layer {}`` and legacy V1 ``layers {}``) as netspec YAML.

Field names are Caffe's in both, so most of a layer carries over as it is.
What does not (a field netspec does not have, a V1 field with no current
meaning) is listed in the report rather than dropped silently; a layer type
netspec lacks is an error naming it.  Deploy headers (``input:`` with
``input_dim:`` or ``input_shape``) become an Input layer.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field

from netspec.engine.registry import layer_schemas
from netspec.errors import ConfigError
from netspec.interop.prototxt import Message
from netspec.spec.net_spec import NetState, NetStateRule, ParamSpec
from netspec.spec.schema import FilePath

# V1LayerParameter.LayerType names and the current type names
V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution", "DATA": "Data",
    "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power",
    "RELU": "ReLU", "SIGMOID": "Sigmoid", "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence", "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split",
    "SLICE": "Slice", "TANH": "TanH", "THRESHOLD": "Threshold",
}
LAYER_FIELDS = {"name", "type", "bottom", "top", "param", "include", "exclude", "loss_weight", "propagate_down"}
MAX_LAYERS = 100_000  # as many as a netspec net may expand to (ResNet-152 has about 500)
# V1 fields that Caffe's upgrade moves into each learnable blob's ParamSpec (the i-th value into the i-th blob's)
V1_PARAM_FIELDS = {"param": "name", "blob_share_mode": "share_mode", "blobs_lr": "lr_mult",
                   "weight_decay": "decay_mult"}
V1_SHARE_MODES = {0: "STRICT", 1: "PERMISSIVE"}  # DimCheckMode's numbers


@dataclass
class ImportReport:
    """What the import dropped, and what needs the user's attention."""

    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


ROOT_MARKS = ("examples", "models")  # folders a Caffe checkout has at its root


def find_caffe_root(path: str) -> str | None:
    """The nearest folder above ``path`` holding ``examples/`` or ``models/`` (a Caffe checkout), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        if any(os.path.isdir(os.path.join(folder, mark)) for mark in ROOT_MARKS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


@dataclass
class CaffePaths:
    """Caffe reads relative paths against the folder it runs in (``root``); netspec against the file's folder.

    :meth:`rewrite` turns one into the other for a file written to ``out_dir``
    (with no ``root`` known, paths stay as they are); :meth:`note` reports it.
    """

    root: str | None
    out_dir: str
    how: str = ""  # how the root was chosen, for the report
    seen: list[tuple[str, str]] = field(default_factory=list)

    def rewrite(self, path: str) -> str:
        """``path`` as Caffe reads it, relative to the netspec file (absolute paths stay)."""
        if os.path.isabs(path) or path.startswith("~"):
            return path
        moved = path if self.root is None else os.path.relpath(os.path.join(self.root, path), self.out_dir)
        self.seen.append((path, moved))
        return moved

    def note(self, source: str) -> str | None:
        """The report's line on the relative paths of ``source``, or None when it has none."""
        if not self.seen:
            return None
        if self.root is None:
            kept = ", ".join(dict.fromkeys(old for old, _ in self.seen))
            return (f"no folder above {source} holds examples/ or models/, so its paths ({kept}) are kept relative "
                    "to the file; --caffe-root DIR reads them as Caffe run from DIR would")
        moved = ", ".join(dict.fromkeys(f"{old} -> {new}" for old, new in self.seen))
        return (f"Caffe root {self.root} ({self.how}): Caffe reads relative paths against it, so they are rewritten "
                f"relative to the netspec file: {moved}")


def _scalar_or_list(values: list, tp):
    """A repeated field as a list (one value as itself, which netspec reads as a list too), else the last value."""
    if typing.get_origin(tp) is list:
        return values[0] if len(values) == 1 else list(values)
    return values[-1]


def _plain_type(tp):
    """``X | None`` as X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


def _expect(message: Message, fields, nested: bool, where: str) -> None:
    """ConfigError unless each of ``fields`` present in ``message`` holds messages (``nested``) or plain values
    only, as the field's type says (``layer: 5`` or ``type {}`` are no Caffe)."""
    for name in fields:
        for value in message.get(name, []):
            if isinstance(value, Message) != nested:
                raise ConfigError(f"{where}{name} (line {message.lines[name]}): expected "
                                  + ("a message {...}, found a value" if nested else "a value, found a message {...}"))


def convert_message(message: Message, cls, where: str, report: ImportReport, paths: CaffePaths | None = None) -> dict:
    """A Caffe message as the mapping netspec's ``cls`` block reads; unknown fields go to the report.

    File paths are rewritten by ``paths`` (when given) to point where Caffe would read.
    """
    hints = typing.get_type_hints(cls)
    out = {}
    for name, values in message.items():
        if name not in hints:
            report.dropped.append(f"{where}.{name}")
            continue
        tp = _plain_type(hints[name])
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
        _expect(message, [name], dataclasses.is_dataclass(item), f"{where}.")
        if dataclasses.is_dataclass(item):
            converted = [convert_message(v, item, f"{where}.{name}", report, paths) if isinstance(v, Message) else v
                         for v in values]
            out[name] = converted if typing.get_origin(tp) is list else converted[-1]
        elif item is FilePath and paths is not None:
            out[name] = _scalar_or_list([paths.rewrite(str(v)) for v in values], tp)
        else:
            out[name] = _scalar_or_list(values, tp)
    return out


def _layer(message: Message, index: int, v1: bool, schemas: dict, report: ImportReport,
           paths: CaffePaths | None) -> dict:
    plain = ("name", "type", "bottom", "top", "loss_weight", "propagate_down", "blobs_lr", "weight_decay",
             "blob_share_mode")
    _expect(message, plain + (("param",) if v1 else ()), False, f"layer {index}: ")  # (V1: shared blobs' names)
    _expect(message, ("include", "exclude") + (() if v1 else ("param",)), True, f"layer {index}: ")
    name = message.one("name", f"layer{index}")
    kind = message.one("type", "")
    if v1:
        kind = V1_TYPES.get(str(kind), str(kind))
    where = f"layer '{name}': "
    if kind not in schemas:
        raise ConfigError(f"{where}type '{kind}' has no netspec equivalent (netspec layers lists the types)")
    layer = {"name": name, "type": kind}
    for key in ("bottom", "top"):
        if message.get(key):
            layer[key] = _scalar_or_list(message[key], list[str])
    params = [] if v1 else [convert_message(m, ParamSpec, f"{where}param", report) for m in message.get("param", [])]
    if v1:
        for old, new in V1_PARAM_FIELDS.items():
            for i, value in enumerate(message.get(old, [])):
                while len(params) <= i:
                    params.append({})
                params[i][new] = V1_SHARE_MODES.get(value, value) if old == "blob_share_mode" else value
    if params:
        layer["param"] = params
    for key in ("include", "exclude"):
        if message.get(key):
            layer[key] = [convert_message(m, NetStateRule, f"{where}{key}", report) for m in message[key]]
    for key in ("loss_weight", "propagate_down"):
        if message.get(key):
            layer[key] = _scalar_or_list(message[key], list[float])
    for key, values in message.items():
        if key in LAYER_FIELDS or (v1 and key in V1_PARAM_FIELDS):
            continue
        if key in schemas[kind]:
            _expect(message, [key], True, where)
            layer[key] = convert_message(values[-1], schemas[kind][key], f"{where}{key}", report, paths)
        else:
            report.dropped.append(f"{where}{key}")
    if kind == "ImageData" and paths is not None and not layer.get("image_data_param", {}).get("root_folder"):
        # Caffe reads the list's lines against the folder it runs in; netspec, by default, against the list's
        layer.setdefault("image_data_param", {})["root_folder"] = paths.rewrite(".")
    if "transform_param" in schemas[kind]:
        layer.setdefault("transform_param", {})["channel_order"] = "BGR"
        report.notes.append(f"{where}transform_param.channel_order: BGR, as Caffe decoded images (netspec's records "
                            "are RGB and get swapped), so the imported weights see what they saw in Caffe")
    if kind in ("Data", "ImageData") and "data_param" in layer:
        report.notes.append(f"{where}Caffe's LMDB/LevelDB hold Datum records; convert the images with "
                            "netspec convert imageset and point data_param.source at the result")
    return layer


def _input_layers(net: Message) -> list[dict]:
    """Deploy headers (``input`` with ``input_dim`` or ``input_shape``) as Input layers."""
    names = net.get("input", [])
    if not names:
        return []
    if net.get("input_shape"):
        for shape in net["input_shape"]:
            _expect(shape, ["dim"], False, "net: input_shape.")
        shapes = [list(shape.get("dim", [])) for shape in net["input_shape"]]
    else:
        dims = list(net.get("input_dim", []))
        if len(dims) != 4 * len(names):
            raise ConfigError(f"the net declares {len(names)} input(s) but {len(dims)} input_dim values "
                              "(4 per input)")
        shapes = [dims[4 * i:4 * i + 4] for i in range(len(names))]
    if len(shapes) != len(names):
        raise ConfigError(f"the net declares {len(names)} input(s) but {len(shapes)} input_shape(s)")
    return [{"name": name, "type": "Input", "top": name, "input_param": {"shape": {"dim": shape}}}
            for name, shape in zip(names, shapes)]


def import_net(net: Message, paths: CaffePaths | None = None) -> tuple[dict, ImportReport]:
    """A parsed NetParameter as a netspec net (plain data), and the report; ``paths`` rewrites file paths."""
    report = ImportReport()
    schemas = layer_schemas()
    _expect(net, ("name", "input", "input_dim", "force_backward"), False, "net: ")
    _expect(net, ("layer", "layers", "input_shape", "state"), True, "net: ")
    for key in net:
        if key not in ("name", "input", "input_dim", "input_shape", "layer", "layers", "force_backward", "state"):
            report.dropped.append(f"net: {key}")
    current, legacy = net.get("layer", []), net.get("layers", [])
    if current and legacy:
        raise ConfigError("the net mixes 'layer' and legacy 'layers' entries; Caffe itself refuses that")
    if len(current or legacy) > MAX_LAYERS:
        raise ConfigError(f"the net has {len(current or legacy):,} layers, more than the {MAX_LAYERS:,} a net may "
                          "have")
    layers = _input_layers(net)
    layers += [_layer(m, i, bool(legacy), schemas, report, paths) for i, m in enumerate(current or legacy)]
    result = {"name": net.one("name", "")} if net.one("name") else {}
    if net.one("force_backward"):
        result["force_backward"] = True
    if net.get("state"):
        result["state"] = convert_message(net.one("state"), NetState, "net: state", report)
    result["layers"] = layers
    if any(_takes_colour(layer) for layer in layers):
        report.notes.append("Caffe nets take BGR images: publish this one with netspec zoo publish --channels BGR "
                            "(and the mean it was trained with, in B, G, R order)")
    return result, report


def _takes_colour(layer: dict) -> bool:
    """True for an Input layer with a three-channel (N x 3 x H x W) top."""
    if layer["type"] != "Input":
        return False
    shapes = layer.get("input_param", {}).get("shape", [])
    shapes = shapes if isinstance(shapes, list) else [shapes]
    return any(len(dims) == 4 and dims[1] == 3 for dims in (list(shape.get("dim", [])) for shape in shapes))


def copy_caffemodel(net, stored: dict, path: str) -> tuple[list[str], list[str]]:
    """Copy ``stored`` blobs (from :func:`netspec.interop.caffemodel.read_caffemodel`) into ``net`` by layer name.

    Legacy 4-axis blob shapes are reshaped when the counts agree, as Caffe
    did.  A layer's blobs in the file include those it shares with another
    layer (Caffe saves every layer's): each is copied in layer order, so the
    last layer's copy of a shared blob stays, as in Caffe.  Returns ``(layers
    left with their fillers, file layers the net lacks)``; blobs that do not
    fit, or a file that matches no layer, are a DataError naming them.
    """
    from netspec.errors import DataError

    owned = net.owned_params()
    every = {layer.name: list(enumerate(layer.blobs)) for layer in net.layers if layer.blobs}
    missing = [name for name in owned if name not in stored]
    unused = [name for name in stored if name not in every]
    problems = []
    for name, blobs in every.items():
        if name not in stored:
            continue
        if len(stored[name]) != len(blobs):
            problems.append(f"layer '{name}' has {len(stored[name])} blob(s) in the file, {len(blobs)} in the net")
            continue
        for (index, blob), array in zip(blobs, stored[name]):
            if array.shape != blob.shape and array.size != blob.count:
                problems.append(f"layer '{name}' blob {index} is {list(array.shape)} in the file, "
                                f"{list(blob.shape)} in the net")
    if problems:
        raise DataError(f"{path}: the blobs do not match the net: " + "; ".join(problems))
    if owned and len(missing) == len(owned):
        raise DataError(f"{path}: no layer of the file has the name of a layer of net '{net.graph.name}' "
                        f"(file: {', '.join(stored)}; net: {', '.join(owned)})")
    for name, blobs in every.items():
        for (_, blob), array in zip(blobs, stored.get(name, [])):
            blob.data[...] = net.backend.asarray(array.reshape(blob.shape), dtype=blob.dtype)
    return missing, unused


# SolverParameter.SolverType (legacy enum) and the current type names
SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                "ADADELTA": "AdaDelta", "ADAM": "Adam"}
NET_FIELDS = ("net", "train_net", "test_net")


def import_solver(solver: Message, paths: CaffePaths | None = None) -> tuple[dict, ImportReport]:
    """A parsed SolverParameter as a netspec solver (plain data); net paths are pointed at .yaml files.

    ``paths`` rewrites file paths (nets, snapshot_prefix) to point where Caffe would read and write.
    """
    from netspec.spec.solver_spec import SolverParams

    report = ImportReport()
    hints = typing.get_type_hints(SolverParams)
    result = {}
    for key, values in solver.items():
        if key in NET_FIELDS:
            nets = [str(v).rsplit(".prototxt", 1)[0] + ".yaml" for v in values]
            nets = [paths.rewrite(net) for net in nets] if paths is not None else nets
            result[key] = nets if key == "test_net" else nets[-1]
            report.notes.append(f"{key}: {', '.join(map(str, values))} -> {', '.join(nets)} "
                                "(import the net with netspec import caffe)")
        elif key in ("net_param", "train_net_param"):
            result["net" if key == "net_param" else "train_net"] = import_net(values[-1], paths)[0]
        elif key == "solver_type":
            result["type"] = SOLVER_TYPES.get(str(values[-1]), str(values[-1]))
        elif key in hints:
            tp = _plain_type(hints[key])
            item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
            if dataclasses.is_dataclass(item):
                converted = [convert_message(v, item, f"solver: {key}", report) for v in values]
                result[key] = converted if typing.get_origin(tp) is list else converted[-1]
            elif item is FilePath and paths is not None:
                result[key] = paths.rewrite(str(values[-1]))
            else:
                result[key] = list(values) if typing.get_origin(tp) is list else values[-1]
        else:
            report.dropped.append(f"solver: {key}")
    return result, report
