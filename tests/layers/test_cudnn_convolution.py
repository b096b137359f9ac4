"""Convolution on cuDNN (netspec.engine.cudnn_conv) against im2col and cuBLAS, the path it falls back to, on every
geometry Caffe's convolutions take (groups, depthwise, dilation, stride, asymmetric padding, a kernel overhanging
the input); and the fallback decisions, which the GPU stand-in checks in CI.  Marked ``gpu``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import cudnn_conv, half
from netspec.engine.backend import Backend

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


class EmulatedGraphs:
    """What :class:`netspec.engine.cudnn_conv.Convolution` does, computed by netspec's NumPy im2col (groups of 1):
    the decisions around cuDNN's graphs (what is fused, what the net then runs) checked on the stand-in."""

    workspace_bytes = 0

    def __init__(self, xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, precision="fp32", bias=False,
                 relu=None):
        from netspec.layers.convolution import BATCH_OUTER, ConvGeometry

        self.xp = xp  # (CuPy on a GPU, the stand-in in CI: the arrays come to the host and go back)

        self.geo = ConvGeometry(tuple(w_shape[2:]), tuple(pad), tuple(stride), tuple(dilation), tuple(y_shape[2:]),
                                BATCH_OUTER, tuple(far_pad))
        self.shapes, self.fused = (tuple(x_shape), tuple(w_shape)), {"bias": bias, "relu": relu}
        self.calls: list[tuple[str, int]] = []
        self.half = precision if precision in half.PRECISIONS else None  # (its arrays then hold 16-bit floats)

    def run(self, name, arrays, workspace):
        from netspec.layers.convolution import col2im, im2col

        *inputs, out = arrays
        self.calls.append((name, len(arrays)))
        host = [self.xp.asnumpy(array) for array in inputs]
        if self.half:
            host = [(bits.astype(np.uint32) << 16).view(np.float32) if self.half == "bf16-mixed"
                    else bits.view(np.float16) for bits in host]
        host = [array.astype(np.float64) for array in host]
        k = self.shapes[1][0]
        if name == "fprop":
            cols = im2col(np, host[0], self.geo).reshape(-1, host[0].shape[0] * math.prod(self.geo.out))
            y = (host[1].reshape(k, -1) @ cols).reshape(k, host[0].shape[0], *self.geo.out).transpose(1, 0, 2, 3)
            if self.fused["bias"]:
                y = y + host[2]
            if self.fused["relu"] is not None:
                y = np.where(y > 0, y, y * self.fused["relu"])
        elif name == "wgrad":
            cols = im2col(np, host[0], self.geo).reshape(-1, host[0].shape[0] * math.prod(self.geo.out))
            y = (host[1].transpose(1, 0, 2, 3).reshape(k, -1) @ cols.T).reshape(self.shapes[1])
        else:
            dcols = host[1].reshape(k, -1).T @ host[0].transpose(1, 0, 2, 3).reshape(k, -1)
            y = col2im(np, dcols.reshape(self.shapes[0][1], *self.geo.kernel, self.shapes[0][0], *self.geo.out),
                       self.shapes[0], self.geo)
        if self.half:
            bits = np.empty(y.size, dtype=np.uint16)
            half.narrow(np, np.ascontiguousarray(y, dtype=np.float32), bits, self.half)
            y = bits.reshape(y.shape)
        out[...] = self.xp.asarray(y.astype(out.dtype))


def relu_net(phase: str, relu_slope: float, bias: bool = True) -> str:
    layers = [{"name": "x", "type": "Input", "top": "x", "input_param": {"shape": {"dim": [2, 3, 6, 6]}}},
              {"name": "conv", "type": "Convolution", "bottom": "x", "top": "y",
               "convolution_param": {"num_output": 4, "kernel_size": 3, "pad": 1, "bias_term": bias,
                                     "weight_filler": {"type": "gaussian", "std": 0.5},
                                     "bias_filler": {"type": "uniform", "min": -0.5, "max": 0.5}}},
              {"name": "relu", "type": "ReLU", "bottom": "y", "top": "y", "relu_param": {"negative_slope": relu_slope}},
              {"name": "ip", "type": "InnerProduct", "bottom": "y", "top": "z",
               "inner_product_param": {"num_output": 3, "weight_filler": {"type": "xavier"}}}]
    if phase == "TRAIN":
        layers.append({"name": "loss", "type": "EuclideanLoss", "bottom": ["z", "t"], "top": "loss"})
        layers[0] = {**layers[0], "top": ["x", "t"], "input_param": {"shape": [{"dim": [2, 3, 6, 6]}, {"dim": [2, 3]}]}}
    return yaml.safe_dump({"name": "relu_net", "force_backward": True, "layers": layers})  # (x's gradient too)


