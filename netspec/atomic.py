"""Writing files so that a crash never leaves a half-written one in place, and never through a symbolic link.

A folder someone else made (a workspace, a run folder, a zoo) may hold links
to files elsewhere under the names netspec writes: every write here opens its
file without following a link (``O_NOFOLLOW``) and refuses anything but a
regular file, with an OSError whose message names the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

TEMPORARY_NAME = re.compile(r"\..+\.tmp-(\d{1,10})")  # what temporary_path names look like (group 1: the writer's pid)


def temporary_path(path: str | os.PathLike) -> str:
    """A hidden name beside ``path`` to write to before renaming (its folder is created)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``, made empty (a file or link left under its name is removed, never
    written through); rename it into place only if the block succeeds (a link at ``path`` is replaced, not
    followed)."""
    temporary = temporary_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(temporary)
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = None):
    """Yield a file open for writing (``mode`` "w" or "wb") under a temporary name beside ``path``, renamed into
    place only if the block succeeds; the file is written through the descriptor made with ``O_NOFOLLOW``, so a
    link swapped in under the temporary name meanwhile is never written through."""
    with atomic_path(path) as temporary, open_for_writing(temporary, mode, encoding) as handle:
        yield handle


def write_bytes(path: str | os.PathLike, data) -> None:
    """Write ``data`` to ``path`` atomically and durably (flushed to the disk before the rename).

    A full disk is an OSError from here, with no partial file left behind.
    """
    with atomic_open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


WRITE_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND}


def open_for_writing(path: str | os.PathLike, mode: str = "a", encoding: str | None = None, buffering: int = -1):
    """``open(path, mode, buffering=buffering)`` for ``mode`` "w", "a" or "a+" (each with "b" for bytes) that
    refuses a symbolic link or anything but a regular file at ``path`` (a FIFO is refused at once, never waited
    on): an OSError naming the path."""
    path = os.fspath(path)
    flags = WRITE_FLAGS[mode.replace("b", "")] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
            raise OSError(exc.errno, f"{path} is {'a symbolic link' if exc.errno == errno.ELOOP else 'a FIFO'}, "
                                     "which netspec never writes to") from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, f"{path} is not a regular file, which netspec never writes to")
    os.set_blocking(descriptor, True)
    handle = os.fdopen(descriptor, mode, buffering, encoding=None if "b" in mode else encoding or "utf-8")
    raw = handle
    for layer in ("buffer", "raw"):  # (down to the file itself, under the text and buffer layers there are)
        raw = getattr(raw, layer, raw)
    raw.name = path  # (as open() names it: a file over a descriptor is named by its number, in every error)
    return handle


def make_folder(path: str | os.PathLike) -> str:
    """Make the folder ``path`` (and those above it) unless it exists; an OSError naming it when it is a symbolic
    link (files written into it would land where the link points)."""
    path = os.fspath(path)
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"{path} is a symbolic link, which netspec never writes through")
    os.makedirs(path, exist_ok=True)
    return path
