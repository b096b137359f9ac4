"""``${name}`` placeholders in YAML values: finding them and replacing them with values.

``${p}`` standing alone takes the value with its type (a number stays a
number); inside a longer string it is spliced in as text.  Replacement keeps
every line number, so a problem in the result still names its line.
"""

from __future__ import annotations

import re

from netspec.errors import ConfigError, Problem, did_you_mean
from netspec.spec.schema import Context
from netspec.spec.yaml_lines import YamlList, YamlMap

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_TEXT = 1 << 20  # characters a string may grow to as values are spliced in (a name or a path needs far fewer)
MAX_SPLICED = 64 << 20  # characters spliced into the strings of one file in all (as many as a config file holds)


def strings_in(value, line):
    """Every string in a YAML value, with the best line known for it."""
    if isinstance(value, str):
        yield value, line
    elif isinstance(value, YamlMap):
        for key, item in value.items():
            yield from strings_in(item, value.line_of(key))
    elif isinstance(value, YamlList):
        for index, item in enumerate(value):
            yield from strings_in(item, value.line_of(index))
    elif isinstance(value, (dict, list)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from strings_in(item, line)


def substitute(value, values: dict, ctx: Context, file, line, via, keep=None, only=None):
    """A copy of ``value`` with ``${name}`` replaced from ``values``.

    Names in ``keep`` without a value are left for later (a repeat's index);
    with ``only``, just those names are replaced and every other reference is kept.
    """
    if isinstance(value, YamlMap):
        copy = YamlMap()
        copy.line, copy.key_lines = value.line, dict(value.key_lines)
        for key, item in value.items():
            copy[key] = substitute(item, values, ctx, file, value.line_of(key), via, keep, only)
        return copy
    if isinstance(value, YamlList):
        copy = YamlList(substitute(item, values, ctx, file, value.line_of(i), via, keep, only)
                        for i, item in enumerate(value))
        copy.line, copy.item_lines = value.line, list(value.item_lines)
        return copy
    if not isinstance(value, str) or "${" not in value:
        return value

    def known(name: str) -> bool:
        return name in values and (only is None or name in only)

    def left_alone(name: str) -> bool:
        return (only is not None and name not in only) or (keep is not None and name in keep and name not in values)

    whole = PLACEHOLDER.fullmatch(value)
    if whole and known(whole.group(1)):
        return values[whole.group(1)]
    grown = len(value)  # (the result's length so far: values spliced into values could double it at each use)

    def splice(match):
        nonlocal grown
        name = match.group(1)
        if known(name):
            found = values[name]
            if isinstance(found, (dict, list)):
                ctx.add_at(file, line, f"'${{{name}}}' is a {type(found).__name__}; it can only stand alone, not "
                           "inside a longer string", via)
            text = str(found)
            grown += len(text)
            ctx.spliced += len(text)
            if grown > MAX_TEXT or ctx.spliced > MAX_SPLICED:  # (refused at once, as the growth would go on)
                raise ConfigError(Problem(
                    f"'${{{name}}}' makes a value longer than {MAX_TEXT:,} characters" if grown > MAX_TEXT else
                    f"the placeholders splice more than {MAX_SPLICED:,} characters into the file's values",
                    file=file or "<string>", line=line, via=via))
            return text
        if not left_alone(name):
            ctx.add_at(file, line, f"unknown parameter '${{{name}}}'{did_you_mean(name, values)}", via)
        return match.group(0)

    return PLACEHOLDER.sub(splice, value)
