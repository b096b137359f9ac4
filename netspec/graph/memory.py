"""The net's memory plan: which blobs may hold their arrays in one buffer, their lifetimes never meeting.

A static graph knows, before any batch, when each array is first written and
last read.  Two arrays whose lifetimes do not overlap can be views of one
buffer, and the net then holds about what is live at the worst moment
instead of the sum of every array:

- **Gradients** (:func:`diff_plan`): a blob's diff is written by the backward
  pass of its last consumer and read last by its producer's; once that ran
  the buffer is free for the next diff down the net.  Parameter diffs
  accumulate over passes and are never planned.  A diff its producer reads
  but nothing writes (an unused top) must stay zero: it keeps a buffer of
  its own.
- **Data of a net run forward only** (:func:`data_plan`): a blob's data lives
  from its producer's forward pass to its last consumer's (from the pass of
  a layer before the producer where that layer may compute it:
  :func:`written_from`).  The outputs,
  the blobs the caller keeps and what the layers without bottoms fill (data
  and Input layers, which the caller may write before a pass) keep buffers
  of their own.

Both rest on the layer contract: a forward pass writes every element of its
tops, a backward pass every element of the bottom diffs it is asked for
(:mod:`netspec.testing` checks both for every layer).  The blobs of a layer
that does not promise it (``overwrites`` false: Python layers) keep arrays
of their own.

Split tops that no layer changes in place use their bottom's data
(:func:`split_aliases`), in every net.  In a net run forward only, the top of
an element-wise sum may take the data of a bottom it is the last reader of
(:func:`sum_aliases`: a residual block's sum written over its shortcut, which
oneDNN's convolution before it then adds its product to where it stands).

The learnable blobs of a net that trains lie in one flat buffer per pair of
multipliers (:func:`param_groups`), so that an update runs a few operations
per group rather than per blob, on buffers whose addresses never change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from netspec.graph.graph import Graph


@dataclass(frozen=True)
class Plan:
    """Shared buffers and the blobs that use them: ``buffers[k]`` elements for buffer k, ``buffer_of[blob]`` = k.

    Blobs absent from ``buffer_of`` keep arrays of their own.
    """

    buffers: list[int]
    buffer_of: dict[str, int]

    def elements(self) -> int:
        """Elements held by the shared buffers together."""
        return sum(self.buffers)


def split_aliases(graph: Graph) -> dict[str, str]:
    """``{Split top: its bottom}`` for the Split tops no layer changes in place: they read their bottom's data."""
    changed = {name for node in graph.nodes for name, in_place in zip(node.tops, node.inplace) if in_place}
    return {top: node.bottoms[0] for node in graph.nodes if node.layer.type == "Split"
            for top in node.tops if top not in changed}


def diff_blobs(graph: Graph) -> set[str]:
    """The blobs whose diffs a net that trains holds: the tops of the layers that run backward, and the bottoms
    they send a gradient to."""
    return set(_diff_touches(graph)[0])


def diff_plan(graph: Graph, size: Callable[[str], int] | None = None) -> Plan:
    """Shared buffers for the diffs of a net trained by forward and backward passes (see the module's text);
    ``size(blob)``: the elements a blob needs (default: its shape's; more where a layout pads it)."""
    touched, own = _diff_touches(graph)
    lifetimes = {name: (min(steps_), max(steps_)) for name, steps_ in touched.items() if name not in own}
    return pack(lifetimes, {name: _size(graph, size, name) for name in lifetimes})


def _size(graph: Graph, size: Callable[[str], int] | None, name: str) -> int:
    return size(name) if size is not None else math.prod(graph.blob_shapes[name])


