"""Where layers that write files may write.

A layer type that writes files (``HDF5Output``) declares ``writes_files``.
Its paths go through the net's :class:`OutputFolder`: a relative path
resolves inside the folder (the run folder when training, the current
directory for ``netspec test`` and ``predict``); an absolute path, or a
relative one that climbs out with ``..``, is refused unless the user allows
writing anywhere.  Whether a net may hold such layers at all is the user's
:class:`netspec.engine.trust.Trust`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from netspec.errors import ParamError

ALLOW_ANYWHERE = "or allow writing anywhere (--allow-absolute-outputs)"


@dataclass(frozen=True)
class OutputFolder:
    """The folder relative output paths resolve in; ``anywhere`` lets paths leave it.

    ``remedy`` ends the message refusing a path that leaves it: how the user
    can allow that where the net is built.
    """

    root: str = "."
    anywhere: bool = False
    remedy: str = ALLOW_ANYWHERE

    def resolve(self, path: str, key: str) -> str:
        """``path`` resolved inside the folder; ParamError naming ``key`` when it would leave it.

        The folders on the way are followed as the OS will follow them, so a
        symbolic link inside the output folder cannot lead out of it.
        """
        root = os.path.abspath(self.root)
        if self.anywhere:
            return os.path.join(root, os.path.expanduser(path))
        if os.path.isabs(path) or path.startswith("~"):
            raise ParamError(key, f"'{path}' is outside the output folder {root}; write a path relative to it, "
                                  f"{self.remedy}")
        resolved = os.path.normpath(os.path.join(root, path))
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, os.path.realpath(os.path.dirname(resolved))]) != real_root:
            raise ParamError(key, f"'{path}' leads out of the output folder {root} (through '..' or a link); write "
                                  f"a path inside it, {self.remedy}")
        return resolved
