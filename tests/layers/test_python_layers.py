"""Python layers: a user's class named in the config, held to the contract of built-in layers, refused in nets
from someone else unless allowed, and every failure of the user's code one line naming the layer and module."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_cli import run

import netspec
from netspec.engine import registry
from netspec.engine.trust import Trust
from netspec.testing import check_layer

MODULE = '''
import netspec


class Doubler(netspec.PythonLayer):
    """y = k * x, k from param_str; learns nothing."""

    inplace_ok = True

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        top[0].data[...] = float(self.param_str or 2) * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = float(self.param_str or 2) * top[0].diff


class Offset(netspec.PythonLayer):
    """y = x + b, b learned per channel."""

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def param_shapes(self, bottom_shapes):
        return [(bottom_shapes[0][1],)]

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + self.blobs[0].data.reshape(1, -1)

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff += top[0].diff.sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff


class BadShapes(netspec.PythonLayer):
    def top_shapes(self, bottom_shapes):
        return 7


class Plain:
    pass
'''

NET = """
layers:
  - {{name: data, type: Input, top: x, input_param: {{shape: {{dim: [2, 3]}}}}}}
  - {{name: user, type: Python, bottom: x, top: y, python_param: {{module: {module}, layer: {layer}, param_str: "3"}}}}
"""


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    (tmp_path / "user_layers.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("user_layers", None)


def test_a_user_layer_runs_and_passes_the_shipped_checks(module_dir):
    x = np.random.default_rng(0).normal(size=(2, 3))
    net = netspec.load_net(NET.format(module="user_layers", layer="Doubler"), dtype=np.float64, trust=Trust.own())
    net.blobs["x"].data[...] = x
    net.forward()
    np.testing.assert_allclose(net.blobs["y"].data, 3 * x)
    for layer in ("Doubler", "Offset"):
        check_layer("Python", [x], params={"python_param": {"module": "user_layers", "layer": layer}})


def test_the_module_is_found_beside_the_net_file(tmp_path):
    (tmp_path / "beside.py").write_text(MODULE)
    net_file = tmp_path / "net.yaml"
    net_file.write_text(NET.format(module="beside", layer="Offset"))
    try:
        net = netspec.load_net(str(net_file), trust=Trust.own())
        assert net.params["user"][0].shape == (3,)
    finally:
        sys.modules.pop("beside", None)
    with pytest.raises(netspec.ConfigError, match="pass --allow-python-layers"):
        netspec.load_net(str(net_file))  # the default: nets are refused their Python layers


@pytest.mark.parametrize("module, layer, message", [
    ("no_such_module", "Doubler", "layer 'user': python_param.module: no module 'no_such_module' on Python's path"),
    ("user_layers", "Missing", "python_param.layer: module 'user_layers' ("),
    ("user_layers", "Plain", "'user_layers.Plain' is not a subclass of netspec.PythonLayer"),
    ("user_layers", "BadShapes", "'user_layers.BadShapes' failed to give its shapes: TypeError"),
])
def test_a_broken_user_layer_is_one_line_naming_the_layer_and_module(module_dir, module, layer, message):
    net_file = module_dir / "net.yaml"
    net_file.write_text(NET.format(module=module, layer=layer))
    result = run("check", net_file, "--allow-python-layers", env={"PYTHONPATH": str(module_dir)})
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{net_file}:4: " in result.stderr and message in result.stderr


@pytest.mark.parametrize("command", ["check", "deploy-net"])
def test_python_layers_are_refused_unless_allowed_and_nothing_is_imported_before(tmp_path, command):
    (tmp_path / "marker.py").write_text("open('IMPORTED', 'w').close()\n" + MODULE)
    net_file = tmp_path / "net.yaml"
    net_file.write_text(NET.format(module="marker", layer="Doubler"))
    refused = run(command, net_file, cwd=tmp_path)
    assert refused.returncode == 1 and not (tmp_path / "IMPORTED").exists()
    assert "imports module 'marker', which runs its code: pass --allow-python-layers" in refused.stderr
    allowed = run(command, net_file, "--allow-python-layers", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "IMPORTED").exists()


def test_plugins_register_through_entry_points(monkeypatch):
    class Entry:
        name, value = "broken", "nowhere:Nothing"

        def load(self):
            raise ImportError("No module named 'nowhere'")

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [Entry()])
    assert registry.load_plugins() == ["layer plug-in 'broken' (nowhere:Nothing) did not load: ImportError: "
                                       "No module named 'nowhere'"]


def test_two_nets_with_modules_of_one_name_beside_them_keep_their_own(tmp_path):
    nets = []
    for factor in (2, 5):
        folder = tmp_path / f"net{factor}"
        folder.mkdir()
        (folder / "mine.py").write_text(MODULE.replace("float(self.param_str or 2)", f"{factor}.0"))
        (folder / "net.yaml").write_text(NET.format(module="mine", layer="Doubler"))
        nets.append(netspec.load_net(str(folder / "net.yaml"), dtype=np.float64, trust=Trust.own()))
    for net, factor in zip(nets, (2, 5)):
        net.blobs["x"].data[...] = 1
        net.forward()
        assert (net.blobs["y"].data == factor).all()


def test_a_module_name_must_be_a_python_name(module_dir):
    net_file = module_dir / "net.yaml"
    net_file.write_text(NET.format(module="../evil", layer="Doubler"))
    result = run("check", net_file, "--allow-python-layers")
    assert result.returncode == 1 and "'../evil' is not a module name" in result.stderr


def test_the_old_python_layers_flag_of_load_net_says_where_it_went():
    with pytest.raises(TypeError, match=r"python_layers is now part of trust= .*trust=Trust\(python_layers=True\)"):
        netspec.load_net(NET.format(module="user_layers", layer="Doubler"), python_layers=True)


@pytest.mark.parametrize(("command", "what"), [(["time", "-n", "1", "--warmup", "0"], "timing"),
                                             (["test", "--weights", "none.h5"], "test")])
def test_the_commands_that_run_your_own_nets_refuse_python_layers_when_told(tmp_path, command, what):
    (tmp_path / "marker.py").write_text("open('IMPORTED', 'w').close()\n" + MODULE)
    (tmp_path / "net.yaml").write_text(NET.format(module="marker", layer="Doubler"))
    refused = run(command[0], "net.yaml", *command[1:], "--no-python-layers", cwd=tmp_path)
    assert refused.returncode == 1 and not (tmp_path / "IMPORTED").exists(), refused.stderr
    assert f"which runs its code: this {what} was started with --no-python-layers" in refused.stderr
