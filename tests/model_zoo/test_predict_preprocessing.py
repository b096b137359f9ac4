"""``netspec predict`` prepares an image as training's data did: resized as the dataset conversion resized it, then
the TEST phase's transform_param (centre crop, mean, scale), so the same pixels reach the net as in validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_cli import ok, run

import netspec
from netspec.data.dataset import Dataset
from netspec.errors import ConfigError
from netspec.model_zoo.card import parse_card
from netspec.model_zoo.zoo import Zoo

NET = """
layers:
  - {name: data, type: Data, top: [data, label], include: {phase: TRAIN}, data_param: {source: data, batch_size: 2},
     transform_param: {crop_size: 32, mirror: true, mean_value: [100, 110, 120], scale: 0.01, channel_order: BGR}}
  - {name: data, type: Data, top: [data, label], include: {phase: TEST}, data_param: {source: data, batch_size: 2},
     transform_param: {crop_size: 32, mean_value: [100, 110, 120], scale: 0.01, channel_order: BGR}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: gaussian, std: 0.1}}}
  - {name: test_prob, type: Softmax, bottom: ip, top: test_prob, include: {phase: TEST}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""
SIZES = [(60, 40), (40, 70), (57, 45)]  # (width, height) of each class's images: none of them square


def trained_and_published(tmp_path: Path, keep_aspect: bool) -> list[Path]:
    """Images of three classes converted --resize 40x40 (squashed, or --keep-aspect), a net cropping 32 trained two
    iterations on them and published as 'crop' in tmp_path/zoo; the images in the order of their records."""
    rng = np.random.default_rng(1)
    images = []
    for name, (width, height) in zip(("ant", "bee", "cow"), SIZES):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(2):
            images.append(tmp_path / "images" / name / f"{i}.png")
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(images[-1])
    ok("convert", "imageset", tmp_path / "images", tmp_path / "data", "--resize", "40x40",
       *(["--keep-aspect"] if keep_aspect else []))
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 2\nsnapshot_prefix: run/crop\n")
    ok("train", tmp_path / "solver.yaml")
    ok("zoo", "publish", "--name", "crop", "--run", tmp_path / "run", "--zoo", tmp_path / "zoo")
    return images


def forward_test_phase(tmp_path: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The TEST phase of the trained net over the dataset's first ``count`` records in one batch: its data blob
    (the pixels that reached the net) and its class probabilities."""
    net = netspec.load_net(str(tmp_path / "net.yaml"), phase="TEST", batch_size=count)
    net.load_weights(tmp_path / "run" / "crop_iter_2.weights.h5")
    net.forward()
    return net.blobs["data"].data.copy(), net.blobs["test_prob"].data.astype(np.float64)


@pytest.mark.parametrize("keep_aspect", [False, True], ids=["squash", "keep-aspect"])
def test_predict_on_an_original_image_gives_the_scores_of_the_test_phase_on_its_record(tmp_path, keep_aspect):
    images = trained_and_published(tmp_path, keep_aspect)
    pixels, expected = forward_test_phase(tmp_path, len(images))

    result = run("predict", "crop", *images, "--zoo", tmp_path / "zoo", "--json", "--top-k", "3")
    assert result.returncode == 0, result.stderr
    got = [{p["label"]: p["probability"] for p in r["predictions"]} for r in json.loads(result.stdout)["results"]]
    assert np.array_equal([[row[k] for k in range(3)] for row in got], expected)  # exactly: the same computation
    mode = " keeping their aspect" if keep_aspect else ""
    assert result.stderr == (f"note: resized {len(images)} input(s) to 40x40{mode}, like its training images "
                             f"({images[0]} was 40x60): the model takes 3x32x32 BGR images (a centre crop)\n")

    model = netspec.model_zoo.load("crop", zoo=str(tmp_path / "zoo"), batch_size=len(images))
    with pytest.warns(UserWarning, match="resized 6 input"):
        model.predict(images)
    assert np.array_equal(model.net.blobs["data"].data, pixels)  # the same pixels reached the net

    dataset = Dataset(str(tmp_path / "data"))  # a .npy of records holds images of the dataset's size
    np.save(tmp_path / "records.npy", np.stack([dataset.record(i)[0] for i in range(len(images))]))
    dataset.close()
    records = model.predict(tmp_path / "records.npy", top_k=3)
    assert [[p["probability"] for p in sorted(r["predictions"], key=lambda p: p["label"])] for r in records] == \
        expected.tolist()

    card = Zoo(str(tmp_path / "zoo")).card("crop").input
    assert (card.shape, card.resize, card.keep_aspect, card.crop_size) == ([3, 32, 32], [40, 40], keep_aspect, 32)


CARD = """name: m
version: '1'
input: {shape: [3, 32, 32], channels: RGB, INPUT}
files:
  - {path: deploy.yaml, size: 10, sha256: SHA}
  - {path: weights.h5, size: 20, sha256: SHA}
""".replace("SHA", "a" * 64)


def test_a_cards_resize_and_crop_must_make_its_input_shape():
    assert parse_card(CARD.replace("INPUT", "resize: [40, 48], keep_aspect: true, crop_size: 32"), "m.yaml")
    assert parse_card(CARD.replace("INPUT", "resize: [32, 32]"), "m.yaml").input.crop_size == 0
    older = parse_card(CARD.replace(", INPUT", ""), "m.yaml").input  # a card from before they were recorded
    assert (older.resize, older.keep_aspect, older.crop_size) == (None, False, 0)
    for given, message in [
        ("resize: [40, 40]", "input.resize: [40, 40] is not the input's 32x32: give the crop_size that made it"),
        ("resize: [40, 40], crop_size: 28", "input.crop_size: a centre crop of 28 makes 28x28 images, the input "
                                            "is 32x32"),
        ("resize: [30, 40], crop_size: 32", "input.crop_size: a centre crop of 32 does not fit in images of 30x40"),
        ("crop_size: 32", "input.crop_size: needs resize (the size of the images it is cropped from)"),
        ("keep_aspect: true", "input.keep_aspect: needs resize (the size of the images it is cropped from)"),
        ("resize: [40]", "input.resize: must be [H, W] of positive sizes, got [40]"),
        ("resize: [40, 0], crop_size: 32", "input.resize: must be [H, W] of positive sizes, got [40, 0]"),
    ]:
        with pytest.raises(ConfigError) as error:
            parse_card(CARD.replace("INPUT", given), "m.yaml")
        assert str(error.value).startswith(f"m.yaml:3: {message}"), str(error.value)
