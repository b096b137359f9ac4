"""`netspec export onnx`: outputs match netspec's through onnxruntime; layers without an equivalent are named."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from test_cli import run

import netspec
from netspec.engine.deploy import deploy_net_yaml, derive_deploy_net

ROOT = Path(__file__).parent.parent
RESNET_BLOCK = f"""name: block
include: {ROOT}/configs/resnet50/resnet_blocks.yaml
layers:
  - {{name: data, type: Input, top: data, input_param: {{shape: {{dim: [2, 16, 9, 9]}}}}}}
  - {{use: projection, bottom: data, top: res2a, with: {{block: 2a, mid: 8, out: 32, stride: 2}}}}
  - {{use: identity, bottom: res2a, top: res2b, with: {{block: 2b, mid: 8, out: 32}}}}
"""
INCEPTION_BLOCK = f"""name: inception
include: {ROOT}/configs/googlenet/inception_blocks.yaml
layers:
  - {{name: data, type: Input, top: data, input_param: {{shape: {{dim: [2, 16, 7, 7]}}}}}}
  - {{use: inception, bottom: data, top: out, with: {{id: 3a, c1: 4, r3: 6, c3: 8, r5: 2, c5: 4, pool_proj: 4}}}}
"""
POOLS = """name: pools
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 10, 11]}}}
  - {name: max, type: Pooling, bottom: data, top: max, pooling_param: {pool: MAX, kernel_size: 3, stride: 2, pad: 1}}
  - {name: ave, type: Pooling, bottom: data, top: ave, pooling_param: {pool: AVE, kernel_size: 3, stride: 2, pad: 1}}
  - {name: ave0, type: Pooling, bottom: data, top: ave0, pooling_param: {pool: AVE, kernel_size: 3, stride: 2}}
  - {name: sum, type: Eltwise, bottom: [ave, max], top: sum, eltwise_param: {coeff: [0.5, -2]}}
"""
FCN = """name: fcn
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 8, 8]}}}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution_param: {num_output: 4, kernel_size: 3,
                                                                                  pad: 1, stride: 2}}
  - {name: up, type: Deconvolution, bottom: conv, top: up, convolution_param: {num_output: 4, group: 2,
                                                                                kernel_size: 4, stride: 2}}
  - {name: crop, type: Crop, bottom: [up, data], top: score, crop_param: {offset: 1}}
"""
ACTIVATIONS = """name: activations
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 4, 5]}}}
  - {name: wide, type: Convolution, bottom: data, top: wide, convolution_param: {num_output: 3, kernel_size: 1}}
  - {name: relu6, type: ReLU6, bottom: wide, top: a}
  - {name: hsig, type: HardSigmoid, bottom: wide, top: b, hard_sigmoid_param: {alpha: 0.2}}
  - {name: hswish, type: HardSwish, bottom: wide, top: c}
  - {name: swish, type: Swish, bottom: wide, top: d, swish_param: {beta: 1.5}}
  - {name: silu, type: Swish, bottom: wide, top: e}
  - {name: ln, type: LayerNorm, bottom: wide, top: f, layer_norm_param: {axis: 1}}
"""

GELU_ADAPTIVE_MATMUL = """name: gelu_adaptive_matmul
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 4, 6, 8]}}}
  - {name: gelu, type: GELU, bottom: data, top: gelu}
  - {name: gelu_tanh, type: GELU, bottom: data, top: gelu_tanh, gelu_param: {approximate: tanh}}
  - {name: ave, type: Pooling, bottom: gelu, top: ave, pooling_param: {pool: AVE, output_size: [3, 4]}}
  - {name: max, type: Pooling, bottom: gelu_tanh, top: max, pooling_param: {pool: MAX, output_h: 2, output_w: 2}}
  - {name: global, type: Pooling, bottom: data, top: global, pooling_param: {pool: MAX, output_size: 1}}
  - {name: scores, type: MatMul, bottom: [gelu, gelu_tanh], top: scores, mat_mul_param: {transpose_b: true}}
  - {name: mix, type: MatMul, bottom: [ave, ave], top: mix, mat_mul_param: {transpose_a: true}}
  - {name: flat, type: Flatten, bottom: max, top: flat}
  - {name: gram, type: MatMul, bottom: [flat, flat], top: gram, mat_mul_param: {transpose_b: true}}
  - {name: outer, type: MatMul, bottom: [flat, flat], top: outer, mat_mul_param: {transpose_a: true}}