def train_pass(monkeypatch, slope: float, graphs, bias: bool = True, precision: str = "fp32"):
    """A forward and backward pass of a conv + ReLU net on the stand-in, cuDNN emulated by ``graphs`` (None:
    cuDNN off): the net, and every blob's data and diff and every parameter's diff on the host."""
    monkeypatch.setattr(cudnn_conv, "runs_on", lambda xp: graphs is not None)
    monkeypatch.setattr(cudnn_conv, "graphs_for", graphs)
    monkeypatch.setattr(cudnn_conv, "version", lambda: "cuDNN 9.0.0 (frontend 1.23.0)")
    backend = Backend("gpu", seed=3)
    backend.precision = precision
    net = netspec.load_net(relu_net("TRAIN", slope, bias), phase="TRAIN", device="gpu", backend=backend)
    rng = np.random.default_rng(4)
    for name in ("x", "t"):
        net.blobs[name].data[...] = net.backend.asarray(rng.standard_normal(net.blobs[name].shape))
    net.forward()
    for blob in (blob for blobs in net.params.values() for blob in blobs):
        blob.diff[...] = 0.25  # (the gradients are added to what the diffs hold)
    net.backward()
    arrays = [array for blob in net.blobs.values() for array in (blob.data, blob.diff)]
    arrays += [blob.diff for blobs in net.params.values() for blob in blobs]
    return net, [net.backend.to_host(array).astype(np.float64) for array in arrays]


def emulated(refuse_fusion: bool = False):
    """A ``graphs_for`` that builds :class:`EmulatedGraphs` (refusing a fused ReLU where asked), and the graphs
    it built."""
    built = []

    def graphs_for(xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, dtype, deterministic=False,
                   precision="fp32", passes=cudnn_conv.PASSES, bias=False, relu=None):
        if refuse_fusion and relu is not None:
            raise cudnn_conv.GraphRefused("fprop: no engine fuses it")
        built.append(EmulatedGraphs(xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, precision, bias,
                                    relu))
        return built[-1]

    return graphs_for, built


