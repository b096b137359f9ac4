"""RNN and LSTM: resets by cont, states carried between passes, Caffe's blobs, bad bottoms."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from devices import DEVICES
from test_layers import ref_lstm, ref_rnn

from netspec import load_net
from netspec.engine import onednn
from netspec.errors import ConfigError, ParamError, ShapeError
from netspec.testing import check_accumulation, check_float32, check_forward, one_layer_net, run_forward

RNG = np.random.default_rng(20)
STATES = {"RNN": 1, "LSTM": 2}
REFERENCES = {"RNN": ref_rnn, "LSTM": ref_lstm}


def rand(*shape):
    return RNG.uniform(-1, 1, shape)


def net_of(layer_type, bottoms, expose=False, num_output=3, weights=None, device="cpu", dtype=np.float64):
    """A one-layer net of ``layer_type`` fed ``bottoms``; ``weights`` (arrays) replace its random ones."""
    block = {"recurrent_param": {"num_output": num_output, "expose_hidden": expose}}
    net = one_layer_net(layer_type, [b.shape for b in bottoms], tops=1 + (STATES[layer_type] if expose else 0),
                        params=block, bottoms=bottoms, device=device, dtype=dtype)
    for blob, value in zip(net.layers[-1].blobs, weights or []):
        blob.data[...] = value
    return net


def weights_of(net):
    return [b.data.copy() for b in net.layers[-1].blobs]


@pytest.mark.parametrize("layer_type", ["RNN", "LSTM"])
def test_cont_zero_starts_a_new_sequence(layer_type):
    x = rand(5, 2, 3)
    cont = np.array([[0, 0], [1, 1], [0, 1], [1, 1], [1, 1]], float)  # sequence 0 restarts at t = 2
    whole = net_of(layer_type, [x, cont])
    (y,) = run_forward(whole)
    fresh = net_of(layer_type, [x[2:, :1], np.array([[0], [1], [1]], float)], weights=weights_of(whole))
    (tail,) = run_forward(fresh)
    np.testing.assert_allclose(y[2:, :1], tail, rtol=1e-12)
    unbroken = net_of(layer_type, [x, np.array([[0, 0]] + [[1, 1]] * 4, float)], weights=weights_of(whole))
    (z,) = run_forward(unbroken)
    np.testing.assert_allclose(z[:, 1], y[:, 1], rtol=1e-12)  # sequence 1 never restarts
    assert not np.allclose(z[2:, 0], y[2:, 0])


@pytest.mark.parametrize("layer_type", ["RNN", "LSTM"])
def test_exposed_states_carried_to_the_next_pass_equal_one_longer_sequence(layer_type):
    x = rand(6, 2, 3)
    cont = np.array([[0, 0], [1, 1], [1, 0], [1, 1], [1, 1], [0, 1]], float)
    states = [np.zeros((1, 2, 3))] * STATES[layer_type]
    whole = net_of(layer_type, [x, cont, *states], expose=True)
    weights = weights_of(whole)
    y, *final = run_forward(whole)
    first = net_of(layer_type, [x[:4], cont[:4], *states], expose=True, weights=weights)
    y1, *middle = run_forward(first)
    second = net_of(layer_type, [x[4:], cont[4:], *middle], expose=True, weights=weights)
    y2, *end = run_forward(second)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-12)
    for got, expected in zip(end, final):
        np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("layer_type", ["RNN", "LSTM"])
def test_without_expose_hidden_a_pass_continues_from_the_last_one_as_in_caffe(layer_type):
    x = rand(6, 2, 3)
    cont = np.array([[0, 0], [1, 1], [1, 0], [1, 1], [1, 1], [0, 1]], float)
    whole = net_of(layer_type, [x, cont])
    (y,) = run_forward(whole)
    net = net_of(layer_type, [x[:3], cont[:3]], weights=weights_of(whole))
    (y1,) = run_forward(net)
    net.blobs["b0"].data[...] = x[3:]
    net.blobs["b1"].data[...] = cont[3:]
    (y2,) = run_forward(net)  # cont[3] = 1: both sequences go on from the state the first pass ended in
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-12)


@pytest.mark.parametrize("layer_type", ["RNN", "LSTM"])
@pytest.mark.parametrize("expose", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_static_input_and_exposed_states_match_the_reference(layer_type, expose, device):
    bottoms = [rand(3, 2, 2, 2), np.array([[0, 0], [1, 0], [1, 1]], float), rand(2, 5)]
    bottoms += [rand(1, 2, 3) for _ in range(STATES[layer_type] if expose else 0)]
    net = net_of(layer_type, bottoms, expose=expose, device=device)
    block = {"recurrent_param": {"expose_hidden": expose}}
    check_forward(net, lambda b, w: REFERENCES[layer_type](b, w, block))


needs_onednn = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")


def took_onednn(net):
    """Whether the LSTM's last forward pass ran on oneDNN (which keeps no gates: backward recomputes them)."""
    layer = net.layers[-1]
    return layer.fast is not None and layer.acts is None


