"""Model cards: ``model.yaml``, what a published model is, and the README generated from it.

A model is a folder holding its card and the files the card lists (each with
size and sha256).  Names, versions and file names are restricted to plain
characters, so nothing a card says can point outside its folder, and a file
cannot take a name the zoo gives its own: the card, the README generated from
it, a download's ``.part`` file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Literal

import yaml

from netspec.errors import ConfigError, Problem, shown
from netspec.spec.schema import Context, doc, read_block, required
from netspec.spec.yaml_lines import YamlMap, load_yaml

MAX_INPUT_PIXELS = 89_478_485  # H x W of a model's input: Pillow's decompression-bomb limit, far past any net

CARD = "model.yaml"
README = "README.md"
PART = ".part"  # the ending of a file being downloaded
# \Z, not $: '$' also matches before a final newline, and 'x\n' is no name
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
VERSION_PATTERN = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,31}\Z")
FILE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}\Z")


@dataclass
class InputSpec:
    """What the deploy net takes, and how to prepare an image for it (as transform_param did in training)."""

    shape: list[int] = required(doc="one input as [C, H, W]")
    channels: Literal["RGB", "BGR", "GRAY"] = required(doc="channel order of the input (images are decoded RGB; "
                                                           "BGR swaps them, as for models trained in Caffe)")
    scale: float = doc(1.0, "multiply after subtracting the mean")
    mean_value: list[float] = doc([], "per-channel mean to subtract")
    mean_file: str | None = doc(None, "file of the model holding a per-pixel mean (.npy, C x H x W)")
    label_names: list[str] = doc([], "the name of each output class, by index")
    resize: list[int] | None = doc(None, "[H, W] of the images its TEST phase read (the dataset's records, as "
                                         "netspec convert --resize made them): inputs are resized to it first; "
                                         "none (older cards): inputs are resized straight to the shape's H x W")
    keep_aspect: bool = doc(False, "with resize: scale the short side to fit and crop about the centre (netspec "
                                   "convert --keep-aspect) instead of stretching")
    crop_size: int = doc(0, "with resize: the TEST phase's transform_param.crop_size, the centre square taken from "
                            "the resized image (0: none)")


@dataclass
class ModelFile:
    """One file of a model, as published."""

    path: str = required(doc="file name inside the model folder")
    size: int = required(doc="bytes")
    sha256: str = required(doc="hex digest")


@dataclass
class CaffeOrigin:
    """The Caffe Model Zoo directory a model was imported from: its readme's front matter, and the readme's text."""

    url: str = required(doc="the model directory (folder or URL) it was imported from")
    caffemodel: str = required(doc="the weights file the readme names")
    caffemodel_url: str = required(doc="where the readme says the weights are")
    sha1: str = required(doc="SHA-1 of the weights, as the readme gives it (checked before the import)")
    name: str = doc("", "the model's name in the readme")
    license: str = doc("", "the licence the readme names")
    caffe_commit: str | None = doc(None, "the Caffe commit the model was made with")
    gist_id: str | None = doc(None, "the GitHub gist that published it")
    readme: str = doc("", "the readme's text, front matter left out")


@dataclass
class ImportOrigin:
    """The file of another framework the weights were converted from (``netspec import onnx``)."""

    format: str = required(doc="the file's format (onnx)")
    file: str = required(doc="its name")
    sha256: str = required(doc="its SHA-256")
    producer: str = doc("", "the program that wrote it, and its version")
    opset: int | None = doc(None, "its ONNX opset")


@dataclass
class Provenance:
    """Where a model came from."""

    netspec_version: str = doc("", "the netspec that published it")
    config_hash: str = doc("", "hash of the net that trained the weights")
    dataset_sha256: str | None = doc(None, "sha256 of the training data's manifest (or list file)")
    iterations: int | None = doc(None, "training iterations of the weights")
    date: str = doc("", "publication date, ISO 8601")
    caffe: CaffeOrigin | None = doc(None, "for a model imported from Caffe's Model Zoo: where it came from")
    imported: ImportOrigin | None = doc(None, "for weights converted from another framework's file: which")


@dataclass
class ModelCard:
    """Everything known about a published model."""

    name: str = required(doc="lower-case name: letters, digits, '.', '_', '-'")
    version: str = required(doc="version, e.g. 1 or 1.2.0")
    input: InputSpec = required(doc="what the deploy net takes")
    summary: str = doc("", "one line for people")
    license: str = doc("unspecified", "licence of the weights")
    authors: list[str] = doc([], "who made it")
    task: str = doc("image-classification", "what the model does")
    deploy_net: str = doc("deploy.yaml", "the net for inference (a file of the model)")
    weights: str | None = doc("weights.h5", "trained weights (a file of the model; none for a config-only card)")
    train_net: str | None = doc(None, "the net it was trained with (a file of the model)")
    solver: str | None = doc(None, "the solver it was trained with (a file of the model)")
    metrics: dict[str, float] = doc({}, "results of the last test pass of training")
    per_class: dict[str, list[float | None]] = doc(
        {}, "each class's accuracy in that test pass (its hits over its records; null: the pass held none of it), "
            "by class index (as input.label_names), under the name of the Accuracy top that gave it")
    provenance: Provenance = field(default_factory=Provenance)
    files: list[ModelFile] = doc([], "every file of the model except the card, with size and sha256")

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    def referenced_files(self) -> list[str]:
        """The files the card points to (all must be in ``files``)."""
        names = [self.deploy_net, self.weights, self.train_net, self.solver, self.input.mean_file]
        return [n for n in names if n]


def per_class_figures(value) -> dict[str, list[float | None]]:
    """The per-class accuracies in ``value``, the ``per_class`` of a metrics.jsonl test event (written by another
    program, perhaps): each top's list, a finite number kept, anything else in it None; a top of no list left out."""
    if not isinstance(value, dict):
        return {}
    return {str(top): [finite_number(number) for number in figures] for top, figures in value.items()
            if isinstance(figures, list)}


