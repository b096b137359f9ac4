"""ONNX models as netspec nets: ``netspec import onnx`` and :func:`import_onnx`.

The model is read defensively (a file that is not ONNX, a truncated one,
external data outside the model's folder, control flow, quantised ops, a
cycle or an absurd node count are each refused in one line), its inputs'
dynamic dimensions are fixed (``batch``, ``input_shape``), and ONNX's own
shape inference gives every tensor a static shape.  Whatever can be computed
once is: constant subgraphs (``Constant``, ``ConstantOfShape``, ``Shape`` of a
static tensor and the arithmetic on it, evaluated by ONNX's reference
implementation), ``Identity`` and inference ``Dropout``.  Every other node
becomes layers (:mod:`netspec.interop.onnx_ops`); the net is compiled, its
blobs' shapes checked against ONNX's, and its weights set.
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
from dataclasses import dataclass, field

import numpy
import yaml

from netspec import errors
from netspec.atomic import write_bytes
from netspec.engine.net import Net, load_net
from netspec.engine.trust import Trust
from netspec.errors import ConfigError, ModelImportError, ShapeError, first_line
from netspec.interop.onnx_ops import CONVERTERS, NEAREST, Builder, ConversionError, Node
from netspec.interop.onnx_patterns import fold_batchnorm as fold_batchnorm_into_convolutions
from netspec.interop.onnx_patterns import recognise
from netspec.spec.yaml_text import config_yaml

OPSETS = range(9, 22)  # the default domain's versions read
MAX_NODES = 100_000  # more is a malformed (or hostile) model, not a network
MAX_FOLDED_BYTES = 4 << 30  # the values constant subgraphs may make (a zoo model's weights drawn by ConstantOfShape)
CONTROL_FLOW = {"If", "Loop", "Scan"}
QUANTISED = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger", "QLinearAdd", "QLinearMul"}
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64"}
SHAPE_VALUES = 64  # constants this small go to shape inference with their values (shapes, axes, indices)


@dataclass
class OnnxImport:
    """An imported model: the net as plain data (``net``: name and layers), its weights (layer name: arrays in
    the layer's blob order), and what became of each node."""

    net: dict
    weights: dict[str, list[numpy.ndarray]]
    opset: int
    producer: str
    mapped: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (node, operator, layer types)
    folded: list[tuple[str, str]] = field(default_factory=list)  # (node, operator) computed once, or aliases
    notes: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # sizes the model fixed that batch and input_shape changed

    def cause(self) -> str:
        """Why the net's shapes could differ from the model's: a changed size the model's own shapes fix, else a
        bug of the importer."""
        if self.changed:
            return (f"{'; '.join(self.changed)}: the model fixes that size in its own shapes (a Reshape to a "
                    "constant shape); import it at its own")
        return "a bug of the importer"

    def text(self, source: str) -> str:
        """The net as the YAML text of a net file, headed by where it came from (on one comment line, whatever
        the file's name and the model's producer hold)."""
        origin = printable(f"{source} by netspec import onnx (opset {self.opset}"
                           f"{', ' + self.producer if self.producer else ''})")
        return (f"# imported from {origin}\n"
                + config_yaml(self.net))

    def summary(self) -> list[str]:
        """What became of the operators, in a few lines."""
        layers = collections.defaultdict(collections.Counter)
        for _, op, kinds in self.mapped:
            layers[op][" + ".join(kinds) or "(nothing: an alias)"] += 1
        lines = [f"{op} x{sum(counts.values())} -> {', '.join(counts)}" for op, counts in sorted(layers.items())]
        folded = collections.Counter(op for _, op in self.folded)
        if folded:
            lines.append("folded away: " + ", ".join(f"{op} x{count}" for op, count in sorted(folded.items())))
        return lines + self.notes

    def build(self) -> Net:
        """The net (TEST phase, never run here) with the imported weights in its blobs."""
        net = load_net(yaml.safe_dump(self.net, sort_keys=False), phase="TEST", trust=Trust(outputs_anywhere=True))
        for name, arrays in self.weights.items():
            for index, (blob, array) in enumerate(zip(net.params[name], arrays)):
                if blob.shape != array.shape:
                    raise ModelImportError(f"layer '{name}' blob {index}: the model gives {list(array.shape)}, the "
                                           f"layer holds {list(blob.shape)} ({self.cause()})")
                blob.data[...] = array
        return net


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ModelImportError("ONNX import needs the onnx package: python3 -m pip install 'netspec[onnx]'") from None
    return onnx


def read_model(path: str):
    """The ONNX model in ``path``, its external data (only from files inside its folder) loaded."""
    onnx = _onnx()
    from onnx import external_data_helper

    if not os.path.isfile(path):
        raise ModelImportError(f"{path}: no such file")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and onnx's own errors: not a model
        raise ModelImportError(f"{path}: not an ONNX model ({first_line(exc)})") from None
    if not model.HasField("graph") or not model.ir_version:
        raise ModelImportError(f"{path}: not an ONNX model (no graph, or no IR version)")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        location = external_data_helper.ExternalDataInfo(tensor).location
        try:
            target = os.path.realpath(os.path.join(folder, location))
        except ValueError:  # (a NUL byte)
            target = ""
        if not target or os.path.isabs(location) or os.path.commonpath([folder, target]) != folder or \
                not os.path.isfile(target):
            raise ModelImportError(f"{path}: tensor '{printable(tensor.name)}' keeps its data in "
                                   f"'{printable(location)}', outside the model's folder or not a file there: a "
                                   "model may read only files beside it")
    try:
        external_data_helper.load_external_data_for_model(model, folder)
    except Exception as exc:  # noqa: BLE001 - onnx's checker and the file system raise several types
        raise ModelImportError(f"{path}: its external data cannot be read ({first_line(exc)})") from None
    return model


def printable(text) -> str:
    """``text`` (a model's name, someone else's) on one line, its control characters escaped."""
    return errors.printable(text, one_line=True)



def import_onnx(source, batch: int | None = None, input_shape: tuple[int, ...] | None = None,
                fold_batchnorm: bool = False) -> OnnxImport:
    """Import an ONNX model (a path, or an ``onnx.ModelProto``) as a netspec net and its weights.

    ``batch`` sets the first axis of every input, ``input_shape`` the others
    (C, H, W) where the model leaves them dynamic.  ``fold_batchnorm`` folds
    each BatchNormalization after a convolution into its weights and bias
    (a faster net, with no BatchNorm left to fine-tune).  ModelImportError,
    in one line naming the node, for anything netspec cannot express.
    """
    onnx = _onnx()
    where = source if isinstance(source, str) else "the model"
    try:
        batch = None if batch is None else int(batch)
        input_shape = None if input_shape is None else tuple(int(size) for size in input_shape)
    except (TypeError, ValueError):
        raise ModelImportError(f"batch and input_shape take whole numbers (input_shape: a tuple such as (3, 224, "
                               f"224)), not {batch!r} and {input_shape!r}") from None
    if (batch is not None and batch < 1) or (input_shape and min(input_shape) < 1):
        raise ModelImportError(f"batch and input_shape take positive sizes, not {batch} and {input_shape}")
    model = read_model(source) if isinstance(source, str) else source
    if not isinstance(source, str) and any(onnx.external_data_helper.uses_external_data(tensor) for tensor in
                                           onnx.external_data_helper._get_all_tensors(model)):
        raise ModelImportError(f"{where}: keeps tensors in external files: give its path, so that only files beside "
                               "it are read")
    try:
        return _import(model, where, batch, input_shape, fold_batchnorm)
    except MemoryError:
        raise ModelImportError(f"{where}: out of memory while importing it (its constants, folded, are too large "
                               "for this machine)") from None


def _import(model, where: str, batch, input_shape, fold_batchnorm: bool) -> OnnxImport:
    """:func:`import_onnx` of a model read."""
    graph = model.graph
    if len(graph.node) > MAX_NODES:
        raise ModelImportError(f"{where}: {len(graph.node):,} nodes, more than the {MAX_NODES:,} netspec reads")
    opset = _opset(model, where)
    constants = {tensor.name: _array(tensor, where) for tensor in graph.initializer}
    nodes = _in_order(graph.node, where)
    _refuse(nodes, opset, where)
    inputs, changed = _inputs(graph, nodes, constants, batch, input_shape, where)
    made = {output for node in nodes for output in node.output} | set(inputs) | set(constants)
    unmade = [output.name for output in graph.output if output.name not in made]
    if unmade:
        raise ModelImportError(f"{where}: graph output '{printable(unmade[0])}' is made by no node (nor is it an "
                               "input or a constant)")
    result = OnnxImport(net={"name": graph.name or "imported", "layers": []}, weights={}, opset=opset,
                        producer=" ".join(filter(None, (model.producer_name, model.producer_version))),
                        changed=changed)
    try:
        remaining, shapes = nodes, _infer(model, inputs, constants, nodes, where)
        while True:  # (a shape computed from folded values can let more fold: PyTorch's attention reshapes)
            folded = _fold(remaining, shapes, constants, opset, result, where)
            if len(folded) == len(remaining):
                break
            remaining, shapes = folded, _infer(model, inputs, constants, folded, where)
    except ModelImportError as exc:
        if not changed:
            raise
        raise ModelImportError(f"{exc} ({result.cause()})") from None
    outputs = {output.name for output in graph.output}
    remaining, notes = recognise(remaining, constants, outputs)
    result.notes.extend(notes)
    if fold_batchnorm:
        remaining, notes = fold_batchnorm_into_convolutions(remaining, constants, outputs)
        result.notes.extend(notes)
        shapes.update({name: value.shape for name, value in constants.items() if name not in shapes})
    builder = Builder(names={*inputs}, tensors={*inputs, *constants, *(name for node in nodes for name in
                                                                      (*node.input, *node.output))})
    for name, shape in inputs.items():
        builder.layers.append({"name": name, "type": "Input", "top": [name],
                               "input_param": {"shape": [{"dim": list(shape)}]}})
    read = {name for node in remaining for name in node.input} | {output.name for output in graph.output}
    for index, node in enumerate(remaining):
        _convert(builder, node, index, opset, shapes, constants, read, result, where)
    _outputs(builder, graph, constants, where)
    result.net["layers"] = builder.layers
    result.weights = builder.weights
    _check_shapes(result, shapes, builder, where)
    return result


def _opset(model, where: str) -> int:
    versions = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    opset = versions.get("ai.onnx")
    if opset is None or opset not in OPSETS:
        raise ModelImportError(f"{where}: opset {opset} of the default domain: netspec reads opsets "
                               f"{OPSETS.start} to {OPSETS.stop - 1}")
    return opset


def _array(tensor, where: str) -> numpy.ndarray:
    from onnx import numpy_helper

    if any(size < 0 for size in tensor.dims):
        raise ModelImportError(f"{where}: tensor '{printable(tensor.name)}' declares the sizes {list(tensor.dims)}: a "
                               "constant's sizes are whole numbers")
    try:
        value = numpy_helper.to_array(tensor)
    except Exception as exc:  # noqa: BLE001 - a malformed tensor fails in NumPy or onnx, in several types
        raise ModelImportError(f"{where}: tensor '{tensor.name}' cannot be read ({first_line(exc)})") from None
    return value.astype(numpy.float32) if value.dtype in (numpy.float16, numpy.float64) else value


def _in_order(nodes, where: str) -> list:
    """The nodes in an order where each comes after those whose outputs it reads (ModelImportError naming a node
    of a cycle)."""
    producer = {output: index for index, node in enumerate(nodes) for output in node.output if output}
    waiting = [sum(1 for name in set(node.input) if name in producer) for node in nodes]
    readers = collections.defaultdict(list)
    for index, node in enumerate(nodes):
        for name in set(node.input):
            if name in producer:
                readers[producer[name]].append(index)
    ready = collections.deque(index for index, count in enumerate(waiting) if count == 0)
    order = []
    while ready:
        index = ready.popleft()
        order.append(nodes[index])
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    if len(order) < len(nodes):
        stuck = next(node for index, node in enumerate(nodes) if waiting[index])
        raise ModelImportError(f"{where}: node '{stuck.name or stuck.op_type}' ({stuck.op_type}) is part of a cycle: "
                               "an ONNX graph is acyclic")
    return order


def _refuse(nodes, opset: int, where: str) -> None:
    """ModelImportError for control flow, quantised operators, other domains' operators, and attributes an
    operator does not have at ``opset`` (which would be ignored)."""
    from onnx import defs

    for node in nodes:
        label = f"{where}: node '{node.name or node.op_type}' ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            raise ModelImportError(f"{label} is of the domain '{node.domain}': netspec reads ONNX's own operators")
        try:
            known = defs.get_schema(node.op_type, opset).attributes
        except defs.SchemaError:  # (an operator ONNX does not know: named where it is converted)
            known = None
        unknown = [attribute.name for attribute in node.attribute if known is not None and attribute.name not in known]
        if unknown:
            raise ModelImportError(f"{label}: attribute '{printable(unknown[0])}' is not one of {node.op_type}'s at "
                                   f"opset {opset} ({', '.join(sorted(known)) or 'it takes none'})")
        if node.op_type in CONTROL_FLOW:
            raise ModelImportError(f"{label}: control flow has no place in netspec's static graph (export the "
                                   "model with the branch or loop unrolled)")
        if node.op_type in QUANTISED:
            raise ModelImportError(f"{label}: a quantised (integer) model; netspec imports float models (export "
                                   "the model before quantisation)")


def _inputs(graph, nodes, constants, batch, input_shape, where: str) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The shape of each real input (a graph input that no initializer or node gives), its axes set by ``batch``
    and ``input_shape`` where given, its dynamic ones needing them; and the sizes the model fixed that they
    changed, in words."""
    produced = {output for node in nodes for output in node.output}
    inputs, changed = {}, []
    for value in graph.input:
        if value.name in constants or value.name in produced:
            continue
        tensor = value.type.tensor_type
        if tensor.elem_type not in FLOAT_TYPES:
            kind = "int8/uint8: a quantised model" if tensor.elem_type in (2, 3) else f"element type {tensor.elem_type}"
            raise ModelImportError(f"{where}: input '{value.name}' is {kind}; netspec's nets take float inputs")
        axes = list(tensor.shape.dim)
        if input_shape and len(input_shape) != len(axes) - 1:
            raise ModelImportError(f"{where}: --input-shape gives {len(input_shape)} sizes, but input '{value.name}' "
                                   f"has {len(axes) - 1} axes after the batch (give them all: C,H,W)")
        dims = []
        for axis, dim in enumerate(axes):
            given = batch if axis == 0 else input_shape[axis - 1] if input_shape else None
            if given is not None:
                dims.append(int(given))
                if dim.dim_value > 0 and dim.dim_value != given:
                    changed.append(f"input '{value.name}' axis {axis} from the model's {dim.dim_value} to {given}")
            elif dim.dim_value > 0:
                dims.append(int(dim.dim_value))
            else:
                option = "--batch (batch=)" if axis == 0 else "--input-shape (input_shape=)"
                raise ModelImportError(f"{where}: input '{value.name}' has the dynamic axis {axis} "
                                       f"('{dim.dim_param or '?'}'): give its size with {option}")
        inputs[value.name] = tuple(dims)
    if not inputs:
        raise ModelImportError(f"{where}: the model takes no input")
    return inputs, changed


def _infer(model, inputs, constants, nodes, where: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from ONNX's shape inference on the graph of ``nodes`` with the inputs fixed and
    ``constants`` as initializers."""
    import onnx
    from onnx import helper, numpy_helper

    used = {name for node in nodes for name in node.input}
    small = {name: value for name, value in constants.items() if name in used and value.size <= SHAPE_VALUES}
    declared = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
                for name, value in constants.items() if name in used and name not in small]
    graph = helper.make_graph(  # (large constants, weights, by type and shape only: inference reads no weights)
        list(nodes), "inferred",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name, shape in inputs.items()]
        + declared, [helper.make_tensor_value_info(output.name, output.type.tensor_type.elem_type, None)
                     for output in model.graph.output if output.name not in inputs],  # (the shapes left to --batch)
        [numpy_helper.from_array(value, name) for name, value in small.items()])
    # (from IR 4 on, initializers need not be listed as inputs to count: older models' may not be)
    probe = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx's InferenceError, ValidationError and kin
        raise ModelImportError(f"{where}: ONNX's shape inference refuses the model ({first_line(exc)})") from None
    shapes = {name: tuple(value.shape) for name, value in constants.items()}
    shapes.update(inputs)
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(dim.dim_value > 0 or dim.HasField("dim_value")
                                            for dim in tensor.shape.dim):
            shapes[value.name] = tuple(int(dim.dim_value) for dim in tensor.shape.dim)
    return shapes


