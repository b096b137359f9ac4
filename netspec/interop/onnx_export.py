"""``netspec export onnx``: a net's inference graph, with its weights, as an ONNX model (the ``onnx`` package).

Each layer becomes the ONNX operators that compute the same values:
in-place layers get fresh tensor names (ONNX tensors are written once),
BatchNorm's stored sums are divided by its scale factor, Dropout is the
identity, and Caffe's pooling (output size rounded up, the last window
starting inside the padded input, average windows clipped at the padded
edge) becomes explicit end padding, for Pooling and for each level of SPP.
MultiHeadAttention becomes plain operators (MatMul, Reshape, Transpose,
Softmax), InnerProduct on an axis other than 1 a MatMul over the last axis,
MVN its means, square root and division in Caffe's order, and Caffe's
base/scale/shift forms of Exp, Log and Power a Mul and an Add before the
operator.  Indices stored as floats (Embed's, BatchReindex's) are cast to
int64 for Gather; ArgMax's and Threshold's results are cast back to floats.
In an inference net (:func:`netspec.load_net` with ``inference``, as
``netspec export onnx`` builds it unless ``--unfolded``) the BatchNorm and
Scale a convolution absorbs are folded into its weights and bias, as the
net computes them.
A layer with no ONNX equivalent is refused by name; so are adaptive pooling
whose windows differ in size and RNN and LSTM, whose ``cont`` input can reset
the state at any step, which ONNX's recurrent operators cannot.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy

from netspec.atomic import atomic_path
from netspec.errors import NetspecError
from netspec.layers.activations import TANH_CUBIC, TANH_SCALE
from netspec.layers.pooling import pool_geometry

DEFAULT_OPSET = 17
IR_VERSION = 8  # ONNX 1.10 (opsets up to 15 in the spec; readers accept newer opsets at this IR) - widely readable


class ExportError(NetspecError):
    """A net that cannot be written as ONNX."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ExportError("ONNX export needs the onnx package: python3 -m pip install 'netspec[onnx]'") from None
    return onnx


class _Builder:
    """Collects ONNX nodes and initializers while walking the net."""

    def __init__(self, onnx, net, opset: int, folded: set[int]):
        self.onnx, self.helper, self.net, self.opset = onnx, onnx.helper, net, opset
        self.nodes, self.initializers = [], []
        self.current: dict[str, str] = {}  # blob name -> the ONNX tensor holding its latest value
        self.writes = Counter(name for index, node in enumerate(net.nodes) if index not in folded
                              for name in node.tops)
        self.seen: Counter = Counter()
        self.counter = 0

    def tensor_for_top(self, blob: str) -> str:
        """A fresh ONNX name for a write of ``blob``; its last write keeps the blob's own name."""
        self.seen[blob] += 1
        name = blob if self.seen[blob] == self.writes[blob] else f"{blob}/{self.seen[blob]}"
        self.current[blob] = name
        return name

    def graph_input(self, blob: str) -> str:
        """The graph input holding ``blob``: the blob's own name, which callers feed, so no later (in-place)
        write of the blob takes that name."""
        self.writes[blob] += 1
        self.seen[blob] += 1
        self.current[blob] = blob
        return blob

    def constant(self, stem: str, value) -> str:
        """An initializer holding ``value`` (float32 unless it is an integer array)."""
        self.counter += 1
        name = f"{stem}/{self.counter}"
        array = numpy.asarray(value)
        array = array.astype(numpy.int64 if array.dtype.kind in "iu" else numpy.float32)
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def temporary(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}/intermediate{self.counter}"

    def add(self, op: str, inputs: list[str], outputs: list[str], name: str, **attributes) -> None:
        self.nodes.append(self.helper.make_node(op, inputs, outputs, name=f"{name}/{op}/{len(self.nodes)}",
                                                **attributes))

    def intermediate(self, op: str, inputs: list[str], name: str, **attributes) -> str:
        """A node of ``op`` writing a fresh :meth:`temporary`; that tensor's name."""
        out = self.temporary(name)
        self.add(op, inputs, [out], name, **attributes)
        return out


def _param(layer, index: int) -> numpy.ndarray:
    return _host(layer, layer.blobs[index].data)


def _host(layer, array) -> numpy.ndarray:
    """A float32 copy on the host of ``array``, on ``layer``'s device."""
    return numpy.asarray(layer.backend.to_host(array), dtype=numpy.float32)


def folded_into_convolutions(net) -> set[int]:
    """Indices of the BatchNorm and Scale layers that ``net`` (an inference net) folds into a convolution."""
    return {absorbed for absorbed, index in net.absorbed_by.items()
            if net.layers[index].type == "Convolution" and net.layers[absorbed].type in ("BatchNorm", "Scale")}


