"""The workspace folder a dashboard serves: client paths confined to it, and the run folders under it."""

from __future__ import annotations

import os

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

    def folder(self, relative: str) -> str:
        """The real path of the folder ``relative`` names inside the workspace.

        ``..``, absolute paths, hidden names and symbolic links leading out of
        the workspace are refused (403); a folder that does not exist is 404.
        """
        parts = relative.replace("\\", "/").split("/")
        if "\0" in relative or relative.startswith(("/", "\\")) or os.path.isabs(relative) or any(
                part == ".." or (part.startswith(".") and part != ".") for part in parts):
            raise RefusedPathError(f"{relative!r}: outside the workspace", 403)
        real = os.path.realpath(os.path.join(self.root, *parts))
        if real != self.root and not real.startswith(self.root + os.sep):
            raise RefusedPathError(f"{relative!r}: outside the workspace", 403)
        if not os.path.isdir(real):
            raise RefusedPathError(f"{relative!r}: no such folder in the workspace", 404)
        return real

    def run(self, relative: str) -> str:
        """The real path of the run folder ``relative`` names (404 when the folder holds no run)."""
        folder = self.folder(relative)
        if not run_folder.is_run_folder(folder, os.listdir(folder)):
            raise RefusedPathError(f"{relative!r}: not a run folder (no metrics.jsonl or snapshots)", 404)
        return folder

    def runs(self) -> list[str]:
        """Every run folder under the workspace, as paths relative to it ('.' for the workspace itself), sorted.

        Hidden folders, symbolic links and the folders inside a run are not searched.
        """
        found: list[str] = []
        self._search(self.root, 0, found)
        return sorted(found)

    def _search(self, folder: str, depth: int, found: list[str]) -> None:
        try:
            with os.scandir(folder) as scan:
                entries = list(scan)
        except OSError:
            return
        if run_folder.is_run_folder(folder, [entry.name for entry in entries]):
            found.append(os.path.relpath(folder, self.root).replace(os.sep, "/"))
            return
        if depth >= MAX_DEPTH:
            return
        for entry in entries:
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                self._search(entry.path, depth + 1, found)
