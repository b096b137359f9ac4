"""ONNX import: graphs built with onnx.helper for each operator and its attributes, and the classic models that
ship inside the onnx package, compared with onnxruntime; the CLI; and the models it refuses, in one line each."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import netspec  # noqa: E402, F401
from netspec.errors import ModelImportError  # noqa: E402
from netspec.interop.onnx_import import import_onnx  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
RNG = np.random.default_rng(0)


def model_of(nodes, inputs: dict, constants: dict | None = None, opset: int = 17, outputs=None):
    """A model of ``nodes`` with float inputs ``{name: shape}`` and ``constants`` as initializers; its outputs
    ``outputs`` (default: the last node's first output)."""
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_empty_tensor_value_info(name) for name in (outputs or [nodes[-1].output[0]])],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in (constants or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compare(model, rtol: float = 1e-4, atol: float = 1e-5, **options):
    """Import ``model``, run it in netspec and onnxruntime on the same random inputs, and assert every output
    agrees (``atol`` relative to the output's largest value, where that exceeds 1); the import."""
    imported = import_onnx(model, **options)
    net = imported.build()
    feeds, rng = {}, np.random.default_rng(1)  # (the same inputs whatever ran before)
    for layer in imported.net["layers"]:
        if layer["type"] == "Input":
            feeds[layer["name"]] = rng.standard_normal(net.blobs[layer["name"]].shape).astype(np.float32)
            net.blobs[layer["name"]].data[...] = feeds[layer["name"]]
    net.forward()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    for output, value in zip(model.graph.output, expected):
        got = net.blobs[output.name].data
        assert got.shape == value.shape, output.name
        # (float32 sums in another order: absolute errors grow with the values' scale)
        np.testing.assert_allclose(got, value, rtol=rtol, atol=atol * max(1.0, float(np.abs(value).max())),
                                   err_msg=output.name)
    return imported


def weights(*shape, positive: bool = False):
    values = RNG.uniform(0.5, 1.5, shape) if positive else RNG.standard_normal(shape) * 0.3
    return values.astype(np.float32)


def kinds(imported) -> list[str]:
    return [layer["type"] for layer in imported.net["layers"] if layer["type"] != "Input"]


CONVOLUTIONS = {
    "plain": (dict(kernel_shape=[3, 3]), (2, 4, 7, 7), (6, 4, 3, 3)),
    "padded, strided": (dict(pads=[1, 1, 1, 1], strides=[2, 2]), (1, 4, 8, 7), (5, 4, 3, 3)),
    "grouped, dilated": (dict(group=2, dilations=[2, 2], pads=[2, 1, 2, 1]), (1, 4, 9, 9), (6, 2, 3, 2)),
    "depthwise": (dict(group=4, pads=[1, 1, 1, 1]), (2, 4, 6, 6), (4, 1, 3, 3)),
    "auto_pad SAME_UPPER, odd": (dict(auto_pad="SAME_UPPER"), (1, 3, 7, 7), (4, 3, 3, 3)),
    "rectangular kernel": (dict(pads=[0, 1, 0, 1]), (1, 2, 5, 6), (3, 2, 1, 3)),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_conv(name, bias):
    attrs, x, w = CONVOLUTIONS[name]
    constants = {"w": weights(*w), **({"b": weights(w[0])} if bias else {})}
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], **attrs)
    assert kinds(compare(model_of([node], {"x": x}, constants))) == ["Convolution"]


