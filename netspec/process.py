"""How netspec starts itself in another process: the training the dashboard launches, the ranks of an MPI run."""

from __future__ import annotations

import sys


def netspec_command(*arguments: str) -> list[str]:
    """The command line of ``netspec ARGUMENTS`` in a new process of this Python.

    ``python -m`` puts the working folder first on the module path, so a ``click.py`` or ``json.py`` lying in
    a workspace someone else made would run in place of the real module; ``-P`` leaves it off.  (Python layers
    name their module's folder themselves, where a net allows them.)
    """
    return [sys.executable, "-P", "-m", "netspec", *arguments]
