"""Reading net files: YAML with line numbers, typed schemas, every error at once.

YAML is read with ``yaml.SafeLoader`` semantics (no tags that build objects);
mappings and lists come back as :class:`YamlMap` / :class:`YamlList`, which
remember the line of each key and item so that every problem can be reported
as ``file:line``.  Parameter blocks are plain dataclasses; :func:`read_block`
checks a mapping against one and collects problems instead of stopping at the
first.  Which blocks a layer type takes is passed in by the caller, so this
module knows nothing of layers.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from netspec.errors import ConfigError, Problem

PHASES = ("TRAIN", "TEST")


class FilePath(str):
    """Annotation for a parameter naming a file; relative values resolve against the config's folder."""


class YamlMap(dict):
    """A dict read from YAML that knows the line of itself and of each key."""

    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key) -> int:
        """Line of ``key``, or of the mapping itself when the key is absent."""
        return self.key_lines.get(key, self.line)


class YamlList(list):
    """A list read from YAML that knows the line of itself and of each item."""

    line: int = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int:
        """Line of item ``index``."""
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences keep their line numbers."""


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    result = YamlMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first on line {result.key_lines[key]})",
                key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_list(loader: _LineLoader, node: yaml.SequenceNode) -> YamlList:
    result = YamlList(loader.construct_object(item, deep=True) for item in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [item.start_mark.line + 1 for item in node.value]
    return result


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_list)


def did_you_mean(word: str, candidates) -> str:
    """A ``"; did you mean 'x'?"`` suffix for the closest candidate, or ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    if not close:
        lowered = {str(c).lower(): str(c) for c in candidates}
        if str(word).lower() in lowered:
            close = [lowered[str(word).lower()]]
    return f"; did you mean '{close[0]}'?" if close else ""


def read_source(source: str | os.PathLike) -> tuple[str, str | None]:
    """Return ``(text, filename)`` for a path or for YAML text given inline.

    A string is taken as a path when it names an existing file or when it is a
    single line ending in ``.yaml``/``.yml``; anything else is YAML text.
    """
    text = os.fspath(source)
    looks_like_path = "\n" not in text and (os.path.isfile(text) or text.endswith((".yaml", ".yml")))
    if not looks_like_path:
        return text, None
    try:
        with open(text, encoding="utf-8") as handle:
            return handle.read(), text
    except OSError as exc:
        raise ConfigError(Problem(f"cannot read the file: {exc.strerror}", file=text)) from None


def load_yaml(text: str, filename: str | None = None) -> Any:
    """Parse YAML text with line tracking; a syntax error becomes a one-line ConfigError."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"malformed YAML: {reason}" + (f" ({context})" if context else "")
        raise ConfigError(Problem(message, file=filename or "<string>", line=line)) from None


@dataclass
class Context:
    """Where problems are collected while reading one config file."""

    file: str | None
    base_dir: str
    problems: list[Problem] = field(default_factory=list)
    layer: str | None = None
    origin: tuple[str | None, str | None] | None = None  # (file, via) of a layer expanded from a module

    def add(self, message: str, line: int | None = None, key: str | None = None) -> None:
        """Record one problem at ``line`` (of the module's file, for a layer expanded from a module)."""
        file, via = self.origin or (self.file, None)
        self.problems.append(Problem(message, file=file or "<string>", line=line, layer=self.layer, key=key, via=via))

    def add_at(self, file: str | None, line: int | None, message: str, via: str | None = None) -> None:
        """Record one problem in another file (an included one) or from a module use."""
        self.problems.append(Problem(message, file=file or "<string>", line=line, via=via))


def required(**kwargs):
    """A dataclass field with no default that the user must give."""
    return field(default=None, metadata={"required": True, **kwargs})


def doc(default, text: str, **kwargs):
    """A dataclass field with a default and a one-line description."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": text, **kwargs})
    return field(default=default, metadata={"doc": text, **kwargs})


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"{_type_name(typing.get_args(tp)[0])} or a list of them"
    if origin is dict:
        return f"a mapping of {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if tp is FilePath:
        return "a file path"
    return getattr(tp, "__name__", str(tp))


_INVALID = object()


def convert_value(tp, value, ctx: Context, key: str, line: int):
    """Check ``value`` against annotation ``tp``; return it converted, or _INVALID after recording why."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return convert_value(inner[0], value, ctx, key, line)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, str) and value in choices:
            return value
        ctx.add(f"'{value}' is not one of {', '.join(choices)}{did_you_mean(value, choices)}", line, key)
        return _INVALID
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]
        out = []
        for index, item in enumerate(items):
            item_line = items.line_of(index) if isinstance(items, YamlList) else line
            converted = convert_value(item_tp, item, ctx, key, item_line)
            if converted is _INVALID:
                return _INVALID
            out.append(converted)
        return out
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            ctx.add(f"expected a mapping, got {type(value).__name__} {value!r}", line, key)
            return _INVALID
        out = {}
        for name, item in value.items():
            item_line = value.line_of(name) if isinstance(value, YamlMap) else line
            converted = convert_value(value_tp, item, ctx, f"{key}.{name}", item_line)
            if converted is _INVALID or convert_value(key_tp, name, ctx, key, item_line) is _INVALID:
                return _INVALID
            out[name] = converted
        return out
    if dataclasses.is_dataclass(tp):
        return read_block(tp, value, ctx, key, line)
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp in (str, FilePath) and isinstance(value, str))
    )
    if not ok:
        ctx.add(f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}", line, key)
        return _INVALID
    if tp is float:
        return float(value)
    if tp is FilePath:
        return FilePath(os.path.normpath(os.path.join(ctx.base_dir, os.path.expanduser(value))))
    return value


