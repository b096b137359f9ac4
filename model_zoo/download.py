"""``netspec zoo download``: fetch a model from the first source that has it, check every byte, install.

A source (:mod:`netspec.model_zoo.sources`) is a zoo folder, a ``file://``
URL or an ``http(s)://`` zoo (e.g. ``netspec zoo serve``), or a Caffe models
tree, whose model directories are imported (:mod:`netspec.model_zoo.caffe_zoo`).
Nothing is fetched unless the zoo's disk has room for the files the card lists
(plus 5% and 64 MiB to spare).  Files are fetched into
``<zoo>/.partial/<name>@<version>/``, each cut off at the size the card lists and
checked against its sha256, and the model is installed only when all are right.

A transfer that breaks off keeps its ``.part`` file when the source can
continue it, and the next attempt fetches only the rest.  Any other failure
(more bytes than the card lists, fewer from a source that has no more, a wrong
sha256, an HTTP error, a server without Range) removes the model's partial
files.  Nothing else in the zoo changes.
"""

from __future__ import annotations

import os
import shutil

from netspec.model_zoo.caffe_zoo import (
    CAFFE_VERSION,
    CaffeDirectory,
    CaffeImport,
    import_caffe,
    tree_folder,
    tree_index,
)
from netspec.model_zoo.card import CARD, PART, ModelCard, file_sha256, parse_card
from netspec.model_zoo.sources import (
    NotFoundError,
    check_room,
    fetch_file,
    location,
    make_partial_folder,
    open_source,
    remove_partial,
    resumable,
    sources_config_path,
    without_progress,
)
from netspec.model_zoo.zoo import (
    INDEX,
    MODELS,
    Zoo,
    ZooError,
    parse_index,
    split_ref,
    version_key,
    write_readme,
)


def find(ref: str, sources: list) -> tuple[object, str, str, str | None]:
    """The first source that has ``ref``: ``(source, name, version, folder)``, ``folder`` the model's directory when
    the source is a Caffe models tree (else None); ZooError listing why none did."""
    name, version = split_ref(ref)
    reasons = []
    for source in sources:
        try:
            return (source, name, *_lookup(source, name, version, ref))
        except ZooError as exc:
            reasons.append(str(exc))
    if not sources:
        raise ZooError(f"no zoo sources to look for {ref} in: give one with --from FOLDER|URL, or list them under "
                       f"'sources:' in {sources_config_path()}")
    raise ZooError(f"no source has {ref}: " + "; ".join(reasons))


def _lookup(source, name: str, version: str | None, ref: str) -> tuple[str, str | None]:
    """The version of ``name`` that ``source`` has, and the folder of its model directory when the source is a Caffe
    models tree (no index, a folder ``name/readme.md``, version 1); ZooError saying why it has none."""
    try:
        index = parse_index(source.read(INDEX), f"{source.label}/{INDEX}")
    except NotFoundError:
        index = None
    if index is None:
        folder = tree_folder(source, name) if version in (None, CAFFE_VERSION) else None
        if folder is not None:
            return CAFFE_VERSION, folder
        raise ZooError(f"{source.label}: has no {ref} (no {INDEX}, nor a Caffe model directory {name}/readme.md, "
                       f"which is version {CAFFE_VERSION})")
    entry = index["models"].get(name)
    if entry is None or (version and version not in entry["versions"]):
        raise ZooError(f"{source.label}: has no {ref}")
    return version or max(entry["versions"], key=version_key), None


def download(ref: str, sources: list, zoo: Zoo, force: bool = False, progress_factory=None,
             timeout: float = 30.0) -> ModelCard:
    """Fetch ``name[@version]`` from the first source that has it, verify every file, install into ``zoo``.

    From a Caffe models tree, the model directory is imported (``timeout``: for the download of its caffemodel).
    """
    source, name, version, folder = find(ref, sources)
    if folder is not None:
        request = CaffeImport(name=name, force=force, timeout=timeout)
        return import_caffe(CaffeDirectory(source, folder), zoo, request, progress_factory)[0]
    zoo.refuse_existing(name, version, force)
    base = f"{MODELS}/{name}/{version}"
    card_text = source.read(f"{base}/{CARD}")
    card = parse_card(card_text.decode("utf-8", errors="replace"), f"{source.label}/{base}/{CARD}")
    if (card.name, card.version) != (name, version):
        raise ZooError(f"{source.label}/{base}/{CARD}: the card is of {card.ref}, not {name}@{version}")
    partial_dir = os.path.join(zoo.root, ".partial", f"{name}@{version}")
    _check_room(card, partial_dir, zoo.root)
    make_partial_folder(partial_dir, zoo.root)
    total = sum(entry.size for entry in card.files)
    with resumable(partial_dir, source), (progress_factory or without_progress)(total) as advance:
        for entry in card.files:
            _fetch_checked(source, f"{base}/{entry.path}", os.path.join(partial_dir, entry.path), entry, advance)
    staged = zoo.staging_folder(name)
    try:
        for entry in card.files:
            os.replace(os.path.join(partial_dir, entry.path), os.path.join(staged, entry.path))
        with open(os.path.join(staged, CARD), "wb") as handle:
            handle.write(card_text)
        write_readme(staged, card)
        zoo.install(staged, force=force)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    remove_partial(partial_dir)
    return card


def _check_room(card: ModelCard, partial_dir: str, root: str) -> None:
    """Refuse a download that the disk of the zoo ``root`` has no room for: what is still to fetch, and some spare."""
    missing = 0
    for entry in card.files:
        target = os.path.join(partial_dir, entry.path)
        if not os.path.exists(target):
            part = target + PART
            missing += entry.size - (min(os.path.getsize(part), entry.size) if os.path.exists(part) else 0)
    check_room(missing, root, card.ref)


def _fetch_checked(source, relative: str, target: str, entry, advance) -> None:
    """Fetch one file of the card to ``target``, checking its size and sha256 (one an earlier attempt fetched is kept
    when intact)."""
    if os.path.exists(target) and _intact(target, entry):
        advance(entry.size)
        return
    fetch_file(source, relative, target, entry.size, lambda _total: advance)
    if not _intact(target, entry):
        raise ZooError(f"{location(source, relative)}: the sha256 does not match the card; the download was discarded")


def _intact(path: str, entry) -> bool:
    """True when the file at ``path`` has the size and sha256 of card entry ``entry``."""
    return os.path.getsize(path) == entry.size and file_sha256(path) == entry.sha256


def read_index(zoo_dir: str | None, source: str | None) -> tuple[dict, str, list[str]]:
    """The index of the local zoo (``zoo_dir``, or the default one), or of a source folder or URL (a Caffe models
    tree's from its model directories), where it is, and notes on what the index leaves out."""
    if source is None:
        local = Zoo(zoo_dir)
        return local.index(), local.root, []
    opened = open_source(source, timeout=30)
    try:
        return parse_index(opened.read(INDEX), f"{source}/{INDEX}"), source, []
    except NotFoundError:
        index, notes = tree_index(opened)
        return index, source, notes
