"""ContrastiveLoss, InfogainLoss and MultinomialLogisticLoss: Caffe's formulas, its parameters, and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from devices import DEVICES

import netspec
from netspec import ConfigError, DataError
from netspec.testing import gradient_check, one_layer_net, run_forward

RNG = np.random.default_rng(20)


def softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def forward_backward(net, loss_weight=1.0):
    """The loss of the layer under test, and its bottoms' diffs for ``loss_weight``."""
    loss = run_forward(net)[0]
    top, bottom = net.top_blobs[-1], net.bottom_blobs[-1]
    top[0].diff[...] = loss_weight
    net.layers[-1].backward(top, net.nodes[-1].bottom_need_backward, bottom)
    return float(loss), [b.diff.copy() for b in bottom]


def one_line_error(error_type, build) -> str:
    with pytest.raises(error_type) as info:
        build()
    message = str(info.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- ContrastiveLoss

PAIRS = (np.zeros((3, 2)), np.array([[0.3, 0.4], [0.6, 0.8], [0.3, 0.4]]), np.array([1.0, 0.0, 0.0]))  # d .5, 1, .5


def contrastive(a, b, y, device="cpu", **params):
    return one_layer_net("ContrastiveLoss", [a.shape, b.shape, y.shape], bottoms=[a, b, y],
                         params={"contrastive_loss_param": params} if params else None, device=device)


@pytest.mark.parametrize(("legacy", "expected"), [
    (False, (0.25 + (1.2 - 1.0) ** 2 + (1.2 - 0.5) ** 2) / 6),  # similar d^2; dissimilar max(margin - d, 0)^2
    (True, (0.25 + (1.2 - 1.0) + (1.2 - 0.25)) / 6),  # legacy: max(margin - d^2, 0)
])
@pytest.mark.parametrize("device", DEVICES)
def test_contrastive_loss_of_both_margin_forms(legacy, expected, device):
    net = contrastive(*PAIRS, device=device, margin=1.2, legacy_version=legacy)
    assert run_forward(net)[0] == pytest.approx(expected, rel=1e-12)
    gradient_check(contrastive(*PAIRS, device=device, margin=1.2, legacy_version=legacy))


def test_contrastive_default_margin_is_one_and_far_dissimilar_pairs_add_nothing():
    a, b, y = PAIRS
    loss, (da, db, dy) = forward_backward(contrastive(a, b, y), loss_weight=2.0)
    assert loss == pytest.approx((0.25 + 0.0 + 0.5 ** 2) / 6)
    np.testing.assert_allclose(da[0], 2.0 * (a[0] - b[0]) / 3)  # similar: (a - b) / N
    np.testing.assert_array_equal(da[1], [0, 0])  # d = margin: outside it, no gradient
    np.testing.assert_allclose(da[2], 2.0 * -(1 - 0.5) / 0.5 * (a[2] - b[2]) / 3)  # -(margin - d)(a - b) / (d N)
    np.testing.assert_allclose(db, -da)
    assert not dy.any()


def test_contrastive_gradient_is_caffes_up_to_its_damping():
    a, b = RNG.uniform(-1, 1, (8, 4)), RNG.uniform(-1, 1, (8, 4))
    y = np.zeros(8)
    _, (da, _, _) = forward_backward(contrastive(a, b, y, margin=3.0))
    d = np.sqrt(((a - b) ** 2).sum(axis=1, keepdims=True))
    caffe = -(3.0 - d) / (d + 1e-4) * (a - b) / 8  # contrastive_loss_layer.cpp's beta
    np.testing.assert_allclose(da, caffe, rtol=1e-4 / d.min() + 1e-12)


def test_contrastive_similarity_is_the_labels_integer_part_as_caffe_casts_it():
    a, b, _ = PAIRS
    as_floats = run_forward(contrastive(a, b, np.array([1.9, 0.7, -0.4]), margin=1.2))[0]
    as_ints = run_forward(contrastive(a, b, np.array([1.0, 0.0, 0.0]), margin=1.2))[0]
    assert as_floats == as_ints
    flipped = run_forward(contrastive(a, b, np.array([1.0, -1.0, 2.0]), margin=1.2))[0]
    assert flipped == pytest.approx((0.25 + 1.0 + 0.25) / 6)


@pytest.mark.parametrize("device", DEVICES)
def test_contrastive_takes_no_gradient_to_the_labels_and_feature_maps_of_one_pixel(device):
    a, b = RNG.uniform(-1, 1, (4, 3, 1, 1)), RNG.uniform(-1, 1, (4, 3, 1, 1))
    net = contrastive(a, b, np.array([[1.0], [0.0], [1.0], [0.0]]), device=device)
    assert net.nodes[-1].bottom_need_backward == [True, True, False]
    gradient_check(net)


@pytest.mark.parametrize(("shapes", "expected"), [
    ([(4, 3), (4, 2), (4,)], "bottoms 'b0' (4, 3) and 'b1' (4, 2) must hold the same number of pairs"),
    ([(4, 3), (2, 6), (4,)], "bottoms 'b0' (4, 3) and 'b1' (2, 6) must hold the same number of pairs"),
    ([(4, 3), (4, 3), (3,)], "similarity bottom 'b2' has shape (3,): expected one label per pair (4)"),
])
def test_contrastive_refuses_bottoms_that_do_not_pair(shapes, expected):
    message = one_line_error(ConfigError, lambda: one_layer_net("ContrastiveLoss", shapes))
    assert "layer 'under_test'" in message and expected in message


# ----------------------------------------------------------------------------- InfogainLoss

H = np.array([[1.0, 0.2, 0.0], [0.5, 2.0, 0.1], [0.0, 0.3, 1.5]])


def infogain_reference(x, y, h, normalization="VALID", ignore=None, axis=1):
    """Caffe's loop: the loss and the gradient to the scores for a loss weight of 1."""
    prob = softmax(x, axis)
    p = np.moveaxis(prob, axis, -1).reshape(-1, h.shape[0])
    lab = y.reshape(-1).astype(int)
    loss, grad, count = 0.0, np.zeros_like(p), 0
    for i, label in enumerate(lab):
        if label == ignore:
            continue
        loss -= (h[label] * np.log(np.maximum(p[i], 1e-20))).sum()
        grad[i] = p[i] * h[label].sum() - h[label]
        count += 1
    outer = math.prod(x.shape[:axis])
    norm = max(1, {"VALID": count, "FULL": len(lab), "BATCH_SIZE": outer, "NONE": 1}[normalization])
    moved = np.moveaxis(prob, axis, -1).shape
    return loss / norm, np.moveaxis(grad.reshape(moved), -1, axis) / norm


@pytest.fixture
def h_file(tmp_path):
    path = tmp_path / "H.npy"
    np.save(path, H)
    return str(path)


def infogain(x, y, h=None, source=None, tops=1, **params):
    shapes, bottoms = [x.shape, y.shape], [x, y]
    if h is not None:
        shapes.append(h.shape)
        bottoms.append(h)
    blocks = {"loss_param": params.pop("loss_param", {}), "infogain_loss_param": dict(params)}
    if source is not None:
        blocks["infogain_loss_param"]["source"] = source
    return one_layer_net("InfogainLoss", shapes, tops=tops, bottoms=bottoms, params=blocks)


@pytest.mark.parametrize("normalization", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, 1])
def test_infogain_normalization_and_ignore_label(h_file, normalization, ignore):
    x = RNG.uniform(-2, 2, (2, 3, 2, 2))
    y = np.array([[[0, 1], [2, 1]], [[1, 1], [0, 2]]], float)
    loss_param = {"normalization": normalization, **({"ignore_label": ignore} if ignore is not None else {})}
    loss, (dx, dy) = forward_backward(infogain(x, y, source=h_file, loss_param=loss_param))
    expected_loss, expected_dx = infogain_reference(x, y, H, normalization, ignore)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-10, atol=1e-14)
    assert not dy.any()


