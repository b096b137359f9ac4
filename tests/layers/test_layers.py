"""Every layer: forward against a naive reference, float64 gradient check, in-place, accumulation, reshape."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import yaml
from devices import DEVICES
from test_attention import ref_attention

from netspec.engine.backend import Backend, DeviceGenerator
from netspec.engine.net import load_net
from netspec.engine.registry import layer_types
from netspec.errors import ConfigError
from netspec.layers import convolution
from netspec.testing import (
    check_accumulation,
    check_float32,
    check_forward,
    check_inplace,
    check_reshape,
    gradient_check,
    one_layer_net,
    run_forward,
)

RNG = np.random.default_rng(0)


def rand(*shape, low=-1.0, high=1.0):
    """Random float64 values, spread so that ties and kinks are unlikely."""
    return RNG.uniform(low, high, shape)


def labels(*shape, classes):
    """Integer class labels stored as floats, as Caffe stores them."""
    return RNG.integers(0, classes, shape).astype(np.float64)


# ----------------------------------------------------------------------------- naive references

def ref_conv(bottoms, params, p):
    x = bottoms[0]
    w = params[0]
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    sh = p.get("stride_h", p.get("stride", 1))
    sw = p.get("stride_w", p.get("stride", 1))
    ph = p.get("pad_h", p.get("pad", 0))
    pw = p.get("pad_w", p.get("pad", 0))
    d = p.get("dilation", 1)
    g = p.get("group", 1)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - (d * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (d * (kw - 1) + 1)) // sw + 1
    o = w.shape[0]
    out = np.zeros((n, o, oh, ow))
    cg, og = c // g, o // g
    for b in range(n):
        for oc in range(o):
            group = oc // og
            for y in range(oh):
                for xx in range(ow):
                    acc = 0.0
                    for ic in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                acc += w[oc, ic, i, j] * xp[b, group * cg + ic, y * sh + i * d, xx * sw + j * d]
                    out[b, oc, y, xx] = acc + (params[1][oc] if len(params) > 1 else 0)
    return [out]


def ref_pool(bottoms, params, p):
    x = bottoms[0]
    n, c, h, w = x.shape
    if p.get("global_pooling"):
        k, s, pad = (h, w), (1, 1), (0, 0)
    else:
        k = (p["kernel_h"], p["kernel_w"]) if "kernel_h" in p else (p["kernel_size"],) * 2
        s = (p["stride_h"], p["stride_w"]) if "stride_h" in p else (p.get("stride", 1),) * 2
        pad = (p["pad_h"], p["pad_w"]) if "pad_h" in p else (p.get("pad", 0),) * 2
    rounding = math.floor if p.get("round_mode") == "FLOOR" else math.ceil
    out_size = []
    for size, kk, ss, pp in zip((h, w), k, s, pad):
        o = rounding((size + 2 * pp - kk) / ss) + 1
        if any(pad) and (o - 1) * ss >= size + pp:  # Caffe's PoolingLayer::Reshape: both axes once either is padded
            o -= 1
        out_size.append(o)
    out = np.zeros((n, c, *out_size))
    for b in range(n):
        for ch in range(c):
            for oy in range(out_size[0]):
                for ox in range(out_size[1]):
                    hs, ws = oy * s[0] - pad[0], ox * s[1] - pad[1]
                    he, we = min(hs + k[0], h + pad[0]), min(ws + k[1], w + pad[1])
                    size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    if not p.get("count_include_pad", True):  # (ONNX's default: the input positions alone)
                        size = (he - hs) * (we - ws)
                    patch = x[b, ch, hs:he, ws:we]
                    out[b, ch, oy, ox] = patch.max() if p.get("pool", "MAX") == "MAX" else patch.sum() / size
    return [out]


def ref_ip(bottoms, params, p):
    axis = p.get("axis", 1)
    x = bottoms[0]
    m = math.prod(x.shape[:axis])
    w = params[0].T if p.get("transpose") else params[0]
    y = x.reshape(m, -1) @ w.T + (params[1] if len(params) > 1 else 0)
    return [y.reshape(*x.shape[:axis], -1)]


def ref_lrn(bottoms, params, p):
    x = bottoms[0]
    n = p.get("local_size", 5)
    alpha, beta, k = p.get("alpha", 1.0), p.get("beta", 0.75), p.get("k", 1.0)
    half = (n - 1) // 2
    out = np.zeros_like(x)
    _, c, h, w = x.shape
    for ch in range(c):
        for y in range(h):
            for xx in range(w):
                if p.get("norm_region") == "WITHIN_CHANNEL":
                    patch = x[:, ch, max(0, y - half):y + half + 1, max(0, xx - half):xx + half + 1]
                    scale = 1 + alpha / n ** 2 * (patch ** 2).sum(axis=(1, 2))
                else:
                    patch = x[:, max(0, ch - half):ch + half + 1, y, xx]
                    scale = k + alpha / n * (patch ** 2).sum(axis=1)
                out[:, ch, y, xx] = x[:, ch, y, xx] * scale ** -beta
    return [out]


def ref_bn(bottoms, params, p):
    x = bottoms[0]
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return [(x - mean) / np.sqrt(var + p.get("eps", 1e-5))]


def channel_shape(x, values):
    return values.reshape((1, -1) + (1,) * (x.ndim - 2))


def ref_scale(bottoms, params, p):
    x = bottoms[0]
    scale = bottoms[1] if len(bottoms) > 1 else params[0]
    bias = params[-1] if p.get("bias_term") else 0
    out = x * channel_shape(x, scale)
    return [out + (channel_shape(x, bias) if p.get("bias_term") else 0)]


def ref_mvn(bottoms, params, p):
    x = bottoms[0].reshape(*bottoms[0].shape, *[1] * (4 - bottoms[0].ndim))  # (Caffe's top: N, C, H, W)
    axes = (1, 2, 3) if p.get("across_channels") else (2, 3)
    centred = x - x.mean(axis=axes, keepdims=True)
    if p.get("normalize_variance", True) is False:
        return [centred]
    return [centred / (centred.std(axis=axes, keepdims=True) + p.get("eps", 1e-9))]


def ref_softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_softmax_loss(bottoms, params, p, normalization="VALID", ignore=None, smoothing=0.0):
    x, y = bottoms
    prob = ref_softmax(x)
    classes = x.shape[1]
    prob = np.moveaxis(prob, 1, -1).reshape(-1, classes)
    lab = y.reshape(-1).astype(int)
    valid = lab != ignore if ignore is not None else np.ones_like(lab, bool)
    target = (1 - smoothing) * np.eye(classes)[lab] + smoothing / classes
    loss = -sum((target[i] * np.log(prob[i])).sum() for i in range(len(lab)) if valid[i])
    norm = {"VALID": valid.sum() if ignore is not None else len(lab), "FULL": len(lab), "BATCH_SIZE": x.shape[0],
            "NONE": 1}[normalization]
    return [np.array(loss / norm)]


def ref_sigmoid_ce(bottoms, params, p):
    x, t = bottoms
    s = 1 / (1 + np.exp(-x))
    return [np.array(-(t * np.log(s) + (1 - t) * np.log(1 - s)).sum() / x.shape[0])]


def ref_hinge(bottoms, params, p):
    x, y = bottoms
    n = x.shape[0]
    x = x.reshape(n, -1)
    d = -np.ones_like(x)
    d[np.arange(n), y.astype(int)] = 1
    margins = np.maximum(0, 1 - d * x)
    return [np.array((margins ** (2 if p.get("norm") == "L2" else 1)).sum() / n)]


def ref_accuracy(bottoms, params, p):
    x, y = bottoms
    k = p.get("top_k", 1)
    ignore = p.get("ignore_label")
    correct = total = 0
    per_class_hits = np.zeros(x.shape[1])
    per_class_count = np.zeros(x.shape[1])
    for i in range(x.shape[0]):
        label = int(y[i])
        if label == ignore:
            continue
        total += 1
        per_class_count[label] += 1
        better = -1  # Caffe's AccuracyLayer loop: the true class counts itself, ties count against
        for c in range(x.shape[1]):
            if better >= k:
                break
            better += x[i, c] >= x[i, label]
        if better < k:
            correct += 1
            per_class_hits[label] += 1
    per_class = np.where(per_class_count > 0, per_class_hits / np.maximum(per_class_count, 1), 0)
    return [np.array(correct / total), per_class]


def ref_argmax(bottoms, params, p):
    """Caffe's ArgMaxLayer without axis: (value, index) pairs sorted by std::greater (equal values: the larger index
    first); the top (N, 1 or 2, top_k) and axes of 1 up to the bottom's count."""
    x = bottoms[0].reshape(bottoms[0].shape[0], -1)
    k = p.get("top_k", 1)
    index = np.array([sorted(range(x.shape[1]), key=lambda j, row=row: (row[j], j), reverse=True)[:k] for row in x])
    out = index[:, None, :].astype(float)
    if p.get("out_max_val"):
        out = np.stack([index, np.take_along_axis(x, index, 1)], axis=1)
    return [out.reshape(*out.shape, *[1] * (bottoms[0].ndim - 3))]


def ref_reduction(bottoms, params, p):
    x = bottoms[0]
    axis = p.get("axis", 0)
    flat = x.reshape(*x.shape[:axis], -1)
    op = p.get("operation", "SUM")
    value = {"SUM": flat.sum(-1), "ASUM": np.abs(flat).sum(-1), "SUMSQ": (flat ** 2).sum(-1),
             "MEAN": flat.mean(-1)}[op]
    return [p.get("coeff", 1.0) * value]


def ref_eltwise(bottoms, params, p):
    op = p.get("operation", "SUM")
    if op == "SUM":
        coeff = p.get("coeff", [1.0] * len(bottoms))
        return [sum(c * b for c, b in zip(coeff, bottoms))]
    if op == "PROD":
        return [np.prod(bottoms, axis=0)]
    return [np.max(bottoms, axis=0)]


def ew(fn):
    return lambda bottoms, params, p: [fn(bottoms[0], params, p)]


def ref_contrastive(bottoms, params, p):
    a, b, y = bottoms
    n = a.shape[0]
    margin = p.get("margin", 1.0)
    loss = 0.0
    for i in range(n):
        d2 = ((a[i] - b[i]) ** 2).sum()
        if int(y.reshape(-1)[i]):
            loss += d2
        elif p.get("legacy_version"):
            loss += max(margin - d2, 0)
        else:
            loss += max(margin - math.sqrt(d2), 0) ** 2
    return [np.array(loss / (2 * n))]