@pytest.mark.parametrize("slope", [0.0, 0.25, -0.5])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("refuse_fusion", [False, True], ids=["fused", "refused"])
def test_training_fuses_bias_and_relu_into_cudnns_forward_graph_and_still_runs_relus_backward(slope, bias,
                                                                                              refuse_fusion,
                                                                                              monkeypatch):
    """A negative slope is not fused: the ReLU's backward pass reads the input its forward pass keeps."""
    graphs_for, built = emulated(refuse_fusion)
    net, on_cudnn = train_pass(monkeypatch, slope, graphs_for, bias)
    _, on_cublas = train_pass(monkeypatch, slope, None, bias)
    layer = net.layer_by_name["conv"]
    if refuse_fusion or slope < 0:
        assert net.absorbed_by == {} and layer.cudnn.fused == {"bias": bias, "relu": None}
        assert layer.cudnn.calls[0] == ("fprop", 3 + bias)
        unfused = "(bias or ReLU after cuDNN's product, unfused: conv: fprop: no engine fuses it)"
        assert (unfused in net.paths()) == (refuse_fusion and slope >= 0), net.paths()
    else:
        assert net.absorbed_by == {2: 1} and layer.cudnn.fused == {"bias": bias, "relu": slope}
        assert layer.cudnn.calls[0] == ("fprop", 3 + bias)  # (x, w, the bias, y: one call)
        assert net.paths().startswith("cuDNN 9.0.0 (frontend 1.23.0) for conv+relu; CuPy for the rest"), net.paths()
    assert [name for name, _ in layer.cudnn.calls] == ["fprop", "wgrad", "dgrad"]
    for ours, theirs in zip(on_cudnn, on_cublas, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_an_inference_net_folds_bias_and_relu_into_cudnns_forward_graph(monkeypatch):
    graphs_for, built = emulated()
    monkeypatch.setattr(cudnn_conv, "runs_on", lambda xp: True)
    monkeypatch.setattr(cudnn_conv, "graphs_for", graphs_for)
    net = netspec.load_net(relu_net("TEST", 0.0), phase="TEST", device="gpu", seed=3, inference=True)
    net.blobs["x"].data[...] = net.backend.asarray(np.random.default_rng(4).standard_normal((2, 3, 6, 6)))
    net.forward()
    fused = net.backend.to_host(net.blobs["z"].data)
    monkeypatch.setattr(cudnn_conv, "runs_on", lambda xp: False)
    plain = netspec.load_net(relu_net("TEST", 0.0), phase="TEST", device="gpu", seed=3, inference=True)
    plain.blobs["x"].data[...] = net.blobs["x"].data
    plain.forward()
    layer = net.layer_by_name["conv"]
    assert layer.cudnn.fused == {"bias": True, "relu": 0.0} and layer.cudnn.calls == [("fprop", 4)]
    np.testing.assert_allclose(fused, plain.backend.to_host(plain.blobs["z"].data), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("slope", [0.0, 0.25])
def test_cudnn_with_bias_and_relu_fused_trains_as_im2col_does(slope, monkeypatch):
    """On a GPU: cuDNN's graphs, the bias and ReLU fused into the forward one where cuDNN has an engine for it
    (else named on the paths line), against im2col and cuBLAS."""
    if not cudnn_conv.runs_on(Backend("gpu").xp):
        pytest.skip(f"cuDNN runs on a GPU only, with its frontend ({cudnn_conv.unavailable() or 'the stand-in'})")
    net, on_cudnn = train_pass(monkeypatch, slope, cudnn_conv.graphs_for)
    layer = net.layer_by_name["conv"]
    assert layer.cudnn is not None, f"cuDNN refused the convolution: {layer.cudnn_refused}"
    if layer.cudnn_unfused:
        assert f"unfused: conv: {layer.cudnn_unfused}" in net.paths(), net.paths()
    else:
        assert net.absorbed_by == {2: 1} and "for conv+relu;" in net.paths(), net.paths()
    _, on_cublas = train_pass(monkeypatch, slope, None)
    for ours, theirs in zip(on_cudnn, on_cublas, strict=True):
        assert np.linalg.norm(ours - theirs) <= 3e-5 * np.linalg.norm(theirs)


def test_the_graphs_kept_are_the_latest_asked_for(monkeypatch):
    """A process asked for many input sizes (a server predicting on images of every size) keeps the graphs of
    the KEPT_GRAPHS geometries asked for last, a refusal's reason among them."""
    made = []

    class Counted:
        def __init__(self, xp, x_shape, *args):
            if x_shape[0] == 3:
                raise cudnn_conv.GraphRefused("fprop: no engine")
            made.append(x_shape[0])

    monkeypatch.setattr(cudnn_conv, "Convolution", Counted)
    monkeypatch.setattr(cudnn_conv, "KEPT_GRAPHS", 4)
    monkeypatch.setattr(cudnn_conv, "_built", cudnn_conv.OrderedDict())
    xp = Backend("gpu").xp

    def ask(batch):
        return cudnn_conv.graphs_for(xp, (batch, 3, 8, 8), (4, 3, 3, 3), (batch, 4, 6, 6), (0, 0), (0, 0), (1, 1),
                                     (1, 1), np.float32)

    for batch in (1, 2, 4, 5, 1, 6):  # (1 asked again before 6: 2 goes, not 1)
        ask(batch)
    assert made == [1, 2, 4, 5, 6] and len(cudnn_conv._built) == 4
    ask(1)
    ask(2)
    assert made == [1, 2, 4, 5, 6, 2]
    for _ in range(2):
        with pytest.raises(cudnn_conv.GraphRefused, match="fprop: no engine"):
            ask(3)


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize("graphs", ["emulated", "cudnn"])
def test_mixed_convolutions_take_their_operands_rounded_to_16_bits(graphs, precision, monkeypatch):
    """Under precision bf16-mixed (fp16-mixed) cuDNN's graphs read and write bfloat16 (float16), emulated or
    cuDNN's own on a GPU: the layer rounds its inputs, widens the results (adding the weights' gradient to the
    diff), and computes what im2col and cuBLAS compute from the same rounded operands, to the 16-bit float's
    precision; fp32 differs by more than float32's."""
    if graphs == "emulated":
        graphs_for, _ = emulated()
    elif cudnn_conv.runs_on(Backend("gpu").xp):
        graphs_for = cudnn_conv.graphs_for
    else:
        pytest.skip(f"cuDNN runs on a GPU only, with its frontend ({cudnn_conv.unavailable() or 'the stand-in'})")
    net, on_cudnn = train_pass(monkeypatch, 0.0, graphs_for, precision=precision)
    assert net.layer_by_name["conv"].cudnn.half == precision
    _, on_cublas = train_pass(monkeypatch, 0.0, None, precision=precision)
    _, in_fp32 = train_pass(monkeypatch, 0.0, None)
    for ours, theirs, exact in zip(on_cudnn, on_cublas, in_fp32, strict=True):
        scale = np.abs(exact).max() + 1e-30
        assert np.abs(ours - theirs).max() <= 2 ** -6 * scale
        assert np.abs(theirs - exact).max() <= 2 ** -5 * scale
    assert max(np.abs(ours - exact).max() / (np.abs(exact).max() + 1e-30)
               for ours, exact in zip(on_cudnn, in_fp32)) > 1e-5


def test_a_mixed_backward_pass_rounds_each_operand_once(monkeypatch):
    """The gradients' two graphs share the top's gradient: under bf16-mixed a convolution's backward pass rounds
    x, dy and w once each (three rounding kernels, not four)."""
    graphs_for, _ = emulated()
    net, _ = train_pass(monkeypatch, 0.0, graphs_for, precision="bf16-mixed")
    rounded = []
    narrow = half.narrow
    monkeypatch.setattr(half, "narrow", lambda xp, x, out, precision: (rounded.append(x.shape),
                                                                        narrow(xp, x, out, precision)))
    index = net.layers.index(net.layer_by_name["conv"])
    net.layers[index].backward(net.top_blobs[index], [True], net.bottom_blobs[index])
    x, dy, w = net.blobs["x"].shape, net.blobs["y"].shape, net.params["conv"][0].shape
    assert rounded == [x, dy, w, w, x]  # (then the emulated graphs round their results, the gradients of w and x)
