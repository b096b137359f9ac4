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
folder that looks complete; a failed write (a full disk) removes the partial
folder and names the dataset.

Opening a dataset checks it cheaply against its manifest: the manifest's
fields, ``data.mdb`` as long as the LMDB's own map says (a truncated file
would kill the reader with SIGBUS) and as many records as counted, or
``data.h5``'s datasets of the counted rows, shape and an integer label.
:meth:`Dataset.verify` (``netspec data inspect --verify``) reads and decodes
every record.  Every read failure is a DataError naming the dataset and record.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import reprlib
import shutil
import threading
from collections import Counter

import h5py
import lmdb
import numpy

from netspec.data import hdf5
from netspec.data.files import one_line, regular_file, writing
from netspec.data.images import checked_label
from netspec.data.records import decode_record, read_header, record_key, valid_shape
from netspec.data.staging import IN_PROGRESS, PARTIAL, partial_folder
from netspec.errors import DataError

FORMAT = "netspec-dataset-1"
BACKENDS = ("lmdb", "hdf5")
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 24
LMDB_FILE = "data.mdb"
HDF5_FILE = "data.h5"
INITIAL_MAP_SIZE = 1 << 26
HDF5_CHUNK_ROWS = 64
FLUSH_EVERY = 256
_WRITE_ERRORS = (*hdf5.WRITE_ERRORS, lmdb.Error)


SHAPES_SHOWN = 4  # record shapes a line names; of a dataset of many sizes, how many more there are


def shapes_text(shapes, times: str = "x") -> str:
    """Record shapes as ``CxHxW`` (``times`` between the sizes), several joined with 'or': the first
    SHAPES_SHOWN, then how many more (a dataset of mixed sizes may hold thousands)."""
    listed = [times.join(map(str, shape)) for shape in shapes[:SHAPES_SHOWN]]
    if len(shapes) > SHAPES_SHOWN:
        listed.append(f"{len(shapes) - SHAPES_SHOWN:,} more sizes")
    return " or ".join(listed)


class DatasetWriter:
    """Writes records in index order into ``<path>.partial``; :meth:`finish` writes the manifest and renames.

    A ``.partial`` folder left by an interrupted conversion (it holds IN_PROGRESS) is replaced; any other is
    refused, never removed.

    ``overwrite`` allows replacing an existing dataset (only once the new one is complete).  A write that
    fails raises a DataError naming the dataset; the caller then calls :meth:`abandon` (:meth:`finish` does it
    itself).
    """

    def __init__(self, path: str, backend: str = "lmdb", encoding: str = "raw", overwrite: bool = False,
                 name: str | None = None):
        self.path = os.path.abspath(path)
        if os.path.exists(self.path) and not overwrite:
            raise DataError(f"{self.path}: already exists; choose another output or pass --overwrite")
        self.partial = self.path + PARTIAL
        self.name = name or self.path  # what messages call it (a part of a conversion staged elsewhere: its place)
        self.backend, self.encoding = backend, encoding
        self.count = 0
        self.shapes: list[tuple[int, ...]] = []
        self.labels: Counter = Counter()
        self.pending: list = []  # (key, record) for LMDB, (image, label) for HDF5
        self.env = self.h5 = self.h5_data = self.h5_label = None  # datasets kept open: see hdf5.close_discarding
        with writing(self.name, _WRITE_ERRORS):
            partial_folder(self.path)  # (refused: nothing was touched, so nothing is abandoned)
        try:
            with writing(self.name, _WRITE_ERRORS):
                if backend == "lmdb":
                    self.env = lmdb.open(self.partial, map_size=INITIAL_MAP_SIZE, subdir=True, sync=False,
                                         metasync=False)
                else:
                    self.h5 = h5py.File(os.path.join(self.partial, HDF5_FILE), "w")
        except DataError:
            self.abandon()
            raise

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
        with writing(self.name, _WRITE_ERRORS):
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
        if self.h5_data is None:
            self.h5_data = self.h5.create_dataset("data", shape=(0, *shape), maxshape=(None, *shape),
                                                  dtype=numpy.uint8, chunks=(HDF5_CHUNK_ROWS, *shape))
            self.h5_label = self.h5.create_dataset("label", shape=(0,), maxshape=(None,), dtype=numpy.int64,
                                                   chunks=(HDF5_CHUNK_ROWS * 16,))
        data, labels = self.h5_data, self.h5_label
        start = data.shape[0]
        data.resize(start + len(self.pending), axis=0)
        labels.resize(start + len(self.pending), axis=0)
        data[start:] = numpy.stack([image for image, _ in self.pending])
        labels[start:] = [label for _, label in self.pending]
        self.pending = []

    def finish(self, label_names: list[str], source_sha256: str, options: dict) -> dict:
        """Close the data, write the manifest last, move the folder into place; return the manifest.

        When a write fails (a DataError), the unfinished folder is removed.
        """
        manifest = {"format": FORMAT, "backend": self.backend, "count": self.count,
                    "shapes": [list(s) for s in self.shapes], "dtype": "uint8", "encoding": self.encoding,
                    "label_names": label_names, "label_counts": {str(k): v for k, v in sorted(self.labels.items())},
                    "source_sha256": source_sha256, "options": options}
        try:
            self._flush()
            with writing(self.name, _WRITE_ERRORS):
                if self.backend == "lmdb":
                    self.env.sync(True)
                    self.env.close()
                else:
                    self.h5.flush()  # a full disk fails here; a close that fails cannot be taken back
                    self.h5.close()
                with open(os.path.join(self.partial, MANIFEST), "w", encoding="utf-8") as handle:
                    json.dump(manifest, handle, indent=1)
                os.remove(os.path.join(self.partial, IN_PROGRESS))
                if os.path.exists(self.path):
                    shutil.rmtree(self.path)
                os.replace(self.partial, self.path)
        except DataError:
            self.abandon()
            raise
        return manifest

    def abandon(self) -> None:
        """Close without a manifest; the unfinished ``.partial`` folder is removed (once; later calls do nothing)."""
        if self.env is not None:
            self.env.close()
        if self.h5 is not None:
            hdf5.close_discarding(self.h5)
        shutil.rmtree(self.partial, ignore_errors=True)


