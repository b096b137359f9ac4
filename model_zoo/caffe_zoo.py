"""Caffe's Model Zoo as a source of models: ``netspec zoo import-caffe``, and Caffe models trees for ``zoo download``
and ``zoo list``.

A Caffe model directory holds ``readme.md``, whose YAML front matter (between
two ``---`` lines) names ``caffemodel``, ``caffemodel_url`` and ``sha1`` (and
``name``, ``license``, ``gist_id``, ``caffe_commit``), beside
``deploy.prototxt`` and often ``train_val.prototxt`` and ``solver.prototxt``.
A models tree is a folder or URL holding such directories as
``<name>/readme.md``, as Caffe's ``models/`` does; over HTTP its folders are
found in the server's directory listing.

Importing a directory reads the front matter as plain data (the bounded safe
loader, and no YAML tags at all), takes the caffemodel from ``--weights``,
from beside the readme, or from ``caffemodel_url`` (http, https or file; an
HTTP download shows its progress and resumes, as ``zoo download`` does), and
checks its SHA-1 before anything else.  The prototxts and weights are then
converted with netspec's Caffe importers in the zoo's ``.partial`` folder and
published as version 1 of one model: BGR input as in Caffe, no mean unless one
is given, and the front matter and readme text in ``provenance.caffe``.  The
train net and solver keep Caffe's paths, read from the root of a Caffe
checkout; the solver trains the model's own train net.  A failure leaves the
zoo as it was, but for a download that can resume.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass

import yaml

from netspec.engine.registry import layer_schemas
from netspec.errors import NetspecError, shown
from netspec.interop.caffe_files import import_caffemodel_file, imported_yaml
from netspec.interop.caffe_import import ImportReport, import_net, import_solver
from netspec.interop.prototxt import parse_prototxt
from netspec.model_zoo.card import FILE_PATTERN, NAME_PATTERN, PART, CaffeOrigin, ModelCard, file_digest
from netspec.model_zoo.publish import CONFIGS, DEPLOY, WEIGHTS, PublishRequest, deploy_input, publish
from netspec.model_zoo.sources import (
    FolderSource,
    NotFoundError,
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
CAFFEMODEL = "weights.caffemodel"  # a downloaded caffemodel's name beside the converted files
REQUIRED = ("caffemodel", "caffemodel_url", "sha1")
OPTIONAL = ("name", "license", "gist_id", "caffe_commit")
URL_SCHEMES = ("http", "https", "file")
SHA1_PATTERN = re.compile(r"^[0-9a-fA-F]{40}$")
README_LIMIT = 64 << 10  # a readme's text goes into the card; Caffe's are a few kB
PROTOTXT_LIMIT = 16 << 20  # ResNet-152's deploy.prototxt, the longest of Caffe's zoo, has about 200 kB


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


def parse_front_matter(text: str, where: str) -> CaffeOrigin:
    """A Caffe model readme's front matter and text (``url`` left empty); ZooError naming ``where``:line for a
    readme that has none, front matter that is not a mapping of plain values, a YAML tag, a missing key, a
    ``caffemodel`` that is a path, a ``caffemodel_url`` that is not http, https or file, or a ``sha1`` that is not
    40 hex digits."""
    lines = text.splitlines()
    marks = [index for index, line in enumerate(lines) if line.strip() == "---"][:2]
    if len(marks) < 2:
        raise ZooError(f"{where}: no front matter: a Caffe model's readme starts with YAML between two '---' lines "
                       f"naming {', '.join(REQUIRED)}")
    top, bottom = marks
    source = "\n" * (top + 1) + "\n".join(lines[top + 1:bottom])  # padded, so that lines are the readme's
    _refuse_tags(source, where)
    tree = load_yaml(source, where)
    if not isinstance(tree, YamlMap):
        raise ZooError(f"{where}:{top + 2}: the front matter must be a mapping ({': ..., '.join(REQUIRED)}: ...), "
                       f"not {shown(tree)}")
    missing = [key for key in REQUIRED if tree.get(key) in (None, "")]
    if missing:
        raise ZooError(f"{where}:{top + 1}: the front matter lacks {', '.join(missing)} (a Caffe model's readme "
                       f"names {', '.join(REQUIRED)})")
    values = {}
    for key in REQUIRED + OPTIONAL:
        value = tree.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ZooError(f"{where}:{tree.line_of(key)}: {key} must be text, not {shown(value)}")
        values[key] = str(value).strip()
    if not FILE_PATTERN.match(values["caffemodel"]):
        raise ZooError(f"{where}:{tree.line_of('caffemodel')}: caffemodel '{values['caffemodel']}' is not a plain "
                       "file name (no folders, no '..'): it names the weights file beside the readme")
    url = urllib.parse.urlparse(values["caffemodel_url"])
    if url.scheme not in URL_SCHEMES or not (url.netloc or url.path):
        raise ZooError(f"{where}:{tree.line_of('caffemodel_url')}: caffemodel_url '{values['caffemodel_url']}' is "
                       "not an http, https or file URL")
    if not SHA1_PATTERN.match(values["sha1"]):
        raise ZooError(f"{where}:{tree.line_of('sha1')}: sha1 '{values['sha1']}' is not 40 hex digits")
    values["sha1"] = values["sha1"].lower()
    readme = "\n".join(lines[:top] + lines[bottom + 1:]).strip()
    return CaffeOrigin(url="", readme=readme, **values)


def _refuse_tags(source: str, where: str) -> None:
    """ZooError at the first YAML tag (``!!python/object`` and the like): front matter is plain text and numbers."""
    try:
        for event in yaml.parse(source, Loader=yaml.SafeLoader):
            if getattr(event, "tag", None):
                raise ZooError(f"{where}:{event.start_mark.line + 1}: the front matter has a YAML tag ({event.tag}); "
                               "netspec reads front matter as plain text and numbers, never as objects")
    except yaml.YAMLError:
        return  # malformed: load_yaml says where


def read_front_matter(directory: CaffeDirectory) -> CaffeOrigin:
    """The front matter and text of the directory's readme.md (see :func:`parse_front_matter`)."""
    origin = parse_front_matter(directory.read(CAFFE_README, README_LIMIT), directory.label(CAFFE_README))
    origin.url = directory.label()
    return origin


