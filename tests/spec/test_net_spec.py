"""Net files: YAML errors, schema validation with file:line and "did you mean", paths."""

from __future__ import annotations

import os

import pytest

from netspec import ConfigError
from netspec.engine.registry import layer_schemas
from netspec.spec.net_spec import parse_net


def parse(text):
    return parse_net(text, layer_schemas())


def problems(text):
    with pytest.raises(ConfigError) as info:
        parse(text)
    return [str(p) for p in info.value.problems]


def test_malformed_yaml_is_one_located_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("layers:\n  - name: a\n    type: [ReLU\n")
    with pytest.raises(ConfigError) as info:
        parse(str(path))
    (problem,) = info.value.problems
    assert str(problem).startswith(f"{path}:")
    assert "malformed YAML" in str(problem)


def test_duplicate_key_is_an_error():
    assert "duplicate key 'type'" in problems("layers:\n  - {name: a, type: ReLU, type: TanH}\n")[0]


def test_a_mapping_as_a_key_is_an_error_not_a_crash():
    assert problems("layers:\n  - {name: a, type: ReLU, x: {{a: 1}}}\n") == [
        "<string>:2: malformed YAML: a mapping or list cannot be a key (one pair of braces too many?)"]


def test_every_mistake_reported_at_once_with_suggestions():
    found = problems("""name: n
layer: []
layers:
  - name: data
    type: Inputt
  - name: conv
    type: Convolution
    bottom: data
    top: conv
    convolution_param: {num_outptu: 3, kernel_size: three, weight_filler: {type: xavir}}
  - name: pool
    type: Pooling
    pooling_param: {pool: MAXX}
    relu_param: {}
    botom: conv
""")
    text = "\n".join(found)
    assert "<string>:2: unknown key 'layer'; did you mean 'layers'?" in text
    assert "<string>:5: layer 'data': type: unknown layer type 'Inputt'; did you mean 'Input'?" in text
    assert "<string>:10: layer 'conv': convolution_param: unknown parameter 'num_outptu'; did you mean 'num_output'?" in text
    assert "convolution_param.kernel_size: expected int, got str 'three'" in text
    assert "convolution_param.weight_filler.type: 'xavir' is not one of" in text and "did you mean 'xavier'?" in text
    assert "<string>:13: layer 'pool': pooling_param.pool: 'MAXX' is not one of MAX, AVE; did you mean 'MAX'?" in text
    assert "<string>:14: layer 'pool': a Pooling layer takes no 'relu_param'" in text
    assert "<string>:15: layer 'pool': unknown key 'botom'; did you mean 'bottom'?" in text
    assert "convolution_param.num_output: missing required parameter" in text
    assert len(found) == 9


def test_scalars_or_lists_for_bottom_top_and_repeated_fields():
    spec = parse("""layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 1, 4, 4]}}}
  - {name: conv, type: Convolution, bottom: [data], top: conv, convolution_param: {num_output: 1, kernel_size: [3, 2]}}
""")
    assert spec.layers[0].tops == ["data"] and spec.layers[1].bottoms == ["data"]
    assert spec.layers[1].blocks["convolution_param"].kernel_size == [3, 2]


def test_wrong_value_types():
    found = problems("""layers:
  - {name: a, type: ReLU, bottom: 3, top: a, loss_weight: heavy, propagate_down: maybe, relu_param: 0.1}
""")
    text = "\n".join(found)
    assert "layer 'a': bottom: expected str, got int 3" in text
    assert "loss_weight: expected float, got str 'heavy'" in text
    assert "propagate_down: expected bool, got str 'maybe'" in text
    assert "relu_param: expected a mapping of parameters, got float 0.1" in text


def test_not_a_mapping_and_empty_layers():
    assert "must be a mapping" in problems("- a\n- b\n")[0]
    assert "non-empty 'layers' list" in problems("name: x\n")[0]


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    folder = tmp_path / "nets"
    folder.mkdir()
    net = folder / "net.yaml"
    net.write_text("layers:\n  - {name: d, type: HDF5Data, top: data, hdf5_data_param: {source: lists/train.txt, "
                   "batch_size: 2}}\n")
    spec = parse(str(net))
    assert spec.layers[0].blocks["hdf5_data_param"].source == os.path.join(str(folder), "lists", "train.txt")


def test_missing_file_is_a_located_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        parse(str(tmp_path / "absent.yaml"))


def test_config_hash_ignores_formatting():
    a = parse("layers:\n  - {name: d, type: Input, top: d, input_param: {shape: {dim: [1]}}}\n")
    b = parse("# comment\nlayers:\n- name: d\n  input_param:\n    shape: {dim: [1]}\n  type: Input\n  top: d\n")
    assert a.config_hash == b.config_hash



def test_a_net_without_a_name_is_known_by_its_files(tmp_path):
    net_file = tmp_path / "tiny_classifier.yaml"
    net_file.write_text("layers:\n  - {name: x, type: Input, top: x, input_param: {shape: {dim: [1, 2]}}}\n")
    assert parse_net(str(net_file), layer_schemas()).name == "tiny_classifier"  # (not '': "net ''" in every line)
    assert parse_net(net_file.read_text(), layer_schemas()).name == ""  # (text has no file to be named after)
