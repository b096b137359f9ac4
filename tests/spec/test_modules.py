"""Modules, repeats and includes in net files; `netspec render`; the modular reference nets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_cli import run

from netspec.engine.net import compile_net
from netspec.engine.registry import layer_schemas
from netspec.errors import ConfigError
from netspec.spec.modules import render_net
from netspec.spec.net_spec import parse_net

ROOT = Path(__file__).parent.parent.parent
MODULES = """modules:
  unit:
    params: {out: ~, kernel: 1}
    inputs: [x]
    outputs: [y]
    layers:
      - {name: "${name}_conv", type: Convolution, bottom: x, top: y,
         convolution_param: {num_output: "${out}", kernel_size: "${kernel}"}}
      - {name: "${name}_relu", type: ReLU, bottom: y, top: y}
"""
DATA = "  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 8, 8]}}}\n"


def net(tmp_path, layers: str, modules: str = MODULES, name="net.yaml") -> Path:
    path = tmp_path / name
    path.write_text(modules + "layers:\n" + DATA + layers)
    return path


def spec(path):
    return parse_net(str(path), layer_schemas())


def problems(path) -> list[str]:
    with pytest.raises(ConfigError) as error:
        spec(path)
    return [str(p) for p in error.value.problems]


def test_a_use_substitutes_typed_values_and_maps_inputs_and_outputs(tmp_path):
    layers = spec(net(tmp_path, "  - {use: unit, name: u1, bottom: data, top: out, with: {out: 4, kernel: 3}}\n")).layers
    assert [(layer.name, layer.bottoms, layer.tops) for layer in layers] == [
        ("data", [], ["data"]), ("u1_conv", ["data"], ["out"]), ("u1_relu", ["out"], ["out"])]
    conv = layers[1].blocks["convolution_param"]
    assert (conv.num_output, conv.kernel_size) == (4, [3])
    assert layers[1].via == f"module 'unit' used at {tmp_path}/net.yaml:12" and layers[1].line == 7


def test_a_repeat_chains_copies_and_names_them_by_index(tmp_path):
    path = net(tmp_path, '  - repeat: {count: 3, start: 1, use: unit, name: "u${number}", bottom: data, '
                         'top: "t${letter}", with: {out: "${index}"}}\n')
    layers = spec(path).layers[1:]
    assert [(layer.name, layer.bottoms, layer.tops) for layer in layers[::2]] == [
        ("u2_conv", ["data"], ["tb"]), ("u3_conv", ["tb"], ["tc"]), ("u4_conv", ["tc"], ["td"])]
    assert [layer.blocks["convolution_param"].num_output for layer in layers[::2]] == [1, 2, 3]


def test_modules_come_from_included_files_and_may_use_each_other(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "blocks.yaml").write_text(MODULES + """  pair:
    params: {out: ~}
    inputs: [a]
    outputs: [b]
    layers:
      - {use: unit, name: "${name}_first", bottom: a, top: "${name}_mid", with: {out: "${out}"}}
      - {use: unit, name: "${name}_second", bottom: "${name}_mid", top: b, with: {out: "${out}"}}
