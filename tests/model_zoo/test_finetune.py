"""netspec zoo finetune: a published model's training configs pointed at a dataset folder, then trained."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from test_cli import fails, ok, run
from test_zoo import ROOT, weights, zoo_a  # noqa: F401 - fixtures: a zoo of models published without configs

import netspec
from netspec.data.dataset import DatasetWriter, read_manifest
from netspec.errors import DataError
from netspec.model_zoo.finetune import prepare_finetune
from netspec.model_zoo.publish import PublishRequest, publish
from netspec.model_zoo.zoo import Zoo, ZooError
from netspec.tools.digits import convert_digits, load_digits
from netspec.training.run import TrainOptions, train


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    """A zoo holding digits@1: 30 iterations of configs/digits, published from the run (configs included)."""
    root = tmp_path_factory.mktemp("digits")
    shutil.copytree(ROOT / "configs" / "digits", root / "digits", ignore=shutil.ignore_patterns("data", "runs"))
    convert_digits(str(root / "digits" / "data"))
    train(str(root / "digits" / "solver.yaml"), TrainOptions(max_iter=30, run_dir=str(root / "run")), say=print)
    (root / "labels.txt").write_text("".join(f"{digit}\n" for digit in range(10)))
    publish(PublishRequest(name="digits", run_dir=str(root / "run"), labels_file=str(root / "labels.txt"),
                           scale=1 / 255), Zoo(str(root / "zoo")))
    return root / "zoo"


def write_dataset(path: Path, images: np.ndarray, labels: np.ndarray, names: list[str]) -> Path:
    """An HDF5 dataset folder of uint8 records."""
    writer = DatasetWriter(str(path), backend="hdf5")
    for image, label in zip(images, labels):
        writer.add(image, int(label))
    writer.finish(names, "", {})
    return path


def digits(classes: int, split: bool = True, path: Path | None = None) -> Path:
    """The 8x8 digits 0 .. classes-1 as a dataset: train/ and val/ (split) or one folder."""
    images, labels = load_digits()
    chosen = labels < classes
    pixels, labels = np.round(images[chosen] * 255).astype(np.uint8), labels[chosen]
    names = [f"digit{d}" for d in range(classes)]
    if not split:
        return write_dataset(path, pixels, labels, names)
    cut = len(labels) * 3 // 4
    write_dataset(path / "train", pixels[:cut], labels[:cut], names)
    write_dataset(path / "val", pixels[cut:], labels[cut:], names)
    return path


def count_of(dataset: Path) -> int:
    """The records of a dataset folder, as its manifest counts them."""
    return read_manifest(str(dataset))["count"]


def one_pass_note(dataset: Path) -> str:
    """The note on a test pass over ``dataset``: every record once (test_iter: epoch)."""
    return f"test_iter epoch: a test pass scores each of the {count_of(dataset)} records of {dataset} once"


def test_a_model_fine_tunes_on_three_classes_from_its_weights(zoo, tmp_path):
    data = digits(3, path=tmp_path / "three")
    out = tmp_path / "out"
    lines = ok("zoo", "finetune", "digits", data, "--out", out, "--zoo", zoo).splitlines()
    assert lines[:5] == [
        f"note: the TRAIN phase reads {data}/train, the TEST phase {data}/val (3 classes; Data layers, scale "
        "0.00392157 as the card says)",
        "note: ip2 re-made for 3 classes as ip2_finetune (the model's has 10; its weights start from fillers)",
        f"note: {one_pass_note(data / 'val')}",
        "note: the solver keeps the model's schedule (SGD, base_lr 0.01, max_iter 1000); netspec train --base-lr and "
        "--max-iter change it",
        f"prepared {out}/finetune/solver.yaml; train with:"]
    model = zoo / "models" / "digits" / "1"
    command = shlex.split(lines[5])
    assert command == ["netspec", "train", f"{out}/finetune/solver.yaml", "--weights", f"{model}/weights.h5",
                       "--out", str(out)]
    solver = yaml.safe_load((out / "finetune" / "solver.yaml").read_text())
    assert solver["net"] == f"{out}/finetune/train_net.yaml" and solver["snapshot_prefix"] == f"{out}/digits"
    layers = yaml.safe_load((out / "finetune" / "train_net.yaml").read_text())["layers"]
    assert layers[0]["data_param"] == {"source": f"{data}/train", "batch_size": 64, "backend": "HDF5",
                                       "shuffle_buffer": 402}
    assert layers[1]["data_param"] == {"source": f"{data}/val", "batch_size": min(120, count_of(data / "val")),
                                       "backend": "HDF5"}
    assert solver["test_iter"] == ["epoch"]

    trained = run(*command[1:], "--max-iter", "20")
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.startswith(f"weights {model}/weights.h5: copied 3 layer(s); not in the file (keep their "
                                     "fillers): ip2_finetune; in the file but not the net: ip2\n")
    accuracy = float(trained.stdout.split("test: accuracy = ")[-1].split(",")[0])
    assert accuracy > 0.8, trained.stdout
    with h5py.File(model / "weights.h5") as before, h5py.File(out / "digits_iter_20.weights.h5") as after:
        assert after["ip2_finetune"]["0"].shape == (3, 128) and "ip2" not in after
        for layer in ("conv1", "conv2", "ip1"):  # started from the model's weights, not from fillers
            start, end = before[layer]["0"][...], after[layer]["0"][...]
            assert np.linalg.norm(end - start) < 0.25 * np.linalg.norm(start), layer
    ok("zoo", "publish", "--name", "three", "--run", out, "--zoo", zoo)
    assert Zoo(str(zoo)).card("three").input.label_names == ["digit0", "digit1", "digit2"]
    assert fails("zoo", "finetune", "digits", data, "--out", out, "--zoo", zoo) == (
        f"error: {out} already holds a run (metrics.jsonl, 2 snapshot file(s)); continue it with --resume "
        f"{out}/digits_iter_20.solverstate.h5, train into another folder with --out DIR, or move it away")


def test_a_dataset_of_as_many_classes_keeps_the_classifier(zoo, tmp_path):
    data = digits(10, split=False, path=tmp_path / "ten")
    prepared = prepare_finetune(str(zoo / "models" / "digits" / "1"), str(data), str(tmp_path / "out"))
    assert prepared.notes[0] == f"both phases read {data} (10 classes; Data layers, scale 0.00392157 as the card says)"
    assert prepared.notes[1] == one_pass_note(data)
    assert len(prepared.notes) == 3 and prepared.weights == f"{zoo}/models/digits/1/weights.h5"
    net = netspec.load_net(f"{tmp_path}/out/finetune/train_net.yaml", phase="TRAIN")
    assert net.blobs["ip2"].shape == (64, 10) and "ip2" in net.layer_by_name
    net.close()


def test_models_and_datasets_that_cannot_fine_tune_are_refused(zoo, zoo_a, tmp_path):  # noqa: F811 - fixtures
    three = digits(3, path=tmp_path / "three")
    with pytest.raises(ZooError) as error:
        prepare_finetune("digits@1", str(three), str(tmp_path / "out"), zoo=str(zoo_a))
    assert str(error.value) == (
        f"{zoo_a}/models/digits/1: digits@1 was published without its training configs (train net and solver): "
        "publish it from a run (netspec zoo publish --run)")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as error:
        prepare_finetune("digits", str(tmp_path / "empty"), str(tmp_path / "out"), zoo=str(zoo))
    assert str(error.value) == (f"{tmp_path}/empty: not a dataset (no manifest.json), nor a folder of train/ and val/ "
                                "datasets; make one with netspec convert imageset")
    rng = np.random.default_rng(0)
    for shape, remedy in [((1, 10, 10), "--resize 8x8"), ((3, 8, 8), "--resize 8x8 --gray")]:
        data = write_dataset(tmp_path / f"{shape[0]}x{shape[1]}", rng.integers(0, 256, (6, *shape), dtype=np.uint8),
                             np.arange(6) % 3, [])
        with pytest.raises(DataError) as error:
            prepare_finetune("digits", str(data), str(tmp_path / "out"), zoo=str(zoo))
        assert str(error.value) == (
            f"{data}: records of shape {list(shape)} reach the net as {list(shape)} through layer 'digits', but "
            f"digits@1 takes [1, 8, 8] (C, H, W); convert the images with netspec convert imageset {remedy}")
    assert not (tmp_path / "out").exists()  # nothing is written before every check passed


TINY_DEPLOY = """
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 1, 6, 6]}}}
  - {name: a, type: InnerProduct, bottom: data, top: a, inner_product_param: {num_output: 10}}
  - {name: b, type: InnerProduct, bottom: data, top: b, inner_product_param: {num_output: 10}}
  - {name: scores, type: Eltwise, bottom: [a, b], top: scores}
  - {name: prob, type: Softmax, bottom: scores, top: prob}
