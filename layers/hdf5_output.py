"""HDF5Output: appends the values of its bottoms to an HDF5 file, batch after batch (Caffe's form)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from netspec.data.hdf5 import ArrayWriter
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.spec.schema import OutputPath, required

DATASET_NAMES = ("data", "label")


@dataclass
class HDF5OutputParams:
    """Parameters of HDF5Output."""

    file_name: OutputPath = required(doc="the .h5 file to write (replaced when the net is closed), relative to the "
                                         "run folder when training, else to the current directory")


@register_layer
class HDF5Output(Layer):
    """HDF5Output: saves what reaches it, e.g. features and labels of a test pass.

    Each forward pass appends its first bottom to dataset ``data`` and its
    second (if any) to ``label``, as Caffe names them.  The file is written
    under a temporary name and moved to ``file_name`` when the net is closed
    (``netspec test`` and training do that at the end), so a crash never
    leaves a half-written file there.  It has no tops and passes no gradient.
    ``file_name`` resolves inside the run folder when training and the current
    directory otherwise; a path outside it needs ``--allow-absolute-outputs``,
    and a net from a zoo runs this layer only with ``--allow-side-effects``.

    Example::

        - {name: save, type: HDF5Output, bottom: [ip1, label], hdf5_output_param: {file_name: features.h5}}
    """

    type = "HDF5Output"
    param_blocks = {"hdf5_output_param": HDF5OutputParams}
    num_bottoms = (1, 2)
    num_tops = (0, 0)
    label_bottoms = (0, 1)  # nothing flows back to them
    writes_files = True

    def top_shapes(self, bottom_shapes):
        return []

    def setup(self, bottom, top, backend, dtype):
        super().setup(bottom, top, backend, dtype)
        self.path = self.output_folder.resolve(self.block("hdf5_output_param").file_name, "hdf5_output_param.file_name")
        self.writer = None

    def forward(self, bottom, top):
        if self.writer is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.writer = ArrayWriter(self.path)
        self.writer.append({name: self.backend.to_host(blob.data) for name, blob in zip(DATASET_NAMES, bottom)})

    def backward(self, top, propagate_down, bottom):
        """Nothing flows back: the bottoms' diffs are left as they are."""

    def close(self):
        if self.writer is not None:
            self.writer.finish()
            self.writer = None
