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

ROOT = Path(__file__).parent.parent.parent
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
  - {name: inside, type: Pooling, bottom: data, top: inside, pooling_param: {pool: AVE, kernel_size: 3, stride: 2,
                                                                             pad: 1, count_include_pad: false}}
"""
OVERHANG = """name: overhang
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 2, 7]}}}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution_param: {num_output: 4, kernel_size: 3,
                                                                                  stride: 2}}
"""  # (rows: Caffe's (2 - 3) / 2 + 1 = 1 output, its kernel reading a row of zeros past the input)
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
  - {name: log_prob, type: LogSoftmax, bottom: wide, top: g}
  - {name: log_last, type: LogSoftmax, bottom: wide, top: h, softmax_param: {axis: -1}}
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

CAFFE_ELEMENTWISE = """name: caffe_elementwise
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 4, 5]}}}
  - {name: wide, type: Convolution, bottom: data, top: wide, convolution_param: {num_output: 3, kernel_size: 1}}
  - {name: elu, type: ELU, bottom: wide, top: elu, elu_param: {alpha: 0.7}}
  - {name: prelu, type: PReLU, bottom: wide, top: prelu}
  - {name: prelu_shared, type: PReLU, bottom: elu, top: elu, prelu_param: {channel_shared: true}}
  - {name: bnll, type: BNLL, bottom: wide, top: bnll}
  - {name: exp, type: Exp, bottom: wide, top: exp}
  - {name: exp2, type: Exp, bottom: prelu, top: prelu, exp_param: {base: 2, scale: 0.5, shift: 0.1}}
  - {name: abs, type: AbsVal, bottom: wide, top: abs}
  - {name: log, type: Log, bottom: abs, top: log}
  - {name: log10, type: Log, bottom: abs, top: log10, log_param: {base: 10, scale: 2, shift: 0.5}}
  - {name: root, type: Power, bottom: abs, top: root, power_param: {power: 1.5, scale: 0.5, shift: 1}}
  - {name: square, type: Power, bottom: wide, top: square, power_param: {power: 2, scale: -1, shift: 0.5}}
  - {name: clip, type: Clip, bottom: wide, top: clip, clip_param: {min: -0.5, max: 0.7}}
  - {name: below, type: Clip, bottom: wide, top: below, clip_param: {max: 0.2}}
  - {name: mask, type: Threshold, bottom: bnll, top: bnll, threshold_param: {threshold: 0.7}}
  - {name: product, type: Eltwise, bottom: [clip, below, square], top: product, eltwise_param: {operation: PROD}}
  - {name: larger, type: Eltwise, bottom: [exp, log], top: larger, eltwise_param: {operation: MAX}}
  - {name: mvn, type: MVN, bottom: wide, top: mvn}
  - {name: mvn_all, type: MVN, bottom: wide, top: mvn_all, mvn_param: {across_channels: true, eps: 0.01}}
  - {name: centred, type: MVN, bottom: wide, top: centred, mvn_param: {normalize_variance: false}}
"""
SHAPES_AND_SEARCH = """name: shapes_and_search
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 10, 11]}}}
  - {name: spp, type: SPP, bottom: data, top: spp, spp_param: {pyramid_height: 3}}
  - {name: spp_ave, type: SPP, bottom: data, top: spp_ave, spp_param: {pyramid_height: 3, pool: AVE}}
  - {name: spp_one, type: SPP, bottom: data, top: spp_one, spp_param: {pyramid_height: 1}}
  - {name: tile, type: Tile, bottom: data, top: tile, tile_param: {tiles: 3}}
  - {name: tile_w, type: Tile, bottom: data, top: tile_w, tile_param: {axis: -1, tiles: 2}}
  - {name: padded, type: Pad, bottom: data, top: padded, pad_param: {before: [1, 0], after: [0, 2], value: -1.5}}
  - {name: mirrored, type: Pad, bottom: data, top: mirrored, pad_param: {axis: 1, before: 1, after: 2,
                                                                          mode: REFLECT}}
  - {name: edges, type: Pad, bottom: data, top: edges, pad_param: {before: 2, mode: EDGE}}
  - {name: nearer, type: Resize, bottom: data, top: nearer, resize_param: {scale: [1.5, 2]}}
  - {name: smooth, type: Resize, bottom: data, top: smooth, resize_param: {height: 5, width: 17, mode: LINEAR,
                                                                         coordinates: ALIGN_CORNERS}}
  - {name: halves, type: Slice, bottom: tile, top: [first, rest], slice_param: {slice_point: [2]}}
  - {name: thirds, type: Slice, bottom: data, top: [a, b, c], slice_param: {axis: 2, slice_point: [3, 7]}}
  - {name: pairs, type: Slice, bottom: data, top: [left, right], slice_param: {axis: -1, slice_point: [4]}}
  - {name: flat, type: Flatten, bottom: left, top: flat}
  - {name: mvn2d, type: MVN, bottom: flat, top: mvn2d}
  - {name: best, type: ArgMax, bottom: data, top: best}
  - {name: best3, type: ArgMax, bottom: data, top: best3, argmax_param: {top_k: 3, out_max_val: true}}
  - {name: channel, type: ArgMax, bottom: data, top: channel, argmax_param: {axis: 1, top_k: 2}}
  - {name: row_max, type: ArgMax, bottom: data, top: row_max, argmax_param: {axis: -2, top_k: 4, out_max_val: true}}
