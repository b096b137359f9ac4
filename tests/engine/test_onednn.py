"""The oneDNN fast path: the same results as the NumPy path for every geometry of the layers it runs
(Convolution, Pooling, InnerProduct, BatchNorm, Scale...), and the NumPy path whenever oneDNN is off, missing,
or asked for float64."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import onednn, primitives
from netspec.engine.net import LISTED
from netspec.engine.registry import layer_class
from netspec.engine.trust import Trust
from netspec.testing import one_layer_net

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(autouse=True)
def onednn_or_skip(request):
    """Skip every test here where oneDNN is off, but the NumPy and CuPy variants of the folding tests (``path``),
    which need none (the GPU image has no oneDNN)."""
    callspec = getattr(request.node, "callspec", None)
    if onednn.library() is None and (callspec is None or callspec.params.get("path", "oneDNN") == "oneDNN"):
        pytest.skip(f"oneDNN is off: {onednn.why_unavailable()}")


def conv_net(shape, dtype=np.float32, propagate_down=True, **params):
    """An Input and a Convolution of ``params``, with random weights and bias."""
    layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": list(shape)}}},
              {"name": "conv", "type": "Convolution", "bottom": "x", "top": "y",
               "propagate_down": [propagate_down],
               "convolution_param": {**params, "weight_filler": {"type": "gaussian"},
                                     "bias_filler": {"type": "gaussian"}}}]
    return netspec.load_net(yaml.safe_dump({"force_backward": True, "layers": layers}), seed=1, dtype=dtype)


def passes(net, fast: bool, times: int = 2):
    """Forward once and backward ``times`` times (parameter diffs accumulate) on fixed data."""
    conv = net.layer_by_name["conv"]
    if not fast:
        conv.fast = None
    rng = np.random.default_rng(0)
    x, y = net.blobs["x"], net.blobs["y"]
    x.data[...] = rng.standard_normal(x.shape)
    x.diff[...] = 7  # a bottom diff is overwritten, never added to
    conv.forward([x], [y])
    y.diff[...] = rng.standard_normal(y.shape)
    for blob in conv.blobs:
        blob.diff[...] = 0
    for _ in range(times):
        conv.backward([y], [conv.spec.propagate_down != [False]], [x])
    return {"top": y.data.copy(), "bottom diff": x.diff.copy(),
            **{f"param {i} diff": blob.diff.copy() for i, blob in enumerate(conv.blobs)}}


def both_paths(layer_type, shapes, params, phase="TRAIN", inplace=False, rtol=1e-4, atol=1e-4, spread=1.0):
    """Run one layer on oneDNN and on NumPy (same float32 bottoms, normal with deviation ``spread``, and blobs,
    forward, then backward twice so that parameter diffs accumulate) and compare the top, every bottom diff, and
    every blob's data and diff."""
    results = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not fast:
                patch.setattr(onednn, "library_for", lambda layer: None)
            net = one_layer_net(layer_type, shapes, params=params, phase=phase, inplace=inplace, dtype=np.float32)
        layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
        assert (layer.fast is not None) == fast, f"{layer_type} {'should' if fast else 'should not'} run on oneDNN"
        rng = np.random.default_rng(0)
        for blob in bottom:
            blob.data[...] = spread * rng.standard_normal(blob.shape)
        for blob in layer.blobs:
            blob.data[...] = rng.uniform(0.5, 1.5, blob.shape)
            blob.diff[...] = 0
        layer.forward(bottom, top)
        outputs = [top[0].data.copy()]
        top[0].diff[...] = rng.standard_normal(top[0].shape)
        for _ in range(2):
            layer.backward(top, [True] * len(bottom), bottom)
        outputs += [blob.diff.copy() for blob in bottom]
        outputs += [array.copy() for blob in layer.blobs for array in (blob.data, blob.diff)]
        results.append(outputs)
    for index, (got, expected) in enumerate(zip(*results)):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=f"output {index}")


BATCH_NORMS = {
    "TRAIN 4-D": ((4, 3, 5, 5), {}, "TRAIN"),
    "TRAIN in place": ((2, 6, 3, 4), {}, "TRAIN"),
    "TRAIN 2-D, batch 2": ((2, 7), {}, "TRAIN"),
    "TRAIN 1x1 maps": ((5, 4, 1, 1), {}, "TRAIN"),
    "TEST stored statistics": ((3, 4, 5, 5), {}, "TEST"),
    "TRAIN with global statistics": ((2, 3, 4, 4), {"use_global_stats": True}, "TRAIN"),
}


@pytest.mark.parametrize("name", BATCH_NORMS)
def test_batch_norm_matches_the_numpy_path(name):
    shape, params, phase = BATCH_NORMS[name]
    both_paths("BatchNorm", [shape], {"batch_norm_param": params}, phase=phase, inplace="in place" in name)


SCALES = {
    "per channel with bias": ((4, 3, 5, 5), {"bias_term": True}),
    "in place": ((2, 6, 3, 4), {"bias_term": True}),
    "no bias, 2-D": ((3, 7), {}),
}


@pytest.mark.parametrize("name", SCALES)
def test_scale_matches_the_numpy_path(name):
    shape, params = SCALES[name]
    both_paths("Scale", [shape], {"scale_param": params}, inplace="in place" in name)


@pytest.mark.parametrize("params", [{"axis": 2}, {"num_axes": 2}, {"axis": 0}])
def test_a_scale_over_other_axes_keeps_the_numpy_path(params):
    assert one_layer_net("Scale", [(2, 3, 4)], params={"scale_param": params}, dtype=np.float32).layers[-1].fast is None


def unit(scale="scale_param: {bias_term: true}", relu=True, frozen_scale=False):
    """ResNet's unit (convolution, then BatchNorm, Scale and ReLU in place) under a loss."""
    scale_layer = (f"  - {{name: scale, type: Scale, bottom: c, top: c, {scale}"
                   + (", param: [{lr_mult: 0}, {lr_mult: 0}]" if frozen_scale else "") + "}\n") if scale else ""
    return ("layers:\n"
            "  - {name: data, type: Input, top: [data, target], input_param: {shape: [{dim: [4, 3, 6, 6]}, {dim: [4, 1]}]}}\n"
            "  - {name: conv, type: Convolution, bottom: data, top: c, convolution_param: {num_output: 5, kernel_size: 3,"
            " weight_filler: {type: gaussian, std: 1}}}\n"
            "  - {name: bn, type: BatchNorm, bottom: c, top: c}\n" + scale_layer
            + ("  - {name: relu, type: ReLU, bottom: c, top: c}\n" if relu else "")
            + "  - {name: ip, type: InnerProduct, bottom: c, top: out, inner_product_param: {num_output: 1,"
            " weight_filler: {type: gaussian, std: 1}}}\n"
              "  - {name: loss, type: EuclideanLoss, bottom: [out, target], top: loss}\n")


