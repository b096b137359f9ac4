"""Caffe-style HDF5 datasets: a text file listing .h5 files, each holding one dataset per top.

Only numeric datasets stored in the file itself are read: a link to another
file, a dataset whose data lives in external files and a virtual dataset are
refused before anything outside the file is opened.  Read and write failures
are DataErrors naming the file; a file being written is thrown away whole when
a write fails (:func:`close_discarding`).
"""

from __future__ import annotations

import contextlib
import os

import h5py
import numpy

from netspec.atomic import atomic_open, temporary_path, write_bytes
from netspec.data import hdf5_policy
from netspec.data.files import one_line, regular_file, writing
from netspec.data.staging import staged
from netspec.errors import DataError, did_you_mean

WRITE_ERRORS = (OSError, RuntimeError)  # h5py raises RuntimeError when a flush or close cannot write

HDF5_EXTENSIONS = (".h5", ".hdf5")


def read_file_list(source: str) -> list[str]:
    """The .h5 paths listed in ``source`` (one a line, '#' comments), relative ones resolved beside it.

    A ``source`` that is itself an .h5/.hdf5 file stands for a list of that one file.
    """
    if source.lower().endswith(HDF5_EXTENSIONS):
        return [source]
    regular_file(source, what="the HDF5 file list")  # (a FIFO would be waited on forever)
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


def open_file(path: str) -> h5py.File:
    """``path`` opened for reading; DataError naming it when it is not a readable HDF5 file."""
    if os.path.exists(path):
        regular_file(path)  # h5py would wait forever on a FIFO
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: cannot open HDF5 file: {open_failure(path, exc)}") from None


def stored_dataset(handle: h5py.File, path: str, name: str) -> h5py.Dataset:
    """The numeric dataset ``name`` stored in the file itself; DataError naming ``path`` otherwise."""
    available = [k for k in handle if isinstance(handle.get(k, getlink=True), h5py.HardLink)
                 and isinstance(handle[k], h5py.Dataset)]
    link = handle.get(name, getlink=True)
    if link is not None and not isinstance(link, h5py.HardLink):
        raise DataError(f"{path}: '{name}' is a link; netspec reads only datasets stored in the file itself")
    if name not in available:
        raise DataError(f"{path}: no dataset '{name}'{did_you_mean(name, available)} "
                        f"(the file has: {', '.join(available) or 'none'})")
    dataset = handle[name]
    hdf5_policy.check_dataset(dataset, f"{path}: dataset '{name}'", DataError)
    hdf5_policy.check_stored(dataset, f"{path}: dataset '{name}'", DataError)
    return dataset


def _check_names(handle: h5py.File, path: str, names: list[str]) -> None:
    datasets = {name: stored_dataset(handle, path, name) for name in names}
    rows = {name: dataset.shape[0] if dataset.shape else 0 for name, dataset in datasets.items()}
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"{k}: {v}" for k, v in rows.items())
        raise DataError(f"{path}: datasets have different numbers of rows ({detail})")
    if not next(iter(rows.values()), 1):
        raise DataError(f"{path}: the datasets hold no rows")


def record_shapes(path: str, names: list[str]) -> list[tuple[int, ...]]:
    """Shape of one record (a row) of each dataset, read from metadata only."""
    with open_file(path) as handle:
        _check_names(handle, path, names)
        return [tuple(handle[name].shape[1:]) for name in names]


def row_count(path: str, name: str) -> int:
    """Rows of dataset ``name``, read from metadata only."""
    with open_file(path) as handle:
        _check_names(handle, path, [name])
        return handle[name].shape[0]


class RowReader:
    """Rows of the named datasets of one HDF5 file, read on demand (the file is never loaded whole)."""

    def __init__(self, path: str, names: list[str]):
        self.path = path
        self.handle = open_file(path)
        _check_names(self.handle, path, names)
        self.datasets = [self.handle[name] for name in names]
        self.row_count = self.datasets[0].shape[0]
        self.row_shapes = [tuple(d.shape[1:]) for d in self.datasets]

    def read(self, rows: slice | numpy.ndarray) -> list[numpy.ndarray]:
        """The rows ``rows`` (a slice, or indices in any order) of every dataset."""
        try:
            if isinstance(rows, slice):
                return [d[rows] for d in self.datasets]
            order = numpy.argsort(rows)  # h5py reads increasing indices; put them back in the asked order
            inverse = numpy.empty_like(order)
            inverse[order] = numpy.arange(len(order))
            return [d[numpy.asarray(rows)[order]][inverse] for d in self.datasets]
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read rows: {one_line(exc)}") from None

    def close(self) -> None:
        """Close the file."""
        self.handle.close()


