"""Protobuf text format and `netspec import caffe`: current and V1 nets, deploy headers, what is dropped."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from test_cli import run
from test_modules import canonical

import netspec
from netspec.engine.registry import layer_schemas, solver_types
from netspec.errors import ConfigError, DataError
from netspec.interop.prototxt import parse_prototxt
from netspec.spec.solver_spec import parse_solver

HERE = Path(__file__).parent.parent / "caffe"
ROOT = Path(__file__).parent.parent.parent


def test_text_format_values_repeats_and_nesting():
    message = parse_prototxt('name: "a\\"b" "c"  # comment\nx: 1 x: -2.5e1, x: inf; flag: true\n'
                             "m { n: 0x1F list: [1, 2] sub < k: ENUM > } m: { n: 'q\\n' }\n")
    assert message["name"] == ['a"bc'] and message["x"] == [1, -25.0, float("inf")] and message["flag"] == [True]
    assert [m.one("n") for m in message["m"]] == [31, "q\n"]
    assert message["m"][0]["list"] == [1, 2] and message["m"][0].one("sub").one("k") == "ENUM"
    assert message.lines == {"name": 1, "x": 2, "flag": 2, "m": 3}


def test_numbers_read_as_protobuf_reads_them():
    zeros = "0" * 5000
    message = parse_prototxt(f"n: 010 n: -0x{zeros}1F n: 0 n: -0 n: 0.5 n: 00.25 n: 1e3 n: {zeros}7 n: 0x{zeros}")
    assert message["n"] == [8, -31, 0, 0, 0.5, 0.25, 1000.0, 7, 0]  # (a leading zero makes a whole number octal)
    for text in ("n: 08", "n: 0x1" + "0" * 16, "n: 1" + "0" * 40, "n: 01" + "0" * 22, "n: ١٢",  # (ASCII digits only)
                 "n: " + "1" * 1_000_000 + "a"):  # (refused in linear time: this took hours)
        with pytest.raises(DataError):
            parse_prototxt(text, "net.prototxt")


@pytest.mark.parametrize("text, message", [
    ('layer { name: "a"\n', "net.prototxt:2:1: missing '}' before the end of the file"),
    ("layer { name: }", "net.prototxt:1:15: expected a value, found '}'"),
    ("layer {\n  name: $x }", "net.prototxt:2:9: unexpected character '$'"),
    ("layer { 3: 4 }", "net.prototxt:1:9: expected a field name, found '3'"),
])
def test_syntax_errors_give_line_and_column(text, message):
    with pytest.raises(DataError) as error:
        parse_prototxt(text, "net.prototxt")
    assert str(error.value) == message


def imported(tmp_path, name) -> tuple[Path, str]:
    out = tmp_path / f"{name}.yaml"
    result = run("import", "caffe", HERE / f"{name}.prototxt", "-o", out)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


BGR_NOTE = ("note: Caffe nets take BGR images: publish this one with netspec zoo publish --channels BGR (and the "
            "mean it was trained with, in B, G, R order)")


def test_current_format_matches_the_netspec_config(tmp_path):
    out, stdout = imported(tmp_path, "cifar10_quick_deploy")
    assert stdout.splitlines() == [f"wrote {out} (13 layers)", BGR_NOTE]
    expected = canonical(ROOT / "configs" / "cifar10" / "cifar10_quick_deploy.yaml", "TEST", mults=False)
    assert canonical(out, "TEST", mults=False) == expected


def test_v1_format_with_a_deploy_header(tmp_path):
    out, stdout = imported(tmp_path, "lenet_v1")
    net = netspec.load_net(str(out))
    assert net.blobs["data"].shape == (64, 1, 28, 28) and net.blobs["prob"].shape == (64, 10)
    conv1 = [n for n in net.nodes if n.name == "conv1"][0]
    assert [(p.lr_mult, p.decay_mult) for p in conv1.param_specs] == [(1, 1), (2, 0)]
    assert net.learnable_params()[0].blob.shape == (20, 1, 5, 5)


def test_grouped_lrn_inception_and_resnet_blocks_build_and_run(tmp_path):
    out, stdout = imported(tmp_path, "blocks")
    net = netspec.load_net(str(out), seed=0)
    assert net.blobs["conv1"].shape == (2, 32, 15, 15) and net.params["conv1"][0].shape == (32, 8, 3, 3)
    assert net.blobs["inc/output"].shape == (2, 48, 15, 15) and net.blobs["res"].shape == (2, 48, 15, 15)
    net.blobs["data"].data[...] = np.random.default_rng(0).normal(size=(2, 16, 15, 15))
    net.forward()
    assert np.isfinite(net.blobs["res"].data).all() and (net.blobs["res"].data >= 0).all()


def test_an_fcn_head_imports_with_deconvolution_and_crop(tmp_path):
    out, _ = imported(tmp_path, "fcn_head")
    net = netspec.load_net(str(out), seed=0)
    assert net.blobs["upscore"].shape == (1, 5, 68, 68) and net.blobs["out"].shape == (1, 5, 64, 64)
    assert net.params["upscore"][0].shape == (5, 1, 8, 8)
    assert [p.lr_mult for p in next(n for n in net.nodes if n.name == "upscore").param_specs] == [0]
    kernel = net.params["upscore"][0].data[0, 0]
    assert kernel[3, 3] == kernel.max() and np.allclose(kernel, kernel.T)  # the bilinear filler's tent
    v1 = tmp_path / "v1.prototxt"
    v1.write_text('input: "x"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 3\ninput_dim: 3\n'
                  'layers { name: "up" type: DECONVOLUTION bottom: "x" top: "y"\n'
                  '  convolution_param { num_output: 2 kernel_size: 2 stride: 2 } }\n')
    result = run("import", "caffe", v1, "-o", tmp_path / "v1.yaml")
    assert result.returncode == 0, result.stderr
    assert netspec.load_net(str(tmp_path / "v1.yaml")).blobs["y"].shape == (1, 2, 6, 6)


def test_v1_layers_share_blobs_by_the_names_their_param_strings_give(tmp_path):
    v1 = tmp_path / "shared.prototxt"
    v1.write_text('input: "x"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 2\ninput_dim: 2\n'
                  'layers { name: "a" type: INNER_PRODUCT bottom: "x" top: "a" param: "w" param: "b" blobs_lr: 1\n'
                  '  blobs_lr: 2 weight_decay: 1 weight_decay: 0 inner_product_param { num_output: 2 } }\n'
                  'layers { name: "b" type: INNER_PRODUCT bottom: "x" top: "b" param: "w" blob_share_mode: PERMISSIVE\n'
                  '  inner_product_param { num_output: 2 bias_term: false } }\n')
    result = run("import", "caffe", v1, "-o", tmp_path / "shared.yaml")
    assert result.returncode == 0, result.stderr
    layers = yaml.safe_load((tmp_path / "shared.yaml").read_text())["layers"]
    assert layers[1]["param"] == [{"name": "w", "lr_mult": 1, "decay_mult": 1},
                                  {"name": "b", "lr_mult": 2, "decay_mult": 0}]
    assert layers[2]["param"] == [{"name": "w", "share_mode": "PERMISSIVE"}]
    net = netspec.load_net(str(tmp_path / "shared.yaml"))
    assert np.shares_memory(net.params["a"][0].data, net.params["b"][0].data)  # (one blob, shared)
    v1.write_text('layers { name: "a" type: INNER_PRODUCT param { name: "w" } }\n')  # (V1 params are names)
    result = run("import", "caffe", v1)
    assert result.returncode == 1 and "layer 0: param (line 1): expected a value, found a message" in result.stderr


def test_fields_without_an_equivalent_are_listed_and_unknown_types_refused(tmp_path):
    source = tmp_path / "extra.prototxt"
    source.write_text('name: "x" debug_info: true\ninput: "data" input_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4\n'
                      'layer { name: "c" type: "Convolution" bottom: "data" top: "c" phase: TRAIN\n'
                      '  convolution_param { num_output: 2 kernel_size: 1 engine: CUDNN } }\n')
    result = run("import", "caffe", source)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote {tmp_path / 'extra.yaml'} (2 layers)",
                                          "dropped (no netspec equivalent): net: debug_info",
                                          "dropped (no netspec equivalent): layer 'c': phase",
                                          "dropped (no netspec equivalent): layer 'c': convolution_param.engine",
                                          BGR_NOTE]
    source.write_text('layer { name: "w" type: "WindowData" top: "d" }\n')
    failed = run("import", "caffe", source, "-o", tmp_path / "w.yaml")
    assert failed.returncode == 1 and failed.stderr.strip() == (
        "error: layer 'w': type 'WindowData' has no netspec equivalent (netspec layers lists the types)")
    source.write_text('input: "data" input_dim: 1\n')
    assert "declares 1 input(s) but 1 input_dim values (4 per input)" in run("import", "caffe", source).stderr
    source.write_text("layer {")
    assert run("import", "caffe", source).stderr.strip() == (
        f"error: {source}:1:8: missing '}}' before the end of the file")
    assert not (tmp_path / "w.yaml").exists()


# ---- .caffemodel: protobuf wire format written by hand, as caffe.proto lays it out ------------------------
def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def blob(array: np.ndarray, legacy: bool = False) -> bytes:
    data = delimited(5, array.astype("<f4").tobytes())  # packed repeated float
    if legacy:  # num, channels, height, width as varints (old files)
        dims = (1,) * (4 - array.ndim) + array.shape
        return b"".join(varint(n << 3) + varint(d) for n, d in zip((1, 2, 3, 4), dims)) + data
    shape = delimited(1, b"".join(varint(d) for d in array.shape))  # BlobShape.dim, packed
    return delimited(7, shape) + data


def caffemodel(layers: dict, v1: bool, legacy: tuple = ()) -> bytes:
    name_field, type_field, blob_field, layer_field = (4, 5, 6, 2) if v1 else (1, 2, 7, 100)
    out = delimited(1, b"LeNet")
    for name, arrays in layers.items():
        body = delimited(name_field, name.encode())
        body += (varint(type_field << 3) + varint(4)) if v1 else delimited(type_field, b"Convolution")
        body += b"".join(delimited(blob_field, blob(a, name in legacy)) for a in arrays)
        out += delimited(layer_field, body)
    return out


@pytest.mark.parametrize("v1", [True, False])
def test_caffemodel_weights_are_decoded_and_written(tmp_path, v1):
    rng = np.random.default_rng(0)
    arrays = {"conv1": [rng.normal(size=(20, 1, 5, 5)), rng.normal(size=20)],
              "conv2": [rng.normal(size=(50, 20, 5, 5)), rng.normal(size=50)],
              "ip1": [rng.normal(size=(500, 800)), rng.normal(size=500)],
              "old_layer": [rng.normal(size=3)]}
    (tmp_path / "w.caffemodel").write_bytes(caffemodel(arrays, v1, legacy=("ip1",)))
    result = run("import", "caffemodel", HERE / "lenet_v1.prototxt", tmp_path / "w.caffemodel",
                 "-o", tmp_path / "w.h5")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote {tmp_path / 'w.h5'}: 3 layer(s) of weights",
                                          "not in the caffemodel (keep their fillers): ip2",
                                          "in the caffemodel but not the net: old_layer"]
    out, _ = imported(tmp_path, "lenet_v1")
    net = netspec.load_net(str(out))
    net.load_weights(tmp_path / "w.h5")
    for name in ("conv1", "conv2", "ip1"):
        for blob, array in zip(net.params[name], arrays[name]):
            np.testing.assert_allclose(blob.data, array.reshape(blob.shape).astype(np.float32))


def test_caffemodel_weights_go_into_the_yaml_net_import_caffe_wrote_as_into_its_prototxt(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {name: [rng.normal(size=shape), rng.normal(size=shape[0])] for name, shape in (
        ("conv1", (20, 1, 5, 5)), ("conv2", (50, 20, 5, 5)), ("ip1", (500, 800)), ("ip2", (10, 500)))}
    (tmp_path / "w.caffemodel").write_bytes(caffemodel(arrays, v1=False))
    out, _ = imported(tmp_path, "lenet_v1")
    for net_file, weights in ((out, tmp_path / "yaml.h5"), (HERE / "lenet_v1.prototxt", tmp_path / "prototxt.h5")):
        result = run("import", "caffemodel", net_file, tmp_path / "w.caffemodel", "-o", weights)
        assert result.returncode == 0 and result.stdout == f"wrote {weights}: 4 layer(s) of weights\n", result.stderr
    nets = [netspec.load_net(str(out)) for _ in range(2)]
    nets[0].load_weights(tmp_path / "yaml.h5")
    nets[1].load_weights(tmp_path / "prototxt.h5")
    for name, blobs in arrays.items():
        for from_yaml, from_prototxt, array in zip(nets[0].params[name], nets[1].params[name], blobs):
            np.testing.assert_array_equal(from_yaml.data, array.reshape(from_yaml.shape).astype(np.float32))
            np.testing.assert_array_equal(from_yaml.data, from_prototxt.data)


@pytest.mark.parametrize("v1", [True, False])
def test_a_caffemodel_with_shared_blobs_imports_as_caffe_saved_it(tmp_path, v1):
    param = ('param: "w" param: "{}"' if v1 else 'param {{ name: "w" }} param {{ name: "{}" }}').format
    kind = "INNER_PRODUCT" if v1 else '"InnerProduct"'
    entry = "layers" if v1 else "layer"
    (tmp_path / "net.prototxt").write_text(
        'input: "x"\ninput_dim: 1\ninput_dim: 4\ninput_dim: 1\ninput_dim: 1\n' + "".join(
            f'{entry} {{ name: "{name}" type: {kind} bottom: "x" top: "{name}" {param(name + "_b")}\n'
            f'  inner_product_param {{ num_output: 3 }} }}\n' for name in ("a", "b")))
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 4))
    arrays = {"a": [w, rng.normal(size=3)], "b": [w, rng.normal(size=3)]}  # (Caffe saves the shared w twice)
    (tmp_path / "w.caffemodel").write_bytes(caffemodel(arrays, v1))
    result = run("import", "caffemodel", tmp_path / "net.prototxt", tmp_path / "w.caffemodel", "-o", tmp_path / "w.h5")
    assert result.returncode == 0, result.stderr
    assert "not the net" not in result.stdout and "fillers" not in result.stdout, result.stdout
    run("import", "caffe", tmp_path / "net.prototxt", "-o", tmp_path / "net.yaml")
    net = netspec.load_net(str(tmp_path / "net.yaml"))
    net.load_weights(tmp_path / "w.h5")
    for name in ("a", "b"):
        np.testing.assert_allclose(net.params[name][0].data, w.astype(np.float32))
        np.testing.assert_allclose(net.params[name][1].data, arrays[name][1].astype(np.float32))


def test_caffemodel_blobs_that_do_not_fit_are_named(tmp_path):
    arrays = {"conv1": [np.zeros((20, 1, 3, 3)), np.zeros(20)], "ip2": [np.zeros((10, 500))]}
    (tmp_path / "w.caffemodel").write_bytes(caffemodel(arrays, v1=False))
    result = run("import", "caffemodel", HERE / "lenet_v1.prototxt", tmp_path / "w.caffemodel",
                 "-o", tmp_path / "w.h5")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'w.caffemodel'}: the blobs do not match the net: layer 'conv1' blob 0 is [20, 1, 3, 3] "
        "in the file, [20, 1, 5, 5] in the net; layer 'ip2' has 1 blob(s) in the file, 2 in the net")
    (tmp_path / "w.caffemodel").write_bytes(caffemodel(arrays, v1=False)[:-7])
    assert "truncated" in run("import", "caffemodel", HERE / "lenet_v1.prototxt", tmp_path / "w.caffemodel",
                              "-o", tmp_path / "w.h5").stderr
    assert not (tmp_path / "w.h5").exists()


def test_a_caffe_solver_becomes_a_netspec_solver_that_loads(tmp_path):
    shutil.copy(HERE / "lenet_v1.prototxt", tmp_path)
    shutil.copy(HERE / "lenet_solver.prototxt", tmp_path)
    assert run("import", "caffe", tmp_path / "lenet_v1.prototxt").returncode == 0
    result = run("import", "caffe-solver", tmp_path / "lenet_solver.prototxt")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'lenet_solver.yaml'}",
                                              "dropped (no netspec equivalent): solver: debug_info"]
    spec = parse_solver(str(tmp_path / "lenet_solver.yaml"), layer_schemas(), list(solver_types()))
    p = spec.params
    assert (p.type, p.lr_policy, p.gamma, p.power, p.test_iter, p.solver_mode) == (
        "Nesterov", "inv", 0.0001, 0.75, [100], "GPU")
    assert spec.train_net.name == "LeNet" and len(spec.test_nets) == 1


def test_a_solver_of_plain_values_is_written_a_key_a_line_and_its_gpu_mode_noted(tmp_path):
    """PyYAML would write a mapping holding only plain values on one line ({net: ..., solver_mode: GPU}); the
    imported file keeps a line per key, which the note on solver_mode names."""
    (tmp_path / "solver.prototxt").write_text('net: "tv.prototxt"\nbase_lr: 0.01\nsolver_mode: GPU\n')
    result = run("import", "caffe-solver", tmp_path / "solver.prototxt", "-o", tmp_path / "solver.yaml")
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "solver.yaml").read_text().splitlines()
    assert lines[1:] == ["net: tv.yaml", "base_lr: 0.01", "solver_mode: GPU"], lines  # (the net as imported)
    assert f"{tmp_path / 'solver.yaml'}:4: solver_mode: GPU trains on the GPU" in result.stdout, result.stdout


COLOUR_NET = """name: "colour"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  data_param { source: "examples/colour/train_lmdb" batch_size: 4 } transform_param { mean_value: 10 } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
  data_param { source: "examples/colour/train_lmdb" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" include { stage: "softmax" } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" loss_weight: 2
  include { stage: "weighted" } }