def read_manifest(path: str) -> dict:
    """A dataset folder's manifest; DataError when the folder is not a complete netspec dataset."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise DataError(f"{path}: no such dataset folder")
    if not os.path.lexists(manifest_path):
        partial = " (an interrupted conversion?)" if path.endswith(PARTIAL) else ""
        raise DataError(f"{path}: not a finished netspec dataset: no {MANIFEST}{partial}; convert it again with "
                        "netspec convert")
    regular_file(manifest_path, MAX_MANIFEST_BYTES)
    try:
        with open(manifest_path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError, RecursionError) as exc:
        raise DataError(f"{manifest_path}: cannot read the manifest: {one_line(exc)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("backend") not in BACKENDS:
        raise DataError(f"{manifest_path}: not a {FORMAT} manifest")
    for key, (meaning, valid) in _MANIFEST_FIELDS.items():
        if not valid(manifest.get(key)):
            raise DataError(f"{manifest_path}: '{key}' must be {meaning}, not {reprlib.repr(manifest.get(key))}")
    return manifest


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


_MANIFEST_FIELDS = {  # key: (what it must be, its test)
    "count": ("a positive integer", _positive),
    "shapes": ("a list of record shapes [C, H, W]", lambda value: isinstance(value, list) and value and all(
        isinstance(shape, list) and all(_positive(size) for size in shape) and valid_shape(shape) for shape in value)),
    "dtype": ("a string", lambda value: isinstance(value, str)),
    "encoding": ("a string", lambda value: isinstance(value, str)),
    "source_sha256": ("a string", lambda value: isinstance(value, str)),
    "label_names": ("a list of strings", lambda value: value is None or _strings(value)),
    "label_counts": ("a map of labels to counts", lambda value: isinstance(value, dict) and all(
        re.fullmatch(r"-?[0-9]{1,18}", label) and _positive(count) for label, count in value.items())),
}


_OPEN_ENVIRONMENTS: dict[str, list] = {}  # path -> [environment, data.mdb's descriptor, users]; one per process
_OPEN_LOCK = threading.Lock()


def _open_environment(path: str) -> tuple[lmdb.Environment, int]:
    """The read-only LMDB environment of ``path``, shared by every reader in this process, and a descriptor of the
    data.mdb it maps (to check its size by, whatever later lies at its path)."""
    with _OPEN_LOCK:
        if path not in _OPEN_ENVIRONMENTS:
            _OPEN_ENVIRONMENTS[path] = [*_checked_environment(path), 0]
        entry = _OPEN_ENVIRONMENTS[path]
        entry[2] += 1
        return entry[0], entry[1]


def _checked_environment(path: str) -> tuple[lmdb.Environment, int]:
    """``path``'s LMDB opened read-only, and a descriptor of its data.mdb; DataError when data.mdb is shorter
    than the LMDB's own map says, or was replaced while it was opened.

    The map's size comes from the meta pages at the start of the file; reading a page past the end of a
    truncated file would kill the process with SIGBUS.
    """
    data = os.path.join(path, LMDB_FILE)
    regular_file(data)  # (a FIFO refused before anything opens it)
    try:
        descriptor = os.open(data, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise DataError(f"{path}: cannot read {LMDB_FILE}: {exc.strerror}") from None
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True, max_readers=1024)
    except lmdb.Error as exc:
        os.close(descriptor)
        raise DataError(f"{path}: cannot open the LMDB database: {one_line(exc)}") from None
    try:
        same = os.path.samestat(os.fstat(descriptor), os.stat(data))
    except OSError:
        same = False
    size, needed = os.fstat(descriptor).st_size, _mapped_bytes(env)
    if not same or size < needed:
        env.close()
        os.close(descriptor)
        raise DataError(f"{path}: {LMDB_FILE} was replaced while it was opened; open it again" if not same else
                        f"{path}: damaged: {LMDB_FILE} holds {size} bytes, its LMDB pages need {needed} (a truncated "
                        "copy?); copy or convert it again")
    return env, descriptor


def _mapped_bytes(env: lmdb.Environment) -> int:
    """The bytes of data.mdb an LMDB's pages take (its meta pages say): reading past a shorter file is SIGBUS."""
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def _release_environment(path: str) -> None:
    with _OPEN_LOCK:
        entry = _OPEN_ENVIRONMENTS[path]
        entry[2] -= 1
        if not entry[2]:
            entry[0].close()
            os.close(entry[1])
            del _OPEN_ENVIRONMENTS[path]


