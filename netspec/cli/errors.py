"""How the command line reports what a user caused: one line per problem on stderr, exit status 1."""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback

import click

from netspec.errors import ConfigError, NetspecError, printable


def user_errors(command):
    """Report NetspecError as text on stderr with exit status 1, never a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except NetspecError as exc:
            report_error(exc)
            sys.exit(1)

    return wrapper


def report_error(exc: NetspecError, prefix: str = "error: ") -> None:
    """Print a user error on stderr, one line per problem."""
    problems = exc.problems if isinstance(exc, ConfigError) else [exc]
    for problem in problems:
        click.echo(f"{prefix}{printable(str(problem))}", err=True)
    if len(problems) > 1:
        click.echo(f"{len(problems)} errors", err=True)


@contextlib.contextmanager
def rank_errors(comm):
    """In a distributed run, report a rank's error with its rank, then end every rank of the job.

    An error all ranks raise together (``every_rank``) is reported by rank 0
    alone and the ranks exit normally; any other ends the job with MPI_Abort,
    so no rank is left waiting for one that has gone.
    """
    if comm.size == 1:
        yield
        return
    try:
        yield
    except NetspecError as exc:
        if exc.every_rank:
            if comm.rank == 0:
                report_error(exc)
            sys.exit(1)
        report_error(exc, f"error: rank {comm.rank}: ")
        comm.abort(1)
    except Exception as exc:  # noqa: BLE001 - a bug: show it, and do not leave the other ranks waiting
        traceback.print_exc()
        click.echo(f"error: rank {comm.rank}: {type(exc).__name__}: {exc}", err=True)
        comm.abort(1)
