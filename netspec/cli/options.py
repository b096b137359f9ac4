"""Options several commands share."""

from __future__ import annotations

import click

phase_option = click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default=None,
                            help="phase to build (default: the file's state, else TEST)")


stage_option = click.option("--stage", "stages", multiple=True, help="active stage (repeatable)")


level_option = click.option("--level", type=int, default=None, help="net level for include/exclude rules")
