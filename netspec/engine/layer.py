"""The layer contract shared by every layer type (docs/pages/concepts/layer-contract.md).

A subclass declares its ``type``, its parameter blocks, how many bottoms and
tops it takes, whether it may run in place, whether it is a loss, and which
bottoms never take a gradient.  It implements :meth:`top_shapes` (used both
for static shape inference and at reshape time), :meth:`param_shapes` and
:meth:`param_fillers` when it learns, :meth:`forward` and :meth:`backward`.

Rules: ``backward`` *overwrites* the diffs of the bottoms it is asked for
(``propagate_down[i]``) and *accumulates* into parameter diffs; the net zeroes
parameter diffs once per iteration.  A layer that runs in place receives the
same Blob as bottom and top, so its backward must work from the top's data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from netspec.engine.blob import Blob
from netspec.engine.fillers import FillerParams, constant, fill
from netspec.engine.outputs import OutputFolder
from netspec.errors import ShapeError
from netspec.spec.net_spec import LayerSpec


def weighted_flops(top_shape, param_shapes) -> int:
    """FLOPs of a layer whose every output value is a dot product with one row of ``param_shapes[0]``
    (``num_output`` first), plus a bias when there is a second blob."""
    outputs = math.prod(top_shape)
    weights = param_shapes[0]
    return 2 * outputs * (math.prod(weights) // weights[0]) + (outputs if len(param_shapes) > 1 else 0)


def checked_indices(layer: Layer, values, bound: int, describe: Callable[[int | str, int], str], valid=None):
    """``values`` (indices stored as floats, as Caffe stores them) as int64 indices into [0, bound), 0 where
    not ``valid``.

    A value (where valid) that is not a whole number in [0, bound) (1.7, -1,
    1e30, NaN) is a DataError whose message ``describe(value as the blob holds
    it, how many such)`` gives, never truncated or wrapped: raised at once on
    the CPU; on a GPU checked on the device and raised when the host next reads
    from it (:meth:`netspec.engine.backend.Backend.check_later`), index 0
    standing in for it meanwhile.
    """
    xp = layer.xp
    bad = ~((values >= 0) & (values < bound) & (values == xp.floor(values)))
    if valid is not None:
        bad &= valid
    layer.backend.check_later(bad, values, describe)
    keep = ~bad if valid is None else valid & ~bad
    return xp.where(keep, values, 0).astype(xp.int64)


class Layer:
    """Base class of every layer."""

    type: ClassVar[str] = ""
    param_blocks: ClassVar[dict[str, type]] = {}
    num_bottoms: ClassVar[tuple[int, int | None]] = (1, 1)
    num_tops: ClassVar[tuple[int, int | None]] = (1, 1)
    inplace_ok: ClassVar[bool] = False
    is_loss: ClassVar[bool] = False
    label_bottoms: ClassVar[tuple[int, ...]] = ()
    learnable: ClassVar[bool] = True
    writes_files: ClassVar[bool] = False  # a side effect: its paths go through output_folder, sandboxes refuse it
    output_folder: OutputFolder = OutputFolder()  # the net sets its own before setup
    inference: bool = False  # the net runs forward passes only (it sets this before setup)
    feeds_net: ClassVar[bool] = True  # without bottoms: the net's input (a data layer); False for Parameter
    # its forward copies values from the host (a data layer's batch): a training iteration captured as a CUDA graph
    # runs it before each launch, outside the graph (netspec.training.graphed)
    from_host: ClassVar[bool] = False
    # a layer whose first top is a mean (Accuracy, the losses) sets how many items its last forward averaged (a
    # device scalar, or a number): a pass over many batches weighs each batch's value by it; None: by its rows
    averaged_over = None
    # forward writes every element of each top and backward of each bottom diff asked for, each pass (the checks in
    # netspec.testing test it): a net with reuse_memory may give them buffers other blobs use (netspec.graph.memory)
    overwrites: ClassVar[bool] = True
    # its oneDNN fast path (``self.fast``, where it has one) reads and writes blobs held in blocked layouts as they
    # are held (netspec.engine.onednn.hold_outputs); a net holds a blob only between such layers
    takes_held: ClassVar[bool] = False
    # its forward pass on its oneDNN fast path (``self.fast``) makes oneDNN calls and nothing else (:attr:`records`)
    fast_records: ClassVar[bool] = False
    # the types of the layers whose pass may compute this layer's tops in an inference net, where one of them
    # writes a bottom of this layer with only layers in place on that bottom between: its tops may then be
    # written from that layer's step on (netspec.graph.memory.data_plan)
    computed_by: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def may_write_over_bottom(cls, spec: LayerSpec) -> bool:
        """Whether the layer ``spec`` describes computes its one top right when the top's data is that of one of
        its bottoms (an element-wise sum): an inference net's memory plan may then give it that bottom's data
        where nothing reads the bottom after it (netspec.graph.memory.sum_aliases)."""
        return False

    def __init__(self, spec: LayerSpec, phase: str = "TEST"):
        self.spec = spec
        self.name = spec.name
        self.phase = phase
        self.blobs: list[Blob] = []
        self.param_arrays: dict[int, tuple] = {}  # blob index -> (data, diff) the net gives it (set before setup)
        self.param_propagate_down: list[bool] = []
        self.backend = None
        self.xp = None
        self.dtype = None

    def block(self, name: str):
        """The validated parameter block ``name`` (defaults when absent from the file)."""
        return self.spec.blocks[name]

    # ---- static description (no arrays) -------------------------------------------------
    @classmethod
    def describe(cls, spec: LayerSpec, phase: str, bottom_shapes: list[tuple[int, ...]]) -> tuple[list, list, int]:
        """``(top shapes, learnable blob shapes, forward FLOPs)`` of a layer of this type with these bottoms.

        The graph's shape inference calls this before any array exists; it
        raises ShapeError/ParamError when the shapes are impossible.
        """
        layer = cls(spec, phase)
        tops = [tuple(int(d) for d in shape) for shape in layer.top_shapes(bottom_shapes)]
        params = [tuple(int(d) for d in shape) for shape in layer.param_shapes(bottom_shapes)]
        return tops, params, layer.flops(bottom_shapes, tops, params)

    def top_shapes(self, bottom_shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Shapes of the tops for these bottom shapes; raise ShapeError/ParamError when impossible."""
        raise NotImplementedError

    def param_shapes(self, bottom_shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Shapes of the learnable blobs (none by default)."""
        return []

    def flops(self, bottom_shapes, top_shapes, param_shapes) -> int:
        """Floating-point operations of one forward pass (a multiply-add counts 2).

        By default one per output value, and none for layers without bottoms
        (data layers); layers that multiply by weights or pool windows say more.
        """
        return sum(math.prod(s) for s in top_shapes) if bottom_shapes else 0

    def param_fillers(self) -> list[FillerParams]:
        """How each learnable blob starts (constant 0 by default)."""
        return [constant(0.0)] * len(self.param_shapes_cache)

    # ---- on a device ----------------------------------------------------------------------
    def setup(self, bottom: list[Blob], top: list[Blob], backend, dtype) -> None:
        """Bind to a backend and create and fill the learnable blobs (in the arrays of ``param_arrays`` where the
        net gave some)."""
        self.backend = backend
        self.xp = backend.xp
        self.dtype = dtype
        self.param_shapes_cache = self.param_shapes([b.shape for b in bottom])
        self.blobs = []
        for index, (shape, filler) in enumerate(zip(self.param_shapes_cache, self.param_fillers())):
            data, diff = self.param_arrays.get(index, (None, None))
            blob = Blob(shape, self.xp, dtype, name=f"{self.name}[{index}]", data=data)
            if diff is not None:
                blob.diff = diff
            blob.data[...] = backend.asarray(fill(filler, shape, backend.host_rng, dtype))
            self.blobs.append(blob)
        if not self.param_propagate_down:
            self.param_propagate_down = [True] * len(self.blobs)
        self.reshape(bottom, top)

    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Shape the tops from the bottoms (cheap when nothing changed)."""
        for blob, shape in zip(top, self.top_shapes([b.shape for b in bottom])):
            blob.reshape(shape)

    @property
    def changes_blobs(self) -> bool:
        """Whether forward passes change this layer's own blobs (a BatchNorm's running sums): a frozen net
        (:meth:`netspec.engine.net.Net.freeze`) leaves them writable.  False by default."""
        return False

    @property
    def records(self) -> bool:
        """Whether this layer's forward pass, as set up, makes the same oneDNN calls on arrays that stay where they
        are (its blobs', its constants', the shared scratch buffers) at every pass of a frozen net, and nothing
        else whose result could change (work on constants only), so that a recorded pass may make those calls
        again in its place (:mod:`netspec.engine.recorded`).  By default: where its class says its fast path
        does no work of its own (``fast_records``) and it runs on it."""
        return self.fast_records and getattr(self, "fast", None) is not None

    fuses_backward = True  # whether a layer it absorbs (absorb) has its backward pass run by this one too

    def absorb(self, following: list[tuple[Layer, list[Blob], list[Blob]]]) -> int:
        """Take over the work of the first layers of ``following`` (each with its bottoms and tops), fused into
        this layer's fast path; return how many.  The net then runs none of their forward passes (this layer
        computes their tops), nor their backward passes where ``fuses_backward`` says this layer computes their
        gradients too (else the net runs those).  In a net built for ``inference`` (forward passes only) more
        can fuse.  None by default."""
        return 0

    def record_count(self) -> int | None:
        """Records in one full pass over a data layer's dataset; None when the layer cannot tell (the default)."""
        return None

    def label_names(self, top: str) -> list[str] | None:
        """The names of the classes of the labels a data layer gives in its top ``top``, as its dataset says; None
        when it does not (the default)."""
        return None

    def label_classes(self, top: str) -> int | None:
        """How many classes the labels a data layer gives in its top ``top`` belong to, as its dataset says; None
        when it cannot tell (the default).  Asked before setup."""
        return None

    def close(self) -> None:
        """Release threads and files (data layers); nothing by default."""

    def runtime_state(self) -> dict:
        """Arrays a resumed run needs to continue exactly (a data layer's position); none by default."""
        return {}

    def restore_runtime_state(self, state: dict) -> None:
        """Take back what :meth:`runtime_state` returned."""

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Compute the tops' data from the bottoms' data."""
        raise NotImplementedError

    def backward(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        """Overwrite bottom diffs where asked and accumulate parameter diffs (none by default)."""
        if any(propagate_down):
            raise NotImplementedError(f"{self.type} has no backward")


def canonical_axis(axis: int, ndim: int, key: str) -> int:
    """``axis`` as a non-negative index into ``ndim`` axes (negative counts from the end)."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of range for a {ndim}-axis bottom", key)
    return axis % ndim
