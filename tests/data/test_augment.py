"""Augmentation (random resized crop, rotation, colour jitter, random erasing) against naive references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_cli import fails, ok, run
from test_record_data import batches, data_net
from test_records import images, write_dataset

from netspec.data import augment
from netspec.data.augment import ColorJitterParams, RandomErasingParams, RandomResizedCropParams
from netspec.data.transform import LUMA, Transformer, TransformParams

C = augment.C
EVERYTHING = {"crop_size": 5, "mirror": True, "random_resized_crop": {"scale": [0.3, 1]}, "rotation": 20,
              "color_jitter": {"brightness": 0.3, "contrast": 0.3, "saturation": 0.3},
              "random_erasing": {"probability": 0.5}, "mean_value": [100, 110, 120], "scale": 0.02}


def naive_warp(image, top, left, box_h, box_w, angle, mirror, out_h, out_w):
    """Each output pixel's centre mapped into the box, turned about its centre, sampled bilinearly (0 off the record)."""
    channels, height, width = image.shape
    out = np.zeros((channels, out_h, out_w))
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    for i in range(out_h):
        for j in range(out_w):
            u = (j + 0.5) / out_w
            u = 1 - u if mirror else u
            x, y = (u - 0.5) * box_w, ((i + 0.5) / out_h - 0.5) * box_h
            xs = left + box_w / 2 + cos * x - sin * y - 0.5
            ys = top + box_h / 2 + sin * x + cos * y - 0.5
            if not (-0.5 <= xs <= width - 0.5 and -0.5 <= ys <= height - 0.5):
                continue  # off the record: the mean, 0
            xs, ys = min(max(xs, 0), width - 1), min(max(ys, 0), height - 1)  # the edge pixels, extended
            for row in (math.floor(ys), math.floor(ys) + 1):
                for column in (math.floor(xs), math.floor(xs) + 1):
                    if 0 <= row < height and 0 <= column < width:
                        weight = (1 - abs(ys - row)) * (1 - abs(xs - column))
                        out[:, i, j] += weight * image[:, row, column]
    return out


def choices_for(count, **columns):
    choices = np.zeros((count, len(augment.COLUMNS)))
    choices[:, [C["brightness"], C["contrast"], C["saturation"]]] = 1
    for name, values in columns.items():
        choices[:, C[name]] = values
    return choices


def test_warping_matches_the_naive_loop_and_is_exact_for_whole_boxes_and_right_angles():
    records = images(6, (3, 7, 6), seed=2).astype(np.float64)
    choices = choices_for(6, top=[0, 1, 0.5, 2, 0, 3], left=[0, 0.25, 1, 0, 2, 1], box_height=[7, 4, 5.5, 3, 6, 2],
                          box_width=[6, 5, 3, 4, 2, 2], angle=[0, 12, -30, 90, 180, 45], mirror=[0, 1, 0, 1, 0, 1])
    out = np.empty((6, 3, 4, 5))
    augment.warp(records, choices, out)
    for record, choice, got in zip(records, choices, out):
        expected = naive_warp(record, *choice[[C["top"], C["left"], C["box_height"], C["box_width"], C["angle"],
                                              C["mirror"]]], 4, 5)
        np.testing.assert_allclose(got, expected, atol=1e-12)
    square = records[:, :, :6, :]
    whole = np.empty((3, 3, 6, 6))
    augment.warp(square[:3], choices_for(3, box_height=6, box_width=6, angle=[0, 180, 90], mirror=[1, 0, 0]), whole)
    np.testing.assert_allclose(whole[0], square[0][..., ::-1], atol=1e-9)
    np.testing.assert_allclose(whole[1], square[1][:, ::-1, ::-1], atol=1e-9)
    np.testing.assert_allclose(whole[2], np.rot90(square[2], k=1, axes=(1, 2)), atol=1e-9)
    constant = np.full((1, 3, 6, 6), 100.0)  # a small box at a corner, enlarged: the edge stays the record's value
    corner = np.empty((1, 3, 8, 8))
    augment.warp(constant, choices_for(1, box_height=2, box_width=2), corner)
    np.testing.assert_allclose(corner, 100.0)