def _convolution(op: str):
    """Conv (the weights and bias with what the layer folds), or ConvTranspose for Deconvolution (Caffe's
    weights are its: C, num_output/group, kh, kw)."""
    def export(b: _Builder, node, layer, x: str, y: str) -> None:
        geo = layer.geometry(node.bottom_shapes[0])
        weights, bias = (layer.folded_weights_and_bias() if op == "Conv" else
                         (layer.blobs[0].data, layer.blobs[1].data if layer.params.bias_term else None))
        inputs = [x, b.constant(f"{node.name}/weight", _host(layer, weights))]
        if bias is not None:
            inputs.append(b.constant(f"{node.name}/bias", _host(layer, bias)))
        b.add(op, inputs, [y], node.name, kernel_shape=list(geo.kernel), strides=list(geo.stride),
              pads=[*geo.pad, *(geo.far_pad if op == "Conv" else geo.pad)],  # (a kernel past the far edge)
              dilations=list(geo.dilation), group=layer.params.group)
    return export


def _crop(b: _Builder, node, layer, x: str, y: str) -> None:
    window = layer.window(*node.bottom_shapes)
    axes = [axis for axis, part in enumerate(window) if part != slice(None)]
    starts = [window[axis].start for axis in axes]
    ends = [window[axis].stop for axis in axes]
    b.add("Slice", [x, b.constant(f"{node.name}/starts", starts), b.constant(f"{node.name}/ends", ends),
                    b.constant(f"{node.name}/axes", axes)], [y], node.name)


def _linear(b: _Builder, name: str, x: str, matrix: numpy.ndarray, bias, y: str | None = None) -> str:
    """``x @ matrix (+ bias)`` over x's last axis (MatMul, and Add for a bias) written to ``y``, or to a fresh
    tensor without one; the tensor's name."""
    out = y or b.temporary(name)
    weight = b.constant(f"{name}/weight", matrix)
    if bias is None:
        b.add("MatMul", [x, weight], [out], name)
    else:
        b.add("Add", [b.intermediate("MatMul", [x, weight], name), b.constant(f"{name}/bias", bias)], [out], name)
    return out


def _inner_product(b: _Builder, node, layer, x: str, y: str) -> None:
    """Gemm on the flattened input for axis 1; for any other axis the axes from it on flattened into the last
    one (a Reshape where there are several), then MatMul and Add."""
    p = layer.params
    shape = node.bottom_shapes[0]
    axis = layer.split(shape)[0]
    if axis != 1:
        if axis != len(shape) - 1:
            x = b.intermediate("Reshape", [x, b.constant(f"{node.name}/shape", [*shape[:axis], -1])], node.name)
        _linear(b, node.name, x, _param(layer, 0) if p.transpose else _param(layer, 0).T,
                _param(layer, 1) if p.bias_term else None, y)
        return
    flat = b.temporary(node.name)
    b.add("Flatten", [x], [flat], node.name, axis=1)
    inputs = [flat, b.constant(f"{node.name}/weight", _param(layer, 0))]
    inputs.append(b.constant(f"{node.name}/bias", _param(layer, 1) if p.bias_term else numpy.zeros(p.num_output)))
    b.add("Gemm", inputs, [y], node.name, transB=0 if p.transpose else 1)


def _pooling(b: _Builder, node, layer, x: str, y: str) -> None:
    _pool(b, node, layer.block("pooling_param"), x, y)


def _pool(b: _Builder, node, p, x: str, y: str) -> None:
    """The pooling ``p`` (a pooling_param block) of the node's bottom, with Caffe's rounding and padding."""
    shape = node.bottom_shapes[0]
    geo = pool_geometry(p, shape)
    if geo.bins is not None:
        raise ExportError(f"layer '{node.name}' ({node.layer.type}): adaptive pooling of {shape[2]}x{shape[3]} to "
                          f"{geo.out[0]}x{geo.out[1]} has windows of different sizes, which ONNX's pooling cannot "
                          "express; pick an output size that divides the input's")
    if geo.kernel == tuple(shape[2:]) and geo.out == (1, 1) and not any(geo.pad):
        b.add("GlobalMaxPool" if p.pool == "MAX" else "GlobalAveragePool", [x], [y], node.name)
        return
    window = {"kernel_shape": list(geo.kernel), "strides": list(geo.stride)}
    if p.pool == "MAX":  # far_pad is the whole padding past the far edge that the last window needs
        b.add("MaxPool", [x], [y], node.name, pads=[*geo.pad, *geo.far_pad], **window)
        return
    if p.pool != "AVE":
        raise ExportError(f"layer '{node.name}' ({node.layer.type}): {p.pool} pooling has no ONNX equivalent")
    if not getattr(p, "count_include_pad", True):  # (ONNX's own rule: the input positions alone count)
        b.add("AveragePool", [x], [y], node.name, pads=[*geo.pad, *geo.far_pad], count_include_pad=0, **window)
        return
    # Caffe's average counts the declared padding but not what rounding up adds past it: pad the declared
    # part with real zeros, and let AveragePool leave the rest out of its count
    declared_end = [min(pad, far) for pad, far in zip(geo.pad, geo.far_pad)]
    if any(geo.pad):
        padded = b.temporary(node.name)
        pads = b.constant(f"{node.name}/pads", [0, 0, *geo.pad, 0, 0, *declared_end])
        b.add("Pad", [x, pads], [padded], node.name)
        x = padded
    extra = [max(0, far - pad) for pad, far in zip(geo.pad, geo.far_pad)]
    b.add("AveragePool", [x], [y], node.name, pads=[0, 0, *extra], count_include_pad=0, **window)


