"""Convolution on cuDNN (netspec.engine.cudnn_conv) against im2col and cuBLAS, the path it falls back to, on every
geometry Caffe's convolutions take (groups, depthwise, dilation, stride, asymmetric padding, a kernel overhanging
the input); and the fallback decisions, which the GPU stand-in checks in CI.  Marked ``gpu``."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import cudnn_conv

pytestmark = pytest.mark.gpu

GEOMETRIES = {  # name: (bottom shape, convolution_param)
    "plain": ((4, 3, 9, 9), {"num_output": 8, "kernel_size": 3, "pad": 1}),
    "strided-dilated": ((2, 4, 11, 13), {"num_output": 6, "kernel_size": 3, "pad": [1, 2], "stride": [2, 1],
                                         "dilation": [1, 2]}),
    "grouped": ((2, 4, 9, 9), {"num_output": 8, "kernel_size": 5, "pad": 2, "group": 2}),
    "depthwise": ((2, 6, 8, 8), {"num_output": 6, "kernel_size": 3, "pad": 1, "group": 6}),
    "overhanging": ((2, 3, 2, 2), {"num_output": 4, "kernel_size": 3, "stride": 2}),  # (out 1x1, reading past)
    "pointwise-strided": ((2, 8, 7, 7), {"num_output": 4, "kernel_size": 1, "stride": 2, "bias_term": False}),
}
# geometries cuDNN may have no float32 engine for (more padding past the far edge than before the near one): they
# must then run on im2col, named on the paths line
MAY_REFUSE = {"overhanging"}


def conv_net(shape, param) -> str:
    return yaml.safe_dump({"name": "conv", "layers": [
        {"name": "x", "type": "Input", "top": "x", "input_param": {"shape": {"dim": list(shape)}}},
        {"name": "conv", "type": "Convolution", "bottom": "x", "top": "y", "convolution_param": param}]})


def passes(shape, param):
    """The conv layer of a one-layer GPU net, and its top, bottom diff and parameter diffs after a forward and a
    backward pass from fixed values (the parameter diffs holding 0.5 first: the gradients are added to them)."""
    net = netspec.load_net(conv_net(shape, param), phase="TRAIN", device="gpu", seed=0)
    rng = np.random.default_rng(1)
    layer = net.layer_by_name["conv"]
    net.blobs["x"].data[...] = net.backend.asarray(rng.standard_normal(shape).astype(np.float32))
    for blob in net.params["conv"]:
        blob.data[...] = net.backend.asarray(rng.standard_normal(blob.shape).astype(np.float32))
        blob.diff[...] = 0.5
    bottom, top = net.bottom_blobs[1], net.top_blobs[1]
    layer.forward(bottom, top)
    top[0].diff[...] = net.backend.asarray(rng.standard_normal(top[0].shape).astype(np.float32))
    layer.backward(top, [True], bottom)
    arrays = [top[0].data, bottom[0].diff] + [blob.diff for blob in net.params["conv"]]
    return layer, [net.backend.to_host(array).astype(np.float64) for array in arrays], net


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_cudnn_computes_what_im2col_and_cublas_compute(geometry, monkeypatch):
    shape, param = GEOMETRIES[geometry]
    layer, on_cudnn, net = passes(shape, param)
    if not cudnn_conv.runs_on(net.backend.xp):
        pytest.skip(f"cuDNN runs on a GPU only, with its frontend ({cudnn_conv.unavailable() or 'the stand-in'})")
    if geometry in MAY_REFUSE and layer.cudnn is None:  # (then named, with cuDNN's reason)
        assert f"cuDNN refused conv: {layer.cudnn_refused}" in net.paths(), net.paths()
    else:
        assert layer.cudnn is not None, f"cuDNN refused {geometry}: {layer.cudnn_refused}"
        assert "for conv;" in net.paths(), net.paths()
    monkeypatch.setattr(cudnn_conv, "runs_on", lambda xp: False)
    layer, on_cublas, _ = passes(shape, param)
    assert layer.cudnn is None
    for name, ours, theirs in zip(["top", "bottom diff", "weights diff", "bias diff"], on_cudnn, on_cublas):
        error = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
        assert error <= 3e-5, f"{name}: cuDNN and im2col differ by {error:.1e} of its norm"  # (TF32: 1e-4 or more)


def test_a_geometry_cudnn_refuses_runs_on_cublas_named_on_the_paths_line(monkeypatch):
    """The decision the stand-in can check: cuDNN offered (as on a GPU with it) but refusing the geometry."""
    def refuse(*args, **kwargs):
        raise cudnn_conv.GraphRefused("fprop: no engine supports it")

    monkeypatch.setattr(cudnn_conv, "runs_on", lambda xp: True)
    monkeypatch.setattr(cudnn_conv, "graphs_for", refuse)
    monkeypatch.setattr(cudnn_conv, "version", lambda: "cuDNN 9.0.0 (frontend 1.23.0)")
    layer, values, net = passes(*GEOMETRIES["grouped"])
    assert layer.cudnn is None and layer.cudnn_refused == "fprop: no engine supports it"
    assert net.paths() == ("cuDNN 9.0.0 (frontend 1.23.0) for no layer; CuPy for the rest (cuDNN refused conv: fprop: "
                           "no engine supports it)")
    assert all(np.isfinite(array).all() for array in values)


@pytest.mark.parametrize(("setting", "why"), [
    ("off", "off (NETSPEC_CUDNN=0)"),
    ("missing", "the cuDNN frontend cannot be imported"),
])
def test_without_cudnn_unavailable_says_why(setting, why, monkeypatch):
    cudnn_conv._frontend.cache_clear()
    if setting == "off":
        monkeypatch.setenv(cudnn_conv.ENVIRONMENT, "0")
    else:
        monkeypatch.setitem(__import__("sys").modules, "cudnn", None)  # (an import of it raises ImportError)
    try:
        assert cudnn_conv.unavailable().startswith(why)
    finally:
        cudnn_conv._frontend.cache_clear()
