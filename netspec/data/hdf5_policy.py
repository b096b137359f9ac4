"""Reading HDF5 files from someone else: only what is inside the file, only as much as the reader expects.

HDF5 can point outside a file (soft and external links, external raw
storage, virtual datasets) and can describe a dataset far larger than the
file (a never-written or highly compressed chunked dataset reads back as
gigabytes of fill values).  Weight and solver-state files come from other
people through the model zoo, so their readers go through this module:

- :func:`check_structure` walks the file's links without following any and
  refuses anything but hard links to groups and to contiguous, chunked or
  compact datasets of plain numbers (:func:`check_dataset`, which dataset
  readers call for each dataset they read);
- :func:`read_dataset` reads one dataset only after checking its shape
  against what the reader expects (or a byte limit) and its compression
  ratio.

Every refusal raises the caller's error type with the file and the object's
path in it.
"""

from __future__ import annotations

import os

import h5py
import numpy

from netspec.errors import NetspecError

MAX_DEPTH = 8  # group nesting; weights files have 2 levels, solver states 4
MAX_OBJECTS = 100_000  # groups and datasets; ResNet-152's weights have about 1,000
MAX_COMPRESSION_RATIO = 1_000  # logical bytes per stored byte, checked for datasets over COMPRESSION_CHECK_BYTES
COMPRESSION_CHECK_BYTES = 1 << 20
STORED_LAYOUTS = (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED, h5py.h5d.COMPACT)
NUMBER_KINDS = "biuf"  # the numpy.dtype kinds a dataset may hold: booleans, integers, floating point


def regular_file(path: str, error: type[NetspecError]) -> None:
    """Refuse ``path`` unless it is a regular file (a FIFO or a device would block or never end)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise error(f"{path}: not a regular file")


def check_structure(handle: h5py.File, error: type[NetspecError]) -> None:
    """Refuse links, external storage, virtual datasets and non-numeric datasets anywhere in ``handle``.

    The file must be a tree of groups and datasets: an object reached by two
    paths (hard links that make a lattice of billions of paths) is refused too.
    """
    count = 0
    seen = set()
    pending = [(handle, 0)]
    while pending:
        group, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise error(f"{handle.filename}: groups nested deeper than {MAX_DEPTH} levels at {group.name}")
        for name in group:  # names only: iterating follows no link
            count += 1
            if count > MAX_OBJECTS:
                raise error(f"{handle.filename}: more than {MAX_OBJECTS:,} objects")
            path = f"{group.name.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
                raise error(f"{handle.filename}: {path} is {kind}; netspec reads only what is inside the file")
            item = group[name]
            address = h5py.h5o.get_info(item.id).addr
            if address in seen:
                raise error(f"{handle.filename}: {path} is a second link to an object; netspec reads files whose "
                            "groups and datasets each have one path")
            seen.add(address)
            if isinstance(item, h5py.Group):
                pending.append((item, depth + 1))
            elif isinstance(item, h5py.Dataset):
                check_dataset(item, f"{handle.filename}: {path}", error)
            else:
                raise error(f"{handle.filename}: {path} is neither a group nor a dataset")


def check_dataset(dataset: h5py.Dataset, where: str, error: type[NetspecError]) -> None:
    """Refuse a dataset (``where`` names it) whose data lies in other files (virtual, external storage) or
    that does not hold plain numbers."""
    plist = dataset.id.get_create_plist()
    if plist.get_layout() not in STORED_LAYOUTS or plist.get_external_count():
        raise error(f"{where} keeps its data in other files; netspec reads only what is inside the file")
    if dataset.dtype.kind not in NUMBER_KINDS or dataset.dtype.fields is not None:
        raise error(f"{where} holds {dataset.dtype}, not numbers")


def read_dataset(dataset: h5py.Dataset, error: type[NetspecError], shape: tuple[int, ...] | None = None,
                 max_bytes: int | None = None) -> numpy.ndarray:
    """The values of ``dataset`` (checked by :func:`check_structure`), after checking its size first.

    ``shape`` is the shape the reader expects; without one, ``max_bytes``
    bounds the dataset's size; :func:`check_stored` refuses what the file does
    not really hold.
    """
    where = f"{dataset.file.filename}: {dataset.name}"
    if shape is not None and tuple(dataset.shape) != tuple(shape):
        raise error(f"{where} has shape {tuple(dataset.shape)}, expected {tuple(shape)}")
    logical = dataset.size * dataset.dtype.itemsize
    if max_bytes is not None and logical > max_bytes:
        raise error(f"{where} holds {logical:,} bytes, more than the {max_bytes:,} this file may hold there")
    check_stored(dataset, where, error)
    return dataset[()]


def check_stored(dataset: h5py.Dataset, where: str, error: type[NetspecError]) -> None:
    """Refuse a dataset that stores nothing of what it declares (never written: it would read back as fill
    values) or that would expand more than :data:`MAX_COMPRESSION_RATIO` times when read."""
    logical = dataset.size * dataset.dtype.itemsize
    stored = dataset.id.get_storage_size()
    if logical and not stored and dataset.id.get_create_plist().get_layout() != h5py.h5d.COMPACT:
        raise error(f"{where} declares {logical:,} bytes but stores none")
    if logical > COMPRESSION_CHECK_BYTES and logical > MAX_COMPRESSION_RATIO * stored:
        raise error(f"{where} expands from {stored:,} stored bytes to {logical:,}, more than "
                    f"{MAX_COMPRESSION_RATIO:,} times")