"""
TINY_TRAIN = """
layers:
  - {name: data, type: Data, top: [data, label], data_param: {source: data, batch_size: 4},
     transform_param: {crop_size: 6, mirror: true}}
  - {name: a, type: InnerProduct, bottom: data, top: a, inner_product_param: {num_output: 10}}
  - {name: b, type: InnerProduct, bottom: data, top: b, inner_product_param: {num_output: 10}}
  - {name: scores, type: Eltwise, bottom: [a, b], top: scores}
  - {name: loss, type: SoftmaxWithLoss, bottom: [scores, label], top: loss}
"""


def test_crops_are_followed_and_scores_of_two_layers_are_refused(tmp_path):
    """A model taking 6x6 crops of its records, its scores the sum of two layers: which one to re-make?"""
    (tmp_path / "deploy.yaml").write_text(TINY_DEPLOY)
    (tmp_path / "train.yaml").write_text(TINY_TRAIN)
    (tmp_path / "solver.yaml").write_text("net: train.yaml\nbase_lr: 0.1\nmax_iter: 5\n")
    netspec.load_net(str(tmp_path / "deploy.yaml")).save_weights(tmp_path / "tiny.h5")
    (tmp_path / "labels.txt").write_text("".join(f"{digit}\n" for digit in range(10)))
    zoo = str(tmp_path / "zoo")
    publish(PublishRequest(name="tiny", net=str(tmp_path / "deploy.yaml"), weights=str(tmp_path / "tiny.h5"),
                           labels_file=str(tmp_path / "labels.txt"), train_net=str(tmp_path / "train.yaml"),
                           solver=str(tmp_path / "solver.yaml")), Zoo(zoo))
    publish(PublishRequest(name="unnamed", net=str(tmp_path / "deploy.yaml"), weights=str(tmp_path / "tiny.h5"),
                           train_net=str(tmp_path / "train.yaml"), solver=str(tmp_path / "solver.yaml")), Zoo(zoo))
    ten = digits(10, split=False, path=tmp_path / "ten")  # 8x8 records, cropped to 6x6: they fit
    assert len(prepare_finetune("tiny", str(ten), str(tmp_path / "out"), zoo=zoo).notes) == 2
    # no label names on the card: its deploy net's 10 scores say the classifier stays, so nothing is traced
    assert len(prepare_finetune("unnamed", str(ten), str(tmp_path / "out2"), zoo=zoo).notes) == 2
    small = write_dataset(tmp_path / "small", np.zeros((4, 1, 5, 5), np.uint8), np.arange(4) % 3, [])
    with pytest.raises(DataError) as error:
        prepare_finetune("tiny", str(small), str(tmp_path / "out"), zoo=zoo)
    assert str(error.value) == f"{small}: cannot feed layer 'data': 6 is larger than the records (5x5)"
    three = digits(3, split=False, path=tmp_path / "three")
    with pytest.raises(ZooError) as error:
        prepare_finetune("tiny", str(three), str(tmp_path / "out"), zoo=zoo)
    assert str(error.value) == (
        f"{zoo}/models/tiny/1/train_net.yaml: cannot tell which layer makes the class scores of loss 'loss': they "
        "come through layer 'scores' (Eltwise), which has 2 inputs")
