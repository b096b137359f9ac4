"""A progress bar with count, rate and ETA for long commands (rich), shown only on a terminal."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def progress_bar(total: int | None, label: str, stream=None, in_bytes: bool = False):
    """Yield ``advance(count=1)``; nothing is drawn when ``stream`` is not a terminal.

    With ``in_bytes`` the bar shows sizes and transfer speed instead of counts and a rate.  A ``total`` of None (not
    known beforehand) shows the count so far and a moving bar.
    """
    stream = stream or sys.stderr
    if not stream.isatty():
        yield lambda count=1: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Items per second."""

        def render(self, task):
            return Text(f"{task.speed:.0f}/s" if task.speed else "")

    counts = (DownloadColumn(), TransferSpeedColumn()) if in_bytes else (MofNCompleteColumn(), RateColumn())
    columns = (TextColumn(label), BarColumn(), *counts, TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda count=1: progress.advance(task, count)
