"""Adaptive pooling (PyTorch's windows): the first maximum's gradient, the ordinary pooling it becomes where sizes
divide, float32 against float64, and bad settings as one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_caffe_losses import one_line_error

from netspec import ConfigError
from netspec.testing import one_layer_net, run_forward

RNG = np.random.default_rng(21)


def adaptive_net(x, **params):
    return one_layer_net("Pooling", [x.shape], bottoms=[x], params={"pooling_param": params})


def test_adaptive_max_gradient_goes_to_the_first_maximum_of_each_overlapping_window():
    x = RNG.integers(0, 2, size=(2, 2, 7, 5)).astype(np.float64)  # ties everywhere
    net = adaptive_net(x, pool="MAX", output_size=[4, 3])
    (y,) = run_forward(net)
    dy = RNG.uniform(1, 2, y.shape)
    net.top_blobs[-1][0].diff[...] = dy
    net.layers[-1].backward(net.top_blobs[-1], [True], net.bottom_blobs[-1])
    expected = np.zeros_like(x)
    for b, c, i, j in np.ndindex(dy.shape):
        rows, columns = range(i * 7 // 4, math.ceil((i + 1) * 7 / 4)), range(j * 5 // 3, math.ceil((j + 1) * 5 / 3))
        cells = [(r, s) for r in rows for s in columns]
        first = max(cells, key=lambda cell: (x[b, c][cell], -cells.index(cell)))
        assert y[b, c, i, j] == x[b, c][first]
        expected[b, c][first] += dy[b, c, i, j]  # overlapping windows may pick the same cell
    np.testing.assert_array_equal(net.bottom_blobs[-1][0].diff, expected)


def test_adaptive_pooling_that_divides_is_an_ordinary_pooling():
    x = RNG.standard_normal((2, 3, 12, 8))
    for pool in ("MAX", "AVE"):
        adaptive = run_forward(adaptive_net(x, pool=pool, output_h=4, output_w=2))
        ordinary = run_forward(adaptive_net(x, pool=pool, kernel_h=3, kernel_w=4, stride_h=3, stride_w=4))
        np.testing.assert_array_equal(adaptive[0], ordinary[0])


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_adaptive_pooling_in_float32_matches_float64(pool):
    x = RNG.standard_normal((2, 3, 7, 10))
    tops = [run_forward(one_layer_net("Pooling", [x.shape], bottoms=[x], dtype=dtype,
                                      params={"pooling_param": {"pool": pool, "output_size": [3, 4]}}))[0]
            for dtype in (np.float32, np.float64)]
    np.testing.assert_allclose(tops[0], tops[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("params", "expected"), [
    ({"output_size": 3, "kernel_size": 2}, "pooling_param.kernel_size: give output_size (adaptive pooling) or "
                                           "kernel_size, not both"),
    ({"output_size": 3, "global_pooling": True}, "pooling_param.global_pooling: give output_size (adaptive pooling) "
                                                 "or global_pooling, not both"),
    ({"output_h": 2, "output_w": 2, "stride": 2}, "pooling_param.stride: give output_size (adaptive pooling) or "
                                                  "stride, not both"),
    ({"output_h": 3}, "pooling_param.output_h: give both output_h and output_w"),
    ({"output_size": [0, 2]}, "pooling_param.output_size: must be positive, got (0, 2)"),
])
def test_conflicting_or_bad_adaptive_settings_are_one_line_errors(params, expected):
    message = one_line_error(ConfigError, lambda: one_layer_net("Pooling", [(1, 2, 5, 5)],
                                                                params={"pooling_param": params}))
    assert f"layer 'under_test': {expected}" in message
