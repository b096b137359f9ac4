"""The documentation's reference pages, generated from the code: every layer, rule, command and key is there."""

from __future__ import annotations

import dataclasses
import re

import click

import netspec.cli
from netspec.engine.registry import layer_types, solver_types
from netspec.inspect import reference
from netspec.spec import modules, net_spec, solver_spec


def test_a_literal_block_becomes_fenced_yaml_and_prose_stays():
    text = "Sums its bottoms.\n\nExample::\n\n    - name: sum\n      type: Eltwise\n\nAfter."
    assert reference.markdown(text) == (
        "Sums its bottoms.\n\nExample:\n\n```yaml\n- name: sum\n  type: Eltwise\n```\n\nAfter.\n")
    assert "```text\nx = 1\n```" in reference.markdown("Formula::\n\n    x = 1\n")


def test_every_layer_page_has_its_summary_counts_and_every_parameter():
    for name, cls in layer_types().items():
        page = reference.layer_page(cls)
        assert page.startswith(f"# {name}\n"), name
        assert "**Bottoms:**" in page and "::\n" not in page, name
        for block, params in cls.param_blocks.items():
            assert f"## `{block}`" in page
            for field in dataclasses.fields(params):
                assert f"| `{field.name}` |" in page, (name, field.name)
    index = reference.layers_index(layer_types())
    assert len(re.findall(r"^\| \[\w+\]\(\w+\.md\) \|", index, re.M)) == len(layer_types())


def test_a_pipe_in_a_type_does_not_split_the_table_cell():
    page = reference.layer_page(layer_types()["Pooling"])
    assert "| `pool` | MAX \\| AVE | MAX |" in page


def test_the_commands_page_has_every_command_and_option():
    page = reference.commands_page(netspec.cli.main)

    def walk(group, path):
        for name, command in group.commands.items():
            yield f"{path} {name}", command
            if isinstance(command, click.Group):
                yield from walk(command, f"{path} {name}")

    for path, command in walk(netspec.cli.main, "netspec"):
        assert f"\n## {path}\n" in page, path
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{', '.join(param.opts)}" in page or param.opts[0] in page, (path, param.opts)


def test_the_schema_and_solver_pages_cover_every_key_and_rule():
    schema = reference.schema_page()
    keys = [*net_spec.NET_KEYS, *net_spec.LAYER_KEYS, *modules.FILE_KEYS, *modules.MODULE_KEYS, *modules.REPEAT_KEYS,
            *solver_spec.NET_KEYS, *(f.name for f in dataclasses.fields(solver_spec.SolverParams))]
    for key in keys:
        assert f"| `{key}` |" in schema, key
    solvers = reference.solvers_page(solver_types())
    for name in solver_types():
        assert f"\n## {name}\n" in solvers
    for policy, formula in solver_spec.LR_FORMULAS.items():
        assert f"| `{policy}` | `{formula}` |" in solvers
