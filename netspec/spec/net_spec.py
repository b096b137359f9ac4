"""Net files: the layers as written, validated against their types' parameter blocks.

:func:`parse_net` reads a net from a path or YAML text (expanding modules,
repeats and includes first) and returns a :class:`NetConfig`, or raises one
ConfigError listing every problem with its file:line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Literal

from netspec.errors import ConfigError, NetspecError, Problem, did_you_mean, shown, shown_name
from netspec.spec.modules import expand_net, uses_modules
from netspec.spec.schema import INVALID, Context, convert_value, doc, read_block
from netspec.spec.yaml_lines import YamlMap, load_yaml, read_source, to_plain


@dataclass
class ParamSpec:
    """How one learnable blob of a layer trains and whether it is shared (Caffe's ParamSpec)."""

    name: str | None = doc(None, "share this blob with every layer that uses the same name")
    lr_mult: float = doc(1.0, "multiplier on the solver's learning rate")
    decay_mult: float = doc(1.0, "multiplier on the solver's weight decay")
    share_mode: Literal["STRICT", "PERMISSIVE"] = doc(
        "STRICT", "STRICT: shapes must be equal; PERMISSIVE: counts must be equal")


@dataclass
class NetStateRule:
    """A condition on the net state, used by ``include``/``exclude``."""

    phase: Literal["TRAIN", "TEST"] | None = doc(None, "the phase the net must be built for")
    min_level: int | None = doc(None, "the net's level must be at least this")
    max_level: int | None = doc(None, "the net's level must be at most this")
    stage: list[str] = doc([], "every listed stage must be active")
    not_stage: list[str] = doc([], "no listed stage may be active")

    def matches(self, state: NetState) -> bool:
        """True when ``state`` satisfies every condition of this rule."""
        if self.phase is not None and self.phase != state.phase:
            return False
        if self.min_level is not None and state.level < self.min_level:
            return False
        if self.max_level is not None and state.level > self.max_level:
            return False
        if any(s not in state.stage for s in self.stage):
            return False
        return not any(s in state.stage for s in self.not_stage)


@dataclass
class NetState:
    """The phase, level and stages a net is built for."""

    phase: Literal["TRAIN", "TEST"] = doc("TEST", "TRAIN or TEST")
    level: int = doc(0, "a number that include and exclude rules compare with min_level and max_level")
    stage: list[str] = doc([], "active stages")

    def describe(self) -> str:
        """The state as a user would say it: ``phase TRAIN, stage a, b, level 0``."""
        stages = f"stage {', '.join(self.stage)}" if self.stage else "no stage"
        return f"phase {self.phase}, {stages}, level {self.level}"


@dataclass
class LayerSpec:
    """One layer as written in the file, validated but not yet placed in a graph."""

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    blocks: dict[str, Any]
    params: list[ParamSpec]
    include: list[NetStateRule]
    exclude: list[NetStateRule]
    loss_weight: list[float] | None
    propagate_down: list[bool] | None
    file: str | None
    line: int
    key_lines: dict[str, int]
    via: str | None = None

    def line_of(self, key: str) -> int:
        """Line of a key of this layer, or of the layer itself."""
        return self.key_lines.get(key, self.line)

    def problem(self, message: str, key: str | None = None) -> Problem:
        """A Problem located at this layer (and key)."""
        top_key = key.split(".")[0] if key else None
        return Problem(message, file=self.file or "<string>", line=self.line_of(top_key),
                       layer=self.name, key=key, via=self.via)


@dataclass
class NetConfig:
    """A whole net file (or a net written inline in a solver file), parsed and validated."""

    name: str
    layers: list[LayerSpec]
    force_backward: bool
    state: NetState
    file: str | None
    config_hash: str

    def stages_named(self) -> list[str]:
        """Every stage the layers' include and exclude rules name, sorted."""
        rules = [rule for layer in self.layers for rule in (*layer.include, *layer.exclude)]
        return sorted({stage for rule in rules for stage in (*rule.stage, *rule.not_stage)})


MAX_NAME = 256  # characters of a layer or blob name

# The keys of a layer and of a net, with what each means (the reference pages print these).
LAYER_KEYS = {
    "name": "the layer's name, unique in the net; weights are saved and loaded by it",
    "type": "the layer type (netspec layers lists them)",
    "bottom": "the blob(s) it reads: a name or a list",
    "top": "the blob(s) it writes: a name or a list; top i named as bottom i runs in place",
    "param": "one mapping per learnable blob: name (to share it), lr_mult, decay_mult, share_mode",
    "include": "build the layer only in these states (one mapping or a list: any may match)",
    "exclude": "leave the layer out in these states (one mapping or a list: any may match)",
    "loss_weight": "weight of each top in the loss (a number or one per top; loss layers: 1)",
    "propagate_down": "per bottom, whether the gradient goes back to it (true or false each)",
}
NET_KEYS = {
    "name": "the net's name",
    "layers": "the layers, run in file order (and module uses and repeats)",
    "force_backward": "compute every gradient, even those no loss needs",
    "state": "the phase, level and stages the net is built for when nothing else says",
}


def _read_list(node, key: str, item_tp, ctx: Context, line: int):
    value = node.get(key)
    if value is None:
        return []
    converted = convert_value(list[item_tp], value, ctx, key, node.line_of(key) if isinstance(node, YamlMap) else line)
    return [] if converted is INVALID else converted


def parse_layer(node, index: int, layer_schemas: dict[str, dict[str, type]], ctx: Context,
                line: int) -> LayerSpec | None:
    """Validate one entry of ``layers``; returns None when it is beyond repair."""
    if not isinstance(node, dict):
        ctx.add(f"layer #{index + 1} must be a mapping, got {type(node).__name__}", line)
        return None
    name = node.get("name")
    ctx.layer = name if isinstance(name, str) else f"#{index + 1}"
    if getattr(node, "file", None) or getattr(node, "via", None):
        ctx.origin = (getattr(node, "file", None) or ctx.file, getattr(node, "via", None))
    if not isinstance(name, str) or not name:
        ctx.add("every layer needs a 'name' (a non-empty string)", node.line, "name")
    elif name in (".", "..") or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > MAX_NAME:
        ctx.layer = shown_name(name)
        ctx.add(f"a layer name cannot be '.' or '..', hold control characters or be longer than {MAX_NAME} "
                f"characters, got {shown(name)} (weight files store layers by name)", node.line_of("name"), "name")
    type_name = node.get("type")
    schema: dict[str, type] = {}
    if not isinstance(type_name, str):
        ctx.add("every layer needs a 'type'", node.line, "type")
    elif type_name not in layer_schemas:
        ctx.add(f"unknown layer type {shown(type_name)}{did_you_mean(type_name, layer_schemas)}"
                " (netspec layers lists them)", node.line_of("type"), "type")
    else:
        schema = layer_schemas[type_name]
    known_keys = list(LAYER_KEYS) + list(schema)
    for key in node:
        if key in known_keys:
            continue
        if type_name in layer_schemas and str(key).endswith("_param"):
            takes = ", ".join(schema) or "no parameter block"
            hint = did_you_mean(key, schema)
            ctx.add(f"a {type_name} layer takes no '{key}'{hint or f' (it takes {takes})'}",
                    node.line_of(key))
        elif type_name in layer_schemas or not str(key).endswith("_param"):
            ctx.add(f"unknown key '{key}'{did_you_mean(key, known_keys)}", node.line_of(key))
    blocks = {}
    for block_name, block_cls in schema.items():
        block = read_block(block_cls, node.get(block_name), ctx, block_name, node.line_of(block_name))
        blocks[block_name] = block_cls() if block is INVALID else block
    loss_weight = _read_list(node, "loss_weight", float, ctx, node.line) if "loss_weight" in node else None
    propagate_down = (_read_list(node, "propagate_down", bool, ctx, node.line)
                      if "propagate_down" in node else None)
    spec = LayerSpec(
        name=name if isinstance(name, str) else f"#{index + 1}",
        type=type_name if isinstance(type_name, str) else "",
        bottoms=_read_list(node, "bottom", str, ctx, node.line),
        tops=_read_list(node, "top", str, ctx, node.line),
        blocks=blocks,
        params=_read_list(node, "param", ParamSpec, ctx, node.line),
        include=_read_list(node, "include", NetStateRule, ctx, node.line),
        exclude=_read_list(node, "exclude", NetStateRule, ctx, node.line),
        loss_weight=loss_weight,
        propagate_down=propagate_down,
        file=ctx.origin[0] if ctx.origin else ctx.file,
        line=node.line,
        key_lines=dict(node.key_lines),
        via=ctx.origin[1] if ctx.origin else None,
    )
    for key, names in (("bottom", spec.bottoms), ("top", spec.tops)):
        for blob in names:
            if len(blob) > MAX_NAME:
                ctx.add(f"a blob name is longer than {MAX_NAME} characters: {shown(blob)}", node.line_of(key), key)
    if spec.include and spec.exclude:
        ctx.add("give 'include' or 'exclude', not both", node.line_of("exclude"), "exclude")
    ctx.layer, ctx.origin = None, None
    return spec if isinstance(name, str) and name and type_name in layer_schemas else None


def config_hash(tree) -> str:
    """A stable sha256 of a parsed YAML tree (key order and comments do not matter)."""
    text = json.dumps(to_plain(tree), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def parse_net(source, layer_schemas: dict[str, dict[str, type]]) -> NetConfig:
    """Read and validate a net from a path or YAML text.

    ``layer_schemas`` maps each layer type to ``{block name: params dataclass}``.
    Raises ConfigError listing every problem found.
    """
    text, filename = read_source(source)
    tree = load_yaml(text, filename)
    base_dir = os.path.dirname(os.path.abspath(filename)) if filename else os.getcwd()
    ctx = Context(filename, base_dir)
    spec = read_net(tree, ctx, layer_schemas, 1)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    if not spec.name and filename:  # (a net file without a name is known by the file's: never as net '')
        spec.name = os.path.splitext(os.path.basename(filename))[0]
    return spec


def read_net(tree, ctx: Context, layer_schemas: dict[str, dict[str, type]], line: int) -> NetConfig | None:
    """Validate a parsed net mapping (a whole file, or a net written inline in a solver file).

    Problems are recorded in ``ctx``; returns None when ``tree`` is not a mapping.
    """
    if not isinstance(tree, YamlMap):
        ctx.add("a net must be a mapping with a 'layers' list", line)
        return None
    if uses_modules(tree):
        tree = expand_net(tree, ctx)
    for key in tree:
        if key not in NET_KEYS:
            ctx.add(f"unknown key '{key}'{did_you_mean(key, NET_KEYS)}", tree.line_of(key))
    name = tree.get("name", "")
    if not isinstance(name, str):
        ctx.add("expected a string", tree.line_of("name"), "name")
        name = ""
    force_backward = tree.get("force_backward", False)
    if not isinstance(force_backward, bool):
        ctx.add("expected true or false", tree.line_of("force_backward"), "force_backward")
        force_backward = False
    state = read_block(NetState, tree.get("state"), ctx, "state", tree.line_of("state"))
    layer_nodes = tree.get("layers")
    layers: list[LayerSpec] = []
    if not isinstance(layer_nodes, list) or not layer_nodes:
        ctx.add("the net needs a non-empty 'layers' list", tree.line_of("layers"), "layers")
        layer_nodes = []
    for index, node in enumerate(layer_nodes):
        spec = parse_layer(node, index, layer_schemas, ctx, layer_nodes.line_of(index))
        if spec is not None:
            layers.append(spec)
    return NetConfig(name=name, layers=layers, force_backward=force_backward,
                   state=state if state is not INVALID else NetState(),
                   file=ctx.file, config_hash=config_hash(tree))


def in_phase(layer: LayerSpec, phase: str) -> bool:
    """Whether ``phase`` (TRAIN or TEST) includes ``layer`` as far as its rules' phases say (stages and levels
    aside)."""
    if layer.include:
        return any(rule.phase in (None, phase) for rule in layer.include)
    return not any(rule.phase == phase for rule in layer.exclude)


def with_batch_size(net: NetConfig, batch_size: int, phase: str) -> NetConfig:
    """A copy of ``net`` whose data layers in ``phase`` read ``batch_size`` rows a batch (the other phase's
    keep theirs).

    Its data layers are those with a ``batch_size`` parameter that ``phase`` includes, by their phase rules; a
    net with none (a deploy net) takes the batch size as the first axis of its first Input layer's shapes; a net
    with neither is refused (NetspecError).
    """
    layers = list(net.layers)
    batched = [index for index, layer in enumerate(layers) if in_phase(layer, phase) and _batch_block(layer)]
    for index in batched:
        layer = layers[index]
        block = _batch_block(layer)
        layers[index] = dataclasses.replace(layer, blocks={
            **layer.blocks, block: dataclasses.replace(layer.blocks[block], batch_size=batch_size)})
    inputs = [index for index, layer in enumerate(layers) if in_phase(layer, phase) and layer.type == "Input"
              and layer.blocks["input_param"].shape]
    if not batched and inputs:
        layer = layers[inputs[0]]
        params = layer.blocks["input_param"]
        shapes = [dataclasses.replace(shape, dim=[batch_size, *shape.dim[1:]]) for shape in params.shape]
        layers[inputs[0]] = dataclasses.replace(layer, blocks={
            **layer.blocks, "input_param": dataclasses.replace(params, shape=shapes)})
    elif not batched:
        raise NetspecError(f"{net.file or net.name}: no data layer with a batch_size, nor an Input layer, in the "
                           f"{phase} phase, so a batch size cannot be set")
    return dataclasses.replace(net, layers=layers)


def _batch_block(layer: LayerSpec) -> str | None:
    """The name of the layer's parameter block that has a ``batch_size`` (a data layer's), or None."""
    return next((name for name, params in layer.blocks.items() if hasattr(params, "batch_size")), None)
