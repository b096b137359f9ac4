"""Caffe-style HDF5 datasets: a text file listing .h5 files, each holding one dataset per top."""

from __future__ import annotations

import os

import h5py
import numpy

from netspec.atomic import atomic_path, temporary_path
from netspec.errors import DataError, did_you_mean

HDF5_EXTENSIONS = (".h5", ".hdf5")


def read_file_list(source: str) -> list[str]:
    """The .h5 paths listed in ``source`` (one a line, '#' comments), relative ones resolved beside it.

    A ``source`` that is itself an .h5/.hdf5 file stands for a list of that one file.
    """
    if source.lower().endswith(HDF5_EXTENSIONS):
        return [source]
    try:
        with open(source, encoding="utf-8") as handle:
            lines = [line.split("#", 1)[0].strip() for line in handle]
    except OSError as exc:
        raise DataError(f"{source}: cannot read the HDF5 file list: {exc.strerror}") from None
    folder = os.path.dirname(os.path.abspath(source))
    files = [os.path.normpath(os.path.join(folder, line)) for line in lines if line]
    if not files:
        raise DataError(f"{source}: the HDF5 file list names no file")
    return files


def escape_name(name: str) -> str:
    """A layer name as an HDF5 group name: ``%`` and ``/`` percent-escaped (HDF5 reads ``/`` as a path)."""
    return name.replace("%", "%25").replace("/", "%2F")


def unescape_name(key: str) -> str:
    """The layer name an :func:`escape_name` group name stands for."""
    return key.replace("%2F", "/").replace("%25", "%")


def open_failure(path: str, exc: OSError) -> str:
    """Why h5py could not open ``path``, in a few words."""
    if not os.path.exists(path):
        return "no such file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    detail = str(exc)
    inner = detail[detail.find("(") + 1:detail.rfind(")")] if "(" in detail else detail
    return f"not a readable HDF5 file ({inner})"


def _open(path: str) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: cannot open HDF5 file: {open_failure(path, exc)}") from None


def _check_names(handle: h5py.File, path: str, names: list[str]) -> None:
    available = [k for k in handle if isinstance(handle[k], h5py.Dataset)]
    for name in names:
        if name not in available:
            raise DataError(f"{path}: no dataset '{name}'{did_you_mean(name, available)} "
                            f"(the file has: {', '.join(available) or 'none'})")
    rows = {name: handle[name].shape[0] if handle[name].shape else 0 for name in names}
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"{k}: {v}" for k, v in rows.items())
        raise DataError(f"{path}: datasets have different numbers of rows ({detail})")
    if not next(iter(rows.values()), 1):
        raise DataError(f"{path}: the datasets hold no rows")


def record_shapes(path: str, names: list[str]) -> list[tuple[int, ...]]:
    """Shape of one record (a row) of each dataset, read from metadata only."""
    with _open(path) as handle:
        _check_names(handle, path, names)
        return [tuple(handle[name].shape[1:]) for name in names]


def row_count(path: str, name: str) -> int:
    """Rows of dataset ``name``, read from metadata only."""
    with _open(path) as handle:
        _check_names(handle, path, [name])
        return handle[name].shape[0]


class RowReader:
    """Rows of the named datasets of one HDF5 file, read on demand (the file is never loaded whole)."""

    def __init__(self, path: str, names: list[str]):
        self.path = path
        self.handle = _open(path)
        _check_names(self.handle, path, names)
        self.datasets = [self.handle[name] for name in names]
        self.row_count = self.datasets[0].shape[0]
        self.row_shapes = [tuple(d.shape[1:]) for d in self.datasets]

    def read(self, rows: slice | numpy.ndarray) -> list[numpy.ndarray]:
        """The rows ``rows`` (a slice, or indices in any order) of every dataset."""
        if isinstance(rows, slice):
            return [d[rows] for d in self.datasets]
        order = numpy.argsort(rows)  # h5py reads increasing indices; put them back in the asked order
        inverse = numpy.empty_like(order)
        inverse[order] = numpy.arange(len(order))
        return [d[numpy.asarray(rows)[order]][inverse] for d in self.datasets]

    def close(self) -> None:
        """Close the file."""
        self.handle.close()


class ArrayWriter:
    """Appends rows to named datasets of a new HDF5 file, chunk by chunk; renamed into place by :meth:`finish`."""

    def __init__(self, path: str, chunk_rows: int = 1024):
        self.path, self.chunk_rows = path, chunk_rows
        self.temporary = temporary_path(path)
        self.handle = h5py.File(self.temporary, "w")

    def append(self, arrays: dict[str, numpy.ndarray]) -> None:
        """Add the rows of each array to its dataset (created, resizable, at the first call)."""
        for name, array in arrays.items():
            array = numpy.asarray(array)
            if name not in self.handle:
                self.handle.create_dataset(name, shape=(0, *array.shape[1:]), maxshape=(None, *array.shape[1:]),
                                           dtype=array.dtype, chunks=(min(self.chunk_rows, max(len(array), 1)),
                                                                      *array.shape[1:]))
            dataset = self.handle[name]
            start = dataset.shape[0]
            dataset.resize(start + len(array), axis=0)
            dataset[start:] = array

    def finish(self) -> None:
        """Close the file and move it into place."""
        self.handle.close()
        os.replace(self.temporary, self.path)

    def abandon(self) -> None:
        """Close the file and delete it."""
        self.handle.close()
        os.remove(self.temporary)


def write_arrays(path: str, arrays: dict[str, numpy.ndarray]) -> None:
    """Write one dataset per name (rows along the first axis) to an HDF5 file, atomically."""
    writer = ArrayWriter(path)
    writer.append(arrays)
    writer.finish()


def write_file_list(path: str, files: list[str]) -> None:
    """Write a list file naming ``files`` relative to the list's folder, atomically."""
    folder = os.path.dirname(os.path.abspath(path))
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.writelines(os.path.relpath(os.path.abspath(f), folder) + "\n" for f in files)
