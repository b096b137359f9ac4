"""Conversions staged in ``<out>.partial``: written there whole, then moved into place.

A conversion with several parts (train and val datasets, train.h5 and
test.h5 with their list files) writes them into ``<out>.partial``, a folder
marked as a conversion's own by the file IN_PROGRESS, and moves them into
``out`` only once every part is complete.  A conversion that fails (a full
disk) removes its partial folder; one that is killed leaves it, never a
folder that looks complete, and the next conversion into ``out`` replaces it.
A ``.partial`` folder without the mark is refused, never removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from netspec.data.files import writing
from netspec.errors import DataError

PARTIAL = ".partial"  # the suffix of a folder being written
IN_PROGRESS = "conversion-in-progress"  # the file marking a .partial folder as a conversion's own


def partial_folder(path: str) -> str:
    """``<path>.partial``, made afresh for a conversion into ``path`` and marked as a conversion's own (it holds
    IN_PROGRESS): one an interrupted conversion left is replaced, any other refused (DataError), never removed."""
    partial = path + PARTIAL
    if os.path.lexists(partial):
        if not os.path.isfile(os.path.join(partial, IN_PROGRESS)):
            raise DataError(f"{partial}: exists and is no conversion's leftover (it has no {IN_PROGRESS}), so it is "
                            "left alone: move it away, or choose another output")
        shutil.rmtree(partial)
    os.makedirs(partial)
    open(os.path.join(partial, IN_PROGRESS), "w").close()
    return partial


def move_into_place(path: str) -> None:
    """Move the complete conversion in ``<path>.partial`` to ``path``: the whole folder in one rename when
    ``path`` is not there, else each of its entries (replacing those of the same name)."""
    partial = path + PARTIAL
    os.remove(os.path.join(partial, IN_PROGRESS))
    if not os.path.lexists(path):
        os.replace(partial, path)
        return
    for name in os.listdir(partial):
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        os.replace(os.path.join(partial, name), target)
    os.rmdir(partial)


@contextlib.contextmanager
def staged(out: str):
    """Yield the partial folder of a conversion into ``out`` (beside where ``out`` really is, on its file
    system); move what the block wrote into ``out`` when it succeeds, remove it all when it fails.  Failures to
    make or move the folder are DataErrors naming ``out``."""
    real = os.path.realpath(out)
    with writing(out):
        partial = partial_folder(real)
    try:
        yield partial
        with writing(out):
            move_into_place(real)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