"""
LOOKUPS = """name: lookups
layers:
  - {name: data, type: Input, top: [words, features, order], input_param: {shape: [{dim: [2, 5]}, {dim: [4, 3, 2]},
                                                                                  {dim: [6]}]}}
  - {name: embed, type: Embed, bottom: words, top: embed, embed_param: {num_output: 4, input_dim: 7}}
  - {name: embed_nb, type: Embed, bottom: words, top: embed_nb, embed_param: {num_output: 3, input_dim: 7,
                                                                              bias_term: false}}
  - {name: reindex, type: BatchReindex, bottom: [features, order], top: reindex}
  - {name: gains, type: Parameter, top: gains, parameter_param: {shape: {dim: [3]}}}
  - {name: offsets, type: Parameter, top: offsets, parameter_param: {shape: {dim: [3, 2]}}}
  - {name: table, type: Parameter, top: table, parameter_param: {shape: {dim: [2, 2]}}}
  - {name: scaled, type: Scale, bottom: [features, gains], top: scaled, scale_param: {bias_term: true}}
  - {name: shifted, type: Bias, bottom: [scaled, offsets], top: shifted}
  - {name: gated, type: Scale, bottom: [reindex, offsets], top: gated}
"""
RECURRENT = """layers:
  - {{name: data, type: Input, top: [x, cont], input_param: {{shape: [{{dim: [3, 2, 4]}}, {{dim: [3, 2]}}]}}}}
  - {{name: seq, type: {kind}, bottom: [x, cont], top: seq, recurrent_param: {{num_output: 5}}}}
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
    ("convolution_past_the_far_edge", OVERHANG),
    ("fcn_deconvolution_crop", FCN), ("activations", ACTIVATIONS), ("gelu_adaptive_matmul", GELU_ADAPTIVE_MATMUL)])
def test_onnxruntime_computes_what_netspec_computes(tmp_path, name, source):
    check_with_onnxruntime(tmp_path, source)


@pytest.mark.parametrize("unfolded", [False, True])
def test_batchnorm_and_scale_fold_into_the_convolutions_unless_unfolded(tmp_path, unfolded):
    model = check_with_onnxruntime(tmp_path, RESNET_BLOCK, options=["--unfolded"] if unfolded else [])
    kinds = Counter(node.op_type for node in model.graph.node)
    assert kinds["Conv"] == 7 and kinds["Relu"] == 6
    assert (kinds["BatchNormalization"], kinds["Mul"]) == ((7, 7) if unfolded else (0, 0))


def check_with_onnxruntime(tmp_path, source, opset=17, indices=None, options=()):
    """Export ``source`` (at ``opset``, with the command's ``options``) and compare every output onnxruntime
    computes with netspec's (unfolded); the inputs named in ``indices`` hold random row indices below the number
    it gives them.  Returns the ONNX model."""
    net, weights, inputs = randomised(source, tmp_path)
    rng = np.random.default_rng(2)
    for name_, rows in (indices or {}).items():
        inputs[name_] = rng.integers(0, rows, inputs[name_].shape).astype(np.float32)
    net_file = tmp_path / "net.yaml"
    net_file.write_text(Path(source).read_text() if source.endswith(".yaml") else source)
    result = run("export", "onnx", net_file, "--weights", weights, "-o", tmp_path / "m.onnx", "--opset", opset,
                 *options)
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
    return onnx.load(str(tmp_path / "m.onnx"))


