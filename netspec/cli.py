"""The ``netspec`` command: wires options to library calls, and turns user errors into one-line messages."""

from __future__ import annotations

import functools
import json
import sys

import click

from netspec.config import parse_net
from netspec.errors import ConfigError, NetspecError
from netspec.graph import compile_net
from netspec.registry import layer_class, layer_schemas, layer_types


def user_errors(command):
    """Report NetspecError as text on stderr with exit status 1, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ConfigError as exc:
            for problem in exc.problems:
                click.echo(f"error: {problem}", err=True)
            count = len(exc.problems)
            if count > 1:
                click.echo(f"{count} errors", err=True)
            sys.exit(1)
        except NetspecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


phase_option = click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default=None,
                            help="phase to build (default: the file's state, else TEST)")
stage_option = click.option("--stage", "stages", multiple=True, help="active stage (repeatable)")
level_option = click.option("--level", type=int, default=None, help="net level for include/exclude rules")


@click.group()
@click.version_option(package_name="netspec")
def main():
    """netspec: declarative deep-learning nets and solvers in YAML."""


@main.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@phase_option
@stage_option
@level_option
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="also check that this weights file loads into the net")
@user_errors
def check(net_file, phase, stages, level, weights):
    """Validate NET_FILE and print every layer's tops, parameters and memory."""
    from netspec.net import Net  # noqa: PLC0415 - keeps `netspec --help` fast
    from netspec.report import net_summary  # noqa: PLC0415

    spec = parse_net(net_file, layer_schemas())
    graph = compile_net(spec, phase=phase.upper() if phase else None, stages=stages or None, level=level)
    click.echo(net_summary(graph))
    if weights:
        click.echo(Net(graph).load_weights(weights).summary(weights))


@main.command()
@click.argument("layer_type", required=False)
@user_errors
def layers(layer_type):
    """List every layer type, or print the documentation of LAYER_TYPE."""
    from netspec.report import first_line, layer_doc  # noqa: PLC0415

    types = layer_types()
    if layer_type is None:
        width = max(len(name) for name in types)
        for name, cls in types.items():
            click.echo(f"{name.ljust(width)}  {first_line(cls).split(':', 1)[-1].strip()}")
        return
    click.echo(layer_doc(layer_class(layer_type)))


@main.command("time")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=50, show_default=True,
              help="timed forward+backward passes")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="untimed passes first")
@phase_option
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@click.option("--seed", type=int, default=0, show_default=True, help="seed for fillers and data")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line holding every figure")
@user_errors
def time_command(net_file, iterations, warmup, phase, stages, level, device, seed, as_json):
    """Time forward and backward passes of NET_FILE, layer by layer."""
    from netspec.net import load_net  # noqa: PLC0415
    from netspec.report import format_table  # noqa: PLC0415
    from netspec.timing import time_net  # noqa: PLC0415

    net = load_net(net_file, phase=phase.upper() if phase else "TRAIN", device=device, stages=stages or None,
                   level=level, seed=seed)
    result = time_net(net, iterations=iterations, warmup=warmup)
    rows = [[x["name"], x["type"], f"{x['forward_ms']:.3f}", f"{x['backward_ms']:.3f}"] for x in result["layers"]]
    rows.append(["total", "", f"{result['forward_ms']:.3f}", f"{result['backward_ms']:.3f}"])
    click.echo(f"net '{result['net']}' ({result['phase']}) on {result['device']}, batch {result['batch_size']}, "
               f"{iterations} iterations after {warmup} warm-up")
    click.echo(format_table(["layer", "type", "forward ms", "backward ms"], rows, right={2, 3}))
    click.echo(f"{result['ms_per_iter']:.3f} ms per iteration, {result['images_per_s']:.1f} images/s")
    if as_json:
        click.echo(json.dumps(result))
