"""The reference pages of the documentation site, in Markdown, generated from the code.

Each function returns one page: a layer type (its docstring and parameter
table, what ``netspec layers TYPE`` prints), the index of layer types, the
update rules with the learning-rate policies, every command with its options
(read from the click objects), and the YAML schema of net and solver files
(from the documented keys and parameter dataclasses).  ``docs/hooks.py``
writes them into the site at build time, so the reference cannot drift from
the code.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import textwrap
import typing

import click

from netspec.inspect.report import count_text, default_text, summary
from netspec.spec import modules, net_spec, solver_spec
from netspec.spec.schema import type_name

# An indented block after a line ending in "::" (reStructuredText's literal block).
_LITERAL = re.compile(r"::\n\n((?:(?:    .*)?\n)+)", re.M)


def markdown(docstring: str) -> str:
    """A docstring as Markdown: its ``::`` literal blocks become fenced code (YAML where they look like it)."""

    def fence(match: re.Match) -> str:
        block = textwrap.dedent(match.group(1)).strip("\n")
        language = "yaml" if re.match(r"(- )?[\w.]+:", block) else "text"
        return f":\n\n```{language}\n{block}\n```\n\n"

    return _LITERAL.sub(fence, docstring.rstrip() + "\n\n").rstrip() + "\n"


# a code span: ``x`` or `x`
_CODE = re.compile(r"(``?)(.+?)\1")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: ``|`` splits no cell (a code span holding one becomes HTML code),
    ``<`` and ``>`` are text, never tags."""

    def prose(part: str) -> str:
        return html.escape(part, quote=False).replace("|", "\\|")

    def code(match: re.Match) -> str:
        inner = match.group(2)
        return f"<code>{html.escape(inner).replace('|', '&#124;')}</code>" if "|" in inner else match.group(0)

    text = " ".join(str(text).split())
    pieces, last = [], 0
    for match in _CODE.finditer(text):
        pieces += [prose(text[last:match.start()]), code(match)]
        last = match.end()
    return "".join(pieces + [prose(text[last:])])


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fields_table(cls) -> str:
    """The fields of a parameter dataclass: name, type, default and meaning."""
    hints = typing.get_type_hints(cls)
    rows = [[f"`{f.name}`", type_name(hints[f.name]), default_text(f), f.metadata.get("doc", "")]
            for f in dataclasses.fields(cls)]
    return table(["key", "type", "default", "meaning"], rows)


def keys_table(keys: dict[str, str]) -> str:
    """A table of documented keys."""
    return table(["key", "meaning"], [[f"`{key}`", meaning] for key, meaning in keys.items()])


def described(cls) -> str:
    """A layer type's or update rule's docstring as a page section, its summary without the leading ``Name:``."""
    said = summary(cls)
    body = (inspect.getdoc(cls) or "").partition("\n\n")[2]
    return f"{said[:1].upper()}{said[1:]}\n\n{markdown(body)}"


def layer_page(cls) -> str:
    """One layer type's page: its documentation, its bottoms, tops and in-place rule, and its parameter blocks."""
    counts = (f"**Bottoms:** {count_text(cls.num_bottoms)} · **tops:** {count_text(cls.num_tops)} · "
              f"**in place:** {'yes' if cls.inplace_ok else 'no'}" + (" · **loss:** yes (loss_weight 1)"
                                                                     if cls.is_loss else ""))
    parts = [f"# {cls.type}\n", described(cls), counts + "\n"]
    for block, params in cls.param_blocks.items():
        parts += [f"## `{block}`\n", fields_table(params)]
    if not cls.param_blocks:
        parts.append("It takes no parameter block.\n")
    return "\n".join(parts)


def layers_index(types: dict[str, type]) -> str:
    """The list of layer types, each linked to its page."""
    rows = [[f"[{name}]({name}.md)", summary(cls)] for name, cls in types.items()]
    return ("# Layer types\n\nEvery layer type netspec has, as `netspec layers` lists them; each page is what "
            "`netspec layers TYPE` prints.\n\n" + table(["type", "what it computes"], rows))


