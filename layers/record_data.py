"""Data: batches of (image, label) records from a dataset folder (LMDB or HDF5), transformed and prefetched."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal

import numpy

from netspec.data.batches import Prefetcher, RecordOrder
from netspec.data.dataset import Dataset, read_manifest
from netspec.data.transform import Transformer, TransformParams
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import DataError, ParamError
from netspec.spec.schema import FilePath, doc, required


class RecordBatches(Layer, abc.ABC):
    """Base of the layers that deliver transformed records in batches: tops ``data`` and optionally ``label``.

    A subclass names its parameter block (``data_block``, which holds
    ``batch_size`` and ``prefetch``), says where records come from
    (:meth:`open_source`, returning an object with ``count``, ``record(i)``,
    ``where(i)`` and ``close()``), their shape (:meth:`record_shape`) and the
    order's shuffle mode.
    Batches are made ahead by a :class:`Prefetcher` thread; batch ``k`` is a
    pure function of the layer's seed and ``k``, which is the whole of the
    run-time state.  In a distributed run each rank reads its share of the
    record stream (:class:`RecordOrder`) and the matching rows of the random
    crops and flips, so N ranks of batch B see what one process of batch N*B
    would.
    """

    num_bottoms = (0, 0)
    from_host = True
    num_tops = (1, 2)
    data_block = ""

    def batch_size(self) -> int:
        """Records per batch."""
        return self.block(self.data_block).batch_size

    @abc.abstractmethod
    def record_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every record."""

    @abc.abstractmethod
    def shuffle_mode(self) -> str | int:
        """A :class:`RecordOrder` shuffle: "none", "epoch" or a block size."""

    @abc.abstractmethod
    def open_source(self):
        """The records: an object with ``count``, ``record(i)`` (DataError when the files changed under it),
        ``where(i)`` and ``close()``."""

    def check_params(self) -> None:
        """Refuse parameter values the block's types cannot (called at shape inference)."""
        prefetch = self.block(self.data_block).prefetch
        if prefetch < 0:
            raise ParamError(f"{self.data_block}.prefetch", f"must not be negative, got {prefetch}")

    def transformer(self) -> Transformer:
        """The transform of this layer's records (checked against their shape)."""
        return Transformer(self.block("transform_param"), self.phase, self.record_shape())

    def top_shapes(self, bottom_shapes):
        self.check_params()
        batch = self.batch_size()
        if batch is None or batch <= 0:
            raise ParamError(f"{self.data_block}.batch_size", "must be a positive integer")
        shapes = [(batch, *self.transformer().out_shape), (batch,)]
        return shapes[:len(self.spec.tops)]

    def setup(self, bottom, top, backend, dtype):
        super().setup(bottom, top, backend, dtype)
        self.source = self.open_source()
        self.transform = self.transformer()
        self.seed = int(backend.host_rng.integers(2 ** 62))
        self.order = self.record_order()
        self.prefetcher = Prefetcher(self.make_batch, self.block(self.data_block).prefetch)

    def record_order(self) -> RecordOrder:
        """The order of this rank's records, from the layer's seed."""
        comm = self.backend.comm
        return RecordOrder(self.source.count, self.seed, self.shuffle_mode(), comm.rank, comm.size)

    def make_batch(self, k: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        """Batch ``k``: its records transformed, and their labels."""
        batch, transform = self.batch_size(), self.transform
        indices = self.order.indices(k * batch, batch)
        images = numpy.empty((batch, *transform.in_shape), dtype=self.dtype)
        labels = self.backend.host_empty(batch, self.dtype)  # (page-locked on a GPU: copied from where they are)
        for row, index in enumerate(indices.tolist()):
            image, labels[row] = self.source.record(index)
            image = transform.prepare(image)
            if image.shape != transform.in_shape:
                raise transform.shape_error(image, self.source.where(index))
            images[row] = image
        data = self.backend.host_empty((batch, *transform.out_shape), self.dtype)
        ranks = self.order.world_size  # the choices for the whole batch k of all ranks, then this rank's rows
        choices = transform.draw(numpy.random.default_rng([self.seed, k, 1]), batch * ranks)[self.order.rank::ranks]
        transform.apply(images, choices, data)
        return data, labels

    def record_count(self):
        return self.source.count

    def runtime_state(self):
        return {"seed": numpy.int64(self.seed), "next_batch": numpy.int64(self.prefetcher.next_batch)}

    def restore_runtime_state(self, state):
        self.seed, next_batch = int(state["seed"]), int(state["next_batch"])
        if next_batch < 0:
            raise DataError(f"layer '{self.name}': the saved position is batch {next_batch}, before the first")
        self.order = self.record_order()
        self.prefetcher.restart(next_batch)

    def forward(self, bottom, top):
        data, labels = self.prefetcher.next()
        self.backend.upload_batch(data, top[0].data)
        if len(top) > 1:
            self.backend.upload_batch(labels, top[1].data)

    def close(self):
        self.prefetcher.close()
        self.source.close()


@dataclass
class DataParams:
    """Parameters of Data."""

    source: FilePath = required(doc="dataset folder written by netspec convert (holds manifest.json)")
    batch_size: int = required(doc="records per batch")
    backend: Literal["LMDB", "HDF5"] = doc("LMDB", "how the dataset stores its records")
    prefetch: int = doc(4, "batches made ahead in a background thread (0: none)")
    shuffle_buffer: int = doc(0, "shuffle each epoch within blocks of this many consecutive records, visiting "
                                 "the blocks in a random order (0: key order)")


@register_layer
class Data(RecordBatches):
    """Data: batches of records from a dataset folder, in key order, wrapping around at the end.

    ``source`` is a folder written by ``netspec convert imageset`` (or any
    writer of the record format in the docs' "File formats").  Each record
    passes through ``transform_param`` (crop, mirror, mean, scale, augmentation).  With
    ``shuffle_buffer: S`` each epoch reads blocks of S consecutive records in a
    random order, shuffled within each block.  A background thread makes
    ``prefetch`` batches ahead; the order and the random crops are the same
    for a given seed whatever the threads do.

    Tops: ``data`` (batch_size, C, H, W) and optionally ``label`` (batch_size).

    Example::

        - name: data
          type: Data
          top: [data, label]
          include: {phase: TRAIN}
          transform_param: {scale: 0.00390625, mirror: true, crop_size: 28}
          data_param: {source: train_lmdb, batch_size: 64}
    """

    type = "Data"
    param_blocks = {"data_param": DataParams, "transform_param": TransformParams}
    data_block = "data_param"

    def manifest(self) -> dict:
        params = self.block("data_param")
        try:
            manifest = read_manifest(params.source)
        except DataError as exc:
            raise ParamError("data_param.source", str(exc)) from None
        if manifest["backend"] != params.backend.lower():
            raise ParamError("data_param.backend", f"{params.source} is a {manifest['backend'].upper()} dataset; "
                                                   f"set backend: {manifest['backend'].upper()}")
        return manifest

    def check_params(self):
        super().check_params()
        buffer = self.block("data_param").shuffle_buffer
        if buffer < 0:
            raise ParamError("data_param.shuffle_buffer", f"must not be negative, got {buffer}")

    def record_shape(self):
        shapes = self.manifest()["shapes"]
        if len(shapes) > 1:
            raise ParamError("data_param.source", f"{self.block('data_param').source} holds records of "
                                                  f"{len(shapes)} shapes ({', '.join(map(str, shapes[:3]))}...); "
                                                  "convert with --resize so that they share one")
        return tuple(shapes[0])

    def shuffle_mode(self):
        return self.block("data_param").shuffle_buffer or "none"

    def label_names(self, top):
        """For the label top: the manifest's label names."""
        return list(self.manifest().get("label_names") or []) or None if top in self.spec.tops[1:2] else None

    def label_classes(self, top):
        """For the label top: the manifest's label names (the classes), else its largest label plus one."""
        if top not in self.spec.tops[1:2]:
            return None
        names = self.label_names(top)
        if names:
            return len(names)
        labels = [int(label) for label in self.manifest().get("label_counts") or {}]
        return max(labels) + 1 if labels else None

    def open_source(self):
        return Dataset(self.block("data_param").source)