def finite_number(value) -> float | None:
    """``value`` as a float when it is a finite number (of JSON written by another program, perhaps), else None
    (text, NaN, an infinity, an integer past any float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # (an integer past any float)
        return None
    return number if math.isfinite(number) else None


def file_digest(path: str, digest) -> str:
    """The hex digest of a file's bytes, fed to ``digest`` (a new hashlib object)."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes."""
    return file_digest(path, hashlib.sha256())


def check_name(name: str, what: str = "model name") -> str:
    """``name`` if it is a safe model name; ConfigError otherwise."""
    if not NAME_PATTERN.match(name or ""):
        raise ConfigError(f"invalid {what} '{name}': use 1-64 lower-case letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return name


def check_version(version: str) -> str:
    """``version`` if it is a safe version string; ConfigError otherwise."""
    if not VERSION_PATTERN.match(version or ""):
        raise ConfigError(f"invalid version '{version}': use 1-32 letters, digits, '.', '+', '_' or '-', "
                          "starting with a letter or digit")
    return version


def input_shape_problem(shape: list[int]) -> str | None:
    """What is wrong with a model's input shape, or None: it must be [C, H, W] with 1 or 3 channels."""
    if (len(shape) != 3 or shape[0] not in (1, 3) or any(d <= 0 for d in shape)
            or shape[1] * shape[2] > MAX_INPUT_PIXELS):
        return (f"must be [C, H, W] with 1 or 3 channels and at most {MAX_INPUT_PIXELS:,} pixels, got "
                f"{shown(shape)}")
    return None


def resize_problem(spec: InputSpec) -> tuple[str, str] | None:
    """``(key, what is wrong)`` when resize, keep_aspect and crop_size do not make an input of the shape, or None."""
    size, crop = spec.resize, spec.crop_size
    if size is None:
        for key in ("crop_size", "keep_aspect"):
            if getattr(spec, key):
                return key, "needs resize (the size of the images it is cropped from)"
        return None
    if len(size) != 2 or any(d <= 0 for d in size) or size[0] * size[1] > MAX_INPUT_PIXELS:
        return "resize", f"must be [H, W] of positive sizes, got {shown(size)}"
    shape = "x".join(map(str, spec.shape[1:]))
    if not crop:
        return None if size == spec.shape[1:] else ("resize", f"{shown(size)} is not the input's {shape}: give the "
                                                              "crop_size that made it")
    if crop < 0 or crop > min(size):
        return "crop_size", f"a centre crop of {crop} does not fit in images of {size[0]}x{size[1]}"
    if spec.shape[1:] != [crop, crop]:
        return "crop_size", f"a centre crop of {crop} makes {crop}x{crop} images, the input is {shape}"
    return None


def parse_card(text: str, where: str) -> ModelCard:
    """A card from YAML text (safe loading), validated; ConfigError with ``where``:line otherwise."""
    tree = load_yaml(text, where)
    ctx = Context(where, ".")
    if not isinstance(tree, YamlMap):
        raise ConfigError(Problem("a model card must be a mapping (name, version, input, files, ...)", file=where,
                                  line=1))
    card = read_block(ModelCard, tree, ctx, "", 1)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    problems = []

    def bad(key: str, message: str) -> None:
        problems.append(Problem(message, file=where, line=tree.line_of(key.split(".")[0]), key=key))

    if not NAME_PATTERN.match(card.name):
        bad("name", f"'{card.name}' is not a valid model name (lower-case letters, digits, '.', '_', '-')")
    if not VERSION_PATTERN.match(card.version):
        bad("version", f"'{card.version}' is not a valid version (letters, digits, '.', '+', '_', '-')")
    listed = [f.path for f in card.files]
    for entry in card.files:
        if not FILE_PATTERN.match(entry.path):
            bad("files", f"'{entry.path}' is not a plain file name inside the model folder")
        elif entry.path in (CARD, README) or entry.path.endswith(PART):
            bad("files", f"'{entry.path}' is a name the zoo gives its own files ({CARD}, {README}, *{PART}); "
                         "rename the model's file")
        if entry.size < 0 or not SHA256_PATTERN.match(entry.sha256):
            bad("files", f"'{entry.path}' needs a size >= 0 and a 64-digit hex sha256")
    if len(set(listed)) != len(listed):
        bad("files", "a file is listed twice")
    for name in card.referenced_files():
        if name not in listed:
            bad("files", f"'{name}' is named by the card but not listed in files")
    shape_problem = input_shape_problem(card.input.shape)
    input_problem = ("shape", shape_problem) if shape_problem else resize_problem(card.input)
    if input_problem:
        bad(f"input.{input_problem[0]}", input_problem[1])
    if problems:
        raise ConfigError(problems)
    return card


def read_card(folder: str) -> ModelCard:
    """The card of the model folder ``folder``."""
    path = os.path.join(folder, CARD)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(Problem(f"cannot read the model card: {exc.strerror}", file=path)) from None
    return parse_card(text, path)


def card_yaml(card: ModelCard) -> str:
    """The card as YAML text, fields in their documented order."""
    return yaml.safe_dump(dataclasses.asdict(card), sort_keys=False, allow_unicode=True)


def readme(card: ModelCard) -> str:
    """A README.md for people, generated from the card."""
    lines = [f"# {card.name} {card.version}", "", card.summary or "(no summary)", "",
             f"- task: {card.task}", f"- license: {card.license}"]
    if card.authors:
        lines.append(f"- authors: {', '.join(card.authors)}")
    shape = "x".join(map(str, card.input.shape))
    lines += [f"- input: {shape} ({card.input.channels}), scale {card.input.scale:g}"
              + (f", mean {card.input.mean_value}" if card.input.mean_value else "")
              + (f", mean file {card.input.mean_file}" if card.input.mean_file else "")
              + (f", from images resized to {'x'.join(map(str, card.input.resize))}" if card.input.resize else "")
              + (" keeping their aspect" if card.input.keep_aspect else "")
              + (f", centre crop {card.input.crop_size}" if card.input.crop_size else "")]
    if card.input.label_names:
        lines.append(f"- classes ({len(card.input.label_names)}): {', '.join(card.input.label_names)}")
    if card.metrics:
        lines += ["", "## Metrics", ""] + [f"- {name}: {value:.4g}" for name, value in card.metrics.items()]
    p = card.provenance
    lines += ["", "## Provenance", "", f"- published {p.date} with netspec {p.netspec_version}"]
    if p.iterations is not None:
        lines.append(f"- trained for {p.iterations} iterations (net config {p.config_hash[:12]})")
    if p.dataset_sha256:
        lines.append(f"- training data sha256 {p.dataset_sha256[:16]}...")
    if p.caffe:
        lines += _caffe_lines(card, p.caffe)
    if p.imported:
        i = p.imported
        lines.append(f"- converted from {i.format.upper()}: {i.file}, SHA-256 {i.sha256[:16]}..."
                     + (f", written by {i.producer}" if i.producer else "") + (f", opset {i.opset}" if i.opset else ""))
        if card.train_net:
            lines.append(f"- {card.train_net} and {card.solver} are made from the deploy net for fine-tuning "
                         f"(netspec zoo finetune {card.name} DATASET --out RUN)")
    lines += ["", "## Use", "", "```bash", f"netspec zoo download {card.ref}",
              f"netspec predict {card.name} image.png", "```", "", "## Files", "",
              "| file | bytes | sha256 |", "|---|---|---|"]
    lines += [f"| {f.path} | {f.size} | {f.sha256} |" for f in card.files]
    if p.caffe:
        lines += ["", "## Caffe readme", "", p.caffe.readme or "(no text beside the front matter)"]
    return "\n".join(lines) + "\n"


def _caffe_lines(card: ModelCard, caffe: CaffeOrigin) -> list[str]:
    """The README's provenance lines of a model imported from Caffe's Model Zoo."""
    lines = [f"- imported from Caffe's Model Zoo: {caffe.url}",
             f"- weights {caffe.caffemodel_url}, SHA-1 {caffe.sha1} (checked)"]
    if caffe.caffe_commit:
        lines.append(f"- made with Caffe at commit {caffe.caffe_commit}")
    if caffe.gist_id:
        lines.append(f"- published in gist {caffe.gist_id}")
    if not card.input.mean_value and not card.input.mean_file:
        lines.append("- no mean is subtracted from the input: Caffe models usually need the one their readme names "
                     "(netspec zoo import-caffe --mean-value B,G,R sets it)")
    if card.train_net or card.solver:
        lines.append("- the train net and solver keep Caffe's paths (data, mean file, snapshots), which Caffe reads "
                     "from the root of its checkout")
    return lines