def test_uneven_padding_is_a_pad_first():
    """TensorFlow's SAME for stride 2 on an even map pads one more after than before."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])
    assert kinds(compare(model_of([node], {"x": (1, 2, 8, 8)}, {"w": weights(3, 2, 3, 3)}))) == ["Pad", "Convolution"]
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2])
    compare(model_of([node], {"x": (1, 2, 8, 8)}, {"w": weights(3, 2, 3, 3)}))
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 0, 2, 1])
    assert kinds(compare(model_of([node], {"x": (1, 2, 6, 6)}))) == ["Pad", "Pooling"]
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 1, 1, 2], count_include_pad=1)
    assert kinds(compare(model_of([node], {"x": (1, 2, 6, 6)}))) == ["Pad", "Pooling"]


@pytest.mark.parametrize("opset, mode, value", [(9, "constant", 1.5), (13, "reflect", None), (13, "edge", None),
                                                (18, "constant", -2.0)])
def test_pad(opset, mode, value):
    if opset < 11:
        node, constants = helper.make_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 3, 0], mode=mode,
                                           value=value), {}
    elif opset < 18:
        node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
        constants = {"pads": np.array([0, 1, 1, 2, 0, 0, 2, 1], dtype=np.int64)}
    else:
        node = helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"], mode=mode)
        constants = {"pads": np.array([1, 2, 0, 3], dtype=np.int64), "value": np.float32(value),
                     "axes": np.array([-1, 1], dtype=np.int64)}
    assert kinds(compare(model_of([node], {"x": (2, 3, 4, 5)}, constants, opset=opset))) == ["Pad"]


POOLS = {
    "max, floor": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]), (1, 2, 8, 8)),
    "max, ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 2, 8, 8)),
    "max, padded": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (2, 3, 7, 6)),
    "max, padded after only (Caffe2's ceil)": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                                                pads=[0, 0, 1, 1]), (1, 2, 12, 12)),
    "average, padding left out": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                  (1, 2, 7, 7)),
    "average, padding counted": ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                                                     count_include_pad=1), (1, 2, 5, 5)),
    "average, ceil": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), (1, 2, 7, 7)),
    "average, one window over the map": ("AveragePool", dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1]),
                                         (1, 3, 6, 6)),
    "global average": ("GlobalAveragePool", {}, (2, 3, 5, 4)),
    "global max": ("GlobalMaxPool", {}, (2, 3, 5, 4)),
}


@pytest.mark.parametrize("name", POOLS)
def test_pooling(name):
    op, attrs, shape = POOLS[name]
    imported = compare(model_of([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": shape}))
    assert kinds(imported) == ["Pooling"]


def test_gemm_with_transposes_scales_and_a_row_bias():
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)
    assert kinds(compare(model_of([node], {"x": (3, 5)}, {"w": weights(4, 5), "c": weights(1, 4)}))) == \
        ["InnerProduct"]
    node = helper.make_node("Gemm", ["x", "w"], ["y"])
    compare(model_of([node], {"x": (2, 6)}, {"w": weights(6, 3)}))


def test_matmul_by_a_matrix_is_an_inner_product_over_the_last_axis_and_of_two_tensors_a_matmul():
    imported = compare(model_of([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (2, 3, 5)},
                                {"w": weights(5, 4)}))
    assert kinds(imported) == ["InnerProduct"]
    imported = compare(model_of([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 4), "b": (2, 4, 5)}))
    assert kinds(imported) == ["MatMul"]


def test_batch_normalization_is_batchnorm_and_scale():
    constants = {"s": weights(3), "b": weights(3), "m": weights(3), "v": weights(3, positive=True)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    assert kinds(compare(model_of([node], {"x": (2, 3, 4, 5)}, constants))) == ["BatchNorm", "Scale"]


ACTIVATIONS = {
    "Relu": ({}, "ReLU"), "LeakyRelu": ({"alpha": 0.1}, "ReLU"), "Sigmoid": ({}, "Sigmoid"), "Tanh": ({}, "TanH"),
    "Elu": ({"alpha": 0.5}, "ELU"), "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, "HardSigmoid"),
    "HardSwish": ({}, "HardSwish"), "Softplus": ({}, "BNLL"), "Abs": ({}, "AbsVal"), "Exp": ({}, "Exp"),
    "Neg": ({}, "Power"),
}


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activations(op):
    attrs, kind = ACTIVATIONS[op]
    assert kinds(compare(model_of([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (2, 3, 4)}))) == [kind]


def test_positive_only_operators():
    for op in ("Log", "Sqrt", "Reciprocal"):
        square = helper.make_node("Mul", ["x", "x"], ["s"])
        shifted = helper.make_node("Add", ["s", "one"], ["p"])
        compare(model_of([square, shifted, helper.make_node(op, ["p"], ["y"])], {"x": (2, 5)},
                         {"one": np.float32(1.0)}))


@pytest.mark.parametrize("opset, bounds, kind", [(9, dict(min=0.0, max=6.0), "ReLU6"), (13, (0.0, None), "ReLU"),
                                                 (13, (-1.0, 0.5), "Clip"), (9, dict(max=0.25), "Clip")])
def test_clip(opset, bounds, kind):
    if isinstance(bounds, dict):
        node, constants = helper.make_node("Clip", ["x"], ["y"], **bounds), {}
    else:
        names = ["lo", "hi" if bounds[1] is not None else ""]
        constants = {name: np.float32(value) for name, value in zip(names, bounds) if name}
        node = helper.make_node("Clip", ["x", *names], ["y"])
    assert kinds(compare(model_of([node], {"x": (2, 3, 4)}, constants, opset=opset))) == [kind]


@pytest.mark.parametrize("slope", [(3, 1, 1), (1,)])
def test_prelu(slope):
    node = helper.make_node("PRelu", ["x", "a"], ["y"])
    assert kinds(compare(model_of([node], {"x": (2, 3, 4, 4)}, {"a": weights(*slope)}))) == ["PReLU"]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", [(11, 1), (13, 1), (13, -1), (11, 3)])
def test_softmax(op, opset, axis):
    """Before opset 13 Softmax normalises over every axis from ``axis`` on, flattened."""
    imported = compare(model_of([helper.make_node(op, ["x"], ["y"], axis=axis)], {"x": (2, 3, 4, 5)}, opset=opset))
    assert op in kinds(imported)


def test_lrn():
    node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-3, beta=0.75, bias=2.0)
    assert kinds(compare(model_of([node], {"x": (2, 8, 3, 3)}))) == ["LRN"]


ARITHMETIC = {
    "add a scalar": ("Add", 0, np.float32(0.5), "Power"),
    "scalar minus x": ("Sub", 1, np.float32(2.0), "Power"),
    "divide by a scalar": ("Div", 0, np.float32(4.0), "Power"),
    "scalar over x": ("Div", 1, np.float32(3.0), "Power"),
    "times a channel's factor": ("Mul", 0, weights(3, 1, 1), "Scale"),
    "plus a channel's bias (4-D)": ("Add", 1, weights(1, 3, 1, 1), "Bias"),
    "minus a per-position constant": ("Sub", 0, weights(4, 5), "Bias"),
    "constant minus x, per channel": ("Sub", 1, weights(3, 1, 1), "Bias"),
    "over a per-channel constant": ("Div", 0, weights(3, 1, 1, positive=True), "Scale"),
    "constant over x, broadcast inside": ("Div", 1, weights(3, 1, 5, positive=True), "Scale"),
}


@pytest.mark.parametrize("name", ARITHMETIC)
def test_arithmetic_with_a_constant(name):
    op, side, value, kind = ARITHMETIC[name]
    inputs = ["x", "k"] if side == 0 else ["k", "x"]
    imported = compare(model_of([helper.make_node(op, inputs, ["y"])], {"x": (2, 3, 4, 5)}, {"k": value}),
                       rtol=1e-4, atol=1e-4)
    assert kinds(imported)[-1] == kind


@pytest.mark.parametrize("op, kind", [("Add", "Eltwise"), ("Sub", "Eltwise"), ("Mul", "Eltwise")])
def test_arithmetic_of_two_tensors(op, kind):
    assert kinds(compare(model_of([helper.make_node(op, ["a", "b"], ["y"])], {"a": (2, 3), "b": (2, 3)}))) == [kind]


def test_sum_max_concat_transpose_flatten():
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["s"]), helper.make_node("Max", ["a", "s"], ["m"]),
             helper.make_node("Concat", ["s", "m"], ["j"], axis=1),
             helper.make_node("Transpose", ["j"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Flatten", ["t"], ["f"], axis=2)]
    imported = compare(model_of(nodes, {"a": (2, 3, 4, 5), "b": (2, 3, 4, 5), "c": (2, 3, 4, 5)}))
    assert kinds(imported) == ["Eltwise", "Eltwise", "Concat", "Permute", "Reshape"]


def test_a_shape_computed_from_the_input_folds_into_a_static_reshape():
    """PyTorch's view(x.size(0), -1): Shape, Gather, Unsqueeze, Concat feeding Reshape."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    constants = {"zero": np.array(0, dtype=np.int64), "axes": np.array([0], dtype=np.int64),
                 "minus_one": np.array([-1], dtype=np.int64)}
    imported = compare(model_of(nodes, {"x": (2, 3, 4, 5)}, constants))
    assert kinds(imported) == ["Reshape"] and len(imported.folded) == 4


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_identity_dropout(opset):
    axes = {"axes": [1]} if opset < 13 else {}
    inputs = [] if opset < 13 else ["axes"]
    nodes = [helper.make_node("Unsqueeze", ["x", *inputs], ["u"], **axes),
             helper.make_node("Identity", ["u"], ["i"]), helper.make_node("Dropout", ["i"], ["d"]),
             helper.make_node("Squeeze", ["d", *inputs], ["y"], **axes)]
    constants = {} if opset < 13 else {"axes": np.array([1], dtype=np.int64)}
    imported = compare(model_of(nodes, {"x": (2, 3)}, constants, opset=opset))
    assert kinds(imported) == ["Reshape", "Reshape"]