def has_model(source, name: str) -> bool:
    """Whether the Caffe models tree ``source`` has the model directory ``name`` (``name/readme.md``)."""
    try:
        source.read(f"{name}/{CAFFE_README}", README_LIMIT)
    except NotFoundError:
        return False
    return True


def tree_index(source) -> dict:
    """The model directories of a Caffe models tree as a zoo index: version 1 of each, summarised by its readme's
    name; ZooError when the source holds none."""
    try:
        folders = source.folders()
    except NotFoundError:
        folders = []
    models = {}
    for folder in folders:
        try:
            summary = read_front_matter(CaffeDirectory(source, folder)).name
        except NotFoundError:
            continue
        except NetspecError:
            summary = "(its readme cannot be imported: netspec zoo import-caffe says why)"
        models[folder] = {"versions": [CAFFE_VERSION], "latest": CAFFE_VERSION, "summary": summary,
                          "task": "Caffe model"}
    if not models:
        raise ZooError(f"{source.label}: neither a netspec zoo (no index.json) nor a Caffe models tree (no "
                       f"<name>/{CAFFE_README})")
    return {"models": models}


def import_caffe(directory: CaffeDirectory, zoo: Zoo, request: CaffeImport,
                 progress_factory=None) -> tuple[ModelCard, ImportReport]:
    """Import a Caffe model directory into ``zoo`` as one model; returns its card and a report: the prototxt fields
    that had no netspec equivalent (``file: field``), and a note when no mean was given.

    ``progress_factory(total)`` shows a download's progress (total None: the size is not known beforehand).
    """
    origin = read_front_matter(directory)
    name = request.name or directory.name().lower()
    if not request.name and not NAME_PATTERN.match(name):
        raise ZooError(f"{directory.label()}: '{directory.name()}' is no model name (lower-case letters, digits, '.', "
                       "'_', '-'); give one with --name")
    if not request.force and os.path.exists(zoo.folder(name, CAFFE_VERSION)):
        raise ZooError(f"{name}@{CAFFE_VERSION} is already in the zoo {zoo.root}; pass --force to replace it")
    texts = {}
    for key, prototxt in PROTOTXTS.items():
        try:
            texts[key] = directory.read(prototxt, PROTOTXT_LIMIT)
        except NotFoundError:
            if key == "net":
                raise
    local = _local_caffemodel(directory, origin, request)
    fetcher = None if local else open_source(origin.caffemodel_url, request.timeout)
    work = os.path.join(zoo.root, ".partial", f"{name}@{CAFFE_VERSION}")
    make_partial_folder(work, zoo.root)
    with resumable(work, fetcher):
        caffemodel = local or _download(fetcher, work, progress_factory or without_progress)
        _check_sha1(caffemodel, origin, local or origin.caffemodel_url)
        files, report = _convert(directory, texts, work)
        weights = os.path.join(work, WEIGHTS)
        net, missing, _ = import_caffemodel_file(files["net"], caffemodel, weights, local or origin.caffemodel_url)
        if missing:
            raise ZooError(f"{local or origin.caffemodel_url}: holds no weights for layer(s) {', '.join(missing)} of "
                           f"{directory.label(PROTOTXTS['net'])}")
        channels = "BGR" if deploy_input(net)[1][0] == 3 else "GRAY"
        card = publish(PublishRequest(
            name=name, version=CAFFE_VERSION, net=files["net"], weights=weights,
            labels_file=request.labels_file, license=origin.license or "unspecified", summary=origin.name,
            mean_value=request.mean_value, channels=channels, force=request.force, train_net=files.get("train_net"),
            solver=files.get("solver"), caffe=origin), zoo)
    remove_partial(work)
    if request.mean_value is None:
        report.notes.append("no mean is subtracted from the input: Caffe models usually need the one their readme "
                            "names (--mean-value B,G,R)")
    return card, report


