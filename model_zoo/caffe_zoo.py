"""Caffe's Model Zoo as a source of models: ``netspec zoo import-caffe``, and Caffe models trees for ``zoo download``
and ``zoo list``.

A Caffe model directory holds ``readme.md``, which starts with YAML front
matter (between two ``---`` lines) naming ``caffemodel``, ``caffemodel_url``
and ``sha1`` (and ``name``, ``license``, ``gist_id``, ``caffe_commit``), beside
``deploy.prototxt`` and often ``train_val.prototxt`` and ``solver.prototxt``.
A models tree is a folder or URL holding such directories as
``<name>/readme.md``, as Caffe's ``models/`` does; over HTTP its folders are
found in the server's directory listing.  A folder whose name is a model name
once in lower case (``VGG_16`` is ``vgg_16``) is the model of that name; the
others are left out (``zoo import-caffe TREE/DIR --name NAME`` imports one).

Importing a directory reads the front matter as plain text (the bounded safe
loader, no YAML tags at all, each value as written), takes the caffemodel
from ``--weights``, from beside the readme, or from ``caffemodel_url`` (http
or https; a ``file:`` URL only in a directory on this machine, for a file
inside it; an HTTP download shows its progress, needs room on the disk and
resumes, as ``zoo download`` does), and checks its SHA-1 before anything else.
The prototxts and weights are then converted with netspec's Caffe importers in
the zoo's ``.partial/caffe-<name>@1`` folder and published as version 1 of one
model: BGR input as in Caffe, no mean unless one is given, and the front
matter and readme text in ``provenance.caffe``.  The train net and solver keep
Caffe's paths, read from the root of a Caffe checkout; the solver trains the
model's own train net.  Errors name the directory's files, never the converted
ones.  A failure leaves the zoo as it was, but for a download that can resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pathlib
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass

import yaml

from netspec.atomic import write_bytes
from netspec.engine.registry import layer_schemas
from netspec.errors import ConfigError, NetspecError, Problem, shown
from netspec.interop.caffe_files import import_caffemodel_file, imported_yaml
from netspec.interop.caffe_import import ImportReport, import_net, import_solver
from netspec.interop.prototxt import parse_prototxt
from netspec.model_zoo.card import FILE_PATTERN, NAME_PATTERN, PART, CaffeOrigin, ModelCard, file_digest
from netspec.model_zoo.publish import CONFIGS, DEPLOY, WEIGHTS, PublishRequest, publish
from netspec.model_zoo.sources import (
    FolderSource,
    NotFoundError,
    check_room,
    fetch_file,
    http_url_problem,
    make_partial_folder,
    open_source,
    remove_partial,
    resumable,
    without_progress,
)
from netspec.model_zoo.zoo import Zoo, ZooError
from netspec.spec.net_spec import parse_net
from netspec.spec.yaml_lines import YamlMap, load_yaml

CAFFE_README = "readme.md"
# a directory's prototxts, and the netspec files they become, by card field
PROTOTXTS = {"net": "deploy.prototxt", "train_net": "train_val.prototxt", "solver": "solver.prototxt"}
CONVERTED = {"net": DEPLOY, **CONFIGS}
CAFFE_VERSION = "1"  # the version a Caffe model becomes
REQUIRED = ("caffemodel", "caffemodel_url", "sha1")
OPTIONAL = ("name", "license", "gist_id", "caffe_commit")
SHA1_PATTERN = re.compile(r"^[0-9a-fA-F]{40}\Z")
README_LIMIT = 64 << 10  # a readme's text goes into the card; Caffe's are a few kB
PROTOTXT_LIMIT = 16 << 20  # ResNet-152's deploy.prototxt, the longest of Caffe's zoo, has about 200 kB
MAX_TREE_FOLDERS = 1000  # model folders of a tree whose readmes zoo list reads; BVLC's tree has about 10
DISK_COPIES = 3  # a download needs room for the caffemodel, the weights converted from it and their copy installed


@dataclass
class CaffeImport:
    """What ``netspec zoo import-caffe`` was asked, beside the directory."""

    name: str | None = None  # default: the directory's name, lower-case
    weights: str | None = None  # the .caffemodel [default: the file beside the readme, else caffemodel_url]
    mean_value: list[float] | None = None  # B, G, R
    labels_file: str | None = None
    force: bool = False
    timeout: float = 30.0  # seconds without data before a download gives up


class CaffeDirectory:
    """A Caffe model directory: the folder ``folder`` of ``source`` (a FolderSource or HttpSource), or its root."""

    def __init__(self, source, folder: str = ""):
        self.source, self.folder = source, folder

    def relative(self, name: str) -> str:
        """The path of file ``name`` of the directory, relative to the source."""
        return f"{self.folder}/{name}" if self.folder else name

    def label(self, name: str = "") -> str:
        """Where file ``name`` (or the directory itself) is, for messages and the card."""
        return "/".join(part for part in (self.source.label.rstrip("/"), self.folder, name) if part)

    def read(self, name: str, limit: int) -> str:
        """The text of file ``name``; NotFoundError when the directory does not have it."""
        data = self.source.read(self.relative(name), limit)
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ZooError(f"{self.label(name)}: not a text file (byte {exc.start} is not UTF-8)") from None

    def local_folder(self) -> str | None:
        """The directory's path when it is a folder on this machine, else None."""
        if isinstance(self.source, FolderSource):
            return os.path.join(self.source.root, *self.folder.split("/")) if self.folder else self.source.root
        return None

    def url(self) -> str:
        """Where the directory is, for the card: its URL, or its absolute path as a ``file://`` URI."""
        local = self.local_folder()
        return pathlib.Path(os.path.abspath(local)).as_uri() if local is not None else self.label()

    def name(self) -> str:
        """The directory's own name (the last part of its path or URL)."""
        if self.folder:
            return self.folder
        local = self.local_folder()
        if local is not None:
            return os.path.basename(os.path.abspath(local))
        return urllib.parse.unquote(urllib.parse.urlparse(self.source.url).path.rstrip("/").rsplit("/", 1)[-1])


