"""YAML with line numbers: every mapping and list read from a file remembers where it came from.

YAML is read with ``yaml.SafeLoader`` semantics (no tags that build objects),
plus the numbers YAML 1.1 leaves as strings (:mod:`netspec.spec.numbers`);
mappings and lists come back as :class:`YamlMap` / :class:`YamlList`, which
remember the line of each key and item so that every problem can be reported
as ``file:line``.

Whatever the file, the work of reading it is bounded: nesting deeper than
:data:`MAX_DEPTH`, more than :data:`MAX_ALIASES` aliases, or a tree that
aliases would expand to more than :data:`MAX_NODES` nodes (an "alias bomb":
a few hundred bytes that unfold into billions of values) is refused while
the file is read, before anything walks the tree.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from netspec.errors import ConfigError, Problem
from netspec.spec.numbers import FIRST_CHARACTERS, FLOAT_YAML_1_1_MISSES

MAX_FILE_BYTES = 64 << 20  # a config file; ResNet-152 written out without modules is about 200 KB
MAX_DEPTH = 100  # nesting levels; a net file needs about 6
MAX_ALIASES = 10_000  # '*name' references in one file
MAX_NODES = 1_000_000  # keys, values and items once aliases are expanded; GoogLeNet written out needs about 20,000


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
    """SafeLoader whose mappings and sequences keep their line numbers, reads ``1e-3`` as a number,
    and refuses documents deeper, more aliased or larger than the module's limits."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _OverLimit(None, None, f"more than {MAX_ALIASES:,} aliases",
                                                  self.peek_event().start_mark)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _OverLimit(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                              self.peek_event().start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _measure(node, 1, {}, set())
        return node


class _OverLimit(yaml.composer.ComposerError):
    """A document past one of the module's limits (not a syntax error)."""


def _measure(node: yaml.Node, depth: int, measured: dict, open_nodes: set) -> tuple[int, int]:
    """``(values, levels)`` that ``node``, found at ``depth``, stands for once every alias is copied out.

    Refuses a tree that would be deeper than :data:`MAX_DEPTH` or larger than
    :data:`MAX_NODES` that way, and an alias inside the node it names (a tree
    without end).  ``measured`` memoises shared nodes; ``open_nodes`` holds
    those being measured.
    """
    if depth > MAX_DEPTH:
        raise _OverLimit(None, None, f"its aliases nest it deeper than {MAX_DEPTH} levels", node.start_mark)
    if id(node) in measured:
        size, levels = measured[id(node)]
        if depth + levels - 1 > MAX_DEPTH:
            raise _OverLimit(None, None, f"its aliases nest it deeper than {MAX_DEPTH} levels", node.start_mark)
        return size, levels
    if id(node) in open_nodes:
        raise _OverLimit(None, None, "an alias refers to a value that holds it (a tree without end)",
                         node.start_mark)
    open_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    size, levels = 1, 1
    for child in children:
        child_size, child_levels = _measure(child, depth + 1, measured, open_nodes)
        size, levels = size + child_size, max(levels, child_levels + 1)
        if size > MAX_NODES:
            raise _OverLimit(None, None, f"its aliases expand to more than {MAX_NODES:,} values", node.start_mark)
    open_nodes.discard(id(node))
    measured[id(node)] = size, levels
    return size, levels


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    result = YamlMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (dict, list)):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping or list cannot be a key (one pair of braces too many?)", key_node.start_mark)
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
_LineLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_YAML_1_1_MISSES, list(FIRST_CHARACTERS))


def read_source(source: str | os.PathLike) -> tuple[str, str | None]:
    """Return ``(text, filename)`` for a path or for YAML text given inline.

    A string is taken as a path when it names an existing file or when it is a
    single line ending in ``.yaml``/``.yml``; anything else is YAML text.
    """
    text = os.fspath(source)
    looks_like_path = "\n" not in text and (os.path.isfile(text) or text.endswith((".yaml", ".yml")))
    if not looks_like_path:
        return text, None
    if text.lower().endswith(".onnx"):
        raise ConfigError(Problem("an ONNX model, not a net file: netspec import onnx makes one of it", file=text))
    if os.path.exists(text) and (not os.path.isfile(text) or os.path.getsize(text) > MAX_FILE_BYTES):
        raise ConfigError(Problem(f"not a config file (a regular file of at most {MAX_FILE_BYTES:,} bytes)",
                                  file=text))
    try:
        with open(text, encoding="utf-8") as handle:
            return handle.read(), text
    except OSError as exc:
        raise ConfigError(Problem(f"cannot read the file: {exc.strerror}", file=text)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(Problem(f"not a text file (byte {exc.start} is not UTF-8)", file=text)) from None


def load_yaml(text: str, filename: str | None = None) -> Any:
    """Parse YAML text with line tracking; a syntax error becomes a one-line ConfigError."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        kind = "YAML past netspec's limits" if isinstance(exc, _OverLimit) else "malformed YAML"
        message = f"{kind}: {reason}" + (f" ({context})" if context else "")
        raise ConfigError(Problem(message, file=filename or "<string>", line=line)) from None


def to_plain(value):
    """A YAML tree as plain dicts and lists (for hashing and writing)."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value
