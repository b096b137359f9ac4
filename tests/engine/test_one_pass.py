"""Scoring every test record exactly once: `netspec test` by default, and `test_iter: epoch` (or none) in training."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_cli import ok, run
from test_train_cli import events

from netspec.engine.net import load_net
from netspec.engine.one_pass import OnePass, rank_share
from netspec.inspect.confusion import Confusion

ROOT = Path(__file__).parent.parent.parent
TEST_BATCH = "batch_size: 120"  # the quickstart's test batch: 3 of them hold the 360 test digits
RECORDS = 360


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The quickstart's net and solver with the digits converted, and weights trained for 30 iterations."""
    folder = tmp_path_factory.mktemp("digits")
    for name in ("solver.yaml", "digits_net.yaml"):
        shutil.copy(ROOT / "configs" / "digits" / name, folder / name)
    ok("convert", "digits", folder / "data")
    ok("train", folder / "solver.yaml", "--max-iter", "30", "--out", folder / "run")
    return folder


def net_file(digits: Path, batch: int, extra: str = "") -> Path:
    """The quickstart's net with test batches of ``batch`` (and ``extra`` layers at its end)."""
    path = digits / f"net_{batch}{'_extra' if extra else ''}.yaml"
    path.write_text((digits / "digits_net.yaml").read_text().replace(TEST_BATCH, f"batch_size: {batch}") + extra)
    return path


def scored(path: Path, weights: Path, report: bool = False, device: str = "cpu"):
    """OnePass's scores of the net at ``path`` on ``device`` (and its confusion matrix with ``report``)."""
    def load(**kwargs):
        net = load_net(str(path), phase="TEST", reuse_memory=not report, device=device, **kwargs)
        net.load_weights(str(weights))
        return net

    net = load()
    one_pass = OnePass(net, lambda rows: load(batch_size=rows))
    confusion = Confusion(net) if report else None
    try:
        return one_pass.score(confusion.add if confusion else None), one_pass, confusion
    finally:
        one_pass.close()
        net.close()


@pytest.mark.parametrize("batch", [7, 100, 359, 500])
def test_a_pass_scores_what_one_batch_of_the_whole_set_scores(digits, batch):
    weights = digits / "run" / "digits_iter_30.weights.h5"
    whole, _, _ = scored(net_file(digits, RECORDS), weights)
    scores, one_pass, confusion = scored(net_file(digits, batch), weights, report=True)
    assert scores == pytest.approx(whole, rel=1e-5)
    assert one_pass.rows == RECORDS and one_pass.note is None
    assert (one_pass.batches, one_pass.tail_rows) == divmod(RECORDS, batch)
    assert confusion.matrix.sum(axis=1).tolist() == [36] * 10  # every record counted once
    assert np.trace(confusion.matrix) / RECORDS == pytest.approx(scores["accuracy"])


@pytest.mark.gpu
def test_a_pass_on_the_gpu_scores_what_one_on_the_cpu_scores(digits):
    weights = digits / "run" / "digits_iter_30.weights.h5"
    on_cpu, _, _ = scored(net_file(digits, 100), weights)
    on_gpu, one_pass, confusion = scored(net_file(digits, 100), weights, report=True, device="gpu")
    assert on_gpu == pytest.approx(on_cpu, rel=1e-5) and one_pass.tail_rows == 60
    assert confusion.matrix.sum() == RECORDS


def test_each_pass_starts_at_the_first_record(digits):
    weights = digits / "run" / "digits_iter_30.weights.h5"
    net = load_net(str(net_file(digits, 100)), phase="TEST")
    net.load_weights(str(weights))
    one_pass = OnePass(net, lambda rows: load_net(str(net_file(digits, 100)), phase="TEST", batch_size=rows))
    try:
        first = one_pass.score()
        net.score(2)  # (moves the data layer on, as integer test_iter passes do)
        assert one_pass.score() == first
    finally:
        one_pass.close()
        net.close()


def test_a_net_whose_shapes_fix_the_batch_wraps_its_last_batch_and_says_so(digits):
    fixed = ("  - {name: flat, type: Reshape, bottom: ip2, top: flat, reshape_param: {shape: {dim: [100, 10]}},\n"
             "     include: {phase: TEST}}\n")
    scores, one_pass, _ = scored(net_file(digits, 100, fixed), digits / "run" / "digits_iter_30.weights.h5")
    assert (one_pass.batches, one_pass.tail_rows, one_pass.rows) == (4, 0, 400)
    assert one_pass.note.startswith("the last batch wraps around, so 40 records count twice: the net cannot be "
                                    "built for a batch of 60 (")
    assert "flat" in one_pass.note and 0 <= scores["accuracy"] <= 1


def test_netspec_test_scores_one_pass_by_default(digits):
    weights = digits / "run" / "digits_iter_30.weights.h5"
    out = ok("test", net_file(digits, 100), "--weights", weights, "--json")
    assert "360 records, each once: 3 batches of 100 and one of 60" in out
    whole = ok("test", net_file(digits, RECORDS), "--weights", weights, "--json")
    assert "360 records, each once: 1 batch of 360" in whole
    figures = [json.loads(text.splitlines()[-1]) for text in (out, whole)]
    assert figures[0]["records"] == figures[1]["records"] == RECORDS
    assert figures[0]["outputs"] == pytest.approx(figures[1]["outputs"], rel=1e-5)
    capped = ok("test", net_file(digits, 100), "--weights", weights, "-n", "2")
    assert "2 batches of 100, 200 of the dataset's 360 records" in capped and "160 never" in capped


