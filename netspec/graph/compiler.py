"""Compilation: pure passes from a validated NetConfig to a static :class:`Graph`, in Caffe's order.

NetState filtering, producer/consumer checks with in-place detection,
automatic Split insertion at fan-out, static shape and FLOP inference, weight
sharing by param name, loss weights, need-backward inference, and the net's
outputs.  Every problem found is collected and raised together as one
ConfigError.  The layer classes come from the caller (``layer_types``, the
engine's registry), so this package never imports the engine: it reads their
declared counts and flags and asks :meth:`describe` for shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from netspec.errors import ConfigError, ParamError, Problem, ShapeError, did_you_mean
from netspec.graph.graph import Graph, Node
from netspec.spec.net_spec import LayerSpec, NetConfig, NetState, ParamSpec

MAX_DIMENSION = 2 ** 31 - 1  # of a blob's axis (Caffe's int)
MAX_VALUES = 2 ** 47  # in one blob: 512 TiB of float32, more than any machine holds
TOO_LARGE = (f"(more than any machine holds: an axis of at most {MAX_DIMENSION:,}, at most 2^47 values); check the "
             "layer's parameters")


def _oversized(shape) -> bool:
    """Whether a blob of ``shape`` is beyond MAX_DIMENSION or MAX_VALUES (exact integers: no overflow)."""
    return any(d > MAX_DIMENSION for d in shape) or math.prod(shape) > MAX_VALUES


@dataclass
class _Version:
    """One value of a blob name: produced by one top, read by some bottoms."""

    name: str
    producer: int
    top_index: int
    consumers: list[tuple[int, int]] = field(default_factory=list)


def included(spec: LayerSpec, state: NetState) -> bool:
    """True when a layer belongs in a net built for ``state`` (its include/exclude rules, Caffe's semantics)."""
    if spec.include:
        return any(rule.matches(state) for rule in spec.include)
    return not any(rule.matches(state) for rule in spec.exclude)


def _count_ok(count: int, bounds: tuple[int, int | None]) -> bool:
    low, high = bounds
    return count >= low and (high is None or count <= high)


def _describe(bounds: tuple[int, int | None]) -> str:
    low, high = bounds
    if high == low:
        return str(low)
    return f"at least {low}" if high is None else f"{low} to {high}"


def _split_spec(base: LayerSpec, blob: str, top_index: int, fan_out: int) -> LayerSpec:
    name = f"{blob}_{base.name}_{top_index}_split"
    return LayerSpec(name=name, type="Split", bottoms=[blob],
                     tops=[f"{name}_{j}" for j in range(fan_out)], blocks={}, params=[], include=[],
                     exclude=[], loss_weight=None, propagate_down=None, file=base.file,
                     line=base.line, key_lines={})


class _Compiler:
    def __init__(self, spec: NetConfig, state: NetState, layer_types: Mapping[str, type]):
        self.spec = spec
        self.state = state
        self.layer_types = layer_types
        self.problems: list[Problem] = []
        self.nodes: list[Node] = []
        self.versions: list[_Version] = []
        self.bottom_versions: list[list[int]] = []
        self.top_versions: list[list[int]] = []
        self.broken: set[int] = set()

    def fail(self, spec: LayerSpec, message: str, key: str | None = None) -> None:
        self.problems.append(spec.problem(message, key))

    def compile(self) -> Graph:
        specs = [s for s in self.spec.layers if included(s, self.state)]
        if not specs:
            raise ConfigError(Problem(f"no layer is included in phase {self.state.phase}",
                                      file=self.spec.file or "<string>"))
        self.connect(specs)
        self.insert_splits()
        self.name_blobs()
        blob_shapes = self.infer_shapes()
        self.share_params()
        self.assign_loss_weights()
        if self.problems:
            raise ConfigError(self.problems)
        self.infer_backward()
        outputs = [self.versions[v].name for v, version in enumerate(self.versions) if not version.consumers]
        return Graph(name=self.spec.name, state=self.state, nodes=self.nodes, blob_shapes=blob_shapes,
                     outputs=outputs, config_hash=self.spec.config_hash, file=self.spec.file)

    # ---- structure ----------------------------------------------------------------------
    def connect(self, specs: list[LayerSpec]) -> None:
        """Resolve bottoms to earlier tops, check counts and in-place use."""
        producers_later = {top: s for s in specs for top in s.tops}
        current: dict[str, int] = {}
        names: dict[str, int] = {}
        for spec in specs:
            if spec.name in names:
                self.fail(spec, f"layer name used twice in phase {self.state.phase} (first on line "
                                f"{names[spec.name]})", "name")
            names.setdefault(spec.name, spec.line)
            cls = self.layer_types[spec.type]
            index = len(self.nodes)
            if hasattr(cls, "resolve_class"):  # a type standing for a class its parameters name (Python layers)
                try:
                    cls = cls.resolve_class(spec)
                except ParamError as exc:
                    self.fail(spec, str(exc), exc.key)
                    self.broken.add(index)
            node = Node(layer=cls, spec=spec, bottoms=list(spec.bottoms), tops=list(spec.tops))
            self.nodes.append(node)
            if not _count_ok(len(spec.bottoms), cls.num_bottoms):
                self.fail(spec, f"a {spec.type} layer takes {_describe(cls.num_bottoms)} bottom(s), "
                                f"got {len(spec.bottoms)}", "bottom")
                self.broken.add(index)
            if not _count_ok(len(spec.tops), cls.num_tops):
                self.fail(spec, f"a {spec.type} layer takes {_describe(cls.num_tops)} top(s), "
                                f"got {len(spec.tops)}", "top")
                self.broken.add(index)
            if spec.propagate_down is not None and len(spec.propagate_down) != len(spec.bottoms):
                self.fail(spec, f"needs one entry per bottom ({len(spec.bottoms)})", "propagate_down")
            bottom_versions = []
            for j, blob in enumerate(spec.bottoms):
                if blob in current:
                    version = current[blob]
                    self.versions[version].consumers.append((index, j))
                    bottom_versions.append(version)
                    continue
                self.broken.add(index)
                bottom_versions.append(-1)
                later = producers_later.get(blob)
                if later is not None and later is not spec and later.line >= spec.line:
                    self.fail(spec, f"bottom '{blob}' is produced later, by layer '{later.name}' "
                                    f"(line {later.line}); layers run in file order, so move it "
                                    "before its consumers (or break the cycle)", "bottom")
                elif later is spec:
                    self.fail(spec, f"bottom '{blob}' is this layer's own top: a cycle", "bottom")
                elif (left_out := self.left_out_producer(blob, spec)) is not None:
                    self.fail(spec, f"bottom '{blob}' comes from layer '{left_out.name}' (line {left_out.line}), "
                                    f"which a net of {self.state.describe()} leaves out; the file's stages: "
                                    f"{', '.join(self.spec.stages_named()) or 'none'}", "bottom")
                else:
                    self.fail(spec, f"bottom '{blob}' is not produced by any earlier layer"
                                    f"{_blob_hint(blob, current)}", "bottom")
            top_versions = []
            for j, blob in enumerate(spec.tops):
                in_place = j < len(spec.bottoms) and spec.bottoms[j] == blob
                node.inplace.append(in_place)
                if in_place and not cls.inplace_ok:
                    self.fail(spec, f"a {spec.type} layer cannot run in place (top '{blob}' is also "
                                    "its bottom); give the top another name", "top")
                elif not in_place and blob in spec.bottoms:
                    self.fail(spec, f"top '{blob}' is also bottom #{spec.bottoms.index(blob)}; in-place "
                                    "use needs the top at the same position as its bottom", "top")
                elif not in_place and blob in current and not (j < len(spec.bottoms) and bottom_versions[j] < 0):
                    # (with its bottom missing, a layer meant to run in place already has its error)
                    producer = self.nodes[self.versions[current[blob]].producer].spec
                    self.fail(spec, f"top '{blob}' is already produced by layer '{producer.name}' "
                                    f"(line {producer.line}); each blob is produced once", "top")
                self.versions.append(_Version(blob, index, j))
                current[blob] = len(self.versions) - 1
                top_versions.append(current[blob])
            self.bottom_versions.append(bottom_versions)
            self.top_versions.append(top_versions)

    def left_out_producer(self, blob: str, consumer: LayerSpec) -> LayerSpec | None:
        """The last layer before ``consumer`` in the file producing ``blob`` that this net's state filtered out."""
        earlier = self.spec.layers[:next(i for i, s in enumerate(self.spec.layers) if s is consumer)]
        return next((s for s in reversed(earlier) if blob in s.tops and not included(s, self.state)), None)

    def insert_splits(self) -> None:
        """Give every blob read by several bottoms a Split whose tops each feed one reader."""
        if self.problems:
            return
        original = len(self.nodes)
        split_after: dict[int, list[int]] = {}
        for v, version in enumerate(list(self.versions)):
            if len(version.consumers) < 2:
                continue
            producer = self.nodes[version.producer]
            split_spec = _split_spec(producer.spec, version.name, version.top_index, len(version.consumers))
            split_index = len(self.nodes)
            self.nodes.append(Node(layer=self.layer_types["Split"], spec=split_spec,
                                   bottoms=[version.name], tops=list(split_spec.tops),
                                   inplace=[False] * len(version.consumers)))
            tops = []
            for j, (consumer, bottom_index) in enumerate(version.consumers):
                self.versions.append(_Version(split_spec.tops[j], split_index, j, [(consumer, bottom_index)]))
                self.bottom_versions[consumer][bottom_index] = len(self.versions) - 1
                tops.append(len(self.versions) - 1)
            version.consumers = [(split_index, 0)]
            self.bottom_versions.append([v])
            self.top_versions.append(tops)
            split_after.setdefault(version.producer, []).append(split_index)
        order: list[int] = []
        for index in range(original):
            order.append(index)
            order.extend(split_after.get(index, []))
        self.reorder(order)

    def reorder(self, order: list[int]) -> None:
        position = {old: new for new, old in enumerate(order)}
        self.nodes = [self.nodes[i] for i in order]
        self.bottom_versions = [self.bottom_versions[i] for i in order]
        self.top_versions = [self.top_versions[i] for i in order]
        self.broken = {position[i] for i in self.broken}
        for version in self.versions:
            version.producer = position[version.producer]
            version.consumers = [(position[c], j) for c, j in version.consumers]

    def name_blobs(self) -> None:
        """Final blob names: in-place tops keep the (possibly split) name of their bottom."""
        if self.problems:
            return
        for node, bottoms, tops in zip(self.nodes, self.bottom_versions, self.top_versions):
            node.bottoms = [self.versions[v].name for v in bottoms]
            for j, v in enumerate(tops):
                if node.inplace[j]:
                    self.versions[v].name = node.bottoms[j]
            node.tops = [self.versions[v].name for v in tops]

    def infer_shapes(self) -> dict[str, tuple]:
        """Shape every blob and learnable blob, layer by layer, before any array exists."""
        shapes: dict[int, tuple] = {}
        blob_shapes: dict[str, tuple] = {}
        for index, node in enumerate(self.nodes):
            if index in self.broken or any(v not in shapes for v in self.bottom_versions[index]):
                continue
            node.bottom_shapes = [shapes[v] for v in self.bottom_versions[index]]
            try:
                node.top_shapes, node.param_shapes, node.flops = node.layer.describe(
                    node.spec, self.state.phase, node.bottom_shapes)
            except (ShapeError, ParamError) as exc:
                self.fail(node.spec, str(exc), exc.key)
                continue
            oversized = [f"learnable blob {i} {list(shape)}" for i, shape in enumerate(node.param_shapes or [])
                         if _oversized(shape)]
            if oversized:
                self.fail(node.spec, f"{oversized[0]} {TOO_LARGE}", "param")
                continue
            for v, shape in zip(self.top_versions[index], node.top_shapes):
                if any(d < 0 for d in shape):
                    self.fail(node.spec, f"top '{self.versions[v].name}' would have the impossible "
                                         f"shape {shape}", "top")
                    break
                if _oversized(shape):
                    self.fail(node.spec, f"top '{self.versions[v].name}' would be {list(shape)} {TOO_LARGE}", "top")
                    break
                shapes[v] = shape
                blob_shapes[self.versions[v].name] = shape
        return blob_shapes

    def share_params(self) -> None:
        """Pad param specs to the blob count and resolve sharing by name."""
        owners: dict[str, tuple[int, int]] = {}
        for index, node in enumerate(self.nodes):
            spec = node.spec
            count = len(node.param_shapes)
            if len(spec.params) > count and index not in self.broken and node.top_shapes:
                self.fail(spec, f"{len(spec.params)} param entries for a layer with {count} "
                                "learnable blob(s)", "param")
            node.param_specs = [spec.params[i] if i < len(spec.params) else ParamSpec() for i in range(count)]
            if not node.layer.learnable:
                node.param_specs = [ParamSpec(lr_mult=0.0, decay_mult=0.0) for _ in range(count)]
            node.param_owners = [None] * count
            for i, param in enumerate(node.param_specs):
                if not param.name:
                    continue
                if param.name not in owners:
                    owners[param.name] = (index, i)
                    continue
                owner_index, owner_param = owners[param.name]
                owner = self.nodes[owner_index]
                mine, theirs = node.param_shapes[i], owner.param_shapes[owner_param]
                if param.share_mode == "STRICT" and mine != theirs:
                    self.fail(spec, f"shared param '{param.name}' has shape {mine} here but {theirs} in "
                                    f"layer '{owner.name}' (share_mode STRICT)", "param")
                elif math.prod(mine) != math.prod(theirs):
                    self.fail(spec, f"shared param '{param.name}' has {math.prod(mine)} values here but "
                                    f"{math.prod(theirs)} in layer '{owner.name}'", "param")
                owner_spec = owner.param_specs[owner_param]
                for mult in ("lr_mult", "decay_mult"):
                    if getattr(param, mult) != getattr(owner_spec, mult):
                        self.fail(spec, f"shared param '{param.name}' has {mult} {getattr(param, mult)} "
                                        f"here but {getattr(owner_spec, mult)} in layer '{owner.name}'",
                                  "param")
                node.param_owners[i] = (owner_index, owner_param)

    def assign_loss_weights(self) -> None:
        for node in self.nodes:
            spec = node.spec
            count = len(node.tops)
            if spec.loss_weight is not None:
                if len(spec.loss_weight) != count:
                    self.fail(spec, f"needs one weight per top ({count})", "loss_weight")
                node.loss_weights = (list(spec.loss_weight) + [0.0] * count)[:count]
            elif node.layer.is_loss:
                node.loss_weights = [1.0] + [0.0] * (count - 1)
            else:
                node.loss_weights = [0.0] * count

    def infer_backward(self) -> None:
        """Which layers and bottoms need a backward pass (Caffe's rules)."""
        needs = [False] * len(self.versions)
        force = self.spec.force_backward
        for index, node in enumerate(self.nodes):
            params_learn = node.param_propagate_down
            wanted = []
            for j, v in enumerate(self.bottom_versions[index]):
                allowed = j not in node.layer.label_bottoms and (
                    node.spec.propagate_down is None or node.spec.propagate_down[j])
                wanted.append(allowed and (needs[v] or force))
            node.bottom_need_backward = wanted
            node.need_backward = any(wanted) or any(params_learn)
            for v in self.top_versions[index]:
                needs[v] = node.need_backward
        # only layers with a path to a loss need backward
        under_loss = [False] * len(self.versions)
        for index in reversed(range(len(self.nodes))):
            node = self.nodes[index]
            tops = self.top_versions[index]
            contributes = any(w != 0 for w in node.loss_weights) or any(under_loss[v] for v in tops)
            if not contributes and not force:
                node.need_backward = False
            if not node.need_backward:
                node.bottom_need_backward = [False] * len(node.bottoms)
            if contributes:
                for v in self.bottom_versions[index]:
                    under_loss[v] = True
        for index, node in enumerate(self.nodes):
            node.top_diff_written = [
                any(self.nodes[c].bottom_need_backward[j] for c, j in self.versions[v].consumers)
                for v in self.top_versions[index]]


def _blob_hint(blob: str, current: dict[str, int]) -> str:
    hint = did_you_mean(blob, current)
    if hint:
        return hint
    return f" (available: {', '.join(sorted(current))})" if current else ""


def compile_graph(spec: NetConfig, layer_types: Mapping[str, type], phase: str | None = None, stages=None,
                  level: int | None = None) -> Graph:
    """Compile ``spec`` for a NetState; phase/stages/level default to the file's ``state``.

    ``layer_types`` maps every type the spec names (and ``Split``) to its class.
    """
    state = NetState(phase=phase or spec.state.phase,
                     level=spec.state.level if level is None else level,
                     stage=list(spec.state.stage if stages is None else stages))
    return _Compiler(spec, state, layer_types).compile()