def test_infogain_all_positions_ignored_gives_zero_not_nan(h_file):
    x, y = RNG.uniform(-1, 1, (3, 3)), np.array([1.0, 1.0, 1.0])
    loss, (dx, _) = forward_backward(infogain(x, y, source=h_file, loss_param={"ignore_label": 1}))
    assert loss == 0.0 and not dx.any()


def test_infogain_h_as_a_bottom_equals_h_from_the_file(h_file):
    x, y = RNG.uniform(-2, 2, (5, 3)), np.array([0, 2, 1, 1, 0], float)
    from_file = infogain(x, y, source=h_file, tops=2)
    as_bottom = infogain(x, y, h=H.reshape(1, 1, 3, 3), tops=2)
    assert as_bottom.nodes[-1].bottom_need_backward == [True, False, False]
    (loss_file, prob_file), (loss_bottom, prob_bottom) = run_forward(from_file), run_forward(as_bottom)
    assert loss_file == loss_bottom == pytest.approx(infogain_reference(x, y, H)[0], rel=1e-12)
    np.testing.assert_allclose(prob_bottom, softmax(x), rtol=1e-12)
    np.testing.assert_array_equal(prob_file, prob_bottom)
    np.testing.assert_array_equal(forward_backward(from_file)[1][0], forward_backward(as_bottom)[1][0])