class ArrayWriter:
    """Appends rows to named datasets of a new HDF5 file, chunk by chunk; renamed into place by :meth:`finish`.

    A failed write (a full disk) is a DataError naming the file; the caller then calls :meth:`abandon`
    (:meth:`finish` does it itself).
    """

    def __init__(self, path: str, chunk_rows: int = 1024, name: str | None = None):
        self.path, self.chunk_rows = path, chunk_rows
        self.name = name or path  # what messages call it (a file staged elsewhere: its place)
        self.datasets: dict[str, h5py.Dataset] = {}  # kept open until the file closes (see close_discarding)
        with writing(self.name):
            self.temporary = temporary_path(path)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.temporary)  # (a leftover, or a link someone put there: never written through)
            try:
                self.handle = h5py.File(self.temporary, "w-")  # (w-: fails where anything is there again)
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.temporary)
                raise

    def append(self, arrays: dict[str, numpy.ndarray]) -> None:
        """Add the rows of each array to its dataset (created, resizable, at the first call)."""
        with writing(self.name, WRITE_ERRORS):
            for name, array in arrays.items():
                array = numpy.asarray(array)
                if name not in self.datasets:
                    self.datasets[name] = self.handle.create_dataset(
                        name, shape=(0, *array.shape[1:]), maxshape=(None, *array.shape[1:]), dtype=array.dtype,
                        chunks=(min(self.chunk_rows, max(len(array), 1)), *array.shape[1:]))
                dataset = self.datasets[name]
                start = dataset.shape[0]
                dataset.resize(start + len(array), axis=0)
                dataset[start:] = array

    def finish(self) -> None:
        """Close the file and move it into place; when that fails (a DataError), the file is thrown away."""
        try:
            with writing(self.name, WRITE_ERRORS):
                self.handle.flush()  # a full disk fails here; a close that fails cannot be taken back
                self.handle.close()
                os.replace(self.temporary, self.path)
        except DataError:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Close the file and delete it (once; later calls do nothing)."""
        close_discarding(self.handle)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.temporary)


def close_discarding(handle: h5py.File) -> None:
    """Close an HDF5 file that is being thrown away (if it is still open), whether or not a write failed.

    After a failed write (a full disk) HDF5 tries the write again when the file or one of its datasets
    closes; when that fails too, HDF5 is left in a state that crashes the process later.  So a writer keeps
    its datasets open until the file closes and flushes before closing, and here a flush that fails points
    the file's descriptor at /dev/null, where the close can write what it must.
    """
    if not handle.id.valid:
        return
    try:
        handle.flush()
    except WRITE_ERRORS:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, handle.id.get_vfd_handle())
        os.close(null)
    handle.close()


def write_arrays(path: str, arrays: dict[str, numpy.ndarray], name: str | None = None) -> None:
    """Write one dataset per name (rows along the first axis) to an HDF5 file, atomically; errors name the file
    as ``name`` (default: ``path``)."""
    writer = ArrayWriter(path, name=name)
    try:
        writer.append(arrays)
        writer.finish()
    except BaseException:
        writer.abandon()
        raise


def write_splits(out_dir: str, splits: dict[str, dict[str, numpy.ndarray]],
                 files: dict[str, bytes] | None = None) -> dict[str, int]:
    """Write each split as ``<name>.h5`` (one dataset per array) with its list file ``<name>.txt`` in ``out_dir``,
    and ``files`` (name: contents) beside them, staged (:mod:`netspec.data.staging`): all of them or, when a
    write fails, none.

    Returns the number of rows written per split.
    """
    counts = {}
    with staged(out_dir) as folder:
        for name, arrays in splits.items():
            h5 = os.path.join(folder, f"{name}.h5")
            write_arrays(h5, arrays, name=os.path.join(out_dir, f"{name}.h5"))
            write_file_list(os.path.join(folder, f"{name}.txt"), [h5], name=os.path.join(out_dir, f"{name}.txt"))
            counts[name] = len(next(iter(arrays.values())))
        for name, contents in (files or {}).items():
            with writing(os.path.join(out_dir, name)):
                write_bytes(os.path.join(folder, name), contents)
    return counts


def write_file_list(path: str, files: list[str], name: str | None = None) -> None:
    """Write a list file naming ``files`` relative to the list's folder, atomically; errors name it as ``name``
    (default: ``path``)."""
    folder = os.path.dirname(os.path.abspath(path))
    with writing(name or path), atomic_open(path, "w") as handle:
        handle.writelines(os.path.relpath(os.path.abspath(f), folder) + "\n" for f in files)
