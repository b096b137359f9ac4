"""Net: a compiled graph instantiated on a device, with forward, backward and weight I/O."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import NamedTuple

import numpy

from netspec.engine import cudnn_conv, kernels, onednn, weights
from netspec.engine.backend import Backend
from netspec.engine.blob import Blob
from netspec.engine.buffers import SharedBuffers, flat_view
from netspec.engine.outputs import OutputFolder
from netspec.engine.recorded import RecordedPass
from netspec.engine.registry import layer_schemas, layer_types
from netspec.engine.trust import LIBRARY, Trust
from netspec.errors import ConfigError, DataError, DeviceError, ParamError, WeightsError
from netspec.graph.compiler import compile_graph
from netspec.graph.graph import Graph
from netspec.graph.memory import (
    ParamGroups,
    Plan,
    data_aliases,
    data_plan,
    diff_blobs,
    diff_plan,
    param_groups,
    split_aliases,
)
from netspec.spec.net_spec import NetConfig, parse_net, with_batch_size


class LearnableParam(NamedTuple):
    """One blob that trains: where it lives and its multipliers."""

    layer: str
    index: int
    blob: Blob
    lr_mult: float
    decay_mult: float


class ParamGroup(NamedTuple):
    """Learnable blobs with the same multipliers, laid out in one flat ``data`` and ``diff`` (the blobs' arrays are
    views of them): ``members`` holds each blob with its offset."""

    lr_mult: float
    decay_mult: float
    data: object
    diff: object
    members: list[tuple[LearnableParam, int]]


class Net:
    """Layers of a graph bound to blobs on one backend.

    ``blobs`` maps every blob name to its Blob; ``params`` maps each layer with
    learnable blobs to their list (shared blobs appear under every user, as
    views of one memory).  Layers that write files write inside
    ``output_folder`` (default: the current directory, nowhere outside it).

    With ``reuse_memory`` blobs whose arrays are never live at once share
    buffers (:mod:`netspec.graph.memory`): the diffs of a net that trains,
    the data of an ``inference`` net but its outputs and the blobs named in
    ``keep``.  Such a blob's array then holds what the pass left in it only
    until the buffer's next user writes; leave it off to read every blob
    after a pass, as in Caffe.  The learnable blobs of a net that trains are
    views of a flat buffer per pair of multipliers (:meth:`learnable_groups`).
    """

    def __init__(self, graph: Graph, device: str = "cpu", dtype=numpy.float32, seed: int | None = None,
                 backend: Backend | None = None, output_folder: OutputFolder | None = None, inference: bool = False,
                 reuse_memory: bool = False, keep: tuple[str, ...] = ()):
        self.graph = graph
        self.inference = inference
        self.backend = backend or Backend(device, seed)
        self.dtype = numpy.dtype(dtype)
        self.nodes = graph.nodes
        self.split_aliases = split_aliases(graph)
        # {blob: the blob whose data it uses}: the Split tops, and in a planned inference net its sums over a bottom
        self.aliases = data_aliases(graph, keep) if reuse_memory and inference else self.split_aliases
        # blobs oneDNN's layers may hold in their blocked layouts (the memory plan makes room for those)
        self.holdable = set() if self.backend.is_gpu or self.dtype != numpy.float32 else onednn.holdable(graph, keep)
        self.held_diffs = set() if inference else self.holdable & diff_blobs(graph)

        def size(name: str) -> int:  # (room for a blocked copy, its channels padded)
            shape = graph.blob_shapes[name]
            return onednn.held_elements(shape) if name in self.holdable else math.prod(shape)

        no_plan = Plan([], {})
        self.shared_data = SharedBuffers(data_plan(graph, keep, size) if reuse_memory and inference else no_plan,
                                         graph.blob_shapes, self.backend.xp, self.dtype, "data")
        self.shared_diffs = SharedBuffers(diff_plan(graph, size) if reuse_memory and not inference else no_plan,
                                          graph.blob_shapes, self.backend.xp, self.dtype, "diff")
        self.grouping = param_groups(graph) if not inference else ParamGroups([], [], {})
        self.group_arrays = self._group_arrays()
        self.layers = []
        self.blobs: dict[str, Blob] = {}
        self.params: dict[str, list[Blob]] = {}
        self.layer_by_name = {}
        self.bottom_blobs: list[list[Blob]] = []
        self.top_blobs: list[list[Blob]] = []
        for index, node in enumerate(graph.nodes):
            layer = node.layer(node.spec, graph.state.phase)
            layer.param_propagate_down = node.param_propagate_down
            layer.param_arrays = self._param_views(index, node)
            if output_folder is not None:
                layer.output_folder = output_folder
            layer.inference = inference
            try:
                bottom, top = self._set_up(node, layer)
            except ParamError as exc:
                raise ConfigError(node.spec.problem(str(exc), exc.key)) from None
            except MemoryError as exc:  # NumPy's, or CuPy's OutOfMemoryError
                raise DeviceError(f"layer '{node.spec.name}': out of {self.backend.device} memory while setting it "
                                  f"up: {str(exc).splitlines()[0] if str(exc) else 'an allocation failed'}; use a "
                                  "smaller batch_size, or check the sizes that make that shape") from None
            for index, owner in enumerate(node.param_owners):
                if owner is not None:
                    layer.blobs[index].share(self.layers[owner[0]].blobs[owner[1]])
            self.layers.append(layer)
            self.layer_by_name[layer.name] = layer
            self.bottom_blobs.append(bottom)
            self.top_blobs.append(top)
            if layer.blobs:
                self.params[layer.name] = layer.blobs
        self.absorbed_by = self.fuse()
        self._release_holds()
        backward_absorbed = {index for index, by in self.absorbed_by.items() if self.layers[by].fuses_backward}
        # what backward_layer does at each index, worked out once: None (nothing), or the loss tops it seeds
        # (blob, weight, whether a layer writes that diff already) before the layer's backward pass
        self._backward_steps = [
            [(blob, weight, written) for blob, weight, written in zip(top, node.loss_weights, node.top_diff_written)
             if weight] if node.need_backward and index not in backward_absorbed else None
            for index, (node, top) in enumerate(zip(self.nodes, self.top_blobs))]
        self.recorded: RecordedPass | None = None  # a frozen net's forward passes on oneDNN (:meth:`freeze`)
        self.loss_scale = 1.0  # what the loss's gradient is seeded with, times its weight (precision fp16-mixed)

    def _release_holds(self) -> None:
        """Keep a blob's held copies only where every layer that runs on it takes them as they are held (else
        the plain array would be read and written beside them, at twice the memory): the others' blobs go back to
        their plain arrays, in the memory plan's buffers.  Room no layer took goes too."""
        readers: dict[int, list] = {}  # {id of a held array: the layers that run on it}
        for index, (layer, bottom, top) in enumerate(zip(self.layers, self.bottom_blobs, self.top_blobs)):
            if index not in self.absorbed_by:
                for blob in {*bottom, *top}:
                    for held in (blob.held_data, blob.held_diff):
                        if held is not None:
                            readers.setdefault(id(held), []).append(layer)
        for name, blob in self.blobs.items():
            for diff, shared in ((False, self.shared_data), (True, self.shared_diffs)):
                held = blob.held_diff if diff else blob.held_data
                if held is None:
                    continue
                if isinstance(held, onednn.HeldArray) and all(layer.takes_held and layer.fast is not None
                                                               for layer in readers.get(id(held), [])):
                    held.plain_used = False  # (what setting up looked at: nothing written)
                    continue
                setattr(blob, "held_diff" if diff else "held_data", None)
                if name not in shared or (not diff and name in self.aliases):  # (an alias: its source's)
                    continue
                array = shared.view(name)  # (back in its place in the plan)
                if diff:
                    blob.diff = array
                    continue
                blob.data = array
                for alias in (top for top, source in self.aliases.items() if source == name):
                    self.blobs[alias].data = array

    def _group_arrays(self) -> list[tuple[object, object]]:
        """The flat ``(data, diff)`` of each group of learnable blobs (DeviceError when the device has no room)."""
        xp = self.backend.xp
        try:
            return [(xp.zeros(size, dtype=self.dtype), xp.zeros(size, dtype=self.dtype))
                    for size in self.grouping.sizes]
        except MemoryError:
            asked = 2 * sum(self.grouping.sizes) * self.dtype.itemsize
            raise DeviceError(f"net '{self.graph.name}': out of {self.backend.device} memory for the {asked:,} bytes "
                              "of its learnable blobs and their gradients; use a smaller net") from None

    def _param_views(self, index: int, node) -> dict[int, tuple]:
        """``{blob index: (data, diff)}``: views of the group buffers for node ``index``'s learnable blobs."""
        views = {}
        for blob, shape in enumerate(node.param_shapes):
            if (index, blob) in self.grouping.place:
                group, offset = self.grouping.place[(index, blob)]
                views[blob] = tuple(flat_view(array, offset, shape) for array in self.group_arrays[group])
        return views

    def learnable_groups(self) -> list[ParamGroup]:
        """The learnable blobs (:meth:`learnable_params`) by group, each group's blobs views of its flat arrays
        (none in an inference net)."""
        if self.inference:
            return []
        members: list[list[tuple[LearnableParam, int]]] = [[] for _ in self.grouping.sizes]
        for position, param in self._learnable():
            group, offset = self.grouping.place[(position, param.index)]
            members[group].append((param, offset))
        return [ParamGroup(lr_mult, decay_mult, data, diff, grouped) for (lr_mult, decay_mult), (data, diff), grouped
                in zip(self.grouping.multipliers, self.group_arrays, members)]

    def _set_up(self, node, layer) -> tuple[list[Blob], list[Blob]]:
        """Make the node's new top blobs and set its layer up on them; its bottom and top blobs.

        A new top takes its planned arrays (``shared_data``, ``shared_diffs``),
        or, as a Split top nothing changes in place or a sum written over a bottom (:attr:`aliases`), that
        bottom's data (as it holds it).  A top oneDNN may
        hold in a blocked layout gets room for that (:meth:`_held_buffer`).
        """
        bottom = [self.blobs[name] for name in node.bottoms]
        for name in node.tops:
            if name not in self.blobs:
                alias = self.aliases.get(name)
                data = (self.blobs[alias].data if alias is not None
                        else self.shared_data.view(name) if name in self.shared_data else None)
                blob = self.blobs[name] = Blob(self.graph.blob_shapes[name], self.backend.xp, self.dtype, name, data)
                if name in self.shared_diffs:
                    blob.diff = self.shared_diffs.view(name)
                if name in self.holdable:
                    blob.held_data = onednn.Vacancy(functools.partial(self._held_buffer, blob, False))
                if name in self.held_diffs:
                    blob.held_diff = onednn.Vacancy(functools.partial(self._held_buffer, blob, True))
                if alias is not None:  # (held as its bottom is, or never)
                    source = self.blobs[alias]
                    if isinstance(source.held_data, onednn.Vacancy):
                        source.held_data = None
                    blob.held_data = source.held_data
        top = [self.blobs[name] for name in node.tops]
        layer.setup(bottom, top, self.backend, self.dtype)
        if not self.inference:  # the diffs backward uses, made now: no room fails here
            wanted = [blob for blob, needed in zip(bottom, node.bottom_need_backward) if needed]
            for blob in wanted + ([*top, *layer.blobs] if node.need_backward else []):
                blob.diff  # noqa: B018 - asking makes it
        return bottom, top

    def _held_buffer(self, blob: Blob, diff: bool, nbytes: int) -> numpy.ndarray:
        """Room for ``blob``'s data or ``diff`` held in a blocked layout of ``nbytes``: the buffer the memory plan
        shares it in (its plain array then becomes one of its own, touched only if something reads it), else a
        new one."""
        shared = self.shared_diffs if diff else self.shared_data
        if blob.name not in shared or shared.nbytes(blob.name) < nbytes:
            return numpy.empty(nbytes, dtype=numpy.uint8)
        room = shared.buffer(blob.name).view(numpy.uint8)
        setattr(blob, "diff" if diff else "data", numpy.zeros(blob.shape, dtype=self.dtype))
        return room[:nbytes]

    def fuse(self) -> dict[int, int]:
        """Let each layer absorb the layers after it that its fast path runs fused (BatchNorm: the Scale in place
        on its top); return ``{absorbed index: absorbing index}``.

        A layer is offered only followers whose tops are no losses and which
        need no backward pass where it needs none.
        """
        absorbed = {}
        index = 0
        while index < len(self.layers):
            following = []
            for j in range(index + 1, len(self.layers)):
                node = self.nodes[j]
                if any(node.loss_weights) or (node.need_backward and not self.nodes[index].need_backward):
                    break
                following.append((self.layers[j], self.bottom_blobs[j], self.top_blobs[j]))
            count = self.layers[index].absorb(following) if following else 0
            absorbed.update(dict.fromkeys(range(index + 1, index + 1 + count), index))
            index += 1 + count
        return absorbed

    @property
    def name(self) -> str:
        """The net's name from its file."""
        return self.graph.name

    @property
    def outputs(self) -> list[str]:
        """Names of the blobs no layer consumes (losses, accuracies, predictions)."""
        return self.graph.outputs

    @property
    def phase(self) -> str:
        """TRAIN or TEST."""
        return self.graph.state.phase

    def owned_params(self) -> dict[str, list[tuple[int, Blob]]]:
        """``{layer: [(index, blob)]}`` for blobs each layer owns (shared copies left out)."""
        owned = {}
        for node, layer in zip(self.nodes, self.layers):
            mine = [(i, blob) for i, (blob, owner) in enumerate(zip(layer.blobs, node.param_owners))
                    if owner is None]
            if mine:
                owned[layer.name] = mine
        return owned

    def freeze(self) -> None:
        """Make the layers' blobs (weights, biases, statistics) constants, as an inference net's are once its
        weights are loaded: their arrays, and the arrays they view, become read-only (a write raises ValueError;
        a layer whose passes change its blobs keeps them writable, and so does every layer sharing memory with
        them: :attr:`Layer.changes_blobs`), and the fast paths that compute in other layouts then reorder them
        once (oneDNN's primitives keep their blocked copies: :func:`netspec.engine.onednn.constant`) rather than
        at every pass.  The layers that run on oneDNN alone are then run from a recording of their calls (made
        at the second pass) from the third pass on (:class:`netspec.engine.recorded.RecordedPass`).  For
        inference nets whose weights no other net shares (a solver's test nets follow its training weights).

        A frozen net's weights change only by freezing it again: a weight made writable, changed and made
        read-only again, or changed through a view of it taken before freezing, is seen at the next pass only
        after another ``freeze()`` (which makes every blocked copy of a constant again, those of the other
        frozen nets of the process too, at their next pass: one reorder each)."""
        if not self.inference:
            raise ValueError(f"net '{self.name}' trains: only an inference net's weights can be frozen")
        changing = [blob.data for layer in self.layers if layer.changes_blobs for blob in layer.blobs]
        for layer in self.layers:
            for blob in [] if layer.changes_blobs else layer.blobs:
                array = blob.data
                if any(numpy.may_share_memory(array, other) for other in changing):
                    continue
                while isinstance(array, numpy.ndarray):
                    array.flags.writeable = False
                    array = array.base
        onednn.forget_constants()
        lib = onednn.library()
        if lib is not None and not self.backend.is_gpu and any(layer.fast_records and layer.records
                                                               for layer in self.layers):
            self.recorded = RecordedPass(self, lib)

    def learnable_params(self) -> list[LearnableParam]:
        """Each owned blob that trains (lr_mult != 0), in layer order."""
        return [param for _, param in self._learnable()]

    def _learnable(self):
        """``(layer index, LearnableParam)`` for each owned blob that trains, in layer order."""
        for position, (node, layer) in enumerate(zip(self.nodes, self.layers)):
            for index, (blob, spec, owner) in enumerate(zip(layer.blobs, node.param_specs, node.param_owners)):
                if owner is None and spec.lr_mult != 0:
                    yield position, LearnableParam(layer.name, index, blob, spec.lr_mult, spec.decay_mult)

    @property
    def batch_size(self) -> int:
        """Size of the first axis of the data layer's first top (1 when there is none)."""
        source = self.data_layer()
        first_top = self.top_blobs[self.layers.index(source)][0] if source is not None and source.spec.tops else None
        return first_top.shape[0] if first_top is not None and first_top.shape else 1

    def data_layer(self):
        """The first layer that takes no bottoms and feeds the net (a data layer, not a Parameter), or None."""
        return next((layer for layer, node in zip(self.layers, self.nodes) if not node.bottoms and layer.feeds_net),
                    None)

    def blob_magnitudes(self) -> list[tuple[str, float, float]]:
        """``(name, mean |data|, mean |diff|)`` of every blob, for debugging divergence (the diffs of the last
        backward pass divided by the :attr:`loss_scale` it was seeded with)."""
        xp = self.backend.xp
        return [(name, float(xp.abs(blob.data).mean()), float(xp.abs(blob.diff).mean()) / self.loss_scale)
                for name, blob in self.blobs.items()]

    def has_loss(self) -> bool:
        """True when some top carries a non-zero loss weight."""
        return any(any(node.loss_weights) for node in self.nodes)

    @property
    def output_loss_weights(self) -> dict[str, float]:
        """``{output blob: loss weight}`` for the outputs that are losses."""
        outputs = set(self.outputs)
        return {name: weight for node in self.nodes for name, weight in zip(node.tops, node.loss_weights)
                if weight and name in outputs}

    def share_trained_layers(self, source: Net) -> None:
        """Make every parameter blob of a layer also in ``source`` (same name) a view of source's blob.

        Test nets use this to follow the train net's weights (Caffe's ShareTrainedLayersWith).
        """
        for name, blobs in self.params.items():
            theirs = source.params.get(name)
            if theirs is None:
                continue
            for index, (mine, other) in enumerate(zip(blobs, theirs)):
                if mine.shape != other.shape:
                    raise WeightsError(f"layer '{name}' blob {index} is {mine.shape} in net '{self.name}' "
                                       f"({self.phase}) but {other.shape} in net '{source.name}' ({source.phase})")
                mine.share(other)

    def scalar_outputs(self) -> dict[str, float]:
        """The value of each one-element output blob after the last forward pass (read in one transfer)."""
        names = [name for name in self.outputs if self.blobs[name].count == 1]
        if not names:
            return {}
        xp = self.backend.xp
        values = self.backend.to_host(xp.stack([self.blobs[name].data.reshape(-1)[0].astype(numpy.float64)
                                                for name in names]))
        return dict(zip(names, values.tolist()))

    def score(self, iterations: int, after_each=None) -> dict[str, float]:
        """Run ``iterations`` forward passes; return each one-element output averaged over them (summed on the
        device, read once).  ``after_each(net)``, when given, is called after each pass with this net (a report
        reading more).  :class:`netspec.engine.one_pass.OnePass` scores every record exactly once instead."""
        if not iterations:
            return {}
        names = [name for name in self.outputs if self.blobs[name].count == 1]
        totals = self.backend.xp.zeros(len(names), dtype=numpy.float64)
        for _ in range(iterations):
            self.device_forward()
            if after_each is not None:
                after_each(self)
            for index, name in enumerate(names):
                totals[index] += self.blobs[name].data.reshape(-1)[0].astype(numpy.float64)
        scores = self.backend.to_host(totals).tolist()
        self.backend.raise_checks()
        return {name: total / iterations for name, total in zip(names, scores)}

    def record_count(self) -> int | None:
        """Records in one pass over the data layer's dataset; None when it cannot tell (or there is none)."""
        source = self.data_layer()
        return source.record_count() if source is not None else None

    def coverage(self, iterations: int) -> str | None:
        """What scoring ``iterations`` batches reads of the dataset, in a sentence, where it is not every record
        once (some twice, some never); None where it is, or where the data layer cannot tell its size."""
        records, scored = self.record_count(), iterations * self.batch_size
        if not records or scored == records:
            return None
        if scored < records:
            return (f"{iterations} batch(es) of {self.batch_size} score {scored:,} of the {records:,} records: "
                    f"{records - scored:,} never")
        return (f"{iterations} batch(es) of {self.batch_size} score {scored:,} records of a {records:,}-record "
                f"dataset: {scored - records:,} of them count again (the data wraps around)")

    def memory_bytes(self, *others: Net) -> int:
        """Bytes the blobs hold on the device: data and (where made) diff of every blob and parameter, of this net
        and ``others`` (a solver's test nets), each array counted once however many blobs share it (layers' own
        buffers are not counted; the buffers of the memory plan whole); an array held in a blocked layout counts
        as its held copy, and its plain one too once something has read or written that."""
        blobs = [blob for net in (self, *others) for blob in net.blobs.values()]
        blobs += [blob for net in (self, *others) for params in net.params.values() for blob in params]
        counted = [buffer for net in (self, *others) for plan in (net.shared_data, net.shared_diffs)
                   for buffer in plan.buffers.values()]
        for blob in blobs:
            for side in (blob.values, blob.gradient) if blob.has_diff else (blob.values,):
                held = side.held if isinstance(side.held, onednn.HeldArray) else None
                if held is not None:
                    counted.append(held.buffer)
                if held is None or held.plain_used:
                    counted.append(side.stored())
        arrays = {}
        for array in counted:
            address = self.backend.address(array)
            arrays[address] = max(arrays.get(address, 0), array.nbytes)
        return sum(arrays.values())

    def first_non_finite(self) -> tuple[str, str] | None:
        """``(layer, top)`` of the first layer whose output holds a NaN or an infinity, if any."""
        places = [(layer.name, blob) for layer, tops in zip(self.layers, self.top_blobs) for blob in tops]
        index = self._first_non_finite([blob.data for _, blob in places])
        return None if index is None else (places[index][0], places[index][1].name)

    def _first_non_finite(self, arrays: list) -> int | None:
        """The index of the first of ``arrays`` holding a NaN or an infinity, if any: the checks are made on the
        device and read back in one copy."""
        if not arrays:
            return None
        xp = self.backend.xp
        finite = self.backend.to_host(xp.stack([xp.isfinite(array).all() for array in arrays]))
        return next((index for index, ok in enumerate(finite.tolist()) if not ok), None)

    def paths(self) -> str:
        """Which implementations run the layers, in a line: the layers oneDNN runs (``bn+scale`` where one
        absorbed the next) and how many blobs it keeps in its blocked layouts, the array library's, and the layers
        it runs folded into one."""
        groups = {index: layer.name for index, layer in enumerate(self.layers) if index not in self.absorbed_by}
        for absorbed, index in self.absorbed_by.items():
            groups[index] += f"+{self.layers[absorbed].name}"
        on_onednn = {index for index in groups if getattr(self.layers[index], "fast", None) is not None}
        on_cudnn = {index for index in groups if getattr(self.layers[index], "cudnn", None) is not None}
        folded = [groups[index] for index in groups
                  if index not in on_onednn | on_cudnn and "+" in groups[index]]  # (NumPy/CuPy)
        library = "CuPy" if self.backend.is_gpu else "NumPy"
        fused = f"; {library} runs {_listed(folded)} as one" if folded else ""
        if self.backend.is_gpu:
            return self._gpu_paths([groups[index] for index in sorted(on_cudnn)]) + fused
        lib = onednn.library()
        if lib is None:
            return f"NumPy (oneDNN off: {onednn.why_unavailable()})" + fused
        fast = [groups[index] for index in sorted(on_onednn)]
        refused = [f"{layer.name}: {layer.onednn_refused}" for layer in self.layers
                   if getattr(layer, "onednn_refused", None) and getattr(layer, "fast", None) is None]
        plain = [f"{layer.name}: {layer.layout_refused}" for layer in self.layers
                 if getattr(layer, "layout_refused", None) and getattr(layer, "fast", None) is not None]
        note = onednn.isa_note(lib)
        held = sum(isinstance(blob.held_data, onednn.HeldArray) for blob in self.blobs.values())
        return (f"oneDNN {lib.version}{f' ({note})' if note else ''} for {_listed(fast, of='layers') or 'no layer'}"
                + (f" ({held} blob{'s' * (held > 1)} held in its blocked layouts between them)" if held else "")
                + "; NumPy for the rest"
                + (f" (oneDNN refused {_listed(refused, '; ')})" if refused else "")
                + (f"; reordered out of their input's blocked layout: {_listed(plain, '; ')}" if plain else "")
                + fused)

    def _gpu_paths(self, on_cudnn: list[str]) -> str:
        """:meth:`paths` on a GPU, but for the layers run folded by CuPy: the layers cuDNN runs (``on_cudnn``,
        ``conv1+relu1`` where one absorbed the next), those whose geometry it refused and those whose bias or ReLU
        it would not fuse (why), or why it does not run where it could."""
        convolutions = [layer for layer in self.layers if hasattr(layer, "cudnn")]
        refused = [f"{layer.name}: {layer.cudnn_refused}" for layer in convolutions if layer.cudnn_refused]
        unfused = [f"{layer.name}: {layer.cudnn_unfused}" for layer in convolutions
                   if layer.cudnn is not None and layer.cudnn_unfused]
        if on_cudnn or refused:
            return (f"{cudnn_conv.version()} for {_listed(on_cudnn, of='layers') or 'no layer'}; CuPy for the rest"
                    + (f" (cuDNN refused {_listed(refused, '; ')})" if refused else "")
                    + (f" (bias or ReLU after cuDNN's product, unfused: {_listed(unfused, '; ')})"
                       if unfused else ""))
        why = cudnn_conv.unavailable() if convolutions and kernels.compiled(self.backend.xp) else None
        return "CuPy" + (f" (no cuDNN: {why})" if why else "")

    def first_non_finite_param(self) -> tuple[str, int] | None:
        """``(layer, blob index)`` of the first learnable blob holding a NaN or an infinity, if any."""
        places = [(name, index, blob) for name, blobs in self.owned_params().items() for index, blob in blobs]
        first = self._first_non_finite([blob.data for _, _, blob in places])
        return None if first is None else places[first][:2]

    def close(self) -> None:
        """Stop the data layers' background threads and close their files."""
        for layer in self.layers:
            layer.close()

    def runtime_state(self) -> dict[str, dict[str, numpy.ndarray]]:
        """``{layer: state}`` for layers with run-time state (data cursors) that a resumed run needs."""
        states = {layer.name: layer.runtime_state() for layer in self.layers}
        return {name: state for name, state in states.items() if state}

    def restore_runtime_state(self, states: dict[str, dict[str, numpy.ndarray]]) -> None:
        """Give layers back the state saved by :meth:`runtime_state`."""
        for name, state in states.items():
            if name in self.layer_by_name:
                self.layer_by_name[name].restore_runtime_state(state)

    # ---- passes ----------------------------------------------------------------------------
    def forward_layer(self, index: int) -> None:
        """Run layer ``index`` forward (unless another layer absorbed it)."""
        if index not in self.absorbed_by:
            self.layers[index].forward(self.bottom_blobs[index], self.top_blobs[index])

    def backward_layer(self, index: int) -> None:
        """Seed loss diffs of layer ``index`` and run it backward, if it needs to (and no layer that absorbed it
        computes its gradients)."""
        if self.inference:
            raise RuntimeError(f"net '{self.name}' was built for inference (forward passes only, its layers fused)")
        seeds = self._backward_steps[index]
        if seeds is None:
            return
        for blob, weight, written in seeds:
            if written:
                blob.diff += weight * self.loss_scale
            else:
                blob.diff[...] = weight * self.loss_scale
        self.layers[index].backward(self.top_blobs[index], self.nodes[index].bottom_need_backward,
                                    self.bottom_blobs[index])

    def loss(self) -> float:
        """Weighted sum of the loss tops from the last forward pass."""
        return float(self.backend.to_host(self.device_loss()))

    def device_loss(self):
        """Weighted sum of the loss tops from the last forward pass, as a 0-d float64 array on the device: a GPU
        is not waited for."""
        total = None
        for node, top in zip(self.nodes, self.top_blobs):
            for blob, weight in zip(top, node.loss_weights):
                if weight:  # (a loss of one value, the usual, is taken as it is: one copy on a GPU, no sum)
                    term = (blob.data.reshape(()) if blob.data.size == 1 else blob.data.sum()).astype(numpy.float64)
                    term = term if weight == 1 else term * weight
                    total = term if total is None else total + term
        xp = self.backend.xp
        return xp.zeros((), dtype=numpy.float64) if total is None else xp.asarray(total)  # (NumPy: a scalar, else)

    def set_input_arrays(self, data, labels=None, layer: str | None = None) -> None:
        """Hand arrays to the net's MemoryData layer (``layer`` names it when the net has several).

        The layer serves them, ``batch_size`` rows at a time, from the next forward pass on.
        """
        takers = [each for each in self.layers if hasattr(each, "set_arrays")]
        chosen = [each for each in takers if layer is None or each.name == layer]
        if len(chosen) != 1:
            names = ", ".join(f"'{each.name}'" for each in takers) or "none"
            wanted = "a MemoryData layer" if layer is None else f"a MemoryData layer named '{layer}'"
            raise DataError(f"net '{self.name}': set_input_arrays needs {wanted}, and one only "
                            f"(its MemoryData layers: {names})")
        chosen[0].set_arrays(data, labels)

    def forward(self) -> float:
        """Run every layer forward; return the weighted loss (a check a layer left on the device that failed is
        raised: :meth:`Backend.raise_checks`)."""
        loss = float(self.backend.to_host(self.device_forward()))
        self.backend.raise_checks()
        return loss

    def device_forward(self):
        """Run every layer forward; return the weighted loss as :meth:`device_loss` does (on the device)."""
        if self.recorded is not None:
            self.recorded.forward()
        else:
            for index in range(len(self.layers)):
                self.forward_layer(index)
        return self.device_loss()

    def backward(self, after_layer: Callable[[int], None] | None = None) -> None:
        """Run every layer that needs it backward; parameter diffs accumulate (see clear_param_diffs).

        ``after_layer(index)`` is called after each layer's turn (distributed
        training starts sending finished gradients there).
        """
        for index in reversed(range(len(self.layers))):
            self.backward_layer(index)
            if after_layer is not None:
                after_layer(index)

    def clear_param_diffs(self) -> None:
        """Zero the diff of every owned parameter blob: each group's flat diff whole (the gaps between its blobs
        too), then the blobs outside the groups."""
        for _, diff in self.group_arrays:
            diff[...] = 0
        for position, (node, layer) in enumerate(zip(self.nodes, self.layers)):
            for index, (blob, owner) in enumerate(zip(layer.blobs, node.param_owners)):
                if owner is None and (position, index) not in self.grouping.place:
                    blob.diff[...] = 0

    def forward_backward(self) -> float:
        """Zero parameter diffs, run forward and backward; return the loss."""
        self.clear_param_diffs()
        loss = self.forward()
        self.backward()
        return loss

    # ---- weights ----------------------------------------------------------------------------
    def save_weights(self, path: str | os.PathLike, iteration: int = 0, origin: dict[str, str] | None = None) -> None:
        """Write the weights to an HDF5 file atomically (``origin``: where they came from, kept with them)."""
        weights.save_weights(self, path, iteration, origin)

    def load_weights(self, path: str | os.PathLike, strict: bool = True) -> weights.LoadReport:
        """Copy weights from an HDF5 file by layer name; returns what was copied and what was not.

        With ``strict=False`` (fine-tuning) a layer whose shapes differ keeps its fillers instead of
        raising.
        """
        return weights.load_weights(self, path, strict)


