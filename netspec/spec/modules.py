"""Modules and repeats in net files: named, parameterised groups of layers, expanded statically.

A net file may declare::

    include: common.yaml              # modules of other files (a path or a list; their layers are ignored)
    modules:
      unit:
        params: {out: ~, kernel: 1}   # ~ (null) makes a parameter required
        inputs: [x]                   # formal blob names, replaced by the use's bottoms ...
        outputs: [y]                  # ... and tops
        layers: [...]                 # layers, uses and repeats; "${out}" is replaced by the value
    layers:
      - {use: unit, name: u1, bottom: data, top: u1, with: {out: 64}}
      - repeat: {count: 3, start: 1, use: unit, name: "u${number}", bottom: u1, top: "r${letter}", with: {...}}

Placeholders follow :mod:`netspec.spec.placeholders`; ``${name}`` is the
use's name.  A repeat expands its module ``count`` times, copy i reading the
previous copy's top, with ``${index}`` (start + i), ``${number}`` (index + 1)
and ``${letter}`` (a, b, ... for index 0, 1, ...) in its name, top and ``with``.
Nothing is evaluated: expansion only copies and substitutes, each included
file is read once however often it is included, and a net that would expand
past :data:`MAX_LAYERS` layers is refused as soon as it does.  Layers that come
from a module keep their lines in the module's file and say where the module
was used, so an error names both.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass

from netspec.errors import ConfigError, Problem, did_you_mean, shown
from netspec.spec.placeholders import PLACEHOLDER, strings_in, substitute
from netspec.spec.schema import Context
from netspec.spec.yaml_lines import YamlList, YamlMap, load_yaml, read_source, to_plain

# The keys of a net file's module declarations, uses and repeats, with what each means.
FILE_KEYS = {
    "include": "files whose modules this net uses: a path or a list, relative to this file",
    "modules": "named groups of layers: a mapping of module names to declarations",
}
MODULE_KEYS = {
    "params": "the module's parameters and their defaults (~ makes one required)",
    "inputs": "formal bottom names, replaced by each use's bottoms",
    "outputs": "formal top names, replaced by each use's tops",
    "layers": "the module's layers (and further uses and repeats)",
}
USE_KEYS = {
    "use": "the module to expand here",
    "name": "the use's name, ${name} inside the module",
    "bottom": "the blobs that replace the module's inputs",
    "top": "the blobs that replace the module's outputs",
    "with": "values of the module's parameters",
}
REPEAT_KEYS = {
    "count": "how many copies, each reading the previous copy's top",
    "start": "the first copy's ${index} (default 0); ${number} is index + 1, ${letter} a, b, ...",
    **USE_KEYS,
}
INDEX_NAMES = ("index", "number", "letter")
MAX_DEPTH = 32
MAX_LAYERS = 100_000  # layers a net may expand to; ResNet-152 has about 500


@dataclass
class Module:
    """A module as declared."""

    name: str
    params: dict
    inputs: list[str]
    outputs: list[str]
    layers: YamlList
    file: str | None
    line: int


def uses_modules(tree: YamlMap) -> bool:
    """True when the net needs expanding (modules, includes, uses or repeats)."""
    layers = tree.get("layers")
    return (any(key in tree for key in FILE_KEYS)
            or isinstance(layers, list) and any(isinstance(n, dict) and ("use" in n or "repeat" in n) for n in layers))


def expand_net(tree: YamlMap, ctx: Context) -> YamlMap:
    """The net with every module use and repeat expanded into plain layers (problems go to ``ctx``)."""
    modules: dict[str, Module] = {}
    _collect(tree, ctx.file, ctx.base_dir, ctx, modules, visiting=(), collected=set())
    expander = _Expander(modules, ctx)
    layers = tree.get("layers")
    expanded = YamlList(expander.layers(layers, ctx.file, None, ())) if isinstance(layers, YamlList) else layers
    if isinstance(expanded, YamlList):
        expanded.line = layers.line
        expanded.item_lines = [getattr(node, "line", layers.line) for node in expanded]
    result = YamlMap({k: v for k, v in tree.items() if k not in FILE_KEYS})
    result.line, result.key_lines = tree.line, dict(tree.key_lines)
    if "layers" in tree:
        result["layers"] = expanded
    return result


def _collect(tree, file, base_dir, ctx: Context, modules: dict, visiting: tuple, collected: set) -> None:
    """Read the modules of ``tree`` and of the files it includes (each file once; cycles refused).

    ``visiting`` is the chain of includes being read, ``collected`` every file already read.
    """
    includes = tree.get("include", [])
    includes = includes if isinstance(includes, list) else [includes]
    for value in includes:
        line = tree.line_of("include")
        if not isinstance(value, str):
            ctx.add_at(file, line, f"include: expected a file path, got {shown(value)}")
            continue
        path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
        if path in visiting:
            ctx.add_at(file, line, f"include: '{value}' includes itself (through {' -> '.join(visiting)})")
            continue
        if not os.path.isfile(path):
            ctx.add_at(file, line, f"include: '{path}' does not exist")
            continue
        if path in collected:
            continue
        collected.add(path)
        text, filename = read_source(path)
        included = load_yaml(text, filename)
        if not isinstance(included, YamlMap):
            ctx.add_at(filename, 1, "an included file must be a mapping with 'modules'")
            continue
        _collect(included, filename, os.path.dirname(path), ctx, modules, visiting + (path,), collected)
    if "modules" not in tree:
        return
    declared = tree["modules"]
    if not isinstance(declared, YamlMap):
        ctx.add_at(file, tree.line_of("modules"), "modules: expected a mapping of module names to modules")
        return
    for name, body in declared.items():
        line = declared.line_of(name)
        module = _read_module(name, body, file, line, ctx)
        if module is None:
            continue
        if name in modules:
            first = modules[name]
            ctx.add_at(file, line, f"module '{name}' is declared twice (also at {first.file}:{first.line})")
            continue
        modules[name] = module


def _read_module(name, body, file, line, ctx: Context) -> Module | None:
    if not isinstance(body, YamlMap):
        ctx.add_at(file, line, f"module '{name}' must be a mapping with {', '.join(MODULE_KEYS)}")
        return None
    for key in body:
        if key not in MODULE_KEYS:
            ctx.add_at(file, body.line_of(key), f"module '{name}': unknown key '{key}'{did_you_mean(key, MODULE_KEYS)}")
    params = body.get("params", {})
    inputs, outputs, layers = body.get("inputs", []), body.get("outputs", []), body.get("layers")
    problems = len(ctx.problems)
    if not isinstance(params, dict):
        ctx.add_at(file, body.line_of("params"), f"module '{name}': params must be a mapping of names to defaults")
    for key, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            ctx.add_at(file, body.line_of(key), f"module '{name}': {key} must be a list of blob names")
    if not isinstance(layers, YamlList) or not layers:
        ctx.add_at(file, body.line_of("layers"), f"module '{name}' needs a non-empty 'layers' list")
    if len(ctx.problems) > problems:
        return None
    return Module(name, dict(params), list(inputs), list(outputs), layers, file, line)


def _names(value) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


class _Expander:
    """Expands layers lists, tracking where each use came from."""

    def __init__(self, modules: dict[str, Module], ctx: Context):
        self.modules, self.ctx = modules, ctx
        self.expanded = 0  # plain layers produced so far

    def layers(self, nodes, file, via, stack) -> list:
        result = []
        for node in nodes:
            if isinstance(node, YamlMap) and "use" in node:
                result += self.use(node, file, via, stack)
            elif isinstance(node, YamlMap) and "repeat" in node:
                result += self.repeat(node, file, via, stack)
            else:
                self.expanded += 1
                if self.expanded > MAX_LAYERS:
                    raise ConfigError(Problem(f"the modules and repeats expand to more than {MAX_LAYERS:,} layers",
                                              file=file or "<string>", line=getattr(node, "line", None), via=via))
                if isinstance(node, YamlMap):
                    self._check_leftovers(node, file, node.line, via)
                    node = _located(node, file, via)
                result.append(node)
        return result

    def _check_leftovers(self, value, file, line, via) -> None:
        """A ``${...}`` left in a plain layer had nothing to replace it."""
        for text, at in strings_in(value, line):
            for name in PLACEHOLDER.findall(text):
                where = "inside a repeat" if name in INDEX_NAMES else "in a module with that parameter"
                self.ctx.add_at(file, at, f"'${{{name}}}' has no value here (it is only replaced {where})", via)

    def use(self, node: YamlMap, file, via, stack) -> list:
        for key in node:
            if key not in USE_KEYS:
                self.ctx.add_at(file, node.line_of(key), f"unknown key '{key}' in a module use"
                                f"{did_you_mean(key, USE_KEYS)} (a use takes {', '.join(USE_KEYS)})", via)
        name = node.get("use")
        module = self.modules.get(name) if isinstance(name, str) else None
        if module is None:
            known = f"modules: {', '.join(self.modules)}" if self.modules else "the file declares no modules"
            self.ctx.add_at(file, node.line_of("use"),
                            f"unknown module '{name}'{did_you_mean(str(name), self.modules)} ({known})", via)
            return []
        if name in stack or len(stack) >= MAX_DEPTH:
            chain = " -> ".join(stack + (name,))
            self.ctx.add_at(file, node.line_of("use"), f"module '{name}' uses itself ({chain})" if name in stack else
                            f"modules nest more than {MAX_DEPTH} uses deep ({chain})", via)
            return []
        given = node.get("with", {}) or {}
        if not isinstance(given, dict):
            self.ctx.add_at(file, node.line_of("with"), "with: expected a mapping of module parameters", via)
            return []
        values = dict(module.params)
        for key, value in given.items():
            if key not in module.params:
                self.ctx.add_at(file, node.line_of("with"), f"module '{name}' has no parameter '{key}'"
                                f"{did_you_mean(key, module.params)} (it takes: {', '.join(module.params) or 'none'})",
                                via)
            for text, _ in strings_in(value, 0):
                for unknown in PLACEHOLDER.findall(text):
                    self.ctx.add_at(file, node.line_of("with"), f"unknown parameter '${{{unknown}}}' in 'with' "
                                    "(nothing here gives it a value)", via)
                    return []
            values[key] = value
        for key, value in values.items():
            if value is None:
                self.ctx.add_at(file, node.line_of("use"),
                                f"module '{name}' needs parameter '{key}' (give it in 'with')", via)
        if "name" in node:
            values["name"] = node["name"]
        bottoms, tops = _names(node.get("bottom")), _names(node.get("top"))
        for kind, formal, actual in (("bottom", module.inputs, bottoms), ("top", module.outputs, tops)):
            if len(formal) != len(actual):
                self.ctx.add_at(file, node.line_of(kind) if kind in node else node.line,
                                f"module '{name}' takes {len(formal)} {kind}(s) ({', '.join(formal) or 'none'}), "
                                f"got {len(actual)}", via)
        if any(v is None for v in values.values()) or len(module.inputs) != len(bottoms) or \
                len(module.outputs) != len(tops):
            return []
        here = f"module '{name}' used at {file}:{node.line}" + (f", {via}" if via else "")
        renames = dict(zip(module.inputs, bottoms)) | dict(zip(module.outputs, tops))
        body = substitute(module.layers, values, self.ctx, module.file, module.line, here, keep=INDEX_NAMES)
        for item in body:
            if isinstance(item, YamlMap):
                _rename_blobs(item, renames)
        return self.layers(body, module.file, here, stack + (name,))

    def repeat(self, node: YamlMap, file, via, stack) -> list:
        spec = node["repeat"]
        extra = [k for k in node if k != "repeat"]
        if extra or not isinstance(spec, YamlMap):
            self.ctx.add_at(file, node.line, "a repeat is written '- repeat: {count, use, name, bottom, top, with}'",
                            via)
            return []
        for key in spec:
            if key not in REPEAT_KEYS:
                self.ctx.add_at(file, spec.line_of(key), f"unknown key '{key}' in a repeat"
                                f"{did_you_mean(key, REPEAT_KEYS)}", via)
        count, start = spec.get("count"), spec.get("start", 0)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            self.ctx.add_at(file, spec.line_of("count"),
                            f"repeat count must be an integer of at least 1, got {shown(count)}", via)
            return []
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            self.ctx.add_at(file, spec.line_of("start"), f"repeat start must be an integer >= 0, got {shown(start)}",
                            via)
            return []
        if count > 1 and not PLACEHOLDER.search(str(spec.get("top", ""))):
            self.ctx.add_at(file, spec.line_of("top"), "a repeat's top needs ${index}, ${number} or ${letter} so that "
                            "each copy's output has its own name", via)
            return []
        result, bottom = [], spec.get("bottom")
        for copy in range(count):
            index = start + copy
            names = {"index": index, "number": index + 1,
                     "letter": string.ascii_lowercase[index] if index < 26 else str(index)}
            use = YamlMap({"use": spec.get("use"), "bottom": bottom})
            for key in ("name", "top", "with"):
                if key in spec:
                    use[key] = substitute(spec[key], names, self.ctx, file, spec.line_of(key), via, keep=None,
                                           only=INDEX_NAMES)
            use.line, use.key_lines = spec.line, dict(spec.key_lines)
            result += self.use(use, file, via, stack)
            bottom = use.get("top")
        return result


def _located(node: YamlMap, file, via) -> YamlMap:
    """``node`` marked with the file its lines refer to and the module use it came from."""
    copy = YamlMap(node)
    copy.line, copy.key_lines = node.line, dict(node.key_lines)
    copy.file = getattr(node, "file", None) or file
    copy.via = getattr(node, "via", None) or via
    return copy


def _rename_blobs(node: YamlMap, renames: dict) -> None:
    """Replace formal input/output names in a layer's (or a nested use's) bottom and top."""
    target = node["repeat"] if isinstance(node.get("repeat"), YamlMap) else node
    for key in ("bottom", "top"):
        if key in target:
            value = target[key]
            if isinstance(value, list):
                renamed = YamlList(renames.get(v, v) if isinstance(v, str) else v for v in value)
                renamed.line, renamed.item_lines = getattr(value, "line", 0), list(getattr(value, "item_lines", []))
                target[key] = renamed
            elif isinstance(value, str):
                target[key] = renames.get(value, value)


def render_net(source) -> dict:
    """The net of ``source`` (a path or YAML text) expanded into plain Python data; ConfigError on any problem."""
    text, filename = read_source(source)
    tree = load_yaml(text, filename)
    ctx = Context(filename, os.path.dirname(os.path.abspath(filename)) if filename else os.getcwd())
    if not isinstance(tree, YamlMap):
        ctx.add("a net must be a mapping with a 'layers' list", 1)
        raise ConfigError(ctx.problems)
    expanded = expand_net(tree, ctx) if uses_modules(tree) else tree
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return to_plain(expanded)

