"""MultiHeadAttention: a naive reference, PyTorch's layer, gradients, the causal mask, bad bottoms."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from devices import DEVICES

from netspec import load_net
from netspec.errors import ConfigError, ParamError, ShapeError
from netspec.testing import (
    check_accumulation,
    check_forward,
    check_reshape,
    gradient_check,
    one_layer_net,
    run_forward,
)

RNG = np.random.default_rng(20)
BLOCK = "multi_head_attention_param"


def rand(*shape):
    return RNG.uniform(-1, 1, shape)


def ref_attention(bottoms, params, block):
    """Attention one head, one example and one query position at a time, in float64."""
    p = block[BLOCK]
    query, key, value = bottoms * 3 if len(bottoms) == 1 else bottoms
    n, tq, e = query.shape
    tk = key.shape[1]
    w_in, b_in, w_out, b_out = params if len(params) == 4 else (params[0], np.zeros(3 * e), params[1], np.zeros(e))
    q = query @ w_in[:e].T + b_in[:e]
    k = key @ w_in[e:2 * e].T + b_in[e:2 * e]
    v = value @ w_in[2 * e:].T + b_in[2 * e:]
    d = e // p["num_heads"]
    context = np.zeros((n, tq, e))
    for b in range(n):
        for h in range(p["num_heads"]):
            cols = slice(h * d, (h + 1) * d)
            for i in range(tq):
                seen = range(i + 1) if p.get("causal") else range(tk)
                scores = np.array([q[b, i, cols] @ k[b, j, cols] / math.sqrt(d) for j in seen])
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                context[b, i, cols] = sum(w * v[b, j, cols] for w, j in zip(weights, seen))
    return [context @ w_out.T + b_out]


FORMS = {  # bottoms, parameters
    "self": ([rand(2, 4, 6)], {"num_heads": 2}),
    "self_causal": ([rand(2, 5, 6)], {"num_heads": 3, "causal": True}),
    "self_nobias": ([rand(3, 4, 4)], {"num_heads": 2, "bias_term": False}),
    "qkv": ([rand(2, 3, 6), rand(2, 5, 6), rand(2, 5, 6)], {"num_heads": 2}),
    "qkv_causal": ([rand(2, 4, 6), rand(2, 4, 6), rand(2, 4, 6)], {"num_heads": 3, "causal": True}),
    "qkv_nobias_one_head": ([rand(2, 2, 4), rand(2, 3, 4), rand(2, 3, 4)], {"num_heads": 1, "bias_term": False}),
}


def build(form, dtype=np.float64, device="cpu"):
    bottoms, p = FORMS[form]
    return one_layer_net("MultiHeadAttention", [b.shape for b in bottoms], params={BLOCK: p}, bottoms=bottoms,
                         dtype=dtype, device=device)


def reference(form):
    return lambda bottoms, params: ref_attention(bottoms, params, {BLOCK: FORMS[form][1]})


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("device", DEVICES)
def test_forward_matches_the_naive_reference(form, device):
    check_forward(build(form, device=device), reference(form))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_finite_differences(form, device):
    gradient_check(build(form, device=device))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("device", DEVICES)
def test_param_diffs_accumulate_and_bottom_diffs_overwrite(form, device):
    check_accumulation(build(form, device=device))


@pytest.mark.parametrize("form", ["self_causal", "qkv"])
@pytest.mark.parametrize("device", DEVICES)
def test_reshape_to_a_new_batch_size(form, device):
    check_reshape(build(form, device=device), reference(form))


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_to_a_new_length_moves_the_causal_mask(device):
    net = build("self_causal", device=device)
    check_reshape(net, reference("self_causal"), bottoms=[rand(2, 7, 6)])


def test_float32_agrees_with_float64():
    wide, narrow = build("qkv"), build("qkv", dtype=np.float32)
    for blob, value in zip(narrow.layers[-1].blobs, wide.layers[-1].blobs):
        blob.data[...] = value.data
    (expected,), (got,) = run_forward(wide), run_forward(narrow)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_is_three_bottoms_fed_one_array_and_sums_their_gradients():
    x = rand(2, 4, 6)
    one = one_layer_net("MultiHeadAttention", [x.shape], params={BLOCK: {"num_heads": 3}}, bottoms=[x])
    three = one_layer_net("MultiHeadAttention", [x.shape] * 3, params={BLOCK: {"num_heads": 3}}, bottoms=[x] * 3)
    for blob, value in zip(three.layers[-1].blobs, one.layers[-1].blobs):
        blob.data[...] = value.data
    (y_one,), (y_three,) = run_forward(one), run_forward(three)
    np.testing.assert_allclose(y_one, y_three, rtol=1e-12)
    for net in (one, three):
        net.top_blobs[-1][0].diff[...] = np.linspace(-1, 1, y_one.size).reshape(y_one.shape)
        net.layers[-1].backward(net.top_blobs[-1], [True] * len(net.bottom_blobs[-1]), net.bottom_blobs[-1])
    np.testing.assert_allclose(one.bottom_blobs[-1][0].diff, sum(b.diff for b in three.bottom_blobs[-1]),
                               rtol=1e-10, atol=1e-12)
    for a, b in zip(one.layers[-1].blobs, three.layers[-1].blobs):
        np.testing.assert_allclose(a.diff, b.diff, rtol=1e-10, atol=1e-12)


def test_causal_outputs_do_not_depend_on_later_positions():
    net = build("self_causal")
    (before,) = run_forward(net)
    net.bottom_blobs[-1][0].data[:, 3:] = rand(2, 2, 6)
    (after,) = run_forward(net)
    np.testing.assert_array_equal(after[:, :3], before[:, :3])
    assert not np.allclose(after[:, 3:], before[:, 3:])


def test_learnable_blobs_have_pytorchs_shapes_and_order():
    shapes = {form: [b.shape for b in build(form).layers[-1].blobs] for form in ("self", "self_nobias")}
    assert shapes == {"self": [(18, 6), (18,), (6, 6), (6,)], "self_nobias": [(12, 4), (4, 4)]}


def test_default_fillers_are_pytorchs_xavier_weights_and_zero_biases():
    net = load_net("""
