"""The reference configs shipped with netspec: listed, and copied into a folder of the user's (``netspec configs``).

A copy takes every YAML file of the config's folder, and the files of other
folders they include (ResNet-152 takes ResNet-50's blocks), with those
includes rewritten to the copies beside them, so the copied folder stands
alone.  Nothing is written through a symbolic link, and no file is replaced
unless asked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from netspec.atomic import atomic_open, make_folder
from netspec.configs import FOLDER, INDEX
from netspec.errors import ConfigError, DataError, did_you_mean, shown

# an ``include:`` of one file in another folder, as the reference nets write it
_OUTSIDE_INCLUDE = re.compile(r"^include: (\.\./[\w./-]+\.yaml)\s*$", re.M)


def reference_configs() -> dict[str, str]:
    """Each reference config's name and what it holds, in the index's order."""
    return yaml.safe_load(INDEX.read_text(encoding="utf-8"))


def config_files(name: str) -> dict[str, str]:
    """The files a copy of config ``name`` holds, by file name: their text, includes made local."""
    configs = reference_configs()
    if name not in configs:
        raise ConfigError(f"no reference config {shown(name)}{did_you_mean(name, configs)} "
                          "(netspec configs lists them)")
    paths = sorted((FOLDER / name).glob("*.yaml"))
    if not paths:
        raise DataError(f"the reference config {name} has no files in {FOLDER / name}: reinstall netspec")
    files = {}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for included in _OUTSIDE_INCLUDE.findall(text):
            source = (path.parent / included).resolve()
            files[source.name] = source.read_text(encoding="utf-8")
            text = text.replace(f"include: {included}", f"include: {source.name}")
        files[path.name] = text
    return files


def copy_config(name: str, destination: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """Copy config ``name`` into the folder ``destination`` (made if missing); the paths written.

    Refuses, before writing anything, a file of that name already there unless
    ``overwrite`` (a symbolic link there is then replaced, never written
    through), and a destination folder that is a symbolic link.
    """
    files = config_files(name)
    folder = Path(destination)
    targets = [folder / file_name for file_name in files]
    existing = [str(target) for target in targets if os.path.lexists(target)]
    if existing and not overwrite:
        raise DataError(f"{existing[0]} exists; copy into another folder, or give --overwrite to replace "
                        f"{'it' if len(existing) == 1 else f'these {len(existing)} files'}")
    try:
        make_folder(folder)
        for target, text in zip(targets, files.values()):
            with atomic_open(target, "w", encoding="utf-8") as handle:
                handle.write(text)
    except OSError as exc:
        raise DataError(f"cannot copy {name} into {folder}: {exc.strerror or exc}") from None
    return targets
