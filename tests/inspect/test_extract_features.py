"""`netspec extract-features`: every record's row of the chosen blobs, in the data layer's order, with the labels;
--iterations; and the one-line errors."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_cli import run

from netspec import load_net

ROOT = Path(__file__).parent.parent.parent
DIGITS = ROOT / "configs" / "digits"
TEST_RECORDS = 360  # the digits' test set
BATCH = 100  # the test batch here: 360 records are 3 batches and 60 rows of a fourth


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The digits converted, the quickstart's net with a test batch of 100 (``net.yaml``) and as shipped (120,
    ``net120.yaml``), and weights of random values (no filler's) in ``w.weights.h5``."""
    folder = tmp_path_factory.mktemp("digits")
    result = run("convert", "digits", folder / "data")
    assert result.returncode == 0, result.stderr
    shutil.copy(DIGITS / "digits_net.yaml", folder / "net120.yaml")
    text = (DIGITS / "digits_net.yaml").read_text()
    assert "source: data/test.txt, batch_size: 120}" in text
    (folder / "net.yaml").write_text(text.replace("source: data/test.txt, batch_size: 120}",
                                                  f"source: data/test.txt, batch_size: {BATCH}}}"))
    net = load_net(str(folder / "net.yaml"), phase="TEST", seed=3)
    rng = np.random.default_rng(5)
    for blobs in net.params.values():
        for blob in blobs:
            blob.data[...] = rng.normal(0, 0.3, blob.shape)
    net.save_weights(folder / "w.weights.h5")
    net.close()
    return folder


def reference(folder: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Each blob's rows for the 360 test records, computed apart: the net as shipped (3 batches of 120, no
    wrapping, no buffer sharing) with the weights loaded, run forward in this process."""
    net = load_net(str(folder / "net120.yaml"), phase="TEST")
    net.load_weights(folder / "w.weights.h5")
    rows = {name: [] for name in names}
    for _ in range(TEST_RECORDS // 120):
        net.forward()
        for name in names:
            rows[name].append(np.array(net.blobs[name].data))
    net.close()
    return {name: np.concatenate(parts) for name, parts in rows.items()}


def stored(path: Path, name: str) -> np.ndarray:
    """Dataset ``name`` of the HDF5 file ``path``."""
    with h5py.File(path, "r") as handle:
        return handle[name][()]


def one_error(*args) -> str:
    """Run a command that must fail with one line on stderr (exit status 1); that line."""
    result = run(*args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, (result.stdout, result.stderr)
    return result.stderr.strip()


@contextlib.contextmanager
def file_size_limit(limit: int):
    """No file grows past ``limit`` bytes within the block (EFBIG: a full disk's stand-in, for the commands run
    inside too)."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)


def test_one_pass_writes_each_record_once_in_order_with_its_label(digits, tmp_path):
    out = tmp_path / "features.h5"
    result = run("extract-features", digits / "net.yaml", digits / "w.weights.h5", "conv1,ip2", "-o", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"wrote 360 records of conv1 (360x32x8x8), ip2 (360x10) and label (360) to {out}\n")
    with h5py.File(out, "r") as handle:
        assert list(handle) == ["conv1", "ip2", "label"]
        assert all(handle[name].dtype == np.float32 for name in handle)
    expected = reference(digits, ["conv1", "ip2"])
    for name in ("conv1", "ip2"):
        scale = np.abs(expected[name]).max()  # (float32 sums in another order, over other batches: close, not equal)
        np.testing.assert_allclose(stored(out, name), expected[name], rtol=1e-5, atol=1e-5 * scale)
    assert np.abs(expected["ip2"]).max() > 1  # (the random weights, not a filler's: those were loaded)
    np.testing.assert_array_equal(stored(out, "label"), stored(digits / "data" / "test.h5", "label"))
    assert sorted(os.listdir(tmp_path)) == ["features.h5"]  # (no temporary file left)


def test_iterations_keep_every_row_of_each_batch(digits, tmp_path):
    out = tmp_path / "rows.h5"
    result = run("extract-features", digits / "net.yaml", digits / "w.weights.h5", "data,label", "-o", out,
                 "--iterations", "5")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote 500 rows (5 batches of 100) of data (500x1x8x8) and label (500) to {out}\n"
    with h5py.File(out, "r") as handle:
        assert list(handle) == ["data", "label"]  # (label asked for: not written twice)
    order = np.arange(500) % TEST_RECORDS  # the data layer wraps around after the 360th record
    np.testing.assert_array_equal(stored(out, "data"), stored(digits / "data" / "test.h5", "data")[order])
    np.testing.assert_array_equal(stored(out, "label"), stored(digits / "data" / "test.h5", "label")[order])


