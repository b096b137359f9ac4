"""netspec.testing on layers a user writes: correct ones pass every check, each kind of mistake fails its check."""

from __future__ import annotations

import numpy as np
import pytest
from devices import DEVICES

from netspec.engine import registry
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import DeviceError
from netspec.testing import (
    check_accumulation,
    check_forward,
    check_inplace,
    check_layer,
    check_reshape,
    gradient_check,
    one_layer_net,
    run_forward,
)

X = np.random.default_rng(0).uniform(-1, 1, (2, 3, 4))


class Doubler(Layer):
    """``y = 2 x``; runs in place."""

    type = "TestDoubler"
    learnable = False
    inplace_ok = True

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        self.xp.multiply(bottom[0].data, 2, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.xp.multiply(top[0].diff, 2, out=bottom[0].diff)


class WrongDoubler(Doubler):
    """Forgets the factor 2 in backward."""

    type = "TestWrongDoubler"

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff


class Scale(Layer):
    """``y = w x`` with one learned scalar ``w``."""

    type = "TestScale"

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def param_shapes(self, bottom_shapes):
        return [(1,)]

    def forward(self, bottom, top):
        self.xp.multiply(bottom[0].data, self.blobs[0].data[0], out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += (bottom[0].data * top[0].diff).sum()
        if propagate_down[0]:
            self.xp.multiply(top[0].diff, self.blobs[0].data[0], out=bottom[0].diff)


class OverwritingScale(Scale):
    """Overwrites its parameter diff instead of adding to it."""

    type = "TestOverwritingScale"

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = (bottom[0].data * top[0].diff).sum()
        if propagate_down[0]:
            self.xp.multiply(top[0].diff, self.blobs[0].data[0], out=bottom[0].diff)


class UnsafeSquare(Layer):
    """``y = x^2``, claims to run in place, but its backward reads the bottom's data (the top's, in place)."""

    type = "TestUnsafeSquare"
    learnable = False
    inplace_ok = True

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        self.xp.multiply(bottom[0].data, bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.xp.copyto(bottom[0].diff, 2 * bottom[0].data * top[0].diff)


class SetupSizedDoubler(Doubler):
    """Remembers the batch size of setup and doubles only that many items."""

    type = "TestSetupSizedDoubler"
    inplace_ok = False

    def setup(self, bottom, top, backend, dtype):
        self.batch = bottom[0].shape[0]
        super().setup(bottom, top, backend, dtype)

    def forward(self, bottom, top):
        top[0].data[...] = 0
        self.xp.multiply(bottom[0].data[:self.batch], 2, out=top[0].data[:self.batch])


USER_LAYERS = [Doubler, WrongDoubler, Scale, OverwritingScale, UnsafeSquare, SetupSizedDoubler]


@pytest.fixture(autouse=True)
def user_layers(monkeypatch):
    """Register the layers above for one test only: other tests compare the registry with the built-in types."""
    monkeypatch.setattr(registry, "_LAYERS", dict(registry.layer_types()))  # (the built-in types loaded first)
    for cls in USER_LAYERS:
        register_layer(cls)


def doubled(bottoms, params):
    return [2 * bottoms[0]]


def scaled(bottoms, params):
    return [params[0][0] * bottoms[0]]


def build(layer_type, inplace=False):
    return one_layer_net(layer_type, [X.shape], bottoms=[X], inplace=inplace)


def test_a_correct_layer_passes_every_check_one_by_one():
    check_forward(build("TestDoubler"), doubled)
    gradient_check(build("TestDoubler"))
    check_accumulation(build("TestDoubler"))
    check_inplace(lambda inplace: build("TestDoubler", inplace))
    check_reshape(build("TestDoubler"), doubled)
    check_reshape(build("TestDoubler"), doubled, bottoms=[X[:1, :2]])


@pytest.mark.parametrize(("layer_type", "reference"), [("TestDoubler", doubled), ("TestScale", scaled)])
@pytest.mark.parametrize("device", DEVICES)
def test_correct_layers_pass_check_layer(layer_type, reference, device):
    check_layer(layer_type, [X], reference=reference, device=device)


def test_the_nets_are_built_on_the_device_given():
    assert build("TestDoubler").backend.device == "cpu"
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        check_layer("TestDoubler", [X], reference=doubled, device="tpu")


def test_the_layer_under_test_is_fed_the_given_bottoms():
    net = build("TestDoubler")
    np.testing.assert_array_equal(net.bottom_blobs[-1][0].data, X)
    np.testing.assert_array_equal(run_forward(net)[0], 2 * X)
    assert net.layers[-1].name == "under_test"


def test_a_wrong_backward_fails_the_gradient_check():
    with pytest.raises(AssertionError, match=r"bottom 0\[\d+\]: analytic .* vs numeric"):
        gradient_check(build("TestWrongDoubler"))
    with pytest.raises(AssertionError, match="bottom 0"):
        check_layer("TestWrongDoubler", [X], reference=doubled)


def test_a_wrong_reference_fails_the_forward_check():
    with pytest.raises(AssertionError, match="forward: top 0"):
        check_forward(build("TestDoubler"), lambda bottoms, params: [3 * bottoms[0]])
    with pytest.raises(AssertionError, match="the reference returned 2"):
        check_forward(build("TestDoubler"), lambda bottoms, params: [bottoms[0], bottoms[0]])
    with pytest.raises(AssertionError, match=r"has shape \(2, 3, 4\), the reference \(2, 12\)"):
        check_forward(build("TestDoubler"), lambda bottoms, params: [bottoms[0].reshape(2, -1)])


def test_an_overwritten_parameter_diff_fails_the_accumulation_check():
    gradient_check(build("TestOverwritingScale"))  # one backward at a time looks right
    with pytest.raises(AssertionError, match="param 0: a second backward must add to the diff"):
        check_accumulation(build("TestOverwritingScale"))


def test_a_backward_that_reads_the_overwritten_bottom_fails_the_inplace_check():
    check_layer("TestUnsafeSquare", [X], reference=lambda bottoms, params: [bottoms[0] ** 2], inplace=False)
    with pytest.raises(AssertionError, match="in place: the diff of bottom 0"):
        check_inplace(lambda inplace: build("TestUnsafeSquare", inplace))


def test_a_layer_sized_at_setup_fails_the_reshape_check():
    check_forward(build("TestSetupSizedDoubler"), doubled)
    with pytest.raises(AssertionError, match="after reshape: top 0"):
        check_reshape(build("TestSetupSizedDoubler"), doubled)


def test_user_layers_are_registered_for_the_test_only():
    assert registry.layer_types()["TestDoubler"] is Doubler


def test_the_registry_holds_the_built_in_types_again(monkeypatch):
    monkeypatch.undo()
    assert "TestDoubler" not in registry.layer_types()
