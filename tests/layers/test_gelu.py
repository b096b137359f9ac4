"""GELU: its erf to double precision, its gradients, x times the normal distribution, a bad approximation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from devices import DEVICES
from test_caffe_losses import one_line_error

from netspec import ConfigError
from netspec.layers.activations import erf
from netspec.testing import gradient_check, one_layer_net, run_forward

RNG = np.random.default_rng(21)


def test_erf_is_maths_to_double_precision_everywhere():
    x = np.concatenate([np.linspace(-7, 7, 140001), np.geomspace(1e-300, 30, 2000), -np.geomspace(1e-300, 30, 2000),
                        [0.0, -0.0, 1e300, -np.inf, np.inf]])
    expected = np.array([math.erf(value) for value in x])
    got = erf(np, x.reshape(2, -1)).reshape(-1)  # (the shape kept, and more than one block of 2**16 values)
    np.testing.assert_allclose(got, expected, rtol=5e-16, atol=3e-16)
    zeros_and_nan = erf(np, np.array([0.0, -0.0, np.nan]))
    assert np.signbit(zeros_and_nan[:2]).tolist() == [False, True] and np.isnan(zeros_and_nan[2])


def test_erf_in_float32_stays_float32():
    x = RNG.uniform(-5, 5, 1000).astype(np.float32)
    got = erf(np, x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [math.erf(value) for value in x.astype(float)], atol=3e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("device", DEVICES)
def test_gelu_gradients_match_finite_differences_tightly(approximate, device):
    x = np.concatenate([RNG.uniform(-10, 10, 30), RNG.uniform(-1, 1, 30)]).reshape(3, 4, 5)
    net = one_layer_net("GELU", [x.shape], bottoms=[x], params={"gelu_param": {"approximate": approximate}},
                        device=device)
    gradient_check(net, rtol=1e-6, atol=1e-8, samples=60)


def test_gelu_is_x_times_the_normal_distribution_function():
    x = np.array([[-3.0, -1.0, 0.0, 0.5, 2.0]])
    (y,) = run_forward(one_layer_net("GELU", [x.shape], bottoms=[x]))
    phi = [0.0013498980316301, 0.15865525393145707, 0.5, 0.6914624612740131, 0.9772498680518208]
    np.testing.assert_allclose(y, x * phi, rtol=1e-14)


def test_an_unknown_gelu_approximation_is_a_one_line_error():
    message = one_line_error(ConfigError, lambda: one_layer_net(
        "GELU", [(2, 3)], params={"gelu_param": {"approximate": "exact"}}))
    assert "gelu_param.approximate: 'exact' is not one of none, tanh" in message
