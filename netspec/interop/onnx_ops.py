"""ONNX operators as netspec layers: one converter per operator, from a node whose inputs' shapes (and values,
where they are constants) are known, to the layers that compute it in Caffe's vocabulary, with their weights.

A converter adds layers through the :class:`Builder`, or makes its output another name for its input
(:meth:`Builder.alias`) where nothing is computed.  A node it cannot express raises :class:`ConversionError` with the
reason and, where there is one, what would work; :mod:`netspec.interop.onnx_import` names the node and its
inputs' shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy

from netspec.errors import ParamError, ShapeError
from netspec.layers.pooling import PoolingParams, pool_geometry


class ConversionError(Exception):
    """A node netspec's layers cannot compute: the message says why (and what would work, where anything does)."""


@dataclass
class Node:
    """One ONNX node as the converters see it: its layer name (unique in the net), operator, the names of its
    input tensors ("" for an optional one left out) and output tensors, attributes, the model's opset, and the
    static shapes and constant values the importer knows."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    opset: int
    shapes: dict[str, tuple[int, ...]]
    constants: dict[str, numpy.ndarray]

    def shape(self, index: int) -> tuple[int, ...]:
        """The shape of input ``index``."""
        return self.shapes[self.inputs[index]]

    def output_shape(self, index: int = 0) -> tuple[int, ...]:
        """The shape of output ``index``."""
        return self.shapes[self.outputs[index]]

    def constant(self, index: int) -> numpy.ndarray | None:
        """The value of input ``index`` where it is a constant (None where it is computed, or left out)."""
        if index >= len(self.inputs) or not self.inputs[index]:
            return None
        return self.constants.get(self.inputs[index])

    def given(self, index: int) -> bool:
        """Whether input ``index`` is there (optional inputs may be left out)."""
        return index < len(self.inputs) and bool(self.inputs[index])

    def attr(self, name: str, default=None):
        """Attribute ``name``, or ``default``."""
        return self.attrs.get(name, default)

    def computed(self) -> list[int]:
        """The indices of the inputs that are computed (not constants, not left out)."""
        return [i for i, name in enumerate(self.inputs) if name and name not in self.constants]


@dataclass
class Builder:
    """The layers (as plain data, in order) and weights (layer name: arrays in the layer's blob order) made so
    far, and the tensors that are other names for a blob."""

    layers: list[dict] = field(default_factory=list)
    weights: dict[str, list[numpy.ndarray]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)  # the layers'
    tensors: set[str] = field(default_factory=set)  # the blobs' (every tensor of the model, and the ones made)

    def blob(self, tensor: str) -> str:
        """The blob that holds ``tensor``."""
        while tensor in self.aliases:
            tensor = self.aliases[tensor]
        return tensor

    def alias(self, tensor: str, source: str) -> None:
        """``tensor`` is ``source`` under another name (no layer computes it)."""
        self.aliases[tensor] = source

    def unique(self, name: str, taken: set[str] | None = None) -> str:
        """``name``, or ``name_2``, ``name_3``... where a layer (or in ``taken``, a blob) already has it; reserved
        from now on."""
        taken = self.names if taken is None else taken
        candidate, count = name, 1
        while candidate in taken:
            count += 1
            candidate = f"{name}_{count}"
        taken.add(candidate)
        return candidate

    def layer(self, kind: str, name: str, bottoms: list[str], tops: list[str],
              weights: list[numpy.ndarray] = (), **blocks) -> None:
        """Add a layer of type ``kind`` (its name made unique) from ``bottoms`` to ``tops`` (tensor names), with
        ``weights`` for its learnable blobs and its parameter blocks (``convolution_param={...}``)."""
        name = self.unique(name)
        entry = {"name": name, "type": kind}
        if bottoms:
            entry["bottom"] = [self.blob(bottom) for bottom in bottoms]
        entry["top"] = list(tops)
        entry.update({key: value for key, value in blocks.items() if value is not None})
        self.layers.append(entry)
        if weights:
            self.weights[name] = [numpy.asarray(array, dtype=numpy.float32) for array in weights]

    def constant(self, node: Node, tensor: str) -> str:
        """A blob holding the constant ``tensor``: a Parameter's top, its value the Parameter's weights (which
        fine-tuning trains, as it does every constant the import turns into weights)."""
        value = node.constants[tensor]
        top = self.unique(f"{node.name}/{tensor}", self.tensors)
        self.layer("Parameter", top, [], [top], [value], parameter_param={"shape": {"dim": list(value.shape)}})
        return top

    def temporary(self, base: str) -> str:
        """A fresh blob name (no tensor of the model has it) for a result between two layers of one node."""
        return self.unique(f"{base}/step", self.tensors)


def _pair(key: str, values, skip=None) -> dict:
    """``{key: v}`` where both values are ``v``, else Caffe's ``{kernel_h: h, kernel_w: w}`` (``key`` without
    ``_size``); nothing where both are ``skip``."""
    h, w = (int(value) for value in values)
    if h == w:
        return {} if h == skip else {key: h}
    prefix = key.removesuffix("_size")
    return {f"{prefix}_h": h, f"{prefix}_w": w}


def _spatial_pads(node: Node, spatial, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    """The padding before and after each spatial axis, from ``pads`` or ``auto_pad``."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = node.attr("pads", [0] * (2 * len(spatial)))
        return list(pads[:len(spatial)]), list(pads[len(spatial):])
    if auto == "VALID":
        return [0] * len(spatial), [0] * len(spatial)
    before, after = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        before.append(small if auto == "SAME_UPPER" else big)
        after.append(big if auto == "SAME_UPPER" else small)
    return before, after


def _require_2d(node: Node, what: str) -> tuple[int, ...]:
    shape = node.shape(0)
    if len(shape) != 4:
        raise ConversionError(f"a {len(shape) - 2}-D {what}: netspec's {what} is 2-D (N, C, H, W)")
    return shape