LISTED = 12  # names a line lists in full; of more, the first LISTED - 2 and how many others


def _listed(names: list[str], separator: str = ", ", of: str = "") -> str:
    """``names`` joined, or for many of them the first few and a count: ``a, b, ... and 42 more`` (preceded by
    ``48 OF: `` when ``of`` names what they are)."""
    if len(names) <= LISTED:
        return separator.join(names)
    shown = separator.join(names[:LISTED - 2]) + f" and {len(names) - LISTED + 2} more"
    return f"{len(names)} {of}: {shown}" if of else shown


def compile_net(config: NetConfig, phase: str | None = None, stages=None, level: int | None = None,
                trust: Trust = LIBRARY, where: str | None = None) -> Graph:
    """Compile a parsed net with the registered layer types; phase/stages/level default to the file's ``state``.

    ``trust`` says what the net may do (:class:`~netspec.engine.trust.Trust`): its Python layers are refused
    before any of their modules is imported unless it allows them, and layers with side effects once compiled
    (the message naming ``where``, default: the net's file).
    """
    trust.check_config(config)
    graph = compile_graph(config, layer_types(), phase=phase, stages=stages, level=level)
    trust.check_graph(graph, where or config.file or config.name or "<string>")
    return graph


def compile_file(source, phase: str | None = None, stages=None, level: int | None = None,
                 batch_size: int | None = None, trust: Trust = LIBRARY) -> Graph:
    """The one way from a net file (a path or YAML text) to its compiled graph: read, validated, its batch size
    set (``batch_size``: :func:`~netspec.spec.net_spec.with_batch_size`, the data layers ``phase`` includes, else
    its first Input layer), compiled under ``trust``."""
    config = parse_net(source, layer_schemas())
    if batch_size is not None:
        config = with_batch_size(config, batch_size, phase or config.state.phase)
    return compile_net(config, phase=phase, stages=stages, level=level, trust=trust)