def test_colour_jitter_matches_the_naive_formulas():
    records = images(4, (3, 3, 2), seed=1).astype(np.float64)
    choices = choices_for(4, brightness=[1, 1.3, 0.7, 1], contrast=[1, 0.8, 1.2, 1.1], saturation=[1, 1.4, 0.6, 0])
    jittered = records.copy()
    augment.jitter(jittered, choices, LUMA)
    for record, choice, got in zip(records, choices, jittered):
        x = np.clip(record * choice[C["brightness"]], 0, 255)
        grey = np.tensordot(LUMA, x, axes=1).mean()
        x = np.clip((x - grey) * choice[C["contrast"]] + grey, 0, 255)
        grey = np.tensordot(LUMA, x, axes=1)
        x = np.clip((x - grey) * choice[C["saturation"]] + grey, 0, 255)
        np.testing.assert_allclose(got, x, atol=1e-9)
    np.testing.assert_allclose(jittered[3], np.broadcast_to(jittered[3][:1], (3, 3, 2)), atol=1e-9)  # no colour
    assert np.array_equal(jittered[0], records[0])


def test_draws_stay_in_their_ranges_and_erasing_blanks_only_its_box():
    params = TransformParams(crop_size=4, random_resized_crop=RandomResizedCropParams(scale=[0.2, 0.9]),
                             rotation=10, color_jitter=ColorJitterParams(brightness=0.25),
                             random_erasing=RandomErasingParams(probability=0.3, scale=[0.1, 0.4], value=-7))
    transform = Transformer(params, "TRAIN", (3, 12, 10))
    choices = transform.draw(np.random.default_rng(0), 2000)
    area = choices[:, C["box_height"]] * choices[:, C["box_width"]] / 120
    assert area.min() >= 0.15 and area.max() <= 0.95  # the scale range, give or take the rounding
    assert (choices[:, C["top"]] + choices[:, C["box_height"]] <= 12).all()
    assert (choices[:, C["left"]] + choices[:, C["box_width"]] <= 10).all() and choices[:, :2].min() >= 0
    assert np.abs(choices[:, C["angle"]]).max() <= 10 and choices[:, C["angle"]].std() > 4
    assert choices[:, C["brightness"]].min() >= 0.75 and choices[:, C["brightness"]].max() <= 1.25
    assert (choices[:, C["contrast"]] == 1).all()
    assert 0.25 < choices[:, C["erase"]].mean() < 0.35

    out = np.ones((len(choices), 3, 4, 4))
    augment.erase(out, choices, -7.0)
    for row, choice in enumerate(choices[:50]):
        blank = np.zeros((4, 4), dtype=bool)
        if choice[C["erase"]]:
            top, left, h, w = (int(choice[C[n]]) for n in ("erase_top", "erase_left", "erase_height", "erase_width"))
            assert top + h <= 4 and left + w <= 4
            blank[top:top + h, left:left + w] = True
        assert (out[row][:, blank] == -7).all() and (out[row][:, ~blank] == 1).all()


def test_the_test_phase_only_takes_the_centred_crop():
    params = TransformParams(**{k: v for k, v in EVERYTHING.items() if k in ("crop_size", "rotation")},
                             random_resized_crop=RandomResizedCropParams(), color_jitter=ColorJitterParams(0.5),
                             random_erasing=RandomErasingParams(probability=1))
    transform = Transformer(params, "TEST", (3, 7, 7))
    records = images(3, (3, 7, 7), seed=4).astype(np.float64)
    out = np.empty((3, 3, 5, 5))
    transform.apply(records, transform.draw(np.random.default_rng(1), 3), out)
    np.testing.assert_array_equal(out, records[:, :, 1:6, 1:6])


@pytest.fixture
def dataset(tmp_path):
    pictures = images(10, (3, 8, 8))
    write_dataset(tmp_path / "ds", "lmdb", pictures, [i % 2 for i in range(10)])
    return tmp_path / "ds"