"""
ATTENTION = """name: attention
layers:
  - {name: data, type: Input, top: [data, key, value], input_param: {shape: [{dim: [2, 5, 8]}, {dim: [2, 7, 8]},
                                                                            {dim: [2, 7, 8]}]}}
  - {name: self, type: MultiHeadAttention, bottom: data, top: self, multi_head_attention_param: {num_heads: 2}}
  - {name: causal, type: MultiHeadAttention, bottom: data, top: causal,
     multi_head_attention_param: {num_heads: 4, causal: true}}
  - {name: cross, type: MultiHeadAttention, bottom: [data, key, value], top: cross,
     multi_head_attention_param: {num_heads: 2, bias_term: false}}
"""
TRANSFORMER_BLOCK = """name: transformer_block
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 6, 8]}}}
  - {name: ln1, type: LayerNorm, bottom: data, top: ln1, layer_norm_param: {axis: 2}}
  - {name: attention, type: MultiHeadAttention, bottom: ln1, top: attention,
     multi_head_attention_param: {num_heads: 2, causal: true}}
  - {name: add1, type: Eltwise, bottom: [data, attention], top: mid}
  - {name: ln2, type: LayerNorm, bottom: mid, top: ln2, layer_norm_param: {axis: 2}}
  - {name: fc1, type: InnerProduct, bottom: ln2, top: fc1, inner_product_param: {num_output: 16, axis: 2}}
  - {name: gelu, type: GELU, bottom: fc1, top: gelu}
  - {name: fc2, type: InnerProduct, bottom: gelu, top: fc2, inner_product_param: {num_output: 8, axis: -1,
                                                                                  bias_term: false}}
  - {name: add2, type: Eltwise, bottom: [mid, fc2], top: out}
"""
BIAS_PERMUTE_REDUCTION = """name: bias_permute_reduction
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 4, 5]}}}
  - {name: position, type: Bias, bottom: data, top: data, bias_param: {axis: 1, num_axes: 2}}
  - {name: last, type: Bias, bottom: data, top: shifted, bias_param: {axis: -1, num_axes: -1}}
  - {name: nhwc, type: Permute, bottom: shifted, top: nhwc, permute_param: {order: [0, 2, 3, 1]}}
  - {name: mean, type: Reduction, bottom: nhwc, top: mean, reduction_param: {operation: MEAN, axis: 2}}
  - {name: sum, type: Reduction, bottom: data, top: sum, reduction_param: {axis: 1, coeff: 0.5}}
  - {name: asum, type: Reduction, bottom: data, top: asum, reduction_param: {operation: ASUM, axis: -1}}
  - {name: sumsq, type: Reduction, bottom: data, top: sumsq, reduction_param: {operation: SUMSQ}}
  - {name: fc, type: InnerProduct, bottom: nhwc, top: fc, inner_product_param: {num_output: 6, axis: 2}}
  - {name: fc_t, type: InnerProduct, bottom: nhwc, top: fc_t, inner_product_param: {num_output: 2, axis: 0,
                                                                                    transpose: true}}
"""


def randomised(source, tmp_path):
    """The net with random weights (and BatchNorm statistics), saved, and its inputs by name."""
    net = netspec.load_net(source, phase="TEST", seed=0)
    rng = np.random.default_rng(1)
    for blobs in net.params.values():
        for blob in blobs:
            blob.data[...] = rng.normal(0, 0.3, blob.shape)
    for layer in net.layers:
        if layer.type == "BatchNorm":
            layer.blobs[1].data[...] = np.abs(layer.blobs[1].data) + 0.5
            layer.blobs[2].data[...] = 2.0
    weights = tmp_path / "w.h5"
    net.save_weights(weights)
    return net, weights, {name: rng.normal(0, 1, net.blobs[name].shape).astype(np.float32)
                          for name in net.data_layer().spec.tops}


@pytest.mark.parametrize("name, source", [
    ("lenet", str(ROOT / "configs" / "lenet" / "lenet_deploy.yaml")),
    ("cifar10_quick", str(ROOT / "configs" / "cifar10" / "cifar10_quick_deploy.yaml")),
    ("resnet_block", RESNET_BLOCK), ("inception_block", INCEPTION_BLOCK), ("caffe_pooling", POOLS),
    ("fcn_deconvolution_crop", FCN), ("activations", ACTIVATIONS), ("gelu_adaptive_matmul", GELU_ADAPTIVE_MATMUL)])
def test_onnxruntime_computes_what_netspec_computes(tmp_path, name, source):
    check_with_onnxruntime(tmp_path, source)


def check_with_onnxruntime(tmp_path, source, opset=17):
    """Export ``source`` (at ``opset``) and compare every output onnxruntime computes with netspec's."""
    net, weights, inputs = randomised(source, tmp_path)
    net_file = tmp_path / "net.yaml"
    net_file.write_text(Path(source).read_text() if source.endswith(".yaml") else source)
    result = run("export", "onnx", net_file, "--weights", weights, "-o", tmp_path / "m.onnx", "--opset", opset)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {tmp_path / 'm.onnx'} (opset {opset}, ")
    for name_, x in inputs.items():
        net.blobs[name_].data[...] = x
    net.forward()
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    names = [output.name for output in session.get_outputs()]
    assert names == net.outputs
    for name_, value in zip(names, session.run(None, inputs)):
        scale = max(1.0, float(np.abs(net.blobs[name_].data).max()))
        np.testing.assert_allclose(value, net.blobs[name_].data, atol=1e-4 * scale, rtol=1e-4)


def test_layers_without_an_onnx_equivalent_are_named(tmp_path):
    lenet = ROOT / "configs" / "lenet" / "lenet_timing.yaml"
    weights = tmp_path / "w.h5"
    netspec.load_net(str(lenet), phase="TEST").save_weights(weights)
    result = run("export", "onnx", lenet, "--weights", weights, "-o", tmp_path / "m.onnx")
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: no ONNX equivalent for layer(s) 'mnist' (DummyData), 'accuracy' "
                                     "(Accuracy), 'loss' (SoftmaxWithLoss); export the deploy net (Input layers, "
                                     "no losses or data layers)")
    assert not (tmp_path / "m.onnx").exists()