def open_directory(location: str, timeout: float) -> CaffeDirectory:
    """The Caffe model directory at a folder path or a ``file://`` or ``http(s)://`` URL."""
    return CaffeDirectory(open_source(location, timeout))


def parse_front_matter(text: str, where: str, local: bool) -> CaffeOrigin:
    """A Caffe model readme's front matter and text (``url`` left empty); ZooError naming ``where``:line for a
    readme that does not start with front matter, front matter that is not a mapping of plain values, a YAML tag, a
    missing key, a ``caffemodel`` that is a path, a ``caffemodel_url`` that is no http(s) URL netspec can fetch nor
    (only in a readme on this machine, ``local``) a ``file:`` URL, or a ``sha1`` that is not 40 hex digits.

    Each value is its text as written (YAML would read ``gist_id: 0123`` as the octal 83), its whitespace
    collapsed to single spaces: a value is one line of text.
    """
    lines = text.splitlines()
    top = next((index for index, line in enumerate(lines) if line.strip()), 0)
    closing = [index for index in range(top + 1, len(lines)) if lines[index].strip() == "---"]
    if not lines or lines[top].strip() != "---" or not closing:
        raise ZooError(f"{where}: no front matter: a Caffe model's readme starts with YAML between two '---' lines "
                       f"naming {', '.join(REQUIRED)}")
    bottom = closing[0]
    source = "\n" * (top + 1) + "\n".join(lines[top + 1:bottom])  # padded, so that lines are the readme's
    _refuse_tags(source, where)
    tree = load_yaml(source, where)  # syntax, netspec's limits, lines
    if not isinstance(tree, YamlMap):
        raise ZooError(f"{where}:{top + 2}: the front matter must be a mapping ({': ..., '.join(REQUIRED)}: ...), "
                       f"not {shown(tree)}")
    nodes = {key.value: value for key, value in yaml.compose(source, Loader=yaml.SafeLoader).value}
    values = {}
    for key in REQUIRED + OPTIONAL:
        node = nodes.get(key)
        if node is None or node.tag == "tag:yaml.org,2002:null":
            continue
        if not isinstance(node, yaml.ScalarNode):
            raise ZooError(f"{where}:{tree.line_of(key)}: {key} must be text, not {shown(tree[key])}")
        values[key] = " ".join(node.value.split())
    missing = [key for key in REQUIRED if not values.get(key)]
    if missing:
        raise ZooError(f"{where}:{top + 1}: the front matter lacks {', '.join(missing)} (a Caffe model's readme "
                       f"names {', '.join(REQUIRED)})")
    if not FILE_PATTERN.match(values["caffemodel"]):
        raise ZooError(f"{where}:{tree.line_of('caffemodel')}: caffemodel '{values['caffemodel']}' is not a plain "
                       "file name (no folders, no '..'): it names the weights file beside the readme")
    problem = _url_problem(values["caffemodel_url"], local)
    if problem:
        raise ZooError(f"{where}:{tree.line_of('caffemodel_url')}: caffemodel_url '{values['caffemodel_url']}' "
                       f"{problem}")
    if not SHA1_PATTERN.match(values["sha1"]):
        raise ZooError(f"{where}:{tree.line_of('sha1')}: sha1 '{values['sha1']}' is not 40 hex digits")
    values["sha1"] = values["sha1"].lower()
    readme = "\n".join(lines[:top] + lines[bottom + 1:]).strip()
    return CaffeOrigin(url="", readme=readme, **values)