def _spp(b: _Builder, node, layer, x: str, y: str) -> None:
    """Each level's pooling (by SPP's own geometry) flattened per instance, the levels joined along axis 1 (one
    level: its pooling, unflattened, as the layer's top)."""
    if len(layer.levels(node.bottom_shapes[0])) == 1:
        _pool(b, node, layer.levels(node.bottom_shapes[0])[0], x, y)
        return
    levels = []
    for params in layer.levels(node.bottom_shapes[0]):
        pooled = b.temporary(node.name)
        _pool(b, node, params, x, pooled)
        levels.append(b.intermediate("Flatten", [pooled], node.name, axis=1))
    b.add("Concat", levels, [y], node.name, axis=1)


def _batch_norm(b: _Builder, node, layer, x: str, y: str) -> None:
    if not layer.global_stats:
        raise ExportError(f"layer '{node.name}' (BatchNorm): only stored statistics (use_global_stats) export")
    factor = float(_param(layer, 2)[0])
    scale = 0.0 if factor == 0 else 1.0 / factor
    channels = node.bottom_shapes[0][1]
    b.add("BatchNormalization", [x, b.constant(f"{node.name}/gamma", numpy.ones(channels)),
                                 b.constant(f"{node.name}/beta", numpy.zeros(channels)),
                                 b.constant(f"{node.name}/mean", _param(layer, 0) * scale),
                                 b.constant(f"{node.name}/var", _param(layer, 1) * scale)],
          [y], node.name, epsilon=float(layer.block("batch_norm_param").eps))


def _operand_shape(node, layer) -> list[int]:
    """The shape of Scale's or Bias's operand with ones after it, to broadcast against the bottom (numpy rules)."""
    shape = layer.operand(node.bottom_shapes)[0]
    ndim = len(node.bottom_shapes[0])
    start = layer.block(layer.block_name).axis % ndim
    return [*shape, *([1] * (ndim - start - len(shape)))]


def _operand(b: _Builder, node, layer, inputs: list[str]) -> str:
    """Scale's or Bias's operand, broadcastable: the second bottom reshaped, or an initializer of the learned one."""
    shape = _operand_shape(node, layer)
    if len(inputs) > 1:
        return b.intermediate("Reshape", [inputs[1], b.constant(f"{node.name}/shape", shape)], node.name)
    return b.constant(f"{node.name}/operand", _param(layer, 0).reshape(shape))


