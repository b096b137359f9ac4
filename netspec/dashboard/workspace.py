"""The workspace folder a dashboard serves: client paths confined to it, and the run folders under it."""

from __future__ import annotations

import os
from collections.abc import Iterator

from netspec.errors import NetspecError
from netspec.training import run_folder

MAX_DEPTH = 8  # folders deeper than this below the workspace are not searched for runs


class RefusedPathError(NetspecError):
    """A path a client named that the dashboard will not serve; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Workspace:
    """A folder whose run folders the dashboard shows; a client names runs by their path relative to it."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise NetspecError(f"{root}: no such folder to serve")

    def path(self, relative: str) -> str:
        """The real path ``relative`` names inside the workspace, which need not exist yet.

        ``..``, absolute paths, hidden names and symbolic links leading out of
        the workspace are refused (403).
        """
        parts = relative.replace("\\", "/").split("/")
        if "\0" in relative or relative.startswith(("/", "\\")) or os.path.isabs(relative) or any(
                part == ".." or (part.startswith(".") and part != ".") for part in parts):
            raise RefusedPathError(f"{relative!r}: outside the workspace", 403)
        real = os.path.realpath(os.path.join(self.root, *parts))
        if not self.holds(real):
            raise RefusedPathError(f"{relative!r}: outside the workspace", 403)
        return real

    def holds(self, real: str) -> bool:
        """Whether the real path ``real`` is the workspace or inside it."""
        return real == self.root or real.startswith(self.root + os.sep)

    def folder(self, relative: str) -> str:
        """The real path of the folder ``relative`` names inside the workspace (:meth:`path`; 404 when missing)."""
        real = self.path(relative)
        if not os.path.isdir(real):
            raise RefusedPathError(f"{relative!r}: no such folder in the workspace", 404)
        return real

    def file(self, relative: str) -> str:
        """The real path of the file ``relative`` names inside the workspace (:meth:`path`; 404 when missing)."""
        real = self.path(relative)
        if not os.path.isfile(real):
            raise RefusedPathError(f"{relative!r}: no such file in the workspace", 404)
        return real

    def relative(self, real: str) -> str:
        """The path of ``real`` (inside the workspace) relative to it, with forward slashes."""
        return os.path.relpath(real, self.root).replace(os.sep, "/")

    def run(self, relative: str) -> str:
        """The real path of the run folder ``relative`` names (404 when the folder holds no run)."""
        folder = self.folder(relative)
        if not run_folder.is_run_folder(folder, os.listdir(folder)):
            raise RefusedPathError(f"{relative!r}: not a run folder (no metrics.jsonl or snapshots)", 404)
        return folder

    def runs(self) -> list[str]:
        """Every run folder under the workspace, as paths relative to it ('.' for the workspace itself), sorted."""
        return sorted(self.relative(folder) for folder, _, is_run in self.folders() if is_run)

    def folders(self) -> Iterator[tuple[str, list[os.DirEntry], bool]]:
        """``(folder, its entries, whether it is a run folder)`` for each folder searched under the workspace.

        Hidden folders, symbolic links, the folders inside a run and those
        deeper than MAX_DEPTH are not searched.
        """
        yield from self._search(self.root, 0)

    def _search(self, folder: str, depth: int) -> Iterator[tuple[str, list[os.DirEntry], bool]]:
        try:
            with os.scandir(folder) as scan:
                entries = list(scan)
        except OSError:
            return
        is_run = run_folder.is_run_folder(folder, [entry.name for entry in entries])
        yield folder, entries, is_run
        if is_run or depth >= MAX_DEPTH:
            return
        for entry in entries:
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                yield from self._search(entry.path, depth + 1)
