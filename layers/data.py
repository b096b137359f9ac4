"""Input and DummyData: tops whose values come from the caller or from fillers."""

from __future__ import annotations

from dataclasses import dataclass

from netspec.engine.backend import DeviceGenerator
from netspec.engine.fillers import FillerParams, fill
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError
from netspec.spec.schema import doc


@dataclass
class BlobShape:
    """A blob shape: ``{dim: [N, C, H, W]}``."""

    dim: list[int] = doc([], "the size of each axis")


def shapes_for_tops(shapes: list[BlobShape], count: int, key: str) -> list[tuple[int, ...]]:
    """One shape per top: a single shape applies to every top, otherwise one each."""
    if not shapes:
        raise ParamError(key, "give the shape of the tops, e.g. shape: {dim: [64, 1, 28, 28]}")
    if len(shapes) not in (1, count):
        raise ParamError(key, f"give one shape for all tops or one per top ({count}), got {len(shapes)}")
    result = []
    for shape in (shapes * count if len(shapes) == 1 else shapes):
        if not shape.dim or any(d <= 0 for d in shape.dim):
            raise ParamError(key, f"every dim must be positive, got {shape.dim}")
        result.append(tuple(shape.dim))
    return result


@dataclass
class InputParams:
    """Parameters of Input."""

    shape: list[BlobShape] = doc([], "one shape for every top, or one per top")


@register_layer
class Input(Layer):
    """Input: tops that the caller fills (a deploy net's entry point).

    Tops: any number, shaped by ``input_param.shape``.  The layer computes
    nothing; set ``net.blobs[name].data`` before ``forward()``.

    Example::

        - name: data
          type: Input
          top: data
          input_param: {shape: {dim: [1, 3, 224, 224]}}
    """

    type = "Input"
    param_blocks = {"input_param": InputParams}
    num_bottoms = (0, 0)
    num_tops = (1, None)

    def top_shapes(self, bottom_shapes):
        return shapes_for_tops(self.block("input_param").shape, len(self.spec.tops), "input_param.shape")

    @property
    def records(self) -> bool:
        return True  # (nothing to run)

    def forward(self, bottom, top):
        pass


@dataclass
class DummyDataParams:
    """Parameters of DummyData."""

    shape: list[BlobShape] = doc([], "one shape for every top, or one per top")
    data_filler: list[FillerParams] = doc([], "none (zeros), one for every top, or one per top")


@register_layer
class DummyData(Layer):
    """DummyData: tops filled by fillers, refreshed every forward pass unless constant.

    Used to time or smoke-test a net without a dataset.  Tops: any number,
    shaped by ``dummy_data_param.shape``; ``data_filler`` gives none (zeros),
    one filler for every top, or one per top.  A label top filled
    ``randint`` with ``min: 0, max: K`` gives class indices 0 to K-1 (a loss
    refuses labels that are not whole class indices).

    Example::

        - name: data
          type: DummyData
          top: [data, label]
          dummy_data_param:
            shape: [{dim: [64, 1, 28, 28]}, {dim: [64]}]
            data_filler: [{type: gaussian, std: 1}, {type: randint, min: 0, max: 10}]
    """

    type = "DummyData"
    param_blocks = {"dummy_data_param": DummyDataParams}
    num_bottoms = (0, 0)
    num_tops = (1, None)

    def top_shapes(self, bottom_shapes):
        params = self.block("dummy_data_param")
        count = len(self.spec.tops)
        if len(params.data_filler) not in (0, 1, count):
            raise ParamError("dummy_data_param.data_filler",
                             f"give no filler, one, or one per top ({count}); got {len(params.data_filler)}")
        return shapes_for_tops(params.shape, count, "dummy_data_param.shape")

    def fillers(self) -> list[FillerParams]:
        """The filler of each top."""
        given = self.block("dummy_data_param").data_filler
        if not given:
            return [FillerParams()] * len(self.spec.tops)
        return given * len(self.spec.tops) if len(given) == 1 else given

    def setup(self, bottom, top, backend, dtype):
        super().setup(bottom, top, backend, dtype)
        for blob, filler in zip(top, self.fillers()):
            self.refill(blob, filler)

    def refill(self, blob, filler: FillerParams) -> None:
        """Draw new values for one top, on the device (from the layer's stream of random values), in place where
        the filler draws them there."""
        drawn = fill(filler, blob.shape, DeviceGenerator(self.backend, self.name), self.dtype, out=blob.data)
        if drawn is not blob.data:
            blob.data[...] = self.backend.asarray(drawn)

    def forward(self, bottom, top):
        for blob, filler in zip(top, self.fillers()):
            if filler.type != "constant":
                self.refill(blob, filler)
