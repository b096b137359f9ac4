"""``netspec convert arrays``: numeric data in .npz, .npy or .csv files as an HDF5 file HDF5Data reads.

The output holds a dataset ``data`` (rows along the first axis) and, when the
input has labels, ``label``.  Rows are copied ``chunk`` at a time, so .npy and
.csv inputs of any size keep memory flat (.npz members are read one at a time).
"""

from __future__ import annotations

import csv
import os
import zipfile
import zlib

import numpy

from netspec.data.hdf5 import ArrayWriter
from netspec.data.hdf5_policy import NUMBER_KINDS
from netspec.errors import DataError, did_you_mean

FORMATS = (".npz", ".npy", ".csv")


def _npz_arrays(path: str, data_key: str, label_key: str | None, label_given: bool):
    try:
        archive = numpy.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: cannot read the .npz file: {exc or 'it is empty'}") from None
    keys = list(archive.keys())
    if data_key not in keys:
        raise DataError(f"{path}: no array '{data_key}'{did_you_mean(data_key, keys)} (the file has: "
                        f"{', '.join(keys)}); choose one with --data-key")
    if label_key not in keys:
        if label_given:
            raise DataError(f"{path}: no array '{label_key}'{did_you_mean(label_key, keys)} (the file has: "
                            f"{', '.join(keys)}); choose one with --label-key")
        label_key = None
    data = _member(archive, path, data_key)
    labels = _member(archive, path, label_key) if label_key else None
    if labels is not None and len(labels) != len(data):
        raise DataError(f"{path}: '{data_key}' has {len(data)} rows but '{label_key}' has {len(labels)}")
    return data, labels


def _member(archive, path: str, key: str) -> numpy.ndarray:
    """Array ``key`` of an .npz archive, checked by :func:`_rows`; refused before it is unpacked when it would not
    fit in the memory free (a few compressed megabytes may unpack to gigabytes)."""
    unpacked, free = archive.zip.getinfo(f"{key}.npy").file_size, _free_memory()
    if free is not None and unpacked > free:
        raise DataError(f"{path}: array '{key}' unpacks to {unpacked:,} bytes, more than the {free:,} bytes of "
                        "memory free")
    try:
        array = archive[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"{path}: cannot read array '{key}': {exc}") from None
    except MemoryError:
        raise DataError(f"{path}: array '{key}' does not fit in memory (its header declares more values than "
                        "the machine holds)") from None
    return _rows(array, f"{path}: array '{key}'")


def _free_memory() -> int | None:
    """Bytes of memory free now (None where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _rows(array: numpy.ndarray, what: str) -> numpy.ndarray:
    """``array`` if it holds rows of numbers; DataError starting with ``what`` otherwise."""
    if array.ndim == 0 or array.dtype.kind not in NUMBER_KINDS:
        raise DataError(f"{what} holds {'one ' if array.ndim == 0 else ''}{array.dtype}, not rows of numbers")
    if 0 in array.shape[1:]:
        raise DataError(f"{what} has the shape {list(array.shape)}: its rows hold no values")
    return array


def _csv_chunks(path: str, label_key: str, label_given: bool, chunk: int):
    """``(data rows, labels or None)`` chunks of a CSV file with a header row; a DataError naming the line of a
    malformed one (not UTF-8, a field past the csv module's limit)."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        try:
            yield from _csv_rows(path, reader, label_key, label_given, chunk)
        except UnicodeDecodeError as exc:  # (decoded a block at a time: no line to name)
            raise DataError(f"{path}: not UTF-8 text (byte {exc.start} of a block read)") from None
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: {exc}") from None


def _csv_rows(path: str, reader, label_key: str, label_given: bool, chunk: int):
    """:func:`_csv_chunks` of the rows ``reader`` gives."""
    header = next(reader, None)
    if not header:
        raise DataError(f"{path}:1: expected a header row naming the columns")
    if label_key not in header and label_given:
        raise DataError(f"{path}:1: no column '{label_key}'{did_you_mean(label_key, header)}; choose one with "
                        "--label-key")
    label_column = header.index(label_key) if label_key in header else None
    if len(header) == (label_column is not None):
        raise DataError(f"{path}:1: the header names no column of values beside '{label_key}'")

    def chunk_arrays(rows, labels):
        return (numpy.array(rows, dtype=numpy.float32),
                numpy.array(labels, dtype=numpy.float32) if label_column is not None else None)

    rows, labels = [], []
    for line, row in enumerate(reader, 2):
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{line}: {len(row)} values, the header names {len(header)} columns")
        try:
            values = [float(v) for v in row]
        except ValueError:
            column = next(i for i, v in enumerate(row) if not _is_number(v))
            raise DataError(f"{path}:{line}: column '{header[column]}' holds '{row[column]}', not a number") \
                from None
        if label_column is not None:
            labels.append(values.pop(label_column))
        rows.append(values)
        if len(rows) == chunk:
            yield chunk_arrays(rows, labels)
            rows, labels = [], []
    if rows:
        yield chunk_arrays(rows, labels)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def convert_arrays(source: str, out: str, data_key: str = "data", label_key: str | None = None,
                   chunk: int = 4096, overwrite: bool = False) -> dict[str, tuple[int, ...]]:
    """Write ``source``'s rows to the HDF5 file ``out``; return the shape of each dataset written."""
    extension = os.path.splitext(source)[1].lower()
    if extension not in FORMATS:
        raise DataError(f"{source}: expected a {', '.join(FORMATS)} file")
    if not os.path.isfile(source):
        raise DataError(f"{source}: no such file")
    if os.path.exists(out) and not overwrite:
        raise DataError(f"{out}: already exists; choose another output or pass --overwrite")
    label_given, label_key = label_key is not None, label_key or "label"
    if extension == ".npy":
        if label_given:
            raise DataError(f"{source}: a .npy file holds one array, so it has no labels (use .npz for both)")
        try:
            data = numpy.load(source, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(f"{source}: cannot read the .npy file: {exc or 'it is empty'}") from None
        data = _rows(data, source)
        chunks = ((data[i:i + chunk], None) for i in range(0, len(data), chunk))
    elif extension == ".npz":
        data, labels = _npz_arrays(source, data_key, label_key, label_given)
        chunks = ((data[i:i + chunk], None if labels is None else labels[i:i + chunk])
                  for i in range(0, len(data), chunk))
    else:
        chunks = _csv_chunks(source, label_key, label_given, chunk)
    writer = ArrayWriter(out, chunk_rows=chunk)
    try:
        for rows, row_labels in chunks:
            writer.append({"data": rows, **({"label": row_labels} if row_labels is not None else {})})
        if "data" not in writer.datasets:
            raise DataError(f"{source}: no rows to convert")
        shapes = {name: dataset.shape for name, dataset in writer.datasets.items()}
        writer.finish()
    except BaseException:
        writer.abandon()
        raise
    return shapes
