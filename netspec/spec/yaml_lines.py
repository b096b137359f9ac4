"""YAML with line numbers: every mapping and list read from a file remembers where it came from.

YAML is read with ``yaml.SafeLoader`` semantics (no tags that build objects),
plus the numbers YAML 1.1 leaves as strings (:mod:`netspec.spec.numbers`);
mappings and lists come back as :class:`YamlMap` / :class:`YamlList`, which
remember the line of each key and item so that every problem can be reported
as ``file:line``.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from netspec.errors import ConfigError, Problem
from netspec.spec.numbers import FIRST_CHARACTERS, FLOAT_YAML_1_1_MISSES


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
    """SafeLoader whose mappings and sequences keep their line numbers, and which reads ``1e-3`` as a number."""


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


def to_plain(value):
    """A YAML tree as plain dicts and lists (for hashing and writing)."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value