""")
    path = net(tmp_path, "  - {use: pair, name: p, bottom: data, top: out, with: {out: 5}}\n",
               modules="include: lib/blocks.yaml\n")
    assert [layer.name for layer in spec(path).layers] == ["data", "p_first_conv", "p_first_relu", "p_second_conv",
                                                    "p_second_relu"]
    assert compile_net(spec(path), phase="TEST").blob_shapes["out"] == (2, 5, 8, 8)


def test_errors_inside_a_module_name_the_module_line_and_the_use(tmp_path):
    path = net(tmp_path, "  - {use: unit, name: u1, bottom: data, top: out, with: {out: 4, kernel: 9}}\n")
    with pytest.raises(ConfigError) as error:
        compile_net(spec(path), phase="TEST")
    assert str(error.value).startswith(f"{path}:8: layer 'u1_conv': convolution_param.kernel_size")
    assert str(error.value).endswith(f"(in module 'unit' used at {path}:12)")
    typo = net(tmp_path, "  - {use: unit, name: u1, bottom: data, top: out, with: {out: 4}}\n",
               modules=MODULES.replace("num_output:", "num_ouput:"), name="typo.yaml")
    assert problems(typo)[0] == (f"{typo}:8: layer 'u1_conv': convolution_param: unknown parameter 'num_ouput'; did "
                                 f"you mean 'num_output'? (in module 'unit' used at {typo}:12)")


@pytest.mark.parametrize("layers, modules, message", [
    ("  - {use: unit, name: u, bottom: data, top: o}\n", MODULES,
     ":12: module 'unit' needs parameter 'out' (give it in 'with')"),
    ("  - {use: unti, name: u, bottom: data, top: o, with: {out: 1}}\n", MODULES,
     ":12: unknown module 'unti'; did you mean 'unit'? (modules: unit)"),
    ("  - {use: unit, name: u, bottom: data, top: o, with: {out: 1, size: 2}}\n", MODULES,
     ":12: module 'unit' has no parameter 'size' (it takes: out, kernel)"),
    ("  - {use: unit, name: u, bottom: [data, data], top: o, with: {out: 1}}\n", MODULES,
     ":12: module 'unit' takes 1 bottom(s) (x), got 2"),
    ('  - repeat: {count: 0, use: unit, name: "u${index}", bottom: data, top: "t${index}", with: {out: 1}}\n',
     MODULES, ":12: repeat count must be an integer of at least 1, got 0"),
    ("  - repeat: {count: 2, use: unit, name: u, bottom: data, top: t, with: {out: 1}}\n", MODULES,
     ":12: a repeat's top needs ${index}, ${number} or ${letter}"),
    ("  - {use: loop, name: u, bottom: data, top: o}\n",
     "modules:\n  loop:\n    inputs: [x]\n    outputs: [y]\n    layers:\n      - {use: loop, bottom: x, top: y}\n",
     ":6: module 'loop' uses itself (loop -> loop)"),
    ("  - {use: unit, name: u, bottom: data, top: o, with: {out: '${size}'}}\n", MODULES,
     ":12: unknown parameter '${size}' in 'with' (nothing here gives it a value)"),
    ("  - {name: c, type: ReLU, bottom: data, top: '${index}'}\n", MODULES,
     ":12: '${index}' has no value here (it is only replaced inside a repeat)"),
])
def test_bad_module_uses_get_one_located_message(tmp_path, layers, modules, message):
    path = net(tmp_path, layers, modules)
    found = problems(path)
    assert len(found) == 1 and found[0].startswith(f"{path}{message}"), found


def test_an_include_cycle_and_a_missing_include_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\nmodules: {}\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    path = net(tmp_path, "", modules="include: [a.yaml, missing.yaml]\n")
    found = problems(path)
    assert any(f"{tmp_path}/b.yaml:1: include: 'a.yaml' includes itself" in p for p in found), found
    assert any(f"include: '{tmp_path}/missing.yaml' does not exist" in p for p in found), found


def canonical(path, phase, mults=True):
    g = compile_net(parse_net(str(path), layer_schemas()), phase=phase)
    nodes = [(n.name, n.layer.type, n.bottoms, n.tops, n.param_shapes, n.loss_weights,
              [(p.lr_mult, p.decay_mult) for p in n.param_specs] if mults else None) for n in g.nodes]
    return nodes, g.blob_shapes, g.learnable_count()


@pytest.mark.parametrize("family", ["resnet50", "googlenet"])
@pytest.mark.parametrize("kind", ["deploy", "timing"])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_modular_reference_nets_equal_their_plain_versions(family, kind, phase):
    modular = ROOT / "configs" / family / f"{family}_{kind}.yaml"
    plain = Path(__file__).parent.parent / "plain" / f"{family}_{kind}.yaml"
    assert canonical(modular, phase, kind != "deploy") == canonical(plain, phase, kind != "deploy")


def test_resnet50_takes_under_120_lines():
    files = [ROOT / "configs" / "resnet50" / name for name in ("resnet50_timing.yaml", "resnet_blocks.yaml")]
    assert sum(len(f.read_text().splitlines()) for f in files) < 120


def test_render_prints_a_plain_net_with_the_same_graph(tmp_path):
    source = ROOT / "configs" / "resnet50" / "resnet50_deploy.yaml"
    result = run("render", source)
    assert result.returncode == 0, result.stderr
    rendered = tmp_path / "plain.yaml"
    rendered.write_text(result.stdout)
    assert "modules" not in yaml.safe_load(result.stdout) and "use" not in result.stdout
    assert canonical(rendered, "TEST") == canonical(source, "TEST")
    assert render_net(str(source))["name"] == "ResNet-50"
    bad = net(tmp_path, "  - {use: nothing, bottom: data, top: o}\n")
    failed = run("render", bad)
    assert failed.returncode == 1 and "unknown module 'nothing'" in failed.stderr
