"""Graph semantics from inline YAML: phases, splits, in-place, sharing, need-backward, loss weights, outputs."""

from __future__ import annotations

import numpy as np
import pytest

import netspec
from netspec import ConfigError
from netspec.engine.net import compile_net
from netspec.engine.registry import layer_schemas
from netspec.spec.net_spec import parse_net

HEAD = """
layers:
  - {name: data, type: Input, top: [data, label], input_param: {shape: [{dim: [2, 3]}, {dim: [2]}]}}
"""


def graph(text, phase="TRAIN", **kwargs):
    return compile_net(parse_net(text, layer_schemas()), phase=phase, **kwargs)


def names(g):
    return [n.name for n in g.nodes]


def test_phase_stage_and_level_filtering():
    text = HEAD + """
  - {name: a, type: ReLU, bottom: data, top: a, include: {phase: TRAIN}}
  - {name: b, type: ReLU, bottom: data, top: b, include: {phase: TEST}}
  - {name: c, type: ReLU, bottom: data, top: c, include: {stage: deploy}}
  - {name: d, type: ReLU, bottom: data, top: d, exclude: {min_level: 2}}
  - {name: e, type: ReLU, bottom: data, top: e, include: [{phase: TEST}, {not_stage: x, max_level: 0}]}
"""
    assert set(names(graph(text))) >= {"a", "d", "e"} and "b" not in names(graph(text))
    assert "c" in names(graph(text, stages=["deploy"]))
    assert "d" not in names(graph(text, level=2))
    assert "e" not in names(graph(text, stages=["x"]))
    assert "e" in names(graph(text, phase="TEST", stages=["x"]))


def test_include_and_exclude_together_is_an_error():
    with pytest.raises(ConfigError, match="not both"):
        graph(HEAD + "  - {name: a, type: ReLU, bottom: data, top: a, include: {phase: TRAIN}, exclude: {phase: TEST}}\n")


def test_fan_out_inserts_split_and_sums_gradients():
    g = graph(HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: l1, type: EuclideanLoss, bottom: [ip, data], top: l1}
  - {name: l2, type: EuclideanLoss, bottom: [ip, data], top: l2, loss_weight: 2}
""")
    split = [n for n in g.nodes if n.layer.type == "Split"]
    assert [n.name for n in split] == ["data_data_0_split", "ip_ip_0_split"]
    assert names(g).index("ip_ip_0_split") == names(g).index("ip") + 1
    assert g.nodes[names(g).index("l1")].bottoms == ["ip_ip_0_split_0", "data_data_0_split_1"]


def test_split_gradient_equals_sum_of_consumers():
    text = HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3, weight_filler: {type: gaussian}}}
  - {name: t1, type: TanH, bottom: ip, top: t1}
  - {name: t2, type: Sigmoid, bottom: ip, top: t2}
  - {name: r1, type: Reduction, bottom: t1, top: r1, loss_weight: 1}
  - {name: r2, type: Reduction, bottom: t2, top: r2, loss_weight: 1}
"""
    net = netspec.load_net(text, phase="TRAIN", dtype=np.float64, seed=0)
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal((2, 3))
    net.forward_backward()
    y = net.blobs["ip"].data
    expected = (1 - np.tanh(y) ** 2) + (1 / (1 + np.exp(-y))) * (1 - 1 / (1 + np.exp(-y)))
    np.testing.assert_allclose(net.blobs["ip"].diff, expected)


def test_inplace_chain_and_split_on_inplace_blob():
    g = graph(HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: relu, type: ReLU, bottom: ip, top: ip}
  - {name: l1, type: EuclideanLoss, bottom: [ip, data], top: l1}
  - {name: l2, type: EuclideanLoss, bottom: [ip, data], top: l2}
""")
    relu = g.nodes[names(g).index("relu")]
    assert relu.inplace == [True] and relu.tops == ["ip"]
    assert "ip_relu_0_split" in names(g)


def test_blob_errors_name_layer_and_line():
    with pytest.raises(ConfigError) as info:
        graph(HEAD + """
  - {name: a, type: ReLU, bottom: dat, top: a}
  - {name: b, type: ReLU, bottom: c, top: b}
  - {name: c, type: ReLU, bottom: data, top: c}
  - {name: d, type: ReLU, bottom: data, top: a}
  - {name: e, type: AbsVal, bottom: data, top: data}
""")
    text = str(info.value)
    assert "<string>:5: layer 'a': bottom: bottom 'dat' is not produced by any earlier layer; did you mean 'data'?" in text
    assert "produced later, by layer 'c' (line 7)" in text
    assert "top 'a' is already produced by layer 'a' (line 5)" in text
    assert "cannot run in place" in text
    assert len(info.value.problems) == 4


def test_a_wrong_bottom_on_an_in_place_layer_is_the_only_error():
    with pytest.raises(ConfigError) as info:
        graph(HEAD + """
  - {name: fc, type: InnerProduct, bottom: data, top: fc, inner_product_param: {num_output: 4}}
  - {name: relu, type: ReLU, bottom: fcc, top: fc}
