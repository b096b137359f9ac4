"""The schema engine: typed parameter blocks checked against YAML, every problem collected with its line.

Parameter blocks are plain dataclasses; :func:`read_block` checks a mapping
against one and collects problems in a :class:`Context` instead of stopping
at the first.  Which blocks a layer type takes is passed in by the caller, so
this module knows nothing of layers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

from netspec.errors import Problem, did_you_mean, shown
from netspec.spec.numbers import as_int
from netspec.spec.yaml_lines import YamlList, YamlMap


class FilePath(str):
    """Annotation for a parameter naming a file; relative values resolve against the config's folder."""


class OutputPath(str):
    """Annotation for a file a layer writes; kept as written, resolved by the net's output folder
    (:mod:`netspec.engine.outputs`), never against the config's folder."""


class Limit(float):
    """Annotation for a float bound that may be left open: ``.inf`` and ``-.inf`` are accepted (float refuses them)."""


@dataclass
class Context:
    """Where problems are collected while reading one config file."""

    file: str | None
    base_dir: str
    problems: list[Problem] = field(default_factory=list)
    layer: str | None = None
    origin: tuple[str | None, str | None] | None = None  # (file, via) of a layer expanded from a module
    spliced: int = 0  # characters ${...} placeholders have spliced into strings so far (netspec.spec.placeholders)

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


def type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"{type_name(typing.get_args(tp)[0])} or a list of them"
    if origin is dict:
        return f"a mapping of {type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if tp in (FilePath, OutputPath):
        return "a file path"
    if tp is Limit:
        return "float (or .inf, -.inf)"
    return getattr(tp, "__name__", str(tp))


INVALID = object()


def convert_value(tp, value, ctx: Context, key: str, line: int):
    """Check ``value`` against annotation ``tp``; return it converted, or INVALID after recording why."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return convert_value(inner[0], value, ctx, key, line)
        trials = []
        for option in inner:  # the first type that takes the value whole
            trial = dataclasses.replace(ctx, problems=[])
            converted = convert_value(option, value, trial, key, line)
            if converted is not INVALID and not trial.problems:
                return converted
            trials.append((option, trial.problems))
        # what the type meant for values like it says is wrong: a word's choices, a number's kind
        textual = isinstance(value, str)
        ctx.problems.extend(next((problems for option, problems in trials
                                  if (typing.get_origin(option) is Literal or option is str) == textual),
                                 trials[0][1]))
        return INVALID
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, str) and value in choices:
            return value
        ctx.add(f"{shown(value)} is not one of {', '.join(choices)}{did_you_mean(value, choices)}", line, key)
        return INVALID
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]
        out = []
        for index, item in enumerate(items):
            item_line = items.line_of(index) if isinstance(items, YamlList) else line
            converted = convert_value(item_tp, item, ctx, key, item_line)
            if converted is INVALID:
                return INVALID
            out.append(converted)
        return out
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            ctx.add(f"expected a mapping, got {type(value).__name__} {shown(value)}", line, key)
            return INVALID
        out = {}
        for name, item in value.items():
            item_line = value.line_of(name) if isinstance(value, YamlMap) else line
            converted = convert_value(value_tp, item, ctx, f"{key}.{name}", item_line)
            if converted is INVALID or convert_value(key_tp, name, ctx, key, item_line) is INVALID:
                return INVALID
            out[name] = converted
        return out
    if dataclasses.is_dataclass(tp):
        return read_block(tp, value, ctx, key, line)
    if tp is int and (whole := as_int(value)) is not None:
        return whole
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp in (float, Limit) and number)
        or (tp in (str, FilePath, OutputPath) and isinstance(value, str) and (tp is str or value))
    )
    if not ok:
        ctx.add(f"expected {type_name(tp)}, got {type(value).__name__} {shown(value)}", line, key)
        return INVALID
    if tp in (float, Limit):
        value = float(value)
        if math.isnan(value) or (math.isinf(value) and tp is float):
            ctx.add(f"expected a finite number, got {value}", line, key)
            return INVALID
        return value
    if tp is FilePath:
        return FilePath(os.path.normpath(os.path.join(ctx.base_dir, os.path.expanduser(value))))
    return value


def read_block(cls, node, ctx: Context, prefix: str, line: int):
    """Build dataclass ``cls`` from mapping ``node``, recording unknown keys and bad values.

    Returns an instance built from the valid keys (defaults elsewhere), or
    INVALID when ``node`` is not a mapping at all.
    """
    if node is None:
        node = YamlMap()
    if not isinstance(node, dict):
        ctx.add(f"expected a mapping of parameters, got {type(node).__name__} {shown(node)}", line, prefix)
        return INVALID
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
            if value is not INVALID:
                kwargs[name] = value
        elif spec.metadata.get("required"):
            ctx.add("missing required parameter", node_line, path)
    return cls(**kwargs)
