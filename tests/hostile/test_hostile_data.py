"""Damaged datasets and image folders: truncated, corrupted or lying files, bombs, links and full disks.

Each input is made here with the real converters, then damaged; the commands a user runs on it (data inspect,
compute-mean, train, convert) are refused in one line that names the dataset, file or record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from hostile import file_size_limit, files_under, refuses, run
from PIL import Image

from netspec.data import dataset as dataset_module
from netspec.data.records import record_key
from netspec.errors import DataError
from netspec.tools.imageset import convert_imageset

PAGE = 4096  # LMDB's page size on this machine (checked in lmdb_pages)
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04  # LMDB page flags, at byte 10 of a page


def save_images(root: Path, size: int, count: int = 8) -> Path:
    """Three class folders of ``count`` random RGB PNGs, ``size`` x ``size``."""
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def convert(*args):
    result = subprocess.run([sys.executable, "-m", "netspec", "convert", "imageset", *map(str, args)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """``lmdb`` and ``hdf5`` datasets of 24 8x8 records, converted once; tests damage copies."""
    folder = tmp_path_factory.mktemp("converted")
    images = save_images(folder / "images", 8)
    for backend in ("lmdb", "hdf5"):
        convert(images, folder / backend, "--backend", backend, "--workers", "1")
    return folder


@pytest.fixture
def lmdb_set(converted, tmp_path) -> Path:
    return Path(shutil.copytree(converted / "lmdb", tmp_path / "ds"))


@pytest.fixture
def hdf5_set(converted, tmp_path) -> Path:
    return Path(shutil.copytree(converted / "hdf5", tmp_path / "ds"))


def solver(folder: Path, layer: str) -> Path:
    """A solver training a small classifier whose data layer is ``layer`` (YAML flow mapping)."""
    path = folder / "solver.yaml"
    path.write_text(f"base_lr: 0.1\nmax_iter: 2\nsnapshot_prefix: run/s\nnet:\n  layers:\n    - {layer}\n"
                    "    - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}\n"
                    "    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    return path


def data_solver(folder: Path, dataset: Path, backend: str = "LMDB") -> Path:
    return solver(folder, f"{{name: d, type: Data, top: [data, label], data_param: {{source: {dataset}, "
                          f"batch_size: 4, backend: {backend}}}}}")


def refused_everywhere(dataset: Path, tmp_path: Path, backend: str = "LMDB", verify: bool = True) -> list[str]:
    """The lines with which data inspect (--verify), compute-mean and train refuse ``dataset``."""
    inspect = ["data", "inspect", dataset] + (["--verify"] if verify else ["-o", tmp_path / "grid.png"])
    return [refuses(*inspect), refuses("compute-mean", dataset, "-o", tmp_path / "mean.npy"),
            refuses("train", data_solver(tmp_path, dataset, backend), cwd=tmp_path)]


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_the_undamaged_datasets_pass_the_full_check(converted, backend):
    result = run("data", "inspect", converted / backend, "--verify")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines()[-1] == "  verified: all 24 records read, decode and match the manifest"


# ---- LMDB: truncated, miscounted, corrupted pages ----------------------------------------------------------------
def lmdb_pages(dataset: Path) -> bytearray:
    data = bytearray((dataset / "data.mdb").read_bytes())
    assert struct.unpack_from("<I", data, 16)[0] == 0xBEEFC0DE and len(data) % PAGE == 0  # the meta page's magic
    return data


def pages_of_type(data: bytearray, flag: int) -> list[int]:
    return [page for page in range(2, len(data) // PAGE) if struct.unpack_from("<H", data, page * PAGE + 10)[0] & flag]


def test_a_truncated_lmdb_is_refused_at_open_not_killed_by_sigbus(lmdb_set, tmp_path):
    size = len(lmdb_pages(lmdb_set))
    os.truncate(lmdb_set / "data.mdb", size // 2)
    expected = (f"error: {lmdb_set}: damaged: data.mdb holds {size // 2} bytes, its LMDB pages need {size} (a "
                "truncated copy?); copy or convert it again")
    assert refused_everywhere(lmdb_set, tmp_path, verify=False) == [expected] * 3
    assert refuses("data", "inspect", lmdb_set) == expected


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_a_manifest_that_miscounts_the_records_is_refused(converted, tmp_path, backend):
    dataset = Path(shutil.copytree(converted / backend, tmp_path / "ds"))
    manifest = json.loads((dataset / "manifest.json").read_text())
    (dataset / "manifest.json").write_text(json.dumps({**manifest, "count": 30}))
    lines = refused_everywhere(dataset, tmp_path, backend.upper(), verify=False)
    if backend == "lmdb":
        assert lines == [f"error: {dataset}: the manifest counts 30 records, data.mdb holds 24; convert it again"] * 3
    else:
        assert lines == [f"error: {dataset}/data.h5: datasets data [24, 3, 8, 8] and label [24] do not hold the "
                         "manifest's 30 records of shape 3x8x8"] * 3


def retype_leaves(dataset: Path, which: slice) -> None:
    """Mark ``which`` of the LMDB's leaf pages as overflow pages."""
    data = lmdb_pages(dataset)
    leaves = pages_of_type(data, P_LEAF)
    assert len(leaves) >= 2
    for page in leaves[which]:
        struct.pack_into("<H", data, page * PAGE + 10, P_OVERFLOW)
    (dataset / "data.mdb").write_bytes(data)


