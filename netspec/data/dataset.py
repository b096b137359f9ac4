"""Dataset folders: records of (image, label) in LMDB or HDF5, with a manifest written last.

A dataset is a folder::

    manifest.json        written last, so a folder without one is an unfinished conversion
    data.mdb, lock.mdb   backend "lmdb": one record per sample (netspec.data.records), keys in index order
    data.h5              backend "hdf5": datasets ``data`` (N x C x H x W) and ``label`` (N)

The manifest holds ``format``, ``backend``, ``count``, ``shapes`` (the distinct
record shapes), ``dtype``, ``encoding``, ``label_names``, ``label_counts``,
``source_sha256`` (the hash of the list of sources) and the converter's
``options``.  A writer fills ``<folder>.partial`` and renames it into place
only when the manifest is written, so an interrupted conversion never leaves a
folder that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections import Counter

import h5py
import lmdb
import numpy

from netspec.data.records import decode_record, read_header, record_key
from netspec.errors import DataError

FORMAT = "netspec-dataset-1"
BACKENDS = ("lmdb", "hdf5")
MANIFEST = "manifest.json"
HDF5_FILE = "data.h5"
INITIAL_MAP_SIZE = 1 << 26
HDF5_CHUNK_ROWS = 64
FLUSH_EVERY = 256


class DatasetWriter:
    """Writes records in index order into ``<path>.partial``; :meth:`finish` writes the manifest and renames.

    ``overwrite`` allows replacing an existing dataset (only once the new one is complete).
    """

    def __init__(self, path: str, backend: str = "lmdb", encoding: str = "raw", overwrite: bool = False):
        self.path = os.path.abspath(path)
        if os.path.exists(self.path) and not overwrite:
            raise DataError(f"{self.path}: already exists; choose another output or pass --overwrite")
        self.partial = self.path + ".partial"
        shutil.rmtree(self.partial, ignore_errors=True)
        os.makedirs(self.partial)
        self.backend, self.encoding = backend, encoding
        self.count = 0
        self.shapes: list[tuple[int, ...]] = []
        self.labels: Counter = Counter()
        self.pending: list = []  # (key, record) for LMDB, (image, label) for HDF5
        if backend == "lmdb":
            self.env = lmdb.open(self.partial, map_size=INITIAL_MAP_SIZE, subdir=True, sync=False, metasync=False)
        else:
            self.h5 = h5py.File(os.path.join(self.partial, HDF5_FILE), "w")

    def add(self, image: numpy.ndarray, label: int, record: bytes | None = None) -> None:
        """Append one sample; LMDB stores ``record`` (its encoded bytes), HDF5 the ``image`` array."""
        shape = tuple(image.shape)
        if shape not in self.shapes:
            if self.backend == "hdf5" and self.shapes:
                raise DataError(f"an HDF5 dataset holds images of one shape: this one is {list(shape)}, the first "
                                f"was {list(self.shapes[0])}; resize them all (--resize HxW) or use --backend lmdb")
            self.shapes.append(shape)
        self.pending.append((record_key(self.count), record) if self.backend == "lmdb" else (image, label))
        self.labels[int(label)] += 1
        self.count += 1
        if len(self.pending) >= FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        if self.backend == "lmdb":
            self._flush_lmdb()
        else:
            self._flush_hdf5()

    def _flush_lmdb(self) -> None:
        """Write the pending records in one transaction, doubling the map while it is full."""
        while self.pending:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self.pending:
                        txn.put(key, value)
                self.pending = []
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _flush_hdf5(self) -> None:
        if not self.pending:
            return
        shape = self.pending[0][0].shape
        if "data" not in self.h5:
            self.h5.create_dataset("data", shape=(0, *shape), maxshape=(None, *shape), dtype=numpy.uint8,
                                   chunks=(HDF5_CHUNK_ROWS, *shape))
            self.h5.create_dataset("label", shape=(0,), maxshape=(None,), dtype=numpy.int64,
                                   chunks=(HDF5_CHUNK_ROWS * 16,))
        data, labels = self.h5["data"], self.h5["label"]
        start = data.shape[0]
        data.resize(start + len(self.pending), axis=0)
        labels.resize(start + len(self.pending), axis=0)
        data[start:] = numpy.stack([image for image, _ in self.pending])
        labels[start:] = [label for _, label in self.pending]
        self.pending = []

    def finish(self, label_names: list[str], source_sha256: str, options: dict) -> dict:
        """Close the data, write the manifest last, move the folder into place; return the manifest."""
        self._flush()
        if self.backend == "lmdb":
            self.env.sync(True)
            self.env.close()
        else:
            self.h5.close()
        manifest = {"format": FORMAT, "backend": self.backend, "count": self.count,
                    "shapes": [list(s) for s in self.shapes], "dtype": "uint8", "encoding": self.encoding,
                    "label_names": label_names, "label_counts": {str(k): v for k, v in sorted(self.labels.items())},
                    "source_sha256": source_sha256, "options": options}
        with open(os.path.join(self.partial, MANIFEST), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1)
        if os.path.exists(self.path):
            shutil.rmtree(self.path)
        os.replace(self.partial, self.path)
        return manifest

    def abandon(self) -> None:
        """Close without a manifest; the unfinished ``.partial`` folder is removed."""
        if self.backend == "lmdb":
            self.env.close()
        else:
            self.h5.close()
        shutil.rmtree(self.partial, ignore_errors=True)


def read_manifest(path: str) -> dict:
    """A dataset folder's manifest; DataError when the folder is not a complete netspec dataset."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise DataError(f"{path}: no such dataset folder")
    if not os.path.isfile(manifest_path):
        partial = " (an interrupted conversion?)" if path.endswith(".partial") else ""
        raise DataError(f"{path}: not a finished netspec dataset: no {MANIFEST}{partial}; convert it again with "
                        "netspec convert")
    try:
        with open(manifest_path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DataError(f"{manifest_path}: cannot read the manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("backend") not in BACKENDS:
        raise DataError(f"{manifest_path}: not a {FORMAT} manifest")
    return manifest


_OPEN_ENVIRONMENTS: dict[str, list] = {}  # path -> [environment, users]; LMDB allows one per process
_OPEN_LOCK = threading.Lock()


def _open_environment(path: str) -> lmdb.Environment:
    """The read-only LMDB environment of ``path``, shared by every reader in this process."""
    with _OPEN_LOCK:
        if path not in _OPEN_ENVIRONMENTS:
            try:
                env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True, max_readers=1024)
            except lmdb.Error as exc:
                raise DataError(f"{path}: cannot open the LMDB database: {exc}") from None
            _OPEN_ENVIRONMENTS[path] = [env, 0]
        entry = _OPEN_ENVIRONMENTS[path]
        entry[1] += 1
        return entry[0]


def _release_environment(path: str) -> None:
    with _OPEN_LOCK:
        entry = _OPEN_ENVIRONMENTS[path]
        entry[1] -= 1
        if not entry[1]:
            entry[0].close()
            del _OPEN_ENVIRONMENTS[path]


class Dataset:
    """A finished dataset folder opened for reading: ``count``, ``shapes``, ``label_names`` and records by index.

    Safe to read from several threads (each gets its own LMDB transaction).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.manifest = read_manifest(self.path)
        self.backend = self.manifest["backend"]
        self.count = int(self.manifest["count"])
        self.shapes = [tuple(s) for s in self.manifest["shapes"]]
        self.label_names = list(self.manifest.get("label_names", []))
        self._local = threading.local()
        if self.backend == "lmdb":
            self.env = _open_environment(self.path)
        else:
            self.h5 = h5py.File(os.path.join(self.path, HDF5_FILE), "r")
            self.h5_lock = threading.Lock()

    def where(self, index: int) -> str:
        """How errors name a record: ``<folder> record <key>``."""
        return f"{self.path} record {record_key(index).decode()}"

    def _raw(self, index: int) -> bytes:
        txn = getattr(self._local, "txn", None)
        if txn is None:
            txn = self._local.txn = self.env.begin(buffers=False)
        value = txn.get(record_key(index))
        if value is None:
            raise DataError(f"{self.where(index)}: missing (the manifest counts {self.count} records)")
        return value

    def record(self, index: int) -> tuple[numpy.ndarray, int]:
        """``(image C x H x W uint8, label)`` of record ``index`` (0 <= index < count)."""
        if self.backend == "lmdb":
            return decode_record(self._raw(index), self.where(index))
        with self.h5_lock:
            return self.h5["data"][index], int(self.h5["label"][index])

    def records(self):
        """Every ``(image, label)`` in index order, read sequentially (an LMDB cursor, HDF5 chunks)."""
        if self.backend == "lmdb":
            with self.env.begin(buffers=False) as txn:
                for index, (key, value) in enumerate(txn.cursor()):
                    if key != record_key(index):
                        raise DataError(f"{self.where(index)}: missing (found key {key.decode(errors='replace')})")
                    yield decode_record(value, self.where(index))
            return
        for start in range(0, self.count, HDF5_CHUNK_ROWS * 16):
            with self.h5_lock:
                images = self.h5["data"][start:start + HDF5_CHUNK_ROWS * 16]
                labels = self.h5["label"][start:start + HDF5_CHUNK_ROWS * 16]
            yield from zip(images, (int(label) for label in labels))

    def label(self, index: int) -> int:
        """Record ``index``'s label, without decoding its image."""
        if self.backend == "lmdb":
            return read_header(self._raw(index), self.where(index))[0]["label"]
        with self.h5_lock:
            return int(self.h5["label"][index])

    def close(self) -> None:
        """Release the files (once; later calls do nothing)."""
        if self.backend == "lmdb" and self.env is not None:
            self.env = None
            _release_environment(self.path)
        elif self.backend == "hdf5":
            self.h5.close()