def _local_caffemodel(directory: CaffeDirectory, origin: CaffeOrigin, request: CaffeImport) -> str | None:
    """The caffemodel's path when it is on this machine: ``--weights``, the file beside the readme, or a ``file://``
    caffemodel_url; None when it has to be downloaded."""
    if request.weights:
        if not os.path.isfile(request.weights):
            raise ZooError(f"{request.weights}: not found")
        return request.weights
    folder = directory.local_folder()
    if folder is not None and os.path.isfile(os.path.join(folder, origin.caffemodel)):
        return os.path.join(folder, origin.caffemodel)
    url = urllib.parse.urlparse(origin.caffemodel_url)
    if url.scheme == "file":
        path = urllib.request.url2pathname(url.path)
        if not os.path.isfile(path):
            raise ZooError(f"{origin.caffemodel_url}: not found")
        return path
    return None


def _download(source, work: str, progress_factory) -> str:
    """The caffemodel downloaded into ``work`` (continuing a partial file; kept there by an attempt that stopped
    after it)."""
    target = os.path.join(work, CAFFEMODEL)
    if not os.path.isfile(target):
        partial = target + PART
        with progress_factory(None) as advance:
            if os.path.exists(partial):
                advance(os.path.getsize(partial))
            source.fetch("", partial, None, advance)
        os.replace(partial, target)
    return target


def _check_sha1(path: str, origin: CaffeOrigin, where: str) -> None:
    """ZooError unless the file at ``path`` has the SHA-1 the readme gives."""
    sha1 = file_digest(path, hashlib.sha1())  # noqa: S324 - the digest Caffe's readmes publish; none other exists
    if sha1 != origin.sha1:
        raise ZooError(f"{where}: SHA-1 {sha1} does not match the {origin.sha1} of the readme; nothing was imported")


def _convert(directory: CaffeDirectory, texts: dict[str, str], work: str) -> tuple[dict[str, str], ImportReport]:
    """The prototxts' ``texts`` (by card field) as netspec files in ``work``; returns their paths by card field, and
    a report of the fields they dropped."""
    files, converted = {}, ImportReport()
    for key, text in texts.items():
        message = parse_prototxt(text, directory.label(PROTOTXTS[key]))
        if key == "solver":
            data, report = import_solver(message)
            if "train_net" in texts:  # the directory's solver trains its train_val.prototxt
                data = {"net": CONVERTED["train_net"]} | {k: v for k, v in data.items()
                                                          if k not in ("net", "train_net", "test_net")}
        else:
            data, report = import_net(message)
        files[key] = os.path.join(work, CONVERTED[key])
        with open(files[key], "w", encoding="utf-8") as handle:
            handle.write(imported_yaml(data, directory.label(PROTOTXTS[key]), "zoo import-caffe"))
        if key == "train_net":
            parse_net(files[key], layer_schemas())  # the deploy net is checked as it is published
        converted.dropped += [f"{PROTOTXTS[key]}: {item}" for item in report.dropped]
    return files, converted
