"""netspec.spec.yaml_text: the YAML netspec writes for people, one top-level key a line, no anchors."""

from __future__ import annotations

import yaml

from netspec.spec.yaml_text import config_yaml


def test_a_mapping_of_plain_values_takes_a_line_per_key():
    assert config_yaml({"net": "net.yaml", "base_lr": 0.01, "solver_mode": "GPU"}) == (
        "net: net.yaml\nbase_lr: 0.01\nsolver_mode: GPU\n")


def test_small_values_stay_inline_and_larger_ones_are_blocks():
    net = {"name": "n", "layers": [{"name": "conv", "type": "Convolution", "convolution_param": {"kernel_size": [3, 3]}}]}
    assert config_yaml(net) == ("name: n\nlayers:\n- name: conv\n  type: Convolution\n"
                                "  convolution_param:\n    kernel_size: [3, 3]\n")


def test_a_value_used_twice_is_written_twice_never_as_an_alias():
    mean = [125.3, 123.0, 113.9]
    text = config_yaml({"layers": [{"transform_param": {"mean_value": mean}}, {"transform_param": {"mean_value": mean}}]})
    assert "&" not in text and "*" not in text and text.count("[125.3, 123.0, 113.9]") == 2
    assert yaml.safe_load(text)["layers"][1]["transform_param"]["mean_value"] == mean
