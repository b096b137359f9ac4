"""Blobs held in oneDNN's blocked layouts between the layers it runs: the same numbers as plain arrays, the plain
array brought up to date for every reader and every write through it seen, and no more memory."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import onednn, primitives
from netspec.engine.blob import Blob
from netspec.engine.trust import Trust

# (held layouts are oneDNN's; without it, nothing is held: the last test, which runs everywhere)
needs_onednn = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")


def filled(kind="gaussian"):
    return {"type": kind, "std": 0.1} if kind == "gaussian" else {"type": kind}


def residual_net(channels: int = 16, loss: bool = True) -> str:
    """Convolution, BatchNorm, Scale and ReLU in place, a Split into a branch and the identity, their Eltwise sum,
    MAX pooling with Caffe's ceil overhang, LRN, AVE pooling, a convolution to 20 channels (padded in blocks),
    and a loss (or a Softmax) over an InnerProduct."""
    conv = {"num_output": channels, "kernel_size": 3, "pad": 1, "weight_filler": filled(), "bias_filler": filled()}
    layers = [
        {"name": "data", "type": "Input", "top": ["x", "label"],
         "input_param": {"shape": [{"dim": [4, 3, 13, 13]}, {"dim": [4]}]}},
        {"name": "conv1", "type": "Convolution", "bottom": "x", "top": "c1", "convolution_param": conv},
        {"name": "bn1", "type": "BatchNorm", "bottom": "c1", "top": "c1"},
        {"name": "scale1", "type": "Scale", "bottom": "c1", "top": "c1", "scale_param": {"bias_term": True}},
        {"name": "relu1", "type": "ReLU", "bottom": "c1", "top": "c1"},
        {"name": "conv2", "type": "Convolution", "bottom": "c1", "top": "c2", "convolution_param": conv},
        {"name": "sum", "type": "Eltwise", "bottom": ["c1", "c2"], "top": "s"},
        {"name": "relu2", "type": "ReLU", "bottom": "s", "top": "s"},
        {"name": "pool1", "type": "Pooling", "bottom": "s", "top": "p1",
         "pooling_param": {"pool": "MAX", "kernel_size": 3, "stride": 2}},
        {"name": "norm", "type": "LRN", "bottom": "p1", "top": "n", "lrn_param": {"local_size": 5}},
        {"name": "pool2", "type": "Pooling", "bottom": "n", "top": "p2",
         "pooling_param": {"pool": "AVE", "kernel_size": 2, "stride": 1}},
        {"name": "conv3", "type": "Convolution", "bottom": "p2", "top": "c3",
         "convolution_param": {**conv, "num_output": 20, "kernel_size": 1, "pad": 0}},
        {"name": "fc", "type": "InnerProduct", "bottom": "c3", "top": "fc",
         "inner_product_param": {"num_output": 5, "weight_filler": filled(), "bias_filler": filled()}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"} if loss else
        {"name": "loss", "type": "Softmax", "bottom": "fc", "top": "loss"},
    ]
    return yaml.safe_dump({"name": "residual", "layers": layers})


def built(text: str, held: bool, monkeypatch, **options):
    """The net of ``text``, its blobs held in blocked layouts where oneDNN's layers meet, or never."""
    with monkeypatch.context() as patch:
        if not held:
            patch.setattr(onednn, "holdable", lambda graph, keep=(): set())
        return netspec.load_net(text, seed=3, **options)


def fed(net):
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    net.blobs["label"].data[...] = rng.integers(0, 5, net.blobs["label"].shape)
    return net


def held_blobs(net) -> set[str]:
    return {name for name, blob in net.blobs.items()
            if isinstance(blob.held_data, onednn.HeldArray) or isinstance(blob.held_diff, onednn.HeldArray)}