def ref_infogain(bottoms, params, p, h=None, normalization="VALID", ignore=None):
    x, y = bottoms[:2]
    classes = x.shape[1]
    h = (bottoms[2] if h is None else h).reshape(classes, classes)
    prob = np.moveaxis(ref_softmax(x), 1, -1).reshape(-1, classes)
    lab = y.reshape(-1).astype(int)
    loss, count = 0.0, 0
    for i, label in enumerate(lab):
        if label == ignore:
            continue
        loss -= sum(h[label, k] * np.log(max(prob[i, k], 1e-20)) for k in range(classes))
        count += 1
    norm = {"VALID": count, "FULL": len(lab), "BATCH_SIZE": x.shape[0], "NONE": 1}[normalization]
    return [np.array(loss / max(norm, 1))]


def ref_multinomial_logistic(bottoms, params, p):
    prob, y = bottoms
    n = prob.shape[0]
    rows = prob.reshape(n, -1)
    return [np.array(-sum(np.log(max(rows[i, int(y.reshape(-1)[i])], 1e-20)) for i in range(n)) / n)]


INFOGAIN_H = np.array([[1.0, 0.2, 0.0], [0.5, 2.0, 0.1], [0.0, 0.3, 1.5]])  # not symmetric: rows are true labels


def saved_npy(name, array):
    """``array`` saved as a .npy file (InfogainLoss reads H from one) in a folder removed when the tests end."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="netspec-test-layers-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, name)
    np.save(path, array)
    return path


# ----------------------------------------------------------------------------- cases


def ref_embed(bottoms, params, p):
    x = bottoms[0]
    out = np.zeros(x.shape + (params[0].shape[1],))
    for position in np.ndindex(x.shape):
        out[position] = params[0][int(x[position])] + (params[1] if len(params) > 1 else 0)
    return [out]


def ref_batch_reindex(bottoms, params, p):
    x, index = bottoms
    return [np.stack([x[int(i)] for i in index])]


RNN_CONT = np.array([[0, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1]], float)  # a reset mid-sequence in each


def ref_rnn(bottoms, params, p):
    """Caffe's RNN one step and one sequence at a time: h_t = tanh(W_hh cont_t h_{t-1} + W_xh x_t + b_h),
    o_t = tanh(W_ho h_t + b_o)."""
    x, cont = bottoms[0], bottoms[1]
    static = len(bottoms) > 2 + (1 if p["recurrent_param"].get("expose_hidden") else 0)
    w_xh, b_h = params[0], params[1]
    w_static = params[2] if static else None
    w_hh, w_ho, b_o = params[-3:]
    steps, n = cont.shape
    size = b_h.shape[0]
    out = np.zeros((steps, n, size))
    finals = np.zeros((1, n, size))
    for b in range(n):
        h = bottoms[-1][0, b] if p["recurrent_param"].get("expose_hidden") else np.zeros(size)
        for t in range(steps):
            a = w_hh @ (cont[t, b] * h) + w_xh @ x[t, b].reshape(-1) + b_h
            if static:
                a = a + w_static @ bottoms[2][b].reshape(-1)
            h = np.tanh(a)
            out[t, b] = np.tanh(w_ho @ h + b_o)
        finals[0, b] = h
    return [out, finals] if p["recurrent_param"].get("expose_hidden") else [out]


def ref_lstm(bottoms, params, p):
    """Caffe's LSTM one step and one sequence at a time, gates i, f, o, g stacked in that order."""
    x, cont = bottoms[0], bottoms[1]
    expose = p["recurrent_param"].get("expose_hidden")
    static = len(bottoms) > 2 + (2 if expose else 0)
    w_xc, b_c = params[0], params[1]
    w_static = params[2] if static else None
    w_hc = params[-1]
    steps, n = cont.shape
    size = b_c.shape[0] // 4
    out = np.zeros((steps, n, size))
    final_h, final_c = np.zeros((1, n, size)), np.zeros((1, n, size))
    for b in range(n):
        h = bottoms[-2][0, b] if expose else np.zeros(size)
        c = bottoms[-1][0, b] if expose else np.zeros(size)
        for t in range(steps):
            a = w_hc @ (cont[t, b] * h) + w_xc @ x[t, b].reshape(-1) + b_c
            if static:
                a = a + w_static @ bottoms[2][b].reshape(-1)
            i, f, o = (1 / (1 + np.exp(-a[k * size:(k + 1) * size])) for k in range(3))
            g = np.tanh(a[3 * size:])
            c = cont[t, b] * f * c + i * g
            h = o * np.tanh(c)
            out[t, b] = h
        final_h[0, b], final_c[0, b] = h, c
    return [out, final_h, final_c] if expose else [out]


@dataclass
class Case:
    """One configuration of one layer type."""

    id: str
    type: str
    bottoms: list
    reference: object = None
    block: dict = field(default_factory=dict)
    tops: int = 1
    phase: str = "TRAIN"
    inplace: bool = False
    grad: bool = True

    @property
    def shapes(self):
        return [b.shape for b in self.bottoms]

    def params_for(self, block_name):
        return self.block.get(block_name, {})


def conv(id, x, **p):
    return Case(id, "Convolution", [x], lambda b, w, q: ref_conv(b, w, p), {"convolution_param": p})


def pool(id, x, **p):
    return Case(id, "Pooling", [x], lambda b, w, q: ref_pool(b, w, p), {"pooling_param": p})


