"""The examples of the newer layers, as a user runs them: convert their data, train a while, and learn.

Each folder in configs/ holds a net and a solver whose first lines say how to run them; here each is trained
for a few hundred iterations from a fresh copy (the examples guide quotes the full runs' figures), and the tools
that make their data refuse bad input in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_cli import run

import netspec

CONFIGS = Path(__file__).parent.parent.parent / "configs"


def prepared(tmp_path: Path, example: str, *convert: str) -> Path:
    """configs/EXAMPLE copied to tmp_path (without data or runs) and its data converted beside it."""
    folder = tmp_path / example
    shutil.copytree(CONFIGS / example, folder, ignore=shutil.ignore_patterns("data", "runs"))
    result = run("convert", *convert, folder / "data")
    assert result.returncode == 0, result.stderr
    return folder


def trained(folder: Path, iterations: int) -> list[dict]:
    """Train the folder's solver for ``iterations``; the test events of metrics.jsonl (at 0 and at the end)."""
    solver = next(folder.glob("*_solver.yaml"))
    result = run("train", solver, "--max-iter", iterations, "--out", folder / "runs")
    assert result.returncode == 0, result.stderr
    lines = (folder / "runs" / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["phase"] == "TEST"]


def test_fcn_segments_generated_shapes(tmp_path):
    folder = prepared(tmp_path, "fcn_shapes", "shapes")
    with h5py.File(folder / "data" / "train.h5") as f:
        assert f["data"].shape == (2000, 1, 32, 32) and f["label"].shape == (2000, 1, 32, 32)
        assert set(np.unique(f["label"][:50])) == {0, 1, 2, 3}
    # a pixel is background about three times in four: learning the shapes is what passes 0.85
    assert trained(folder, 250)[-1]["accuracy"] >= 0.85


def test_siamese_net_learns_features_that_tell_digits_apart(tmp_path):
    folder = prepared(tmp_path, "siamese_digits", "digit-pairs")
    with h5py.File(folder / "data" / "test.h5") as f:
        assert f["pair_data"].shape == (2000, 2, 8, 8) and f["sim"][:].mean() == 0.5
    tests = trained(folder, 500)
    assert tests[-1]["loss"] < 0.5 * tests[0]["loss"]
    net = netspec.load_net(folder / "siamese_digits_net.yaml", phase="TEST")
    net.load_weights(folder / "runs" / "siamese_digits_iter_500.weights.h5")
    right = 0
    for _ in range(10):
        net.forward()
        distance = np.linalg.norm(net.blobs["feat"].data - net.blobs["feat_p"].data, axis=1)
        right += np.sum((distance < 0.5) == (net.blobs["sim"].data == 1))
    assert right / 2000 >= 0.9  # same or different, told by the distance against half the margin


def test_char_lstm_learns_python_help_text(tmp_path):
    folder = prepared(tmp_path, "char_lstm", "text")
    vocab = json.loads((folder / "data" / "vocab.json").read_text(encoding="utf-8"))
    net_text = (folder / "char_lstm_net.yaml").read_text()
    assert f"input_dim: {len(vocab)}" in net_text and f"num_output: {len(vocab)}" in net_text
    with h5py.File(folder / "data" / "train.h5") as f:
        data, cont, label = f["data"][:2], f["cont"][:2], f["label"][:2]
    assert (label[:, :-1] == data[:, 1:]).all() and label[0, -1] == data[1, 0]
    assert (cont[:, 0] == 0).all() and (cont[:, 1:] == 1).all()
    # a uniform guess costs ln(103) = 4.6 nats a character, the letters' frequencies alone about 3.3
    assert trained(folder, 120)[-1]["loss"] < 2.8


@pytest.mark.parametrize("example, floor", [("mobilenetv2_digits", 0.9), ("vit_digits", 0.75)])
def test_modern_nets_learn_the_digits(tmp_path, example, floor):
    folder = prepared(tmp_path, example, "digits")
    assert trained(folder, 150)[-1]["accuracy"] >= floor


def test_text_conversion_refuses_bad_text(tmp_path):
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"abc\xff\xfe")
    result = run("convert", "text", tmp_path / "out", "--source", binary)
    assert result.returncode == 1 and result.stderr == f"error: {binary}: not UTF-8 text (byte 3)\n"
    short = tmp_path / "short.txt"
    short.write_text("hello")
    result = run("convert", "text", tmp_path / "out", "--source", short)
    assert result.returncode == 1
    assert result.stderr == f"error: {short}: 5 characters leave no training window of 64\n"
    result = run("convert", "text", tmp_path / "out", "--source", tmp_path)
    assert result.returncode == 2 and "is a directory" in result.stderr