def test_pages_of_the_wrong_type_are_named_by_their_record(lmdb_set, tmp_path):
    retype_leaves(lmdb_set, slice(None))
    assert refused_everywhere(lmdb_set, tmp_path) == [
        f"error: {lmdb_set} record 00000000: cannot read: mdb_get: MDB_CORRUPTED: Located page was wrong type"] * 3


def test_a_damaged_page_past_the_first_does_not_abort_compute_mean(lmdb_set, tmp_path):
    retype_leaves(lmdb_set, slice(-1, None))  # an LMDB cursor stepping onto it fails an assertion: abort()
    line = refuses("compute-mean", lmdb_set, "-o", tmp_path / "mean.npy")
    assert line.startswith(f"error: {lmdb_set} record 000000")
    assert not line.startswith(f"error: {lmdb_set} record 00000000")  # records before the damage were read
    assert line.endswith(": cannot read: mdb_get: MDB_CORRUPTED: Located page was wrong type")


def test_a_root_page_beyond_the_file_is_named(lmdb_set, tmp_path):
    data = lmdb_pages(lmdb_set)
    current = [meta for meta in (0, PAGE) if struct.unpack_from("<Q", data, meta + 120)[0] == 24]  # md_entries
    assert current  # the meta page of the last transaction: the main database's MDB_db after its md_entries
    for meta in current:
        struct.pack_into("<Q", data, meta + 128, 1 << 30)  # md_root
    (lmdb_set / "data.mdb").write_bytes(data)
    assert refused_everywhere(lmdb_set, tmp_path) == [
        f"error: {lmdb_set} record 00000000: cannot read: mdb_get: MDB_PAGE_NOTFOUND: Requested page not found"] * 3


def test_verify_survives_damage_that_aborts_liblmdb(lmdb_set):
    data = lmdb_pages(lmdb_set)
    branches = pages_of_type(data, P_BRANCH)
    assert branches, "the fixture's tree should be two levels deep"
    for page in branches:  # one key left in a branch page: liblmdb fails an assertion and calls abort()
        struct.pack_into("<H", data, page * PAGE + 12, 16 + 2)
    (lmdb_set / "data.mdb").write_bytes(data)
    line = refuses("data", "inspect", lmdb_set, "--verify")
    assert line.startswith(f"error: {lmdb_set} record 00000000: damaged: reading it killed the reader (SIGABRT): ")
    assert "Assertion" in line


