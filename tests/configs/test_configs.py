"""Every reference net in configs/ builds in every phase, with the published parameter counts.

A model folder ships as Caffe's ``models/`` did: ``<model>_train_val.yaml`` (Data layers reading
``data/train`` and ``data/val``), ``<model>_solver.yaml``, ``<model>_deploy.yaml``, and a
``<model>_timing.yaml`` with DummyData inputs that builds and times without a dataset.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import netspec
from netspec.engine.deploy import derive_deploy_net
from netspec.engine.net import compile_net
from netspec.engine.registry import layer_schemas, solver_types
from netspec.spec.net_spec import parse_net
from netspec.spec.solver_spec import parse_solver
from netspec.spec.yaml_text import config_yaml
from netspec.tools.imageset import ImagesetOptions, convert_imageset

CONFIGS_DIR = Path(__file__).parent.parent.parent / "configs"
ALL_CONFIGS = sorted(CONFIGS_DIR.glob("*/*.yaml"))
SOLVERS = [p for p in ALL_CONFIGS if p.stem.endswith("solver")]
MODULE_FILES = [p for p in ALL_CONFIGS if p.stem.endswith("_blocks")]  # modules that nets include
TRAIN_VALS = [p for p in ALL_CONFIGS if p.stem.endswith("_train_val")]
# the nets that build without data: the digits net reads converted data (test_train_cli.py trains it)
CONFIGS = [p for p in ALL_CONFIGS if p.parent.name != "digits" and p.stem.endswith(("_timing", "_deploy"))]
# the examples of the newer layers, a net and a solver each (test_example_configs.py trains them)
EXAMPLES = ["char_lstm", "fcn_shapes", "mobilenetv2_digits", "siamese_digits", "vit_digits"]
MODELS = ["lenet", "cifar10_quick", "cifar10_full", "alexnet", "googlenet", "resnet50", "vgg16", "mobilenetv2",
          "resnet20_cifar10"]

PUBLISHED = {
    "lenet": 431_080,
    "cifar10_quick": 145_578,
    "cifar10_full": 89_578,
    "alexnet": 60_965_224,
    "vgg16": 138_357_544,
    "googlenet": 6_998_552,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "mobilenetv2": 3_504_872,  # (torchvision's mobilenet_v2 too)
    "resnet20_cifar10": 272_474,  # the paper's 0.27 M: 269,722 with option A's shortcuts, + two 1x1 projections
}
# GoogLeNet's two auxiliary classifiers, after inception_4a (512 channels) and 4d (528): 1x1 conv to 128,
# fc 2048 -> 1024, classifier 1024 -> 1000; they exist in the train and test phases only
GOOGLENET_AUX = (512 * 128 + 128) + (528 * 128 + 128) + 2 * (2048 * 1024 + 1024 + 1024 * 1000 + 1000)


def model_of(path: Path) -> str:
    return path.stem.rsplit("_", 2 if path.stem.endswith("_train_val") else 1)[0]


def graph(path, phase):
    return compile_net(parse_net(str(path), layer_schemas()), phase=phase)


def expected_count(path: Path) -> int:
    aux = GOOGLENET_AUX if model_of(path) == "googlenet" and not path.stem.endswith("_deploy") else 0
    return PUBLISHED[model_of(path)] + aux


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_reference_net_builds(path, phase):
    assert graph(path, phase).learnable_count() == expected_count(path)


def test_every_model_ships_train_val_solver_deploy_and_timing_nets():
    for model in MODELS:
        folder = next(p.parent for p in ALL_CONFIGS if p.stem.startswith(model))
        for kind in ("train_val", "solver", "deploy", "timing"):
            assert (folder / f"{model}_{kind}.yaml").is_file(), (model, kind)
    assert sorted(model_of(p) for p in TRAIN_VALS) == sorted(MODELS)
    assert {p.relative_to(CONFIGS_DIR).as_posix() for p in ALL_CONFIGS
            if p not in CONFIGS + SOLVERS + TRAIN_VALS} == {
        "digits/digits_net.yaml", "digits/digits_deploy.yaml", "resnet50/resnet_blocks.yaml",
        "googlenet/inception_blocks.yaml", "mobilenetv2/mobilenetv2_blocks.yaml", "augmentation/augmented_net.yaml",
        "resnet20_cifar10/resnet20_cifar10_blocks.yaml",
        *(f"{example}/{example}_net.yaml" for example in EXAMPLES)}


def save_images(root: Path, size: int, gray: bool) -> None:
    """Two classes of three noise images each."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (size, size) if gray else (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A data/ folder (train + val) for each image size the reference nets read, as their comments say."""
    made = {}
    for size, gray in ((28, True), (32, False), (256, False)):
        root = tmp_path_factory.mktemp(f"data{size}")
        save_images(root / "images", size, gray)
        convert_imageset(str(root / "images"), str(root / "data"), options=ImagesetOptions(val_fraction=0.5, gray=gray))
        made[size] = root / "data"
    return made


