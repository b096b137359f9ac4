"""A zoo: a folder of published models, ``models/<name>/<version>/``, with ``index.json`` at its root.

The index is rebuilt from the model folders after every change, so it always
matches them.  Models are installed by renaming a complete folder into place
and removed by renaming it away first, so a failure never leaves half a model.
``index.json``::

    {"format": "netspec-zoo-1",
     "models": {"<name>": {"versions": ["1", "2"], "latest": "2", "summary": "...", "task": "..."}}}
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from netspec.atomic import atomic_open
from netspec.engine.weights import open_weights
from netspec.errors import ConfigError, NetspecError, WeightsError, shown
from netspec.model_zoo.card import (
    CARD,
    README,
    ModelCard,
    check_name,
    check_version,
    file_sha256,
    read_card,
    readme,
)
from netspec.spec.yaml_lines import load_yaml, read_source

INDEX = "index.json"
INDEX_FORMAT = "netspec-zoo-1"
MODELS = "models"


class ZooError(NetspecError):
    """A zoo operation that cannot be done (missing model, failed verification, bad download)."""


def default_zoo() -> str:
    """``$NETSPEC_ZOO``, else ``$XDG_DATA_HOME/netspec/zoo`` (``~/.local/share/netspec/zoo``)."""
    if os.environ.get("NETSPEC_ZOO"):
        return os.environ["NETSPEC_ZOO"]
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data_home, "netspec", "zoo")


def split_ref(ref: str) -> tuple[str, str | None]:
    """``name[@version]`` as ``(name, version or None)``, both checked."""
    name, _, version = ref.partition("@")
    check_name(name)
    return name, check_version(version) if version else None


PRE_RELEASES = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3, "preview": 3}


def version_key(version: str) -> tuple:
    """Sort key of versions as version numbers (PEP 440's order where it applies): 2 < 10, 1.2 < 1.10, v9 < V12
    (case and a leading v aside); a pre-release before its release (1.0.dev1 < 1.0a1 < 1.0-beta < 1.0rc1 < 1.0),
    any other word after it (1.0 < 1.0.post1); a local label (2.0+cuda) only after the same release, never past
    the next (2.0+cuda < 2.0.1).  Runs of digits compare by their length without leading zeros, then their
    digits (no int() of a 5000-digit run); versions equal by all that (1.0, 1.00) compare as text."""
    release, _, local = version.lower().partition("+")
    parts = []
    for part in re.findall(r"[0-9]+|[a-z]+", release.removeprefix("v")):
        if part.isdigit():
            parts.append((2, len(part.lstrip("0")), part.lstrip("0")))
        else:
            parts.append((0, PRE_RELEASES[part], "") if part in PRE_RELEASES else (3, 0, part))
    parts.append((1, 0, ""))  # the release's end: a pre-release word before it is older, anything more newer
    return tuple(parts), local, version


def parse_index(text: str | bytes, where: str) -> dict:
    """The zoo index in JSON ``text``, its names, versions and summaries checked; ZooError naming ``where`` when it
    is not one."""
    try:
        index = json.loads(text)
    except ValueError as exc:
        raise ZooError(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise ZooError(f"{where}: not a netspec zoo index (nested too deeply)") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not isinstance(index.get("models"), dict):
        raise ZooError(f"{where}: not a netspec zoo index (no '{INDEX_FORMAT}' format)")
    for name, entry in index["models"].items():
        try:
            _check_entry(name, entry)
        except ConfigError as exc:
            raise ZooError(f"{where}: invalid index: {exc}") from None
    return index


def _check_entry(name: str, entry) -> None:
    """ConfigError unless ``entry`` is a valid index entry for model ``name``."""
    check_name(name)
    versions = entry.get("versions") if isinstance(entry, dict) else None
    if not isinstance(versions, list) or not versions:
        raise ConfigError(f"model '{name}' lists no versions")
    for version in versions:
        if not isinstance(version, str):
            raise ConfigError(f"model '{name}': a version must be a string such as \"1\", not {_json_kind(version)}")
        check_version(version)
    for key in ("summary", "task"):
        if not isinstance(entry.get(key, ""), str):
            raise ConfigError(f"model '{name}': '{key}' must be a string, not {_json_kind(entry[key])}")


def _json_kind(value) -> str:
    """What a JSON value that is not a string is, for messages (never its whole text, which may be huge)."""
    kinds = {dict: "an object", list: "a list", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), f"the number {value}")


class Zoo:
    """The zoo in folder ``root`` (created when a model is installed)."""

    def __init__(self, root: str | None = None):
        self.root = os.path.abspath(root or default_zoo())

    # ---- reading ------------------------------------------------------------------------------
    def index(self) -> dict:
        """The index (empty when the zoo does not exist yet)."""
        path = os.path.join(self.root, INDEX)
        if not os.path.exists(path):
            return {"format": INDEX_FORMAT, "models": {}}
        try:
            with open(path, "rb") as handle:
                text = handle.read()
        except OSError as exc:
            raise ZooError(f"{path}: cannot read the index: {exc.strerror}") from None
        return parse_index(text, path)

    def resolve(self, ref: str) -> tuple[str, str]:
        """``(name, version)`` of ``name[@version]`` (latest version when none is given) in this zoo."""
        name, version = split_ref(ref)
        entry = self.index()["models"].get(name)
        if entry is None:
            raise ZooError(f"no model '{name}' in the zoo {self.root} (netspec zoo list shows what it has)")
        if version is None:
            return name, max(entry["versions"], key=version_key)
        if version not in entry["versions"]:
            raise ZooError(f"model '{name}' has no version {version} in {self.root} "
                           f"(it has {', '.join(entry['versions'])})")
        return name, version

    def folder(self, name: str, version: str) -> str:
        """Where ``name@version`` lives (names are checked, so the path stays inside the zoo)."""
        return os.path.join(self.root, MODELS, check_name(name), check_version(version))

    def card(self, ref: str) -> ModelCard:
        """The card of ``name[@version]``."""
        return read_card(self.folder(*self.resolve(ref)))

    def verify(self, ref: str | None = None) -> list[str]:
        """Re-hash every file of one model (or of all); returns one line per problem."""
        refs = [ref] if ref else [f"{n}@{v}" for n, e in self.index()["models"].items() for v in e["versions"]]
        problems = []
        for each in refs:
            folder = self.folder(*self.resolve(each))
            problems += [f"{each}: {p}" for p in verify_folder(folder)]
        return problems

    def refuse_existing(self, name: str, version: str, force: bool = False) -> None:
        """ZooError when the zoo has ``name@version`` already, unless ``force`` allows replacing it."""
        if not force and os.path.exists(self.folder(name, version)):
            raise ZooError(f"{name}@{version} is already in the zoo {self.root}; pass --force to replace it")

    # ---- changing -----------------------------------------------------------------------------
    def install(self, staged: str, force: bool = False) -> str:
        """Move the complete model folder ``staged`` into place (after verifying it) and update the index."""
        card = read_card(staged)
        problems = verify_folder(staged)
        if problems:
            raise ZooError(f"{card.ref} was not installed: " + "; ".join(problems))
        self.refuse_existing(card.name, card.version, force)
        target = self.folder(card.name, card.version)
        old = self._set_aside(target) if os.path.exists(target) else None
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(staged, target)
        if old:
            shutil.rmtree(old)
        self.write_index()
        return target

    def remove(self, ref: str) -> list[str]:
        """Delete one version, or every version of a name; returns the refs removed."""
        name, version = split_ref(ref)
        entry = self.index()["models"].get(name)
        if entry is None or (version and version not in entry["versions"]):
            raise ZooError(f"no model {ref} in the zoo {self.root}")
        versions = [version] if version else list(entry["versions"])
        for each in versions:
            shutil.rmtree(self._set_aside(self.folder(name, each)))
        model_dir = os.path.join(self.root, MODELS, name)
        if os.path.isdir(model_dir) and not os.listdir(model_dir):
            os.rmdir(model_dir)
        self.write_index()
        return [f"{name}@{v}" for v in versions]

    def staging_folder(self, label: str) -> str:
        """A fresh folder inside the zoo (same file system, so installing is a rename); ZooError when the zoo
        cannot be written."""
        parent = os.path.join(self.root, ".staging")
        try:
            os.makedirs(parent, exist_ok=True)
            return tempfile.mkdtemp(prefix=f"{label}-", dir=parent)
        except OSError as exc:
            raise ZooError(f"{self.root}: cannot write to the zoo: {exc.strerror}") from None

    def _set_aside(self, folder: str) -> str:
        aside = self.staging_folder("removed")
        os.rmdir(aside)
        os.replace(folder, aside)
        return aside

    def write_index(self) -> dict:
        """Rebuild index.json from the model folders (atomically)."""
        models = {}
        base = os.path.join(self.root, MODELS)
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            versions = sorted((v for v in os.listdir(os.path.join(base, name))
                               if os.path.isfile(os.path.join(base, name, v, CARD))), key=version_key)
            if versions:
                latest = read_card(os.path.join(base, name, versions[-1]))
                models[name] = {"versions": versions, "latest": versions[-1], "summary": latest.summary,
                                "task": latest.task}
        index = {"format": INDEX_FORMAT, "models": models}
        with atomic_open(os.path.join(self.root, INDEX), "w") as out:
            json.dump(index, out, indent=1)
        return index


def verify_folder(folder: str) -> list[str]:
    """Problems with a model folder: files missing, changed, linked, or not listed, and weights that reach outside
    their file (:mod:`netspec.data.hdf5_policy`); [] when it is intact."""
    card = read_card(folder)
    problems = []
    for entry in card.files:
        path = os.path.join(folder, entry.path)
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
            problems.append(f"{entry.path} is not a regular file")
        elif not os.path.exists(path):
            problems.append(f"{entry.path} is missing")
        elif os.path.getsize(path) != entry.size:
            problems.append(f"{entry.path} has {os.path.getsize(path)} bytes, the card says {entry.size}")
        elif file_sha256(path) != entry.sha256:
            problems.append(f"{entry.path} does not match its sha256 in the card")
    if card.weights and not problems:
        try:
            with open_weights(os.path.join(folder, card.weights)):
                pass
        except WeightsError as exc:
            problems.append(str(exc).replace(f"{folder}{os.sep}", ""))
    listed = {entry.path for entry in card.files} | {CARD, README}
    problems += [f"{name} is not listed in the card" for name in sorted(os.listdir(folder)) if name not in listed]
    return problems + include_problems(folder, card, card.deploy_net)


def include_problems(folder: str, card: ModelCard, net: str | None) -> list[str]:
    """The ``include:`` entries of the model's net file ``net`` (and of the files it includes) that name anything
    but a file the card lists: a model reads its own files alone, each checked against its sha256.  Every command
    checks its deploy net (:func:`verify_folder`); fine-tuning its train net too."""
    listed = {entry.path for entry in card.files}
    problems, seen = [], set()
    pending = [net] if net in listed else []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            tree = load_yaml(read_source(os.path.join(folder, name))[0], name)
        except ConfigError:
            continue  # (the net's own problems are named when it is read)
        includes = tree.get("include", []) if isinstance(tree, dict) else []
        for value in includes if isinstance(includes, list) else [includes]:
            if isinstance(value, str) and value in listed:
                pending.append(value)
            else:
                problems.append(f"{name} includes {shown(value)}, which is no file of the model (a model reads the "
                                "files its card lists alone)")
    return problems


def write_readme(folder: str, card: ModelCard) -> None:
    """Generate README.md beside the card."""
    with open(os.path.join(folder, README), "w", encoding="utf-8") as handle:
        handle.write(readme(card))