def _diff_touches(graph: Graph) -> tuple[dict[str, list[int]], set[str]]:
    """``({blob: the backward steps (0 = the last layer's) that read or write its diff}, the blobs whose diffs
    keep arrays of their own)``."""
    steps = len(graph.nodes)
    touched: dict[str, list[int]] = {}
    own = set()
    for index, node in enumerate(graph.nodes):
        step = steps - 1 - index
        if not node.layer.overwrites:
            own.update([*node.tops, *node.bottoms])
        if not node.need_backward:
            continue
        for name, written, weight in zip(node.tops, node.top_diff_written, node.loss_weights):
            touched.setdefault(name, []).append(step)
            if not written and not weight:
                own.add(name)
        for name, wanted in zip(node.bottoms, node.bottom_need_backward):
            if wanted:
                touched.setdefault(name, []).append(step)
    return touched, own


def sum_aliases(graph: Graph, keep: Iterable[str] = ()) -> dict[str, str]:
    """``{sum's top: the blob whose data it takes}`` in a net run forward only.  The top of a layer that may be
    written over one of its bottoms (:meth:`~netspec.engine.layer.Layer.may_write_over_bottom`: an element-wise
    sum), whose top is not one of its bottoms, takes the data of the first of its bottoms that:

    - it is the last reader of, and reads once;
    - is no output, loss, input or ``keep`` blob (nor is the top);
    - a layer before it that may compute the top (a convolution it runs fused with: :func:`written_from`)
      neither writes nor reads: the other bottom of a residual block's sum, its shortcut.

    The data is that bottom's as :func:`split_aliases` reads it (the blob that holds it)."""
    splits = split_aliases(graph)
    root = _root(splits)
    own, _, last = _data_lifetimes(graph, keep, root)
    aliases = {}
    for index, node in enumerate(graph.nodes):
        if not node.layer.may_write_over_bottom(node.spec) or len(node.tops) != 1 or node.tops[0] in node.bottoms:
            continue
        computing = written_from(graph, index)
        touched = ({root(name) for name in (*graph.nodes[computing].tops, *graph.nodes[computing].bottoms)}
                   if computing != index else set())
        roots = [root(name) for name in node.bottoms]
        taken = [source for source in roots if source not in touched and roots.count(source) == 1
                 and last.get(source) == index and source not in own]
        if taken and root(node.tops[0]) not in own:
            aliases[node.tops[0]] = taken[0]
    return aliases


def data_aliases(graph: Graph, keep: Iterable[str] = ()) -> dict[str, str]:
    """``{blob: the blob whose data it uses}`` in a net run forward only whose data shares buffers, the Split
    tops (:func:`split_aliases`) and the sums written over a bottom (:func:`sum_aliases`) each mapped to the
    blob at the end of the chain (a Split of a sum's top: the sum's bottom)."""
    aliases = split_aliases(graph) | sum_aliases(graph, keep)
    root = _root(aliases)
    return {name: root(name) for name in aliases}


def _root(aliases: dict[str, str]) -> Callable[[str], str]:
    """The blob whose data a blob uses, following ``aliases`` to the end."""
    def root(name: str) -> str:
        while name in aliases:
            name = aliases[name]
        return name

    return root


def _data_lifetimes(graph: Graph, keep: Iterable[str], root: Callable[[str], str]
                    ) -> tuple[set[str], dict[str, int], dict[str, int]]:
    """``(the data kept apart, {data: its first step}, {data: its last reader's step})`` of a net run forward only,
    each blob counted as its ``root``."""
    own = {root(name) for name in [*graph.outputs, *keep]}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        if not node.layer.overwrites:
            own.update(root(name) for name in [*node.tops, *node.bottoms])
        for name, weight in zip(node.tops, node.loss_weights):
            if not node.bottoms or weight:
                own.add(root(name))
            first.setdefault(root(name), written_from(graph, index))
        for name in node.bottoms:
            last[root(name)] = index
    return own, first, last


