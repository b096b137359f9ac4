"""HDF5Data: batches read from the HDF5 files named in a list file (Caffe's form)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from netspec.data import hdf5
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ParamError
from netspec.spec.schema import FilePath, doc, required


@dataclass
class HDF5DataParams:
    """Parameters of HDF5Data."""

    source: FilePath = required(doc="text file listing .h5 files, one a line (relative to itself), or one .h5 file")
    batch_size: int = required(doc="rows per batch")
    shuffle: bool = doc(False, "shuffle file order each pass and rows within each file")


@register_layer
class HDF5Data(Layer):
    """HDF5Data: reads batches from HDF5 files, one dataset per top.

    ``source`` is a text file listing .h5 files (or a single .h5 file); each
    file holds a dataset named after each top with the same number of rows.
    Batches take ``batch_size`` consecutive rows, crossing into the next file
    and cycling back to the first file at the end.  With ``shuffle`` the file
    order and the rows within each file are permuted every pass (reproducibly
    for a seed).  Rows are read as batches need them, so files of any size
    keep memory flat.  In a distributed run the ranks take turns row by row:
    N ranks of batch B read the rows one process of batch N*B would.

    Tops: one per dataset, shape ``(batch_size, *row shape)``.

    Example::

        - name: data
          type: HDF5Data
          top: [data, label]
          hdf5_data_param: {source: train.txt, batch_size: 64}
    """

    type = "HDF5Data"
    param_blocks = {"hdf5_data_param": HDF5DataParams}
    num_bottoms = (0, 0)
    from_host = True
    num_tops = (1, None)

    def top_shapes(self, bottom_shapes):
        params = self.block("hdf5_data_param")
        if params.batch_size is None or params.batch_size <= 0:
            raise ParamError("hdf5_data_param.batch_size", "must be a positive integer")
        try:
            files = hdf5.read_file_list(params.source)
            rows = hdf5.record_shapes(files[0], self.spec.tops)
        except DataError as exc:
            raise ParamError("hdf5_data_param.source", str(exc)) from None
        return [(params.batch_size, *row) for row in rows]

    def setup(self, bottom, top, backend, dtype):
        params = self.block("hdf5_data_param")
        self.files = hdf5.read_file_list(params.source)
        self.file_order = list(range(len(self.files)))
        self.file_cursor = 0
        super().setup(bottom, top, backend, dtype)
        if params.shuffle:
            self.backend.host_rng.shuffle(self.file_order)
        self.load_current()

    def load_current(self) -> None:
        """Open the file at the cursor for reading, checking its row shapes."""
        path = self.files[self.file_order[self.file_cursor]]
        self.close()
        self.reader = hdf5.RowReader(path, self.spec.tops)
        expected = [shape[1:] for shape in self.top_shapes([])]
        for name, shape, first in zip(self.spec.tops, self.reader.row_shapes, expected):
            if shape != first:
                raise DataError(f"{path}: dataset '{name}' has rows of shape {shape}, but the first file's are {first}")
        self.row_count = self.reader.row_count
        self.row_order = None
        if self.block("hdf5_data_param").shuffle:
            self.row_order = self.backend.host_rng.permutation(self.row_count)
        self.row_cursor = 0

    def next_file(self) -> None:
        """Advance to the next file, reshuffling the order after a full pass."""
        self.file_cursor += 1
        if self.file_cursor == len(self.files):
            self.file_cursor = 0
            if self.block("hdf5_data_param").shuffle:
                self.backend.host_rng.shuffle(self.file_order)
        self.load_current()

    def label_classes(self, top):
        """The largest value of dataset ``top`` in every listed file plus one, where all are whole numbers from 0
        below 2**31 (class labels, one a row); None otherwise (training's label check names a bad one)."""
        largest = -1
        for path in hdf5.read_file_list(self.block("hdf5_data_param").source):
            handle = hdf5.open_file(path)
            try:
                values = hdf5.stored_dataset(handle, path, top)[()]
            finally:
                handle.close()
            if values.size != len(values) or values.size == 0 or values.min() < 0 or (values % 1).any() or \
                    values.max() >= 2 ** 31:
                return None
            largest = max(largest, int(values.max()))
        return largest + 1

    def close(self):
        if getattr(self, "reader", None) is not None:
            self.reader.close()
            self.reader = None

    def record_count(self):
        return sum(hdf5.row_count(path, self.spec.tops[0]) for path in self.files)

    def runtime_state(self):
        state = {"file_order": list(self.file_order), "file_cursor": self.file_cursor, "row_cursor": self.row_cursor}
        if self.row_order is not None:
            state["row_order"] = self.row_order
        return state

    def restore_runtime_state(self, state):
        order, cursor = [int(i) for i in state["file_order"]], int(state["file_cursor"])
        if sorted(order) != list(range(len(self.files))) or not 0 <= cursor < len(self.files):
            raise DataError(f"{self.block('hdf5_data_param').source}: the saved position is for "
                            f"{len(order)} files, the list now names {len(self.files)}")
        self.file_order, self.file_cursor = order, cursor
        self.load_current()
        rows = len(state["row_order"]) if "row_order" in state else self.row_count
        if rows != self.row_count or not 0 <= int(state["row_cursor"]) <= self.row_count:
            raise DataError(f"{self.files[self.file_order[self.file_cursor]]}: the saved position is for a file of "
                            f"{rows} rows, the file now has {self.row_count}")
        if "row_order" in state:
            row_order = numpy.asarray(state["row_order"])
            if row_order.dtype.kind not in "iu" or not numpy.array_equal(numpy.sort(row_order), numpy.arange(rows)):
                raise DataError(f"{self.files[self.file_order[self.file_cursor]]}: the saved row order is not an "
                                f"order of the file's {rows} rows")
            self.row_order = row_order
        self.row_cursor = int(state["row_cursor"])

    def forward(self, bottom, top):
        batch = self.block("hdf5_data_param").batch_size
        rank, ranks = self.backend.comm.rank, self.backend.comm.size
        filled = passed = 0  # rows of this rank's batch written; rows of all ranks' batch passed
        while passed < batch * ranks:
            if self.row_cursor == self.row_count:
                self.next_file()
            take = min(batch * ranks - passed, self.row_count - self.row_cursor)
            first = self.row_cursor + (rank - passed) % ranks  # this rank's rows are every ranks-th
            rows = slice(first, self.row_cursor + take, ranks)
            mine = len(range(rows.start, rows.stop, rows.step))
            if self.row_order is not None:
                rows = self.row_order[rows]
            if mine:
                for blob, array in zip(top, self.reader.read(rows)):
                    blob.data[filled:filled + mine] = self.backend.asarray(array.astype(self.dtype, copy=False))
            filled += mine
            passed += take
            self.row_cursor += take