def _url_problem(text: str, local: bool) -> str | None:
    """Why ``caffemodel_url`` ``text`` cannot be taken (in a readme on this machine when ``local``), or None."""
    try:
        scheme, host = urllib.parse.urlparse(text)[:2]
    except ValueError as exc:
        return f"is not a URL netspec can fetch: {exc}"
    if scheme in ("http", "https"):
        problem = http_url_problem(text)
        return f"is not a URL netspec can fetch: {problem}" if problem else None
    if scheme != "file":
        return "is not an http, https or file URL"
    if not local:
        return ("names a file on this machine, which only a readme on this machine may (this one was read over "
                "HTTP)")
    return None if host in ("", "localhost") else f"names a file on another machine ({host})"


def _refuse_tags(source: str, where: str) -> None:
    """ZooError at the first YAML tag (``!!python/object`` and the like): front matter is plain text."""
    try:
        for event in yaml.parse(source, Loader=yaml.SafeLoader):
            if getattr(event, "tag", None):
                raise ZooError(f"{where}:{event.start_mark.line + 1}: the front matter has a YAML tag ({event.tag}); "
                               "netspec reads front matter as plain text, never as objects")
    except yaml.YAMLError:
        return  # malformed: load_yaml says where


def read_front_matter(directory: CaffeDirectory) -> CaffeOrigin:
    """The front matter and text of the directory's readme.md (see :func:`parse_front_matter`)."""
    local = directory.local_folder() is not None
    origin = parse_front_matter(directory.read(CAFFE_README, README_LIMIT), directory.label(CAFFE_README), local)
    origin.url = directory.url()
    return origin


def _has_readme(source, folder: str) -> bool:
    """Whether folder ``folder`` of ``source`` holds a readme.md."""
    try:
        source.read(f"{folder}/{CAFFE_README}", README_LIMIT)
    except NotFoundError:
        return False
    return True


def model_folders(source) -> tuple[dict[str, str], int]:
    """The folders of the Caffe models tree ``source`` by model name (the folder's name in lower case; a folder
    named so exactly comes first, then the listing's order), and how many folders are left out: those whose names
    are no model names even in lower case, and the others of a name.  No folders when the source lists none."""
    try:
        folders = source.folders()
    except NotFoundError:
        return {}, 0
    named = {}
    for folder in sorted(folders, key=lambda folder: folder != folder.lower()):
        if NAME_PATTERN.match(folder.lower()):
            named.setdefault(folder.lower(), folder)
    return named, len(folders) - len(named)


def tree_folder(source, name: str) -> str | None:
    """The folder of the Caffe models tree ``source`` that holds model ``name``: ``name/`` itself, else the folder
    the tree lists under that name (``VGG_16/`` for ``vgg_16``); None when the tree has no such model."""
    if _has_readme(source, name):
        return name
    folder = model_folders(source)[0].get(name)
    return folder if folder is not None and _has_readme(source, folder) else None