def read_block(cls, node, ctx: Context, prefix: str, line: int):
    """Build dataclass ``cls`` from mapping ``node``, recording unknown keys and bad values.

    Returns an instance built from the valid keys (defaults elsewhere), or
    _INVALID when ``node`` is not a mapping at all.
    """
    if node is None:
        node = YamlMap()
    if not isinstance(node, dict):
        ctx.add(f"expected a mapping of parameters, got {type(node).__name__} {node!r}", line, prefix)
        return _INVALID
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    node_line = getattr(node, "line", line) or line
    for key in node:
        if key not in known:
            key_line = node.line_of(key) if isinstance(node, YamlMap) else line
            ctx.add(f"unknown parameter '{key}'{did_you_mean(key, known)}", key_line, prefix)
    kwargs = {}
    for name, spec in known.items():
        path = f"{prefix}.{name}" if prefix else name
        if name in node:
            key_line = node.line_of(name) if isinstance(node, YamlMap) else line
            value = convert_value(hints[name], node[name], ctx, path, key_line)
            if value is not _INVALID:
                kwargs[name] = value
        elif spec.metadata.get("required"):
            ctx.add("missing required parameter", node_line, path)
    return cls(**kwargs)


# --------------------------------------------------------------------------- specs


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

    phase: Literal["TRAIN", "TEST"] | None = None
    min_level: int | None = None
    max_level: int | None = None
    stage: list[str] = doc([], "every listed stage must be active")
    not_stage: list[str] = doc([], "no listed stage may be active")

    def matches(self, state: "NetState") -> bool:
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

    phase: Literal["TRAIN", "TEST"] = "TEST"
    level: int = 0
    stage: list[str] = doc([], "active stages")


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
class NetSpec:
    """A whole net file, validated."""

    name: str
    layers: list[LayerSpec]
    force_backward: bool
    state: NetState
    file: str | None
    config_hash: str


_LAYER_KEYS = ("name", "type", "bottom", "top", "param", "include", "exclude",
               "loss_weight", "propagate_down")
_NET_KEYS = ("name", "layers", "force_backward", "state")


def _read_list(node, key: str, item_tp, ctx: Context, line: int):
    value = node.get(key)
    if value is None:
        return []
    converted = convert_value(list[item_tp], value, ctx, key, node.line_of(key) if isinstance(node, YamlMap) else line)
    return [] if converted is _INVALID else converted


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
    type_name = node.get("type")
    schema: dict[str, type] = {}
    if not isinstance(type_name, str):
        ctx.add("every layer needs a 'type'", node.line, "type")
    elif type_name not in layer_schemas:
        ctx.add(f"unknown layer type '{type_name}'{did_you_mean(type_name, layer_schemas)}"
                " (netspec layers lists them)", node.line_of("type"), "type")
    else:
        schema = layer_schemas[type_name]
    known_keys = list(_LAYER_KEYS) + list(schema)
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
        blocks[block_name] = block_cls() if block is _INVALID else block
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
    if spec.include and spec.exclude:
        ctx.add("give 'include' or 'exclude', not both", node.line_of("exclude"), "exclude")
    ctx.layer, ctx.origin = None, None
    return spec if isinstance(name, str) and name and type_name in layer_schemas else None


def _to_plain(value):
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_plain(v) for v in value]
    return value


def config_hash(tree) -> str:
    """A stable sha256 of a parsed YAML tree (key order and comments do not matter)."""
    text = json.dumps(_to_plain(tree), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def parse_net(source, layer_schemas: dict[str, dict[str, type]]) -> NetSpec:
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
    return spec


def read_net(tree, ctx: Context, layer_schemas: dict[str, dict[str, type]], line: int) -> NetSpec | None:
    """Validate a parsed net mapping (a whole file, or a net written inline in a solver file).

    Problems are recorded in ``ctx``; returns None when ``tree`` is not a mapping.
    """
    if not isinstance(tree, YamlMap):
        ctx.add("a net must be a mapping with a 'layers' list", line)
        return None
    from netspec.modules import expand_net, uses_modules  # noqa: PLC0415 - modules builds on this module

    if uses_modules(tree):
        tree = expand_net(tree, ctx)
    for key in tree:
        if key not in _NET_KEYS:
            ctx.add(f"unknown key '{key}'{did_you_mean(key, _NET_KEYS)}", tree.line_of(key))
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
    return NetSpec(name=name, layers=layers, force_backward=force_backward,
                   state=state if state is not _INVALID else NetState(),
                   file=ctx.file, config_hash=config_hash(tree))
