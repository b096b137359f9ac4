"""Recorded passes: a frozen net on oneDNN makes its forward passes again from the oneDNN calls of one of them, to
the numbers a pass layer by layer gives, with every blob read after it up to date."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import yaml

import netspec
from netspec.engine import onednn, primitives
from netspec.engine.net import Net
from tests.engine.test_held_layouts import held_blobs, residual_net

needs_onednn = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")


def inference_net(text: str, frozen: bool) -> Net:
    net = netspec.load_net(text, seed=3, phase="TEST", inference=True)  # (every blob its own arrays, to read)
    if frozen:
        net.freeze()
    return net


def with_power_after_conv3(text: str) -> str:
    """``text``'s net with a Power layer (NumPy's) between conv3 and the InnerProduct."""
    spec = yaml.safe_load(text)
    index = next(i for i, each in enumerate(spec["layers"]) if each["name"] == "conv3")
    spec["layers"].insert(index + 1, {"name": "power", "type": "Power", "bottom": "c3", "top": "c3p",
                                      "power_param": {"scale": 2.0, "shift": 0.5}})
    spec["layers"][index + 2]["bottom"] = "c3p"
    return yaml.safe_dump(spec)


def passes_agree(text: str, monkeypatch, count: int = 4, blobs=("loss",)) -> list[str]:
    """Run ``count`` passes of the frozen net and of the same net layer by layer on the same inputs, checking
    ``blobs`` agree bit for bit after each; return the names of the layers the frozen net ran itself, per pass."""
    frozen, plain = inference_net(text, True), inference_net(text, False)
    ran: list[str] = []
    forward_layer = Net.forward_layer
    monkeypatch.setattr(Net, "forward_layer", lambda net, index: (
        ran.append(net.layers[index].name) if net is frozen else None, forward_layer(net, index)))
    per_pass = []
    for number in range(count):
        x = np.random.default_rng(number).standard_normal(plain.blobs["x"].shape)
        frozen.blobs["x"].data[...] = plain.blobs["x"].data[...] = x
        frozen.forward()
        plain.forward()
        for name in blobs:
            assert np.array_equal(frozen.blobs[name].data, plain.blobs[name].data), (number, name)
        per_pass.append(list(ran))
        ran.clear()
    return per_pass


@needs_onednn
def test_a_frozen_net_on_onednn_replays_its_passes_to_the_numbers_of_passes_layer_by_layer(monkeypatch):
    ran = passes_agree(residual_net(loss=False), monkeypatch)
    assert "conv1" in ran[0] and "conv1" in ran[1]  # (the first pass layer by layer, the second recorded)
    assert ran[2] == ran[3] == []  # (then every layer from the recording)


@needs_onednn
def test_blobs_read_after_a_replayed_pass_hold_its_values(monkeypatch):
    # c1, s and p1 are held in blocked layouts between oneDNN's layers: each read brings its plain array up to
    # date, and the pass after the read (which left the plain array the newer copy) is still replayed right
    assert {"c1", "s", "p1"} <= held_blobs(inference_net(residual_net(loss=False), True))
    ran = passes_agree(residual_net(loss=False), monkeypatch, count=5, blobs=("c1", "s", "p1", "loss"))
    assert ran[4] == []


@needs_onednn
def test_layers_that_do_not_record_run_between_the_recorded_stretches(monkeypatch):
    text = with_power_after_conv3(residual_net(loss=False))
    net = inference_net(text, True)
    net.forward()
    assert [recorded for recorded, _ in net.recorded.runs] == [True, False, True]
    ran = passes_agree(text, monkeypatch)
    assert ran[3] == ["power"]


def agree_after(text: str, change, passes: int = 3, every: bool = False) -> None:
    """Run ``passes`` passes of the frozen net and of the same net layer by layer, ``change(net)`` both (before
    each pass from then on, with ``every``), and four more passes, checking their outputs agree bit for bit after
    each pass."""
    frozen, plain = inference_net(text, True), inference_net(text, False)
    for number in range(passes + 4):
        if number == passes or every and number > passes:
            change(frozen)
            change(plain)
        for net in (frozen, plain):
            net.blobs["x"].data[...] = np.random.default_rng(number).standard_normal(net.blobs["x"].shape)
            net.forward()
        assert np.array_equal(frozen.blobs["loss"].data, plain.blobs["loss"].data), number


@needs_onednn
def test_a_blob_given_a_new_array_is_recorded_again():
    def new_input(net):  # (not the array recorded)
        net.blobs["x"].data = np.zeros(net.blobs["x"].shape, dtype=np.float32)

    agree_after(residual_net(loss=False), new_input)


@needs_onednn
def test_a_new_array_a_layer_gives_its_top_within_a_pass_is_read_by_the_stretch_after_it(monkeypatch):
    text = with_power_after_conv3(residual_net(loss=False))

    def anew(bottom, top):  # (Power, but into an array of its own at every pass)
        top[0].data = (bottom[0].data * 2.0 + 0.5).astype(np.float32)

    def power_anew(net):
        monkeypatch.setattr(net.layer_by_name["power"], "forward", anew)

    agree_after(text, power_anew)


@needs_onednn
def test_weights_given_new_arrays_or_made_writable_and_changed_are_recorded_again():
    def new_weights(net):
        for name in ("conv1", "conv3", "fc"):
            net.params[name][0].data = net.params[name][0].data * np.float32(-1.5)

    def changed_in_place(net):  # (conv1's weights and the BatchNorm statistics folded into it)
        weights, mean, _, factor = net.params["conv1"][0], *net.params["bn1"]
        for blob in (weights, mean, factor):
            blob.data.flags.writeable = True
        weights.data[...] *= np.float32(1.5)
        mean.data[...] += np.float32(0.25)
        factor.data[...] = 1.0  # (0 in a new net: the statistics read as zeros)

    agree_after(residual_net(loss=False), new_weights)
    agree_after(residual_net(loss=False), changed_in_place, every=True)


@needs_onednn
def test_a_layer_whose_calls_change_from_pass_to_pass_is_never_replayed(monkeypatch):
    net = inference_net(residual_net(loss=False), True)
    conv = net.layer_by_name["conv2"]
    forward = conv.forward
    monkeypatch.setattr(conv, "forward", lambda bottom, top: (onednn.library().memory_desc((1, 2)),
                                                              forward(bottom, top)))
    for _ in range(3):
        net.forward()
    assert net.recorded.recordings is None and not net.recorded.recordable


@needs_onednn
def test_only_a_frozen_net_on_onednn_records_its_passes(monkeypatch):
    assert inference_net(residual_net(loss=False), False).recorded is None
    monkeypatch.setattr(onednn, "library", lambda: None)
    assert inference_net(residual_net(loss=False), True).recorded is None


def test_a_call_onednn_refuses_in_a_replay_is_an_error():
    recording = onednn.Recording()
    refused = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 3)
    recording.note("dnnl_primitive_execute", refused, ())
    with pytest.raises(onednn.OneDnnError, match=r"failed \(oneDNN status 3\) in a recorded pass"):
        recording.replay()
    recording.note("dnnl_primitive_create", refused, ())
    assert not recording.complete and len(recording.calls) == 1


@needs_onednn
def test_memory_given_another_array_or_replayed_uses_the_array_it_is_given():
    """The library skips pointing memory at the array it already uses: a copy given other arrays, then the first
    again, and one made after a replay pointed its memory elsewhere, each write the arrays they are given."""
    lib = onednn.library()
    copy = primitives.Copy(lib, (2, 3), (3, 1), (3, 1))
    source, first, second = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((2, 3), np.float32), \
        np.zeros((2, 3), np.float32)
    copy(source, first)
    copy(source, second)
    source += 1
    copy(source, first)
    assert (first == source).all() and (second == source - 1).all()
    recording = lib.record()
    try:
        copy(source, second)  # (recorded: memory pointed at `second`)
    finally:
        lib.recording = None
    copy(source + 1, first)
    recording.replay()  # (memory pointed at `second` again)
    source += 5
    copy(source, first)
    assert (first == source).all() and (second == source - 5).all()