def _fold(nodes, shapes, constants, opset: int, result: OnnxImport, where: str) -> list:
    """Compute once what needs no input (constant subgraphs, Shape of static tensors), adding the values to
    ``constants``; the nodes that remain."""
    from onnx.reference import ReferenceEvaluator

    remaining, folded_bytes = [], 0
    for node in nodes:
        inputs = [name for name in node.input if name]
        label = node.name or node.op_type
        if node.op_type in ("Shape", "Size") and inputs[0] in shapes and inputs[0] not in constants:
            shape = numpy.array(shapes[inputs[0]], dtype=numpy.int64)
            attrs = {a.name: a.i for a in node.attribute}
            value = (shape[attrs.get("start", 0):attrs.get("end", len(shape))] if node.op_type == "Shape"
                     else numpy.array(shape.prod(), dtype=numpy.int64))
            constants[node.output[0]] = value
        elif node.op_type not in RANDOM and all(name in constants for name in inputs):
            # (the values it will make, where shape inference knows their shapes, before they are made: a tiny
            # model may ask for gigabytes; float32's 4 bytes a value)
            if folded_bytes + 4 * sum(math.prod(shapes[name]) for name in node.output if name in shapes) > \
                    MAX_FOLDED_BYTES:
                raise _too_many_values(where, label)
            try:
                values = ReferenceEvaluator(_one_node_model(node, opset)).run(
                    None, {name: constants[name] for name in inputs})
            except Exception as exc:  # noqa: BLE001 - any of NumPy's errors, on a model's values
                raise ModelImportError(f"{where}: node '{label}' ({node.op_type}) on constants fails in ONNX's "
                                       f"reference implementation ({first_line(exc)})") from None
            for name, value in zip(node.output, values):
                constants[name] = _float32(numpy.asarray(value))
            folded_bytes += sum(constants[name].nbytes for name in node.output if name in constants)
            if folded_bytes > MAX_FOLDED_BYTES:
                raise _too_many_values(where, label)
        else:
            remaining.append(node)
            continue
        result.folded.append((label, node.op_type))
    return remaining