layer { name: "halved" type: "Power" bottom: "loss" top: "halved" power_param { scale: 0.5 } }
"""
COLOUR_SOLVER = """net: "examples/colour/train_val.prototxt"
base_lr: 0.01 max_iter: 4 lr_policy: "fixed" snapshot_prefix: "examples/colour/colour"
solver_mode: GPU train_state { stage: "softmax" }
"""


def caffe_checkout(tmp_path: Path) -> Path:
    """A Caffe checkout in miniature: examples/colour holds a net, a solver and a dataset of solid red and blue
    images, with paths relative to the checkout's root, as Caffe's examples write them."""
    root = tmp_path / "caffe"
    (root / "models").mkdir(parents=True)
    colour = root / "examples" / "colour"
    colour.mkdir(parents=True)
    for name, rgb in (("blue", (0, 0, 255)), ("red", (255, 0, 0))):
        (tmp_path / "images" / name).mkdir(parents=True)
        for index in range(2):
            Image.new("RGB", (3, 2), rgb).save(tmp_path / "images" / name / f"{index}.png")
    assert run("convert", "imageset", tmp_path / "images", colour / "train_lmdb").returncode == 0
    (colour / "train_val.prototxt").write_text(COLOUR_NET)
    (colour / "solver.prototxt").write_text(COLOUR_SOLVER)
    return root


def test_an_imported_caffe_example_reads_what_caffe_would_and_trains(tmp_path):
    root = caffe_checkout(tmp_path)
    colour = root / "examples" / "colour"
    imported = run("import", "caffe", colour / "train_val.prototxt")
    assert imported.returncode == 0, imported.stderr
    assert (f"note: Caffe root {root} (the nearest folder above the file holding examples/ or models/): Caffe reads "
            "relative paths against it, so they are rewritten relative to the netspec file: "
            "examples/colour/train_lmdb -> train_lmdb\n") in imported.stdout
    assert "note: layer 'data': transform_param.channel_order: BGR, as Caffe decoded images" in imported.stdout
    solver = run("import", "caffe-solver", colour / "solver.prototxt")
    assert solver.returncode == 0, solver.stderr
    assert "examples/colour/train_val.yaml -> train_val.yaml, examples/colour/colour -> colour" in solver.stdout
    assert f"note: {colour / 'solver.yaml'}:7: solver_mode: GPU trains on the GPU; on a machine without one pass " \
           "--device cpu to netspec train" in solver.stdout

    # the Data layer hands the net B, G, R, as Caffe's did: a red image is (0, 0, 255) less the mean
    net = netspec.load_net(str(colour / "train_val.yaml"), phase="TRAIN", stages=["softmax"])
    net.forward()
    data, labels = net.blobs["data"].data, net.blobs["label"].data
    red = data[labels == 1][0]
    assert [float(red[c].mean()) for c in range(3)] == [-10.0, -10.0, 245.0]
    net.close()

    # two layers named 'loss' in different stages: each stage builds; without one, the error names the stages
    for stage in ("softmax", "weighted"):
        assert run("check", colour / "train_val.yaml", "--phase", "TRAIN", "--stage", stage).returncode == 0
    unstaged = run("check", colour / "train_val.yaml", "--phase", "TRAIN")
    assert unstaged.returncode == 1
    assert unstaged.stderr.endswith("layer 'halved': bottom: bottom 'loss' comes from layer 'loss' (line 29), which a "
                                    "net of phase TRAIN, no stage, level 0 leaves out; the file's stages: softmax, "
                                    "weighted\n")
    trained = run("train", colour / "solver.yaml", "--device", "cpu", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert (colour / "colour_iter_4.weights.h5").exists()


def test_every_v1_layer_type_but_window_data_imports(tmp_path):
    v1 = tmp_path / "im2col.prototxt"
    v1.write_text('input: "x"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 4\ninput_dim: 4\n'
                  'layers { name: "cols" type: IM2COL bottom: "x" top: "y" convolution_param { kernel_size: 3 } }\n')
    result = run("import", "caffe", v1, "-o", tmp_path / "im2col.yaml")
    assert result.returncode == 0, result.stderr
    assert netspec.load_net(str(tmp_path / "im2col.yaml")).blobs["y"].shape == (1, 18, 2, 2)
    window = tmp_path / "window.prototxt"
    window.write_text('layers { name: "w" type: WINDOW_DATA top: "data" top: "label" }\n')
    result = run("import", "caffe", window, "-o", tmp_path / "window.yaml")
    assert result.returncode == 1
    assert result.stderr == ("error: layer 'w': type 'WINDOW_DATA' has no netspec equivalent "
                             "(netspec layers lists the types)\n")


def test_a_value_netspec_refuses_is_named_in_the_prototxt_by_layer_and_key(tmp_path):
    source = tmp_path / "bad.prototxt"
    source.write_text('input: "x"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 4\ninput_dim: 4\n'
                      'layer { name: "c" type: "Convolution" bottom: "x" top: "c"\n'
                      '  convolution_param { num_output: 2 kernel_size: 3 pad: 1.5 } }\n')
    result = run("import", "caffe", source)
    assert (result.returncode, result.stderr.strip()) == (
        1, f"error: {source}: layer 'c': convolution_param.pad: expected int, got float 1.5")  # (not <string>:9)
    assert not (tmp_path / "bad.yaml").exists()


def test_concat_dim_and_slice_dim_name_the_axis_as_in_caffe(tmp_path):
    source = tmp_path / "old.prototxt"
    source.write_text('input: "x"\ninput_dim: 2\ninput_dim: 3\ninput_dim: 4\ninput_dim: 1\n'
                      'layer { name: "join" type: "Concat" bottom: "x" bottom: "x" top: "y"\n'
                      '  concat_param { concat_dim: 0 } }\n'
                      'layer { name: "cut" type: "Slice" bottom: "y" top: "a" top: "b" slice_param { slice_dim: 2 } }\n')
    result = run("import", "caffe", source, "-o", tmp_path / "old.yaml")
    assert result.returncode == 0 and "dropped" not in result.stdout, result.stdout + result.stderr
    net = netspec.load_net(str(tmp_path / "old.yaml"))
    assert net.blobs["y"].shape == (4, 3, 4, 1) and net.blobs["a"].shape == (4, 3, 2, 1)
    both = tmp_path / "both.yaml"
    both.write_text("layers:\n  - {name: x, type: Input, top: x, input_param: {shape: {dim: [2, 3]}}}\n"
                    "  - {name: j, type: Concat, bottom: [x, x], top: y, concat_param: {axis: 0, concat_dim: 1}}\n")
    with pytest.raises(ConfigError, match="concat_param.concat_dim: give axis or concat_dim, not both"):
        netspec.load_net(str(both))


@pytest.mark.parametrize("legacy", [False, True])
def test_caffe_mean_files_convert_alone_and_on_import(tmp_path, legacy):
    mean = np.random.default_rng(4).uniform(0, 255, (1, 3, 4, 5))
    (tmp_path / "mean.binaryproto").write_bytes(blob(mean, legacy))
    result = run("convert", "caffe-mean", tmp_path / "mean.binaryproto", "-o", tmp_path / "alone.npy")
    assert result.returncode == 0 and result.stdout.startswith(f"wrote {tmp_path / 'alone.npy'}: a 3x4x5 mean")
    np.testing.assert_allclose(np.load(tmp_path / "alone.npy"), mean[0].astype(np.float32))
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "data" type: "Data" top: "data" top: "label" data_param { source: "db" batch_size: 1 }\n'
        '  transform_param { mean_file: "mean.binaryproto" } }\n')
    result = run("import", "caffe", tmp_path / "net.prototxt", "-o", tmp_path / "net.yaml")
    assert "layer 'data': converted the Caffe mean mean.binaryproto into mean.npy (netspec's mean format)" \
        in result.stdout, result.stdout + result.stderr
    assert "mean_file: mean.npy" in (tmp_path / "net.yaml").read_text()
    np.testing.assert_array_equal(np.load(tmp_path / "mean.npy"), np.load(tmp_path / "alone.npy"))


def test_a_caffe_mean_file_that_is_none_is_named_in_one_line(tmp_path):
    cases = {"garbage.binaryproto": b"\xff" * 40, "cut.binaryproto": blob(np.ones((1, 3, 4, 4)))[:-7],
             "flat.binaryproto": blob(np.ones(12))}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        result = run("convert", "caffe-mean", tmp_path / name, "-o", tmp_path / "m.npy")
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"error: {tmp_path / name}: "), result.stderr
    assert not (tmp_path / "m.npy").exists()
    (tmp_path / "net.prototxt").write_text('layer { name: "data" type: "Data" top: "data" top: "label"\n'
                                           '  data_param { source: "db" batch_size: 1 }\n'
                                           '  transform_param { mean_file: "missing.binaryproto" } }\n')
    result = run("import", "caffe", tmp_path / "net.prototxt", "-o", tmp_path / "net.yaml")
    assert ("layer 'data': transform_param.mean_file missing.binaryproto is a Caffe .binaryproto, not there: once it "
            "is, netspec convert caffe-mean missing.binaryproto -o missing.npy, and point mean_file at the .npy") \
        in result.stdout, result.stdout + result.stderr


def test_a_train_val_nets_notes_come_once_for_its_two_data_layers_of_one_name(tmp_path):
    (tmp_path / "train_val.prototxt").write_text("".join(
        f'layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: {phase} }}\n'
        f'  data_param {{ source: "db" batch_size: 1 }} transform_param {{ mirror: true }} mystery: 1 }}\n'
        for phase in ("TRAIN", "TEST")))
    result = run("import", "caffe", tmp_path / "train_val.prototxt", "-o", tmp_path / "train_val.yaml")
    lines = result.stdout.splitlines()
    assert len(lines) == len(set(lines)) and any(line.startswith("note: layer 'data': ") for line in lines), lines
