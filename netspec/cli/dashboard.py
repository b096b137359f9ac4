"""The dashboard command: runs of a workspace folder in the browser."""

from __future__ import annotations

import os
import socket

import click

from netspec.cli.errors import user_errors
from netspec.cli.options import Integer
from netspec.errors import NetspecError


@click.command()
@click.argument("workspace", default=".", type=click.Path(file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on; anything but loopback makes every request need the token")
@click.option("--port", type=Integer(min=0, max=65535), default=6006, show_default=True,
              help="port to listen on (0: any free one)")
@click.option("--token", default=None, help="the token to require (default: a new random one)")
@click.option("--zoo", "zoo_dir", type=click.Path(file_okay=False), default=None,
              help="the zoo of the Models pages [default: $NETSPEC_ZOO, else ~/.local/share/netspec/zoo]")
@user_errors
def dashboard(workspace, host, port, token, zoo_dir):
    """Serve WORKSPACE (default: this folder) in the browser: its runs (state, live curves, configs, net),
    new runs, its datasets (and new ones from image folders), and the zoo's models (publish, predict).

    Listening beyond loopback (--host), every request needs the token printed in the URL;
    stopping or snapshotting a run always does.
    """
    try:
        from netspec.dashboard.app import create_app, listen, serve
        from netspec.dashboard.security import is_loopback, new_prefix, new_token
    except ImportError as exc:
        package = (exc.name or "").split(".")[0]
        if package not in ("starlette", "uvicorn", "anyio"):
            raise
        raise NetspecError(f"netspec dashboard needs {package}: python3 -m pip install 'netspec[dashboard]'") \
            from None
    if token is not None and not token.strip():
        raise click.BadParameter("give a token that is not empty", param_hint="--token")
    token = token or new_token()
    local = is_loopback(host)
    prefix = new_prefix()  # (the pages' path, and the token cookie's: no other port of this host receives it)
    app = create_app(workspace, token, token_required=not local, zoo=zoo_dir, prefix=prefix)
    listening = listen(host, port)
    shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()  # noqa: S104 - names a wildcard
    shown = f"[{shown}]" if ":" in shown else shown
    click.echo(f"netspec dashboard of {os.path.abspath(workspace)}: "
               f"http://{shown}:{listening.getsockname()[1]}/{prefix}/?token={token}")
    if not local:
        click.echo("listening beyond this machine: every request needs the token (it is in the URL)")
    click.echo("Ctrl-C stops it")
    serve(app, listening)
