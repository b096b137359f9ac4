"""Caffe's edge cases, each against a transcription of its C++ rule: the convolution output size (C++ division,
which truncates toward zero), the loss layers' first-axis check, InfogainLoss's normalization and
ContrastiveLoss's (N, C, 1, 1) bottoms."""

from __future__ import annotations

import numpy as np
import pytest
from devices import DEVICES

from netspec import ConfigError
from netspec.testing import check_float32, gradient_check, one_layer_net, run_forward

RNG = np.random.default_rng(30)


def one_line_error(build) -> str:
    """The message of the ConfigError ``build()`` raises, checked to be one line."""
    with pytest.raises(ConfigError) as info:
        build()
    message = str(info.value)
    assert "\n" not in message
    return message


def forward_backward(net, loss_weight):
    """The loss of the layer under test, and its bottoms' diffs for ``loss_weight``."""
    loss = run_forward(net)[0]
    top, bottom = net.top_blobs[-1], net.bottom_blobs[-1]
    top[0].diff[...] = loss_weight
    net.layers[-1].backward(top, net.nodes[-1].bottom_need_backward, bottom)
    return float(loss), [net.backend.to_host(b.diff).copy() for b in bottom]


# ----------------------------------------------------------------------------- Convolution's output size

def cpp_divide(a: int, b: int) -> int:
    """``a / b`` on C++ ints: the quotient truncated toward zero (Python's ``//`` floors)."""
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def caffe_output_size(size, kernel, pad, stride, dilation):
    """ConvolutionLayer::compute_output_shape (and im2col_cpu's output_h)."""
    return cpp_divide(size + 2 * pad - (dilation * (kernel - 1) + 1), stride) + 1


def caffe_im2col(x, kernel, pad, stride, dilation):
    """im2col_cpu for each sample: (N, C*kh*kw, H', W'), 0 wherever a tap reads outside the input."""
    n, c, h, w = x.shape
    oh, ow = (caffe_output_size(size, *args) for size, *args in zip((h, w), kernel, pad, stride, dilation))
    cols = np.zeros((n, c, *kernel, oh, ow))
    for channel in range(c):
        for kernel_row in range(kernel[0]):
            for kernel_col in range(kernel[1]):
                for out_row in range(oh):
                    input_row = -pad[0] + kernel_row * dilation[0] + out_row * stride[0]
                    for out_col in range(ow):
                        input_col = -pad[1] + kernel_col * dilation[1] + out_col * stride[1]
                        if 0 <= input_row < h and 0 <= input_col < w:
                            cols[:, channel, kernel_row, kernel_col, out_row, out_col] = x[:, channel, input_row,
                                                                                           input_col]
    return cols.reshape(n, -1, oh, ow)


