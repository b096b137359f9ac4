"""Printing text that came from elsewhere (a model card, a zoo index, a dataset's label names, a Caffe file)."""

from __future__ import annotations

import click

from netspec.errors import printable


def echo(text: str, **options) -> None:
    """``click.echo`` of text that may hold someone else's words, its control characters shown escaped."""
    click.echo(printable(text), **options)