def _scale(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    scale = _operand(b, node, layer, inputs)
    if not layer.block("scale_param").bias_term:
        b.add("Mul", [inputs[0], scale], [y], node.name)
        return
    bias = b.constant(f"{node.name}/bias", _param(layer, -1).reshape(_operand_shape(node, layer)))
    b.add("Add", [b.intermediate("Mul", [inputs[0], scale], node.name), bias], [y], node.name)


def _bias(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    b.add("Add", [inputs[0], _operand(b, node, layer, inputs)], [y], node.name)


def _eltwise(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    p = layer.block("eltwise_param")
    if p.operation == "MAX":
        b.add("Max", inputs, [y], node.name)
        return
    if p.operation == "SUM":
        if p.coeff and any(c != 1 for c in p.coeff):
            weighted = []
            for value, coeff in zip(inputs, p.coeff):
                weighted.append(b.temporary(node.name))
                b.add("Mul", [value, b.constant(f"{node.name}/coeff", numpy.float32(coeff))], [weighted[-1]],
                      node.name)
            inputs = weighted
        b.add("Sum", inputs, [y], node.name)
        return
    product = inputs[0]
    for index, value in enumerate(inputs[1:], 2):
        out = y if index == len(inputs) else b.temporary(node.name)
        b.add("Mul", [product, value], [out], node.name)
        product = out


def _concat(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    b.add("Concat", inputs, [y], node.name, axis=layer.join_axis(node.bottom_shapes))


def _lrn(b: _Builder, node, layer, x: str, y: str) -> None:
    p = layer.block("lrn_param")
    if p.norm_region == "ACROSS_CHANNELS":
        b.add("LRN", [x], [y], node.name, size=p.local_size, alpha=p.alpha, beta=p.beta, bias=p.k)
        return
    # WITHIN_CHANNEL: s = 1 + alpha * (mean of x^2 over the n x n window, zero padded); y = x / s^beta
    n, pad = p.local_size, (p.local_size - 1) // 2
    squares, mean, scaled, s, powered = (b.temporary(node.name) for _ in range(5))
    b.add("Mul", [x, x], [squares], node.name)
    b.add("AveragePool", [squares], [mean], node.name, kernel_shape=[n, n], strides=[1, 1], pads=[pad] * 4,
          count_include_pad=1)
    b.add("Mul", [mean, b.constant(f"{node.name}/alpha", numpy.float32(p.alpha))], [scaled], node.name)
    b.add("Add", [scaled, b.constant(f"{node.name}/one", numpy.float32(1.0))], [s], node.name)
    b.add("Pow", [s, b.constant(f"{node.name}/beta", numpy.float32(p.beta))], [powered], node.name)
    b.add("Div", [x, powered], [y], node.name)


def _simple(op: str, block: str = "", *keys: str):
    """One ``op`` node, its attributes ``keys`` read from the layer's parameter block ``block``."""
    def export(b: _Builder, node, layer, x: str, y: str) -> None:
        b.add(op, [x], [y], node.name, **{key: getattr(layer.block(block), key) for key in keys})
    return export


def _affine(b: _Builder, name: str, x: str, scale: float, shift: float) -> str:
    """``shift + scale * x`` (a Mul, an Add, each only where it changes something); the tensor's name."""
    if scale != 1:
        x = b.intermediate("Mul", [x, b.constant(f"{name}/scale", numpy.float32(scale))], name)
    if shift != 0:
        x = b.intermediate("Add", [x, b.constant(f"{name}/shift", numpy.float32(shift))], name)
    return x


def _exp(b: _Builder, node, layer, x: str, y: str) -> None:
    """``exp(ln(base) * (shift + scale * x))``, in netspec's order."""
    p = layer.params
    b.add("Exp", [_affine(b, node.name, _affine(b, node.name, x, p.scale, p.shift), layer.ln_base(), 0)], [y],
          node.name)


def _log(b: _Builder, node, layer, x: str, y: str) -> None:
    """``log(shift + scale * x) / ln(base)``."""
    p = layer.params
    natural = y if layer.ln_base() == 1 else b.temporary(node.name)
    b.add("Log", [_affine(b, node.name, x, p.scale, p.shift)], [natural], node.name)
    if natural != y:
        b.add("Div", [natural, b.constant(f"{node.name}/ln_base", numpy.float32(layer.ln_base()))], [y], node.name)


def _power(b: _Builder, node, layer, x: str, y: str) -> None:
    p = layer.block("power_param")
    b.add("Pow", [_affine(b, node.name, x, p.scale, p.shift), b.constant(f"{node.name}/power",
                                                                          numpy.float32(p.power))], [y], node.name)


def _prelu(b: _Builder, node, layer, x: str, y: str) -> None:
    """PRelu, the slopes (C,) or the shared one shaped to broadcast over the axes after the channels."""
    slopes = _param(layer, 0)
    ndim = len(node.bottom_shapes[0])
    b.add("PRelu", [x, b.constant(f"{node.name}/slope", slopes.reshape(-1, *([1] * (ndim - 2))))], [y], node.name)


def _threshold(b: _Builder, node, layer, x: str, y: str) -> None:
    limit = b.constant(f"{node.name}/threshold", numpy.float32(layer.block("threshold_param").threshold))
    b.add("Cast", [b.intermediate("Greater", [x, limit], node.name)], [y], node.name, to=b.onnx.TensorProto.FLOAT)


def _relu(b: _Builder, node, layer, x: str, y: str) -> None:
    slope = layer.block("relu_param").negative_slope
    b.add("LeakyRelu" if slope else "Relu", [x], [y], node.name, **({"alpha": slope} if slope else {}))


def _clamp(b: _Builder, node, x: str, y: str, low: float, high: float) -> None:
    """Clip to [low, high], the bounds as inputs (infinite ones too)."""
    b.add("Clip", [x, b.constant(f"{node.name}/min", numpy.float32(low)),
                   b.constant(f"{node.name}/max", numpy.float32(high))], [y], node.name)


def _relu6(b: _Builder, node, layer, x: str, y: str) -> None:
    _clamp(b, node, x, y, 0, 6)


def _clip(b: _Builder, node, layer, x: str, y: str) -> None:
    p = layer.block("clip_param")
    _clamp(b, node, x, y, p.min, p.max)


def _swish(b: _Builder, node, layer, x: str, y: str) -> None:
    beta = layer.block("swish_param").beta
    scaled = x
    if beta != 1:
        scaled = b.temporary(node.name)
        b.add("Mul", [x, b.constant(f"{node.name}/beta", numpy.float32(beta))], [scaled], node.name)
    gate = b.temporary(node.name)
    b.add("Sigmoid", [scaled], [gate], node.name)
    b.add("Mul", [x, gate], [y], node.name)


def _gelu(b: _Builder, node, layer, x: str, y: str) -> None:
    approximate = layer.block("gelu_param").approximate
    if b.opset >= 20:
        b.add("Gelu", [x], [y], node.name, approximate=approximate)
        return

    # before opset 20: y = x * (1 + f) / 2, f = erf(x / sqrt(2)), or tanh(sqrt(2/pi) * x * (1 + 0.044715 x^2))
    def step(op: str, *inputs: str) -> str:
        return b.intermediate(op, list(inputs), node.name)

    def number(value: float) -> str:
        return b.constant(f"{node.name}/constant", numpy.float32(value))

    if approximate == "tanh":
        polynomial = step("Add", step("Mul", step("Mul", x, x), number(TANH_CUBIC)), number(1))
        gate = step("Tanh", step("Mul", step("Mul", x, polynomial), number(TANH_SCALE)))
    else:
        gate = step("Erf", step("Mul", x, number(math.sqrt(0.5))))
    b.add("Mul", [x, step("Mul", step("Add", gate, number(1)), number(0.5))], [y], node.name)


def _matmul(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    p = layer.block("mat_mul_param")
    if len(node.bottom_shapes[0]) == 2:  # Gemm transposes its operands itself
        b.add("Gemm", inputs, [y], node.name, transA=int(p.transpose_a), transB=int(p.transpose_b))
        return
    swap = list(range(len(node.bottom_shapes[0])))
    swap[-2:] = swap[-1], swap[-2]
    operands = [b.intermediate("Transpose", [value], node.name, perm=swap) if transposed else value
                for value, transposed in zip(inputs, (p.transpose_a, p.transpose_b))]
    b.add("MatMul", operands, [y], node.name)


def _attention(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    """MultiHeadAttention in plain operators (ONNX's Attention needs opset 23).

    Per role, q, k and v = x W^T (+ b), 1/sqrt(D) folded into W_q and b_q, reshaped to (N, T, heads, D) and
    transposed to (N, heads, T, D), k to (N, heads, D, T); then softmax(q k^T (+ the causal mask)) v, the heads
    merged back to (N, T_q, E) and the out projection.  One bottom feeds all three projections.
    """
    n, tq, tk, e = layer.dims(node.bottom_shapes)
    heads = layer.params.num_heads
    w_in, b_in, w_out, b_out = layer.blob_indices()
    scale = numpy.ones(3 * e, dtype=numpy.float32)
    scale[:e] = 1 / math.sqrt(e // heads)
    weight = _param(layer, w_in) * scale[:, None]
    bias = None if b_in is None else _param(layer, b_in) * scale
    sources = inputs * 3 if len(inputs) == 1 else inputs
    layouts = ((tq, [0, 2, 1, 3]), (tk, [0, 2, 3, 1]), (tk, [0, 2, 1, 3]))  # (length, perm) of q, k, v
    parts = []
    for role, (x, (length, perm)) in enumerate(zip(sources, layouts)):
        rows = slice(role * e, (role + 1) * e)
        projected = _linear(b, node.name, x, weight[rows].T, None if bias is None else bias[rows])
        shape = b.constant(f"{node.name}/shape", [n, length, heads, e // heads])
        parts.append(b.intermediate("Transpose", [b.intermediate("Reshape", [projected, shape], node.name)],
                                    node.name, perm=perm))
    q, k_transposed, v = parts
    scores = b.intermediate("MatMul", [q, k_transposed], node.name)
    if layer.params.causal:
        mask = numpy.triu(numpy.full((tq, tk), -numpy.inf, dtype=numpy.float32), 1)
        scores = b.intermediate("Add", [scores, b.constant(f"{node.name}/mask", mask)], node.name)
    weights = b.intermediate("Softmax", [scores], node.name, axis=-1)
    context = b.intermediate("Transpose", [b.intermediate("MatMul", [weights, v], node.name)], node.name,
                             perm=[0, 2, 1, 3])
    merged = b.intermediate("Reshape", [context, b.constant(f"{node.name}/shape", [n, tq, e])], node.name)
    _linear(b, node.name, merged, _param(layer, w_out).T, None if b_out is None else _param(layer, b_out), y)


def _layer_norm(b: _Builder, node, layer, x: str, y: str) -> None:
    p = layer.block("layer_norm_param")
    shape = layer.normalised(node.bottom_shapes[0])
    scale, shift = (_param(layer, 0), _param(layer, 1)) if layer.blobs else (numpy.ones(shape), numpy.zeros(shape))
    b.add("LayerNormalization", [x, b.constant(f"{node.name}/scale", scale), b.constant(f"{node.name}/shift", shift)],
          [y], node.name, axis=len(node.bottom_shapes[0]) - len(shape), epsilon=p.eps)


def _softmax(b: _Builder, node, layer, x: str, y: str) -> None:
    """Softmax or LogSoftmax (ONNX's names are netspec's) along the axis."""
    b.add(layer.type, [x], [y], node.name, axis=layer.block("softmax_param").axis)


def _permute(b: _Builder, node, layer, x: str, y: str) -> None:
    b.add("Transpose", [x], [y], node.name, perm=list(layer.axes(len(node.bottom_shapes[0]))))


REDUCTIONS = {"SUM": "ReduceSum", "ASUM": "ReduceL1", "SUMSQ": "ReduceSumSquare", "MEAN": "ReduceMean"}


def _reduce(b: _Builder, name: str, op: str, x: str, axes: list[int], keepdims: int, out: str) -> None:
    """The Reduce operator ``op`` over ``axes`` written to ``out``.  The axes are an input from opset 18
    (ReduceSum's from 13), an attribute before."""
    as_input = b.opset >= (13 if op == "ReduceSum" else 18)
    b.add(op, [x, b.constant(f"{name}/axes", axes)] if as_input else [x], [out], name, keepdims=keepdims,
          **({} if as_input else {"axes": axes}))


def _reduction(b: _Builder, node, layer, x: str, y: str) -> None:
    """The Reduce operator over the axes from ``axis`` on, times ``coeff``."""
    p = layer.block("reduction_param")
    axes = list(range(len(node.top_shapes[0]), len(node.bottom_shapes[0])))
    out = y if p.coeff == 1 else b.temporary(node.name)
    _reduce(b, node.name, REDUCTIONS[p.operation], x, axes, 0, out)
    if p.coeff != 1:
        b.add("Mul", [out, b.constant(f"{node.name}/coeff", numpy.float32(p.coeff))], [y], node.name)


def _mvn(b: _Builder, node, layer, x: str, y: str) -> None:
    """``(x - mean) / (sqrt(mean((x - mean)^2)) + eps)`` over the axes from 2 (from 1 across channels) on, eps
    added to the standard deviation as Caffe does; over no axes (an (N, C) bottom) the mean is x itself.  A bottom
    of fewer than 4 axes is reshaped to the top's (N, C, H, W) after."""
    p = layer.block("mvn_param")
    axes = list(range(1 if p.across_channels else 2, len(node.bottom_shapes[0])))
    if tuple(node.bottom_shapes[0]) != tuple(node.top_shapes[0]):
        normalised = b.temporary(node.name)
        _mvn_values(b, node, p, axes, x, normalised)
        _reshape(b, node, layer, normalised, y)
    else:
        _mvn_values(b, node, p, axes, x, y)


def _mvn_values(b: _Builder, node, p, axes: list[int], x: str, y: str) -> None:
    """MVN's values (see :func:`_mvn`) in the bottom's shape."""

    def mean(value: str) -> str:
        if not axes:
            return value
        out = b.temporary(node.name)
        _reduce(b, node.name, "ReduceMean", value, axes, 1, out)
        return out

    if not p.normalize_variance:
        b.add("Sub", [x, mean(x)], [y], node.name)
        return
    centred = b.intermediate("Sub", [x, mean(x)], node.name)
    std = b.intermediate("Sqrt", [mean(b.intermediate("Mul", [centred, centred], node.name))], node.name)
    eps = b.constant(f"{node.name}/eps", numpy.float32(p.eps))
    b.add("Div", [centred, b.intermediate("Add", [std, eps], node.name)], [y], node.name)


def _reshape(b: _Builder, node, layer, x: str, y: str) -> None:
    b.add("Reshape", [x, b.constant(f"{node.name}/shape", list(node.top_shapes[0]))], [y], node.name)


def _tile(b: _Builder, node, layer, x: str, y: str) -> None:
    p = layer.block("tile_param")
    repeats = [1] * len(node.bottom_shapes[0])
    repeats[p.axis % len(repeats)] = p.tiles
    b.add("Tile", [x, b.constant(f"{node.name}/repeats", repeats)], [y], node.name)


def _pad(b: _Builder, node, layer, x: str, y: str) -> None:
    """Pad with the sizes before every axis then after, the mode and the constant."""
    p = layer.block("pad_param")
    widths = layer.widths(node.bottom_shapes[0])
    inputs = [x, b.constant(f"{node.name}/pads", [before for before, _ in widths] + [after for _, after in widths])]
    if p.mode == "CONSTANT":
        inputs.append(b.constant(f"{node.name}/value", numpy.float32(p.value)))
    b.add("Pad", inputs, [y], node.name, mode=p.mode.lower())


def _resize(b: _Builder, node, layer, x: str, y: str) -> None:
    """Resize by the layer's scales where it has them (its positions depend on them), else to its sizes."""
    p = layer.block("resize_param")
    (height, width), _ = layer.geometry(node.bottom_shapes[0])
    scale = list(p.scale) * 2 if len(p.scale) == 1 else list(p.scale)
    if scale:
        inputs = [x, "", b.constant(f"{node.name}/scales", numpy.array([1.0, 1.0, *scale], dtype=numpy.float32))]
    else:
        inputs = [x, "", "", b.constant(f"{node.name}/sizes", [*node.bottom_shapes[0][:2], height, width])]
    b.add("Resize", inputs, [y], node.name, mode=p.mode.lower(), coordinate_transformation_mode=p.coordinates.lower(),
          nearest_mode=p.nearest.lower())


def _rows(b: _Builder, name: str, indices: str) -> str:
    """Row indices stored as floats (netspec checks they are whole numbers in range) cast to int64."""
    return b.intermediate("Cast", [indices], name, to=b.onnx.TensorProto.INT64)


def _embed(b: _Builder, node, layer, x: str, y: str) -> None:
    """Gather of the weight's rows, plus the bias."""
    bias = layer.params.bias_term
    rows = b.temporary(node.name) if bias else y
    b.add("Gather", [b.constant(f"{node.name}/weight", _param(layer, 0)), _rows(b, node.name, x)], [rows],
          node.name, axis=0)
    if bias:
        b.add("Add", [rows, b.constant(f"{node.name}/bias", _param(layer, 1))], [y], node.name)


def _batch_reindex(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    b.add("Gather", [inputs[0], _rows(b, node.name, inputs[1])], [y], node.name, axis=0)


def _parameter(b: _Builder, node, layer, inputs: list[str], y: str) -> None:
    """The learned blob: an Identity of an initializer holding it."""
    b.add("Identity", [b.constant(f"{node.name}/value", _param(layer, 0))], [y], node.name)


def _argmax(b: _Builder, node, layer, x: str, y: str) -> None:
    """TopK (largest first) over the searched axis reversed, its indices mapped back, so that equal values come the
    larger index first as in netspec and Caffe (TopK itself puts the lower first); the indices cast to floats.
    Along ``axis``: the indices, or the values with ``out_max_val``.  Without: over each instance flattened, shaped
    (N, 1, k), or (N, 2, k) with the values after the indices (then axes of 1, as the top's shape says)."""
    p = layer.block("argmax_param")
    along = p.axis is not None
    shape = node.bottom_shapes[0]
    axis = p.axis % len(shape) if along else 1
    size = shape[axis] if along else math.prod(shape[1:])
    values = y if along and p.out_max_val else b.temporary(node.name)
    searched = x if along else b.intermediate("Flatten", [x], node.name, axis=1)
    reversed_ = b.intermediate("Slice", [searched, *(b.constant(f"{node.name}/{part}", [value]) for part, value in (
        ("starts", -1), ("ends", -2 ** 63), ("axes", axis), ("steps", -1)))], node.name)
    from_end = b.temporary(node.name)
    b.add("TopK", [reversed_, b.constant(f"{node.name}/k", [p.top_k])], [values, from_end], node.name, axis=axis)
    indices = b.intermediate("Sub", [b.constant(f"{node.name}/last", size - 1), from_end], node.name)
    if along and p.out_max_val:
        return
    if along:
        b.add("Cast", [indices], [y], node.name, to=b.onnx.TensorProto.FLOAT)
        return
    found = b.intermediate("Cast", [indices], node.name, to=b.onnx.TensorProto.FLOAT)
    _reshape(b, node, layer, b.intermediate("Concat", [found, values], node.name, axis=1) if p.out_max_val
             else found, y)


def _slice(b: _Builder, node, layer, x: str, ys: list[str]) -> None:
    """Split with the pieces' sizes (an input from opset 13)."""
    axis, spans = layer.pieces(node.bottom_shapes[0])
    sizes = b.constant(f"{node.name}/split", [stop - start for start, stop in spans])
    b.add("Split", [x, sizes], ys, node.name, axis=axis)


# layer type -> export(builder, node, layer, x, y): x the bottom's tensor, y the top's
ONE_INPUT = {"Convolution": _convolution("Conv"), "Deconvolution": _convolution("ConvTranspose"), "Crop": _crop,
             "InnerProduct": _inner_product, "Pooling": _pooling, "SPP": _spp,
             "BatchNorm": _batch_norm, "LRN": _lrn, "ReLU": _relu, "Softmax": _softmax, "LogSoftmax": _softmax,
             "Sigmoid": _simple("Sigmoid"), "TanH": _simple("Tanh"), "AbsVal": _simple("Abs"),
             "Dropout": _simple("Identity"), "Flatten": _reshape, "Reshape": _reshape, "ReLU6": _relu6,
             "HardSigmoid": _simple("HardSigmoid", "hard_sigmoid_param", "alpha", "beta"),
             "HardSwish": _simple("HardSwish"), "Swish": _swish, "LayerNorm": _layer_norm, "GELU": _gelu,
             "Permute": _permute, "Reduction": _reduction, "ELU": _simple("Elu", "elu_param", "alpha"),
             "PReLU": _prelu, "BNLL": _simple("Softplus"), "Exp": _exp, "Log": _log, "Power": _power, "Clip": _clip,
             "Threshold": _threshold, "MVN": _mvn, "ArgMax": _argmax, "Tile": _tile, "Embed": _embed,
             "Pad": _pad, "Resize": _resize}
# export(builder, node, layer, [every bottom's tensor], y)
MANY_INPUTS = {"Eltwise": _eltwise, "Concat": _concat, "MatMul": _matmul, "MultiHeadAttention": _attention,
               "Scale": _scale, "Bias": _bias, "BatchReindex": _batch_reindex, "Parameter": _parameter}
# export(builder, node, layer, x, [every top's tensor])
MANY_TOPS = {"Slice": _slice}
SKIPPED = {"Silence"}
# layer type -> why it is not exported, though ONNX has an operator of its name
REFUSED = {kind: f"its cont input can reset the state at any step, which ONNX's {kind} cannot express"
           for kind in ("RNN", "LSTM")}


def export_onnx(net, out: str, opset: int = DEFAULT_OPSET) -> None:
    """Write ``net`` (with its weights loaded) as an ONNX model to ``out``, atomically; an inference net's
    convolutions with the BatchNorm and Scale they absorbed folded in."""
    onnx = _onnx()
    folded = folded_into_convolutions(net)
    b = _Builder(onnx, net, opset, folded)
    inputs = []
    for node in net.nodes:
        if node.layer.type in REFUSED:
            raise ExportError(f"layer '{node.name}' ({node.layer.type}): {REFUSED[node.layer.type]}")
    unsupported = [f"'{node.name}' ({node.layer.type})" for node in net.nodes
                   if node.layer.type not in {**ONE_INPUT, **MANY_INPUTS, **MANY_TOPS}
                   and node.layer.type not in SKIPPED | {"Input", "Split"}]
    for kind, least in (("HardSwish", 14), ("LayerNorm", 17)):
        if opset < least and any(node.layer.type == kind for node in net.nodes):
            raise ExportError(f"{kind} needs ONNX opset {least} or later: pass --opset {least} (or more)")
    if unsupported:
        raise ExportError(f"no ONNX equivalent for layer(s) {', '.join(unsupported)}; export the deploy net "
                          "(Input layers, no losses or data layers)")
    for index, (node, layer) in enumerate(zip(net.nodes, net.layers)):
        kind = node.layer.type
        if index in folded:
            continue
        if kind == "Input":
            for name, shape in zip(node.tops, node.top_shapes):
                inputs.append(b.helper.make_tensor_value_info(b.graph_input(name), onnx.TensorProto.FLOAT,
                                                              list(shape)))
            continue
        sources = [b.current[name] for name in node.bottoms]
        if kind == "Split":
            for name in node.tops:
                b.current[name] = sources[0]
                b.seen[name] += 1
            continue
        if kind in SKIPPED:
            continue
        if kind in MANY_TOPS:
            MANY_TOPS[kind](b, node, layer, sources[0], [b.tensor_for_top(name) for name in node.tops])
            continue
        target = b.tensor_for_top(node.tops[0])
        if kind in MANY_INPUTS:
            MANY_INPUTS[kind](b, node, layer, sources, target)
        else:
            ONE_INPUT[kind](b, node, layer, sources[0], target)
    outputs = [b.helper.make_tensor_value_info(b.current[name], onnx.TensorProto.FLOAT,
                                               list(net.blobs[name].shape)) for name in net.outputs]
    graph = b.helper.make_graph(b.nodes, net.name or "netspec", inputs, outputs, b.initializers)
    model = b.helper.make_model(graph, opset_imports=[b.helper.make_opsetid("", opset)],
                                producer_name="netspec", ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    with atomic_path(out) as temporary:
        onnx.save(model, temporary)