def _scalar(value, what: str) -> float:
    """A constant of one element as a float; ConversionError for more."""
    value = numpy.asarray(value)
    if value.size != 1:
        raise ConversionError(f"a {what} of shape {list(value.shape)}, where one value is expected")
    return float(value.reshape(-1)[0])


def _constant_input(node: Node, index: int, what: str) -> numpy.ndarray:
    value = node.constant(index)
    if value is None:
        raise ConversionError(f"its {what} (input {index}) is computed at run time: netspec learns {what} as a layer's "
                              "own weights, so they must be constants")
    return value


def conv(b: Builder, node: Node) -> None:
    """Conv: a Convolution (2-D; groups, dilation, padding given or automatic)."""
    shape = _require_2d(node, "convolution")
    weights = _constant_input(node, 1, "weights")
    strides = node.attr("strides", [1, 1])
    dilations = node.attr("dilations", [1, 1])
    before, after = _spatial_pads(node, shape[2:], weights.shape[2:], strides, dilations)
    source = node.inputs[0]
    if before != after:  # (TensorFlow's SAME with an even map: zeros added first, by a Pad)
        source, before = _padded(b, node, source, before, after, 0.0), [0, 0]
    bias = node.constant(2)
    if node.given(2) and bias is None:
        _constant_input(node, 2, "bias")
    params = {"num_output": int(weights.shape[0]), **_pair("kernel_size", weights.shape[2:]),
              **_pair("stride", strides, skip=1), **_pair("pad", before, skip=0),
              **_pair("dilation", dilations, skip=1)}
    group = int(node.attr("group", 1))
    if group != 1:
        params["group"] = group
    if bias is None:
        params["bias_term"] = False
    b.layer("Convolution", node.name, [source], node.outputs[:1],
            [weights] if bias is None else [weights, bias], convolution_param=params)


def _padded(b: Builder, node: Node, source: str, before: list[int], after: list[int], value: float) -> str:
    """A Pad of ``source``'s spatial axes by ``before`` and ``after`` with ``value``: the padded blob."""
    padded = b.temporary(node.name)
    b.layer("Pad", f"{node.name}/pad", [source], [padded],
            pad_param={"axis": 2, "before": [int(v) for v in before], "after": [int(v) for v in after],
                       "value": value})
    return padded


def _pool(b: Builder, node: Node, pool: str) -> None:
    shape = _require_2d(node, "pooling")
    if len(node.outputs) > 1 and node.outputs[1]:
        raise ConversionError("its second output (the indices of the maxima) has no netspec equivalent")
    kernel = [int(k) for k in node.attr("kernel_shape", [])]
    strides = node.attr("strides", [1, 1])
    if len(kernel) != 2 or any(d != 1 for d in node.attr("dilations", [1, 1])):
        raise ConversionError(f"kernel_shape {kernel} or dilation: netspec's Pooling windows are dense and 2-D")
    before, after = _spatial_pads(node, shape[2:], kernel, strides, [1, 1])
    include_pad = bool(node.attr("count_include_pad", 0))
    ceil = bool(node.attr("ceil_mode", 0))
    out = tuple(_onnx_pooled(size, k, s, q, e, ceil) for size, k, s, q, e in zip(shape[2:], kernel, strides, before,
                                                                                 after))
    if out != node.output_shape()[2:]:
        raise ConversionError(f"ceil_mode with a last window that would start past the input: ONNX's shape inference "
                              f"makes {list(node.output_shape()[2:])} outputs, its runtime {list(out)}; export "
                              "the model without ceil_mode, or with padding the windows fit")
    if out == (1, 1) and all(q <= 0 and k - q >= size for q, k, size in zip(before, kernel, shape[2:])) and \
            (pool == "MAX" or not include_pad):
        b.layer("Pooling", node.name, node.inputs[:1], node.outputs[:1],  # (one window over the whole map)
                pooling_param={"pool": pool, "global_pooling": True})
        return
    source, spatial = node.inputs[0], shape[2:]
    if before != after:
        if _caffe_pooled(spatial, kernel, strides, before, True) == out and \
                (pool == "MAX" or not (include_pad or any(before))):
            ceil = True  # (padding after that only rounds the last window up: Caffe's CEIL, which pads it alike)
        elif pool == "MAX" or include_pad:  # (padding no maximum picks, or that counts: a Pad first)
            source = _padded(b, node, source, before, after, -numpy.inf if pool == "MAX" else 0.0)
            spatial = tuple(size + q + e for size, q, e in zip(spatial, before, after))
            before = [0, 0]
        else:
            raise ConversionError(f"padding {before} before and {after} after the spatial axes differs, and leaves "
                                  "the average's divisor (count_include_pad 0): netspec's AVE pools pad each axis "
                                  "alike on both sides")
    rounding = next((mode for mode in ("FLOOR", "CEIL") if _caffe_pooled(spatial, kernel, strides, before,
                                                                         mode == "CEIL") == out), None)
    if rounding is None:
        raise ConversionError(f"ceil_mode windows that Caffe's rounding counts otherwise ({list(out)} outputs): "
                              "export the model without ceil_mode")
    params = {"pool": pool, **_pair("kernel_size", kernel), **_pair("stride", strides, skip=1),
              **_pair("pad", before, skip=0), "round_mode": rounding}
    if pool == "AVE" and not include_pad and any(before):
        params["count_include_pad"] = False
    b.layer("Pooling", node.name, [source], node.outputs[:1], pooling_param=params)


