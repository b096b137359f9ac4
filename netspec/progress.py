"""A progress bar with count, rate and ETA for long commands (rich), shown only on a terminal."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def progress_bar(total: int, label: str, stream=None):
    """Yield a callable that advances the bar by one; nothing is drawn when ``stream`` is not a terminal."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield lambda: None
        return
    from rich.console import Console  # noqa: PLC0415 - only on a terminal
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text  # noqa: PLC0415

    class RateColumn(ProgressColumn):
        """Items per second."""

        def render(self, task):
            return Text(f"{task.speed:.0f}/s" if task.speed else "")

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), RateColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)