@needs_onednn
def test_held_blobs_train_to_the_numbers_plain_arrays_give(monkeypatch):
    nets = [fed(built(residual_net(), held, monkeypatch)) for held in (True, False)]
    assert {"c1", "c2", "s"} <= held_blobs(nets[0]) and not held_blobs(nets[1])  # (p1 too, where LRN is on oneDNN)
    losses = [net.forward_backward() for net in nets]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for name, blobs in nets[1].params.items():
        for index, (held, plain) in enumerate(zip(nets[0].params[name], blobs)):
            np.testing.assert_allclose(held.diff, plain.diff, rtol=1e-4, atol=1e-5, err_msg=f"{name}[{index}]")
    for name in ("c1", "s", "p1", "c3"):  # every reader gets the plain array up to date, data and diff
        np.testing.assert_allclose(nets[0].blobs[name].data, nets[1].blobs[name].data, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(nets[0].blobs[name].diff, nets[1].blobs[name].diff, rtol=1e-4, atol=1e-6)


@needs_onednn
def test_between_onednn_layers_the_plain_array_is_not_written(monkeypatch):
    net = fed(built(residual_net(), True, monkeypatch))
    blob = net.blobs["c2"]
    blob.data[...] = 12345.0  # (stale from here on, until something reads it)
    net.forward()
    assert blob.held_data.latest != onednn.PLAIN and (blob._data == 12345.0).all()
    assert (blob.data != 12345.0).any() and blob.held_data.latest == onednn.PLAIN


@needs_onednn
def test_a_write_through_the_plain_array_reaches_the_next_layer(monkeypatch):
    outputs = []
    for held in (True, False):
        net = fed(built(residual_net(), held, monkeypatch))
        net.forward()
        net.blobs["c1"].data[...] *= -1  # the user changes a held blob between passes
        for index in range(list(net.layer_by_name).index("conv2"), len(net.layers)):
            net.forward_layer(index)
        outputs.append(net.blobs["fc"].data.copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)


@needs_onednn
def test_channels_not_in_whole_blocks_still_match(monkeypatch):
    nets = [fed(built(residual_net(channels=12), held, monkeypatch)) for held in (True, False)]
    losses = [net.forward_backward() for net in nets]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    np.testing.assert_allclose(nets[0].params["conv1"][0].diff, nets[1].params["conv1"][0].diff, rtol=1e-4,
                               atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("reuse", [False, True])
def test_a_folded_inference_net_holds_its_blobs_to_the_same_outputs(reuse, monkeypatch):
    text = residual_net(loss=False)
    probs = []
    for held in (True, False):
        net = built(text, held, monkeypatch, phase="TEST", inference=True, reuse_memory=reuse)
        if held:
            assert "c1" in held_blobs(net)
        net.blobs["x"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["x"].shape)
        net.forward()
        net.forward()  # (a second pass over buffers the first one left)
        probs.append(net.blobs["loss"].data.copy())
    np.testing.assert_allclose(probs[0], probs[1], rtol=1e-4, atol=1e-6)


@needs_onednn
def test_a_layer_onednn_refuses_a_blocked_layout_works_on_plain_arrays_and_is_named(monkeypatch):
    pooling = primitives.Pooling

    def refusing(lib, *args):
        if args[-1] is not None:  # (the bottom's blocked layout)
            raise onednn.OneDnnError("dnnl_pooling_forward_primitive_desc_create failed (oneDNN status 3)")
        return pooling(lib, *args)

    monkeypatch.setattr(primitives, "Pooling", refusing)
    nets = [fed(built(residual_net(), held, monkeypatch)) for held in (True, False)]
    losses = [net.forward_backward() for net in nets]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    line = nets[0].paths()
    assert "pool1" in line.split("NumPy for the rest")[0] and " blobs held in its blocked layouts" in line, line
    assert "reordered out of their input's blocked layout: pool1: dnnl_pooling_forward" in line, line


@needs_onednn
def test_a_python_layer_that_keeps_views_of_its_arrays_sees_every_pass(tmp_path, monkeypatch):
    (tmp_path / "keeping.py").write_text(
        "import netspec\n\n\n"
        "class Double(netspec.PythonLayer):\n"
        "    def top_shapes(self, shapes):\n        return [shapes[0]]\n\n"
        "    def reshape(self, bottom, top):\n        super().reshape(bottom, top)\n"
        "        self.x, self.y = bottom[0].data, top[0].data  # (views kept from pass to pass)\n\n"
        "    def forward(self, bottom, top):\n        self.y[...] = 2 * self.x\n\n"
        "    def backward(self, top, propagate_down, bottom):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    conv = {"num_output": 16, "kernel_size": 3, "weight_filler": filled(), "bias_filler": filled()}
    text = yaml.safe_dump({"layers": [
        {"name": "data", "type": "Input", "top": "x", "input_param": {"shape": {"dim": [2, 3, 9, 9]}}},
        {"name": "c1", "type": "Convolution", "bottom": "x", "top": "a", "convolution_param": conv},
        {"name": "py", "type": "Python", "bottom": "a", "top": "d",
         "python_param": {"module": "keeping", "layer": "Double"}},
        {"name": "c2", "type": "Convolution", "bottom": "d", "top": "t", "convolution_param": conv}]})
    outputs = []
    for held in (True, False):
        net = built(text, held, monkeypatch, phase="TEST", trust=Trust.own())
        net.blobs["x"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["x"].shape)
        net.forward()
        outputs.append(net.blobs["t"].data.copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


@needs_onednn
def test_an_array_given_to_a_held_blob_replaces_its_values(monkeypatch):
    net = fed(built(residual_net(), True, monkeypatch))
    net.forward()
    blob = net.blobs["c2"]
    blob.data = np.ones(blob.shape, dtype=np.float32)
    assert (blob.data == 1).all()


@pytest.mark.parametrize("given, problem", [
    (np.zeros((2, 3, 4, 4), np.float64), "got a float64 array"),
    (np.zeros((2, 3, 4, 5), np.float32), r"got an array of shape \[2, 3, 4, 5\]"),
    (np.zeros((2, 4, 4, 3), np.float32).transpose(0, 3, 1, 2), "got an array that is not C-contiguous"),
    ([[0.0]], "got a list where its device takes a numpy.ndarray"),
    (None, "got a NoneType where its device takes a numpy.ndarray")])  # (a diff not made yet is None: still refused)
def test_a_blob_refuses_an_array_it_cannot_hold(given, problem):
    """A blob's arrays are C-contiguous, of its shape and dtype, on its device, as every fast path reads them; a
    write into the array it has copies any values that convert."""
    net = netspec.load_net(yaml.safe_dump({"layers": [
        {"name": "data", "type": "Input", "top": "data", "input_param": {"shape": {"dim": [2, 3, 4, 4]}}},
        {"name": "relu", "type": "ReLU", "bottom": "data", "top": "out"}]}), phase="TEST")
    blob = net.blobs["data"]
    for what in ("data", "diff"):
        with pytest.raises(ValueError, match=rf"blob 'data' takes a C-contiguous float32 numpy.ndarray of shape "
                                             rf"\[2, 3, 4, 4\] for its {what}, {problem} \(blob.{what}\[...\] ="):
            setattr(blob, what, given)
    blob.data[...] = np.ones((2, 3, 4, 4))  # (float64 values, copied in)
    assert blob.data.dtype == np.float32 and blob.data.sum() == 96
    scalar = Blob((), np, np.float32, "loss")
    scalar.data = np.float32(2.5)  # (a NumPy scalar, as a Python loss layer computes one, taken as an array)
    assert isinstance(scalar.data, np.ndarray) and scalar.data == 2.5


def test_without_onednn_no_blob_is_held_and_the_plan_pads_nothing(monkeypatch):
    monkeypatch.setattr(onednn, "library", lambda: None)
    net = fed(netspec.load_net(residual_net(), seed=3, reuse_memory=True))
    assert net.holdable == set() and not held_blobs(net)
    assert all(blob.held_data is None and blob.held_diff is None for blob in net.blobs.values())
    assert np.isfinite(net.forward_backward()) and "held" not in net.paths()