def test_from_opset_20_gelu_is_onnxs_own_operator_and_before_it_erf_or_tanh(tmp_path):
    check_with_onnxruntime(tmp_path, GELU_ADAPTIVE_MATMUL, opset=20)
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert operators["Gelu"] == 2 and not operators["Erf"] and not operators["Tanh"]
    assert operators["GlobalMaxPool"] == 1 and operators["Gemm"] == 2 and operators["Transpose"] == 2
    check_with_onnxruntime(tmp_path, GELU_ADAPTIVE_MATMUL, opset=17)
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert not operators["Gelu"] and operators["Erf"] == 1 and operators["Tanh"] == 1


def test_adaptive_pooling_with_windows_of_different_sizes_is_refused_in_a_line(tmp_path):
    net_file = tmp_path / "net.yaml"
    net_file.write_text("layers:\n"
                        "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 2, 7, 7]}}}\n"
                        "  - {name: pool, type: Pooling, bottom: data, top: pool, pooling_param: {output_size: 3}}\n")
    weights = tmp_path / "w.h5"
    netspec.load_net(str(net_file), phase="TEST").save_weights(weights)
    result = run("export", "onnx", net_file, "--weights", weights, "-o", tmp_path / "m.onnx")
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: layer 'pool' (Pooling): adaptive pooling of 7x7 to 3x3 has windows of "
                                     "different sizes, which ONNX's pooling cannot express; pick an output size "
                                     "that divides the input's")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_attention_exports_as_plain_operators_self_causal_and_query_key_value(tmp_path, opset):
    check_with_onnxruntime(tmp_path, ATTENTION, opset=opset)
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert operators["Softmax"] == 3 and operators["Transpose"] == 12 and operators["MatMul"] == 18
    assert operators["Add"] == 2 * 4 + 1  # the biases of two layers, the causal mask


@pytest.mark.parametrize("opset", [17, 21])
def test_a_transformer_block_exports(tmp_path, opset):
    check_with_onnxruntime(tmp_path, TRANSFORMER_BLOCK, opset=opset)


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_bias_permute_reduction_and_inner_product_on_later_axes_export(tmp_path, opset):
    check_with_onnxruntime(tmp_path, BIAS_PERMUTE_REDUCTION, opset=opset)
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert operators["ReduceMean"] == operators["ReduceL1"] == operators["ReduceSumSquare"] == 1
    assert operators["Gemm"] == 0 and operators["MatMul"] == 2


@pytest.mark.parametrize("opset", [17, 21])
def test_the_vit_digits_deploy_net_exports(tmp_path, opset):
    source = str(ROOT / "configs" / "vit_digits" / "vit_digits_net.yaml")
    deploy = deploy_net_yaml(derive_deploy_net(source, input_shape=(1, 8, 8), batch_size=2), source)
    assert "MultiHeadAttention" in deploy and "Reduction" in deploy
    check_with_onnxruntime(tmp_path, deploy, opset=opset)