def tree_index(source) -> tuple[dict, list[str]]:
    """The model directories of a Caffe models tree as a zoo index: version 1 of each, summarised by its readme's
    name, and notes on the folders it leaves out; ZooError when the source holds none."""
    named, skipped = model_folders(source)
    notes = []
    if skipped:
        notes.append(f"{skipped} folder(s) left out: their names, in lower case, are no model names (letters, "
                     f"digits, '.', '_', '-') or another folder's; netspec zoo import-caffe {source.label}/DIR "
                     "--name NAME imports one")
    names = sorted(named)
    if len(names) > MAX_TREE_FOLDERS:
        notes.append(f"only the first {MAX_TREE_FOLDERS:,} of {len(names):,} model folders were read")
        names = names[:MAX_TREE_FOLDERS]
    models = {}
    for name in names:
        try:
            summary = read_front_matter(CaffeDirectory(source, named[name])).name
        except NotFoundError:
            continue
        except NetspecError:
            summary = "(its readme cannot be imported: netspec zoo import-caffe says why)"
        models[name] = {"versions": [CAFFE_VERSION], "latest": CAFFE_VERSION, "summary": summary,
                        "task": "Caffe model"}
    if not models and not notes:
        raise ZooError(f"{source.label}: neither a netspec zoo (no index.json) nor a Caffe models tree (no "
                       f"<name>/{CAFFE_README})")
    return {"models": models}, notes


def import_caffe(directory: CaffeDirectory, zoo: Zoo, request: CaffeImport,
                 progress_factory=None) -> tuple[ModelCard, ImportReport]:
    """Import a Caffe model directory into ``zoo`` as one model; returns its card and a report: the prototxt fields
    that had no netspec equivalent (``file: field``), and a note when no mean was given.

    ``progress_factory(total)`` shows a download's progress (total None: the server does not say the size).
    """
    origin = read_front_matter(directory)
    name = request.name or directory.name().lower()
    if not request.name and not NAME_PATTERN.match(name):
        raise ZooError(f"{directory.label()}: '{directory.name()}' is no model name (lower-case letters, digits, '.', "
                       "'_', '-'); give one with --name")
    zoo.refuse_existing(name, CAFFE_VERSION, request.force)
    texts = {}
    for key, prototxt in PROTOTXTS.items():
        try:
            texts[key] = directory.read(prototxt, PROTOTXT_LIMIT)
        except NotFoundError:
            if key == "net":
                raise
    local = _local_caffemodel(directory, origin, request)
    weights_label = local or origin.caffemodel_url
    fetcher = None if local else open_source(origin.caffemodel_url, request.timeout)
    work = os.path.join(zoo.root, ".partial", f"caffe-{name}@{CAFFE_VERSION}")  # not a zoo download's folder
    make_partial_folder(work, zoo.root)
    with resumable(work, fetcher):
        caffemodel = local or os.path.join(work, f"{origin.sha1}.caffemodel")  # a partial file is of this SHA-1 only
        if not local and not os.path.isfile(caffemodel):
            _download(fetcher, caffemodel, zoo.root, f"{name}@{CAFFE_VERSION}", progress_factory or without_progress)
        _check_sha1(caffemodel, origin, weights_label)
        files = {key: os.path.join(work, CONVERTED[key]) for key in texts}
        weights = os.path.join(work, WEIGHTS)
        labels = {files[key]: directory.label(PROTOTXTS[key]) for key in files} | {
            weights: weights_label, caffemodel: weights_label}
        with _relabelled(labels):
            report = _convert(directory, texts, files)
            net, missing, _ = import_caffemodel_file(files["net"], caffemodel, weights, weights_label)
            if missing:
                raise ZooError(f"{weights_label}: holds no weights for layer(s) {', '.join(missing)} of "
                               f"{directory.label(PROTOTXTS['net'])}")
            card = publish(PublishRequest(
                name=name, version=CAFFE_VERSION, net=files["net"], weights=weights,
                labels_file=request.labels_file, license=origin.license or "unspecified", summary=origin.name,
                mean_value=request.mean_value, channel_order="BGR", force=request.force,
                train_net=files.get("train_net"), solver=files.get("solver"), caffe=origin), zoo)
    remove_partial(work)
    if request.mean_value is None:
        report.notes.append("no mean is subtracted from the input: Caffe models usually need the one their readme "
                            "names (--mean-value B,G,R)")
    return card, report


