"""MemoryData: batches served from arrays the Python program hands to the net."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ParamError
from netspec.spec.schema import required


@dataclass
class MemoryDataParams:
    """Parameters of MemoryData (Caffe's names)."""

    batch_size: int = required(doc="rows served by each forward pass")
    channels: int = required(doc="C of each row (C, H, W)")
    height: int = required(doc="H of each row")
    width: int = required(doc="W of each row")


@register_layer
class MemoryData(Layer):
    """MemoryData: each forward pass serves the next ``batch_size`` rows of arrays set from Python.

    Tops: data (batch_size, channels, height, width) and optionally labels
    (batch_size,).  ``net.set_input_arrays(data, labels)`` hands the layer
    its arrays (data (N, C, H, W), labels (N,)), copied; forward passes then
    go through the rows in order, from the first after each call, and wrap
    around to the start after the last (Caffe demands N be a multiple of
    ``batch_size``; here any N works).  No transformation is applied (as in
    Caffe, for arrays).  Until arrays are set, a forward pass is an error.

    Example (then ``solver.net.set_input_arrays(x_train, y_train)``)::

        - name: data
          type: MemoryData
          top: [data, label]
          memory_data_param: {batch_size: 64, channels: 1, height: 28, width: 28}
    """

    type = "MemoryData"
    param_blocks = {"memory_data_param": MemoryDataParams}
    num_bottoms = (0, 0)
    from_host = True
    num_tops = (1, 2)
    data = labels = None  # the arrays set, on the host
    position = 0  # the next row served

    def row_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one row."""
        p = self.block("memory_data_param")
        return p.channels, p.height, p.width

    def top_shapes(self, bottom_shapes):
        p = self.block("memory_data_param")
        for key in ("batch_size", "channels", "height", "width"):
            if getattr(p, key) <= 0:
                raise ParamError(f"memory_data_param.{key}", f"must be positive, got {getattr(p, key)}")
        return [(p.batch_size, *self.row_shape()), (p.batch_size,)][:len(self.spec.tops)]

    def set_arrays(self, data, labels=None) -> None:
        """Serve ``data`` (N, C, H, W) and ``labels`` (N,) from the next forward pass on (copies of both)."""
        data = numpy.asarray(data)
        if data.ndim != 4 or data.shape[1:] != self.row_shape() or not len(data):
            raise DataError(f"layer '{self.name}': data of shape {data.shape} does not fit the layer's rows: "
                            f"give (N, {', '.join(map(str, self.row_shape()))}) with N >= 1")
        if labels is None and len(self.spec.tops) == 2:
            raise DataError(f"layer '{self.name}': its top '{self.spec.tops[1]}' needs labels")
        if labels is not None:
            labels = numpy.asarray(labels)
            if len(self.spec.tops) == 1:
                raise DataError(f"layer '{self.name}': has no label top, so it takes no labels")
            if labels.shape != (len(data),):
                raise DataError(f"layer '{self.name}': labels of shape {labels.shape} do not fit {len(data)} "
                                f"rows of data: give ({len(data)},)")
            labels = labels.astype(self.dtype)
        self.data, self.labels, self.position = data.astype(self.dtype), labels, 0

    def forward(self, bottom, top):
        if self.data is None:
            raise DataError(f"layer '{self.name}': MemoryData has no arrays: hand them over with "
                            f"net.set_input_arrays(data, labels) before running the net")
        rows = (self.position + numpy.arange(top[0].shape[0])) % len(self.data)
        self.backend.upload_batch(self.data[rows], top[0].data)
        if len(top) == 2:
            self.backend.upload_batch(self.labels[rows], top[1].data)
        self.position = int(rows[-1] + 1) % len(self.data)