def test_augmented_batches_repeat_under_the_seed_and_continue_after_a_restore(dataset):
    straight = batches(data_net(dataset, transform=EVERYTHING, prefetch=2), 6)
    again = batches(data_net(dataset, transform=EVERYTHING, prefetch=0), 6)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(straight, again))
    assert not np.array_equal(straight[0][0], straight[5][0][:4])  # records 0-3 come back (batch 5), drawn anew
    first = data_net(dataset, transform=EVERYTHING)
    batches(first, 2)
    resumed = data_net(dataset, transform=EVERYTHING)
    resumed.restore_runtime_state(first.runtime_state())
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(straight[2:], batches(resumed, 4)))
    assert straight[0][0].shape == (4, 3, 5, 5) and np.isfinite(straight[0][0]).all()


def test_bad_augmentation_parameters_are_named(tmp_path):
    net = tmp_path / "net.yaml"
    for params, message in [
        ("random_resized_crop: {}", "transform_param.random_resized_crop: needs crop_size, the size it resizes to"),
        ("crop_size: 4, random_resized_crop: {scale: [0.5, 2]}",
         "transform_param.random_resized_crop.scale: give [min, max] with 1e-06 <= min <= max and at most 1.0, "
         "got [0.5, 2.0]"),
        ("rotation: 270", "transform_param.rotation: must be between 0 and 180 degrees, got 270.0"),
        ("color_jitter: {contrast: 1.5}", "transform_param.color_jitter.contrast: must be between 0 and 1, got 1.5"),
        ("random_erasing: {probability: -1}",
         "transform_param.random_erasing.probability: must be between 0 and 1, got -1.0"),
    ]:
        net.write_text(f"layers:\n  - {{name: data, type: Data, top: [data, label], data_param: {{source: {dataset_of(tmp_path)}, "
                       f"batch_size: 2}},\n     transform_param: {{{params}}}}}\n")
        assert fails("check", net) == f"error: {net}:3: layer 'data': {message}", params


def dataset_of(tmp_path):
    path = tmp_path / "ds"
    if not path.exists():
        write_dataset(path, "lmdb", images(4, (3, 8, 8)), [0, 1, 0, 1])
    return path


def test_data_inspect_draws_augmented_samples(dataset, tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(f"layers:\n  - {{name: data, type: Data, top: [data, label], data_param: {{source: {dataset}, "
                   "batch_size: 2}, transform_param: {crop_size: 6, rotation: 10, color_jitter: {brightness: 0.5}}}\n")
    out = tmp_path / "augmented.png"
    printed = ok("data", "inspect", dataset, "--augmented", net, "-o", out, "--grid", "3")
    assert printed.splitlines()[-1] == f"wrote 3 samples, each as stored and in 3 augmented draws, to {out}"
    assert out.stat().st_size > 1000
    assert "give it a file with -o" in run("data", "inspect", dataset, "--augmented", net).stderr


def test_the_shipped_example_net_sets_every_augmentation():
    from test_cli import ROOT

    from netspec.tools.dataset_info import train_transform

    params = train_transform(str(ROOT / "configs" / "augmentation" / "augmented_net.yaml"))
    assert params.random_resized_crop.scale == [0.25, 1.0] and params.rotation == 15
    assert params.color_jitter.saturation == 0.4 and params.random_erasing.probability == 0.5


def test_data_inspect_refuses_records_of_another_size_in_one_line(tmp_path):
    from PIL import Image

    for name, size in (("a", 8), ("b", 10)):
        (tmp_path / "images" / name).mkdir(parents=True)
        Image.fromarray(np.zeros((size, size, 3), dtype=np.uint8)).save(tmp_path / "images" / name / "0.png")
    ok("convert", "imageset", tmp_path / "images", tmp_path / "mixed", "--allow-mixed-sizes")
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: data, type: Data, top: data, data_param: {source: mixed, batch_size: 1}, "
                   "transform_param: {crop_size: 6, rotation: 10}}\n")
    result = run("data", "inspect", tmp_path / "mixed", "--augmented", net, "-o", tmp_path / "x.png")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "has shape [3, 10, 10], but the first record's is [3, 8, 8]" in result.stderr
