"""Every reference net in configs/ builds in every phase, with the published parameter counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import netspec
from netspec.engine.net import compile_net
from netspec.engine.registry import layer_schemas, solver_types
from netspec.spec.net_spec import parse_net
from netspec.spec.solver_spec import parse_solver

ALL_CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*/*.yaml"))
SOLVERS = [p for p in ALL_CONFIGS if p.stem.endswith("solver")]
MODULE_FILES = [p for p in ALL_CONFIGS if p.stem.endswith("_blocks")]  # modules that nets include
# the digits net reads converted data; the quickstart test (test_train_cli.py) builds and trains it
CONFIGS = [p for p in ALL_CONFIGS if p.parent.name != "digits" and p not in SOLVERS and p not in MODULE_FILES]

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
}


def graph(path, phase):
    return compile_net(parse_net(str(path), layer_schemas()), phase=phase)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_reference_net_builds(path, phase):
    g = graph(path, phase)
    family = path.parent.name if path.parent.name != "cifar10" else "_".join(path.stem.split("_")[:2])
    expected = PUBLISHED[family]
    if family == "googlenet" and "train" in path.stem:
        # two auxiliary classifiers, after inception_4a (512 channels) and 4d (528): 1x1 conv to 128,
        # fc 2048 -> 1024, classifier 1024 -> 1000
        convs = (512 * 128 + 128) + (528 * 128 + 128)
        expected += convs + 2 * (2048 * 1024 + 1024 + 1024 * 1000 + 1000)
    assert g.learnable_count() == expected


def test_every_config_is_listed():
    assert {p.parent.name for p in CONFIGS} == {"lenet", "cifar10", "alexnet", "vgg16", "googlenet", "resnet50",
                                                "resnet101", "resnet152"}
    assert {p.relative_to(p.parent.parent).as_posix() for p in ALL_CONFIGS if p not in CONFIGS} == {
        "digits/digits_net.yaml", "digits/digits_deploy.yaml", "digits/solver.yaml", "digits/adamw_solver.yaml",
        "resnet50/resnet_blocks.yaml", "googlenet/inception_blocks.yaml"}
    assert all(any(p.stem.endswith(kind) for p in CONFIGS if p.parent == folder)
               for folder in {p.parent for p in CONFIGS} for kind in ("train_test", "deploy"))


def test_alexnet_fc8_shape():
    g = graph(CONFIGS[0].parent.parent / "alexnet" / "alexnet_deploy.yaml", "TEST")
    assert g.blob_shapes["fc8"] == (10, 1000)


def test_googlenet_train_has_three_weighted_losses():
    g = graph(CONFIGS[0].parent.parent / "googlenet" / "googlenet_train_test.yaml", "TRAIN")
    weights = {n.name: n.loss_weights[0] for n in g.nodes if n.layer.is_loss}
    assert weights == {"loss1/loss": 0.3, "loss2/loss": 0.3, "loss3/loss": 1.0}


@pytest.mark.parametrize("name", ["lenet/lenet_train_test.yaml", "cifar10/cifar10_quick_train_test.yaml",
                                  "cifar10/cifar10_full_train_test.yaml"])
def test_small_nets_run_forward_and_backward(name):
    net = netspec.load_net(str(CONFIGS[0].parent.parent / name), phase="TRAIN", seed=0)
    loss = net.forward_backward()
    assert np.isfinite(loss) and loss > 0
    assert all(np.isfinite(b.diff).all() for blobs in net.params.values() for b in blobs)


@pytest.mark.parametrize("path", SOLVERS, ids=lambda p: p.parent.name)
def test_solver_files_parse(path):
    spec = parse_solver(str(path), layer_schemas(), list(solver_types()))
    assert spec.train_net.layers and len(spec.test_nets) == len(spec.params.test_iter)