def randomised(model, seed: int = 0):
    """A model of the onnx package's zoo with its ConstantOfShape weights (zeros) replaced by seeded random
    values (variances positive), and the input of its last Softmax an output too."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    shapes = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    variances = {node.input[4] for node in graph.node if node.op_type == "BatchNormalization"}
    kept, drawn = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        if node.output[0] in variances:
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) > 1:
            value = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        else:
            value = rng.uniform(-0.1, 0.1, shape)
        drawn.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(drawn)
    scores = [node.input[0] for node in kept if node.op_type == "Softmax"]
    if scores:
        graph.output.append(helper.make_empty_tensor_value_info(scores[-1]))
    return model


ZOO = sorted(name for name in os.listdir(LIGHT) if name.endswith(".onnx")) if os.path.isdir(LIGHT) else []


@pytest.mark.parametrize("name", ZOO)
def test_the_onnx_packages_zoo_models_match_onnxruntime(name):
    model = randomised(onnx.load(os.path.join(LIGHT, name)))
    compare(model, rtol=1e-3, atol=1e-5)


def test_the_cli_writes_a_net_and_weights_that_check_and_export_again(tmp_path):
    path = tmp_path / "squeeze.onnx"
    onnx.save(randomised(onnx.load(os.path.join(LIGHT, "light_squeezenet.onnx"))), path)
    run = subprocess.run([sys.executable, "-m", "netspec", "import", "onnx", str(path), "--batch", "2"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    net, weights = tmp_path / "squeeze.yaml", tmp_path / "squeeze.weights.h5"
    assert f"wrote {net}" in run.stdout and "Conv x26 -> Convolution" in run.stdout and weights.is_file()
    assert "Softmax x1 -> Softmax" in run.stdout and "folded away: Dropout x1" in run.stdout
    check = subprocess.run([sys.executable, "-m", "netspec", "check", str(net), "--weights", str(weights)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    exported = tmp_path / "again.onnx"
    again = subprocess.run([sys.executable, "-m", "netspec", "export", "onnx", str(net), "--weights", str(weights),
                            "-o", str(exported)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    x = RNG.standard_normal((2, 3, 224, 224)).astype(np.float32)
    first, second = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (path, exported))
    expected = np.concatenate([first.run(None, {"data_0": x[i:i + 1]})[0].reshape(1, -1) for i in range(2)])
    np.testing.assert_allclose(second.run(None, {"data_0": x})[0].reshape(2, -1), expected, rtol=1e-3, atol=1e-6)


def refused(tmp_path, model_or_bytes, *options) -> str:
    """The one-line error of ``netspec import onnx`` on a model (or raw bytes), with nothing written."""
    path = tmp_path / "model.onnx"
    if isinstance(model_or_bytes, bytes):
        path.write_bytes(model_or_bytes)
    else:
        onnx.save(model_or_bytes, path)
    run = subprocess.run([sys.executable, "-m", "netspec", "import", "onnx", str(path), *options],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_files_that_are_not_models_are_refused(tmp_path):
    assert "not an ONNX model" in refused(tmp_path, b"\x08\x07this is not protobuf\xff\xff")
    good = model_of([helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 3)}).SerializeToString()
    assert "not an ONNX model" in refused(tmp_path, good[:len(good) // 2])


def test_what_netspec_cannot_express_is_named_with_the_node(tmp_path):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="pick")
    line = refused(tmp_path, model_of([node], {"x": (2, 5)}, {"k": np.array([2], dtype=np.int64)}))
    assert "node 'pick' (TopK; inputs x [2, 5], k [1]): netspec has no layer for TopK" in line
    loop = helper.make_node("If", ["c"], ["y"], then_branch=helper.make_graph([], "t", [], []),
                            else_branch=helper.make_graph([], "e", [], []))
    assert "control flow" in refused(tmp_path, model_of([loop], {"c": (1,)}))
    quantised = helper.make_node("QuantizeLinear", ["x", "s"], ["y"])
    assert "quantised" in refused(tmp_path, model_of([quantised], {"x": (2,)}, {"s": np.float32(0.1)}))
    outer = helper.make_node("Add", ["a", "b"], ["y"], name="outer")
    assert "node 'outer' (Add; inputs a [2, 1], b [1, 3]): operands of shapes [2, 1] and [1, 3] broadcast each " \
        "other" in refused(tmp_path, model_of([outer], {"a": (2, 1), "b": (1, 3)}))
    uneven = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 0, 2, 1], name="uneven")
    assert "node 'uneven' (AveragePool; inputs x [1, 2, 6, 6]): padding [1, 0] before and [2, 1] after the " \
        "spatial axes differs, and leaves" in refused(tmp_path, model_of([uneven], {"x": (1, 2, 6, 6)}))


def test_dynamic_axes_need_their_sizes(tmp_path):
    model = model_of([helper.make_node("Relu", ["x"], ["y"])], {"x": ("N", 3, "H", "W")})
    assert "input 'x' has the dynamic axis 0 ('N'): give its size with --batch" in refused(tmp_path, model)
    assert "dynamic axis 2 ('H'): give its size with --input-shape" in refused(tmp_path, model, "--batch", "2")
    imported = import_onnx(model, batch=2, input_shape=(3, 5, 6))
    assert imported.net["layers"][0]["input_param"]["shape"][0]["dim"] == [2, 3, 5, 6]


def test_old_and_new_opsets_and_cycles_are_refused(tmp_path):
    relu = helper.make_node("Relu", ["x"], ["y"])
    assert "opset 8 of the default domain: netspec reads opsets 9 to 21" in \
        refused(tmp_path, model_of([relu], {"x": (1, 2)}, opset=8))
    cycle = [helper.make_node("Add", ["x", "b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"])]
    graph = helper.make_graph(cycle, "cycle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2))],
                              [helper.make_empty_tensor_value_info("b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert "is part of a cycle" in refused(tmp_path, model.SerializeToString())
    integers = helper.make_graph([relu], "ints", [helper.make_tensor_value_info("x", TensorProto.INT8, (1, 2))],
                                 [helper.make_empty_tensor_value_info("y")])
    assert "int8/uint8: a quantised model" in refused(
        tmp_path, helper.make_model(integers, opset_imports=[helper.make_opsetid("", 17)]))


def test_external_data_outside_the_models_folder_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(np.zeros(6, dtype=np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    model = model_of([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (2, 3)}, {"w": weights(2, 3)})
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../elsewhere.bin"), ("offset", "0"), ("length", "24")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, folder / "model.onnx")
    with pytest.raises(ModelImportError, match="keeps its data in '../elsewhere.bin', outside the model's folder"):
        import_onnx(str(folder / "model.onnx"))


def test_external_data_beside_the_model_is_read(tmp_path):
    values = weights(2, 300)
    model = model_of([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (2, 300)}, {"w": values})
    onnx.save(model, tmp_path / "big.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="big.data", size_threshold=0)
    assert (tmp_path / "big.data").is_file()
    imported = import_onnx(str(tmp_path / "big.onnx"))
    np.testing.assert_array_equal(imported.weights["Add_0"][0], values)


BROADCASTS = {
    "a channel's gate (squeeze and excitation)": ("Mul", (2, 3, 4, 5), (2, 3, 1, 1), "Scale"),
    "the gate first": ("Mul", (2, 3, 1, 1), (2, 3, 4, 5), "Scale"),
    "a bias per channel": ("Add", (2, 3, 4, 5), (1, 3, 1, 1), "Bias"),
    "minus a row": ("Sub", (2, 3, 4), (4,), "Bias"),
    "over a per-position divisor": ("Div", (2, 3, 4), (3, 4), "Scale"),
    "quotient of one shape": ("Div", (2, 3), (2, 3), "Eltwise"),
}


@pytest.mark.parametrize("name", BROADCASTS)
def test_arithmetic_of_a_tensor_and_one_it_broadcasts_over(name):
    op, first, second, kind = BROADCASTS[name]
    model = model_of([helper.make_node("Abs", ["b"], ["p"]), helper.make_node("Add", ["p", "one"], ["q"]),
                      helper.make_node(op, ["a", "q"], ["y"])], {"a": first, "b": second}, {"one": np.float32(0.5)})
    assert kinds(compare(model, atol=1e-4))[-1] == kind


@pytest.mark.parametrize("attrs, shape, w", [(dict(strides=[2, 2], pads=[1, 1, 1, 1]), (1, 4, 5, 5), (4, 3, 4, 4)),
                                             (dict(group=2), (2, 4, 3, 3), (4, 1, 3, 3)),
                                             (dict(strides=[2, 2], output_shape=[9, 9]), (1, 2, 4, 4), (2, 3, 3, 3)),
                                             (dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                                              (1, 3, 4, 5), (3, 2, 3, 3)),
                                             (dict(strides=[2, 2], output_shape=[8, 10]), (1, 2, 4, 5), (2, 3, 3, 3)),
                                             (dict(pads=[0, 2, 1, 0]), (1, 2, 4, 4), (2, 2, 3, 3))])
def test_conv_transpose_is_a_deconvolution(attrs, shape, w):
    """PyTorch's decoders (stride 2, padding 1, output_padding 1) crop one side less: a Slice after it."""
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    constants = {"w": weights(*w), "b": weights(w[1] * attrs.get("group", 1))}
    assert kinds(compare(model_of([node], {"x": shape}, constants)))[0] == "Deconvolution"