def load_net(source, phase: str | None = None, device: str = "cpu", stages=None, level: int | None = None, *,
             batch_size: int | None = None, trust: Trust = LIBRARY, **options) -> Net:
    """Read, compile and instantiate a net from a YAML path or YAML text.

    ``phase`` (TRAIN/TEST), ``stages`` and ``level`` select layers by their
    include/exclude rules; they default to the file's ``state``.  ``batch_size`` replaces that of the data
    layers the phase includes (of its first Input layer in a net without any); ``trust`` says what the net may
    do (Python layers, files written anywhere: :class:`~netspec.engine.trust.Trust`).  The ``options`` go to
    :class:`Net`: ``inference`` (forward passes only, and fast paths that fuse more), ``reuse_memory`` and
    ``keep``, ``dtype``, ``seed``, and ``output_folder`` (default: the current directory, or anywhere if
    ``trust`` says so).
    """
    moved = sorted({"python_layers", "outputs_anywhere"} & set(options))
    if moved:
        raise TypeError(f"load_net: {', '.join(moved)} is now part of trust= (netspec.engine.trust.Trust: "
                        f"trust=Trust({moved[0]}=True))")
    graph = compile_file(source, phase, stages, level, batch_size, trust)
    options.setdefault("output_folder", trust.output_folder())
    return Net(graph, device=device, **options)