UNITS = {
    "BatchNorm, Scale and ReLU": (dict(), "bn+scale, relu"),
    "BatchNorm and Scale": (dict(relu=False), "bn+scale, ip"),
    "Scale without bias": (dict(scale="scale_param: {}"), "bn+scale, relu"),
    "frozen Scale": (dict(frozen_scale=True), "bn+scale, relu"),
}


@pytest.mark.parametrize("name", UNITS)
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_a_fused_unit_matches_the_numpy_path(name, phase):
    options, fused = UNITS[name]
    results = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not fast:
                patch.setattr(onednn, "library_for", lambda layer: None)
            net = netspec.load_net(unit(**options), phase=phase, seed=1)
        assert (fused in net.paths()) == fast, net.paths()
        rng = np.random.default_rng(0)
        net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
        net.blobs["target"].data[...] = 0.5
        for blob in net.params["bn"]:
            blob.data[...] = rng.uniform(0.5, 1.5, blob.shape)
        for blob in net.params.get("scale", []):
            blob.data[...] = rng.uniform(-1.5, 1.5, blob.shape)
        losses = [net.forward_backward() for _ in range(2)]  # parameter diffs of the second pass
        results.append([np.array(losses), net.blobs["data"].diff.copy(),
                        *(array.copy() for blobs in net.params.values() for blob in blobs
                          for array in (blob.data, blob.diff))])
    for index, (got, expected) in enumerate(zip(*results)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"output {index}")


@pytest.mark.parametrize("params", [{}, {"negative_slope": 0.1}])
@pytest.mark.parametrize("inplace", [False, True])
def test_relu_matches_the_numpy_path(params, inplace):
    both_paths("ReLU", [(3, 4, 5, 6)], {"relu_param": params}, inplace=inplace)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_the_numpy_path(approximate):
    both_paths("GELU", [(3, 4, 5, 6)], {"gelu_param": {"approximate": approximate}}, rtol=1e-5, atol=1e-6)


def test_a_relu_with_a_negative_slope_keeps_the_numpy_path():
    net = one_layer_net("ReLU", [(2, 3)], params={"relu_param": {"negative_slope": -0.5}}, dtype=np.float32)
    assert net.layers[-1].fast is None


ACTIVATIONS = {  # type: parameters (inputs spread over [-12, 12] or so: past ReLU6's 6, HardSwish's and the bounds)
    "ReLU6": {},
    "HardSigmoid": {"hard_sigmoid_param": {}},
    "HardSigmoid, ONNX's alpha": {"hard_sigmoid_param": {"alpha": 0.2, "beta": 0.4}},
    "HardSigmoid, negative slope": {"hard_sigmoid_param": {"alpha": -0.3, "beta": 0.6}},
    "HardSwish": {},
    "Swish": {"swish_param": {}},
    "Swish, beta 1.7": {"swish_param": {"beta": 1.7}},
    "ELU": {"elu_param": {}},
    "ELU, alpha 0.3": {"elu_param": {"alpha": 0.3}},
    "Sigmoid": {},
    "TanH": {},
    "BNLL": {},
}


@pytest.mark.parametrize("name, inplace", [(name, inplace) for name in ACTIVATIONS for inplace in (False, True)
                                           if not inplace or layer_class(name.split(",")[0]).inplace_ok])
def test_activations_match_the_numpy_path(name, inplace):
    both_paths(name.split(",")[0], [(3, 4, 5, 6)], ACTIVATIONS[name], inplace=inplace, spread=4.0, rtol=1e-5,
               atol=1e-5)


def test_an_elu_with_a_negative_alpha_keeps_the_numpy_path():
    net = one_layer_net("ELU", [(2, 3)], params={"elu_param": {"alpha": -0.5}}, dtype=np.float32)
    assert net.layers[-1].fast is None


LAYER_NORMS = {  # name: (bottom shape, layer_norm_param and param)
    "over the last axis": ((4, 7, 16), {"layer_norm_param": {}}),
    "over the last two axes": ((3, 5, 7, 4), {"layer_norm_param": {"axis": 2}}),
    "one row": ((1, 33), {"layer_norm_param": {"eps": 1e-3}}),
    "without scale and shift": ((4, 6, 8), {"layer_norm_param": {"elementwise_affine": False}}),
    "frozen scale": ((4, 6, 8), {"layer_norm_param": {}, "param": [{"lr_mult": 0}, {}]}),
}


@pytest.mark.parametrize("name", LAYER_NORMS)
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_layer_norm_matches_the_numpy_path(name, phase):
    shape, params = LAYER_NORMS[name]
    both_paths("LayerNorm", [shape], params, phase=phase, spread=3.0)