# ---- records that lie about themselves --------------------------------------------------------------------------
@pytest.mark.parametrize("header, message", [
    ({"dtype": "object"}, "bad record header: dtype 'object' is not a number type"),
    ({"label": 1.7}, "the label 1.7 is not an integer in [-2147483648, 2147483647]"),
    ({"label": 1e30}, "the label 1e+30 is not an integer in [-2147483648, 2147483647]"),
    ({"label": 10 ** 23}, "the label 100000000000000000000000 is not an integer in [-2147483648, 2147483647]"),
    ({"shape": [3, -8, -8]}, "bad record header: encoding 'raw', shape [3, -8, -8]"),
])
def test_a_record_header_that_lies_is_named(lmdb_set, tmp_path, header, message):
    fields = {"shape": [3, 8, 8], "dtype": "uint8", "label": 0, "encoding": "raw", **header}
    text = json.dumps(fields, separators=(",", ":")).encode()
    with lmdb.open(str(lmdb_set)) as env, env.begin(write=True) as txn:
        txn.put(record_key(0), struct.pack("<I", len(text)) + text + bytes(8 * 8 * 8 * 3))
    for line in refused_everywhere(lmdb_set, tmp_path):
        assert line.startswith(f"error: {lmdb_set} record 00000000: {message}"), line


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_verify_names_a_record_of_another_element_type_than_the_manifests(lmdb_set, dtype):
    """A float32 record of NaN, or int64's, in a uint8 dataset: whole and decodable, but not what it says."""
    text = json.dumps({"shape": [3, 8, 8], "dtype": dtype, "label": 0, "encoding": "raw"}).encode()
    values = np.full(3 * 8 * 8, np.nan if dtype == "float32" else -2 ** 62, dtype=dtype)
    with lmdb.open(str(lmdb_set)) as env, env.begin(write=True) as txn:
        txn.put(record_key(3), struct.pack("<I", len(text)) + text + values.tobytes())
    assert refuses("data", "inspect", lmdb_set, "--verify") == (
        f"error: {lmdb_set} record 00000003: values of type {dtype}, the manifest says uint8")


# ---- HDF5 dataset folders ---------------------------------------------------------------------------------------
def test_a_truncated_hdf5_dataset_is_refused(hdf5_set, tmp_path):
    os.truncate(hdf5_set / "data.h5", os.path.getsize(hdf5_set / "data.h5") // 2)
    for line in refused_everywhere(hdf5_set, tmp_path, "HDF5", verify=False):
        assert line.startswith(f"error: {hdf5_set}/data.h5: cannot open HDF5 file: not a readable HDF5 file "
                               "(truncated file"), line


def relabel(value):
    """A change to an open .h5 file: its dataset 'label' replaced by ``value`` (or removed, for None)."""
    def change(h5: h5py.File) -> None:
        del h5["label"]
        if value is not None:
            h5["label"] = value
    return change


def label_kept_elsewhere(h5: h5py.File) -> None:
    """A change to an open .h5 file: its dataset 'label' stored in another file (HDF5's external storage)."""
    rows = len(h5["label"])
    del h5["label"]
    h5.create_dataset("label", (rows,), np.float32, external=[("/etc/passwd", 0, 4 * rows)])


LINKED = "'label' is a link; netspec reads only datasets stored in the file itself"
ELSEWHERE = "dataset 'label' keeps its data in other files; netspec reads only what is inside the file"


@pytest.mark.parametrize("change, message", [
    (relabel(None), "no dataset 'label' (the file has: data)"),
    (relabel(np.full(24, 1e23)), "dataset 'label' holds float64, not integers"),
    (relabel(["a"] * 24), "dataset 'label' holds object, not numbers"),
    (relabel(h5py.ExternalLink("/etc/passwd", "/x")), LINKED),
    (label_kept_elsewhere, ELSEWHERE),
])
def test_a_damaged_hdf5_dataset_is_named(hdf5_set, tmp_path, change, message):
    with h5py.File(hdf5_set / "data.h5", "a") as h5:
        change(h5)
    for line in refused_everywhere(hdf5_set, tmp_path, "HDF5", verify=False):
        assert line == f"error: {hdf5_set}/data.h5: {message}"


def test_an_hdf5_label_out_of_int_range_is_named_by_its_record(hdf5_set, tmp_path):
    with h5py.File(hdf5_set / "data.h5", "a") as h5:
        h5["label"][2] = 1 << 40
    for line in refused_everywhere(hdf5_set, tmp_path, "HDF5"):
        assert line == (f"error: {hdf5_set} record 00000002: the label {1 << 40} is not an integer in "
                        "[-2147483648, 2147483647]")


def test_labels_that_disagree_with_the_manifest_are_found_by_the_full_check(hdf5_set):
    with h5py.File(hdf5_set / "data.h5", "a") as h5:
        h5["label"][0] = 2
    assert run("data", "inspect", hdf5_set).returncode == 0  # the check at open reads no record
    assert refuses("data", "inspect", hdf5_set, "--verify") == (
        f"error: {hdf5_set}: 7 records have label 0, the manifest's label_counts say 8")


# ---- manifests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("count"), "'count' must be a positive integer, not None"),
    (lambda m: m.update(shapes=[[3, 8]]), "'shapes' must be a list of record shapes [C, H, W], not [[3, 8]]"),
    (lambda m: m.update(shapes=[[3, 1 << 20, 1 << 20]]), "'shapes' must be a list of record shapes [C, H, W]"),
    (lambda m: m.update(label_counts={"x": 1}), "'label_counts' must be a map of labels to counts"),
    (lambda m: m.update(label_counts={"9" * 5000: 1}), "'label_counts' must be a map of labels to counts"),
])
def test_a_manifest_with_bad_fields_is_named(lmdb_set, tmp_path, change, message):
    manifest = json.loads((lmdb_set / "manifest.json").read_text())
    change(manifest)
    (lmdb_set / "manifest.json").write_text(json.dumps(manifest))
    line = refuses("data", "inspect", lmdb_set)
    assert line.startswith(f"error: {lmdb_set}/manifest.json: {message}"), line


