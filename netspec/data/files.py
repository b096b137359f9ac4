"""Data files opened and written defensively: regular files only, failed writes as one-line DataErrors.

Opening a FIFO, a device or a link loop where a data file should be would
block, read forever or fail deep inside a library; :func:`regular_file`
refuses them first, naming the file.  A write that fails (a full disk, a
file-size limit) becomes a :class:`DataError` naming what was being written
(:func:`writing`), and says so when the disk is full: LMDB reports that as an
I/O error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

from netspec.errors import DataError


def one_line(exc: BaseException) -> str:
    """A library's error message on one line (h5py's run over several)."""
    return " ".join(str(exc).split())


def regular_file(path: str, limit: int | None = None, what: str = "") -> int:
    """The size of ``path``; DataError naming it (and ``what`` it is, when given) unless it is a regular file of
    at most ``limit`` bytes."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot read{f' {what}' if what else ''}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{path}: not a regular file")
    if limit is not None and info.st_size > limit:
        raise DataError(f"{path}: {info.st_size} bytes, more than the {limit} it may hold")
    return info.st_size


def read_small(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, opened without waiting (a FIFO is refused, not waited on); OSError
    when it cannot be opened, DataError naming it when it is no regular file of at most ``limit`` bytes."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise DataError(f"{path}: {info.st_size} bytes, more than the {limit} it may hold")
        return handle.read(limit + 1)[:limit]


TEXT_LIMIT = 256 << 20  # bytes of a list file or of label names (ImageNet's training list is about 50 MB)


def read_text_lines(path: str, what: str) -> list[str]:
    """The lines of the UTF-8 text file ``path`` (``what`` it is, for errors): DataError naming it when it is no
    regular file of at most TEXT_LIMIT bytes (a FIFO is refused, not waited on), cannot be read, is not UTF-8
    or holds a NUL byte."""
    try:
        data = read_small(path, TEXT_LIMIT)
    except OSError as exc:
        raise DataError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: {what}: not UTF-8 text (byte {exc.start})") from None
    if "\0" in text:
        raise DataError(f"{path}: {what}: a NUL byte (byte {data.index(0)})")
    return text.splitlines()


def write_error(path: str, exc: Exception) -> DataError:
    """The DataError for a write to ``path`` that failed with ``exc``."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    code = getattr(exc, "errno", None) or _hdf5_errno(exc)
    space = os.statvfs(folder)
    if code == errno.ENOSPC or (space.f_blocks and not space.f_bavail):  # (a pseudo file system has no blocks)
        reason = "the disk is full"
    else:
        reason = os.strerror(code) if code else one_line(exc)
    return DataError(f"{path}: cannot write: {reason}")


def _hdf5_errno(exc: Exception) -> int | None:
    """The errno an HDF5 error message quotes (``errno = 28``), if it quotes one."""
    found = re.search(r"\berrno = (\d+)", str(exc))
    return int(found.group(1)) if found else None


@contextlib.contextmanager
def writing(path: str, errors: tuple[type[Exception], ...] = (OSError,)):
    """Turn ``errors`` raised inside the block into :func:`write_error` for ``path``."""
    try:
        yield
    except errors as exc:
        raise write_error(path, exc) from None