def test_a_layer_norm_without_bottom_gradient_still_accumulates_its_parameters():
    net = one_layer_net("LayerNorm", [(4, 6, 8)], dtype=np.float32)
    layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
    assert layer.fast is not None
    rng = np.random.default_rng(0)
    bottom[0].data[...] = rng.standard_normal(bottom[0].shape)
    bottom[0].diff[...] = 7
    layer.forward(bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    for blob in layer.blobs:
        blob.diff[...] = 1
    layer.backward(top, [False], bottom)
    once = [blob.diff.copy() for blob in layer.blobs]
    layer.backward(top, [False], bottom)
    assert (bottom[0].diff == 7).all()
    for blob, diff in zip(layer.blobs, once):
        np.testing.assert_allclose(blob.diff - 1, 2 * (diff - 1), rtol=1e-6, atol=1e-6)


def test_a_float64_layer_norm_keeps_the_numpy_path():
    assert one_layer_net("LayerNorm", [(2, 3)], dtype=np.float64).layers[-1].fast is None


ATTENTIONS = {  # name: (bottom shapes, multi_head_attention_param and param)
    "self-attention": ([(2, 5, 8)], {"multi_head_attention_param": {"num_heads": 2}}),
    "causal": ([(3, 6, 6)], {"multi_head_attention_param": {"num_heads": 3, "causal": True}}),
    "query, key and value": ([(2, 3, 8), (2, 5, 8), (2, 5, 8)], {"multi_head_attention_param": {"num_heads": 4}}),
    "without biases": ([(2, 4, 6)], {"multi_head_attention_param": {"num_heads": 2, "bias_term": False}}),
    "frozen projections": ([(2, 4, 6), (2, 3, 6), (2, 3, 6)],
                           {"multi_head_attention_param": {"num_heads": 1},
                            "param": [{"lr_mult": 0}, {}, {}, {"lr_mult": 0}]}),
}


@pytest.mark.parametrize("name", ATTENTIONS)
def test_multi_head_attention_matches_the_numpy_path(name):
    shapes, params = ATTENTIONS[name]
    both_paths("MultiHeadAttention", shapes, params, atol=1e-3)  # (values up to some 100s: float32 rounding)


@pytest.mark.parametrize("shape, axis", [((4, 10), 1), ((2, 5, 3, 4), 1), ((3, 4, 7), -1)])
def test_softmax_matches_the_numpy_path(shape, axis):
    both_paths("Softmax", [shape], {"softmax_param": {"axis": axis}}, spread=3.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", [{}, {"coeff": [2, -0.5, 1]}])
def test_eltwise_sum_matches_the_numpy_path(params):
    both_paths("Eltwise", [(2, 3, 4, 5)] * 3, {"eltwise_param": params})


CROPS = {"spatial": ([(2, 3, 9, 8), (2, 1, 5, 4)], {"axis": 2, "offset": [3, 1]}),
         "from channels": ([(2, 6, 5, 5), (2, 2, 3, 5)], {"axis": 1, "offset": [2, 1, 0]}),
         "nothing": ([(2, 3, 4, 4), (2, 3, 4, 4)], {"axis": 0})}


@pytest.mark.parametrize("name", CROPS)
def test_crop_matches_the_numpy_path(name):
    shapes, params = CROPS[name]
    both_paths("Crop", shapes, {"crop_param": params})


@pytest.mark.parametrize("axis, tiles", [(1, 4), (0, 3), (-1, 2), (2, 1)])
def test_tile_matches_the_numpy_path(axis, tiles):
    both_paths("Tile", [(3, 5, 4)], {"tile_param": {"axis": axis, "tiles": tiles}})


def test_split_matches_the_numpy_path():
    results = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not fast:
                patch.setattr(onednn, "library_for", lambda layer: None)
            net = one_layer_net("Split", [(2, 3, 4)], tops=3, dtype=np.float32)
        split, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
        assert (split.fast is not None) == fast
        bottom[0].data[...] = np.arange(24).reshape(2, 3, 4)
        split.forward(bottom, top)
        for i, blob in enumerate(top):
            blob.diff[...] = i + np.arange(24).reshape(2, 3, 4)
        split.backward(top, [True], bottom)
        results.append([blob.data.copy() for blob in top] + [bottom[0].diff.copy()])
    for got, expected in zip(*results):
        np.testing.assert_array_equal(got, expected)


LRNS = {
    "across channels (AlexNet)": ((2, 7, 5, 6), dict(local_size=5, alpha=1e-2, beta=0.75, k=2)),
    "across, window over the channels": ((1, 2, 3, 3), dict(local_size=5, alpha=0.5, beta=0.75)),
    "within the channel": ((2, 3, 6, 7), dict(local_size=3, alpha=0.5, beta=0.75, norm_region="WITHIN_CHANNEL")),
    "within, window over the map": ((1, 2, 2, 2), dict(local_size=5, alpha=2, beta=0.5, norm_region="WITHIN_CHANNEL")),
}


@pytest.mark.parametrize("name", LRNS)
def test_lrn_matches_the_numpy_path_or_leaves_it_numpys(name):
    """oneDNN runs an LRN where a jit implementation of its passes exists for this CPU, else refuses it, saying
    why: its reference implementation is slower than NumPy (LRN's backward on AVX2 CPUs)."""
    shape, params = LRNS[name]
    net = one_layer_net("LRN", [shape], params={"lrn_param": params}, phase="TRAIN", dtype=np.float32)
    layer = net.layers[-1]
    if layer.fast is None:
        assert layer.onednn_refused.startswith("only oneDNN's reference implementation ("), layer.onednn_refused
        return
    both_paths("LRN", [shape], {"lrn_param": params})


def test_alexnets_lrn_runs_on_onednn_in_inference_on_every_cpu():
    """Its forward pass has a jit implementation on AVX2 as on AVX-512 CPUs (channels in whole blocks of 8, as
    AlexNet's 96 and 256); only training may need NumPy."""
    params = LRNS["across channels (AlexNet)"][1]
    net = netspec.load_net(yaml.safe_dump({"layers": [
        {"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": [2, 16, 5, 6]}}},
        {"name": "norm", "type": "LRN", "bottom": "x", "top": "y", "lrn_param": params}]}),
        phase="TEST", inference=True)
    assert net.layer_by_name["norm"].fast is not None, net.layer_by_name["norm"].onednn_refused


def deploy_unit(bn=True, scale=True, relu=True, bias=False, group=1, slope=0.0, tail="", outputs=6):
    """A deploy net: Input, a convolution and the BatchNorm, Scale and ReLU chosen, in place on its top."""
    return ("layers:\n"
            "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 4, 7, 7]}}}\n"
            f"  - {{name: conv, type: Convolution, bottom: data, top: c, convolution_param: {{num_output: {outputs}, "
            f"kernel_size: 3, pad: 1, group: {group}, bias_term: {str(bias).lower()}, weight_filler: {{type: gaussian}},"
            " bias_filler: {type: gaussian}}}\n"
            + ("  - {name: bn, type: BatchNorm, bottom: c, top: c}\n" if bn else "")
            + ("  - {name: scale, type: Scale, bottom: c, top: c, scale_param: {bias_term: true}}\n" if scale else "")
            + (f"  - {{name: relu, type: ReLU, bottom: c, top: c, relu_param: {{negative_slope: {slope}}}}}\n"
               if relu else "") + tail)


