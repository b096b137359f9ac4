"""Fillers: each distribution has Caffe's parameters and fan definitions."""

from __future__ import annotations

import numpy as np
import pytest

from netspec.engine.fillers import FillerParams, fill
from netspec.errors import ParamError

SHAPE = (64, 32, 3, 3)  # fan_in = 288, fan_out = 576


def draw(shape=SHAPE, **params):
    return fill(FillerParams(**params), shape, np.random.default_rng(0), np.float64)


def test_constant_uniform_gaussian():
    np.testing.assert_array_equal(draw((2, 3), type="constant", value=0.5), np.full((2, 3), 0.5))
    values = draw(type="uniform", min=-2, max=3)
    assert values.min() >= -2 and values.max() <= 3 and abs(values.mean() - 0.5) < 0.05
    values = draw(type="gaussian", mean=1, std=0.1)
    assert abs(values.mean() - 1) < 0.01 and abs(values.std() - 0.1) < 0.01


def test_sparse_gaussian_keeps_about_sparse_per_output():
    values = draw((50, 400), type="gaussian", sparse=10)
    assert abs((values != 0).mean() - 10 / 50) < 0.02


@pytest.mark.parametrize("norm, fan", [("FAN_IN", 288), ("FAN_OUT", 576), ("AVERAGE", 432)])
def test_xavier_and_msra_scale_by_fan(norm, fan):
    values = draw(type="xavier", variance_norm=norm)
    bound = np.sqrt(3 / fan)
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.95 * bound
    values = draw(type="msra", variance_norm=norm)
    assert abs(values.std() - np.sqrt(2 / fan)) < 0.02 * np.sqrt(2 / fan) + 1e-3


def test_bilinear_upsampling_kernel():
    kernel = draw((1, 1, 4, 4), type="bilinear")[0, 0]
    ramp = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(kernel, np.outer(ramp, ramp))
    with pytest.raises(ParamError, match="square kernels"):
        draw((2, 3), type="bilinear")


def test_positive_unitball_rows_sum_to_one():
    values = draw((5, 2, 3), type="positive_unitball")
    assert (values >= 0).all()
    np.testing.assert_allclose(values.reshape(5, -1).sum(axis=1), np.ones(5))


def test_randint_draws_every_whole_number_below_max():
    values = fill(FillerParams(type="randint", min=2, max=5), (10_000,), np.random.default_rng(0))
    assert values.dtype == np.float32 and set(np.unique(values)) == {2.0, 3.0, 4.0}
    with pytest.raises(ParamError, match=r"randint needs whole numbers min < max \(at most 2\*\*53, and 2\*\*32 apart\), got min 0.0 and max 9.5"):
        fill(FillerParams(type="randint", min=0, max=9.5), (3,), np.random.default_rng(0))
