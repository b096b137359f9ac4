"""Packaging guards: the mapped subpackages load only as netspec.*, and a layer type registers once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from netspec.engine.layer import Layer
from netspec.engine.registry import layer_types, register_layer
from netspec.errors import NetspecError

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("package", ["layers", "solvers", "tools", "model_zoo", "configs"])
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


def test_a_wheel_installed_in_a_fresh_venv_copies_a_reference_config_and_trains_it(tmp_path):
    """A non-editable install carries the reference configs: ``netspec configs copy`` and a short training work."""
    source = tmp_path / "source"  # a clean copy: no build/ or egg-info of earlier builds, no converted data
    built = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "site")

    def ignored(folder, names):
        converted = {"data", "runs"} if Path(folder).parent == ROOT / "configs" else set()
        return built(folder, names) | (converted & set(names))

    shutil.copytree(ROOT, source, ignore=ignored)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", tmp_path / "dist", source], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    wheel, = (tmp_path / "dist").glob("netspec-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site, = venv.glob("lib/python*/site-packages")
    # the dependencies come from this environment's site-packages, after the venv's own (so the wheel wins);
    # this environment's editable netspec is not on that path (its finder is installed by a .pth file there,
    # which a directory listed in a .pth file does not run)
    (site / "dependencies.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                              "--no-deps", "--no-index", wheel], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr

    def netspec(*args):
        result = subprocess.run([venv / "bin" / "netspec", *map(str, args)], cwd=tmp_path / "work",
                                capture_output=True, text=True)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        return result.stdout

    (tmp_path / "work").mkdir()
    located = subprocess.run([venv / "bin" / "python", "-c", "import netspec.configs; print(netspec.configs.FOLDER)"],
                             capture_output=True, text=True, cwd=tmp_path / "work")
    assert located.stdout.startswith(str(site)), located  # the wheel's copy, not this checkout
    assert "resnet50" in netspec("configs")
    assert netspec("configs", "copy", "digits").startswith("copied digits into digits: ")
    netspec("convert", "digits", "digits/data")
    trained = netspec("train", "digits/solver.yaml", "--max-iter", "20")
    assert "optimization done at iteration 20" in trained
    assert (tmp_path / "work" / "digits" / "runs" / "digits_iter_20.weights.h5").is_file()