def _onnx_pooled(size: int, kernel: int, stride: int, before: int, after: int, ceil: bool) -> int:
    """The outputs of ONNX's pooling along an axis, as its runtime counts them: with ceil_mode, a last window that
    would start past the input and the padding before it is dropped."""
    span = size + before + after - kernel
    count = (-(-span // stride) if ceil else span // stride) + 1
    return count - 1 if ceil and (count - 1) * stride >= size + before else count


def _caffe_pooled(spatial, kernel, strides, pad, ceil: bool) -> tuple[int, ...] | None:
    """The outputs of netspec's Pooling for this geometry (its own rule, Caffe's), None where it refuses it."""
    params = PoolingParams(kernel_h=int(kernel[0]), kernel_w=int(kernel[1]), stride_h=int(strides[0]),
                           stride_w=int(strides[1]), pad_h=int(pad[0]), pad_w=int(pad[1]),
                           round_mode="CEIL" if ceil else "FLOOR")
    try:
        return pool_geometry(params, (1, 1, *spatial)).out
    except (ParamError, ShapeError):
        return None


def max_pool(b: Builder, node: Node) -> None:
    """MaxPool: Pooling MAX (ceil_mode as round_mode)."""
    _pool(b, node, "MAX")


def average_pool(b: Builder, node: Node) -> None:
    """AveragePool: Pooling AVE."""
    _pool(b, node, "AVE")


def _global_pool(pool: str) -> Callable[[Builder, Node], None]:
    def convert(b: Builder, node: Node) -> None:
        _require_2d(node, "pooling")
        b.layer("Pooling", node.name, node.inputs[:1], node.outputs[:1],
                pooling_param={"pool": pool, "global_pooling": True})
    convert.__doc__ = f"Global{'Average' if pool == 'AVE' else 'Max'}Pool: Pooling {pool} over the whole map."
    return convert


def lrn(b: Builder, node: Node) -> None:
    """LRN: LRN across channels (ONNX's formula is Caffe's)."""
    b.layer("LRN", node.name, node.inputs[:1], node.outputs[:1],
            lrn_param={"local_size": int(node.attr("size")), "alpha": float(node.attr("alpha", 1e-4)),
                       "beta": float(node.attr("beta", 0.75)), "k": float(node.attr("bias", 1.0))})


def gemm(b: Builder, node: Node) -> None:
    """Gemm: an InnerProduct on a 2-D input, ``alpha`` and ``beta`` folded into its weights and bias."""
    if node.attr("transA", 0):
        raise ConversionError("a transposed first input (transA 1): InnerProduct takes rows of features")
    matrix = _constant_input(node, 1, "weights")
    if len(node.shape(0)) != 2:
        raise ConversionError(f"a {len(node.shape(0))}-D input: Gemm multiplies matrices")
    weights = float(node.attr("alpha", 1.0)) * (matrix if node.attr("transB", 0) else matrix.T)
    outputs = weights.shape[0]
    bias = node.constant(2)
    if node.given(2) and bias is None:
        _constant_input(node, 2, "bias")
    if bias is not None:
        bias = numpy.asarray(bias)
        if bias.ndim > 2 or (bias.ndim and bias.shape[-1] not in (1, outputs)):
            raise ConversionError(f"a bias of shape {list(bias.shape)} for {outputs} outputs")
        rows = numpy.broadcast_to(bias.reshape(-1, bias.shape[-1]) if bias.ndim == 2 else bias.reshape(1, -1),
                                  (bias.shape[0] if bias.ndim == 2 else 1, outputs))
        if not (rows == rows[:1]).all():
            raise ConversionError("a bias that differs from row to row: InnerProduct adds one bias per output")
        bias = float(node.attr("beta", 1.0)) * rows[0]
    b.layer("InnerProduct", node.name, node.inputs[:1], node.outputs[:1],
            [weights] if bias is None else [weights, bias],
            inner_product_param={"num_output": int(outputs), **({} if bias is not None else {"bias_term": False})})


def matmul(b: Builder, node: Node) -> None:
    """MatMul: by a constant matrix, an InnerProduct over the last axis; of two computed tensors, MatMul."""
    if node.computed() == [0, 1]:
        first, second = node.shape(0), node.shape(1)
        if len(first) != len(second) or len(first) < 2 or first[:-2] != second[:-2]:
            raise ConversionError(f"operands {list(first)} and {list(second)}: netspec's MatMul takes two of one rank "
                                  "whose leading axes agree")
        b.layer("MatMul", node.name, node.inputs[:2], node.outputs[:1])
        return
    matrix = _constant_input(node, 1, "weights")
    if matrix.ndim != 2 or node.constant(0) is not None:
        raise ConversionError("a product whose constant operand is not the second, a matrix")
    b.layer("InnerProduct", node.name, node.inputs[:1], node.outputs[:1], [matrix.T],
            inner_product_param={"num_output": int(matrix.shape[1]), "bias_term": False,
                                 "axis": len(node.shape(0)) - 1})


def batch_normalization(b: Builder, node: Node) -> None:
    """BatchNormalization (inference): a BatchNorm with stored statistics and a Scale with bias, in place."""
    if node.attr("training_mode", 0) or any(node.outputs[1:]):
        raise ConversionError("training mode (batch statistics and running averages as outputs): import the model "
                              "exported for inference")
    scale, shift, mean, variance = (_constant_input(node, i, what) for i, what in
                                    ((1, "scale"), (2, "bias"), (3, "mean"), (4, "variance")))
    output = node.outputs[0]
    b.layer("BatchNorm", node.name, node.inputs[:1], [output], [mean, variance, numpy.ones(1)],
            batch_norm_param={"use_global_stats": True, "eps": float(node.attr("epsilon", 1e-5))})
    b.layer("Scale", f"{node.name}/scale", [output], [output], [scale, shift], scale_param={"bias_term": True})


def _activation(kind: str, block: str | None = None, params: Callable[[Node], dict] | None = None):
    def convert(b: Builder, node: Node) -> None:
        blocks = {block: params(node)} if block else {}
        b.layer(kind, node.name, node.inputs[:1], node.outputs[:1], **blocks)
    convert.__doc__ = f"{kind}."
    return convert


def clip(b: Builder, node: Node) -> None:
    """Clip: ReLU6 for [0, 6], ReLU for [0, inf), else Clip."""
    if node.opset < 11:
        low, high = float(node.attr("min", -numpy.inf)), float(node.attr("max", numpy.inf))
    else:
        low, high = (_scalar(value, "bound") if value is not None else bound for value, bound in
                     ((node.constant(1), -numpy.inf), (node.constant(2), numpy.inf)))
        for index in (1, 2):
            if node.given(index) and node.constant(index) is None:
                _constant_input(node, index, "bounds")
    if (low, high) == (0, 6):
        b.layer("ReLU6", node.name, node.inputs[:1], node.outputs[:1])
    elif low == 0 and high == numpy.inf:
        b.layer("ReLU", node.name, node.inputs[:1], node.outputs[:1])
    else:
        b.layer("Clip", node.name, node.inputs[:1], node.outputs[:1],
                clip_param={"min": float(low), "max": float(high)})


def prelu(b: Builder, node: Node) -> None:
    """PRelu: PReLU with one slope per channel (axis 1), or one for all."""
    slope = _constant_input(node, 1, "slopes")
    shape = node.shape(0)
    if slope.size == 1:
        b.layer("PReLU", node.name, node.inputs[:1], node.outputs[:1], [slope.reshape(1)],
                prelu_param={"channel_shared": True})
        return
    aligned = slope.reshape((1,) * (len(shape) - slope.ndim) + slope.shape)
    if len(shape) < 2 or slope.size != shape[1] or aligned.shape[1] != shape[1]:
        raise ConversionError(f"slopes of shape {list(slope.shape)}: PReLU learns one per channel (axis 1) or one")
    b.layer("PReLU", node.name, node.inputs[:1], node.outputs[:1], [slope.reshape(-1)])


def softmax(b: Builder, node: Node) -> None:
    """Softmax, LogSoftmax along an axis (before opset 13: over all the axes from ``axis`` on, flattened)."""
    shape = node.shape(0)
    axis = int(node.attr("axis", 1 if node.opset < 13 else -1)) % len(shape)
    if node.opset >= 13 or math.prod(shape[axis + 1:]) == 1:  # (then the axes flattened are this one alone)
        b.layer(node.op, node.name, node.inputs[:1], node.outputs[:1], softmax_param={"axis": axis})
        return
    flat, rows = b.temporary(node.name), b.temporary(node.name)
    b.layer("Reshape", f"{node.name}/flatten", node.inputs[:1], [flat],
            reshape_param=_reshape(shape, (*shape[:axis], math.prod(shape[axis:]))))
    b.layer(node.op, node.name, [flat], [rows], softmax_param={"axis": axis})
    b.layer("Reshape", f"{node.name}/unflatten", [rows], node.outputs[:1],
            reshape_param=_reshape((*shape[:axis], math.prod(shape[axis:])), shape))


def _span(constant: numpy.ndarray, shape: tuple[int, ...]) -> tuple[int, numpy.ndarray] | None:
    """A constant broadcast against a computed tensor of ``shape`` as ``(axis, blob)``: the blob spanning the
    axes from ``axis`` to the last the constant varies along (None: a scalar).  ConversionError where the constant
    makes the result larger than the tensor."""
    if constant.ndim > len(shape) or numpy.broadcast_shapes(constant.shape, shape) != tuple(shape):
        raise ConversionError(f"a constant of shape {list(constant.shape)} broadcasts a tensor of shape {list(shape)} "
                              "to a larger one")
    aligned = constant.reshape((1,) * (len(shape) - constant.ndim) + constant.shape)
    varying = [axis for axis, size in enumerate(aligned.shape) if size != 1]
    if not varying:
        return None
    first, last = varying[0], varying[-1] + 1
    region = aligned[(0,) * first + (slice(None),) * (last - first) + (0,) * (len(shape) - last)]
    return first, numpy.broadcast_to(region, shape[first:last]).copy()


def _with_constant(b: Builder, node: Node, x: int) -> None:
    """Add, Sub, Mul or Div of the computed input ``x`` and a constant: Power for a scalar, else Bias or Scale
    over the axes the constant spans."""
    value = node.constant(1 - x).astype(numpy.float64)
    op, source, output = node.op, node.inputs[x], node.outputs[0]
    span = _span(value, node.shape(x))
    if span is None:
        k = float(value.reshape(-1)[0])
        if k == 0 and op == "Div":
            raise ConversionError("a division by a constant zero")
        power = {("Add", 0): {"shift": k}, ("Add", 1): {"shift": k}, ("Sub", 0): {"shift": -k},
                 ("Sub", 1): {"scale": -1.0, "shift": k}, ("Mul", 0): {"scale": k}, ("Mul", 1): {"scale": k},
                 ("Div", 0): {"scale": 1 / k}, ("Div", 1): {"power": -1.0, "scale": 1 / k}}[op, x]
        b.layer("Power", node.name, [source], [output], power_param=power)
        return
    axis, blob = span
    block = {"axis": axis, "num_axes": blob.ndim}
    if x == 1 and op in ("Sub", "Div"):  # (k - x, k / x: the input negated or inverted first)
        turned = b.temporary(node.name)
        b.layer("Power", f"{node.name}/{'negate' if op == 'Sub' else 'invert'}", [source], [turned],
                power_param={"scale": -1.0} if op == "Sub" else {"power": -1.0})
        source, op = turned, "Add" if op == "Sub" else "Mul"
    if op in ("Add", "Sub"):
        b.layer("Bias", node.name, [source], [output], [blob if op == "Add" else -blob], bias_param=block)
    else:
        b.layer("Scale", node.name, [source], [output], [blob if op == "Mul" else 1 / blob], scale_param=block)


def arithmetic(b: Builder, node: Node) -> None:
    """Add, Sub, Mul, Div: of two computed tensors of one shape an Eltwise (SUM, SUM with coefficients 1 and
    -1, PROD; a quotient as a product with the reciprocal, Power); of a tensor and a smaller one it broadcasts
    over, Bias or Scale with that one as their second bottom; with a constant, Power, Bias or Scale."""
    computed = node.computed()
    if len(computed) == 1:
        _with_constant(b, node, computed[0])
        return
    first, second = node.inputs[:2]
    if node.shape(0) == node.shape(1) and node.op != "Div":
        params = {"Add": {"operation": "SUM"}, "Sub": {"operation": "SUM", "coeff": [1.0, -1.0]},
                  "Mul": {"operation": "PROD"}}[node.op]
        b.layer("Eltwise", node.name, [first, second], node.outputs[:1], eltwise_param=params)
        return
    if node.op in ("Sub", "Div"):  # (the second negated or inverted, then added or multiplied)
        turned = b.temporary(node.name)
        b.layer("Power", f"{node.name}/{'negate' if node.op == 'Sub' else 'invert'}", [second], [turned],
                power_param={"scale": -1.0} if node.op == "Sub" else {"power": -1.0})
        node.shapes[turned] = node.shape(1)
        second = turned
    add = node.op in ("Add", "Sub")
    if node.shape(0) == node.shape(1):
        b.layer("Eltwise", node.name, [first, second], node.outputs[:1], eltwise_param={"operation": "PROD"})
        return
    out = node.output_shape()
    big, small = (first, second) if node.shape(0) == out else (second, first)
    if node.shapes[big] != out:
        raise ConversionError(f"operands of shapes {list(node.shape(0))} and {list(node.shape(1))} broadcast each "
                              "other: netspec broadcasts one blob over the axes of the other")
    axis, span = _broadcast_span(node.shapes[small], out)
    if tuple(node.shapes[small]) != span:  # (its size-1 axes around the span dropped)
        spanned = b.temporary(node.name)
        b.layer("Reshape", f"{node.name}/span", [small], [spanned], reshape_param=_reshape(node.shapes[small], span))
        small = spanned
    b.layer("Bias" if add else "Scale", node.name, [big, small], node.outputs[:1],
            **{"bias_param" if add else "scale_param": {"axis": axis}})


def _broadcast_span(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """Where a tensor of ``shape`` broadcast to ``out`` varies: ``(first axis, the sizes from there to the last
    axis it does not broadcast along)``; ConversionError where it broadcasts along an axis inside that span."""
    aligned = (1,) * (len(out) - len(shape)) + tuple(shape)
    varying = [axis for axis, size in enumerate(aligned) if size != 1] or [len(out) - 1]
    first, last = varying[0], varying[-1] + 1
    if any(aligned[axis] != out[axis] for axis in range(first, last)):
        raise ConversionError(f"a tensor of shape {list(shape)} broadcast to {list(out)} along an axis between "
                              "others: netspec broadcasts a blob over the axes before and after it")
    return first, tuple(out[first:last])


def variadic(operation: str) -> Callable[[Builder, Node], None]:
    """Sum or Max of computed tensors of one shape: an Eltwise."""
    def convert(b: Builder, node: Node) -> None:
        inputs = [name for name in node.inputs if name]
        if node.computed() != list(range(len(node.inputs))) or len({node.shapes[n] for n in inputs}) != 1:
            raise ConversionError("constant or broadcast operands: Eltwise takes computed tensors of one shape")
        if len(inputs) == 1:
            b.alias(node.outputs[0], inputs[0])
            return
        b.layer("Eltwise", node.name, inputs, node.outputs[:1], eltwise_param={"operation": operation})
    convert.__doc__ = f"{'Sum' if operation == 'SUM' else 'Max'}: Eltwise {operation}."
    return convert


def concat(b: Builder, node: Node) -> None:
    """Concat along an axis; a constant operand (a class token) is a Parameter's top."""
    axis = int(node.attr("axis")) % len(node.shape(0))
    inputs = [name if name not in node.constants else b.constant(node, name) for name in node.inputs if name]
    b.layer("Concat", node.name, inputs, node.outputs[:1], concat_param={"axis": axis})


def power(b: Builder, node: Node) -> None:
    """Pow by a constant exponent: Power."""
    exponent = node.constant(1)
    if exponent is None or node.constant(0) is not None:
        raise ConversionError("a computed exponent, or a constant base: netspec's Power raises blobs to a constant")
    b.layer("Power", node.name, node.inputs[:1], node.outputs[:1],
            power_param={"power": _scalar(exponent, "exponent")})


def reshape(b: Builder, node: Node) -> None:
    """Flatten, Reshape, Squeeze, Unsqueeze: Flatten where only the axes from 1 on merge, else Reshape to the
    static output shape."""
    shape, out = node.shape(0), node.output_shape()
    if node.op == "Flatten" and int(node.attr("axis", 1)) % max(len(shape), 1) == 1:
        b.layer("Flatten", node.name, node.inputs[:1], node.outputs[:1])
        return
    b.layer("Reshape", node.name, node.inputs[:1], node.outputs[:1], reshape_param=_reshape(shape, out))


def _reshape(shape, out) -> dict:
    """A Reshape's ``reshape_param`` from ``shape`` to ``out``: the first axis copied (Caffe's 0) where it keeps
    its size, so that a net fine-tuned at another batch size reshapes as the model does (PyTorch's
    ``x.view(x.size(0), -1)``), the other sizes as the model gives them."""
    dims = [int(size) for size in out]
    if shape and dims and shape[0] == dims[0]:
        dims[0] = 0
    return {"shape": {"dim": dims}}


def transpose(b: Builder, node: Node) -> None:
    """Transpose: Permute."""
    order = node.attr("perm", list(range(len(node.shape(0))))[::-1])
    b.layer("Permute", node.name, node.inputs[:1], node.outputs[:1], permute_param={"order": [int(a) for a in order]})


def identity(b: Builder, node: Node) -> None:
    """Identity, and Dropout in inference: the output is the input."""
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
        raise ConversionError("its mask output: netspec's Dropout gives none")
    training = node.constant(2) if node.op == "Dropout" else None
    if training is not None and bool(numpy.asarray(training).reshape(-1)[0]):
        raise ConversionError("training mode (random at every pass): import the model exported for inference")
    b.alias(node.outputs[0], node.inputs[0])


def pad(b: Builder, node: Node) -> None:
    """Pad (constant, reflect, edge): a Pad of the axes from the first padded one on."""
    shape = node.shape(0)
    if node.opset < 11:
        pads, value = node.attr("pads"), float(node.attr("value", 0.0))
    else:
        pads = _constant_input(node, 1, "sizes").tolist()
        value = _scalar(node.constant(2), "constant value") if node.given(2) and node.constant(2) is not None else 0.0
        if node.given(2) and node.constant(2) is None:
            _constant_input(node, 2, "constant value")
    axes = _axes(node, 3) if node.opset >= 18 else None
    axes = list(range(len(shape))) if axes is None else axes
    before, after = [0] * len(shape), [0] * len(shape)
    for axis, start, end in zip(axes, pads[:len(axes)], pads[len(axes):]):
        before[axis], after[axis] = int(start), int(end)
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge") or min(before + after) < 0:
        raise ConversionError(f"mode {mode} with sizes {pads}: netspec's Pad adds (constant, reflect, edge)")
    padded = [axis for axis in range(len(shape)) if before[axis] or after[axis]]
    if not padded:
        b.alias(node.outputs[0], node.inputs[0])
        return
    first = padded[0]
    params = {"axis": first, "before": before[first:], "after": after[first:], "mode": mode.upper()}
    if mode == "constant" and value:
        params["value"] = value
    b.layer("Pad", node.name, node.inputs[:1], node.outputs[:1], pad_param=params)


def resize(b: Builder, node: Node) -> None:
    """Resize, Upsample (nearest or linear, of H and W): Resize."""
    shape = _require_2d(node, "resize")
    mode = node.attr("mode", "nearest")
    if node.op == "Upsample" or node.opset < 11:  # (their positions are o / scale, nearest rounding down)
        coordinates, nearest = "asymmetric", "floor"
        scales = node.attr("scales") if node.attr("scales") is not None else _constant_input(node, 1, "scales")
    else:
        coordinates = node.attr("coordinate_transformation_mode", "half_pixel")
        nearest = node.attr("nearest_mode", "round_prefer_floor")
        scales = node.constant(2) if node.given(2) else None
        if node.given(2) and scales is None:
            _constant_input(node, 2, "scales")
        if scales is not None and not numpy.asarray(scales).size:
            scales = None
        if node.attr("antialias", 0) or node.attr("axes") is not None or \
                node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise ConversionError("antialias, axes or a kept aspect ratio: netspec's Resize stretches H and W")
    if mode not in ("nearest", "linear", "bilinear") or coordinates in ("tf_half_pixel_for_nn", "tf_crop_and_resize"):
        raise ConversionError(f"mode {mode} with coordinate_transformation_mode {coordinates}: netspec's Resize "
                              "is nearest or (bi)linear, with half_pixel, pytorch_half_pixel, align_corners or "
                              "asymmetric positions")
    params = {"height": int(node.output_shape()[2]), "width": int(node.output_shape()[3])}
    if scales is not None:
        scales = [float(value) for value in numpy.asarray(scales).reshape(-1)]
        if len(scales) != len(shape) or scales[:2] != [1.0, 1.0]:
            raise ConversionError(f"scales {scales}: netspec's Resize scales H and W alone")
        params["scale"] = scales[2:]
    params.update({"mode": "NEAREST" if mode == "nearest" else "LINEAR", "coordinates": coordinates.upper()})
    if mode == "nearest":
        params["nearest"] = nearest.upper()
    b.layer("Resize", node.name, node.inputs[:1], node.outputs[:1], resize_param=params)


def conv_transpose(b: Builder, node: Node) -> None:
    """ConvTranspose: a Deconvolution (Caffe's weights are ONNX's: C, num_output/group, kh, kw), padded alike on
    both sides; where ONNX crops one side more (uneven pads, output_padding, output_shape), a Slice after it."""
    shape = _require_2d(node, "transposed convolution")
    weights = _constant_input(node, 1, "weights")
    strides, dilations = node.attr("strides", [1, 1]), node.attr("dilations", [1, 1])
    extra = node.attr("output_padding", [0, 0])
    full = [s * (size - 1) + d * (k - 1) + 1 for size, k, s, d in zip(shape[2:], weights.shape[2:], strides,
                                                                      dilations)]
    auto = node.attr("auto_pad", "NOTSET")
    if node.attr("output_shape") is not None or auto not in ("NOTSET", "", "VALID"):
        total = [f + e - o for f, e, o in zip(full, extra, node.output_shape()[2:])]
        small = [t // 2 for t in total]
        before = small if auto == "SAME_UPPER" else [t - h for t, h in zip(total, small)]
        after = [t - q for t, q in zip(total, before)]
    else:
        pads = node.attr("pads", [0, 0, 0, 0]) if auto != "VALID" else [0, 0, 0, 0]
        before, after = list(pads[:2]), list(pads[2:])
    cropped = [a - e for a, e in zip(after, extra)]  # (output_padding crops less at the end)
    if min(cropped) < 0:
        raise ConversionError(f"output_padding {extra} beyond the padding after {after}: netspec's Deconvolution "
                              "makes no outputs past its kernels' reach")
    pad = [min(q, c) for q, c in zip(before, cropped)]
    bias = node.constant(2)
    if node.given(2) and bias is None:
        _constant_input(node, 2, "bias")
    group = int(node.attr("group", 1))
    params = {"num_output": int(weights.shape[1] * group), **_pair("kernel_size", weights.shape[2:]),
              **_pair("stride", strides, skip=1), **_pair("pad", pad, skip=0), **_pair("dilation", dilations, skip=1),
              **({"group": group} if group != 1 else {}), **({} if bias is not None else {"bias_term": False})}
    uneven = before != cropped
    top = b.temporary(node.name) if uneven else node.outputs[0]
    b.layer("Deconvolution", node.name, node.inputs[:1], [top], [weights] if bias is None else [weights, bias],
            convolution_param=params)
    if not uneven:
        return
    sizes = [f - 2 * p for f, p in zip(full, pad)]
    node.shapes[top] = (shape[0], params["num_output"], *sizes)
    for axis, (q, c, p, size) in enumerate(zip(before, cropped, pad, sizes), start=2):
        last = axis == 3
        piece = node.outputs[0] if last else b.temporary(node.name)
        _cut(b, node, top, axis, [(q - p, size - (c - p))], [piece])
        node.shapes[piece] = (*node.shapes[top][:axis], size - (q - p) - (c - p), *node.shapes[top][axis + 1:])
        top = piece


def layer_normalization(b: Builder, node: Node) -> None:
    """LayerNormalization: LayerNorm over the axes from ``axis`` on, its scale and bias of their shape."""
    shape = node.shape(0)
    axis = int(node.attr("axis", -1)) % len(shape)
    normalised = shape[axis:]
    if any(node.outputs[1:]):
        raise ConversionError("its mean and inverse deviation outputs: netspec's LayerNorm gives only the result")
    scale = _constant_input(node, 1, "scale")
    shift = node.constant(2) if node.given(2) else numpy.zeros(normalised)
    if shift is None:
        _constant_input(node, 2, "bias")
    if any(numpy.broadcast_shapes(value.shape, normalised) != tuple(normalised) for value in (scale, shift)):
        raise ConversionError(f"a scale or bias of shape {list(scale.shape)} or {list(shift.shape)} that does not "
                              f"fit the normalised axes {list(normalised)}")
    b.layer("LayerNorm", node.name, node.inputs[:1], node.outputs[:1],
            [numpy.broadcast_to(scale, normalised), numpy.broadcast_to(shift, normalised)],
            layer_norm_param={"axis": axis, "eps": float(node.attr("epsilon", 1e-5))})


def gelu(b: Builder, node: Node) -> None:
    """Gelu (opset 20, or the exporters' Div-Erf-Add-Mul pattern recognised as it): GELU."""
    b.layer("GELU", node.name, node.inputs[:1], node.outputs[:1],
            gelu_param={"approximate": node.attr("approximate", "none")})


def _axes(node: Node, index: int) -> list[int] | None:
    """The ``axes`` attribute, or constant input ``index`` where later opsets moved it (None: not given)."""
    axes = node.attr("axes")
    if axes is None and node.given(index):
        axes = _constant_input(node, index, "axes").tolist()
    return None if axes is None else [int(axis) % len(node.shape(0)) for axis in axes]


def reduce(b: Builder, node: Node) -> None:
    """ReduceMean, ReduceSum: a Reduction over the trailing axes (the axes reduced moved there first by a
    Permute), and a Reshape where the reduced axes are kept."""
    shape = node.shape(0)
    axes = _axes(node, 1)
    if not axes and node.attr("noop_with_empty_axes", 0):  # (nothing reduced: the value of each element alone)
        if node.op in ("ReduceMean", "ReduceSum"):
            b.alias(node.outputs[0], node.inputs[0])
        else:
            b.layer("AbsVal" if node.op == "ReduceL1" else "Power", node.name, node.inputs[:1], node.outputs[:1],
                    **({} if node.op == "ReduceL1" else {"power_param": {"power": 2.0}}))
        return
    if not axes:
        axes = list(range(len(shape)))
    axes = sorted(set(axes))
    source = node.inputs[0]
    kept = [axis for axis in range(len(shape)) if axis not in axes]
    if kept != list(range(len(kept))):  # (the reduced axes are not the last ones)
        moved = b.temporary(node.name)
        b.layer("Permute", f"{node.name}/order", [source], [moved], permute_param={"order": kept + axes})
        source = moved
    operation = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceSumSquare": "SUMSQ", "ReduceL1": "ASUM"}[node.op]
    reduced = b.temporary(node.name) if node.attr("keepdims", 1) else node.outputs[0]
    b.layer("Reduction", node.name, [source], [reduced], reduction_param={"operation": operation,
                                                                           "axis": len(kept)})
    if reduced != node.outputs[0]:
        b.layer("Reshape", f"{node.name}/keep", [reduced], node.outputs[:1],
                reshape_param=_reshape(tuple(shape[axis] for axis in kept), node.output_shape()))


def _cut(b: Builder, node: Node, source: str, axis: int, pieces: list[tuple[int, int]], tops: list[str]) -> None:
    """A Slice of ``source`` along ``axis`` whose pieces ``(start, stop)`` (in order, not overlapping) go to
    ``tops``; the parts between them go to a Silence."""
    size = node.shapes[source][axis]
    points, names, unused = [], [], []
    position = 0
    for (start, stop), top in zip(pieces, tops):
        if start > position:
            points.append(start)
            unused.append(b.temporary(node.name))
            names.append(unused[-1])
        names.append(top)
        if stop < size:
            points.append(stop)
        position = stop
    if position < size:
        unused.append(b.temporary(node.name))
        names.append(unused[-1])
    if len(names) == 1:
        b.alias(tops[0], source)
        return
    b.layer("Slice", node.name, [source], names, slice_param={"axis": axis, "slice_point": points})
    if unused:
        b.layer("Silence", f"{node.name}/unused", unused, [])


def split(b: Builder, node: Node) -> None:
    """Split: a Slice at the sizes given (or into equal parts)."""
    shape = node.shape(0)
    axis = int(node.attr("axis", 0)) % len(shape)
    sizes = node.attr("split")
    if sizes is None and node.given(1):
        sizes = _constant_input(node, 1, "sizes").tolist()
    if sizes is None:
        count = len(node.outputs)
        sizes = [-(-shape[axis] // count)] * (count - 1)
        sizes.append(shape[axis] - sum(sizes))
    bounds = numpy.cumsum([0, *sizes]).tolist()
    tops = [top or b.temporary(node.name) for top in node.outputs]
    _cut(b, node, node.inputs[0], axis, list(zip(bounds[:-1], bounds[1:])), tops)


def slice_(b: Builder, node: Node) -> None:
    """Slice (steps of 1): a Slice a sliced axis, the rest of each axis silenced."""
    shape = node.shape(0)
    if node.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
        steps = None
    else:
        starts, ends = (_constant_input(node, i, what).tolist() for i, what in ((1, "starts"), (2, "ends")))
        axes = _constant_input(node, 3, "axes").tolist() if node.given(3) else None
        steps = _constant_input(node, 4, "steps").tolist() if node.given(4) else None
    axes = list(range(len(starts))) if axes is None else [int(a) % len(shape) for a in axes]
    if steps is not None and any(step != 1 for step in steps):
        raise ConversionError(f"steps {steps}: netspec's Slice cuts contiguous pieces")
    source = node.inputs[0]
    for number, (axis, start, stop) in enumerate(zip(axes, starts, ends)):
        start, stop, _ = slice(int(start), int(stop)).indices(shape[axis])
        last = number == len(axes) - 1
        top = node.outputs[0] if last else b.temporary(node.name)
        _cut(b, node, source, axis, [(start, stop)], [top])
        node.shapes[top] = (*node.shapes[source][:axis], stop - start, *node.shapes[source][axis + 1:])
        source = top


def gather(b: Builder, node: Node) -> None:
    """Gather of a constant index (a class token): a Slice of that position and a Reshape dropping the axis."""
    index = _constant_input(node, 1, "index")
    shape = node.shape(0)
    axis = int(node.attr("axis", 0)) % len(shape)
    if index.ndim > 1 or (index.ndim == 1 and index.size != 1) or node.constant(0) is not None:
        raise ConversionError("indices other than one constant position: netspec picks rows of computed blobs "
                              "with BatchReindex, and looks up constant tables with Embed")
    position = int(index.reshape(-1)[0])
    if not -shape[axis] <= position < shape[axis]:
        raise ConversionError(f"index {position} outside the {shape[axis]} positions of axis {axis}")
    position %= shape[axis]
    piece = b.temporary(node.name)
    _cut(b, node, node.inputs[0], axis, [(position, position + 1)], [piece])
    b.layer("Reshape", f"{node.name}/drop", [piece], node.outputs[:1],
            reshape_param=_reshape((*shape[:axis], 1, *shape[axis + 1:]), node.output_shape()))


def einsum(b: Builder, node: Node) -> None:
    """Einsum where it is a (batched) product of two matrices, either transposed: MatMul."""
    equation = node.attr("equation").replace(" ", "")
    operands, _, out = equation.partition("->")
    parts = operands.split(",")
    refused = ConversionError(f"equation '{equation}': netspec computes Einsum only as a product of two matrices")
    if len(parts) != 2 or len(out) < 2 or len({len(part) for part in (*parts, out)}) != 1:
        raise refused
    a, c = parts
    batch, (i, k) = out[:-2], out[-2:]
    summed = (set(a) & set(c)) - set(out)
    if len(summed) != 1:
        raise refused
    j = summed.pop()
    if a[:-2] != batch or c[:-2] != batch or set(a[-2:]) != {i, j} or set(c[-2:]) != {j, k}:
        raise refused
    if node.computed() != [0, 1]:
        raise ConversionError("a constant operand: write the product as MatMul by a matrix")
    b.layer("MatMul", node.name, node.inputs[:2], node.outputs[:1],
            mat_mul_param={"transpose_a": a[-2:] == j + i, "transpose_b": c[-2:] == k + j})


CONVERTERS: dict[str, Callable[[Builder, Node], None]] = {
    "Conv": conv, "MaxPool": max_pool, "AveragePool": average_pool,
    "GlobalAveragePool": _global_pool("AVE"), "GlobalMaxPool": _global_pool("MAX"), "LRN": lrn,
    "Gemm": gemm, "MatMul": matmul, "BatchNormalization": batch_normalization,
    "Relu": _activation("ReLU"), "Sigmoid": _activation("Sigmoid"), "Tanh": _activation("TanH"),
    "Softplus": _activation("BNLL"), "Abs": _activation("AbsVal"), "HardSwish": _activation("HardSwish"),
    "Exp": _activation("Exp"), "Log": _activation("Log"),
    "LeakyRelu": _activation("ReLU", "relu_param", lambda n: {"negative_slope": float(n.attr("alpha", 0.01))}),
    "Elu": _activation("ELU", "elu_param", lambda n: {"alpha": float(n.attr("alpha", 1.0))}),
    "HardSigmoid": _activation("HardSigmoid", "hard_sigmoid_param",
                               lambda n: {"alpha": float(n.attr("alpha", 0.2)), "beta": float(n.attr("beta", 0.5))}),
    "Sqrt": _activation("Power", "power_param", lambda n: {"power": 0.5}),
    "Reciprocal": _activation("Power", "power_param", lambda n: {"power": -1.0}),
    "Neg": _activation("Power", "power_param", lambda n: {"scale": -1.0}),
    "Clip": clip, "PRelu": prelu, "Softmax": softmax, "LogSoftmax": softmax,
    "Add": arithmetic, "Sub": arithmetic, "Mul": arithmetic, "Div": arithmetic,
    "Sum": variadic("SUM"), "Max": variadic("MAX"), "Concat": concat,
    "Flatten": reshape, "Reshape": reshape, "Squeeze": reshape, "Unsqueeze": reshape, "Transpose": transpose,
    "Identity": identity, "Dropout": identity,
    "ConvTranspose": conv_transpose, "LayerNormalization": layer_normalization, "Gelu": gelu,
    "ReduceMean": reduce, "ReduceSum": reduce, "ReduceSumSquare": reduce, "ReduceL1": reduce,
    "Split": split, "Slice": slice_, "Gather": gather, "Einsum": einsum, "Pad": pad,
    "Resize": resize, "Upsample": resize, "Pow": power,
}

NEAREST: dict[str, str] = {  # operators with no converter yet, and what to do instead
    "TopK": "ArgMax (with out_max_val for the values)",
}