class Dataset:
    """A finished dataset folder opened for reading: ``count``, ``shapes``, ``label_names`` and records by index.

    Opening checks the files against the manifest without reading the records (see the module's
    docstring); :meth:`verify` reads them all.  Safe to read from several threads (each gets its own LMDB
    transaction).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.manifest = read_manifest(self.path)
        self.backend = self.manifest["backend"]
        self.count = self.manifest["count"]
        self.shapes = [tuple(s) for s in self.manifest["shapes"]]
        self.label_names = list(self.manifest.get("label_names") or [])
        self._local = threading.local()
        self.env = self.h5 = None
        self.lmdb_file, self.lmdb_bytes = None, 0
        try:
            if self.backend == "lmdb":
                self._open_lmdb()
            else:
                self._open_hdf5()
        except DataError:
            self.close()
            raise

    def _open_lmdb(self) -> None:
        self.env, self.lmdb_file = _open_environment(self.path)  # (the descriptor of the file LMDB maps)
        self.lmdb_bytes = _mapped_bytes(self.env)
        entries = self.env.stat()["entries"]
        if entries != self.count:
            raise DataError(f"{self.path}: the manifest counts {self.count} records, {LMDB_FILE} holds {entries}; "
                            "convert it again")

    def _open_hdf5(self) -> None:
        path = os.path.join(self.path, HDF5_FILE)
        self.h5 = hdf5.open_file(path)
        self.h5_lock = threading.Lock()
        self.h5_data = hdf5.stored_dataset(self.h5, path, "data")
        self.h5_label = hdf5.stored_dataset(self.h5, path, "label")
        if self.h5_label.dtype.kind not in "iu":
            raise DataError(f"{path}: dataset 'label' holds {self.h5_label.dtype}, not integers")
        if len(self.shapes) > 1 or self.h5_data.shape != (self.count, *self.shapes[0]) or \
                self.h5_label.shape != (self.count,):
            raise DataError(f"{path}: datasets data {list(self.h5_data.shape)} and label {list(self.h5_label.shape)} "
                            f"do not hold the manifest's {self.count} records of shape {shapes_text(self.shapes)}")

    def where(self, index: int) -> str:
        """How errors name a record: ``<folder> record <key>``."""
        return f"{self.path} record {record_key(index).decode()}"

    @contextlib.contextmanager
    def _reading(self, index: int):
        """Turn LMDB's and HDF5's read errors (a damaged page or chunk) into a DataError naming record ``index``."""
        try:
            yield
        except (lmdb.Error, OSError) as exc:
            raise DataError(f"{self.where(index)}: cannot read: {one_line(exc)}") from None

    def _raw(self, index: int) -> bytes:
        self.check_intact()  # (every read: a page past a cut file's end would kill the process with SIGBUS)
        txn = getattr(self._local, "txn", None)
        with self._reading(index):
            if txn is None:
                txn = self._local.txn = self.env.begin(buffers=False)
            value = txn.get(record_key(index))
        if value is None:
            raise DataError(f"{self.where(index)}: missing (the manifest counts {self.count} records)")
        return value

    def record(self, index: int) -> tuple[numpy.ndarray, int]:
        """``(image C x H x W, label)`` of record ``index`` (0 <= index < count)."""
        if self.backend == "lmdb":
            return decode_record(self._raw(index), self.where(index))
        with self._reading(index), self.h5_lock:
            image, label = self.h5_data[index], self.h5_label[index]
        return image, checked_label(label, self.where(index))

    def records(self):
        """Every ``(image, label)`` in index order: LMDB records by key, HDF5 rows a chunk at a time.

        Not with an LMDB cursor: stepping onto a damaged page, a cursor fails an assertion in liblmdb,
        which aborts the process; a lookup by key reports the damage.
        """
        if self.backend == "lmdb":
            for index in range(self.count):
                yield self.record(index)
            return
        step = HDF5_CHUNK_ROWS * 16
        for start in range(0, self.count, step):
            with self._reading(start), self.h5_lock:
                images, labels = self.h5_data[start:start + step], self.h5_label[start:start + step]
            for index, image, label in zip(range(start, start + step), images, labels):
                yield image, checked_label(label, self.where(index))

    def label(self, index: int) -> int:
        """Record ``index``'s label, without decoding its image."""
        if self.backend == "lmdb":
            return read_header(self._raw(index), self.where(index))[0]["label"]
        with self._reading(index), self.h5_lock:
            label = self.h5_label[index]
        return checked_label(label, self.where(index))

    def verify(self, advance=lambda: None) -> None:
        """Read and decode every record, calling ``advance`` after each: the full check of a dataset.

        DataError names the first record that cannot be read or decoded, has a bad label, a shape the manifest
        does not list or another element type than its ``dtype``, or the first label whose count is not the
        manifest's ``label_counts``.
        """
        counts: Counter = Counter()
        dtype = self.manifest["dtype"]
        for index, (image, label) in enumerate(self.records()):
            if image.shape not in self.shapes:
                raise DataError(f"{self.where(index)}: shape {list(image.shape)}, the manifest lists "
                                f"{shapes_text(self.shapes)}")
            if image.dtype.name != dtype:
                raise DataError(f"{self.where(index)}: values of type {image.dtype.name}, the manifest says {dtype}")
            counts[label] += 1
            advance()
        listed = {int(label): count for label, count in self.manifest["label_counts"].items()}
        for label in sorted(set(counts) | set(listed)):
            if counts[label] != listed.get(label, 0):
                raise DataError(f"{self.path}: {counts[label]} records have label {label}, the manifest's "
                                f"label_counts say {listed.get(label, 0)}")

    def check_intact(self) -> None:
        """DataError when the LMDB file has become shorter than its pages since it was opened (a copy cut short
        while it is read): reading a page past its end would kill the process with SIGBUS, so every read of a
        record asks first (a cut between the two can still end the process: LMDB maps the file)."""
        if self.env is None:
            return
        size = os.fstat(self.lmdb_file).st_size
        if size < self.lmdb_bytes:
            raise DataError(f"{self.path}: {LMDB_FILE} was cut to {size} bytes while it was read (its pages need "
                            f"{self.lmdb_bytes}); copy or convert it again")

    def close(self) -> None:
        """Release the files (once; later calls do nothing)."""
        if self.env is not None:
            self.env = self.lmdb_file = None
            _release_environment(self.path)
        if self.h5 is not None:
            self.h5.close()
            self.h5 = None
