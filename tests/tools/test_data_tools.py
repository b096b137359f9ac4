"""`netspec convert arrays`, `netspec compute-mean` and `netspec data inspect` as a user runs them."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from test_cli import fails, ok
from test_records import images, write_dataset

import netspec


def test_npz_rows_and_labels_become_an_hdf5_source(tmp_path):
    data, labels = np.random.default_rng(0).standard_normal((10, 3)), np.arange(10) % 4
    np.savez(tmp_path / "in.npz", x=data, y=labels)
    out = tmp_path / "out.h5"
    assert ok("convert", "arrays", tmp_path / "in.npz", out, "--data-key", "x", "--label-key", "y",
              "--chunk", "3").strip() == f"wrote {out}: data [10, 3], label [10] (HDF5Data reads it as source)"
    with h5py.File(out) as handle:
        np.testing.assert_array_equal(handle["data"][()], data)
        np.testing.assert_array_equal(handle["label"][()], labels)
    net = netspec.load_net(f"layers:\n  - {{name: d, type: HDF5Data, top: [data, label], "
                           f"hdf5_data_param: {{source: {out}, batch_size: 4, shuffle: true}}}}\n", seed=2)
    net.forward()
    rows = [int(np.flatnonzero((data.astype(np.float32) == row).all(1))[0]) for row in net.blobs["data"].data]
    assert list(net.blobs["label"].data) == [labels[r] for r in rows] and len(set(rows)) == 4


def test_npy_and_csv_inputs(tmp_path):
    np.save(tmp_path / "rows.npy", np.arange(12.0).reshape(6, 2))
    ok("convert", "arrays", tmp_path / "rows.npy", tmp_path / "npy.h5")
    with h5py.File(tmp_path / "npy.h5") as handle:
        assert list(handle) == ["data"] and handle["data"].shape == (6, 2)
    (tmp_path / "table.csv").write_text("a,label,b\n1,0,2\n3,1,4\n5,1,6\n")
    ok("convert", "arrays", tmp_path / "table.csv", tmp_path / "csv.h5", "--chunk", "2")
    with h5py.File(tmp_path / "csv.h5") as handle:
        np.testing.assert_array_equal(handle["data"][()], [[1, 2], [3, 4], [5, 6]])
        np.testing.assert_array_equal(handle["label"][()], [0, 1, 1])


def test_bad_array_inputs_name_the_file_and_line(tmp_path):
    (tmp_path / "bad.csv").write_text("a,label\n1,0\n2,x\n")
    assert fails("convert", "arrays", tmp_path / "bad.csv", tmp_path / "o.h5") == (
        f"error: {tmp_path}/bad.csv:3: column 'label' holds 'x', not a number")
    (tmp_path / "short.csv").write_text("a,b\n1\n")
    assert fails("convert", "arrays", tmp_path / "short.csv", tmp_path / "o.h5") == (
        f"error: {tmp_path}/short.csv:2: 1 values, the header names 2 columns")
    np.savez(tmp_path / "in.npz", data=np.zeros((2, 2)), labels=np.zeros(3))
    assert fails("convert", "arrays", tmp_path / "in.npz", tmp_path / "o.h5", "--label-key", "label") == (
        f"error: {tmp_path}/in.npz: no array 'label'; did you mean 'labels'? (the file has: data, labels); "
        "choose one with --label-key")
    assert "'data' has 2 rows but 'labels' has 3" in fails("convert", "arrays", tmp_path / "in.npz",
                                                            tmp_path / "o.h5", "--label-key", "labels")
    assert not (tmp_path / "o.h5").exists()
    (tmp_path / "o.h5").write_bytes(b"")
    assert "o.h5: already exists; choose another output or pass --overwrite" in fails(
        "convert", "arrays", tmp_path / "in.npz", tmp_path / "o.h5")


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_compute_mean_streams_the_per_pixel_mean(tmp_path, backend):
    pictures = images(50, (3, 4, 5))
    write_dataset(tmp_path / "ds", backend, pictures, [0] * 50)
    stdout = ok("compute-mean", tmp_path / "ds", "-o", tmp_path / "mean.npy")
    mean = np.load(tmp_path / "mean.npy")
    np.testing.assert_allclose(mean, pictures.mean(0), rtol=1e-6)
    channels = ", ".join(f"{v:.4g}" for v in mean.mean((1, 2)))
    assert stdout.strip() == (f"wrote the mean of 50 records to {tmp_path / 'mean.npy'} (shape [3, 4, 5]); "
                              f"per-channel means: mean_value: [{channels}]")
    net = netspec.load_net(f"layers:\n  - {{name: d, type: Data, top: [data, label], transform_param: "
                           f"{{mean_file: {tmp_path / 'mean.npy'}}}, data_param: {{source: {tmp_path / 'ds'}, "
                           f"batch_size: 2, backend: {backend.upper()}}}}}\n", dtype=np.float64)
    net.forward()
    np.testing.assert_allclose(net.blobs["data"].data, pictures[:2] - mean, rtol=1e-6)
    net.close()


def test_data_inspect_shows_counts_and_draws_samples(tmp_path):
    write_dataset(tmp_path / "ds", "lmdb", images(9, (1, 6, 6)), [0, 0, 0, 0, 1, 1, 2, 2, 2])
    stdout = ok("data", "inspect", tmp_path / "ds", "--grid", "2", "-o", tmp_path / "grid.png")
    lines = stdout.splitlines()
    assert lines[0] == f"{tmp_path / 'ds'}: LMDB dataset of 9 records"
    assert lines[1] == "  record shape (C x H x W): 1x6x6; dtype uint8; stored raw"
    assert lines[2].endswith(", converted with test")  # (the settings as key and value; a switch by its name)
    assert lines[3:] == ["  labels (3):", "    0 a  4  " + "#" * 40, "    1 b  2  " + "#" * 20,
                         "    2 c  3  " + "#" * 30, f"wrote 4 samples to {tmp_path / 'grid.png'}"]
    assert (tmp_path / "grid.png").read_bytes().startswith(b"\x89PNG")
    assert fails("data", "inspect", tmp_path / "nowhere") == f"error: {tmp_path}/nowhere: no such dataset folder"


def test_data_inspect_of_many_sizes_names_a_few_and_counts_the_rest(tmp_path):
    pictures = [np.zeros((1, 4, 4 + width), np.uint8) for width in range(9)]
    write_dataset(tmp_path / "ds", "lmdb", pictures, [0] * 9)
    lines = ok("data", "inspect", tmp_path / "ds").splitlines()
    assert lines[1] == "  record shape (C x H x W): 1x4x4 or 1x4x5 or 1x4x6 or 1x4x7 or 5 more sizes; dtype uint8; " \
                       "stored raw", lines[1]
