"""Packaging guards: the mapped subpackages load only as netspec.*, and a layer type registers once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netspec.engine.layer import Layer
from netspec.engine.registry import layer_types, register_layer
from netspec.errors import NetspecError

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("package", ["layers", "solvers", "tools", "model_zoo"])
def test_top_level_folders_refuse_the_wrong_import_name(package):
    result = subprocess.run([sys.executable, "-c", f"import {package}"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert f"import this package as netspec.{package}, not as '{package}'" in result.stderr


def test_subpackages_import_under_netspec():
    import netspec.model_zoo
    import netspec.solvers
    import netspec.tools  # noqa: F401

    assert "Convolution" in layer_types()


def test_a_second_class_for_one_type_is_refused():
    class Impostor(Layer):
        type = "ReLU"

    with pytest.raises(NetspecError, match="registered twice"):
        register_layer(Impostor)
    assert layer_types()["ReLU"] is not Impostor