FOLDS = {  # the deploy unit's options, and the layers run as one
    "convolution, BatchNorm, Scale, ReLU": (dict(), "conv+bn+scale+relu"),
    "with a bias, grouped": (dict(bias=True, group=2), "conv+bn+scale+relu"),
    "BatchNorm alone": (dict(scale=False, relu=False), "conv+bn"),
    "convolution and ReLU": (dict(bn=False, scale=False), "conv+relu"),
    "leaky ReLU": (dict(bn=False, scale=False, slope=-0.2), "conv+relu"),
    "Scale and ReLU": (dict(bn=False), "conv+scale+relu"),
    "with a bias, depthwise": (dict(bias=True, group=4, outputs=8), "conv+bn+scale+relu"),
    "then a layer that does not fuse": (dict(relu=False, tail="  - {name: sig, type: Sigmoid, bottom: c, top: c}\n"),
                                        "conv+bn+scale"),
}
FOLD_PATHS = ["oneDNN", "NumPy", pytest.param("CuPy", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("path", FOLD_PATHS)
@pytest.mark.parametrize("name", FOLDS)
def test_folded_inference_matches_the_unfolded_net(name, path, monkeypatch):
    options, fused = FOLDS[name]
    if path == "NumPy":
        monkeypatch.setattr(onednn, "library_for", lambda layer: None)
    outputs = []
    for inference in (True, False):
        net = netspec.load_net(deploy_unit(**options), phase="TEST", seed=1, inference=inference,
                               device="gpu" if path == "CuPy" else "cpu")
        groups = re.split(r"[,;]? ", net.paths())
        assert (fused in groups) == inference and (f"{path} runs" in net.paths()) == (inference and path != "oneDNN")
        rng = np.random.default_rng(0)
        for blobs in net.params.values():
            for blob in blobs:
                blob.data[...] = net.backend.asarray(rng.uniform(0.5, 1.5, blob.shape) * rng.choice([-1, 1], blob.shape))
        if "bn" in net.params:
            net.params["bn"][1].data[...] = abs(net.params["bn"][1].data)  # variance sums
            net.params["bn"][2].data[...] = 2  # the factor: stored statistics are sums / 2
        net.blobs["data"].data[...] = net.backend.asarray(rng.standard_normal(net.blobs["data"].shape))
        net.forward()
        outputs.append(net.backend.to_host(net.blobs["c"].data).copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", FOLD_PATHS)
def test_a_scale_over_more_axes_than_the_channels_is_not_folded(path, monkeypatch):
    if path == "NumPy":
        monkeypatch.setattr(onednn, "library_for", lambda layer: None)
    text = ("layers:\n"
            "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 3, 3]}}}\n"
            "  - {name: conv, type: Convolution, bottom: data, top: c, convolution_param: {num_output: 4, "
            "kernel_size: 3, weight_filler: {type: gaussian}}}\n"
            "  - {name: bn, type: BatchNorm, bottom: c, top: c}\n"
            "  - {name: scale, type: Scale, bottom: c, top: c, scale_param: {num_axes: -1, bias_term: true,"
            " filler: {type: uniform, min: 0.5, max: 2}, bias_filler: {type: uniform}}}\n")
    outputs = []
    for inference in (True, False):
        net = netspec.load_net(text, phase="TEST", seed=1, inference=inference,
                               device="gpu" if path == "CuPy" else "cpu")
        assert "conv+bn+scale" not in net.paths() and net.params["scale"][0].shape == (4, 1, 1)
        net.params["bn"][2].data[...] = 1
        net.params["bn"][1].data[...] = 2
        net.blobs["data"].data[...] = net.backend.asarray(np.arange(54.0).reshape(2, 3, 3, 3) / 50)
        net.forward()
        outputs.append(net.backend.to_host(net.blobs["c"].data).copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


def test_an_inference_net_normalises_without_keeping_inputs():
    layers = ("layers:\n"
              "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 4, 5, 5]}}}\n"
              "  - {name: bn, type: BatchNorm, bottom: data, top: n}\n"
              "  - {name: scale, type: Scale, bottom: n, top: n, scale_param: {bias_term: true}}\n"
              "  - {name: alone, type: Scale, bottom: n, top: s}\n")
    outputs = []
    for inference in (True, False):
        net = netspec.load_net(layers, phase="TEST", seed=1, inference=inference)
        assert "bn+scale, alone" in net.paths()
        assert (net.layer_by_name["bn"].fast.saved_input is None) == inference
        rng = np.random.default_rng(0)
        for blobs in net.params.values():
            for blob in blobs:
                blob.data[...] = rng.uniform(0.5, 1.5, blob.shape)
        net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
        net.forward()
        outputs.append(net.blobs["s"].data.copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6)


RESIDUAL = """
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 8, 7, 7]}}}
  - {name: a, type: Convolution, bottom: data, top: a, convolution_param: {num_output: 8, kernel_size: 3, pad: 1}}
  - {name: a_relu, type: ReLU, bottom: a, top: a}
  - {name: b, type: Convolution, bottom: a, top: b, convolution_param: {num_output: 8, kernel_size: 3, pad: 1}}
  - {name: b_relu, type: ReLU, bottom: b, top: b}
  - {name: c, type: Convolution, bottom: b, top: c, convolution_param: {num_output: 8, kernel_size: 1}}
  - {name: bn, type: BatchNorm, bottom: c, top: c}
  - {name: scale, type: Scale, bottom: c, top: c, scale_param: {bias_term: true}}
  - {name: sum, type: Eltwise, bottom: [a, c], top: s}
  - {name: sum_relu, type: ReLU, bottom: s, top: s}
  - {name: out, type: Convolution, bottom: s, top: out, convolution_param: {num_output: 3, kernel_size: 1}}
"""


def residual_output(inference: bool, reuse_memory: bool = False, frozen: bool = False, text: str = RESIDUAL):
    """The residual block's output (``out``) for fixed weights and input, and its net."""
    net = netspec.load_net(text, phase="TEST", seed=1, inference=inference, reuse_memory=reuse_memory)
    rng = np.random.default_rng(0)
    for name, blobs in net.params.items():
        for blob in blobs:
            blob.data[...] = rng.uniform(0.5, 1.5, blob.shape) if name in ("bn", "scale") else \
                rng.standard_normal(blob.shape) * 0.3
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    if frozen:
        net.freeze()
    net.forward()
    return net.blobs["out"].data.copy(), net


PLAIN_SHORTCUT = RESIDUAL.replace("bottom: data, top: a,", "bottom: data, top: a0,").replace(
    "{name: a_relu, type: ReLU, bottom: a, top: a}", "{name: a_abs, type: AbsVal, bottom: a0, top: a}")  # (NumPy's)


@pytest.mark.parametrize(("reuse_memory", "text"), [(False, RESIDUAL), (True, RESIDUAL), (True, PLAIN_SHORTCUT)],
                         ids=["own-memory", "over-the-shortcut", "over-a-plain-shortcut"])
@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_residual_sum_and_its_relu_fold_into_the_convolution_before_it(reuse_memory, text):
    """A residual block's end (BatchNorm, Scale, the SUM with the shortcut, ReLU) runs in the convolution's
    primitive; with memory reuse the sum is written over the shortcut (its last reader), the convolution adding
    its product to the shortcut where it stands, and never over the convolution's input, which it reads as it
    writes the sum."""
    expected, _ = residual_output(inference=False, text=text)
    folded, net = residual_output(inference=True, reuse_memory=reuse_memory, text=text)
    assert "c+bn+scale+sum+sum_relu" in re.split(r"[,;]? ", net.paths()), net.paths()
    assert (onednn.layout_of(net.blobs["a"].values) is None) == (text == PLAIN_SHORTCUT)
    assert net.layer_by_name["c"].fast.accumulates == reuse_memory == net.blobs["s"].shares_data(net.blobs["a"])
    assert not onednn.may_overlap(net.blobs["s"].values, net.blobs["b"].values)
    np.testing.assert_allclose(folded, expected, rtol=1e-5, atol=1e-5)
    net.forward()  # (the shortcut's values again, not the sum's)
    np.testing.assert_allclose(net.blobs["out"].data, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blob", ["s", "a"], ids=["the-sum", "the-shortcut"])
@pytest.mark.parametrize("text", [RESIDUAL, PLAIN_SHORTCUT], ids=["held", "plain"])
@pytest.mark.parametrize("frozen", [False, True], ids=["", "frozen"])
@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_sum_written_over_the_shortcut_survives_a_new_array_given_to_either(blob, text, frozen):
    """A new array given to the sum or to its shortcut parts their data: the shortcut's values are then copied
    where the convolution adds its product."""
    expected, _ = residual_output(inference=False, text=text)
    _, net = residual_output(inference=True, reuse_memory=True, frozen=frozen, text=text)
    assert net.layer_by_name["c"].fast.accumulates
    for _ in range(2):
        net.blobs[blob].data = np.full(net.blobs[blob].shape, 5, np.float32)
        for _ in range(3):  # (a frozen net records its calls again, at the second pass from here)
            net.forward()
            np.testing.assert_allclose(net.blobs["out"].data, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("text", "fused"), [
    (RESIDUAL.replace("{name: c, type: Convolution, bottom: b,", "{name: c, type: Convolution, bottom: a,"),
     "c+bn+scale+sum+sum_relu"),  # (the shortcut the convolution's input: a sum of its own)
    (RESIDUAL.replace("scale_param: {bias_term: true}}", "scale_param: {bias_term: true}}\n"
                      "  - {name: c_relu, type: ReLU, bottom: c, top: c}"), "c+bn+scale+c_relu"),  # (the sum alone)
], ids=["shortcut-read-by-the-convolution", "relu-before-the-sum"])
@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_residual_sum_the_convolution_cannot_add_where_it_stands(text, fused):
    expected, _ = residual_output(inference=False, text=text)
    folded, net = residual_output(inference=True, reuse_memory=True, text=text)
    assert fused in re.split(r"[,;]? ", net.paths()) and "reordered" not in net.paths(), net.paths()
    assert not net.layer_by_name["c"].fast.accumulates
    np.testing.assert_allclose(folded, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_frozen_net_whose_folded_weights_are_made_writable_follows_them():
    """Weights folded with a BatchNorm are recomputed at each pass while they may change (and the pass is not
    replayed from a recording of arrays computed once)."""
    _, reference = residual_output(inference=False)
    _, net = residual_output(inference=True, reuse_memory=True, frozen=True)
    assert net.layer_by_name["c"].folds
    array = net.params["c"][0].data
    while isinstance(array, np.ndarray):
        array.flags.writeable = True
        array = array.base
    for _ in range(4):
        for model in (reference, net):
            model.params["c"][0].data[...] *= 1.5
            model.forward()
        np.testing.assert_allclose(net.blobs["out"].data, reference.blobs["out"].data, rtol=1e-5, atol=1e-5)


def test_on_numpy_a_residual_sum_runs_on_its_own(monkeypatch):
    expected, _ = residual_output(inference=False)
    monkeypatch.setattr(onednn, "library_for", lambda layer: None)
    folded, net = residual_output(inference=True, reuse_memory=True)
    assert "c+bn+scale" in net.paths() and "+sum" not in net.paths()
    np.testing.assert_allclose(folded, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_frozen_net_reorders_its_weights_once_and_refuses_writes():
    expected, _ = residual_output(inference=False)
    frozen, net = residual_output(inference=True, reuse_memory=True, frozen=True)
    np.testing.assert_allclose(frozen, expected, rtol=1e-5, atol=1e-5)
    weights = net.layer_by_name["b"].fast.operands[onednn.ARG_WEIGHTS]
    kept = weights.constant_copy.buffer
    folded = net.layer_by_name["c"].folded.arrays  # (its weights and bias with the BatchNorm and Scale in them)
    assert net.layer_by_name["c"].folds and len(folded) == 2 and not folded[0].flags.writeable
    net.forward()
    assert weights.constant_copy.buffer is kept  # (the blocked copy made at the first pass, reused)
    assert net.layer_by_name["c"].folded.arrays is folded
    np.testing.assert_allclose(net.blobs["out"].data, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="read-only"):
        net.params["b"][0].data[...] = 0


def change_weights(net, layer: str, index: int = 0) -> None:
    """Make a weight and the arrays it views writable again and change it (what a frozen net's owner might do)."""
    chain = [net.params[layer][index].data]
    while isinstance(chain[-1].base, np.ndarray):
        chain.append(chain[-1].base)
    for array in reversed(chain):
        array.flags.writeable = True
    chain[0][...] *= -1.5
    for array in chain:
        array.flags.writeable = False


@pytest.mark.parametrize("layer", ["b", "bn"], ids=["convolution", "folded batchnorm"])
@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_net_frozen_again_computes_with_the_weights_changed_in_between(layer):
    """A frozen net's weights change by freezing it again: its blocked copies (and its recording) are made anew
    from the values the weights have then."""
    _, reference = residual_output(inference=False)
    _, net = residual_output(inference=True, reuse_memory=True, frozen=True)
    for _ in range(3):  # (recorded at the second pass, replayed from the third)
        net.forward()
    for model in (reference, net):
        change_weights(model, layer)
    net.freeze()
    reference.forward()
    for _ in range(3):
        net.forward()
        np.testing.assert_allclose(net.blobs["out"].data, reference.blobs["out"].data, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_net_not_frozen_folds_the_weights_each_pass_has():
    _, reference = residual_output(inference=False)
    _, net = residual_output(inference=True, reuse_memory=True)
    assert net.layer_by_name["c"].folds
    for model in (reference, net):
        model.params["c"][0].data[...] *= -1.5
        model.params["bn"][0].data[...] *= 2
        model.forward()
    np.testing.assert_allclose(net.blobs["out"].data, reference.blobs["out"].data, rtol=1e-5, atol=1e-5)


def test_freezing_leaves_the_weights_a_python_layer_shares_writable(tmp_path, monkeypatch):
    """A Python layer's passes may change its blobs: a frozen net leaves them writable, and the blobs of the
    layers that share them too, whichever layer owns them (the Convolution then reads them at every pass)."""
    (tmp_path / "drifting.py").write_text(
        "import numpy as np\nimport netspec\n\n\n"
        "class Drift(netspec.PythonLayer):\n"
        "    def top_shapes(self, bottom_shapes):\n        return [bottom_shapes[0]]\n\n"
        "    def param_shapes(self, bottom_shapes):\n        return [(4, 3, 3, 3)]\n\n"
        "    def forward(self, bottom, top):\n"
        "        top[0].data[...] = bottom[0].data\n        self.blobs[0].data[...] += np.float32(0.01)\n\n"
        "    def backward(self, top, propagate_down, bottom):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    convolution = {"name": "conv", "type": "Convolution", "bottom": "drifted", "top": "c", "param": [{"name": "w"}],
                   "convolution_param": {"num_output": 4, "kernel_size": 3, "bias_term": False}}
    drift = {"name": "drift", "type": "Python", "bottom": "x", "top": "drifted", "param": [{"name": "w"}],
             "python_param": {"module": "drifting", "layer": "Drift"}}
    data = {"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": [2, 3, 6, 6]}}}
    for order in ([drift, convolution], [convolution | {"bottom": "x"}, drift | {"bottom": "c"}]):
        text = yaml.safe_dump({"layers": [data, *order]})
        nets = [netspec.load_net(text, phase="TEST", inference=True, seed=0, trust=Trust(python_layers=True))
                for _ in range(2)]
        nets[1].freeze()
        for number in range(4):
            for net in nets:
                net.blobs["x"].data[...] = number
                net.forward()
            np.testing.assert_allclose(nets[1].blobs["c"].data, nets[0].blobs["c"].data, rtol=1e-5, atol=1e-5)


def test_only_arrays_nothing_can_write_are_constants():
    owner = np.zeros((4, 3), dtype=np.float32)
    view = owner[1:]
    view.flags.writeable = False
    assert not onednn.constant(view)  # (the owner still writes it)
    owner.flags.writeable = False
    assert onednn.constant(view) and onednn.constant(owner)
    assert not onednn.constant(np.frombuffer(bytearray(8), dtype=np.float32))
    assert not onednn.constant(np.zeros(3))


def test_freezing_leaves_running_statistics_writable_and_refuses_a_training_net():
    text = ("layers:\n"
            "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 4, 4]}}}\n"
            "  - {name: bn, type: BatchNorm, bottom: data, top: n, batch_norm_param: {use_global_stats: false}}\n"
            "  - {name: scale, type: Scale, bottom: n, top: s}\n")
    net = netspec.load_net(text, phase="TEST", inference=True)
    net.freeze()
    net.blobs["data"].data[...] = np.arange(96.0).reshape(2, 3, 4, 4)
    net.forward()
    assert net.params["bn"][2].data[0] == 1 and not net.params["scale"][0].data.flags.writeable
    with pytest.raises(ValueError, match="only an inference net"):
        netspec.load_net(text, phase="TEST").freeze()


def test_an_inference_net_refuses_backward():
    net = netspec.load_net(deploy_unit(), phase="TEST", inference=True)
    with pytest.raises(RuntimeError, match="built for inference"):
        net.backward()


def test_a_training_net_does_not_fold_its_convolutions():
    net = netspec.load_net(deploy_unit(), phase="TEST")
    assert "conv+" not in net.paths()


DECONVOLUTIONS = {
    "FCN's upsampling by 2": ((2, 3, 5, 5), dict(num_output=3, group=3, kernel_size=4, stride=2, pad=1,
                                                 weight_filler={"type": "bilinear"})),
    "with a bias, grouped": ((1, 4, 4, 3), dict(num_output=6, group=2, kernel_size=3, stride=2)),
    "1x1, batch 1": ((1, 5, 3, 3), dict(num_output=2, kernel_size=1)),
    "stride over kernel, padding": ((2, 2, 4, 4), dict(num_output=3, kernel_size=2, stride=3, pad=1)),
}


@pytest.mark.parametrize("name", DECONVOLUTIONS)
def test_deconvolution_matches_the_numpy_path(name):
    shape, params = DECONVOLUTIONS[name]
    both_paths("Deconvolution", [shape], {"convolution_param": params})


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_spp_on_onednn_pools_matches_numpy(pool):
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9))
    results = []
    for dtype in (np.float32, np.float64):
        net = one_layer_net("SPP", [x.shape], params={"spp_param": {"pyramid_height": 3, "pool": pool}},
                            bottoms=[x], dtype=dtype)
        layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
        assert all((p.fast is not None) == (dtype == np.float32) for p, _ in layer.pools)
        layer.forward(bottom, top)
        top[0].diff[...] = np.linspace(-1, 1, top[0].count).reshape(top[0].shape)
        layer.backward(top, [True], bottom)
        results.append([top[0].data.copy(), bottom[0].diff.copy()])
    for got, expected in zip(*results):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


GEOMETRIES = {
    "3x3 pad 1": ((2, 3, 8, 8), dict(num_output=4, kernel_size=3, pad=1)),
    "1x1": ((2, 5, 6, 7), dict(num_output=3, kernel_size=1)),
    "stride over kernel": ((2, 3, 11, 9), dict(num_output=4, kernel_size=2, stride=3)),
    "pad over half the kernel": ((1, 2, 5, 5), dict(num_output=3, kernel_size=3, pad=2)),
    "groups": ((2, 6, 7, 7), dict(num_output=4, kernel_size=3, group=2)),
    "depthwise": ((2, 8, 6, 6), dict(num_output=8, kernel_size=3, pad=1, group=8)),
    "depthwise, stride 2": ((2, 8, 7, 8), dict(num_output=8, kernel_size=3, pad=1, stride=2, group=8)),
    "depthwise, 2 outputs a channel": ((2, 4, 6, 5), dict(num_output=8, kernel_size=3, pad=1, group=4)),
    "dilation": ((1, 4, 11, 10), dict(num_output=6, kernel_size=3, dilation=2, pad=1)),
    "batch 1, no bias": ((1, 3, 9, 9), dict(num_output=5, kernel_size=4, stride=2, bias_term=False)),
    "rectangular": ((2, 3, 10, 7), dict(num_output=4, kernel_h=3, kernel_w=2, pad_h=1, pad_w=0, stride_h=2,
                                          stride_w=1)),
}


POOLS = {
    "MAX 2x2": ((2, 3, 8, 8), dict(pool="MAX", kernel_size=2, stride=2)),
    "MAX 3x3/2, ceil overhang": ((2, 3, 7, 8), dict(pool="MAX", kernel_size=3, stride=2)),
    "MAX padded": ((1, 4, 9, 9), dict(pool="MAX", kernel_size=3, stride=2, pad=1)),
    "MAX stride over kernel": ((2, 2, 11, 11), dict(pool="MAX", kernel_size=2, stride=3)),
    "AVE 3x3/2, ceil overhang": ((2, 3, 8, 8), dict(pool="AVE", kernel_size=3, stride=2)),
    "AVE padded": ((1, 4, 7, 9), dict(pool="AVE", kernel_size=3, stride=2, pad=1)),
    "AVE global": ((2, 5, 6, 6), dict(pool="AVE", global_pooling=True)),
    "MAX adaptive, dividing": ((2, 3, 8, 9), dict(pool="MAX", output_size=[4, 3])),
    "AVE adaptive, dividing": ((2, 3, 8, 9), dict(pool="AVE", output_h=2, output_w=1)),
}


@pytest.mark.parametrize("name", POOLS)
def test_pooling_matches_the_numpy_path_ties_included(name):
    shape, params = POOLS[name]

    def run(fast: bool):
        layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": list(shape)}}},
                  {"name": "pool", "type": "Pooling", "bottom": "x", "top": "y", "pooling_param": params}]
        net = netspec.load_net(yaml.safe_dump({"force_backward": True, "layers": layers}))
        pool, x, y = net.layer_by_name["pool"], net.blobs["x"], net.blobs["y"]
        assert pool.fast is not None
        if not fast:
            pool.fast = None
        rng = np.random.default_rng(0)
        x.data[...] = np.maximum(rng.standard_normal(shape), 0)  # zeros, as after a ReLU: ties in MAX windows
        pool.forward([x], [y])
        y.diff[...] = rng.standard_normal(y.shape)
        pool.backward([y], [True], [x])
        return y.data.copy(), x.diff.copy()

    for got, expected in zip(run(fast=True), run(fast=False)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


INNER_PRODUCTS = {
    "4-D bottom": ((4, 3, 5, 5), dict(num_output=7)),
    "axis 2": ((2, 3, 6), dict(num_output=4, axis=2)),
    "batch 1, no bias": ((1, 9), dict(num_output=5, bias_term=False)),
}


@pytest.mark.parametrize("name", INNER_PRODUCTS)
def test_inner_product_matches_the_numpy_path(name):
    shape, params = INNER_PRODUCTS[name]

    def run(fast: bool):
        layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": list(shape)}}},
                  {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y",
                   "inner_product_param": {**params, "weight_filler": {"type": "gaussian"},
                                           "bias_filler": {"type": "gaussian"}}}]
        net = netspec.load_net(yaml.safe_dump({"force_backward": True, "layers": layers}), seed=1)
        ip, x, y = net.layer_by_name["ip"], net.blobs["x"], net.blobs["y"]
        assert ip.fast is not None
        if not fast:
            ip.fast = None
        rng = np.random.default_rng(0)
        x.data[...] = rng.standard_normal(shape)
        ip.forward([x], [y])
        y.diff[...] = rng.standard_normal(y.shape)
        for _ in range(2):  # parameter diffs accumulate
            ip.backward([y], [True], [x])
        return [y.data.copy(), x.diff.copy(), *(blob.diff.copy() for blob in ip.blobs)]

    for got, expected in zip(run(fast=True), run(fast=False)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_transposed_inner_product_keeps_the_numpy_path():
    layers = [{"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": [2, 3]}}},
              {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y",
               "inner_product_param": {"num_output": 4, "transpose": True}}]
    assert netspec.load_net(yaml.safe_dump({"layers": layers})).layer_by_name["ip"].fast is None


@pytest.mark.parametrize("name", GEOMETRIES)
def test_convolution_matches_the_numpy_path(name):
    shape, params = GEOMETRIES[name]
    fast_net, numpy_net = conv_net(shape, **params), conv_net(shape, **params)
    assert fast_net.layer_by_name["conv"].fast is not None
    fast, plain = passes(fast_net, fast=True), passes(numpy_net, fast=False)
    for key in plain:
        np.testing.assert_allclose(fast[key], plain[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_a_layer_onednn_refuses_runs_alone_on_numpy_and_is_named(monkeypatch):
    def refuse(*args, **kwargs):
        raise onednn.OneDnnError("dnnl_convolution_forward_primitive_desc_create failed (oneDNN status 3)")

    monkeypatch.setattr(primitives, "Convolution", refuse)
    net = conv_net((1, 2, 5, 5), num_output=2, kernel_size=3)
    assert net.layer_by_name["conv"].fast is None
    assert net.paths() == (f"oneDNN {onednn.library().version} for no layer; NumPy for the rest (oneDNN refused "
                           "conv: dnnl_convolution_forward_primitive_desc_create failed (oneDNN status 3))")
    plain = passes(conv_net((1, 2, 5, 5), num_output=2, kernel_size=3), fast=False)
    for key, value in passes(net, fast=False).items():
        np.testing.assert_allclose(value, plain[key], err_msg=key)


def test_a_bottom_without_gradient_keeps_its_diff():
    net = conv_net((2, 1, 8, 8), propagate_down=False, num_output=3, kernel_size=3)
    result = passes(net, fast=True, times=1)
    assert (result["bottom diff"] == 7).all()


def test_float64_nets_and_the_switch_use_numpy(monkeypatch):
    assert conv_net((1, 2, 5, 5), dtype=np.float64, num_output=2, kernel_size=3).layer_by_name["conv"].fast is None
    assert "oneDNN 3.2" in conv_net((1, 2, 5, 5), num_output=2, kernel_size=3).paths()
    result = subprocess.run([sys.executable, "-m", "netspec", "time", ROOT / "configs/lenet/lenet_timing.yaml",
                             "-n", "1", "--warmup", "0"], capture_output=True, text=True,
                            env={**os.environ, "NETSPEC_ONEDNN": "0"})
    assert result.returncode == 0, result.stderr
    assert "paths: NumPy (oneDNN off: NETSPEC_ONEDNN=0)" in result.stdout


def test_a_library_that_is_missing_leaves_the_numpy_path(monkeypatch, tmp_path):
    monkeypatch.setattr(netspec.threads, "onednn_path", lambda: str(tmp_path / "libdnnl.so.3"))
    onednn._load.cache_clear()
    try:
        assert onednn.library() is None
        assert onednn.why_unavailable() == "libdnnl.so.3 is not installed (pip install onednn-cpu-gomp)"
        net = conv_net((1, 2, 5, 5), num_output=2, kernel_size=3)
        assert net.layer_by_name["conv"].fast is None and net.paths().startswith("NumPy (oneDNN off")
        (tmp_path / "libdnnl.so.3").write_bytes(b"not a library")
        onednn._load.cache_clear()
        assert onednn.library() is None and "did not load" in onednn.why_unavailable()
    finally:
        onednn._load.cache_clear()


def test_the_paths_line_of_a_large_net_names_a_few_layers_and_counts_the_others():
    net = netspec.load_net(str(ROOT / "configs" / "resnet50" / "resnet50_deploy.yaml"), phase="TEST", inference=True)
    line = net.paths()
    shown = LISTED - 2
    listed = re.fullmatch(rf"oneDNN [\d.]+ for (\d+) layers: ((?:[^,]+, ){{{shown - 1}}}[^,]+) and (\d+) more "
                          r"\(\d+ blobs held in its blocked layouts between them\); NumPy for the rest", line)
    assert listed is not None, line
    assert int(listed[1]) == int(listed[3]) + shown > 50
    assert listed[2].startswith("conv1+bn_conv1+scale_conv1+conv1_relu")


@pytest.mark.parametrize("isa", ["", "AVX2"])  # (the CPU's best, and AVX2's: an empty value leaves oneDNN's own)
@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_the_reference_nets_train_without_reference_kernels(isa):
    """Every primitive on the training path of the reference nets runs a jit implementation (oneDNN's names for
    its slow, portable ones begin ref or simple_): pooling in channel blocks where the plain layout has none,
    LRN on NumPy where only a reference one would run it."""
    for net in ("lenet/lenet_timing", "cifar10/cifar10_quick_timing", "cifar10/cifar10_full_timing"):
        result = subprocess.run([sys.executable, "-m", "netspec", "time", ROOT / "configs" / f"{net}.yaml", "-n", "1",
                                 "--warmup", "0"], capture_output=True, text=True,
                                env={**os.environ, "ONEDNN_VERBOSE": "1", "ONEDNN_MAX_CPU_ISA": isa})
        assert result.returncode == 0, result.stderr
        runs = [line.split(",") for line in result.stdout.splitlines() if line.startswith("onednn_verbose,")]
        kernels = {(fields[3], fields[4]) for fields in runs if len(fields) > 5 and fields[1] == "exec"}
        assert kernels and not [kernel for kernel in kernels if kernel[1].startswith(("ref", "simple_"))], (net, kernels)


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_an_isa_cap_onednn_cannot_follow_is_said_once_on_the_paths_line():
    """A name oneDNN does not know, or an ISA beyond this CPU's: one note naming what runs instead."""
    effective = onednn.library().dll.dnnl_get_effective_cpu_isa()
    beyond = next((name for name, bits in onednn.ISA_BITS.items() if effective & bits != bits), None)
    runs = next(name for name, bits in onednn.ISA_BITS.items() if bits == effective)
    cases = {"FOO": f"ONEDNN_MAX_CPU_ISA=FOO names no ISA oneDNN knows, so it runs {runs}; it knows SSE41, "}
    if beyond is not None:  # (every CPU but the newest lacks one)
        cases[beyond] = f"ONEDNN_MAX_CPU_ISA={beyond} is more than this CPU has: oneDNN runs "
    for asked, note in cases.items():
        result = subprocess.run([sys.executable, "-m", "netspec", "time", ROOT / "configs/lenet/lenet_timing.yaml",
                                 "-n", "1", "--warmup", "0"], capture_output=True, text=True,
                                env={**os.environ, "ONEDNN_MAX_CPU_ISA": asked})
        assert result.returncode == 0, result.stderr
        assert result.stdout.count(note) == 1 and "paths: oneDNN " in result.stdout, result.stdout