def data_plan(graph: Graph, keep: Iterable[str] = (), size: Callable[[str], int] | None = None) -> Plan:
    """Shared buffers for the data of a net run forward only, keeping the outputs, the losses (the net sums them
    after the pass) and ``keep`` apart (see the module's text).  A blob that uses another's data
    (:func:`data_aliases`) counts as that one.  ``size`` as :func:`diff_plan`'s."""
    aliases = data_aliases(graph, keep)
    own, first, last = _data_lifetimes(graph, keep, lambda name: aliases.get(name, name))
    lifetimes = {name: (start, last.get(name, start)) for name, start in first.items() if name not in own}
    return pack(lifetimes, {name: _size(graph, size, name) for name in lifetimes})


def written_from(graph: Graph, index: int) -> int:
    """The first step at which node ``index``'s tops may be written: its own, or that of a layer before it whose
    pass may compute them (of a type in its ``computed_by``), which writes one of its bottoms with only layers in
    place on that bottom between (a residual block's sum, computed by the convolution before it)."""
    node = graph.nodes[index]
    step = index - 1
    while step >= 0 and graph.nodes[step].tops == graph.nodes[step].bottoms:
        step -= 1
    if step >= 0 and graph.nodes[step].layer.type in node.layer.computed_by and \
            set(graph.nodes[step].tops) & set(node.bottoms):
        return step
    return index


def pack(lifetimes: dict[str, tuple[int, int]], sizes: dict[str, int]) -> Plan:
    """Give each array (``lifetimes[name]`` = its first and last step, both included; ``sizes[name]`` elements)
    a buffer no other array uses at the same steps.

    Arrays are placed in the order they start; each takes the smallest free
    buffer that holds it, else grows the largest free one, else opens a new
    buffer.  A buffer is free again after the last step of its array.
    """
    buffers: list[int] = []
    buffer_of: dict[str, int] = {}
    free: set[int] = set()
    ends: dict[int, list[int]] = {}
    for name in sorted(lifetimes, key=lambda name: (lifetimes[name][0], -sizes[name], name)):
        start, end = lifetimes[name]
        for step in [step for step in ends if step < start]:
            free.update(ends.pop(step))
        fitting = [k for k in free if buffers[k] >= sizes[name]]
        if fitting:
            chosen = min(fitting, key=lambda k: (buffers[k], k))
        elif free:
            chosen = max(free, key=lambda k: (buffers[k], -k))
            buffers[chosen] = sizes[name]
        else:
            chosen = len(buffers)
            buffers.append(sizes[name])
        free.discard(chosen)
        buffer_of[name] = chosen
        ends.setdefault(end, []).append(chosen)
    return Plan(buffers, buffer_of)


ALIGNMENT = 16  # elements between the starts of grouped blobs: 64 bytes of float32, what vector units and cuDNN like


@dataclass(frozen=True)
class ParamGroups:
    """Learnable blobs laid out in flat buffers, one per ``(lr_mult, decay_mult)``.

    Group ``g`` has ``multipliers[g]`` and ``sizes[g]`` elements;
    ``place[(node index, blob index)]`` is ``(g, offset)``.  Each blob
    starts at a multiple of :data:`ALIGNMENT` elements; the gaps hold zeros,
    which every update keeps at zero.
    """

    multipliers: list[tuple[float, float]]
    sizes: list[int]
    place: dict[tuple[int, int], tuple[int, int]]


def param_groups(graph: Graph) -> ParamGroups:
    """The flat layout of the blobs that train (owned, ``lr_mult`` not 0), grouped by their multipliers, in net
    order within a group."""
    multipliers: list[tuple[float, float]] = []
    sizes: list[int] = []
    place = {}
    for index, node in enumerate(graph.nodes):
        for blob, (shape, spec, owner) in enumerate(zip(node.param_shapes, node.param_specs, node.param_owners)):
            if owner is not None or spec.lr_mult == 0:
                continue
            key = (spec.lr_mult, spec.decay_mult)
            if key not in multipliers:
                multipliers.append(key)
                sizes.append(0)
            group = multipliers.index(key)
            place[(index, blob)] = (group, sizes[group])
            sizes[group] += -(-math.prod(shape) // ALIGNMENT) * ALIGNMENT
    return ParamGroups(multipliers, sizes, place)