@needs_onednn
@pytest.mark.parametrize("restart", [False, True], ids=["unbroken", "restarting"])
@pytest.mark.parametrize("static", [False, True], ids=["", "static"])
@pytest.mark.parametrize("expose", [False, True], ids=["", "exposed"])
def test_a_float32_lstm_runs_on_onednn_unless_a_sequence_restarts_and_matches_float64(restart, static, expose):
    """oneDNN's LSTM runs every step where cont is 1 after the first (at the first, 0 or 1 per sequence: the
    initial states scaled by it); a restart later keeps NumPy's steps.  Either way float32 gives float64's tops
    and gradients (backward after oneDNN recomputes the gates from the outputs) and accumulates as it should."""
    cont = np.ones((6, 3))
    cont[0] = [0, 1, 1]  # sequences 1 and 2 continue from the initial states (h0, c0, or the zeros carried)
    if restart:
        cont[3, 1] = 0
    bottoms = [rand(6, 3, 2, 2), cont] + [rand(3, 5)] * static + [rand(1, 3, 4) for _ in range(2 * expose)]
    block = {"recurrent_param": {"num_output": 4, "expose_hidden": expose}}

    def build(dtype):
        return one_layer_net("LSTM", [b.shape for b in bottoms], tops=1 + 2 * expose, params=block, bottoms=bottoms,
                             dtype=dtype)

    net = build(np.float32)
    run_forward(net)
    assert took_onednn(net) != restart
    check_float32(build)
    check_accumulation(build(np.float32))


@needs_onednn
def test_an_lstm_on_onednn_continues_from_the_states_its_last_pass_ended_in():
    x, cont = rand(6, 2, 3), np.ones((6, 2))
    cont[0] = 0
    whole = net_of("LSTM", [x, cont], dtype=np.float32)
    (y,) = run_forward(whole)
    net = net_of("LSTM", [x[:3], cont[:3]], weights=weights_of(whole), dtype=np.float32)
    (y1,) = run_forward(net)
    net.blobs["b0"].data[...] = x[3:]
    net.blobs["b1"].data[...] = cont[3:]
    (y2,) = run_forward(net)
    assert took_onednn(whole) and took_onednn(net)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-5, atol=1e-6)
    numpy_net = net_of("LSTM", [x, cont], weights=weights_of(whole))
    np.testing.assert_allclose(run_forward(numpy_net)[0], y, rtol=1e-4, atol=1e-6)


@needs_onednn
@pytest.mark.parametrize("static", [False, True], ids=["", "static"])
def test_a_frozen_lstm_reorders_its_constant_weights_into_onednns_gate_order_once(static):
    """oneDNN stacks the gates i, f, g, o where Caffe's blobs stack i, f, o, g: the reorders into its layout
    move them, at every pass, or for a frozen net's weights at its first (the input weights beside a static
    input's are a concatenation made at each pass: reordered each time)."""
    x, cont = rand(5, 2, 3), np.ones((5, 2))
    cont[0] = 0
    bottoms = [x, cont] + [rand(2, 4)] * static
    reference = net_of("LSTM", bottoms)
    (expected,) = run_forward(reference)
    inputs = [{"dim": list(b.shape)} for b in bottoms]
    text = yaml.safe_dump({"layers": [
        {"name": "input", "type": "Input", "top": ["x", "cont", "static"][:len(bottoms)],
         "input_param": {"shape": inputs}},
        {"name": "lstm", "type": "LSTM", "bottom": ["x", "cont", "static"][:len(bottoms)], "top": "h",
         "recurrent_param": {"num_output": 3}}]})
    net = load_net(text, phase="TEST", inference=True, dtype="float32")
    for blob, value in zip(net.layers[-1].blobs, weights_of(reference)):
        blob.data[...] = value
    for name, value in zip(["x", "cont", "static"], bottoms):
        net.blobs[name].data[...] = value
    net.freeze()
    lstm = net.layers[-1].fast
    net.forward()
    np.testing.assert_allclose(net.blobs["h"].data, expected, rtol=1e-5, atol=1e-6)
    kept = {arg: copy.buffer for arg, copy in lstm.constant_copies.items() if copy.buffer is not None}
    assert len(kept) == 2 - static
    net.forward()
    np.testing.assert_allclose(net.blobs["h"].data, expected, rtol=1e-5, atol=1e-6)
    assert all(lstm.constant_copies[arg].buffer is buffer for arg, buffer in kept.items())
    for blob, changed in zip(net.layers[-1].blobs, reference.layers[-1].blobs):  # (a net frozen again: anew)
        array = blob.data
        while isinstance(array, np.ndarray):
            array.flags.writeable = True
            array = array.base
        changed.data[...] *= -1.5
        blob.data[...] = changed.data
    net.freeze()
    net.forward()
    np.testing.assert_allclose(net.blobs["h"].data, run_forward(reference)[0], rtol=1e-5, atol=1e-6)