def caffe_convolution(x, weights, bias, group, geometry):
    """ConvolutionLayer::Forward_cpu: per group, the weights times im2col's columns, then the bias."""
    cols = caffe_im2col(x, *geometry)
    n, rows, oh, ow = cols.shape
    o = weights.shape[0]
    out = np.einsum("gok,ngkp->ngop", weights.reshape(group, o // group, -1),
                    cols.reshape(n, group, rows // group, oh * ow))
    return out.reshape(n, o, oh, ow) + bias.reshape(1, o, 1, 1)


# (H, W), then (kernel, pad, stride, dilation) as (height, width) pairs; the first three overhang the padded input
# by less than a stride, so C++'s truncation gives one output where floor would give none
OVERHANGING = [
    ((2, 2), ((3, 3), (0, 0), (2, 2), (1, 1))),  # (2 - 3) / 2 + 1 = 0 + 1
    ((3, 5), ((2, 2), (0, 0), (2, 2), (3, 3))),  # dilated extent 4: (3 - 4) / 2 + 1 = 1; (5 - 4) / 2 + 1 = 1
    ((1, 4), ((4, 4), (1, 1), (3, 3), (1, 1))),  # (1 + 2 - 4) / 3 + 1 = 1; (4 + 2 - 4) / 3 + 1 = 1
    ((6, 5), ((3, 2), (1, 0), (2, 3), (1, 1))),  # no overhang: 3 x 2
]


def convolution_params(kernel, pad, stride, dilation, group, num_output=4):
    """A convolution_param block for one of the geometries above."""
    return {"convolution_param": {"num_output": num_output, "group": group, "kernel_h": kernel[0],
                                  "kernel_w": kernel[1], "pad_h": pad[0], "pad_w": pad[1], "stride_h": stride[0],
                                  "stride_w": stride[1], "dilation": list(dilation)}}


@pytest.mark.parametrize(("size", "geometry"), OVERHANGING)
@pytest.mark.parametrize("group", [1, 2], ids=["im2col", "depthwise"])
@pytest.mark.parametrize("device", DEVICES)
def test_convolution_output_size_truncates_toward_zero_as_caffes_integer_division(size, geometry, group, device):
    x = RNG.uniform(-1, 1, (2, 2, *size))
    net = one_layer_net("Convolution", [x.shape], bottoms=[x], params=convolution_params(*geometry, group),
                        device=device)
    weights, bias = (net.backend.to_host(blob.data) for blob in net.layers[-1].blobs)
    expected = caffe_convolution(x, weights, bias, group, geometry)
    assert net.top_blobs[-1][0].shape == expected.shape
    np.testing.assert_allclose(run_forward(net)[0], expected, rtol=1e-12, atol=1e-14)
    gradient_check(net)


@pytest.mark.parametrize(("size", "geometry"), OVERHANGING[:3])
def test_convolution_overhanging_the_input_in_float32_computes_what_float64_does(size, geometry):
    x = RNG.uniform(-1, 1, (2, 2, *size))
    check_float32(lambda dtype: one_layer_net("Convolution", [x.shape], bottoms=[x], dtype=dtype,
                                              params=convolution_params(*geometry, group=1)))


@pytest.mark.parametrize(("size", "geometry"), OVERHANGING)
def test_im2col_takes_the_columns_of_caffes_im2col_cpu(size, geometry):
    x = RNG.uniform(-1, 1, (2, 3, *size))
    params = convolution_params(*geometry, group=1)
    del params["convolution_param"]["num_output"]
    net = one_layer_net("Im2col", [x.shape], bottoms=[x], params=params)
    np.testing.assert_array_equal(run_forward(net)[0], caffe_im2col(x, *geometry))
    gradient_check(net)


@pytest.mark.parametrize(("layer_type", "size", "geometry", "output"), [
    ("Convolution", (1, 1), ((5, 5), (0, 0), (2, 2), (1, 1)), "-1x-1"),  # (1 - 5) / 2 + 1: Caffe's Blob refuses
    ("Convolution", (2, 7), ((5, 5), (0, 0), (3, 1), (1, 1)), "0x3"),  # (2 - 5) / 3 + 1: Caffe, an empty top
    ("Im2col", (4, 4), ((3, 3), (0, 0), (1, 1), (3, 3)), "-2x-2"),  # dilated extent 7: (4 - 7) / 1 + 1
])
def test_convolution_refuses_a_non_positive_output_size(layer_type, size, geometry, output):
    params = convolution_params(*geometry, group=1)
    message = one_line_error(lambda: one_layer_net(layer_type, [(1, 2, *size)], params=params))
    assert "layer 'under_test'" in message and "convolution_param.kernel_size" in message
    assert f"the output would be {output}" in message


@pytest.mark.parametrize(("kernel", "pad", "output"), [(2, 1, "0x0"), (1, 1, "-1x-1")])
def test_deconvolution_refuses_a_non_positive_output_size(kernel, pad, output):
    """Deconvolution's size ``stride*(H-1) + dilated kernel - 2*pad`` has no division; Caffe's Blob refuses it
    negative and would make an empty top at 0."""
    params = {"convolution_param": {"num_output": 2, "kernel_size": kernel, "pad": pad}}
    message = one_line_error(lambda: one_layer_net("Deconvolution", [(1, 2, 1, 1)], params=params))
    assert "layer 'under_test'" in message and f"the output would be {output}" in message


# ----------------------------------------------------------------------------- the loss layers' first axis

H = np.array([[1.0, 0.2, 0.0], [0.5, 2.0, 0.1], [0.0, 0.3, 1.5]])


@pytest.mark.parametrize(("layer_type", "shapes"), [
    ("SoftmaxWithLoss", [(2, 3, 2), (4,)]),
    ("SigmoidCrossEntropyLoss", [(2, 3), (3, 2)]),
    ("EuclideanLoss", [(2, 3), (3, 2)]),
    ("HingeLoss", [(4, 3), (1, 4)]),
    ("InfogainLoss", [(2, 3, 2), (4,), (3, 3)]),
    ("MultinomialLogisticLoss", [(4, 5), (1, 4)]),
    ("ContrastiveLoss", [(4, 3), (2, 6), (4,)]),
])
def test_losses_refuse_data_and_label_of_different_first_axes_as_caffes_loss_layer(layer_type, shapes):
    message = one_line_error(lambda: one_layer_net(layer_type, shapes))
    assert "layer 'under_test'" in message
    assert f"'b0' {shapes[0]} and 'b1' {shapes[1]}" in message


@pytest.mark.parametrize(("layer_type", "shapes"), [
    ("SoftmaxWithLoss", [(2, 3, 2), (2, 1, 2)]),
    ("SigmoidCrossEntropyLoss", [(2, 3), (2, 3, 1)]),
    ("EuclideanLoss", [(2, 3), (2, 1, 3)]),
    ("HingeLoss", [(4, 3), (4, 1, 1, 1)]),
    ("InfogainLoss", [(2, 3, 2), (2, 2), (3, 3)]),
    ("MultinomialLogisticLoss", [(4, 5), (4, 1)]),
])
def test_losses_take_labels_shaped_otherwise_behind_the_same_first_axis(layer_type, shapes):
    assert one_layer_net(layer_type, shapes).top_blobs[-1][0].shape == ()


# ----------------------------------------------------------------------------- InfogainLoss

def caffe_infogain(x, labels, h, axis, normalization, ignore_label, loss_weight):
    """InfogainLossLayer's Forward_cpu and Backward_cpu loops over the flat arrays, with its get_normalizer."""
    prob = np.exp(x - x.max(axis=axis, keepdims=True))
    prob = (prob / prob.sum(axis=axis, keepdims=True)).reshape(-1)
    label = labels.reshape(-1)
    outer, classes = int(np.prod(x.shape[:axis])), x.shape[axis]
    inner = x.size // (outer * classes)
    diff, loss, count = np.zeros(x.size), 0.0, 0
    for i in range(outer):
        for j in range(inner):
            value = int(label[i * inner + j])
            if ignore_label is not None and value == ignore_label:
                continue
            for k in range(classes):
                at = i * inner * classes + k * inner + j
                loss -= h[value, k] * np.log(max(prob[at], 1e-20))
                diff[at] = prob[at] * h[value].sum() - h[value, k]
            count += 1
    normalizer = max(1.0, {"FULL": outer * inner, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[normalization])
    return loss / normalizer, diff.reshape(x.shape) * loss_weight / normalizer


@pytest.mark.parametrize("normalization", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore_label", [None, 2])
@pytest.mark.parametrize("device", DEVICES)
def test_infogain_normalizes_forward_and_backward_as_caffes_get_normalizer(normalization, ignore_label, device):
    """Classes on axis 2, so outer (BATCH_SIZE) is N*C and not N; a probability that underflows to 0 is clamped
    at kLOG_THRESHOLD (1e-20) before its log."""
    x = RNG.uniform(-2, 2, (2, 2, 3, 2))
    x[0, 1, 1, 0] = -1000.0  # p = 0 at a class whose H entry is not 0
    labels = np.array([[[0, 2], [2, 1]], [[1, 1], [2, 0]]], float)
    loss_param = {"normalization": normalization, **({} if ignore_label is None else {"ignore_label": ignore_label})}
    net = one_layer_net("InfogainLoss", [x.shape, labels.shape, H.shape], bottoms=[x, labels, H], device=device,
                        params={"infogain_loss_param": {"axis": 2}, "loss_param": loss_param})
    loss, (dx, _, _) = forward_backward(net, loss_weight=1.5)
    expected_loss, expected_dx = caffe_infogain(x, labels, H, 2, normalization, ignore_label, 1.5)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-10, atol=1e-15)


def test_infogain_refuses_the_deprecated_normalize_as_caffe():
    params = {"loss_param": {"normalize": True}}
    message = one_line_error(lambda: one_layer_net("InfogainLoss", [(2, 3), (2,), (3, 3)], params=params))
    assert "layer 'under_test'" in message and "loss_param.normalize" in message and "normalization" in message


# ----------------------------------------------------------------------------- ContrastiveLoss

def caffe_contrastive(a, b, y, margin, legacy_version, loss_weight):
    """ContrastiveLossLayer's Forward_cpu, and its Backward_cpu with the legacy form (whose gradient is exact)."""
    num = a.shape[0]
    diff = a.reshape(num, -1) - b.reshape(num, -1)  # (caffe_sub over the flat arrays)
    y = y.reshape(-1)
    loss, grad = 0.0, np.zeros_like(diff)
    for i in range(num):
        dist_sq = diff[i] @ diff[i]
        if int(y[i]):
            loss += dist_sq
            grad[i] = loss_weight / num * diff[i]
        elif legacy_version:
            loss += max(margin - dist_sq, 0.0)
            grad[i] = -loss_weight / num * diff[i] if margin - dist_sq > 0 else 0.0
        else:
            loss += max(margin - np.sqrt(dist_sq), 0.0) ** 2
    return loss / num / 2, grad


@pytest.mark.parametrize("shapes", [
    [(4, 3), (4, 3), (4,)],
    [(4, 3, 1, 1), (4, 3, 1, 1), (4, 1, 1, 1)],
    [(4, 3), (4, 3, 1, 1), (4, 1)],
    [(4, 3, 1), (4, 3), (4, 1, 1)],
], ids=["N,C", "N,C,1,1", "mixed", "N,C,1"])
@pytest.mark.parametrize("legacy_version", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_contrastive_takes_n_c_and_n_c_1_1_as_caffes_legacy_accessors_do(shapes, legacy_version, device):
    a, b = RNG.uniform(-0.5, 0.5, shapes[0]), RNG.uniform(-0.5, 0.5, shapes[1])
    y = np.array([1.0, 0.0, 0.0, 1.0]).reshape(shapes[2])
    params = {"contrastive_loss_param": {"margin": 1.5, "legacy_version": legacy_version}}
    net = one_layer_net("ContrastiveLoss", shapes, bottoms=[a, b, y], params=params, device=device)
    loss, (da, db, _) = forward_backward(net, loss_weight=2.0)
    expected_loss, expected_grad = caffe_contrastive(a, b, y, 1.5, legacy_version, 2.0)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    if legacy_version:
        np.testing.assert_allclose(da.reshape(4, 3), expected_grad, rtol=1e-12)
        np.testing.assert_allclose(db.reshape(4, 3), -expected_grad, rtol=1e-12)
    gradient_check(net)


@pytest.mark.parametrize(("shapes", "expected"), [
    ([(4, 3, 2, 1), (4, 3, 2, 1), (4,)], "bottom 'b0' has shape (4, 3, 2, 1)"),
    ([(4, 3), (4, 3, 1, 2), (4,)], "bottom 'b1' has shape (4, 3, 1, 2)"),
    ([(4, 2, 3), (4, 6), (4,)], "bottom 'b0' has shape (4, 2, 3)"),
    ([(4, 3, 1, 1, 1), (4, 3), (4,)], "bottom 'b0' has shape (4, 3, 1, 1, 1)"),
    ([(4, 3), (4, 3), (2, 2)], "similarity bottom 'b2' has shape (2, 2)"),
    ([(4, 3), (4, 3), (4, 1, 1, 1, 1)], "similarity bottom 'b2' has shape (4, 1, 1, 1, 1)"),
])
def test_contrastive_refuses_what_caffes_height_and_width_checks_refuse(shapes, expected):
    message = one_line_error(lambda: one_layer_net("ContrastiveLoss", shapes))
    assert "layer 'under_test'" in message and expected in message