@pytest.mark.parametrize("test_iter", ["", "test_iter: epoch\n"])
def test_training_without_test_iter_tests_one_pass(digits, tmp_path, test_iter):
    solver = re.sub(r"^test_iter:.*\n", test_iter, (digits / "solver.yaml").read_text(), flags=re.MULTILINE)
    assert ("test_iter" in solver) == bool(test_iter)
    (tmp_path / "solver.yaml").write_text(solver.replace("digits_net.yaml", str(net_file(digits, 100))))
    result = run("train", tmp_path / "solver.yaml", "--max-iter", "30", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stdout  # (no coverage note: every record once)
    logged = events(tmp_path / "run", "TEST")
    assert [event["iter"] for event in logged] == [0, 30]
    final, _, _ = scored(net_file(digits, RECORDS), tmp_path / "run" / "digits_iter_30.weights.h5")
    assert logged[-1]["accuracy"] == pytest.approx(final["accuracy"], rel=1e-5)
    assert logged[-1]["loss"] == pytest.approx(final["loss"], rel=1e-4)


def test_test_iter_takes_epoch_or_batches_per_test_net_and_names_a_typo(digits, tmp_path):
    net = net_file(digits, 100)
    (tmp_path / "solver.yaml").write_text(f"train_net: {net}\ntest_net: [{net}, {net}]\ntest_iter: [epoch, 2]\n"
                                          "test_interval: 10\nbase_lr: 0.01\nmax_iter: 10\n")
    result = run("train", tmp_path / "solver.yaml", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "note: test net 1: 2 batch(es) of 100 score 200 of the 360 records: 160 never (test_iter 2)" in result.stdout
    assert "note: test net 0" not in result.stdout
    (tmp_path / "typo.yaml").write_text(f"net: {net}\ntest_iter: eopch\ntest_interval: 10\nbase_lr: 0.01\n"
                                        "max_iter: 10\n")
    typo = run("train", tmp_path / "typo.yaml")
    assert typo.returncode == 1
    assert typo.stderr.strip() == (f"error: {tmp_path}/typo.yaml:2: test_iter: 'eopch' is not one of epoch; did you "
                                   "mean 'epoch'?")
    (tmp_path / "untested.yaml").write_text(f"train_net: {net}\ntest_interval: 10\nbase_lr: 0.01\nmax_iter: 10\n")
    untested = run("train", tmp_path / "untested.yaml")
    assert untested.returncode == 1
    assert untested.stderr.strip() == (f"error: {tmp_path}/untested.yaml:2: test_interval: needs a net to test: "
                                       "give test_net")


def test_a_rank_scores_its_share():
    assert [rank_share(64, rank, 2) for rank in range(2)] == [32, 32]
    assert [rank_share(7, rank, 3) for rank in range(3)] == [3, 2, 2]


IGNORING = """name: ignoring
layers:
  - {{name: data, type: HDF5Data, top: [data, label], hdf5_data_param: {{source: {source}, batch_size: {batch}}}}}
  - {{name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {{num_output: 3, weight_filler: {{type: gaussian, std: 1}}}}}}
  - {{name: accuracy, type: Accuracy, bottom: [ip, label], top: accuracy, accuracy_param: {{ignore_label: 2}}}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss, loss_param: {{ignore_label: 2}}}}
"""


def test_outputs_averaged_over_their_valid_labels_weigh_by_them(tmp_path):
    """Accuracy and a loss ignoring a label are means over the labels they count: a batch holding mostly ignored
    labels weighs that little, so the pass gives the whole set's figures."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 23).astype(np.float32)
    labels[:6] = 2  # (the first batch of 5 ignores every label)
    with h5py.File(tmp_path / "rows.h5", "w") as handle:
        handle["data"] = rng.normal(size=(23, 4)).astype(np.float32)
        handle["label"] = labels
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'rows.h5'}\n")
    for batch in (23, 5):
        (tmp_path / f"net{batch}.yaml").write_text(IGNORING.format(source=tmp_path / "list.txt", batch=batch))
    whole = load_net(str(tmp_path / "net23.yaml"), phase="TEST", seed=7)
    whole.save_weights(tmp_path / "w.h5")
    expected = OnePass(whole, None).score()
    valid = labels != 2
    predicted = np.argmax(whole.blobs["ip"].data, axis=1)
    assert expected["accuracy"] == pytest.approx((predicted == labels)[valid].mean())
    scores, one_pass, _ = scored(tmp_path / "net5.yaml", tmp_path / "w.h5")
    assert one_pass.tail_rows == 3 and scores == pytest.approx(expected, rel=1e-6)
    assert one_pass.weights == {"accuracy": valid.sum(), "loss": valid.sum()}
    whole.close()


def test_a_net_that_writes_a_file_wraps_its_last_batch_instead_of_writing_it_twice(digits, tmp_path):
    writes = "  - {name: out, type: HDF5Output, bottom: [ip2, label], hdf5_output_param: {file_name: out.h5}}\n"
    result = run("test", net_file(digits, 100, writes), "--weights", digits / "run" / "digits_iter_30.weights.h5",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("note: the last batch wraps around, so 40 records count twice: layer 'out' writes a file that a copy of "
            "the net would write again") in result.stdout
    with h5py.File(tmp_path / "out.h5") as written:
        assert (written["data"].shape, written["label"].shape) == ((400, 10), (400,))  # (4 batches of 100)


def test_test_states_without_test_iter_make_as_many_one_pass_test_nets(digits, tmp_path):
    (tmp_path / "solver.yaml").write_text(f"net: {net_file(digits, 100)}\ntest_interval: 10\nbase_lr: 0.01\n"
                                          "max_iter: 10\ntest_state: [{stage: [a]}, {stage: [b]}]\n")
    result = run("train", tmp_path / "solver.yaml", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert [event.get("test_net", 0) for event in events(tmp_path / "run", "TEST")] == [0, 1, 0, 1]
