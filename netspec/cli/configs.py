"""The reference configs command: ``netspec configs`` lists them, ``netspec configs copy NAME [DEST]`` copies one."""

from __future__ import annotations

import click

from netspec.cli.errors import user_errors
from netspec.tools.configs import copy_config, reference_configs


@click.group(invoke_without_command=True)
@click.pass_context
def configs(context):
    """List the reference nets and solvers that ship with netspec (copy one with: netspec configs copy NAME)."""
    if context.invoked_subcommand is None:
        listed = reference_configs()
        width = max(map(len, listed))
        for name, summary in listed.items():
            click.echo(f"{name.ljust(width)}  {summary}")


@configs.command("copy")
@click.argument("name")
@click.argument("destination", required=False, type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True, help="replace files of the same names in DESTINATION")
@user_errors
def copy_command(name, destination, overwrite):
    """Copy the reference config NAME (its nets and solvers) into DESTINATION (default: ./NAME)."""
    written = copy_config(name, destination or name, overwrite)
    click.echo(f"copied {name} into {destination or name}: {', '.join(path.name for path in written)}")
