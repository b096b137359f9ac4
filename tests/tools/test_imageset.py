"""`netspec convert imageset` as a user runs it, its bad input, and digits from PNG files trained with Data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_cli import run
from test_train_cli import events

from netspec.data.dataset import Dataset, read_manifest
from netspec.tools.digits import load_digits, split


def save_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


@pytest.fixture
def class_folders(tmp_path):
    """Three classes of small colour and grey images, 4 each."""
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for name in ["cat", "dog", "eel"]:
        for i in range(4):
            shape = (6, 5, 3) if i % 2 else (6, 5)
            save_png(root / name / f"{i}.png", rng.integers(0, 256, shape, dtype=np.uint8))
    return root


def converted(*args) -> str:
    result = run("convert", "imageset", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_class_folders_become_a_labelled_dataset(class_folders, tmp_path):
    out = tmp_path / "ds"
    assert converted(class_folders, out, "--workers", "1").strip() == f"wrote 12 records to {out}"
    manifest = read_manifest(str(out))
    assert manifest["label_names"] == ["cat", "dog", "eel"]
    assert (manifest["count"], manifest["shapes"], manifest["label_counts"]) == (
        12, [[3, 6, 5]], {"0": 4, "1": 4, "2": 4})
    assert (out / "labels.txt").read_text() == "cat\ndog\neel\n"
    ds = Dataset(str(out))
    image, label = ds.record(5)
    expected = np.asarray(Image.open(class_folders / "dog" / "1.png").convert("RGB")).transpose(2, 0, 1)
    assert label == 1 and np.array_equal(image, expected)
    ds.close()


def test_list_files_resize_gray_encoding_and_parallel_workers_agree(class_folders, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("# path label\ncat/0.png 2\ndog/1.png 0\n\neel/3.png 1\n")
    outputs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"ds{workers}"
        converted(class_folders, listing, out, "--resize", "4x3", "--gray", "--encoded", "png", "--workers", workers)
        outputs[workers] = out
    one, two = read_manifest(str(outputs["1"])), read_manifest(str(outputs["2"]))
    assert one["source_sha256"] == two["source_sha256"] and one["shapes"] == [[1, 4, 3]]
    assert one["encoding"] == "png" and one["label_names"] == []
    a, b = Dataset(str(outputs["1"])), Dataset(str(outputs["2"]))
    assert [a.record(i)[1] for i in range(3)] == [2, 0, 1]
    assert all(np.array_equal(a.record(i)[0], b.record(i)[0]) for i in range(3))
    a.close()
    b.close()


def test_validation_split_is_stratified_and_shuffle_is_seeded(class_folders, tmp_path):
    out = tmp_path / "split"
    stdout = converted(class_folders, out, "--val-fraction", "0.25", "--shuffle", "--seed", "3",
                       "--backend", "hdf5")
    assert stdout.splitlines() == [f"wrote 9 records to {out / 'train'}", f"wrote 3 records to {out / 'val'}"]
    val = read_manifest(str(out / "val"))
    assert val["label_counts"] == {"0": 1, "1": 1, "2": 1} and val["backend"] == "hdf5"
    assert (out / "labels.txt").exists()
    again = tmp_path / "again"
    converted(class_folders, again, "--val-fraction", "0.25", "--shuffle", "--seed", "3", "--backend", "hdf5")
    assert read_manifest(str(again / "train"))["source_sha256"] == read_manifest(str(out / "train"))["source_sha256"]


def test_unreadable_images_are_skipped_and_counted_or_stop_under_strict(class_folders, tmp_path):
    (class_folders / "cat" / "empty.png").write_bytes(b"")
    (class_folders / "dog" / "text.png").write_text("not an image")
    (class_folders / "eel" / "cut.png").write_bytes((class_folders / "eel" / "0.png").read_bytes()[:60])
    result = run("convert", "imageset", class_folders, tmp_path / "ds")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote 12 records to {tmp_path / 'ds'}",
                                          "skipped 3 image(s) that could not be read (--strict stops instead)"]
    skipped = result.stderr.splitlines()
    assert skipped[0] == f"skipped {class_folders}/cat/empty.png: empty file"
    assert skipped[1] == f"skipped {class_folders}/dog/text.png: not an image"
    assert skipped[2].startswith(f"skipped {class_folders}/eel/cut.png: cannot decode: ")
    assert read_manifest(str(tmp_path / "ds"))["options"]["skipped"] == 3
    strict = run("convert", "imageset", class_folders, tmp_path / "strict", "--strict")
    assert strict.returncode == 1
    assert strict.stderr.strip() == f"error: {class_folders}/cat/empty.png: empty file (stopped: --strict)"
    assert not (tmp_path / "strict").exists() and not (tmp_path / "strict.partial").exists()


def test_bad_sources_and_outputs_get_one_clear_message(class_folders, tmp_path):
    def fails(*args):
        result = run("convert", "imageset", *args)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        return result.stderr.strip()

    listing = tmp_path / "list.txt"
    for text, message in [("cat/0.png\n", "list.txt:1: expected 'relative/path label', got 'cat/0.png' (no label)"),
                          ("cat/0.png 1\ndog/1.png one\n", "list.txt:2: the label 'one' is not an integer"),
                          ("../secret.png 0\n", "list.txt:1: '../secret.png' is outside the root folder")]:
        listing.write_text(text)
        assert message in fails(class_folders, listing, tmp_path / "x")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    assert fails(tmp_path / "empty", tmp_path / "x") == (
        f"error: {tmp_path}/empty/cls: the class folder holds no images "
        "(.png, .jpg, .jpeg, .bmp, .gif, .tif, .tiff, .webp, .ppm, .pgm)")
    assert fails(tmp_path / "nowhere", tmp_path / "x") == f"error: {tmp_path}/nowhere: no such folder"
    converted(class_folders, tmp_path / "ds")
    assert fails(class_folders, tmp_path / "ds") == (
        f"error: {tmp_path}/ds: already exists; choose another output or pass --overwrite")
    assert "wrote 12 records" in converted(class_folders, tmp_path / "ds", "--overwrite")
    assert "expected HxW such as 32x32, got '32'" in run("convert", "imageset", class_folders, tmp_path / "y",
                                                         "--resize", "32").stderr


def test_images_of_different_sizes_are_refused_unless_resized_or_allowed(class_folders, tmp_path):
    save_png(class_folders / "dog" / "wide.png", np.zeros((6, 9, 3), dtype=np.uint8))
    result = run("convert", "imageset", class_folders, tmp_path / "ds", "--workers", "1")
    assert result.returncode == 1
    assert result.stderr == (f"error: {class_folders}/dog/wide.png is 6x9 (HxW) but {class_folders}/cat/0.png is 6x5: "
                             "resize them all with --resize HxW, or keep their sizes with --allow-mixed-sizes\n")
    assert not (tmp_path / "ds").exists()
    assert "wrote 13 records" in converted(class_folders, tmp_path / "ds", "--allow-mixed-sizes")
    assert read_manifest(str(tmp_path / "ds"))["shapes"] == [[3, 6, 5], [3, 6, 9]]
    assert "wrote 13 records" in converted(class_folders, tmp_path / "resized", "--resize", "6x5")


def test_a_damaged_record_stops_training_with_its_key(class_folders, tmp_path):
    import lmdb

    converted(class_folders, tmp_path / "ds", "--resize", "4x4")
    with lmdb.open(str(tmp_path / "ds")) as env, env.begin(write=True) as txn:
        txn.put(b"00000005", b"\x02\x00\x00\x00{}x")
    (tmp_path / "solver.yaml").write_text(
        "base_lr: 0.1\nmax_iter: 10\nsnapshot_prefix: run/s\nnet:\n  layers:\n"
        "    - {name: d, type: Data, top: [data, label], data_param: {source: ds, batch_size: 4}}\n"
        "    - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}\n"
        "    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    result = run("train", tmp_path / "solver.yaml")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"error: {tmp_path}/ds record 00000005: bad record header "
                                     "(KeyError: 'shape')")


def test_digits_from_png_files_train_with_a_data_layer(tmp_path):
    """The issue's end-to-end check: PNG class folders -> convert imageset -> Data -> at least 95%."""
    images, labels = load_digits()
    train_rows, test_rows = split(labels)
    for part, rows in (("train", train_rows), ("test", test_rows)):
        for row in rows:
            pixels = np.round(images[row, 0] * 255).astype(np.uint8)
            save_png(tmp_path / part / str(int(labels[row])) / f"{row:04d}.png", pixels)
        converted(tmp_path / part, tmp_path / f"{part}_db", "--gray", "--shuffle", "--encoded", "png")
    net = (Path(__file__).parent.parent.parent / "configs" / "digits" / "digits_net.yaml").read_text()
    data_layers = """  - name: digits
    type: Data
    top: [data, label]
    include: {phase: TRAIN}
    transform_param: {scale: 0.00392156862745098}
    data_param: {source: train_db, batch_size: 64}
  - name: digits
    type: Data
    top: [data, label]
    include: {phase: TEST}
    transform_param: {scale: 0.00392156862745098}
    data_param: {source: test_db, batch_size: 120}
"""
    start, end = net.index("  - name: digits"), net.index("  - name: conv1")
    (tmp_path / "net.yaml").write_text(net[:start] + data_layers + net[end:])
    (tmp_path / "solver.yaml").write_text("net: net.yaml\ntest_iter: [3]\ntest_interval: 500\nbase_lr: 0.01\n"
                                          "momentum: 0.9\nweight_decay: 0.0005\nmax_iter: 500\nrandom_seed: 1\n"
                                          "snapshot_prefix: runs/digits\n")
    result = run("train", tmp_path / "solver.yaml")
    assert result.returncode == 0, result.stderr
    tests = events(tmp_path / "runs", "TEST")
    assert tests[-1]["iter"] == 500 and tests[-1]["accuracy"] >= 0.95, tests
    assert json.loads((tmp_path / "train_db" / "manifest.json").read_text())["count"] == 1437
    assert os.path.exists(tmp_path / "runs" / "digits_iter_500.weights.h5")


def test_keep_aspect_scales_the_short_side_and_crops_about_the_centre(tmp_path):
    pixels = np.random.default_rng(3).integers(0, 256, (10, 20, 3), dtype=np.uint8)  # 10 high, 20 wide
    save_png(tmp_path / "images" / "only" / "wide.png", pixels)
    assert run("convert", "imageset", tmp_path / "images", tmp_path / "out", "--resize", "4x4", "--keep-aspect",
               "--workers", 1).returncode == 0
    record = Dataset(str(tmp_path / "out")).record(0)[0]
    scaled = np.asarray(Image.fromarray(pixels).resize((8, 4), Image.BILINEAR))  # short side 10 -> 4: 20 -> 8
    np.testing.assert_array_equal(record, scaled[:, 2:6].transpose(2, 0, 1))  # the centre 4 of the 8 columns
    assert read_manifest(str(tmp_path / "out"))["options"]["keep_aspect"] is True
    refused = run("convert", "imageset", tmp_path / "images", tmp_path / "other", "--keep-aspect")
    assert refused.returncode == 2 and "--keep-aspect says how --resize resizes: give --resize HxW too" in refused.stderr
