"""The registry of layer types and update rules: filled on its first use, from any thread, plug-ins last."""

from __future__ import annotations

import subprocess
import sys
import textwrap

RACE = """
import sys, threading, time
from netspec.engine import registry

def look_up():
    registry.layer_types()

def import_rules():
    import netspec.solvers  # noqa: F401 - registers the rules while the other thread fills the registry

first = threading.Thread(target=look_up, daemon=True)
first.start()
time.sleep(float(sys.argv[1]))
second = threading.Thread(target=import_rules, daemon=True)
second.start()
first.join(20)
second.join(20)
print(first.is_alive() or second.is_alive(), len(registry.layer_types()) > 60, "SGD" in registry.solver_types())
"""


def test_two_threads_filling_the_registry_at_once_never_wait_on_each_other():
    for delay in ("0", "0.02", "0.1"):
        result = subprocess.run([sys.executable, "-c", RACE, delay], capture_output=True, text=True, timeout=60)
        assert result.stdout.split() == ["False", "True", "True"], (delay, result.stdout, result.stderr)


def test_a_plugin_loads_after_the_built_in_types_whatever_was_imported_first(tmp_path):
    (tmp_path / "relu_plugin.py").write_text(textwrap.dedent("""
        from netspec.engine.registry import layer_class, register_layer

        @register_layer
        class LoudReLU(layer_class("ReLU")):  # (a plug-in may build on a built-in type)
            type = "LoudReLU"
    """))
    info = tmp_path / "relu_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relu-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[netspec.layers]\nloud = relu_plugin\n")
    code = ("from netspec.layers import pooling  # a built-in module first, as netspec export onnx does\n"
            "from netspec.engine.registry import layer_types\n"
            "print('LoudReLU' in layer_types(), 'Pooling' in layer_types())")
    result = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.stdout.split() == ["True", "True"], result.stderr