def _local_caffemodel(directory: CaffeDirectory, origin: CaffeOrigin, request: CaffeImport) -> str | None:
    """The caffemodel's path when it is on this machine: ``--weights``, or in a directory on this machine the file
    beside the readme or a ``file:`` caffemodel_url (relative to the directory); None when it has to be
    downloaded."""
    if request.weights:
        if not os.path.isfile(request.weights):
            raise ZooError(f"{request.weights}: not found")
        return request.weights
    folder = directory.local_folder()
    if folder is None:  # read over HTTP: read_front_matter took an http(s) caffemodel_url only
        return None
    if os.path.isfile(os.path.join(folder, origin.caffemodel)):
        return os.path.join(folder, origin.caffemodel)
    url = urllib.parse.urlparse(origin.caffemodel_url)
    if url.scheme != "file":
        return None
    path = os.path.join(folder, urllib.request.url2pathname(url.path))
    inside = os.path.realpath(folder)
    if os.path.commonpath([os.path.realpath(path), inside]) != inside:
        raise ZooError(f"the readme's caffemodel_url {origin.caffemodel_url} names a file outside the model directory "
                       f"{folder}; refused (give the file with --weights)")
    if not os.path.isfile(path):
        raise ZooError(f"{path}: not found (the readme's caffemodel_url {origin.caffemodel_url})")
    return path


def _download(source, target: str, zoo_root: str, ref: str, progress_factory) -> None:
    """Download the caffemodel to ``target``, continuing the partial file an attempt that stopped left; refused
    when the server's size says the zoo's disk has no room for it and the weights converted from it."""
    partial = target + PART
    with contextlib.ExitStack() as progress:
        def begin(total: int | None):
            if total is not None:
                kept = os.path.getsize(partial) if os.path.exists(partial) else 0
                check_room(DISK_COPIES * total - kept, zoo_root, ref)
            return progress.enter_context(progress_factory(total))

        fetch_file(source, "", target, None, begin)


def _check_sha1(path: str, origin: CaffeOrigin, where: str) -> None:
    """ZooError unless the file at ``path`` has the SHA-1 the readme gives."""
    sha1 = file_digest(path, hashlib.sha1())  # noqa: S324 - the digest Caffe's readmes publish; none other exists
    if sha1 != origin.sha1:
        raise ZooError(f"{where}: SHA-1 {sha1} does not match the {origin.sha1} of the readme; nothing was imported")


@contextlib.contextmanager
def _relabelled(labels: dict[str, str]):
    """Errors raised inside name the files of ``labels`` (the converted files, paths in the zoo's ``.partial``
    folder) by their labels (the directory's own files), without the lines of the converted files."""
    try:
        yield
    except NetspecError as exc:
        paths = "|".join(re.escape(path) for path in sorted(labels, key=len, reverse=True))
        pattern = re.compile(f"(?P<path>{paths})(?::[0-9]+)?")

        def relabel(text: str) -> str:
            return pattern.sub(lambda match: labels[match.group("path")], text)

        if isinstance(exc, ConfigError):
            raise ConfigError([Problem(relabel(str(problem))) for problem in exc.problems]) from None
        raise ZooError(relabel(str(exc))) from None


def _convert(directory: CaffeDirectory, texts: dict[str, str], files: dict[str, str]) -> ImportReport:
    """Convert the prototxts' ``texts`` (by card field) into netspec files at ``files`` (by card field); returns a
    report of the fields they dropped."""
    converted = ImportReport()
    for key, text in texts.items():
        label = directory.label(PROTOTXTS[key])
        message = parse_prototxt(text, label)
        try:
            data, report = (import_solver if key == "solver" else import_net)(message)
        except ConfigError as exc:  # the converter's problems name no file
            raise ConfigError([problem if problem.file else dataclasses.replace(problem, file=label)
                               for problem in exc.problems]) from None
        if key == "solver" and "train_net" in texts:  # the directory's solver trains its train_val.prototxt
            data = {"net": CONVERTED["train_net"]} | {k: v for k, v in data.items()
                                                      if k not in ("net", "train_net", "test_net")}
        write_bytes(files[key], imported_yaml(data, label, "zoo import-caffe").encode("utf-8"))
        if key == "train_net":
            parse_net(files[key], layer_schemas())  # the deploy net is checked as it is published
        converted.dropped += [f"{PROTOTXTS[key]}: {item}" for item in report.dropped]
    return converted