def test_layer_normalization_and_gelu():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("Gelu", ["n"], ["y"])]
    imported = compare(model_of(nodes, {"x": (2, 5, 8)}, {"g": weights(8), "b": weights(8)}, opset=20))
    assert kinds(imported) == ["LayerNorm", "GELU"]


@pytest.mark.parametrize("op, opset, axes, keepdims", [("ReduceMean", 13, [2, 3], 1), ("ReduceMean", 18, [1], 0),
                                                       ("ReduceSum", 13, [-1], 1), ("ReduceSum", 13, None, 0)])
def test_reductions(op, opset, axes, keepdims):
    as_input = axes is not None and (op == "ReduceSum" or opset >= 18)
    node = helper.make_node(op, ["x", *(["axes"] if as_input else [])], ["y"], keepdims=keepdims,
                            **({"axes": axes} if axes is not None and not as_input else {}))
    constants = {"axes": np.array(axes, dtype=np.int64)} if as_input else {}
    assert "Reduction" in kinds(compare(model_of([node], {"x": (2, 3, 4, 5)}, constants, opset=opset)))


def test_split_slice_and_a_class_token():
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=2),
             helper.make_node("Slice", ["b", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Gather", ["c", "zero"], ["token"], axis=1),
             helper.make_node("Split", ["a"], ["a1", "a2"], axis=1)]
    constants = {"sizes": np.array([2, 3, 1], dtype=np.int64), "starts": np.array([1, -3], dtype=np.int64),
                 "ends": np.array([2**62, -1], dtype=np.int64), "axes": np.array([1, 3], dtype=np.int64),
                 "zero": np.array(0, dtype=np.int64)}
    compare(model_of(nodes, {"x": (2, 4, 6, 5)}, constants, opset=13, outputs=["s", "token", "a1", "a2"]))
    old = [helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[3], axes=[2])]
    compare(model_of(old, {"x": (2, 3, 5)}, opset=9))