""")
    assert [str(p) for p in info.value.problems] == [
        "<string>:6: layer 'relu': bottom: bottom 'fcc' is not produced by any earlier layer; did you mean 'fc'?"]


def test_self_cycle_is_reported():
    with pytest.raises(ConfigError, match="cycle"):
        graph(HEAD + "  - {name: a, type: Eltwise, bottom: [data, a], top: a}\n")


def test_weight_sharing_by_name():
    text = HEAD + """
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, param: [{name: w}, {name: b}],
     inner_product_param: {num_output: 3, weight_filler: {type: gaussian}}}
  - {name: ip2, type: InnerProduct, bottom: data, top: ip2, param: [{name: w}, {name: b}],
     inner_product_param: {num_output: 3}}
  - {name: loss, type: EuclideanLoss, bottom: [ip1, ip2], top: loss}
"""
    net = netspec.load_net(text, phase="TRAIN", dtype=np.float64)
    assert np.shares_memory(net.params["ip1"][0].data, net.params["ip2"][0].data)
    assert net.graph.learnable_count() == 12
    assert list(net.owned_params()) == ["ip1"]
    net.params["ip1"][0].data[...] = 1.0
    net.forward_backward()
    assert len(net.learnable_params()) == 2


@pytest.mark.parametrize("second, message", [
    ("{name: w, lr_mult: 2}", "lr_mult 2.0 here but 1.0"),
    ("{name: w}", "has shape (4, 3) here but (3, 3)"),
    ("{name: w, share_mode: PERMISSIVE}", "12 values here but 9"),
])
def test_weight_sharing_errors(second, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        graph(HEAD + f"""
  - {{name: ip1, type: InnerProduct, bottom: data, top: ip1, param: [{{name: w}}], inner_product_param: {{num_output: 3}}}}
  - {{name: ip2, type: InnerProduct, bottom: data, top: ip2, param: [{second}],
     inner_product_param: {{num_output: {4 if 'lr_mult' not in second else 3}}}}}
""")


def test_permissive_sharing_allows_equal_counts():
    g = graph(HEAD + """
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, param: [{name: w}], inner_product_param: {num_output: 2}}
  - {name: ip2, type: InnerProduct, bottom: data, top: ip2, param: [{name: w, share_mode: PERMISSIVE}],
     inner_product_param: {num_output: 2, transpose: true}}
""", phase="TRAIN")
    assert g.nodes[names(g).index("ip2")].param_owners[0] == (names(g).index("ip1"), 0)


def test_need_backward_inference():
    g = graph(HEAD + """
  - {name: frozen, type: InnerProduct, bottom: data, top: f, param: [{lr_mult: 0}, {lr_mult: 0}], inner_product_param: {num_output: 3}}
  - {name: ip, type: InnerProduct, bottom: f, top: ip, inner_product_param: {num_output: 3}}
  - {name: side, type: InnerProduct, bottom: data, top: side, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
""")
    node = {n.name: n for n in g.nodes}
    assert not node["frozen"].need_backward
    assert node["ip"].need_backward and node["ip"].bottom_need_backward == [False]
    assert not node["side"].need_backward
    assert node["loss"].bottom_need_backward == [True, False]
    assert set(g.outputs) == {"side", "loss"}


def test_propagate_down_and_force_backward():
    g = graph("force_backward: true\n" + HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: loss, type: EuclideanLoss, bottom: [ip, data], top: loss, propagate_down: [true, false]}
""")
    node = {n.name: n for n in g.nodes}
    assert node["ip"].bottom_need_backward == [True]
    assert node["loss"].bottom_need_backward == [True, False]


def test_loss_weights_default_and_explicit():
    g = graph(HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: [loss, prob]}
  - {name: aux, type: Reduction, bottom: prob, top: aux, loss_weight: 0.5}
""")
    node = {n.name: n for n in g.nodes}
    assert node["loss"].loss_weights == [1.0, 0.0]
    assert node["aux"].loss_weights == [0.5]


def test_loss_top_that_is_also_consumed_gets_weight_plus_consumer_gradient():
    text = HEAD + """
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 1, weight_filler: {type: gaussian}}}
  - {name: sq, type: Reduction, bottom: ip, top: s, loss_weight: 1, reduction_param: {operation: SUMSQ}}
  - {name: more, type: Power, bottom: s, top: more, loss_weight: 1, power_param: {scale: 3}}
"""
    net = netspec.load_net(text, phase="TRAIN", dtype=np.float64, seed=0)
    net.blobs["data"].data[...] = 1.0
    loss = net.forward_backward()
    s = float(net.blobs["s"].data)
    assert loss == pytest.approx(4 * s)
    np.testing.assert_allclose(net.blobs["ip"].diff, 2 * net.blobs["ip"].data * 4)


def test_shape_errors_are_collected_with_layer_and_line():
    with pytest.raises(ConfigError) as info:
        graph(HEAD + """
  - {name: cat, type: Concat, bottom: [data, label], top: cat, concat_param: {axis: 0}}
  - {name: sum, type: Eltwise, bottom: [data, label], top: sum}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution_param: {num_output: 2, kernel_size: 3}}
""")
    text = str(info.value)
    assert "<string>:5: layer 'cat'" in text and "cannot concatenate along axis 0" in text
    assert "<string>:6: layer 'sum'" in text and "bottoms must have one shape" in text
    assert "<string>:7: layer 'conv'" in text and "4-axis bottom" in text


def test_static_shapes_known_before_allocation():
    g = graph(HEAD.replace("[2, 3]", "[2, 3, 9, 9]") + """
  - {name: pool, type: Pooling, bottom: data, top: pool, pooling_param: {kernel_size: 3, stride: 2, pad: 1}}
""")
    assert g.blob_shapes["pool"] == (2, 3, 5, 5)