def ref_deconv(bottoms, params, p):
    """Each input value spreads its kernel, times the value, over the output (then the padding is cut off)."""
    x, w = bottoms[0], params[0]
    n, c, h, wd = x.shape
    k, s, pad, g = p["kernel_size"], p.get("stride", 1), p.get("pad", 0), p.get("group", 1)
    o = p["num_output"]
    full = np.zeros((n, o, s * (h - 1) + k, s * (wd - 1) + k))
    for b in range(n):
        for ci in range(c):
            group = ci // (c // g)
            for i in range(h):
                for j in range(wd):
                    for oc in range(o // g):
                        full[b, group * (o // g) + oc, s * i:s * i + k, s * j:s * j + k] += x[b, ci, i, j] * w[ci, oc]
    out = full[:, :, pad:full.shape[2] - pad, pad:full.shape[3] - pad]
    return [out + params[1].reshape(1, -1, 1, 1) if len(params) > 1 else out]


def ref_im2col(bottoms, k, s, pad):
    x = np.pad(bottoms[0], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.zeros((n, c * k * k, oh, ow))
    for ci in range(c):
        for i in range(k):
            for j in range(k):
                out[:, (ci * k + i) * k + j] = x[:, ci, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s]
    return [out]


def ref_spp(bottoms, levels, pool):
    """Each level pooled with Caffe's SPP window (square maps), flattened, joined."""
    x = bottoms[0]
    parts = []
    for level in range(levels):
        bins = 2 ** level
        k = math.ceil(x.shape[2] / bins)
        pooled = ref_pool([x], [], {"pool": pool, "kernel_size": k, "stride": k, "pad": (k * bins - x.shape[2] + 1) // 2})
        parts.append(pooled[0].reshape(x.shape[0], -1))
    if levels == 1:  # (Caffe's one pooling writes the top, unflattened)
        return [parts[0].reshape(*x.shape[:2], 1, 1)]
    return [np.concatenate(parts, axis=1)]


def ref_layer_norm(bottoms, params, axis, eps=1e-5):
    x = bottoms[0]
    axes = tuple(range(axis % x.ndim, x.ndim))
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return [y * params[0] + params[1] if params else y]


def deconv(id, x, **p):
    return Case(id, "Deconvolution", [x], lambda b, w, q: ref_deconv(b, w, p), {"convolution_param": p})


def ref_pad(bottoms, params, p):
    """numpy.pad of the axes from ``axis`` on (ONNX's modes are numpy's)."""
    x = bottoms[0]
    axis = p.get("axis", 2) % x.ndim
    count = x.ndim - axis
    sizes = {key: (p.get(key, [0]) * count if len(p.get(key, [0])) == 1 else p[key]) for key in ("before", "after")}
    widths = [(0, 0)] * axis + list(zip(sizes["before"], sizes["after"]))
    mode = p.get("mode", "CONSTANT").lower()
    extra = {"constant_values": p.get("value", 0.0)} if mode == "constant" else {}
    return [np.pad(x, widths, mode=mode, **extra)]


def pad(id, x, **p):
    return Case(id, "Pad", [x], lambda b, w, q: ref_pad(b, w, p), {"pad_param": p})


def ref_resize(bottoms, params, p):
    """Each output at its place in the input (ONNX's coordinate transformations), rounded or bilinear, naively."""
    x = bottoms[0]
    n, c, h, w = x.shape
    scale = p.get("scale", [])
    scale = scale * 2 if len(scale) == 1 else scale
    out = (p["height"], p["width"]) if "height" in p else tuple(int(math.floor(s * f)) for s, f in zip((h, w), scale))
    scale = scale or [o / s for o, s in zip(out, (h, w))]
    coordinates = p.get("coordinates", "HALF_PIXEL")

    def place(o, size, count, factor):
        if coordinates == "ALIGN_CORNERS":
            return o * (size - 1) / (count - 1) if count > 1 else 0.0
        if coordinates == "ASYMMETRIC":
            return o / factor
        return 0.0 if coordinates == "PYTORCH_HALF_PIXEL" and count == 1 else (o + 0.5) / factor - 0.5

    def taps(position, size):
        if p.get("mode", "NEAREST") == "NEAREST":
            rounded = {"ROUND_PREFER_FLOOR": math.ceil(position - 0.5), "ROUND_PREFER_CEIL": math.floor(position + 0.5),
                       "FLOOR": math.floor(position), "CEIL": math.ceil(position)}[p.get("nearest", "ROUND_PREFER_FLOOR")]
            return [(min(max(rounded, 0), size - 1), 1.0)]
        low = math.floor(position)
        return [(min(max(low, 0), size - 1), 1 - (position - low)), (min(max(low + 1, 0), size - 1), position - low)]

    y = np.zeros((n, c, *out))
    for oy in range(out[0]):
        for ox in range(out[1]):
            for iy, wy in taps(place(oy, h, out[0], scale[0]), h):
                for ix, wx in taps(place(ox, w, out[1], scale[1]), w):
                    y[:, :, oy, ox] += wy * wx * x[:, :, iy, ix]
    return [y]


def resize(id, x, **p):
    return Case(id, "Resize", [x], lambda b, w, q: ref_resize(b, w, p), {"resize_param": p})


def ref_crop(bottoms, params, p):
    x, reference = bottoms
    offsets = p.get("offset", [0])
    offsets = offsets * (x.ndim - p.get("axis", 2)) if len(offsets) == 1 else offsets
    index = [slice(None)] * p.get("axis", 2) + [slice(o, o + size) for o, size in
                                                  zip(offsets, reference.shape[p.get("axis", 2):])]
    return [x[tuple(index)]]


def ref_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def ref_adaptive_pool(bottoms, params, p):
    """PyTorch's adaptive pooling: output (i, j) pools rows floor(i*H/H') to ceil((i+1)*H/H'), likewise columns."""
    x = bottoms[0]
    out = p.get("output_size", [p.get("output_h"), p.get("output_w")])
    oh, ow = out * 2 if len(out) == 1 else out
    h, w = x.shape[2:]
    y = np.zeros((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * h // oh:math.ceil((i + 1) * h / oh), j * w // ow:math.ceil((j + 1) * w / ow)]
            y[:, :, i, j] = patch.max(axis=(2, 3)) if p["pool"] == "MAX" else patch.mean(axis=(2, 3))
    return [y]


def adaptive(id, x, **p):
    return Case(id, "Pooling", [x], lambda b, w, q: ref_adaptive_pool(b, w, p), {"pooling_param": p})


CASES = [
    conv("conv_basic", rand(2, 3, 5, 5), num_output=4, kernel_size=3, pad=1),
    conv("conv_stride_rect", rand(2, 2, 7, 6), num_output=3, kernel_h=3, kernel_w=2, stride_h=2, stride_w=1,
         pad_h=1, pad_w=0),
    conv("conv_group_dilation", rand(1, 4, 7, 7), num_output=4, kernel_size=3, group=2, dilation=2, pad=1),
    conv("conv_pointwise_nobias", rand(2, 3, 4, 4), num_output=5, kernel_size=1, bias_term=False),
    deconv("deconv_stride_pad", rand(2, 3, 3, 4), num_output=2, kernel_size=4, stride=2, pad=1),
    deconv("deconv_group_nobias", rand(1, 4, 3, 3), num_output=6, kernel_size=3, group=2, bias_term=False),
    deconv("deconv_stride_over_kernel", rand(2, 2, 2, 3), num_output=3, kernel_size=2, stride=3),
    Case("crop_spatial", "Crop", [rand(2, 3, 6, 7), rand(2, 3, 4, 3)],
         lambda b, w, q: ref_crop(b, w, {"offset": [1, 2]}), {"crop_param": {"offset": [1, 2]}}),
    pad("pad_constant_asymmetric", rand(2, 3, 4, 5), before=[0, 1], after=[1, 2], value=0.5),
    pad("pad_reflect", rand(2, 2, 4, 5), before=[2, 1], after=[3, 4], mode="REFLECT"),
    pad("pad_edge_one_size", rand(1, 3, 3, 2), before=[2], after=[1], mode="EDGE"),
    pad("pad_reflect_axis1", rand(2, 4, 3), axis=1, before=[1, 0], after=[2, 2], mode="REFLECT"),
    resize("resize_nearest_2x", rand(2, 2, 3, 4), scale=[2]),
    resize("resize_nearest_ties", rand(1, 2, 3, 3), scale=[2], coordinates="ASYMMETRIC"),  # (positions o / 2)
    resize("resize_nearest_floor_asymmetric", rand(1, 2, 4, 5), height=7, width=3, coordinates="ASYMMETRIC",
           nearest="FLOOR"),
    resize("resize_nearest_ceil_down", rand(1, 1, 6, 6), scale=[0.5, 0.75], nearest="ROUND_PREFER_CEIL"),
    resize("resize_linear_half_pixel", rand(2, 2, 3, 4), scale=[2, 1.5], mode="LINEAR"),
    resize("resize_linear_align_corners", rand(1, 2, 4, 3), height=7, width=5, mode="LINEAR",
           coordinates="ALIGN_CORNERS"),
    resize("resize_linear_pytorch_to_one", rand(1, 2, 4, 5), height=1, width=3, mode="LINEAR",
           coordinates="PYTORCH_HALF_PIXEL"),
    Case("crop_axis1_one_offset", "Crop", [rand(2, 5, 6, 6), rand(2, 3, 4, 4)],
         lambda b, w, q: ref_crop(b, w, {"axis": 1, "offset": [1]}), {"crop_param": {"axis": 1, "offset": 1}}),
    pool("pool_max_ceil", rand(2, 2, 7, 7), pool="MAX", kernel_size=3, stride=2),
    pool("pool_max_pad", rand(1, 2, 6, 6), pool="MAX", kernel_size=3, stride=2, pad=1),
    pool("pool_ave_pad", rand(2, 2, 6, 5), pool="AVE", kernel_size=3, stride=2, pad=1),
    pool("pool_ave_ceil", rand(1, 2, 8, 8), pool="AVE", kernel_size=3, stride=2),
    pool("pool_ave_pad_without_padding", rand(2, 2, 6, 5), pool="AVE", kernel_size=3, stride=2, pad=1,
         count_include_pad=False),
    pool("pool_ave_floor_without_padding", rand(1, 2, 7, 7), pool="AVE", kernel_size=3, stride=2, pad=1,
         round_mode="FLOOR", count_include_pad=False),
    pool("pool_global", rand(2, 3, 4, 5), pool="AVE", global_pooling=True),
    pool("pool_floor", rand(1, 1, 7, 7), pool="MAX", kernel_size=2, stride=2, round_mode="FLOOR"),
    *[pool(f"pool_{kind.lower()}_one_axis_padded", rand(1, 2, 6, 5), pool=kind, kernel_h=2, kernel_w=1, stride_h=2,
           stride_w=3, pad_h=1, pad_w=0) for kind in ("MAX", "AVE")],  # (Caffe drops the width's third window)
    Case("ip", "InnerProduct", [rand(3, 2, 2, 2)], ref_ip, {"inner_product_param": {"num_output": 4}}),
    Case("ip_transpose_axis2", "InnerProduct", [rand(2, 3, 4)],
         lambda b, w, p: ref_ip(b, w, {"axis": 2, "transpose": True}),
         {"inner_product_param": {"num_output": 3, "axis": 2, "transpose": True}}),
    Case("relu", "ReLU", [rand(2, 3, 4)], ew(lambda x, w, p: np.maximum(x, 0)), inplace=True),
    Case("matmul_batched", "MatMul", [rand(2, 3, 4), rand(2, 4, 5)], lambda b, w, p: [b[0] @ b[1]]),
    Case("matmul_transpose_b", "MatMul", [rand(2, 2, 3, 4), rand(2, 2, 5, 4)],
         lambda b, w, p: [b[0] @ b[1].swapaxes(-1, -2)], {"mat_mul_param": {"transpose_b": True}}),
    Case("matmul_transpose_a", "MatMul", [rand(4, 3), rand(4, 2)], lambda b, w, p: [b[0].T @ b[1]],
         {"mat_mul_param": {"transpose_a": True}}),
    Case("layer_norm_last_axis", "LayerNorm", [rand(2, 5, 6)], lambda b, w, p: ref_layer_norm(b, w, -1)),
    Case("layer_norm_from_axis1", "LayerNorm", [rand(3, 2, 4)], lambda b, w, p: ref_layer_norm(b, w, 1, eps=1e-3),
         {"layer_norm_param": {"axis": 1, "eps": 1e-3}}),
    Case("layer_norm_plain", "LayerNorm", [rand(4, 7)], lambda b, w, p: ref_layer_norm(b, w, -1),
         {"layer_norm_param": {"elementwise_affine": False}}),
    Case("spp_max", "SPP", [rand(2, 3, 7, 7)], lambda b, w, p: ref_spp(b, 3, "MAX"),
         {"spp_param": {"pyramid_height": 3}}),
    Case("spp_ave", "SPP", [rand(1, 2, 6, 6)], lambda b, w, p: ref_spp(b, 2, "AVE"),
         {"spp_param": {"pyramid_height": 2, "pool": "AVE"}}),
    Case("spp_one_level", "SPP", [rand(2, 3, 5, 5)], lambda b, w, p: ref_spp(b, 1, "MAX"),
         {"spp_param": {"pyramid_height": 1}}),
    Case("im2col", "Im2col", [rand(2, 3, 5, 4)], lambda b, w, p: ref_im2col(b, 3, 1, 1),
         {"convolution_param": {"kernel_size": 3, "pad": 1}}),
    Case("im2col_stride_wide", "Im2col", [rand(1, 2, 4, 40)], lambda b, w, p: ref_im2col(b, 2, 2, 0),
         {"convolution_param": {"kernel_size": 2, "stride": 2}}),
    Case("tile", "Tile", [rand(2, 3, 2)], lambda b, w, p: [np.tile(b[0], (1, 3, 1))],
         {"tile_param": {"axis": 1, "tiles": 3}}),
    Case("tile_last_axis", "Tile", [rand(2, 3)], lambda b, w, p: [np.tile(b[0], (1, 2))],
         {"tile_param": {"axis": -1, "tiles": 2}}),
    Case("permute_nhwc", "Permute", [rand(2, 3, 4, 5)], lambda b, w, p: [b[0].transpose(0, 2, 3, 1)],
         {"permute_param": {"order": [0, 2, 3, 1]}}),
    Case("permute_partial_order", "Permute", [rand(2, 3, 4)], lambda b, w, p: [b[0].transpose(2, 0, 1)],
         {"permute_param": {"order": [2]}}),
    Case("relu6", "ReLU6", [rand(2, 3, 4, low=-3, high=9)], ew(lambda x, w, p: np.minimum(np.maximum(x, 0), 6)),
         inplace=True),
    Case("hard_sigmoid", "HardSigmoid", [rand(2, 3, 4, low=-5, high=5)],
         ew(lambda x, w, p: np.clip(x / 6 + 0.5, 0, 1)), inplace=True),
    Case("hard_sigmoid_onnx", "HardSigmoid", [rand(3, 4, low=-4, high=4)],
         ew(lambda x, w, p: np.clip(0.2 * x + 0.5, 0, 1)), {"hard_sigmoid_param": {"alpha": 0.2}}),
    Case("hard_swish", "HardSwish", [rand(2, 3, 4, low=-5, high=5)],
         ew(lambda x, w, p: x * np.clip(x + 3, 0, 6) / 6)),
    Case("swish", "Swish", [rand(2, 3, 4, low=-4, high=4)], ew(lambda x, w, p: x / (1 + np.exp(-x)))),
    Case("swish_beta", "Swish", [rand(3, 5, low=-4, high=4)], ew(lambda x, w, p: x / (1 + np.exp(-2.5 * x))),
         {"swish_param": {"beta": 2.5}}),
    Case("relu_leaky", "ReLU", [rand(2, 3, 4)], ew(lambda x, w, p: np.where(x > 0, x, 0.1 * x)),
         {"relu_param": {"negative_slope": 0.1}}, inplace=True),
    Case("relu_negative_slope", "ReLU", [rand(2, 3, 4)], ew(lambda x, w, p: np.where(x > 0, x, -0.5 * x)),
         {"relu_param": {"negative_slope": -0.5}}, inplace=True),
    Case("prelu", "PReLU", [rand(2, 3, 2, 2)], ew(lambda x, w, p: np.where(x > 0, x, x * channel_shape(x, w[0]))),
         inplace=True),
    Case("prelu_shared", "PReLU", [rand(2, 3, 2)], ew(lambda x, w, p: np.where(x > 0, x, x * w[0][0])),
         {"prelu_param": {"channel_shared": True}}),
    Case("elu", "ELU", [rand(2, 3, 4)], ew(lambda x, w, p: np.where(x > 0, x, 0.5 * (np.exp(x) - 1))),
         {"elu_param": {"alpha": 0.5}}, inplace=True),
    Case("elu_negative_alpha", "ELU", [rand(2, 3, 4)], ew(lambda x, w, p: np.where(x > 0, x, -0.5 * (np.exp(x) - 1))),
         {"elu_param": {"alpha": -0.5}}, inplace=True),
    Case("sigmoid", "Sigmoid", [rand(2, 5)], ew(lambda x, w, p: 1 / (1 + np.exp(-x))), inplace=True),
    Case("tanh", "TanH", [rand(2, 5)], ew(lambda x, w, p: np.tanh(x)), inplace=True),
    Case("absval", "AbsVal", [rand(2, 5)], ew(lambda x, w, p: np.abs(x))),
    Case("power", "Power", [rand(2, 5, low=0.5, high=2)], ew(lambda x, w, p: (0.5 + 2 * x) ** 1.5),
         {"power_param": {"power": 1.5, "scale": 2, "shift": 0.5}}),
    Case("power_scale_0", "Power", [np.array([[1.0, -np.inf, np.inf, np.nan, 0.0]])],  # (Caffe reads no input)
         ew(lambda x, w, p: np.full_like(x, 3.0 ** 2)), {"power_param": {"power": 2, "scale": 0, "shift": 3}},
         grad=False),
    Case("power_0", "Power", [np.array([[1.0, -np.inf, np.nan]])], ew(lambda x, w, p: np.ones_like(x)),
         {"power_param": {"power": 0, "scale": 2, "shift": -1}}, grad=False),
    Case("exp", "Exp", [rand(2, 5)], ew(lambda x, w, p: 2.0 ** (1 + 0.5 * x)),
         {"exp_param": {"base": 2, "scale": 0.5, "shift": 1}}, inplace=True),
    Case("log", "Log", [rand(2, 5, low=0.5, high=2)], ew(lambda x, w, p: np.log10(0.1 + 3 * x)),
         {"log_param": {"base": 10, "scale": 3, "shift": 0.1}}),
    Case("bnll", "BNLL", [rand(2, 5, low=-5, high=5)], ew(lambda x, w, p: np.log1p(np.exp(x)))),
    Case("threshold", "Threshold", [rand(2, 5)], ew(lambda x, w, p: (x > 0.2).astype(float)),
         {"threshold_param": {"threshold": 0.2}}, inplace=True),
    Case("clip", "Clip", [rand(2, 5)], ew(lambda x, w, p: np.clip(x, -0.5, 0.4)),
         {"clip_param": {"min": -0.5, "max": 0.4}}),
    Case("dropout_test", "Dropout", [rand(2, 5)], ew(lambda x, w, p: x), phase="TEST", inplace=True),
    Case("dropout_train", "Dropout", [rand(4, 6)], None, {"dropout_param": {"dropout_ratio": 0.3}}, inplace=True),
    Case("lrn_across", "LRN", [rand(2, 6, 3, 3)], lambda b, w, p: ref_lrn(b, w, {"local_size": 3, "alpha": 0.5, "k": 2.0}),
         {"lrn_param": {"local_size": 3, "alpha": 0.5, "k": 2.0}}),
    Case("lrn_window_of_one", "LRN", [rand(2, 3, 3, 3)], lambda b, w, p: ref_lrn(b, w, {"local_size": 1, "alpha": 0.5}),
         {"lrn_param": {"local_size": 1, "alpha": 0.5}}),  # (oneDNN 3.2 crashes on it: NumPy runs it)
    Case("lrn_within", "LRN", [rand(2, 2, 4, 4)],
         lambda b, w, p: ref_lrn(b, w, {"alpha": 0.5, "local_size": 3, "norm_region": "WITHIN_CHANNEL"}),
         {"lrn_param": {"local_size": 3, "alpha": 0.5, "norm_region": "WITHIN_CHANNEL"}}),
    Case("batchnorm_train", "BatchNorm", [rand(4, 3, 2, 2)], ref_bn, inplace=True),
    Case("batchnorm_2d", "BatchNorm", [rand(5, 3)], ref_bn),
    Case("scale", "Scale", [rand(2, 3, 2, 2)], lambda b, w, p: ref_scale(b, w, {"bias_term": True}),
         {"scale_param": {"bias_term": True}}, inplace=True),
    Case("scale_bottom", "Scale", [rand(2, 3, 2), rand(3)], ref_scale, {"scale_param": {"axis": 1}}),
    Case("bias", "Bias", [rand(2, 3, 2)], lambda b, w, p: [b[0] + channel_shape(b[0], w[0])], inplace=True),
    Case("bias_bottom", "Bias", [rand(2, 3, 2), rand(3)], lambda b, w, p: [b[0] + channel_shape(b[0], b[1])]),
    Case("mvn", "MVN", [rand(2, 3, 3, 3)], ref_mvn),
    Case("mvn_3_axes", "MVN", [rand(2, 3, 5)], ref_mvn),
    Case("mvn_across", "MVN", [rand(2, 3, 2, 2)], lambda b, w, p: ref_mvn(b, w, {"across_channels": True}),
         {"mvn_param": {"across_channels": True}}),
    Case("mvn_mean_only", "MVN", [rand(2, 3, 2, 2)], lambda b, w, p: ref_mvn(b, w, {"normalize_variance": False}),
         {"mvn_param": {"normalize_variance": False}}),
    Case("concat", "Concat", [rand(2, 3, 2), rand(2, 1, 2)], lambda b, w, p: [np.concatenate(b, axis=1)]),
    Case("concat_axis0", "Concat", [rand(2, 3), rand(1, 3)], lambda b, w, p: [np.concatenate(b, axis=0)],
         {"concat_param": {"axis": 0}}),
    Case("slice", "Slice", [rand(2, 5, 2)], lambda b, w, p: np.split(b[0], [1, 3], axis=1),
         {"slice_param": {"slice_point": [1, 3]}}, tops=3),
    Case("slice_equal", "Slice", [rand(4, 3)], lambda b, w, p: np.split(b[0], 2, axis=0),
         {"slice_param": {"axis": 0}}, tops=2),
    Case("split", "Split", [rand(2, 3)], lambda b, w, p: [b[0], b[0]], tops=2),
    Case("eltwise_sum", "Eltwise", [rand(2, 3), rand(2, 3), rand(2, 3)],
         lambda b, w, p: ref_eltwise(b, w, {"coeff": [1, -2, 0.5]}),
         {"eltwise_param": {"operation": "SUM", "coeff": [1, -2, 0.5]}}),
    Case("eltwise_prod", "Eltwise", [rand(2, 3), rand(2, 3), rand(2, 3)],
         lambda b, w, p: ref_eltwise(b, w, {"operation": "PROD"}), {"eltwise_param": {"operation": "PROD"}}),
    Case("eltwise_max", "Eltwise", [rand(2, 3), rand(2, 3)], lambda b, w, p: ref_eltwise(b, w, {"operation": "MAX"}),
         {"eltwise_param": {"operation": "MAX"}}),
    Case("eltwise_prod_unstable", "Eltwise", [rand(2, 3, low=0.5, high=2), rand(2, 3, low=0.5, high=2)],
         lambda b, w, p: ref_eltwise(b, w, {"operation": "PROD"}),
         {"eltwise_param": {"operation": "PROD", "stable_prod_grad": False}}),
    Case("flatten", "Flatten", [rand(2, 3, 2, 2)], lambda b, w, p: [b[0].reshape(b[0].shape[0], -1)]),
    Case("flatten_nothing", "Flatten", [rand(3, 2, 2)], lambda b, w, p: [b[0][:, None]],  # (Caffe's: an axis of 1)
         {"flatten_param": {"axis": 1, "end_axis": 0}}),
    Case("reshape", "Reshape", [rand(2, 3, 4)], lambda b, w, p: [b[0].reshape(b[0].shape[0], 2, 6)],
         {"reshape_param": {"shape": {"dim": [0, 2, -1]}}}),
    Case("softmax", "Softmax", [rand(3, 4)], lambda b, w, p: [ref_softmax(b[0])]),
    Case("softmax_4d", "Softmax", [rand(2, 3, 2, 2)], lambda b, w, p: [ref_softmax(b[0])]),
    Case("log_softmax", "LogSoftmax", [rand(3, 4) * 20], lambda b, w, p: [np.log(ref_softmax(b[0]))]),
    Case("log_softmax_last_axis", "LogSoftmax", [rand(2, 3, 5)],
         lambda b, w, p: [np.log(ref_softmax(b[0], axis=-1))], {"softmax_param": {"axis": -1}}),
    Case("argmax", "ArgMax", [rand(3, 6)], lambda b, w, p: ref_argmax(b, w, {"top_k": 2, "out_max_val": True}),
         {"argmax_param": {"top_k": 2, "out_max_val": True}}, grad=False),
    Case("argmax_ties_4d", "ArgMax", [np.floor(rand(2, 3, 2, 2) * 1.5)],  # (values -2..1: ties everywhere)
         lambda b, w, p: ref_argmax(b, w, {"top_k": 4, "out_max_val": True}),
         {"argmax_param": {"top_k": 4, "out_max_val": True}}, grad=False),
    Case("argmax_ties_indices", "ArgMax", [np.floor(rand(2, 3, 2, 2) * 1.5)],
         lambda b, w, p: ref_argmax(b, w, {"top_k": 3}), {"argmax_param": {"top_k": 3}}, grad=False),
    *[Case(f"reduction_{op.lower()}", "Reduction", [rand(2, 3, 2)],
           lambda b, w, p, op=op: ref_reduction(b, w, {"operation": op, "axis": 1, "coeff": 0.5}),
           {"reduction_param": {"operation": op, "axis": 1, "coeff": 0.5}}) for op in ("SUM", "ASUM", "SUMSQ", "MEAN")],
    Case("softmax_loss", "SoftmaxWithLoss", [rand(4, 5), labels(4, classes=5)], ref_softmax_loss),
    Case("softmax_loss_label_smoothing", "SoftmaxWithLoss", [rand(4, 5), labels(4, classes=5)],
         lambda b, w, p: ref_softmax_loss(b, w, p, smoothing=0.1), {"label_smoothing_param": {"epsilon": 0.1}}),
    Case("softmax_loss_spatial_ignore", "SoftmaxWithLoss",
         [rand(2, 3, 2, 2), np.array([[[0, 1], [2, 1]], [[1, 1], [0, 2]]], float)],
         lambda b, w, p: ref_softmax_loss(b, w, p, ignore=1), {"loss_param": {"ignore_label": 1}}),
    Case("softmax_loss_batch_size", "SoftmaxWithLoss", [rand(4, 3), labels(4, classes=3)],
         lambda b, w, p: ref_softmax_loss(b, w, p, "BATCH_SIZE"), {"loss_param": {"normalization": "BATCH_SIZE"}}),
    Case("sigmoid_ce", "SigmoidCrossEntropyLoss", [rand(3, 4), rand(3, 4, low=0, high=1)], ref_sigmoid_ce),
    Case("euclidean", "EuclideanLoss", [rand(3, 4), rand(3, 4)],
         lambda b, w, p: [np.array(((b[0] - b[1]) ** 2).sum() / (2 * b[0].shape[0]))]),
    Case("hinge_l1", "HingeLoss", [rand(4, 3), labels(4, classes=3)], ref_hinge),
    Case("hinge_l2", "HingeLoss", [rand(4, 3), labels(4, classes=3)], lambda b, w, p: ref_hinge(b, w, {"norm": "L2"}),
         {"hinge_loss_param": {"norm": "L2"}}),
    Case("accuracy_ties", "Accuracy", [np.floor(rand(40, 5) * 1.5), labels(40, classes=5)],  # (scores -2..1)
         lambda b, w, p: ref_accuracy(b, w, {"top_k": 2}), {"accuracy_param": {"top_k": 2}}, tops=2, grad=False),
    Case("accuracy_top2", "Accuracy", [rand(6, 4), labels(6, classes=4)],
         lambda b, w, p: ref_accuracy(b, w, {"top_k": 2, "ignore_label": 3}),
         {"accuracy_param": {"top_k": 2, "ignore_label": 3}}, tops=2, grad=False),
    # ContrastiveLoss, InfogainLoss, MultinomialLogisticLoss (Caffe's catalogue, #20)
    Case("contrastive", "ContrastiveLoss", [rand(6, 3), rand(6, 3), np.array([1, 0, 0, 1, 0, 0], float)],
         ref_contrastive),
    Case("contrastive_legacy", "ContrastiveLoss",
         [rand(6, 2, 1, 1), rand(6, 2, 1, 1), np.array([[0], [1], [0], [0], [1], [0]], float)],
         lambda b, w, p: ref_contrastive(b, w, {"margin": 2.0, "legacy_version": True}),
         {"contrastive_loss_param": {"margin": 2.0, "legacy_version": True}}),
    Case("infogain_source", "InfogainLoss", [rand(4, 3), labels(4, classes=3)],
         lambda b, w, p: ref_infogain(b, w, p, h=INFOGAIN_H),
         {"infogain_loss_param": {"source": saved_npy("H.npy", INFOGAIN_H)}}),
    Case("infogain_spatial_ignore_full", "InfogainLoss",
         [rand(2, 3, 2, 2), np.array([[[0, 1], [2, 1]], [[1, 1], [0, 2]]], float)],
         lambda b, w, p: ref_infogain(b, w, p, h=INFOGAIN_H, normalization="FULL", ignore=1),
         {"infogain_loss_param": {"source": saved_npy("H.npy", INFOGAIN_H)},
          "loss_param": {"ignore_label": 1, "normalization": "FULL"}}),
    # H as a bottom: no reference, as the reshape check would double H with the batch
    Case("infogain_h_bottom", "InfogainLoss", [rand(4, 3), labels(4, classes=3), INFOGAIN_H.reshape(1, 1, 3, 3)]),
    Case("multinomial_logistic", "MultinomialLogisticLoss", [ref_softmax(rand(4, 5)), labels(4, classes=5)],
         ref_multinomial_logistic),
    # Embed, Parameter and BatchReindex (Caffe's catalogue, #20); their indices are label bottoms
    Case("embed", "Embed", [labels(2, 3, classes=5)], ref_embed, {"embed_param": {"num_output": 4, "input_dim": 5}}),
    Case("embed_repeats_nobias", "Embed", [np.array([[1, 3, 1], [1, 0, 3]], float)], ref_embed,
         {"embed_param": {"num_output": 3, "input_dim": 4, "bias_term": False}}),
    Case("parameter", "Parameter", [], lambda b, w, p: [w[0]], {"parameter_param": {"shape": {"dim": [2, 3, 4]}}}),
    Case("batch_reindex", "BatchReindex", [rand(4, 3, 2), np.array([2, 0, 2, 3, 2], float)], ref_batch_reindex),
    Case("batch_reindex_1d_subset", "BatchReindex", [rand(5), np.array([4, 1], float)], ref_batch_reindex),
    # RNN and LSTM (Caffe's catalogue, #20): x (T, N, ...), cont (T, N) a label bottom; a 0 mid-sequence resets,
    # and cont[0] is all 0 so the state a pass carries to the next one never shows.  With x_static or the
    # exposed states no reference, as the reshape check would double N in them (test_recurrent_layers.py has it)
    Case("rnn", "RNN", [rand(4, 3, 2), RNN_CONT], ref_rnn, {"recurrent_param": {"num_output": 3}}),
    Case("rnn_static_expose", "RNN", [rand(3, 2, 2, 2), RNN_CONT[:3, :2], rand(2, 3), rand(1, 2, 4)],
         block={"recurrent_param": {"num_output": 4, "expose_hidden": True}}, tops=2),
    Case("lstm", "LSTM", [rand(4, 3, 2), RNN_CONT], ref_lstm, {"recurrent_param": {"num_output": 3}}),
    Case("lstm_static_expose", "LSTM", [rand(3, 2, 3), RNN_CONT[:3, :2], rand(2, 2), rand(1, 2, 2), rand(1, 2, 2)],
         block={"recurrent_param": {"num_output": 2, "expose_hidden": True}}, tops=3),
    # GELU, adaptive pooling (windows of different sizes, overlapping, more outputs than inputs; and dividing the
    # input, an ordinary pooling) and depthwise convolution, computed directly (#20)
    Case("gelu", "GELU", [rand(2, 3, 4, low=-7, high=7)], ew(lambda x, w, p: ref_gelu(x))),
    Case("gelu_tanh", "GELU", [rand(3, 5, low=-7, high=7)], ew(lambda x, w, p: ref_gelu(x, "tanh")),
         {"gelu_param": {"approximate": "tanh"}}),
    adaptive("pool_adaptive_max", rand(2, 2, 7, 9), pool="MAX", output_size=[3, 4]),
    adaptive("pool_adaptive_ave", rand(2, 2, 7, 9), pool="AVE", output_size=[3, 4]),
    adaptive("pool_adaptive_max_more_outputs", rand(1, 2, 3, 5), pool="MAX", output_h=5, output_w=4),
    adaptive("pool_adaptive_ave_more_outputs", rand(1, 2, 3, 5), pool="AVE", output_h=5, output_w=4),
    adaptive("pool_adaptive_ave_divides", rand(2, 3, 8, 6), pool="AVE", output_size=[4, 3]),
    adaptive("pool_adaptive_max_to_one", rand(2, 3, 5, 4), pool="MAX", output_size=[1]),
    conv("conv_depthwise_stride2_pad1", rand(2, 4, 7, 8), num_output=4, kernel_size=3, stride=2, pad=1, group=4),
    conv("conv_depthwise_multiplier_dilation", rand(1, 3, 7, 6), num_output=6, kernel_size=3, pad=2, dilation=2,
         group=3, bias_term=False),
    # multi-head attention: self-attention, and query/key/value with a causal mask and no biases (#20)
    Case("attention_self", "MultiHeadAttention", [rand(2, 4, 6)], ref_attention,
         {"multi_head_attention_param": {"num_heads": 2}}),
    Case("attention_qkv_causal_nobias", "MultiHeadAttention", [rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 4)],
         ref_attention, {"multi_head_attention_param": {"num_heads": 2, "causal": True, "bias_term": False}}),
]

BY_ID = {case.id: case for case in CASES}


def build(case: Case, inplace=None, bottoms=None, device="cpu", dtype=np.float64):
    return one_layer_net(case.type, case.shapes, case.tops, case.block, phase=case.phase,
                         inplace=case.inplace if inplace is None else inplace, bottoms=bottoms or case.bottoms,
                         device=device, dtype=dtype)


def reference_of(case: Case):
    """The case's reference as netspec.testing calls it: (bottoms, params) -> tops."""
    return lambda bottoms, params: case.reference(bottoms, params, case.block)


def test_every_registered_layer_is_covered():
    # the data layers read files; test_hdf5_data.py and test_record_data.py check them (and HDF5Output);
    # test_python_layers.py checks users' Python layers, test_memory_data.py MemoryData
    covered = {case.type for case in CASES} | {"Input", "DummyData", "HDF5Data", "Silence", "Data", "ImageData",
                                                "HDF5Output", "Python", "MemoryData"}
    assert set(layer_types()) == covered


@pytest.mark.parametrize("case", [c for c in CASES if c.reference], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_forward_matches_reference(case, device):
    check_forward(build(case, inplace=False, device=device), reference_of(case))


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_finite_differences(case, device):
    gradient_check(build(case, inplace=False, device=device))


@pytest.mark.parametrize("case", [c for c in CASES if c.type != "Dropout" or c.phase == "TEST"], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_float32_computes_what_float64_does(case, device):
    check_float32(lambda dtype: build(case, inplace=False, device=device, dtype=dtype), gradient=case.grad)


@pytest.mark.parametrize("case", [c for c in CASES if c.inplace], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_inplace_equals_out_of_place(case, device):
    check_inplace(lambda inplace: build(case, inplace=inplace, device=device))


def test_inplace_refused_for_unsafe_layers():
    with pytest.raises(netspec_error()) as info:
        one_layer_net("AbsVal", [(2, 3)], inplace=True)
    assert "cannot run in place" in str(info.value)


def netspec_error():
    from netspec import ConfigError
    return ConfigError


@pytest.mark.parametrize("case", [c for c in CASES if c.grad and c.type != "Dropout"], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_param_diffs_accumulate_and_bottom_diffs_overwrite(case, device):
    check_accumulation(build(case, inplace=False, device=device))


@pytest.mark.parametrize("case", [c for c in CASES if c.reference and c.id != "scale_bottom"
                                  and c.id != "bias_bottom"], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_reshape_to_a_new_batch_size(case, device):
    doubled = [np.concatenate([b, b]) for b in case.bottoms]
    check_reshape(build(case, inplace=False, device=device), reference_of(case), doubled)


def test_dropout_train_zeroes_about_the_ratio_and_scales_the_rest():
    x = rand(200, 50, low=0.5, high=1.0)
    net = one_layer_net("Dropout", [x.shape], params={"dropout_param": {"dropout_ratio": 0.3}}, bottoms=[x])
    (y,) = run_forward(net)
    kept = y != 0
    assert abs(1 - kept.mean() - 0.3) < 0.02
    np.testing.assert_allclose(y[kept], x[kept] / 0.7)


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_streams_depend_on_seed_rank_name_and_draw_only(device):
    first, again = Backend(device, seed=4), Backend(device, seed=4)
    draws = [first.to_host(first.random((300, 7), name="drop")) for _ in range(3)]
    assert first.stream == (4, {"drop": 3}) and all(d.dtype == np.float32 and d.shape == (300, 7) for d in draws)
    again.stream = (4, {"drop": 2})  # as a resumed run sets it
    assert np.array_equal(again.to_host(again.random((300, 7), name="drop")), draws[2])
    assert not np.array_equal(draws[0], draws[1])
    other = first.to_host(first.random((300, 7), name="drop2"))  # another layer's stream: its own values
    assert not np.array_equal(other, draws[0]) and first.stream == (4, {"drop": 3, "drop2": 1})
    values = np.concatenate([d.ravel() for d in draws])
    assert values.min() >= 0 and values.max() < 1 and abs(values.mean() - 0.5) < 0.01
    assert np.histogram(values, bins=10, range=(0, 1))[0].min() > 0.09 * values.size
    wide = first.to_host(first.random((1000,), np.float64))
    assert wide.dtype == np.float64 and len(np.unique(wide)) == 1000
    other_seed = Backend(device, seed=5)
    assert not np.array_equal(other_seed.to_host(other_seed.random((300, 7), name="drop")), draws[0])
    first.seed(4)
    assert first.stream == (4, {}) and np.array_equal(first.to_host(first.random((300, 7), name="drop")), draws[0])


def test_a_layers_masks_do_not_depend_on_the_layers_before_it():
    def masks(dropouts: list[str]) -> np.ndarray:
        layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": [{"dim": [50, 40]}]}}]
        layers += [{"name": name, "type": "Dropout", "bottom": "x", "top": "x"} for name in dropouts]
        net = load_net(yaml.safe_dump({"layers": layers}), seed=3)
        for _ in range(2):
            net.blobs["x"].data[...] = 1
            net.forward()
        return net.blobs["x"].data != 0

    alone, after = masks(["last"]), masks(["first", "last"])
    assert np.array_equal(after, alone & masks(["first"]))  # each layer's mask is its own stream's


@pytest.mark.parametrize("device", DEVICES)
def test_dummy_data_draws_its_fillers_on_the_device(device):
    fillers = [{"type": "gaussian", "mean": 2, "std": 3}, {"type": "randint", "min": -2, "max": 3},
               {"type": "uniform", "min": -1, "max": 5}, {"type": "xavier"}]
    net = load_net(yaml.safe_dump({"layers": [{"name": "data", "type": "DummyData", "top": ["g", "r", "u", "x"],
                                               "dummy_data_param": {"shape": [{"dim": [400, 250]}],
                                                                    "data_filler": fillers}}]}), device=device,
                   seed=5)
    made = DeviceGenerator(Backend(device, seed=5), "data")  # (the layer's stream: its tops' draws in order)
    made.standard_normal((400, 250), np.float32)
    labels = made.integers(-2, 3, (400, 250), np.float32)
    uniform = made.random((400, 250), np.float32)
    uniform *= 6
    uniform -= 1
    for name, expected in (("r", labels), ("u", uniform)):
        assert np.array_equal(net.backend.to_host(net.blobs[name].data), net.backend.to_host(expected)), name
    host_draws = net.backend.host_rng.bit_generator.state
    net.forward()
    assert net.backend.host_rng.bit_generator.state == host_draws  # the data order's generator is not used
    g, r, u, x = (net.backend.to_host(net.blobs[name].data) for name in ("g", "r", "u", "x"))
    assert abs(g.mean() - 2) < 0.05 and abs(g.std() - 3) < 0.05 and g.dtype == np.float32
    assert set(np.unique(r)) == {-2, -1, 0, 1, 2}
    assert u.min() >= -1 and u.max() < 5 and abs(u.mean() - 2) < 0.05
    assert abs(x).max() <= math.sqrt(3 / 250) and abs(x.std() - math.sqrt(1 / 250)) < 0.001
    before = np.array(net.backend.to_host(net.blobs["g"].data))
    net.forward()
    assert not np.array_equal(before, net.backend.to_host(net.blobs["g"].data))


def test_ranks_draw_streams_of_their_own():
    class Rank:  # a communicator's place in a run, all the backend asks of it here
        def __init__(self, rank):
            self.rank, self.size = rank, 2

    masks = [Backend("cpu", seed=4, comm=Rank(rank)).random((50, 50)) for rank in (0, 1)]
    assert not np.array_equal(*masks)


@pytest.mark.parametrize("threaded", [False, True])
def test_host_draws_are_each_index_hashed_whatever_the_chunks(threaded, monkeypatch):
    """The CPU makes its values a cache-sized chunk at a time (large draws on every core); each is still the
    hash of its index in the draw, as the GPU's (and the array code's) are, and float32 normals are float64's to
    float32 precision."""
    from netspec.engine import backend
    from netspec.engine.backend import HOST_CHUNK, _mix_in_place, _mixed

    if threaded:
        monkeypatch.setattr(backend, "THREADED_VALUES", HOST_CHUNK)

    count = 5 * (HOST_CHUNK // 2 + 1)  # (an odd count, over chunks of two sizes)
    shape = (5, count // 5)
    offset = Backend("cpu", seed=9).next_offset("x")
    hashes = np.arange(count, dtype=np.uint64) + np.uint64(offset)
    _mix_in_place(hashes)
    assert [int(hashes[i]) for i in (0, 5, count - 1)] == [_mixed(offset + i) for i in (0, 5, count - 1)]
    halves = np.stack([hashes & np.uint64(2 ** 32 - 1), hashes >> np.uint64(32)], axis=1)  # (low half first)
    words = halves.reshape(-1)[:count]
    for dtype, bits, width, kept in ((np.float16, words, 32, 11), (np.float32, words, 32, 24),
                                     (np.float64, hashes, 64, 53)):
        expected = ((bits >> np.uint64(width - kept)).astype(dtype) * dtype(2.0 ** -kept)).reshape(shape)
        assert np.array_equal(Backend("cpu", seed=9).random(shape, dtype, "x"), expected), dtype
        # (1 - 1e-9 is 1 in float16 and float32; a drawn value is a threshold some values meet exactly)
        for threshold in (0.3, 1 / 3, 0.0, -1.0, 1 - 1e-9, 0.9999, float(expected[1, 7]), math.nan, math.inf,
                          -math.inf):
            mask = Backend("cpu", seed=9).random_at_least(shape, threshold, dtype, "x")
            assert mask.dtype == bool and np.array_equal(mask, expected >= dtype(threshold)), (dtype, threshold)
    for low, span, dtype in ((-3, 1003, np.int64), (5, 2 ** 16, np.int64), (0, 1000, np.float32)):  # (a word each)
        labels = DeviceGenerator(Backend("cpu", seed=9), "x").integers(low, low + span, count, dtype)
        assert labels.dtype == dtype
        assert np.array_equal(labels, (words * np.uint64(span) >> np.uint64(32)).astype(np.int64) + low), span
    for low, span in ((-2 ** 40, 2 ** 16 + 1), (0, 2 ** 32)):  # (a hash each)
        labels = DeviceGenerator(Backend("cpu", seed=9), "x").integers(low, low + span, count)
        assert labels.tolist() == [(int(h) * span >> 64) + low for h in hashes], span
    wide, narrow = (Backend("cpu", seed=9).standard_normal(count, dtype, "g") for dtype in (np.float64, np.float32))
    draws = Backend("cpu", seed=9)
    pairs = (count + 1) // 2
    u, v = draws.random(pairs, np.float64, "g"), draws.random(pairs, np.float64, "g")
    radius, turn = np.sqrt(-2.0 * np.log(1.0 - u)), 2.0 * math.pi * v
    assert np.array_equal(wide, np.stack([radius * np.cos(turn), radius * np.sin(turn)], axis=1).reshape(-1)[:count])
    # (float32's cos(2 pi v) is within a few 1e-7 of float64's, times the radius: up to ~2e-6 where cos crosses 0)
    assert narrow.dtype == np.float32 and np.allclose(narrow, wide, rtol=1e-5, atol=4e-6)
    assert abs(narrow.mean()) < 0.02 and abs(narrow.std() - 1) < 0.02


def test_integers_come_up_evenly_and_refuse_what_they_cannot_draw():
    draws = DeviceGenerator(Backend("cpu", seed=2), "x")
    for span in (3, 3 * 2 ** 30):  # (a word times 3 * 2**30 would give 0 twice the share of 1 and 2)
        shares = np.bincount(draws.integers(0, span, 300_000) % 3) / 300_000
        assert np.allclose(shares, 1 / 3, atol=0.005), (span, shares)
    for low, high in ((2 ** 53, 2 ** 53 + 3), (0, 2 ** 32 + 1), (5, 5)):
        with pytest.raises(ValueError, match="integers needs low < high within"):
            draws.integers(low, high, 3)
    before = draws.backend.stream
    with pytest.raises(ValueError, match=r"got a float32 array of shape \(5,\), not C-contiguous"):
        draws.integers(0, 9, 5, np.float32, out=np.empty(10, np.float32)[::2])
    assert draws.backend.stream == before  # (a refused call draws nothing)


@pytest.mark.parametrize("device", DEVICES)
def test_draws_into_an_array_given_are_the_draws_made(device):
    made, into = (Backend(device, seed=4) for _ in range(2))
    for draw in (lambda b, **out: b.random((30, 7), np.float32, "x", **out),
                 lambda b, **out: b.standard_normal((30, 7), np.float32, "g", **out),
                 lambda b, **out: DeviceGenerator(b, "n").integers(-4, 70_000, (30, 7), np.float32, **out)):
        out = into.xp.empty((30, 7), np.float32)
        assert draw(into, out=out) is out
        assert np.array_equal(made.to_host(draw(made)), into.to_host(out))


def test_dropout_keeps_where_the_draw_meets_the_ratio_and_backward_takes_the_same_mask():
    x = rand(40, 30).astype(np.float32)
    layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": [{"dim": [40, 30]}]}},
              {"name": "drop", "type": "Dropout", "bottom": "x", "top": "y", "dropout_param": {"dropout_ratio": 0.3}}]
    net = load_net(yaml.safe_dump({"layers": layers}), phase="TRAIN", seed=6)
    net.blobs["x"].data[...] = x
    net.forward()
    keep = Backend("cpu", seed=6).random((40, 30), np.float32, "drop") >= np.float32(0.3)
    scale = np.float32(1 / 0.7)
    assert np.array_equal(net.blobs["y"].data, x * keep * scale)
    net.blobs["y"].diff[...] = 2.0
    net.layers[-1].backward(net.top_blobs[-1], [True], net.bottom_blobs[-1])
    assert np.array_equal(net.blobs["x"].diff, np.float32(2.0) * keep * scale)


def test_batchnorm_test_phase_uses_stored_statistics():
    x = rand(4, 3, 2, 2)
    net = one_layer_net("BatchNorm", [x.shape], phase="TEST", bottoms=[x])
    mean_sum, var_sum, factor = net.layers[-1].blobs
    mean_sum.data[...] = [0.2, 0.4, 0.6]
    var_sum.data[...] = [2.0, 4.0, 8.0]
    factor.data[...] = 2.0
    (y,) = run_forward(net)
    expected = (x - channel_shape(x, np.array([0.1, 0.2, 0.3]))) / np.sqrt(channel_shape(x, np.array([1., 2, 4])) + 1e-5)
    np.testing.assert_allclose(y, expected)
    gradient_check(net, check_params=False)


def test_batchnorm_train_updates_running_sums_as_caffe():
    x = rand(4, 3, 2, 2)
    net = one_layer_net("BatchNorm", [x.shape], bottoms=[x], params={"batch_norm_param": {
        "moving_average_fraction": 0.9}})
    for blob in net.layers[-1].blobs:
        blob.data[...] = 0
    run_forward(net)
    run_forward(net)
    mean_sum, var_sum, factor = (b.data for b in net.layers[-1].blobs)
    m = 16
    np.testing.assert_allclose(factor, [1.9])
    np.testing.assert_allclose(mean_sum, 1.9 * x.mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(var_sum, 1.9 * x.var(axis=(0, 2, 3)) * m / (m - 1))


RESNET_UNIT = """
layers:
  - {name: data, type: Input, top: [data, target], input_param: {shape: [{dim: [4, 3, 5, 5]}, {dim: [4, 1]}]}}
  - {name: conv, type: Convolution, bottom: data, top: c,
     convolution_param: {num_output: 3, kernel_size: 1, weight_filler: {type: gaussian, std: 1}}}
  - {name: bn, type: BatchNorm, bottom: c, top: c}
  - {name: scale, type: Scale, bottom: c, top: c,
     scale_param: {bias_term: true, filler: {type: constant, value: -2.5}, bias_filler: {type: constant, value: .7}}}
  - {name: relu, type: ReLU, bottom: c, top: c}
  - {name: ip, type: InnerProduct, bottom: c, top: out,
     inner_product_param: {num_output: 1, weight_filler: {type: gaussian, std: 1}}}
  - {name: loss, type: EuclideanLoss, bottom: [out, target], top: loss}
"""


def test_batchnorm_in_place_under_scale_and_relu_has_the_true_gradient():
    """ResNet's unit: BatchNorm, Scale and ReLU all in place on the convolution's top, which the later two
    overwrite before BatchNorm's backward runs."""
    net = load_net(RESNET_UNIT, phase="TRAIN", dtype=np.float64, seed=1)
    net.blobs["data"].data[...] = rand(4, 3, 5, 5)
    net.blobs["target"].data[...] = 0.3
    net.forward_backward()
    weights = net.params["conv"][0]
    for index in [(0, 0, 0, 0), (1, 2, 0, 0), (2, 1, 0, 0)]:
        saved = weights.data[index]
        weights.data[index] = saved + 1e-6
        plus = net.forward()
        weights.data[index] = saved - 1e-6
        minus = net.forward()
        weights.data[index] = saved
        np.testing.assert_allclose(weights.diff[index], (plus - minus) / 2e-6, rtol=1e-5)


FORK = """
layers:
  - {name: data, type: Input, top: x, input_param: {shape: {dim: [2, 3]}}}
  - {name: ip, type: InnerProduct, bottom: x, top: h, inner_product_param: {num_output: 4,
     weight_filler: {type: gaussian, std: 1}}}
  - {name: abs, type: AbsVal, bottom: h, top: a}
  - {name: relu, type: ReLU, bottom: h, top: h}
  - {name: sum, type: Eltwise, bottom: [a, h], top: y}
"""


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["NumPy", "oneDNN where installed"])
def test_a_split_shares_its_data_only_with_tops_no_layer_changes_in_place(dtype):
    net = load_net(FORK, phase="TRAIN", dtype=dtype, seed=1)
    split = next(i for i, layer in enumerate(net.layers) if layer.type == "Split")
    bottom, (to_abs, to_relu) = net.bottom_blobs[split][0], net.top_blobs[split]
    assert to_abs.data is bottom.data and to_relu.data is not bottom.data
    net.blobs["x"].data[...] = rand(2, 3)
    net.forward()
    h = net.blobs["x"].data @ net.params["ip"][0].data.T + net.params["ip"][1].data
    np.testing.assert_allclose(net.blobs["y"].data, abs(h) + np.maximum(h, 0),  # ReLU's change stayed in its branch
                               rtol=1e-6 if dtype == np.float32 else 1e-7, atol=1e-6 if dtype == np.float32 else 0)


def test_softmax_loss_weight_scales_gradient():
    x, y = rand(4, 5), labels(4, classes=5)
    net = one_layer_net("SoftmaxWithLoss", [x.shape, y.shape], bottoms=[x, y], params={"loss_weight": 3.0})
    net.forward()
    net.backward()
    prob = ref_softmax(x)
    prob[np.arange(4), y.astype(int)] -= 1
    np.testing.assert_allclose(net.bottom_blobs[-1][0].diff, 3.0 * prob / 4)


def test_dummy_data_refills_random_tops_and_keeps_constants():
    net = one_layer_net("DummyData", [], tops=2, params={"dummy_data_param": {
        "shape": [{"dim": [2, 3]}, {"dim": [2]}], "data_filler": [{"type": "gaussian"}, {"type": "constant", "value": 4}]}})
    first = [b.data.copy() for b in net.top_blobs[-1]]
    net.forward()
    second = [b.data.copy() for b in net.top_blobs[-1]]
    assert not np.allclose(first[0], second[0])
    np.testing.assert_array_equal(second[1], [4, 4])


def test_input_keeps_what_the_caller_sets():
    net = one_layer_net("Input", [], tops=1, params={"input_param": {"shape": {"dim": [1, 2]}}})
    net.blobs["t0"].data[...] = [[3, 4]]
    net.forward()
    np.testing.assert_array_equal(net.blobs["t0"].data, [[3, 4]])


def test_silence_consumes_and_zeroes_gradient():
    net = one_layer_net("Silence", [(2, 3)], tops=0)
    assert net.outputs == []
    net.bottom_blobs[-1][0].diff[...] = 5
    net.layers[-1].backward([], [True], net.bottom_blobs[-1])
    assert not net.bottom_blobs[-1][0].diff.any()


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_underflow_follow_caffes_loops(device):
    def passes(layer_type, x, params=None, dy=None):
        x = np.asarray(x, dtype=np.float64)
        net = one_layer_net(layer_type, [x.shape], bottoms=[x], params=params or {}, device=device)
        y = run_forward(net)[0]
        net.top_blobs[-1][0].diff[...] = net.backend.asarray(np.ones_like(y) if dy is None else dy)
        net.layers[-1].backward(net.top_blobs[-1], [True], net.bottom_blobs[-1])
        return y, net.backend.to_host(net.bottom_blobs[-1][0].diff)

    y, dx = passes("Clip", [[np.nan, -5.0, 5.0, 0.5]], {"clip_param": {"min": -1, "max": 1}})
    assert y.tolist() == [[-1.0, -1.0, 1.0, 0.5]] and dx.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert passes("AbsVal", [[np.nan, -2.0, 0.0, 3.0]])[1].tolist() == [[0.0, -1.0, 0.0, 1.0]]
    prelu = passes("PReLU", [[[np.nan], [-2.0]]])  # (slopes drawn; Caffe's (x > 0) + a (x <= 0) is 0 at NaN)
    assert prelu[1][0, 0, 0] == 0.0
    assert passes("BNLL", [[-40.0, 40.0]])[0].tolist() == [[0.0, 40.0]]  # log(1 + e^-40) is 0 in float64
    assert passes("Reduction", [[np.nan, -2.0]], {"reduction_param": {"operation": "ASUM"}})[1].tolist() == [[0, -1]]


@pytest.mark.parametrize(("shape", "reference", "axis", "offset"), [
    ((2, 3, 6, 7), (2, 3, 4, 3), 2, [1, 2]),  # the last two axes cut
    ((2, 5, 6, 4), (2, 3, 4, 4), 1, [2, 1, 0]),  # the last axis whole
    ((3, 4, 5), (2, 4, 5), 0, [1, 0, 0]),  # only the first axis cut
    ((2, 3, 4), (2, 3, 4), 1, [0]),  # nothing cut (one offset for every axis)
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_crop_copies_its_window_and_its_gradient_back_exactly(shape, reference, axis, offset, dtype):
    x = np.arange(math.prod(shape), dtype=float).reshape(shape) - 7
    net = one_layer_net("Crop", [shape, reference], bottoms=[x, np.zeros(reference)], dtype=dtype,
                        params={"crop_param": {"axis": axis, "offset": offset}})
    offsets = offset * (len(shape) - axis) if len(offset) == 1 else offset
    window = (slice(None),) * axis + tuple(slice(o, o + r) for o, r in zip(offsets, reference[axis:]))
    np.testing.assert_array_equal(run_forward(net)[0], x[window])
    top, bottom = net.top_blobs[-1], net.bottom_blobs[-1]
    top[0].diff[...] = np.arange(top[0].diff.size).reshape(top[0].diff.shape) + 1
    bottom[0].diff[...] = 5  # overwritten, not added to
    net.layers[-1].backward(top, [True, False], bottom)
    expected = np.zeros(shape)
    expected[window] = top[0].diff
    np.testing.assert_array_equal(bottom[0].diff, expected)


def test_tile_needs_its_tiles_as_in_caffe():
    with pytest.raises(ConfigError, match="tile_param.tiles: missing required parameter"):
        one_layer_net("Tile", [(2, 3)])


def test_exp_multiplies_as_caffe_and_log_refuses_base_one():
    x = np.array([[1000.0, 1.0]])
    net = one_layer_net("Exp", [x.shape], bottoms=[x], params={"exp_param": {"shift": -1000}})
    with np.errstate(over="ignore", invalid="ignore"):
        y = run_forward(net)[0]  # Caffe's base^shift * exp(ln(base) scale x): inf * 0 is NaN, as there
    assert np.isnan(y[0, 0]) and y[0, 1] == np.exp(1.0) * np.exp(-1000.0)
    with pytest.raises(ConfigError, match="log_param.base: base 1 has no logarithms"):
        one_layer_net("Log", [(1, 2)], params={"log_param": {"base": 1}})


@pytest.mark.parametrize("device", DEVICES)
def test_losses_clamp_and_ignore_as_caffe_does(device):
    scores, labels_ = np.array([[0.0, -1000.0]]), np.array([1.0])  # p(label) underflows to 0
    net = one_layer_net("SoftmaxWithLoss", [scores.shape, labels_.shape], bottoms=[scores, labels_], device=device)
    np.testing.assert_allclose(run_forward(net)[0], -np.log(np.finfo(np.float32).tiny))  # (FLT_MIN, float64 too)
    x, t = np.array([[1.0, -2.0, 0.5]]), np.array([[0.5, 1.0, 0.0]])
    net = one_layer_net("SigmoidCrossEntropyLoss", [x.shape, t.shape], bottoms=[x, t], device=device,
                        params={"loss_param": {"ignore_label": 0}})
    kept = x[0, 1:2], t[0, 1:2]  # (0.5 truncates to 0: ignored, as Caffe casts targets to int)
    expected = (np.maximum(kept[0], 0) - kept[0] * kept[1] + np.log1p(np.exp(-np.abs(kept[0])))).sum()
    np.testing.assert_allclose(run_forward(net)[0], expected)


@pytest.mark.parametrize("device", DEVICES)
def test_eltwise_max_chooses_as_caffes_loop_does(device):
    bottoms = [np.array([[1.0, 2.0, np.nan, 0.0]]), np.array([[1.0, 1.0, 1.0, 0.0]]), np.array([[1.0, 0.0, 1.0, 0.0]])]
    net = one_layer_net("Eltwise", [b.shape for b in bottoms], bottoms=bottoms, device=device,
                        params={"eltwise_param": {"operation": "MAX"}})
    assert run_forward(net)[0].tolist() == [[1.0, 2.0, 1.0, 0.0]]  # (a NaN in the first bottom is passed over)
    net.top_blobs[-1][0].diff[...] = 1
    net.layers[-1].backward(net.top_blobs[-1], [True] * 3, net.bottom_blobs[-1])
    grads = [net.backend.to_host(blob.diff).tolist() for blob in net.bottom_blobs[-1]]
    assert grads == [[[0, 1, 0, 0]], [[1, 0, 1, 1]], [[0, 0, 0, 0]]]  # ties: the second of the first two, then kept


@pytest.mark.parametrize("device", DEVICES)
def test_accuracy_counts_ties_against_the_label_as_caffe_does(device):
    def accuracy(scores, label_values, top_k=1):
        scores = np.asarray(scores, dtype=np.float64)
        net = one_layer_net("Accuracy", [scores.shape, (len(scores),)], tops=2, device=device,
                            bottoms=[scores, np.asarray(label_values, dtype=np.float64)],
                            params={"accuracy_param": {"top_k": top_k}})
        return [float(value.ravel()[0]) if value.ndim == 0 else list(value) for value in run_forward(net)]

    stuck = np.zeros((4, 3))  # a net that has stopped learning: every class scores the same
    assert accuracy(stuck, [0, 1, 2, 0]) == [0.0, [0.0, 0.0, 0.0]]
    assert accuracy(stuck, [0, 1, 2, 0], top_k=2)[0] == 0.0 and accuracy(stuck, [0, 1, 2, 0], top_k=3)[0] == 1.0
    assert accuracy([[1, 1, 0], [2, 1, 1]], [0, 0])[0] == 0.5  # a tie with another class is no hit
    assert accuracy([[np.nan, 1, 0]], [0])[0] == 1.0  # (Caffe: no class scores >= NaN, so the label is "top")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [0, 1])
def test_max_pooling_gradient_goes_to_the_first_maximum_of_each_window(pad, device):
    x = np.random.default_rng(5).integers(0, 2, size=(2, 2, 7, 7)).astype(np.float64)
    net = one_layer_net("Pooling", [x.shape], bottoms=[x], device=device,
                        params={"pooling_param": {"pool": "MAX", "kernel_size": 3, "stride": 2, "pad": pad}})
    run_forward(net)
    dy = np.random.default_rng(6).uniform(1, 2, net.top_blobs[-1][0].shape)
    net.top_blobs[-1][0].diff[...] = net.backend.asarray(dy)
    net.layers[-1].backward(net.top_blobs[-1], [True], net.bottom_blobs[-1])
    expected = np.zeros_like(x)
    for b, c, oy, ox in np.ndindex(dy.shape):
        cells = [(y, z) for y in range(oy * 2 - pad, oy * 2 - pad + 3) for z in range(ox * 2 - pad, ox * 2 - pad + 3)
                 if 0 <= y < 7 and 0 <= z < 7]
        y, z = max(cells, key=lambda cell: (x[b, c][cell], -cells.index(cell)))
        expected[b, c, y, z] += dy[b, c, oy, ox]
    np.testing.assert_allclose(net.backend.to_host(net.bottom_blobs[-1][0].diff), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_a_convolution_in_parts_of_the_batch_computes_what_it_does_whole(device, monkeypatch):
    rng = np.random.default_rng(8)
    x, dy = rng.normal(size=(5, 4, 9, 11)), rng.normal(size=(5, 6, 5, 6))
    results = []
    for column_bytes in (convolution.COLUMN_BYTES, 1):  # (1: one sample a part)
        monkeypatch.setattr(convolution, "COLUMN_BYTES", column_bytes)
        net = one_layer_net("Convolution", [x.shape], bottoms=[x], device=device, params={"convolution_param": {
            "num_output": 6, "kernel_size": 3, "stride": 2, "pad": 1, "group": 2}})
        layer = net.layers[-1]
        assert len(layer.parts) == (1 if column_bytes > 1 else 5)
        y = run_forward(net)[0]
        net.top_blobs[-1][0].diff[...] = net.backend.asarray(dy)
        layer.backward(net.top_blobs[-1], [True], net.bottom_blobs[-1])
        results.append([y, *(net.backend.to_host(array) for array in (
            net.bottom_blobs[-1][0].diff, layer.blobs[0].diff, layer.blobs[1].diff))])
    for whole, parts in zip(*results):
        np.testing.assert_allclose(parts, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_the_gpus_random_values_are_the_cpus():
    cpu, gpu = Backend("cpu", seed=11), Backend("gpu", seed=11)
    for dtype in (np.float16, np.float32, np.float64):  # (an odd count: the last hash gives one word)
        assert np.array_equal(gpu.to_host(gpu.random((301, 7), dtype, "drop")), cpu.random((301, 7), dtype, "drop"))
        assert np.array_equal(gpu.to_host(gpu.random_at_least((301, 7), 0.3, dtype, "mask")),
                              cpu.random_at_least((301, 7), 0.3, dtype, "mask"))
    for count in (5000, 5001):
        np.testing.assert_allclose(gpu.to_host(gpu.standard_normal(count, np.float64, "g")),
                                   cpu.standard_normal(count, np.float64, "g"), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gpu.to_host(gpu.standard_normal(5001, np.float32, "g")),
                               cpu.standard_normal(5001, np.float32, "g"), rtol=1e-5, atol=4e-6)
    for low, high, dtype in ((-2, 7, np.int64), (-3, 2 ** 20, np.float32), (-2 ** 40, 2 ** 32 - 2 ** 40, np.int64)):
        labels = [DeviceGenerator(backend, "labels").integers(low, high, (41, 51), dtype) for backend in (cpu, gpu)]
        assert labels[1].dtype == dtype and np.array_equal(gpu.to_host(labels[1]), labels[0]), (low, high)
    assert gpu.stream == cpu.stream == (11, {"drop": 3, "mask": 3, "g": 6, "labels": 3})