def refused_export(net_file, tmp_path) -> str:
    """What ``netspec export onnx`` says, failing, of ``net_file`` (with its own weights); it writes no model."""
    weights = tmp_path / "w.h5"
    netspec.load_net(str(net_file), phase="TEST").save_weights(weights)
    result = run("export", "onnx", net_file, "--weights", weights, "-o", tmp_path / "m.onnx")
    assert result.returncode == 1 and not (tmp_path / "m.onnx").exists()
    return result.stderr.strip()


def test_layers_without_an_onnx_equivalent_are_named(tmp_path):
    lenet = ROOT / "configs" / "lenet" / "lenet_timing.yaml"
    assert refused_export(lenet, tmp_path) == ("error: no ONNX equivalent for layer(s) 'mnist' (DummyData), "
                                               "'accuracy' (Accuracy), 'loss' (SoftmaxWithLoss); export the deploy "
                                               "net (Input layers, no losses or data layers)")


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
    assert refused_export(net_file, tmp_path) == ("error: layer 'pool' (Pooling): adaptive pooling of 7x7 to 3x3 "
                                                  "has windows of different sizes, which ONNX's pooling cannot "
                                                  "express; pick an output size that divides the input's")


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


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_caffes_element_wise_layers_and_mvn_export(tmp_path, opset):
    check_with_onnxruntime(tmp_path, CAFFE_ELEMENTWISE, opset=opset)
    graph = onnx.load(tmp_path / "m.onnx").graph
    operators = Counter(node.op_type for node in graph.node)
    assert operators["Elu"] == operators["Softplus"] == operators["Greater"] == 1
    assert operators["PRelu"] == 2 and operators["Clip"] == 2 and operators["Pow"] == 2 and operators["Log"] == 2
    assert operators["ReduceMean"] == 2 * 2 + 1 and operators["Sqrt"] == 2
    assert all(len(node.input) == (2 if opset >= 18 else 1) for node in graph.node if node.op_type == "ReduceMean")


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_spp_tile_slice_and_argmax_export(tmp_path, opset):
    check_with_onnxruntime(tmp_path, SHAPES_AND_SEARCH, opset=opset)
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert operators["MaxPool"] + operators["GlobalMaxPool"] == 4 and operators["Split"] == 3
    assert operators["TopK"] == 4 and operators["Tile"] == 2 and operators["Pad"] == 3 + 2  # (2: padded AVE levels)


def test_argmax_exports_caffes_order_of_equal_values(tmp_path):  # (the larger index first; TopK's is the lower)
    net = SHAPES_AND_SEARCH.split("  - {name: spp,")[0] + "\n".join(
        line for line in SHAPES_AND_SEARCH.splitlines() if "type: ArgMax" in line) + "\n"
    check_with_onnxruntime(tmp_path, net, indices={"data": 3})  # (values 0, 1, 2: ties in every row)


@pytest.mark.parametrize("opset", [13, 21])
def test_embed_batch_reindex_parameter_and_operands_given_as_bottoms_export(tmp_path, opset):
    check_with_onnxruntime(tmp_path, LOOKUPS, opset=opset, indices={"words": 7, "order": 4})
    operators = Counter(node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node)
    assert operators["Gather"] == 3 and operators["Cast"] == 3


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_recurrent_layers_are_refused_with_the_reason(tmp_path, kind):
    net_file = tmp_path / "net.yaml"
    net_file.write_text(RECURRENT.format(kind=kind))
    weights = tmp_path / "w.h5"
    netspec.load_net(str(net_file), phase="TEST").save_weights(weights)
    result = run("export", "onnx", net_file, "--weights", weights, "-o", tmp_path / "m.onnx")
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: layer 'seq' ({kind}): its cont input can reset the state at any step, "
                                     f"which ONNX's {kind} cannot express")
    assert not (tmp_path / "m.onnx").exists()


def test_a_net_exports_without_weights_and_says_so(tmp_path):
    result = run("export", "onnx", ROOT / "configs" / "digits" / "digits_deploy.yaml", "-o", tmp_path / "m.onnx")
    assert result.returncode == 0 and (tmp_path / "m.onnx").is_file(), result.stderr
    assert result.stderr.strip() == "note: no --weights: the model holds the fillers' values, not trained weights"