def test_infogain_a_changed_h_bottom_changes_loss_and_gradient():
    x, y = RNG.uniform(-2, 2, (4, 3)), np.array([0, 2, 1, 1], float)
    net = infogain(x, y, h=np.eye(3))
    net.bottom_blobs[-1][2].data[...] = H
    loss, (dx, _, _) = forward_backward(net)
    expected_loss, expected_dx = infogain_reference(x, y, H)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-10)


def test_infogain_with_the_identity_is_softmax_with_loss(tmp_path):
    np.save(tmp_path / "I.npy", np.eye(4))
    x, y = RNG.uniform(-3, 3, (3, 4, 2)), np.array([[0, 3], [2, 1], [3, 3]], float)
    params = {"loss_param": {"ignore_label": 3}}
    softmax_loss = one_layer_net("SoftmaxWithLoss", [x.shape, y.shape], bottoms=[x, y], params=params)
    info = infogain(x, y, source=str(tmp_path / "I.npy"), **params)
    (loss_a, (dx_a, _)), (loss_b, (dx_b, _)) = forward_backward(softmax_loss, 2.0), forward_backward(info, 2.0)
    assert loss_b == pytest.approx(loss_a, rel=1e-12)
    np.testing.assert_allclose(dx_b, dx_a, rtol=1e-10, atol=1e-15)


def test_infogain_axis_puts_the_classes_elsewhere(h_file):
    x, y = RNG.uniform(-2, 2, (2, 4, 3)), np.array([[0, 1, 2, 2], [1, 0, 0, 2]], float)
    loss, (dx, _) = forward_backward(infogain(x, y, source=h_file, axis=-1))
    expected_loss, expected_dx = infogain_reference(x, y, H, axis=2)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-10)
    gradient_check(infogain(x, y, source=h_file, axis=2))


def test_infogain_source_is_read_against_the_net_files_folder(tmp_path, monkeypatch):
    (tmp_path / "nets").mkdir()
    np.save(tmp_path / "nets" / "H.npy", H)
    net_file = tmp_path / "nets" / "net.yaml"
    net_file.write_text(
        "layers:\n"
        "  - {name: data, type: Input, top: [x, y], input_param: {shape: [{dim: [2, 3]}, {dim: [2]}]}}\n"
        "  - {name: loss, type: InfogainLoss, bottom: [x, y], top: loss, infogain_loss_param: {source: H.npy}}\n")
    monkeypatch.chdir(tmp_path)
    net = netspec.load_net(str(net_file), dtype=np.float64)
    net.blobs["x"].data[...] = [[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]]
    net.blobs["y"].data[...] = [1, 2]
    assert net.forward() == pytest.approx(infogain_reference(net.blobs["x"].data, net.blobs["y"].data, H)[0])


def test_infogain_missing_source_file_names_the_file_and_the_layer(tmp_path):
    missing = str(tmp_path / "nowhere" / "H.npy")
    message = one_line_error(ConfigError, lambda: infogain(np.zeros((2, 3)), np.zeros(2), source=missing))
    assert "layer 'under_test'" in message and "infogain_loss_param.source" in message
    assert f"{missing}: cannot read: No such file or directory" in message


def test_infogain_without_h_says_where_to_give_it():
    message = one_line_error(ConfigError, lambda: infogain(np.zeros((2, 3)), np.zeros(2)))
    assert "infogain_loss_param.source: give the infogain matrix H: a .npy file here, or a third bottom" in message


def test_infogain_refuses_a_file_that_is_not_npy(tmp_path):
    path = tmp_path / "H.binaryproto"
    path.write_bytes(b"\x0a\x03\x08\x01\x03" + bytes(20))
    message = one_line_error(ConfigError, lambda: infogain(np.zeros((2, 3)), np.zeros(2), source=str(path)))
    assert f"{path}: not a .npy file (convert a Caffe .binaryproto to .npy first)" in message