@pytest.mark.parametrize("equation, a, b", [("bij,bjk->bik", (2, 3, 4), (2, 4, 5)), ("ij,kj->ik", (3, 4), (5, 4)),
                                            ("bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4))])
def test_einsum_as_a_matrix_product(equation, a, b):
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    assert kinds(compare(model_of([node], {"a": a, "b": b}))) == ["MatMul"]


@pytest.mark.parametrize("half_first", [False, True])
def test_the_exporters_erf_subgraph_is_one_gelu(half_first):
    """PyTorch before opset 20: x * (1 + erf(x / sqrt(2))) * 0.5 (or x * 0.5 first)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "root2"], ["s"]),
             helper.make_node("Erf", ["s"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"])]
    if half_first:
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "p"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "p"], ["hp"]), helper.make_node("Mul", ["hp", "half"], ["y"])]
    constants = {"w": weights(6, 5), "root2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    imported = compare(model_of(nodes, {"x": (2, 3, 6)}, constants, opset=13))
    assert kinds(imported) == ["InnerProduct", "GELU"]
    assert "GELU recognised in 1 Erf subgraph(s)" in imported.summary()[-1]


def test_a_graph_of_absurdly_many_nodes_is_refused_before_anything_is_read():
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(100_001)]
    model = model_of(nodes, {"t0": (1, 2)})
    with pytest.raises(ModelImportError, match="the model: 100,001 nodes, more than the 100,000 netspec reads"):
        import_onnx(model)


def test_attention_exported_as_plain_operators_imports():
    """A head of scaled dot-product attention as PyTorch writes it: MatMul, Transpose, Div, Softmax, MatMul."""
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Div", ["s", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    mask = np.triu(np.full((5, 5), -1e4, dtype=np.float32), 1)
    constants = {"wq": weights(8, 8), "wk": weights(8, 8), "wv": weights(8, 8), "scale": np.float32(np.sqrt(8)),
                 "mask": mask}
    imported = compare(model_of(nodes, {"x": (2, 5, 8)}, constants), atol=1e-4)
    assert kinds(imported).count("MatMul") == 2 and "Softmax" in kinds(imported)


def test_batch_normalization_folds_into_the_convolution_where_asked():
    constants = {"w": weights(4, 3, 3, 3), "c": weights(4), "s": weights(4), "b": weights(4), "m": weights(4),
                 "v": weights(4, positive=True)}
    nodes = [helper.make_node("Conv", ["x", "w", "c"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["conv", "s", "b", "m", "v"], ["y"], epsilon=1e-3)]
    model = model_of(nodes, {"x": (2, 3, 5, 5)}, constants)
    assert kinds(compare(model)) == ["Convolution", "BatchNorm", "Scale"]
    folded = compare(model, fold_batchnorm=True)
    assert kinds(folded) == ["Convolution"] and "folded into the convolution before it: 1" in folded.summary()[-1]
    kept = model_of([*nodes, helper.make_node("Relu", ["conv"], ["r"])], {"x": (2, 3, 5, 5)}, constants,
                    outputs=["y", "r"])  # (the convolution's output read twice: nothing folds)
    assert "BatchNorm" in kinds(compare(kept, fold_batchnorm=True))


RESIZES = {
    "Upsample, nearest (opset 9)": (9, "Upsample", dict(mode="nearest"), "scales", [1, 1, 2, 2]),
    "Upsample, linear": (9, "Upsample", dict(mode="linear"), "scales", [1, 1, 2, 1.5]),
    "Resize-10, nearest": (10, "Resize", dict(mode="nearest"), "scales", [1, 1, 1.5, 2]),
    "nearest, half pixel, round_prefer_floor": (13, "Resize", dict(mode="nearest"), "scales", [1, 1, 2, 2]),
    "nearest, asymmetric, floor (PyTorch's)": (13, "Resize", dict(mode="nearest", nearest_mode="floor",
                                                                 coordinate_transformation_mode="asymmetric"),
                                              "sizes", [2, 3, 9, 7]),
    "linear, half pixel (PyTorch's bilinear)": (13, "Resize", dict(mode="linear"), "scales", [1, 1, 2, 2]),
    "linear, align corners": (13, "Resize", dict(mode="linear", coordinate_transformation_mode="align_corners"),
                              "sizes", [2, 3, 7, 9]),
    "linear, pytorch half pixel, down": (13, "Resize", dict(mode="linear",
                                                            coordinate_transformation_mode="pytorch_half_pixel"),
                                         "sizes", [2, 3, 1, 3]),
}


@pytest.mark.parametrize("name", RESIZES)
def test_resize(name):
    opset, op, attrs, kind, values = RESIZES[name]
    if opset < 10 or op == "Resize" and opset == 10:
        inputs, constants = ["x", "scales"], {"scales": np.array(values, dtype=np.float32)}
    elif kind == "scales":
        inputs, constants = ["x", "", "scales"], {"scales": np.array(values, dtype=np.float32)}
    else:
        inputs, constants = ["x", "", "", "sizes"], {"sizes": np.array(values, dtype=np.int64)}
    node = helper.make_node(op, inputs, ["y"], **attrs)
    assert kinds(compare(model_of([node], {"x": (2, 3, 4, 5)}, constants, opset=opset))) == ["Resize"]


def test_an_imported_classifier_publishes_with_its_origin_and_fine_tunes_without_code(tmp_path):
    """import onnx, zoo publish (the card names the ONNX file; a train net and solver are made from the deploy
    net), zoo finetune on a dataset of another class count, and netspec train."""
    from PIL import Image

    nodes = [helper.make_node("Conv", ["image", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "w2", "b2"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["prob"], axis=1)]
    constants = {"w1": weights(6, 1, 3, 3), "b1": weights(6), "w2": weights(5, 6), "b2": weights(5)}
    model = model_of(nodes, {"image": ("N", 1, 8, 8)}, constants)
    model.producer_name, model.producer_version = "pytorch", "2.11"
    onnx.save(model, tmp_path / "tiny.onnx")
    rng = np.random.default_rng(0)
    for index in range(24):
        (tmp_path / "images" / str(index % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(tmp_path / "images" / str(index % 3) /
                                                                           f"{index}.png")
    env = {**os.environ, "NETSPEC_ZOO": str(tmp_path / "zoo")}

    def command(*arguments):
        run = subprocess.run([sys.executable, "-m", "netspec", *map(str, arguments)], capture_output=True, text=True,
                             cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr
        return run.stdout

    command("import", "onnx", "tiny.onnx", "--batch", "1")
    command("zoo", "publish", "--name", "tiny", "--net", "tiny.yaml", "--weights", "tiny.weights.h5",
            "--scale", "0.00390625")
    folder = tmp_path / "zoo" / "models" / "tiny" / "1"
    card = (folder / "model.yaml").read_text()
    assert "format: onnx" in card and "file: tiny.onnx" in card and "opset: 17" in card and "pytorch 2.11" in card
    assert "converted from ONNX: tiny.onnx" in (folder / "README.md").read_text()
    assert "type: SoftmaxWithLoss" in (folder / "train_net.yaml").read_text()
    command("convert", "imageset", "images", "data", "--gray", "--val-fraction", "0.25")
    prepared = command("zoo", "finetune", "tiny", "data", "--out", "run")
    assert "Gemm_4 re-made for 3 classes as Gemm_4_finetune" in prepared
    trained = command("train", "run/finetune/solver.yaml", "--weights", folder / "weights.h5", "--out", "run",
                      "--max-iter", "4")
    assert "optimization done at iteration 4" in trained


def test_ceil_mode_windows_onnx_counts_otherwise_are_refused_in_a_line(tmp_path):
    """ONNX's shape inference keeps a last window that would start past the input; its runtime drops it."""
    for pads, size in (([0, 0, 1, 1], 6), ([1, 1, 1, 1], 7)):
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=pads, ceil_mode=1)
        assert "ceil_mode with a last window that would start past the input" in refused(
            tmp_path, model_of([node], {"x": (1, 1, size, size)}, opset=19))


def test_reductions_of_no_axes_and_one_element_constants():
    empty = {"axes": np.array([], dtype=np.int64)}
    for op in ("ReduceSumSquare", "ReduceL1", "ReduceMean"):
        node = helper.make_node(op, ["x", "axes"], ["y"], noop_with_empty_axes=1)
        compare(model_of([node], {"x": (2, 3)}, empty, opset=18))
    compare(model_of([helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)], {"x": (2, 3)}, opset=13))
    pad = helper.make_node("Pad", ["x", "p", "v"], ["y"])
    compare(model_of([pad], {"x": (2, 3)}, {"p": np.array([0, 1, 0, 2], dtype=np.int64),
                                            "v": np.array([2.5], dtype=np.float32)}, opset=13))
    clip = helper.make_node("Clip", ["x", "lo"], ["y"])
    compare(model_of([clip], {"x": (2, 3)}, {"lo": np.array([0.1], dtype=np.float32)}, opset=13))


def test_inputs_that_are_outputs_and_names_the_importer_would_make():
    relu = helper.make_node("Relu", ["x"], ["y"])
    compare(model_of([relu], {"x": (2, 3)}, outputs=["y", "x"]))
    nodes = [helper.make_node("Relu", ["x"], ["s/step"]),  # (the name of the importer's step inside node 's')
             helper.make_node("Sub", ["s/step", "b"], ["y"], name="s")]
    compare(model_of(nodes, {"x": (2, 3, 4), "b": (4,)}))


def test_more_bad_models_are_refused_in_a_line(tmp_path):
    divide = helper.make_node("Div", ["x", "zero"], ["y"])
    assert "a division by a constant zero" in refused(tmp_path, model_of([divide], {"x": (2,)}, {"zero": np.float32(0)}))
    norm = helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=-1)
    assert "does not fit the normalised axes [4]" in refused(
        tmp_path, model_of([norm], {"x": (2, 3, 4)}, {"g": weights(3, 4)}))
    lrn = helper.make_node("LRN", ["x"], ["y"], alpha=1e-4)
    assert "a malformed attribute or input" in refused(tmp_path, model_of([lrn], {"x": (1, 3, 2, 2)}))
    loud = model_of([helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 2)})
    loud.producer_name = "evil\nforce_backward: true\n#"
    path = tmp_path / "loud.onnx"
    onnx.save(loud, path)
    run = subprocess.run([sys.executable, "-m", "netspec", "import", "onnx", str(path)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "loud.yaml").read_text()
    assert text.splitlines()[0].startswith("# imported from loud.onnx") and "\\nforce_backward" in text.splitlines()[0]
    assert "\nforce_backward" not in text
    nowhere = subprocess.run([sys.executable, "-m", "netspec", "import", "onnx", str(path), "-o",
                              str(tmp_path / "absent" / "net.yaml")], capture_output=True, text=True)
    assert nowhere.returncode == 1 and "its folder does not exist" in nowhere.stderr
    assert not (tmp_path / "absent").exists() and not (tmp_path / "absent.weights.h5").exists()


def test_malformed_models_that_would_import_as_something_else_are_refused(tmp_path):
    """What a reader could take one way or another: a constant of negative size (reshaped), an attribute the
    operator has not (ignored), a graph output nothing makes (left out)."""
    add = helper.make_node("Add", ["x", "w"], ["y"])
    negative = model_of([add], {"x": (2, 4)}, {"w": weights(2, 4)})
    negative.graph.initializer[0].dims[:] = [-1, 4]
    assert "tensor 'w' declares the sizes [-1, 4]: a constant's sizes are whole numbers" in refused(tmp_path, negative)
    odd = helper.make_node("Relu", ["x"], ["y"], alpha=0.1)
    assert "node 'Relu' (Relu): attribute 'alpha' is not one of Relu's at opset 17 (it takes none)" in refused(
        tmp_path, model_of([odd], {"x": (2, 3)}))
    lost = model_of([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, outputs=["y", "z"])
    assert "graph output 'z' is made by no node (nor is it an input or a constant)" in refused(tmp_path, lost)


def test_external_data_of_an_in_memory_model_and_odd_locations_are_refused(tmp_path):
    model = model_of([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (2, 3)}, {"w": weights(2, 3)})
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "secret\x00.bin"
    with pytest.raises(ModelImportError, match="give its path, so that only files beside it are read"):
        import_onnx(model)
    onnx.save(model, tmp_path / "odd.onnx")
    with pytest.raises(ModelImportError, match="outside the model's folder or not a file there"):
        import_onnx(str(tmp_path / "odd.onnx"))


def test_a_vision_transformers_tokens_and_a_decomposed_layer_norm():
    """ViT at opset 13: the class token expanded to the batch and joined to the patches, the position embedding
    added, LayerNorm as PyTorch decomposed it before opset 17, the class token's output taken by Gather."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
             helper.make_node("Concat", ["n1", "ones"], ["target"], axis=0),
             helper.make_node("Expand", ["cls", "target"], ["tokens0"]),
             helper.make_node("Concat", ["tokens0", "x"], ["tokens"], axis=1),
             helper.make_node("Add", ["tokens", "position"], ["t"]),
             helper.make_node("ReduceMean", ["t"], ["mean"], axes=[-1]), helper.make_node("Sub", ["t", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]), helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["normed"]), helper.make_node("Mul", ["normed", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "beta"], ["ln"]),
             helper.make_node("Gather", ["ln", "zero"], ["first"], axis=1),
             helper.make_node("Gemm", ["first", "head"], ["logits"], transB=1)]
    constants = {"zero": np.array(0, dtype=np.int64), "axis0": np.array([0], dtype=np.int64),
                 "ones": np.array([1, 1], dtype=np.int64), "cls": weights(1, 1, 8), "position": weights(1, 5, 8),
                 "two": np.float32(2), "eps": np.float32(1e-5), "gamma": weights(8), "beta": weights(8),
                 "head": weights(3, 8)}
    imported = compare(model_of(nodes, {"x": (2, 4, 8)}, constants, opset=13), atol=1e-4)
    assert "Parameter" in kinds(imported)


def test_shapes_of_tensors_reshaped_by_folded_values_fold_too():
    """PyTorch's attention: a Reshape to a shape computed from the input, whose output's Shape is read again."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
             helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"]),
             helper.make_node("Shape", ["y"], ["ys"]), helper.make_node("Gather", ["ys", "one"], ["m"]),
             helper.make_node("Unsqueeze", ["m", "axis0"], ["m1"]),
             helper.make_node("Concat", ["n1", "m1", "minus_one"], ["target2"], axis=0),
             helper.make_node("Reshape", ["y", "target2"], ["z"])]
    constants = {"zero": np.array(0, dtype=np.int64), "one": np.array(1, dtype=np.int64),
                 "axis0": np.array([0], dtype=np.int64), "rest": np.array([6, -1], dtype=np.int64),
                 "minus_one": np.array([-1], dtype=np.int64)}
    imported = compare(model_of(nodes, {"x": (2, 3, 4, 4)}, constants))
    assert kinds(imported) == ["Reshape", "Reshape"]


def test_a_view_keeps_the_batch_free_and_sizes_the_model_fixes_are_named_when_changed(tmp_path):
    """PyTorch's x.view(x.size(0), -1) reshapes at any batch (a fine-tuned net's); a model exported at batch 1
    whose Reshape fixes that batch refuses --batch 3 naming the change, not as an importer's bug."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    constants = {"zero": np.array(0, dtype=np.int64), "axes": np.array([0], dtype=np.int64),
                 "minus_one": np.array([-1], dtype=np.int64)}
    imported = import_onnx(model_of(nodes, {"x": (2, 3, 4, 5)}, constants))
    assert imported.net["layers"][-1]["reshape_param"] == {"shape": {"dim": [0, 60]}}
    fixed = [helper.make_node("Reshape", ["x", "target"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["y"])]
    model = model_of(fixed, {"x": (1, 2, 3)}, {"target": np.array([1, 6], dtype=np.int64), "w": weights(6, 4)})
    assert "input 'x' axis 0 from the model's 1 to 3: the model fixes that size in its own shapes" in \
        refused(tmp_path, model, "--batch", "3")
    assert "--input-shape gives 1 sizes, but input 'x' has 2 axes after the batch" in \
        refused(tmp_path, model, "--input-shape", "5")
    with pytest.raises(ModelImportError, match="batch and input_shape take whole numbers"):
        import_onnx(model, input_shape="2,3")


def test_a_model_given_where_a_net_is_expected_says_how_to_import_it(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model_of([helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 2)}), path)
    run = subprocess.run([sys.executable, "-m", "netspec", "check", str(path)], capture_output=True, text=True)
    assert run.returncode == 1 and "an ONNX model, not a net file: netspec import onnx makes one of it" in \
        run.stderr, run.stderr