def solvers_page(types: dict[str, type]) -> str:
    """The update rules, the order of one update, the learning-rate policies and warm-up."""
    parts = ["# Solvers and learning-rate policies\n",
             "A solver file's `type` picks the update rule (`netspec solvers TYPE` prints one). "
             "Every rule runs inside one loop: the gradient is clipped to `clip_gradients` (its global L2 norm), "
             "divided by `iter_size`, and weight decay is added (times each blob's `decay_mult`; AdamW adds it "
             "to the step instead); then the rule steps with `rate = lr(iter) * lr_mult`.\n"]
    for name, cls in types.items():
        parts += [f"## {name}\n", described(cls)]
    parts += ["## Learning-rate policies\n", "`lr_policy` sets `lr(iter)`:\n",
              table(["policy", "lr(iter)"], [[f"`{name}`", f"`{formula}`"]
                                            for name, formula in solver_spec.LR_FORMULAS.items()]),
              f"Warm-up: {solver_spec.WARMUP_FORMULA}.\n"]
    return "\n".join(parts)


def _commands(group: click.Group, parent: click.Context):
    """Every command under ``group`` with its context, depth first, groups before their commands."""
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        context = click.Context(command, info_name=name, parent=parent)
        yield command, context
        if isinstance(command, click.Group):
            yield from _commands(command, context)


def _help(text: str | None) -> str:
    """A command's help as prose: click's ``\\b`` (keep lines) markers dropped, its ``\\f`` cut-off applied."""
    text = inspect.cleandoc(text or "").split("\f")[0]
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b")


def commands_page(main: click.Group, program: str = "netspec") -> str:
    """Every command and option of the command line, from the click objects that parse them."""
    root = click.Context(main, info_name=program)
    parts = ["# Commands\n", _help(main.help) + "\n", f"`{program} --help` and `{program} COMMAND --help` "
             "print the same from the terminal.\n"]
    for command, context in _commands(main, root):
        path = context.command_path
        parts += [f"## {path}\n", f"```text\n{path} {' '.join(command.collect_usage_pieces(context))}\n```\n",
                  _help(command.help) + "\n"]
        options = [param for param in command.get_params(context)
                   if isinstance(param, click.Option) and "--help" not in param.opts]
        records = filter(None, (option.get_help_record(context) for option in options))
        rows = [[f"`{names}`", meaning] for names, meaning in records]
        if rows:
            parts.append(table(["option", "meaning"], rows))
    return "\n".join(parts)


def schema_page() -> str:
    """The keys of net and solver files, from the documented key tables and parameter dataclasses."""
    return "\n".join([
        "# YAML schema\n",
        "The keys a net file and a solver file take, with their types and defaults. Each layer type's own "
        "parameter block (`convolution_param`...) is on its [layer page](layers/index.md).\n",
        "## Net files\n", keys_table({**net_spec.NET_KEYS, **modules.FILE_KEYS}),
        "### A layer\n", keys_table({**net_spec.LAYER_KEYS,
                                     "<type>_param": "the layer type's parameter block (its page lists them)"}),
        "### `param` entries\n", fields_table(net_spec.ParamSpec),
        "### `include` and `exclude` rules\n", fields_table(net_spec.NetStateRule),
        "### `state`, `train_state` and `test_state`\n", fields_table(net_spec.NetState),
        "### A module declaration (under `modules`)\n", keys_table(modules.MODULE_KEYS),
        "### A module use (a layer entry with `use`)\n", keys_table(modules.USE_KEYS),
        "### A repeat (a layer entry `repeat: {...}`)\n", keys_table(modules.REPEAT_KEYS),
        "## Solver files\n", keys_table(solver_spec.NET_KEYS),
        "### Hyper-parameters\n", fields_table(solver_spec.SolverParams),
        "### `snapshot_best`\n", fields_table(solver_spec.WatchedOutput),
        "### `early_stop`\n", fields_table(solver_spec.EarlyStop),
    ])
