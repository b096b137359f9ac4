"""Writing files so that a crash never leaves a half-written one in place."""

from __future__ import annotations

import contextlib
import os
import re

TEMPORARY_NAME = re.compile(r"\..+\.tmp-(\d{1,10})")  # what temporary_path names look like (group 1: the writer's pid)


def temporary_path(path: str | os.PathLike) -> str:
    """A hidden name beside ``path`` to write to before renaming (its folder is created)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds."""
    temporary = temporary_path(path)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_bytes(path: str | os.PathLike, data) -> None:
    """Write ``data`` to ``path`` atomically and durably (flushed to the disk before the rename).

    A full disk is an OSError from here, with no partial file left behind.
    """
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