@pytest.mark.parametrize("stored", [np.eye(2), np.ones(10), np.array(["a", "b"])])
def test_infogain_refuses_an_h_file_that_does_not_fit(tmp_path, stored):
    np.save(tmp_path / "H.npy", stored)
    message = one_line_error(ConfigError, lambda: infogain(np.zeros((2, 3)), np.zeros(2),
                                                           source=str(tmp_path / "H.npy")))
    assert "layer 'under_test'" in message and "infogain_loss_param.source" in message
    assert "H needs 3 x 3 values" in message or "not an array of numbers" in message


@pytest.mark.parametrize(("shapes", "expected"), [
    ([(2, 3), (2,), (2, 3)], "infogain bottom 'b2' has shape (2, 3): the scores have 3 classes, so H needs 3 x 3"),
    ([(2, 3, 2), (2,), (3, 3)], "label bottom 'b1' has shape (2,): expected 4 labels"),
])
def test_infogain_refuses_bottoms_that_do_not_fit(shapes, expected):
    message = one_line_error(ConfigError, lambda: one_layer_net("InfogainLoss", shapes))
    assert "layer 'under_test'" in message and expected in message


def test_infogain_refuses_a_label_that_is_no_class(h_file):
    net = infogain(np.zeros((2, 3)), np.array([0.0, 3.0]), source=h_file)
    message = one_line_error(DataError, lambda: run_forward(net))
    assert message.startswith("layer 'under_test': label 3 of bottom 'b1' is not a class index 0 to 2")


# ----------------------------------------------------------------------------- MultinomialLogisticLoss

def multinomial(p, y):
    return one_layer_net("MultinomialLogisticLoss", [p.shape, y.shape], bottoms=[p, y])


def test_multinomial_logistic_loss_and_gradient_as_caffe():
    p = softmax(RNG.uniform(-2, 2, (3, 2, 2, 2))).reshape(3, 2, 2, 2)
    y = np.array([5.0, 0.0, 7.0])  # indices into each instance's 8 flattened values, as Caffe reads them
    loss, (dp, dy) = forward_backward(multinomial(p, y), loss_weight=2.0)
    rows = p.reshape(3, 8)
    assert loss == pytest.approx(-(np.log(rows[0, 5]) + np.log(rows[1, 0]) + np.log(rows[2, 7])) / 3, rel=1e-12)
    expected = np.zeros((3, 8))
    expected[[0, 1, 2], [5, 0, 7]] = -2.0 / (3 * rows[[0, 1, 2], [5, 0, 7]])
    np.testing.assert_allclose(dp.reshape(3, 8), expected, rtol=1e-12)
    assert not dy.any()


def test_multinomial_logistic_clips_zero_probabilities_at_1e_20():
    p, y = np.array([[0.0, 1.0], [0.5, 0.5]]), np.array([0.0, 1.0])
    loss, (dp, _) = forward_backward(multinomial(p, y))
    assert loss == pytest.approx((-math.log(1e-20) - math.log(0.5)) / 2)
    assert dp[0, 0] == pytest.approx(-1 / (2 * 1e-20)) and dp[1, 1] == pytest.approx(-1.0)


def test_multinomial_logistic_after_softmax_is_softmax_with_loss():
    x, y = RNG.uniform(-2, 2, (4, 5)), np.array([0.0, 4.0, 2.0, 2.0])
    fused = run_forward(one_layer_net("SoftmaxWithLoss", [x.shape, y.shape], bottoms=[x, y]))[0]
    assert run_forward(multinomial(softmax(x), y))[0] == pytest.approx(fused, rel=1e-12)


def test_multinomial_logistic_refuses_labels_that_do_not_fit():
    message = one_line_error(ConfigError, lambda: one_layer_net("MultinomialLogisticLoss", [(4, 5), (4, 2)]))
    assert "layer 'under_test'" in message
    assert "label bottom 'b1' has shape (4, 2): expected one label per instance of 'b0' (4, 5)" in message
    net = multinomial(np.full((2, 3), 1 / 3), np.array([0.0, 3.0]))
    assert "label 3 of bottom 'b1' is not a class index 0 to 2" in one_line_error(DataError, lambda: run_forward(net))