layers:
  - {name: data, type: Input, top: x, input_param: {shape: [{dim: [1, 2, 8]}]}}
  - {name: attn, type: MultiHeadAttention, bottom: x, top: y, multi_head_attention_param: {num_heads: 2}}
""")
    w_in, b_in, w_out, b_out = (b.data for b in net.layers[-1].blobs)
    assert np.abs(w_in).max() <= math.sqrt(6 / (8 + 24)) and np.abs(w_out).max() <= math.sqrt(6 / 16)
    assert w_in.std() > 0.1 and not b_in.any() and not b_out.any()


@pytest.mark.parametrize("form", ["self", "self_causal", "qkv", "qkv_nobias_one_head"])
def test_matches_torch_multihead_attention(form):
    torch = pytest.importorskip("torch")
    bottoms, p = FORMS[form]
    net = build(form)
    weights = [b.data for b in net.layers[-1].blobs]
    e = bottoms[0].shape[2]
    module = torch.nn.MultiheadAttention(e, p["num_heads"], bias=p.get("bias_term", True), batch_first=True,
                                         dtype=torch.float64)
    names = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    module.load_state_dict(dict(zip(names if p.get("bias_term", True) else names[::2], map(torch.tensor, weights))))
    query, key, value = (torch.tensor(b) for b in (bottoms * 3 if len(bottoms) == 1 else bottoms))
    mask = torch.ones(query.shape[1], key.shape[1], dtype=torch.bool).triu(1) if p.get("causal") else None
    expected, _ = module(query, key, value, attn_mask=mask, need_weights=False)
    (got,) = run_forward(net)
    np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_inplace_is_refused():
    with pytest.raises(ConfigError, match="cannot run in place"):
        one_layer_net("MultiHeadAttention", [(2, 3, 4)], params={BLOCK: {"num_heads": 2}}, inplace=True)


def describe(bottom_shapes, **p):
    """What the layer class says of these bottom shapes, as the graph asks it (raises what it raises)."""
    layer = build("self").layers[-1]
    spec = dataclasses.replace(layer.spec, bottoms=[f"b{i}" for i in range(len(bottom_shapes))],
                               blocks={BLOCK: dataclasses.replace(layer.params, **p)})
    return type(layer).describe(spec, "TRAIN", bottom_shapes)


HEADS, CAUSAL = f"{BLOCK}.num_heads", f"{BLOCK}.causal"


@pytest.mark.parametrize(("shapes", "p", "error", "key", "message"), [
    ([(2, 3, 6)], {"num_heads": 4}, ShapeError, HEADS, r"^4 heads do not divide the embedding size E = 6$"),
    ([(2, 3, 6)], {"num_heads": 0}, ParamError, HEADS, r"^must be a positive integer, got 0$"),
    ([(2, 6)], {}, ShapeError, None, r"^bottom 'b0' \(x\) has shape \(2, 6\): expected \(N, T, E\), batch first$"),
    ([(2, 3, 6), (2, 5, 6, 1), (2, 5, 6)], {}, ShapeError, None, r"^bottom 'b1' \(key\) has shape \(2, 5, 6, 1\)"),
    ([(2, 3, 6), (2, 5, 4), (2, 5, 4)], {}, ShapeError, None,
     r"^bottom 'b1' \(key\) has shape \(2, 5, 4\): expected N = 2 and E = 6, as the query \(2, 3, 6\)$"),
    ([(2, 3, 6), (2, 5, 6), (3, 5, 6)], {}, ShapeError, None, r"^bottom 'b2' \(value\) has shape \(3, 5, 6\)"),
    ([(2, 3, 6), (2, 5, 6), (2, 4, 6)], {}, ShapeError, None,
     r"^the key 'b1' \(2, 5, 6\) and the value 'b2' \(2, 4, 6\) must have one length T_k$"),
    ([(2, 3, 6), (2, 5, 6), (2, 5, 6)], {"causal": True}, ShapeError, CAUSAL,
     r"^causal needs the query and the key of one length, got T_q = 3 and T_k = 5$"),
    ([(2, 3, 6), (2, 3, 6)], {}, ShapeError, "bottom", r"^MultiHeadAttention takes 1 bottom \(self-attention\) or 3"),
])
def test_bad_bottoms_and_params_are_one_line_errors_naming_the_key(shapes, p, error, key, message):
    with pytest.raises(error, match=message) as info:
        describe(shapes, **{"num_heads": 2, **p})
    assert "\n" not in str(info.value) and info.value.key == key


def test_a_bad_layer_in_a_net_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"layer 'under_test': multi_head_attention_param.num_heads: 4 heads do not "
                                          r"divide the embedding size E = 6$"):
        one_layer_net("MultiHeadAttention", [(2, 3, 6)], params={BLOCK: {"num_heads": 4}})
    with pytest.raises(ConfigError, match="num_heads"):
        one_layer_net("MultiHeadAttention", [(2, 3, 6)])