def test_a_manifest_bomb_is_refused(lmdb_set):
    (lmdb_set / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert refuses("data", "inspect", lmdb_set).startswith(
        f"error: {lmdb_set}/manifest.json: cannot read the manifest: maximum recursion depth exceeded")
    os.truncate(lmdb_set / "manifest.json", 1 << 30)
    assert refuses("data", "inspect", lmdb_set) == (
        f"error: {lmdb_set}/manifest.json: {1 << 30} bytes, more than the {1 << 24} it may hold")


@pytest.mark.parametrize("name", ["data.mdb", "manifest.json"])
def test_a_fifo_in_a_dataset_is_refused_not_waited_on(lmdb_set, name):
    os.remove(lmdb_set / name)
    os.mkfifo(lmdb_set / name)
    assert refuses("data", "inspect", lmdb_set, timeout=30) == f"error: {lmdb_set / name}: not a regular file"


def truncated_mean(path: Path) -> None:
    np.save(path, np.zeros((3, 8, 8), np.float32))
    os.truncate(path, 128)  # the header alone


@pytest.mark.parametrize("make, message", [
    (lambda path: np.save(path, np.array([["a"]])), "not a .npy array of numbers"),
    (truncated_mean, "cannot read: "),
    (os.mkfifo, "not a regular file"),
])
def test_a_mean_file_that_is_no_array_is_named(lmdb_set, tmp_path, make, message):
    make(tmp_path / "mean.npy")
    path = solver(tmp_path, f"{{name: d, type: Data, top: [data, label], transform_param: {{mean_file: mean.npy}}, "
                            f"data_param: {{source: {lmdb_set}, batch_size: 4}}}}")
    line = refuses("train", path, cwd=tmp_path, timeout=30)
    assert f"transform_param.mean_file: {tmp_path}/mean.npy: {message}" in line, line


# ---- Caffe-style HDF5 lists (HDF5Data) -------------------------------------------------------------------------
def hdf5_solver(folder: Path, change) -> Path:
    with h5py.File(folder / "a.h5", "w") as h5:
        h5["data"] = np.zeros((8, 4), np.float32)
        h5["label"] = np.zeros(8, np.float32)
        change(h5)
    (folder / "list.txt").write_text("a.h5\n")
    return solver(folder, "{name: d, type: HDF5Data, top: [data, label], "
                          "hdf5_data_param: {source: list.txt, batch_size: 4}}")


@pytest.mark.parametrize("change, message", [
    (relabel(None), "no dataset 'label' (the file has: data)"),
    (relabel(["x"] * 8), "dataset 'label' holds object, not numbers"),
    (relabel(h5py.ExternalLink("/dev/zero", "/x")), LINKED),
    (label_kept_elsewhere, ELSEWHERE),
])
def test_a_damaged_hdf5_list_file_is_named(tmp_path, change, message):
    line = refuses("train", hdf5_solver(tmp_path, change), cwd=tmp_path)
    assert line.endswith(f"hdf5_data_param.source: {tmp_path}/a.h5: {message}"), line


def test_a_truncated_file_in_an_hdf5_list_is_named(tmp_path):
    path = hdf5_solver(tmp_path, lambda h5: h5.create_dataset("big", data=np.zeros(100_000, np.float32)))
    os.truncate(tmp_path / "a.h5", os.path.getsize(tmp_path / "a.h5") // 2)
    line = refuses("train", path, cwd=tmp_path)
    assert f"hdf5_data_param.source: {tmp_path}/a.h5: cannot open HDF5 file: not a readable HDF5 file" in line


# ---- image folders ----------------------------------------------------------------------------------------------
def png_bomb(path: Path, side: int) -> None:
    """A valid 1-bit PNG of ``side`` x ``side`` black pixels: a few kilobytes that decode to side**2 pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    compressor = zlib.compressobj(9)
    row = bytes(1 + (side + 7) // 8)  # filter byte 0, then the bits
    pixels = b"".join(compressor.compress(row * 1000) for _ in range(side // 1000)) + compressor.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


def hostile_file(kind: str, path: Path) -> str:
    """Put a hostile ``kind`` of file at ``path``; what the conversion says about it."""
    if kind == "bomb":  # 100 million pixels: over Pillow's limit, where Pillow itself only warns
        png_bomb(path, 10_000)
        return "cannot decode: Image size (100000000 pixels) exceeds limit of 89478485 pixels"
    if kind == "big bomb":  # 400 million pixels: Pillow's DecompressionBombError
        png_bomb(path, 20_000)
        return "cannot decode: Image size (400000000 pixels) exceeds limit of 178956970 pixels"
    if kind == "loop":
        path.symlink_to(path.name)
        return "cannot read: Too many levels of symbolic links"
    if kind == "zero":
        path.symlink_to("/dev/zero")
        return "not a regular file"
    os.mkfifo(path)
    return "not a regular file"


@pytest.mark.parametrize("kind", ["bomb", "big bomb", "loop", "zero", "fifo"])
def test_a_hostile_file_in_an_image_folder_is_named(tmp_path, kind):
    images = save_images(tmp_path / "images", 4, count=2)
    reason = hostile_file(kind, images / "dog" / "x.png")
    line = refuses("convert", "imageset", images, tmp_path / "ds", "--strict", "--workers", "1")
    assert line.startswith(f"error: {images}/dog/x.png: {reason}") and line.endswith("(stopped: --strict)"), line
    assert os.listdir(tmp_path) == ["images"]
    result = run("convert", "imageset", images, tmp_path / "ds", "--workers", "2")
    assert result.returncode == 0 and result.stderr.startswith(f"skipped {images}/dog/x.png: {reason}"), result.stderr
    assert "wrote 6 records" in result.stdout


def test_a_bomb_in_an_image_data_list_stops_training_with_its_name(tmp_path):
    save_images(tmp_path, 4, count=2)
    png_bomb(tmp_path / "bomb.png", 10_000)
    (tmp_path / "list.txt").write_text("cat/0.png 0\nbomb.png 1\n")
    line = refuses("train", solver(tmp_path, "{name: d, type: ImageData, top: [data, label], "
                                             "image_data_param: {source: list.txt, batch_size: 2}}"), cwd=tmp_path)
    assert line == (f"error: {tmp_path}/bomb.png: cannot decode: Image size (100000000 pixels) exceeds limit of "
                    "89478485 pixels, could be decompression bomb DOS attack.")


def test_a_list_file_label_past_int32_is_refused(tmp_path):
    images = save_images(tmp_path / "images", 4, count=1)
    (tmp_path / "list.txt").write_text(f"cat/0.png {10 ** 30}\n")
    assert refuses("convert", "imageset", images, tmp_path / "list.txt", tmp_path / "ds") == (
        f"error: {tmp_path}/list.txt:1: the label {10 ** 30} is outside [0, 2147483647]")


# ---- full disks -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_a_conversion_that_fills_the_disk_leaves_nothing_behind(tmp_path, backend):
    images = save_images(tmp_path / "images", 48)  # 24 records of 6.9 kB
    before = files_under(tmp_path)
    with file_size_limit(64 << 10):
        line = refuses("convert", "imageset", images, tmp_path / "ds", "--backend", backend, "--workers", "1")
        assert line.startswith(f"error: {tmp_path}/ds: cannot write: "), line
        line = refuses("convert", "imageset", images, tmp_path / "split", "--val-fraction", "0.5",
                       "--backend", backend, "--workers", "1")
        assert line.startswith(f"error: {tmp_path}/split/train: cannot write: "), line
    assert files_under(tmp_path) == before  # split/, made for train and val, removed again


@pytest.mark.parametrize("earlier", [False, True])
def test_a_split_conversion_on_a_full_disk_leaves_nothing_new_behind(tmp_path, earlier):
    """convert digits writes train.h5, test.h5 and their lists together or not at all: no empty folder, no
    train set without its test set, and an earlier conversion in the folder stays as it was."""
    if earlier:
        assert run("convert", "digits", tmp_path / "dg").returncode == 0
        (tmp_path / "dg" / "notes.txt").write_text("the user's own file\n")
    before = {path: (tmp_path / path).read_bytes() if (tmp_path / path).is_file() else None
              for path in files_under(tmp_path)}
    with file_size_limit(10_000):
        assert refuses("convert", "digits", tmp_path / "dg") == f"error: {tmp_path}/dg/train.h5: cannot write: File too large"
    assert {path: (tmp_path / path).read_bytes() if (tmp_path / path).is_file() else None
            for path in files_under(tmp_path)} == before


def test_compute_mean_and_convert_arrays_on_a_full_disk_leave_nothing_behind(lmdb_set, tmp_path):
    np.savez(tmp_path / "rows.npz", data=np.zeros((2000, 10)), label=np.arange(2000))
    before = files_under(tmp_path)
    with file_size_limit(512):
        assert refuses("compute-mean", lmdb_set, "-o", tmp_path / "mean.npy").startswith(
            f"error: {tmp_path}/mean.npy: cannot write: ")
        assert refuses("convert", "arrays", tmp_path / "rows.npz", tmp_path / "rows.h5").startswith(
            f"error: {tmp_path}/rows.h5: cannot write: ")
    assert files_under(tmp_path) == before


def test_a_full_disk_is_called_full(tmp_path, monkeypatch):
    """liblmdb reports a full disk as an I/O error; the message says what happened."""
    images = save_images(tmp_path / "images", 4, count=1)

    def full(self):
        raise lmdb.Error("mdb_txn_commit: Input/output error")

    monkeypatch.setattr(dataset_module.DatasetWriter, "_flush_lmdb", full)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((4096,) * 3 + (0,) * 7))
    with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path))}/ds: cannot write: the disk is full$"):
        convert_imageset(str(images), str(tmp_path / "ds"))
    assert sorted(os.listdir(tmp_path)) == ["images"]


@pytest.mark.parametrize("command, make", [
    (("check", "net.yaml"), lambda folder: (folder / "net.yaml").write_text(
        "layers:\n  - {name: d, type: HDF5Data, top: [data], hdf5_data_param: {source: fifo, batch_size: 2}}\n")),
    (("check", "net.yaml"), lambda folder: (folder / "net.yaml").write_text(
        "layers:\n  - {name: d, type: ImageData, top: [data, label], image_data_param: {source: fifo, "
        "batch_size: 2}}\n")),
    (("import", "caffe", "fifo", "-o", "net.yaml"), lambda folder: None),
    (("import", "caffemodel", "net.prototxt", "fifo", "-o", "w.h5"), lambda folder: (folder / "net.prototxt").write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }\n')),
], ids=["HDF5 list", "image list", "prototxt", "caffemodel"])
def test_a_fifo_named_as_a_source_is_refused_at_once(tmp_path, command, make):
    os.mkfifo(tmp_path / "fifo")  # nobody writes to it: reading it would wait forever
    make(tmp_path)
    line = refuses(*command, cwd=tmp_path, timeout=30)
    assert "fifo: not a regular file" in line, line


def test_a_split_conversion_killed_after_its_first_part_leaves_no_part_that_looks_finished(tmp_path):
    images = save_images(tmp_path / "images", 16, count=60)
    out = tmp_path / "split"
    process = subprocess.Popen([sys.executable, "-m", "netspec", "convert", "imageset", images, out, "--val-fraction",
                                "0.5", "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # kill it once the training part is complete (its manifest written), while the validation part is made
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("split*/train/manifest.json")) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        process.kill()
        process.wait()
    assert not out.exists() or not (out / "train" / "manifest.json").exists()  # only split.partial holds a part
    line = refuses("data", "inspect", out / "train")
    assert "no such" in line.lower() or "not a finished netspec dataset" in line
    rerun = run("convert", "imageset", images, out, "--val-fraction", "0.5")
    assert rerun.returncode == 0, rerun.stderr  # the leftover split.partial is the conversion's own: replaced
    assert sorted(os.listdir(out)) == ["labels.txt", "train", "val"] and not (tmp_path / "split.partial").exists()


def test_an_lmdb_cut_short_while_a_net_reads_it_is_one_line_not_sigbus(lmdb_set, tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(f"layers:\n  - {{name: d, type: Data, top: [data, label], data_param: {{source: {lmdb_set}, "
                   "batch_size: 4, prefetch: 0}}\n")
    probe = (f"import netspec\nnet = netspec.load_net({str(net)!r})\nnet.forward()\n"
             f"import os\nos.truncate({str(lmdb_set / 'data.mdb')!r}, 8192)\n"
             "try:\n    net.forward()\nexcept netspec.DataError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])  # (SIGBUS: -7)
    assert result.stdout.strip() == (f"{lmdb_set}: data.mdb was cut to 8192 bytes while it was read (its pages "
                                     f"need {result.stdout.split('need ')[1].split(')')[0]}); copy or convert it again")


def test_an_lmdb_is_checked_by_the_file_it_maps_even_once_another_lies_at_its_path(lmdb_set, tmp_path):
    first = dataset_module.Dataset(str(lmdb_set))
    mapped = tmp_path / "mapped.mdb"
    os.link(lmdb_set / "data.mdb", mapped)  # (a name for the file the environment maps)
    shutil.copy(mapped, tmp_path / "copy.mdb")
    os.replace(tmp_path / "copy.mdb", lmdb_set / "data.mdb")  # a whole copy renamed over it
    second = dataset_module.Dataset(str(lmdb_set))  # shares the first's environment, which maps the old file
    os.truncate(mapped, 8192)
    for opened in (first, second):
        with pytest.raises(DataError, match="data.mdb was cut to 8192 bytes while it was read"):
            opened.check_intact()
        opened.close()


def test_a_split_conversion_into_a_linked_folder_stages_beside_the_real_one(tmp_path):
    images = save_images(tmp_path / "images", 8, count=4)
    (tmp_path / "elsewhere" / "real").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "real", tmp_path / "out")
    result = run("convert", "imageset", images, tmp_path / "out", "--val-fraction", "0.5")
    assert result.returncode == 0, result.stderr
    assert f"to {tmp_path / 'out' / 'train'}" in result.stdout  # (named as the user named it)
    assert sorted(os.listdir(tmp_path / "elsewhere" / "real")) == ["labels.txt", "train", "val"]
    assert sorted(os.listdir(tmp_path / "elsewhere")) == ["real"] and (tmp_path / "out").is_symlink()
    (tmp_path / "file").write_text("not a folder")
    assert refuses("convert", "imageset", images, tmp_path / "file", "--val-fraction", "0.5") == (
        f"error: {tmp_path / 'file'}: exists and is no folder, so it cannot hold train/ and val/")


def test_every_read_of_an_lmdb_cut_short_is_one_line_not_sigbus(lmdb_set):
    probe = ("from netspec.data.dataset import Dataset\nfrom netspec.errors import DataError\nimport os\n"
             f"first, second = Dataset({str(lmdb_set)!r}), Dataset({str(lmdb_set)!r})\n"
             f"os.truncate({str(lmdb_set / 'data.mdb')!r}, 8192)\n"
             "for reader in (first, second):\n    try:\n        reader.record(reader.count - 1)\n"
             "    except DataError as exc:\n        print(str(exc).split(' (')[0])\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])  # (SIGBUS: -7)
    assert result.stdout.splitlines() == [f"{lmdb_set}: data.mdb was cut to 8192 bytes while it was read"] * 2


# ---- text and array sources -------------------------------------------------------------------------------------
def npy_header(shape, dtype="<f4") -> bytes:
    """The header of a .npy file declaring ``shape``, padded as NumPy pads it."""
    text = str({"descr": dtype, "fortran_order": False, "shape": shape})
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


@pytest.mark.parametrize("name, content, message", [
    ("latin.csv", b"a,label\n1,0\ncaf\xe9,0\n", "latin.csv: not UTF-8 text (byte 15 of a block read)"),
    ("wide.csv", b"a,b,label\n1,2,0\n" + b"1" * 200_000 + b",2,0\n", "wide.csv:3: field larger than field limit"),
    ("labels only.csv", b"label\n1\n2\n", "labels only.csv:1: the header names no column of values beside 'label'"),
    ("empty.npz", b"", "empty.npz: cannot read the .npz file: No data left in file"),
    ("empty.npy", b"", "empty.npy: cannot read the .npy file: No data left in file"),
    ("no columns.npy", npy_header((3, 0)), "no columns.npy has the shape [3, 0]: its rows hold no values"),
], ids=["latin-1 csv", "huge field", "labels only", "empty npz", "empty npy", "no columns"])
def test_array_sources_that_are_not_rows_of_numbers_are_one_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    line = refuses("convert", "arrays", tmp_path / name, tmp_path / "out.h5")
    assert message in line, line
    assert not (tmp_path / "out.h5").exists()


def test_an_npz_member_declaring_more_values_than_memory_holds_is_one_line(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        archive.writestr("data.npy", npy_header((10 ** 12, 4)) + bytes(64))  # (4 TB declared, 64 bytes stored)
    assert refuses("convert", "arrays", tmp_path / "huge.npz", tmp_path / "out.h5") == (
        f"error: {tmp_path / 'huge.npz'}: array 'data' does not fit in memory (its header declares more values than "
        "the machine holds)")


@pytest.mark.parametrize("make, message", [
    (lambda path: os.mkfifo(path), "not a regular file"),
    (lambda path: path.write_bytes(b"c\xe9t\ndog\n"), "the label names: not UTF-8 text (byte 1)"),
], ids=["fifo", "latin-1"])
def test_label_names_that_are_no_text_file_are_one_line_never_waited_on(tmp_path, make, message):
    for label in ("cat", "dog"):
        (tmp_path / "root" / label).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "root" / label / "0.png")
    make(tmp_path / "labels")
    started = time.perf_counter()
    line = refuses("convert", "imageset", tmp_path / "root", tmp_path / "out", "--labels", tmp_path / "labels")
    assert line == f"error: {tmp_path / 'labels'}: {message}" and time.perf_counter() - started < 30