def model_folder(train_val: Path, datasets, tmp_path) -> Path:
    """A copy of the model's configs next to a data/ folder of the size its net reads."""
    size = 28 if model_of(train_val) == "lenet" else 32 if "cifar" in train_val.stem else 256
    for path in train_val.parent.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "data").symlink_to(datasets[size])
    return tmp_path / train_val.name


@pytest.mark.parametrize("train_val", TRAIN_VALS, ids=model_of)
def test_train_val_nets_read_their_data_and_derive_the_shipped_deploy_net(train_val, datasets, tmp_path):
    copy = model_folder(train_val, datasets, tmp_path)
    for phase in ("TRAIN", "TEST"):
        assert graph(copy, phase).learnable_count() == expected_count(train_val)
    derived = compile_net(parse_net(config_yaml(derive_deploy_net(str(copy))), layer_schemas()), phase="TEST")
    shipped = graph(train_val.parent / f"{model_of(train_val)}_deploy.yaml", "TEST")
    assert derived.learnable_count() == PUBLISHED[model_of(train_val)]
    assert param_shapes(derived) == param_shapes(shipped)
    assert derived.blob_shapes["prob"][1:] == shipped.blob_shapes[shipped.outputs[0]][1:]


def param_shapes(g) -> dict:
    return {node.name: node.param_shapes for node in g.nodes if node.param_shapes}


@pytest.mark.parametrize("path", SOLVERS, ids=lambda p: p.stem)
def test_solver_files_parse(path):
    spec = parse_solver(str(path), layer_schemas(), list(solver_types()))
    assert spec.train_net.layers and len(spec.test_nets) == len(spec.params.test_iter)


def test_alexnet_fc8_shape():
    g = graph(CONFIGS_DIR / "alexnet" / "alexnet_deploy.yaml", "TEST")
    assert g.blob_shapes["fc8"] == (10, 1000)


def test_googlenet_train_has_three_weighted_losses():
    g = graph(CONFIGS_DIR / "googlenet" / "googlenet_timing.yaml", "TRAIN")
    weights = {n.name: n.loss_weights[0] for n in g.nodes if n.layer.is_loss}
    assert weights == {"loss1/loss": 0.3, "loss2/loss": 0.3, "loss3/loss": 1.0}


@pytest.mark.parametrize("name", ["lenet/lenet_timing.yaml", "cifar10/cifar10_quick_timing.yaml",
                                  "cifar10/cifar10_full_timing.yaml", "resnet20_cifar10/resnet20_cifar10_timing.yaml"])
def test_small_nets_run_forward_and_backward(name):
    net = netspec.load_net(str(CONFIGS_DIR / name), phase="TRAIN", seed=0)
    loss = net.forward_backward()
    assert np.isfinite(loss) and loss > 0
    assert all(np.isfinite(b.diff).all() for blobs in net.params.values() for b in blobs)


def test_the_index_names_every_reference_config_folder():
    from netspec.tools.configs import reference_configs

    folders = {p.name for p in CONFIGS_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml"))}
    assert set(reference_configs()) == folders


def test_a_copied_config_stands_alone_and_builds(tmp_path):
    from test_cli import fails, ok

    assert "resnet152  " in ok("configs")
    out = tmp_path / "mine"
    assert ok("configs", "copy", "resnet152", out) == (
        f"copied resnet152 into {out}: resnet_blocks.yaml, resnet152_deploy.yaml, resnet152_timing.yaml\n")
    assert (out / "resnet_blocks.yaml").read_text() == (CONFIGS_DIR / "resnet50" / "resnet_blocks.yaml").read_text()
    assert "include: resnet_blocks.yaml\n" in (out / "resnet152_deploy.yaml").read_text()
    graph = compile_net(parse_net(str(out / "resnet152_deploy.yaml"), layer_schemas()), phase="TEST")
    assert graph.nodes[-1].name == "prob"
    # a second copy replaces nothing unless asked; a link in the way is never written through
    assert fails("configs", "copy", "resnet152", out) == (
        f"error: {out}/resnet_blocks.yaml exists; copy into another folder, or give --overwrite to replace these 3 files")
    victim = tmp_path / "victim.yaml"
    victim.write_text("kept")
    (out / "resnet152_deploy.yaml").unlink()
    (out / "resnet152_deploy.yaml").symlink_to(victim)
    ok("configs", "copy", "resnet152", out, "--overwrite")
    assert victim.read_text() == "kept" and not (out / "resnet152_deploy.yaml").is_symlink()
    assert fails("configs", "copy", "resnt50") == (
        "error: no reference config 'resnt50'; did you mean 'resnet50'? (netspec configs lists them)")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert fails("configs", "copy", "lenet", tmp_path / "link").startswith(f"error: cannot copy lenet into {tmp_path}/link: ")
