"""Options several commands share, and the number types every numeric option uses."""

from __future__ import annotations

import math

import click

from netspec.engine.trust import Trust
from netspec.spec.numbers import as_int, parse_number
from netspec.threads import use_idle_cores, use_threads


class OptionalBounds:
    """For click's range types: ``--help`` shows no ``[x<=None]`` for a number without bounds."""

    def _describe_range(self) -> str:  # (click's name)
        return "" if self.min is None and self.max is None else super()._describe_range()


class Integer(OptionalBounds, click.IntRange):
    """A whole number as a person writes it (``1_000``, ``+2``, ``1e4``), within optional bounds."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            try:
                whole = as_int(parse_number(value))
            except ValueError:
                whole = None
            if whole is None:
                self.fail(f"{value!r} is not a whole number", param, ctx)
            value = whole
        return super().convert(value, param, ctx)


class Real(OptionalBounds, click.FloatRange):
    """A finite number as a person writes it (``1e-3``, ``.5``, ``1_000``, or a fraction: ``1/255``), within
    optional bounds."""

    name = "number"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.count("/") == 1:
            try:
                top, bottom = (parse_number(part) for part in value.split("/"))
                value = top / bottom
            except (ValueError, TypeError, ZeroDivisionError):
                self.fail(f"{value!r} is not a number, nor a fraction of two (1/255)", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class Dims(click.ParamType):
    """``length`` (None: any number of) positive whole numbers separated by commas or x: ``3,224,224`` or
    ``3x224x224``."""

    name = "dims"

    def __init__(self, length: int | None):
        self.length = length

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            dims = [as_int(parse_number(part)) for part in str(value).lower().replace("x", ",").split(",")]
        except ValueError:
            dims = [None]
        if len(dims) != (self.length or len(dims)) or any(d is None or d < 1 for d in dims):
            self.fail(f"{value!r} is not {self.length or 'a list of'} positive whole numbers separated by commas, "
                      "e.g. 3,224,224", param, ctx)
        return tuple(dims)


def phase_option(default: str | None = None):
    """``--phase TRAIN|TEST``; without a ``default`` the net file's ``state`` decides, else TEST."""
    if default is None:
        return click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default=None,
                            help="phase to build (default: the file's state, else TEST)")
    return click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default=default,
                        show_default=True, help="phase to build")


stage_option = click.option("--stage", "stages", multiple=True, help="active stage (repeatable)")


level_option = click.option("--level", type=Integer(), default=None, help="net level for include/exclude rules")


outputs_anywhere_option = click.option(
    "--allow-absolute-outputs", "outputs_anywhere", is_flag=True,
    help="let layers that write files (HDF5Output) write outside the run folder or current directory")


side_effects_option = click.option(
    "--allow-side-effects", is_flag=True,
    help="run a net from someone else even though it has layers that write files (HDF5Output)")

python_layers_option = click.option(
    "--allow-python-layers", is_flag=True,
    help="build a net with Python layers, importing (running) the modules they name: only if you trust the file")
no_python_layers_option = click.option(
    "--no-python-layers", is_flag=True,
    help="refuse a net with Python layers instead of importing the modules they name (the dashboard starts its "
         "runs so)")


def own_net_trust(no_python_layers: bool, outputs_anywhere: bool, what: str) -> Trust:
    """What a net the user runs as their own (``what``: "training", "timing"...) may do, as its flags say."""
    return Trust.own(python_layers=not no_python_layers, outputs_anywhere=outputs_anywhere,
                     python_refusal=f"this {what} was started with --no-python-layers")


def _apply_threads(context: click.Context, parameter, value: int | None) -> None:
    context.meta["threads"] = value
    if value is None:  # left out: OMP_NUM_THREADS, else the cores other processes leave idle
        use_idle_cores()
    else:
        use_threads(value)


threads_option = click.option(
    "--threads", type=Integer(min=1), default=None, expose_value=False, is_eager=True, callback=_apply_threads,
    help="threads for oneDNN's pool (OpenBLAS keeps one beside it), or for OpenBLAS without oneDNN (NumPy on "
         "another BLAS keeps its own)  [default: OMP_NUM_THREADS, else the cores no other process keeps busy at the "
         "start]")
