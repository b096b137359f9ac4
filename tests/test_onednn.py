"""The oneDNN fast path: the same results as the NumPy path for every geometry of Convolution, Pooling and
InnerProduct, and the NumPy path whenever oneDNN is off, missing, or asked for float64."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import onednn

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")


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


GEOMETRIES = {
    "3x3 pad 1": ((2, 3, 8, 8), dict(num_output=4, kernel_size=3, pad=1)),
    "1x1": ((2, 5, 6, 7), dict(num_output=3, kernel_size=1)),
    "stride over kernel": ((2, 3, 11, 9), dict(num_output=4, kernel_size=2, stride=3)),
    "pad over half the kernel": ((1, 2, 5, 5), dict(num_output=3, kernel_size=3, pad=2)),
    "groups": ((2, 6, 7, 7), dict(num_output=4, kernel_size=3, group=2)),
    "depthwise": ((2, 8, 6, 6), dict(num_output=8, kernel_size=3, pad=1, group=8)),
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