def _too_many_values(where: str, label: str) -> ModelImportError:
    return ModelImportError(f"{where}: its constant subgraphs make more than {MAX_FOLDED_BYTES >> 30} GiB of values "
                            f"(node '{label}')")


def _one_node_model(node, opset: int):
    """A model of ``node`` alone at ``opset`` (the reference implementation picks the operator's version from a
    model's opset, not a lone node's)."""
    from onnx import helper

    inputs = [helper.make_empty_tensor_value_info(name) for name in node.input if name]
    graph = helper.make_graph([node], "node", inputs, [helper.make_empty_tensor_value_info(n) for n in node.output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float32(value: numpy.ndarray) -> numpy.ndarray:
    return value.astype(numpy.float32) if value.dtype in (numpy.float16, numpy.float64) else value


def _convert(builder: Builder, proto, index: int, opset: int, shapes, constants, read: set[str],
             result: OnnxImport, where: str) -> None:
    """Add the layers of one node (ModelImportError naming it where it cannot be expressed); of its outputs but
    the first, those nothing ``read`` are left out."""
    from onnx import helper

    label = proto.name or f"{proto.op_type}_{index}"
    described = ", ".join(f"{name} {list(shapes[name])}" if name in shapes else name
                          for name in proto.input if name)
    outputs = [proto.output[0], *(name if name in read else "" for name in proto.output[1:])]
    missing = [name for name in [*proto.input, *outputs] if name and name not in shapes]
    if missing:
        raise ModelImportError(f"{where}: node '{label}' ({proto.op_type}): tensor '{missing[0]}' keeps a dynamic "
                               "shape after --batch and --input-shape fixed the inputs' (give the sizes the model "
                               "leaves open)")
    attrs = {attr.name: _attribute(helper.get_attribute_value(attr)) for attr in proto.attribute}
    node = Node(label, proto.op_type, list(proto.input), outputs, attrs, opset, shapes, constants)
    convert = CONVERTERS.get(proto.op_type)
    if convert is None:
        nearest = NEAREST.get(proto.op_type)
        raise ModelImportError(f"{where}: node '{label}' ({proto.op_type}; inputs {described}): netspec has no "
                               f"layer for {proto.op_type}" + (f"; nearest: {nearest}" if nearest else ""))
    before = len(builder.layers)
    try:
        convert(builder, node)
    except ConversionError as exc:
        raise ModelImportError(f"{where}: node '{printable(label)}' ({proto.op_type}; inputs {described}): "
                               f"{printable(exc)}") from None
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:  # (attributes of wrong types)
        raise ModelImportError(f"{where}: node '{printable(label)}' ({proto.op_type}; inputs {described}): a "
                               f"malformed attribute or input ({printable(first_line(exc))})") from None
    kinds = [layer["type"] for layer in builder.layers[before:]]
    if kinds:
        result.mapped.append((label, proto.op_type, kinds))
    else:
        result.folded.append((label, proto.op_type))


def _attribute(value):
    """An attribute's value as plain Python (strings decoded, lists as lists)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_attribute(item) for item in value]
    return value


def _outputs(builder: Builder, graph, constants, where: str) -> None:
    """Each graph output a blob of its name: an output that is another tensor's alias gets a Split naming it."""
    for output in graph.output:
        if output.name in constants:
            raise ModelImportError(f"{where}: output '{output.name}' is a constant: it needs no network")
        if builder.blob(output.name) != output.name:
            builder.layer("Split", builder.unique(output.name), [output.name], [output.name])


def _check_shapes(result: OnnxImport, shapes, builder: Builder, where: str) -> None:
    """Compile the net and check each blob named after a tensor has the tensor's shape."""
    from netspec.engine.net import compile_net
    from netspec.engine.registry import layer_schemas
    from netspec.spec.net_spec import parse_net

    try:
        graph = compile_net(parse_net(yaml.safe_dump(result.net, sort_keys=False), layer_schemas()), phase="TEST")
    except (ConfigError, ShapeError) as exc:
        cause = f" ({result.cause()})" if result.changed else ""
        raise ModelImportError(f"{where}: the net made from it is refused: {printable(first_line(exc))}"
                               f"{cause}") from None
    for name, shape in graph.blob_shapes.items():
        if name in shapes and tuple(shape) != shapes[name]:
            raise ModelImportError(f"{where}: netspec computes {list(shape)} for tensor '{name}', ONNX "
                                   f"{list(shapes[name])} ({result.cause()})")


def import_onnx_file(path: str, out: str | None = None, weights: str | None = None, batch: int | None = None,
                     input_shape: tuple[int, ...] | None = None,
                     fold_batchnorm: bool = False) -> tuple[str, str, OnnxImport]:
    """Import the ONNX model ``path`` (:func:`import_onnx`) and write its net (``out``, default beside it with
    ``.yaml``) and weights (``weights``, default beside the net with ``.weights.h5``), the weights first: nothing
    is written unless the whole model imports.  Returns both paths and the import."""
    out = out or os.path.splitext(path)[0] + ".yaml"
    weights = weights or os.path.splitext(out)[0] + ".weights.h5"
    for target in (out, weights):  # (before the work)
        if not os.path.isdir(os.path.dirname(os.path.abspath(target))):
            raise ModelImportError(f"{target}: its folder does not exist")
    imported = import_onnx(path, batch, input_shape, fold_batchnorm)
    text = imported.text(os.path.basename(path))
    net = imported.build()
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    origin = {"format": "onnx", "file": os.path.basename(path), "sha256": digest, "producer": imported.producer,
              "opset": str(imported.opset)}
    new = not os.path.exists(weights)
    try:
        net.save_weights(weights, origin=origin)
        write_bytes(out, text.encode("utf-8"))
    except OSError as exc:  # (a full disk: the weights written for the net go too)
        if new and os.path.isfile(weights):
            os.remove(weights)
        raise ModelImportError(f"{exc.filename or out}: cannot write it ({exc.strerror})") from None
    return out, weights, imported