@needs_onednn
def test_an_lstm_leaves_onednn_where_only_its_reference_implementation_would_run():
    """(It would be slower than NumPy's steps: CPUs without AVX2, here as oneDNN limited to SSE4.1.)"""
    code = ("import numpy as np\nfrom netspec.testing import one_layer_net\n"
            "net = one_layer_net('LSTM', [(4, 2, 3), (4, 2)], params={'recurrent_param': {'num_output': 3}}, "
            "dtype=np.float32)\nprint(net.paths())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "ONEDNN_MAX_CPU_ISA": "SSE41"})
    assert "oneDNN refused under_test: only oneDNN's reference LSTM" in result.stdout, result.stdout


def test_learnable_blobs_have_caffes_order_and_shapes():
    x, cont, static = rand(2, 2, 5), np.zeros((2, 2)), rand(2, 7)
    shapes = {t: [b.shape for b in net_of(t, [x, cont], num_output=4).layers[-1].blobs] for t in STATES}
    assert shapes == {"RNN": [(4, 5), (4,), (4, 4), (4, 4), (4,)], "LSTM": [(16, 5), (16,), (16, 4)]}
    static_shapes = [b.shape for b in net_of("LSTM", [x, cont, static], num_output=4).layers[-1].blobs]
    assert static_shapes == [(16, 5), (16,), (16, 7), (16, 4)]


def describe(layer_type, bottom_shapes, expose=False):
    """What the layer class says of these bottom shapes, as the graph asks it (raises what it raises)."""
    states = STATES[layer_type] if expose else 0
    good = net_of(layer_type, [rand(3, 2, 4), np.zeros((3, 2))] + [np.zeros((1, 2, 3))] * states, expose=expose)
    layer = good.layers[-1]
    spec = dataclasses.replace(layer.spec, bottoms=[f"b{i}" for i in range(len(bottom_shapes))])
    return type(layer).describe(spec, "TRAIN", bottom_shapes)


@pytest.mark.parametrize("layer_type", ["RNN", "LSTM"])
@pytest.mark.parametrize("cont_shape", [(4, 2), (3,), (3, 2, 1)])
def test_a_cont_of_the_wrong_shape_is_a_shape_error_naming_it(layer_type, cont_shape):
    with pytest.raises(ShapeError, match=r"bottom 'b1' \(cont, the sequence-continuation indicators\) has shape "
                                         r".*expected \(T, N\) = \(3, 2\)"):
        describe(layer_type, [(3, 2, 4), cont_shape])
    with pytest.raises(ConfigError, match=r"<string>:\d+: layer 'under_test': bottom 'b1' \(cont"):
        one_layer_net(layer_type, [(3, 2, 4), cont_shape], params={"recurrent_param": {"num_output": 3}})


def test_an_initial_state_of_the_wrong_shape_is_a_shape_error_naming_it():
    with pytest.raises(ShapeError, match=r"'b3' \(c0, the initial state\) has shape \(1, 2, 4\): expected"):
        describe("LSTM", [(3, 2, 4), (3, 2), (1, 2, 3), (1, 2, 4)], expose=True)
    with pytest.raises(ShapeError, match=r"'b2' \(x_static\) has shape \(3, 5\): expected \(N, ...\)"):
        describe("RNN", [(3, 2, 4), (3, 2), (3, 5)])


def test_bottoms_that_do_not_fit_expose_hidden_are_a_param_error():
    with pytest.raises(ParamError, match="LSTM takes x, cont, optionally x_static, then h0, c0"):
        describe("LSTM", [(3, 2, 4), (3, 2)], expose=True)
    with pytest.raises(ConfigError, match="RNN gives 1 top"):
        one_layer_net("RNN", [(3, 2, 4), (3, 2)], tops=2, params={"recurrent_param": {"num_output": 3}})


NET = """
force_backward: true
layers:
  - {name: data, type: Input, top: [x, cont, target], input_param: {shape: [{dim: [5, 2, 3]}, {dim: [5, 2]},
     {dim: [5, 2, 4]}]}}
  - {name: lstm, type: LSTM, bottom: [x, cont], top: h,
     recurrent_param: {num_output: 4, weight_filler: {type: uniform, min: -0.5, max: 0.5}, debug_info: true}}
  - {name: loss, type: EuclideanLoss, bottom: [h, target], top: loss}
"""


def test_an_lstm_trains_in_a_float32_net_and_cont_takes_no_gradient():
    net = load_net(NET, phase="TRAIN", dtype=np.float32, seed=1)
    net.blobs["x"].data[...] = rand(5, 2, 3)
    net.blobs["cont"].data[...] = [[0, 0], [1, 1], [1, 0], [1, 1], [1, 1]]
    net.blobs["target"].data[...] = 0.25
    losses = []
    for _ in range(30):
        for blob in net.params["lstm"]:
            blob.diff[...] = 0
        losses.append(float(net.forward_backward()))
        for blob in net.params["lstm"]:
            blob.data[...] -= 0.5 * blob.diff
    assert losses[-1] < 0.5 * losses[0]
    assert net.blobs["x"].diff.any()