def test_bad_blobs_are_one_line_errors_and_write_nothing(digits, tmp_path):
    args = (digits / "net.yaml", digits / "w.weights.h5")
    out = tmp_path / "f.h5"
    assert one_error("extract-features", *args, "conv1,ip3", "-o", out) == (
        "error: net 'DigitsNet' (TEST) has no blob 'ip3'; did you mean 'ip2'? (its blobs with a row per record: "
        "data, label, conv1, pool1, conv2, pool2, ip1, ip2)")
    assert one_error("extract-features", *args, "loss", "-o", out) == (
        "error: net 'DigitsNet' (TEST): blob 'loss' holds one value a batch (a scalar), not a row per record")
    assert one_error("extract-features", *args, "ip2,,conv1", "-o", out) == (
        "error: 'ip2,,conv1': expected blob names separated by commas, e.g. conv1,ip2")
    assert os.listdir(tmp_path) == []


def test_a_blob_without_the_batch_first_is_refused(tmp_path):
    (tmp_path / "net.yaml").write_text(
        "name: Dummy\nlayers:\n"
        "  - {name: data, type: DummyData, top: data, dummy_data_param: {shape: [{dim: [4, 6]}]}}\n"
        "  - {name: flip, type: Permute, bottom: data, top: flipped, permute_param: {order: [1, 0]}}\n")
    net = load_net(str(tmp_path / "net.yaml"), phase="TEST")
    net.save_weights(tmp_path / "w.weights.h5")
    args = (tmp_path / "net.yaml", tmp_path / "w.weights.h5")
    assert one_error("extract-features", *args, "flipped", "-o", tmp_path / "f.h5") == (
        "error: net 'Dummy' (TEST): blob 'flipped' has shape 6x4, whose first axis is not the batch of 4, so it "
        "holds no row per record")
    assert one_error("extract-features", *args, "data", "-o", tmp_path / "f.h5") == (
        "error: net 'Dummy' (TEST): its data layer cannot tell how many records it reads; give the number of "
        "batches (--iterations N)")
    result = run("extract-features", *args, "data", "-o", tmp_path / "f.h5", "-n", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote 8 rows (2 batches of 4) of data (8x6) to {tmp_path / 'f.h5'}\n"  # (no label)


def test_an_existing_output_needs_overwrite_and_a_link_is_replaced_not_followed(digits, tmp_path):
    args = (digits / "net.yaml", digits / "w.weights.h5", "ip2")
    out, target = tmp_path / "f.h5", tmp_path / "target.h5"
    out.write_bytes(b"mine")
    assert one_error("extract-features", *args, "-o", out) == (
        f"error: {out}: already exists; choose another output or pass --overwrite")
    assert out.read_bytes() == b"mine"
    assert run("extract-features", *args, "-o", out, "--overwrite").returncode == 0
    assert stored(out, "ip2").shape == (TEST_RECORDS, 10)
    out.unlink()
    target.write_bytes(b"theirs")
    out.symlink_to(target)
    assert one_error("extract-features", *args, "-o", out).startswith(f"error: {out}: already exists")
    assert run("extract-features", *args, "-o", out, "--overwrite").returncode == 0
    assert not out.is_symlink() and stored(out, "ip2").shape == (TEST_RECORDS, 10)
    assert target.read_bytes() == b"theirs"
    out.unlink()
    out.symlink_to(tmp_path / "nowhere.h5")  # a link to nothing is something too
    assert one_error("extract-features", *args, "-o", out).startswith(f"error: {out}: already exists")
    assert sorted(os.listdir(tmp_path)) == ["f.h5", "target.h5"]


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(digits, tmp_path):
    out = tmp_path / "big.h5"
    with file_size_limit(100_000):  # conv1's rows alone are 2.9 MB
        line = one_error("extract-features", digits / "net.yaml", digits / "w.weights.h5", "conv1", "-o", out)
    assert line.startswith(f"error: {out}: cannot write: "), line
    assert os.listdir(tmp_path) == []
