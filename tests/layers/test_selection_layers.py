"""Embed, Parameter and BatchReindex: Caffe's semantics, repeated indices, and bad indices as one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from test_caffe_losses import one_line_error

from netspec import ConfigError, DataError
from netspec.engine.net import load_net
from netspec.layers import selection
from netspec.testing import gradient_check, one_layer_net, run_forward

RNG = np.random.default_rng(21)


def backward(net, top_diffs):
    """Run the layer under test backward from ``top_diffs`` with its parameter diffs zeroed first."""
    layer, top, bottom = net.layers[-1], net.top_blobs[-1], net.bottom_blobs[-1]
    for blob, diff in zip(top, top_diffs):
        blob.diff[...] = diff
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward(top, net.nodes[-1].bottom_need_backward, bottom)


# ----------------------------------------------------------------------------- Embed

def embed(x, dtype=np.float64, **params):
    return one_layer_net("Embed", [x.shape], bottoms=[x], dtype=dtype,
                         params={"embed_param": {"num_output": 2, "input_dim": 4, **params}})


def test_embed_looks_up_rows_and_adds_the_bias():
    x = np.array([[3.0, 0.0], [1.0, 3.0]])
    net = embed(x)
    weights, bias = (blob.data for blob in net.layers[-1].blobs)
    (y,) = run_forward(net)
    assert y.shape == (2, 2, 2)
    np.testing.assert_array_equal(y, weights[[[3, 0], [1, 3]]] + bias)


@pytest.mark.parametrize("threaded", [False, True])
def test_rows_gathered_on_every_core_are_the_rows_gathered_on_one(monkeypatch, threaded):
    """Embed (with its bias) and BatchReindex gather rows in parts on every core from THREADED_BYTES of them on;
    the parts cover every row once, whatever the split."""
    monkeypatch.setattr(selection, "THREADED_BYTES", 0 if threaded else 1 << 62)
    x = RNG.integers(0, 4, (7, 5)).astype(np.float64)
    net = embed(x)
    weights, bias = (blob.data for blob in net.layers[-1].blobs)
    bias[...] = RNG.uniform(-1, 1, bias.shape)
    np.testing.assert_array_equal(run_forward(net)[0], weights[x.astype(int)] + bias)
    rows, indices = RNG.uniform(-1, 1, (6, 3, 2)), RNG.integers(0, 6, 11).astype(np.float64)
    np.testing.assert_array_equal(run_forward(reindex(rows, indices))[0], rows[indices.astype(int)])


def test_embed_gradient_sums_over_repeated_indices_and_skips_the_indices():
    x = np.array([2.0, 0.0, 2.0, 2.0])
    net = embed(x)
    assert net.nodes[-1].bottom_need_backward == [False]
    run_forward(net)
    dy = RNG.uniform(-1, 1, (4, 2))
    backward(net, [dy])
    weights, bias = net.layers[-1].blobs
    np.testing.assert_allclose(weights.diff, [dy[1], [0, 0], dy[0] + dy[2] + dy[3], [0, 0]])
    np.testing.assert_allclose(bias.diff, dy.sum(axis=0))
    gradient_check(embed(x))


def test_embed_defaults_to_caffes_zero_fillers_and_takes_fillers():
    net = load_net("""
layers:
  - {name: data, type: Input, top: words, input_param: {shape: {dim: [3]}}}
  - {name: embed, type: Embed, bottom: words, top: vectors,
     embed_param: {num_output: 5, input_dim: 7, weight_filler: {type: constant, value: 0.5}}}
""", dtype=np.float32)
    weights, bias = net.params["embed"]
    assert weights.shape == (7, 5) and bias.shape == (5,)
    assert (weights.data == 0.5).all() and not bias.data.any()
    net.blobs["words"].data[...] = [6, 0, 6]
    net.forward()
    np.testing.assert_array_equal(net.blobs["vectors"].data, np.full((3, 5), 0.5, np.float32))


def test_embed_without_bias_has_one_blob():
    net = embed(np.array([1.0]), bias_term=False)
    assert [blob.shape for blob in net.layers[-1].blobs] == [(4, 2)]


@pytest.mark.parametrize(("value", "shown"), [(4.0, "4"), (-1.0, "-1"), (1.5, "1.5"), (np.nan, "nan"),
                                               (1e30, "1e+30")])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_embed_refuses_an_index_that_is_no_row(value, shown, dtype):
    net = embed(np.array([[0.0, value], [value, 3.0]]), dtype=dtype)
    message = one_line_error(DataError, lambda: run_forward(net))
    assert message == (f"layer 'under_test': index {shown} of bottom 'b0' is not a row of the embedding "
                       f"(input_dim 4), a whole number 0 to 3 (2 such indices in the batch)")


@pytest.mark.parametrize(("params", "expected"), [
    ({"num_output": 0, "input_dim": 4}, "embed_param.num_output: must be a positive integer, got 0"),
    ({"num_output": 3, "input_dim": -2}, "embed_param.input_dim: must be a positive integer, got -2"),
    ({"num_output": 3}, "embed_param.input_dim"),
])
def test_embed_refuses_sizes_that_are_not_positive(params, expected):
    message = one_line_error(ConfigError, lambda: one_layer_net("Embed", [(2,)], params={"embed_param": params}))
    assert "layer 'under_test'" in message and expected in message


# ----------------------------------------------------------------------------- Parameter

PARAMETER_NET = """
layers:
  - {name: data, type: Input, top: target, input_param: {shape: {dim: [2, 3]}}}
  - {name: p, type: Parameter, top: p, parameter_param: {shape: {dim: [2, 3]}}}
  - {name: loss, type: EuclideanLoss, bottom: [p, target], top: loss}
