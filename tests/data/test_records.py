"""The record format, dataset folders (LMDB and HDF5), record order and prefetching."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from netspec.data import dataset as dataset_module
from netspec.data.batches import Prefetcher, RecordOrder
from netspec.data.dataset import Dataset, DatasetWriter, read_manifest
from netspec.data.records import decode_record, encode_record, record_key
from netspec.errors import DataError


def images(count, shape=(3, 5, 4), seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, *shape), dtype=np.uint8)


@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("channels", [1, 3])
def test_records_round_trip_exactly(encoding, channels):
    image = images(1, (channels, 6, 7))[0]
    data = encode_record(image, 7, encoding)
    (length,) = struct.unpack_from("<I", data)
    header = json.loads(data[4:4 + length])
    assert header == {"shape": [channels, 6, 7], "dtype": "uint8", "label": 7, "encoding": encoding}
    decoded, label = decode_record(data, "here")
    assert label == 7 and decoded.dtype == np.uint8 and np.array_equal(decoded, image)


def test_jpeg_records_decode_close_to_the_image():
    image = np.full((3, 16, 16), 120, dtype=np.uint8)
    decoded, _ = decode_record(encode_record(image, 0, "jpg"), "here")
    assert decoded.shape == (3, 16, 16) and np.abs(decoded.astype(int) - 120).max() <= 2


def test_damaged_records_are_named():
    good = encode_record(images(1)[0], 1)
    with pytest.raises(DataError, match="db record 00000003: bad record: 2 bytes, too short for a header"):
        decode_record(b"ab", "db record 00000003")
    with pytest.raises(DataError, match=r"^x: bad record header \(JSONDecodeError"):
        decode_record(struct.pack("<I", 5) + b"{nope" + b"\0" * 10, "x")
    with pytest.raises(DataError, match=r"^x: bad record: 59 payload bytes, the header's shape \[3, 5, 4\] of uint8 "
                                        "needs 60"):
        decode_record(good[:-1], "x")
    with pytest.raises(DataError, match="^x: not an image"):
        decode_record(good.replace(b'"raw"', b'"png"'), "x")


def write_dataset(path, backend, pictures, labels, **kwargs):
    writer = DatasetWriter(str(path), backend, **kwargs)
    for image, label in zip(pictures, labels):
        writer.add(image, label, encode_record(image, label) if backend == "lmdb" else None)
    return writer.finish(["a", "b", "c"], "0" * 64, {"test": True})


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_datasets_hold_their_records_in_order_with_a_manifest(tmp_path, backend, monkeypatch):
    monkeypatch.setattr(dataset_module, "INITIAL_MAP_SIZE", 4096 * 8)  # forces the map to grow
    monkeypatch.setattr(dataset_module, "FLUSH_EVERY", 7)
    pictures, labels = images(300), [i % 3 for i in range(300)]
    manifest = write_dataset(tmp_path / "ds", backend, pictures, labels)
    assert manifest == read_manifest(str(tmp_path / "ds"))
    assert (manifest["count"], manifest["shapes"], manifest["label_counts"]) == (
        300, [[3, 5, 4]], {"0": 100, "1": 100, "2": 100})
    ds = Dataset(str(tmp_path / "ds"))
    for index in (0, 7, 299):
        image, label = ds.record(index)
        assert np.array_equal(image, pictures[index]) and label == labels[index] == ds.label(index)
    assert ds.label_names == ["a", "b", "c"] and not (tmp_path / "ds.partial").exists()
    ds.close()


def test_a_partial_folder_is_replaced_only_when_a_conversion_left_it(tmp_path):
    interrupted = DatasetWriter(str(tmp_path / "ds"), "lmdb")
    interrupted.add(images(1)[0], 0, encode_record(images(1)[0], 0))  # and the process dies: no abandon
    interrupted.env.close()
    write_dataset(tmp_path / "ds", "lmdb", images(2), [0, 1])  # replaces the leftover
    assert Dataset(str(tmp_path / "ds")).count == 2 and not (tmp_path / "ds" / "conversion-in-progress").exists()
    (tmp_path / "notes.partial").mkdir()
    (tmp_path / "notes.partial" / "thesis.txt").write_text("mine")
    with pytest.raises(DataError, match=r"notes.partial: exists and is no conversion's leftover .* move it away"):
        DatasetWriter(str(tmp_path / "notes"), "hdf5")
    assert (tmp_path / "notes.partial" / "thesis.txt").read_text() == "mine"


def test_an_unfinished_or_existing_dataset_is_refused(tmp_path):
    writer = DatasetWriter(str(tmp_path / "ds"), "lmdb")
    writer.add(images(1)[0], 0, encode_record(images(1)[0], 0))
    with pytest.raises(DataError, match=r"ds.partial: not a finished netspec dataset: no manifest.json \(an "
                                        r"interrupted conversion\?\)"):
        read_manifest(str(tmp_path / "ds.partial"))
    writer.abandon()
    assert not (tmp_path / "ds.partial").exists() and not (tmp_path / "ds").exists()
    write_dataset(tmp_path / "ds", "lmdb", images(2), [0, 1])
    with pytest.raises(DataError, match="ds: already exists; choose another output or pass --overwrite"):
        DatasetWriter(str(tmp_path / "ds"), "lmdb")
    write_dataset(tmp_path / "ds", "lmdb", images(3), [0, 1, 2], overwrite=True)
    assert Dataset(str(tmp_path / "ds")).count == 3
    with pytest.raises(DataError, match="an HDF5 dataset holds images of one shape"):
        write_dataset(tmp_path / "h5", "hdf5", [images(1)[0], images(1, (3, 2, 2))[0]], [0, 1])


def test_a_bad_lmdb_record_is_named_by_its_key(tmp_path):
    write_dataset(tmp_path / "ds", "lmdb", images(3), [0, 1, 2])
    import lmdb

    with lmdb.open(str(tmp_path / "ds")) as env, env.begin(write=True) as txn:
        txn.put(record_key(1), b"\x00\x00")
    with pytest.raises(DataError, match=r"ds record 00000001: bad record: 2 bytes"):
        Dataset(str(tmp_path / "ds")).record(1)


def test_record_order_in_key_order_wraps_around():
    order = RecordOrder(5, seed=0)
    assert list(order.indices(0, 12)) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize("shuffle", ["epoch", 4])
def test_shuffled_orders_visit_every_record_once_per_epoch(shuffle):
    order = RecordOrder(10, seed=3, shuffle=shuffle)
    first, second = order.indices(0, 10), order.indices(10, 10)
    assert sorted(first) == sorted(second) == list(range(10)) and list(first) != list(second)
    assert list(RecordOrder(10, seed=3, shuffle=shuffle).indices(7, 6)) == list(order.indices(0, 20)[7:13])
    if shuffle == 4:  # each epoch reads whole blocks of 4 consecutive records, one after another
        position = 0
        while position < 10:
            block = range(first[position] // 4 * 4, min(first[position] // 4 * 4 + 4, 10))
            assert sorted(first[position:position + len(block)]) == list(block)
            position += len(block)


@pytest.mark.parametrize("shuffle", ["none", "epoch", 4])
def test_shards_are_disjoint_and_cover_the_dataset_every_epoch(shuffle):
    readers = [RecordOrder(10, seed=1, shuffle=shuffle, rank=r, world_size=3) for r in range(3)]
    for epoch in range(3):
        # stream positions 10 * epoch .. 10 * epoch + 9, wherever they fall among the readers
        taken = [[int(reader.indices(p, 1)[0]) for p in range(12) if 10 * epoch <= r + 3 * p < 10 * (epoch + 1)]
                 for r, reader in enumerate(readers)]
        assert sorted(index for share in taken for index in share) == list(range(10))
    with pytest.raises(DataError, match="rank 3 is not in 0..2"):
        RecordOrder(10, seed=1, rank=3, world_size=3)
    with pytest.raises(DataError, match="2 records cannot be split over 3 processes"):
        RecordOrder(2, seed=1, world_size=3)


@pytest.mark.parametrize("shuffle", ["none", "epoch", 4])
def test_readers_batches_together_are_one_readers_larger_batch(shuffle):
    single = RecordOrder(10, seed=5, shuffle=shuffle)
    pair = [RecordOrder(10, seed=5, shuffle=shuffle, rank=r, world_size=2) for r in range(2)]
    for k in range(7):  # batch 3 per reader against batch 6, across epoch ends
        joined = np.empty(6, dtype=np.int64)
        joined[0::2], joined[1::2] = pair[0].indices(3 * k, 3), pair[1].indices(3 * k, 3)
        assert list(joined) == list(single.indices(6 * k, 6))


def test_the_prefetcher_delivers_in_order_and_stops_cleanly():
    made = []

    def make(k):
        made.append(k)
        return k * 10

    ahead = Prefetcher(make, depth=3, start=5)
    assert [ahead.next() for _ in range(4)] == [50, 60, 70, 80]
    ahead.restart(2)
    assert ahead.next() == 20 and ahead.next_batch == 3
    thread = ahead.thread
    ahead.close()
    assert not thread.is_alive() and ahead.thread is None
    inline = Prefetcher(lambda k: k, depth=0, start=4)
    assert [inline.next(), inline.next()] == [4, 5]


def test_the_prefetcher_hands_errors_to_the_consumer():
    def make(k):
        if k == 2:
            raise DataError("record 2 is broken")
        return k

    ahead = Prefetcher(make, depth=2)
    assert [ahead.next(), ahead.next()] == [0, 1]
    with pytest.raises(DataError, match="record 2 is broken"):
        ahead.next()
    assert ahead.thread is None
