"""Numbers as people write them (1e-3, 5E-4, .5, 1_000, +2) in every numeric field of every config block, and on
the command line; NaN and infinities refused where they make no sense."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from test_cli import run
from test_train_cli import digits, events  # noqa: F401 - digits is a fixture

from netspec.engine.registry import layer_schemas
from netspec.spec.net_spec import NetState, NetStateRule, ParamSpec
from netspec.spec.schema import Context, Limit, read_block
from netspec.spec.solver_spec import SolverParams
from netspec.spec.yaml_lines import load_yaml

FLOATS = [("1e-3", 1e-3), ("5E-4", 5e-4), (".5", 0.5), ("-.5", -0.5), ("1_000", 1000.0), ("+2", 2.0),
          ("1.5e3", 1500.0), ("2", 2.0)]
INTEGERS = [("1_000", 1000), ("+2", 2), ("1e3", 1000), ("2.0", 2)]


def numeric_fields() -> list[tuple[type, str, type, bool]]:
    """``(block, field, float/int/Limit, in a list)`` for every numeric field reachable from the config roots."""
    roots = [SolverParams, NetState, NetStateRule, ParamSpec]
    roots += [block for blocks in layer_schemas().values() for block in blocks.values()]
    found, seen = [], set()
    while roots:
        block = roots.pop()
        if block in seen:
            continue
        seen.add(block)
        for name, hint in typing.get_type_hints(block).items():
            listed = False
            while typing.get_origin(hint) in (typing.Union, types.UnionType, list):
                listed = listed or typing.get_origin(hint) is list
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            if dataclasses.is_dataclass(hint):
                roots.append(hint)
            elif hint in (float, int, Limit):
                found.append((block, name, hint, listed))
    return found


def read(block: type, name: str, written: str):
    """The value ``name: written`` gives in ``block``, and the problems about that key."""
    ctx = Context(None, "/")
    value = read_block(block, load_yaml(f"{name}: {written}"), ctx, "", 1)
    return getattr(value, name), [p.message for p in ctx.problems if p.key == name]


def test_the_schema_has_numeric_fields_of_every_kind():
    kinds = {hint for _, _, hint, _ in numeric_fields()}
    assert kinds == {float, int, Limit}
    assert len(numeric_fields()) > 80


@pytest.mark.parametrize(("written", "expected"), FLOATS)
def test_every_float_field_reads_a_number_as_written(written, expected):
    for block, name, hint, listed in numeric_fields():
        if hint is int:
            continue
        value, problems = read(block, name, f"[{written}]" if listed else written)
        assert problems == [], f"{block.__name__}.{name}"
        assert value == ([expected] if listed else expected), f"{block.__name__}.{name}"
        assert all(isinstance(v, float) for v in (value if listed else [value]))


@pytest.mark.parametrize(("written", "expected"), INTEGERS)
def test_every_integer_field_reads_a_whole_number_as_written(written, expected):
    for block, name, hint, listed in numeric_fields():
        if hint is not int:
            continue
        value, problems = read(block, name, f"[{written}]" if listed else written)
        assert problems == [], f"{block.__name__}.{name}"
        assert value == ([expected] if listed else expected), f"{block.__name__}.{name}"


def test_integer_fields_refuse_fractions():
    for block, name, hint, _ in numeric_fields():
        if hint is int:
            assert read(block, name, "1.5")[1] == ["expected int, got float 1.5"], f"{block.__name__}.{name}"


@pytest.mark.parametrize("written", [".nan", ".inf", "-.inf"])
def test_float_fields_refuse_nan_and_infinity_except_open_bounds(written):
    for block, name, hint, listed in numeric_fields():
        if hint is int:
            continue
        value, problems = read(block, name, f"[{written}]" if listed else written)
        if hint is Limit and written != ".nan":
            assert problems == [] and value == float(written.replace(".", "")), f"{block.__name__}.{name}"
        else:
            assert problems == [f"expected a finite number, got {float(written.replace('.', ''))}"], \
                f"{block.__name__}.{name}"


def test_a_solver_written_with_exponents_trains_through_the_cli(digits, tmp_path):  # noqa: F811 - the fixture
    solver = (digits / "solver.yaml").read_text()
    for key, written in (("base_lr", "1e-2"), ("weight_decay", "5e-4"), ("momentum", ".9"), ("max_iter", "1_000")):
        lines = [line for line in solver.splitlines() if not line.startswith(f"{key}:")]
        solver = "\n".join([*lines, f"{key}: {written}"]) + "\n"
    (digits / "exponents.yaml").write_text(solver)
    result = run("train", digits / "exponents.yaml", "--max-iter", "2e1", "--out", tmp_path / "run", "--seed", "+3",
                 "--base-lr", "1/50")
    assert result.returncode == 0, result.stderr
    assert events(tmp_path / "run", "TRAIN")[0]["lr"] == pytest.approx(0.02)  # (a fraction on the command line)
    assert (tmp_path / "run" / "digits_iter_20.weights.h5").exists()


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-iter", "1.5", "'1.5' is not a whole number"),
    ("--max-iter", "ten", "'ten' is not a whole number"),
    ("--collective-timeout", "nan", "'nan' is not a finite number"),
    ("--base-lr", "1/0", "'1/0' is not a number, nor a fraction of two (1/255)"),
    ("--base-lr", "a/2", "'a/2' is not a number, nor a fraction of two (1/255)"),
])
def test_the_command_line_refuses_what_is_not_a_number_of_the_kind(digits, option, value, message):  # noqa: F811
    result = run("train", digits / "solver.yaml", option, value)
    assert result.returncode == 2
    assert message in result.stderr