"""


def test_parameter_starts_at_zero_and_its_gradient_is_the_tops():
    net = load_net(PARAMETER_NET, phase="TRAIN", dtype=np.float64)
    (blob,) = net.params["p"]
    assert blob.shape == (2, 3) and not blob.data.any()
    assert [param.layer for param in net.learnable_params()] == ["p"]
    blob.data[...] = RNG.uniform(-1, 1, (2, 3))
    target = RNG.uniform(-1, 1, (2, 3))
    net.blobs["target"].data[...] = target
    loss = net.forward_backward()
    assert loss == pytest.approx(((blob.data - target) ** 2).sum() / 4)
    np.testing.assert_array_equal(net.blobs["p"].data, blob.data)
    np.testing.assert_allclose(blob.diff, (blob.data - target) / 2)
    net.forward()
    net.backward()  # a second pass without clearing (iter_size 2): the gradients add up
    np.testing.assert_allclose(blob.diff, (blob.data - target))


def test_parameter_top_is_a_copy_that_layers_in_place_cannot_change():
    net = load_net("""
layers:
  - {name: p, type: Parameter, top: p, parameter_param: {shape: {dim: [4]}}}
  - {name: relu, type: ReLU, bottom: p, top: p}
""", dtype=np.float64)
    (blob,) = net.params["p"]
    blob.data[...] = [-1.0, 2.0, -3.0, 4.0]
    net.forward()
    np.testing.assert_array_equal(net.blobs["p"].data, [0, 2, 0, 4])
    np.testing.assert_array_equal(blob.data, [-1, 2, -3, 4])


def test_parameter_docstring_example_feeds_a_scale():
    net = load_net("""
layers:
  - {name: data, type: Input, top: features, input_param: {shape: {dim: [2, 10, 64]}}}
  - {name: centres, type: Parameter, top: centres, parameter_param: {shape: {dim: [10, 64]}}}
  - {name: scaled, type: Scale, bottom: [features, centres], top: scaled, scale_param: {axis: 1}}
""", dtype=np.float64)
    net.params["centres"][0].data[...] = 2.0
    net.blobs["features"].data[...] = 1.5
    net.forward()
    assert (net.blobs["scaled"].data == 3.0).all()


@pytest.mark.parametrize("dims", [[], [3, 0], [-1]])
def test_parameter_refuses_a_shape_without_positive_dims(dims):
    message = one_line_error(ConfigError, lambda: one_layer_net(
        "Parameter", [], params={"parameter_param": {"shape": {"dim": dims}}}))
    assert "layer 'under_test'" in message
    assert f"parameter_param.shape: give the blob's shape with positive dims, e.g. shape: {{dim: [10, 64]}}; " \
           f"got {dims}" in message


# ----------------------------------------------------------------------------- BatchReindex

def reindex(x, indices):
    return one_layer_net("BatchReindex", [x.shape, indices.shape], bottoms=[x, indices])


def test_batch_reindex_takes_rows_in_order_and_adds_repeated_rows_gradients():
    x = RNG.uniform(-1, 1, (4, 2, 3))
    indices = np.array([3.0, 1.0, 3.0, 3.0, 0.0])
    net = reindex(x, indices)
    assert net.nodes[-1].bottom_need_backward == [True, False]
    (y,) = run_forward(net)
    np.testing.assert_array_equal(y, x[[3, 1, 3, 3, 0]])
    dy = RNG.uniform(-1, 1, y.shape)
    net.bottom_blobs[-1][0].diff[...] = 7.0  # overwritten, not added to
    backward(net, [dy])
    np.testing.assert_allclose(net.bottom_blobs[-1][0].diff, [dy[4], dy[1], np.zeros((2, 3)), dy[0] + dy[2] + dy[3]])
    gradient_check(reindex(x, indices))


@pytest.mark.parametrize(("value", "shown"), [(4.0, "4"), (-2.0, "-2"), (0.5, "0.5"), (np.inf, "inf")])
def test_batch_reindex_refuses_an_index_that_is_no_row(value, shown):
    net = reindex(np.zeros((4, 2)), np.array([0.0, value]))
    message = one_line_error(DataError, lambda: run_forward(net))
    assert message == (f"layer 'under_test': index {shown} of bottom 'b1' is not a row of bottom 'b0', "
                       f"a whole number 0 to 3 (1 such index in the batch)")


def test_batch_reindex_refuses_indices_of_more_than_one_axis():
    message = one_line_error(ConfigError, lambda: one_layer_net("BatchReindex", [(4, 2), (3, 1)]))
    assert "layer 'under_test'" in message
    assert "index bottom 'b1' has shape (3, 1): expected one axis (the rows of 'b0' to take, in order)" in message


def test_batch_reindex_refuses_a_scalar():
    message = one_line_error(ConfigError, lambda: load_net("""
layers:
  - {name: data, type: Input, top: [x, order], input_param: {shape: [{dim: [4, 2]}, {dim: [3]}]}}
  - {name: total, type: Reduction, bottom: x, top: total}
  - {name: pick, type: BatchReindex, bottom: [total, order], top: picked}
"""))
    assert "layer 'pick'" in message and "bottom 'total' has no axes: BatchReindex picks rows of its first axis" in message


def test_a_parameter_layer_is_neither_the_data_layer_nor_the_batch():
    net = load_net("layers:\n"
                   "  - {name: p, type: Parameter, top: p, parameter_param: {shape: {dim: [3, 4]}}}\n"
                   "  - {name: data, type: Input, top: x, input_param: {shape: {dim: [2, 4]}}}\n")
    assert net.data_layer().name == "data" and net.batch_size == 2
