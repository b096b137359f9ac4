"""``netspec deploy-net``: a train/val net becomes its deploy net (Input, no losses or accuracy, Softmax)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from PIL import Image
from test_cli import fails, ok, run

from netspec.engine.deploy import derive_deploy_net

HEAD = """
name: small
layers:
  - {name: data, type: Data, top: [data, label], include: {phase: TRAIN}, data_param: {source: data/train, batch_size: 4},
     transform_param: {crop_size: 6, mirror: true}}
  - {name: data, type: Data, top: [data, label], include: {phase: TEST}, data_param: {source: data/val, batch_size: 2},
     transform_param: {crop_size: 6}}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution_param: {num_output: 4, kernel_size: 3}}
  - {name: relu, type: ReLU, bottom: conv, top: conv}
  - {name: aux, type: InnerProduct, bottom: conv, top: aux, inner_product_param: {num_output: 3}}
  - {name: aux_loss, type: SoftmaxWithLoss, bottom: [aux, label], top: aux_loss, loss_weight: 0.3}
  - {name: ip, type: InnerProduct, bottom: conv, top: ip, inner_product_param: {num_output: 3}}
  - {name: drop, type: Dropout, bottom: ip, top: ip, include: {phase: TRAIN}}
  - {name: accuracy, type: Accuracy, bottom: [ip, label], top: accuracy, include: {phase: TEST}}
"""


@pytest.fixture
def folder(tmp_path):
    """A train/val net beside a data/ folder of 8x8 colour images, two classes."""
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "images" / label / f"{i}.png")
    ok("convert", "imageset", tmp_path / "images", tmp_path / "data", "--val-fraction", "0.5")
    return tmp_path


def write_net(folder, loss: str) -> str:
    path = folder / "train_val.yaml"
    path.write_text(HEAD + loss)
    return str(path)


def names(net: dict) -> list[str]:
    return [layer["name"] for layer in net["layers"]]


def test_the_deploy_net_keeps_what_feeds_the_main_loss_and_ends_in_softmax(folder):
    path = write_net(folder, "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    printed = yaml.safe_load(ok("deploy-net", path))
    assert printed == derive_deploy_net(path)
    assert names(printed) == ["data", "conv", "relu", "ip", "prob"]  # no aux branch, TRAIN-only dropout, accuracy
    assert printed["layers"][0] == {"name": "data", "type": "Input", "top": "data",
                                    "input_param": {"shape": {"dim": [1, 3, 6, 6]}}}  # the TEST crop
    assert printed["layers"][-1] == {"name": "prob", "type": "Softmax", "bottom": "ip", "top": "prob"}
    assert all("include" not in layer for layer in printed["layers"])

    out = folder / "deploy.yaml"
    assert ok("deploy-net", path, "-o", out, "--batch-size", "8").strip() == f"wrote {out} (5 layers)"
    assert "derived by netspec" in out.read_text().splitlines()[0]
    summary = ok("check", out)
    assert "(8, 3, 6, 6)" in summary and summary.strip().endswith("outputs: prob")


@pytest.mark.parametrize("loss, last", [
    ("  - {name: loss, type: SigmoidCrossEntropyLoss, bottom: [ip, label], top: loss}\n", "Sigmoid"),
    ("  - {name: loss, type: EuclideanLoss, bottom: [ip, label], top: loss}\n", "InnerProduct"),
])
def test_the_output_layer_follows_the_loss(folder, loss, last):
    net = derive_deploy_net(write_net(folder, loss), input_shape=(3, 6, 6))
    assert net["layers"][-1]["type"] == last


def test_a_net_without_its_data_needs_the_input_shape(tmp_path):
    path = write_net(tmp_path, "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    message = fails("deploy-net", path)
    assert "train_val.yaml:6: layer 'data'" in message and "no such dataset folder" in message
    assert message.endswith("pass the input shape (--input-shape C,H,W) to derive the deploy net without the data")
    net = yaml.safe_load(ok("deploy-net", path, "--input-shape", "3x6x6"))
    assert net["layers"][0]["input_param"] == {"shape": {"dim": [1, 3, 6, 6]}}
    for shape in ("3,six", "6,6"):
        bad = run("deploy-net", path, "--input-shape", shape)
        assert bad.returncode == 2 and f"'{shape}' is not 3 positive whole numbers" in bad.stderr
    assert yaml.safe_load(ok("deploy-net", path, "--input-shape", "3X6X6")) == net
