"""``netspec convert imageset``: a folder of images (or Caffe's list file) as an LMDB or HDF5 dataset.

Sources come from a list file of ``relative/path label`` lines, or, without
one, from ROOT's subfolders: each is a class, labelled by the sorted order of
the names (or by ``--labels``).  Images are decoded and prepared in worker
processes (Pillow) and written in order by :class:`netspec.data.dataset.DatasetWriter`.
A file that is not a regular image file (a link loop, a device, a FIFO, a
decompression bomb) is skipped and named, or stops the conversion under
``--strict``; a failed write (a full disk) leaves no dataset behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import os
import re
from dataclasses import dataclass, field

import numpy
from PIL import Image

from netspec.atomic import atomic_open
from netspec.data.dataset import DatasetWriter
from netspec.data.files import read_text_lines, writing
from netspec.data.images import (
    IMAGE_EXTENSIONS,
    PIL_FORMATS,
    decode_image,
    read_image_file,
    read_list_file,
    resized,
)
from netspec.data.records import encode_record, pack_record
from netspec.data.staging import staged
from netspec.errors import DataError


@dataclass
class ImagesetOptions:
    """How images become records."""
    backend: str = "lmdb"
    resize: tuple[int, int] | None = None
    keep_aspect: bool = False  # with resize: scale as one, then crop about the centre
    gray: bool = False
    shuffle: bool = False
    seed: int = 0
    encoding: str = "raw"
    workers: int = 1
    val_fraction: float = 0.0
    strict: bool = False
    overwrite: bool = False
    allow_mixed_sizes: bool = False


@dataclass
class ConversionReport:
    """What a conversion wrote and skipped."""
    written: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    label_names: list[str] = field(default_factory=list)


def parse_size(text: str) -> tuple[int, int]:
    """An image size written ``HxW`` (``32x32``) as ``(H, W)``; ValueError when it is not one."""
    height, sep, width = text.strip().lower().partition("x")
    if not sep or not re.fullmatch("[0-9]+", height) or not re.fullmatch("[0-9]+", width) or int(height) < 1 or \
            int(width) < 1:
        raise ValueError(f"expected HxW such as 32x32, got '{text}'")
    return int(height), int(width)


def read_label_names(path: str) -> list[str]:
    """Class names, one a line (blank lines ignored); line k names label k."""
    names = [line.strip() for line in read_text_lines(path, "the label names") if line.strip()]
    if len(set(names)) != len(names):
        raise DataError(f"{path}: a label name appears twice")
    return names


def _list_folder(folder: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(folder))
    except OSError as exc:
        raise DataError(f"{folder}: cannot list the folder: {exc.strerror}") from None


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link loop: not a folder; as an image it is named when it cannot be read
        return False


def scan_class_folders(root: str, label_names: list[str] | None) -> tuple[list[tuple[str, int]], list[str]]:
    """``(path, label)`` for every image in ROOT's class subfolders, and the class names by label.

    Every entry named like an image that is not a folder is listed, so a broken link or a link loop is
    reported when it cannot be read instead of silently left out.
    """
    folders = sorted(e.name for e in _list_folder(root) if _is_folder(e) and not e.name.startswith("."))
    if not folders:
        raise DataError(f"{root}: no class subfolders (give a list file, or put each class's images in a folder)")
    names = label_names or folders
    unknown = [f for f in folders if f not in names]
    if unknown:
        raise DataError(f"{root}: class folder(s) {', '.join(unknown)} are not in the label names")
    items = []
    for folder in folders:
        files = sorted(e.name for e in _list_folder(os.path.join(root, folder))
                       if e.name.lower().endswith(IMAGE_EXTENSIONS) and not _is_folder(e))
        if not files:
            raise DataError(f"{os.path.join(root, folder)}: the class folder holds no images "
                            f"({', '.join(IMAGE_EXTENSIONS)})")
        items.extend((os.path.join(root, folder, name), names.index(folder)) for name in files)
    return items, names


def prepare(path: str, label: int, options: ImagesetOptions) -> tuple[numpy.ndarray | None, bytes | None, str]:
    """``(image, record, '')`` for one source image, or ``(None, None, why)`` when it cannot be read.

    Runs in worker processes.  An encoded record keeps the file's own bytes
    when they already are what was asked (same format and colour, no resize).
    """
    try:
        data = read_image_file(path)
        image = decode_image(data, path, channels=1 if options.gray else 3)
    except DataError as exc:
        return None, None, str(exc)
    if options.resize:
        image = resized(image, options.resize, options.keep_aspect)
    if options.backend != "lmdb":
        return image, None, ""
    if options.encoding != "raw" and not options.resize and keeps_bytes(data, options):
        return image, pack_record(image.shape, image.dtype, label, options.encoding, data), ""
    return image, encode_record(image, label, options.encoding), ""


def keeps_bytes(data: bytes, options: ImagesetOptions) -> bool:
    """True when the file already is a ``options.encoding`` image in the asked colour mode."""
    with Image.open(io.BytesIO(data)) as image:
        return image.format == PIL_FORMATS[options.encoding] and image.mode == ("L" if options.gray else "RGB")


def split_validation(items: list[tuple[str, int]], fraction: float, seed: int):
    """Stratified split: about ``fraction`` of each label's items (at least one when it has two) go to val."""
    rng = numpy.random.default_rng(seed)
    train, val = [], []
    for label in sorted({label for _, label in items}):
        mine = [item for item in items if item[1] == label]
        order = rng.permutation(len(mine))
        take = min(len(mine) - 1, max(1 if len(mine) > 1 else 0, round(fraction * len(mine))))
        val.extend(mine[i] for i in sorted(order[:take]))
        train.extend(mine[i] for i in sorted(order[take:]))
    return train, val


def source_hash(items: list[tuple[str, int]], root: str) -> str:
    """sha256 of the ``relative/path label`` lines in the order written."""
    text = "\n".join(f"{os.path.relpath(path, root)} {label}" for path, label in items)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextlib.contextmanager
def _no_progress(total: int):
    yield lambda: None


def write_dataset(items, out: str, options: ImagesetOptions, label_names: list[str], root: str, report,
                  advance, name: str | None = None) -> None:
    """Prepare ``items`` (in parallel) and write them, in order, as the dataset ``out`` (``name`` in messages and
    the report: where a staged part will be)."""
    name = name or out
    writer = DatasetWriter(out, options.backend, options.encoding, options.overwrite, name)
    written, first_shape = [], None
    try:
        with _pool(options.workers) as pool:
            results = pool.map(prepare, [p for p, _ in items], [label for _, label in items],
                               [options] * len(items), chunksize=32)
            for (path, label), (image, record, problem) in zip(items, results):
                if problem:
                    if options.strict:
                        raise DataError(f"{problem} (stopped: --strict)")
                    report.skipped.append(problem)
                else:
                    if not options.allow_mixed_sizes and written and image.shape != first_shape:
                        raise DataError(f"{path} is {_size(image.shape)} (HxW) but {written[0][0]} is "
                                        f"{_size(first_shape)}: resize them all with --resize HxW, or keep their "
                                        "sizes with --allow-mixed-sizes")
                    first_shape = first_shape or image.shape
                    writer.add(image, label, record)
                    written.append((path, label))
                advance()
        if not written:
            raise DataError(f"{name}: no image could be read, so nothing was written")
        settings = {"root": os.path.abspath(root), "resize": list(options.resize) if options.resize else None,
                    "keep_aspect": options.keep_aspect, "gray": options.gray, "shuffle": options.shuffle,
                    "seed": options.seed, "skipped": len(items) - len(written)}
        writer.finish(label_names, source_hash(written, root), settings)
    except BaseException:
        writer.abandon()
        raise
    report.written[name] = len(written)


def _size(shape: tuple[int, ...]) -> str:
    """An image's C x H x W shape as ``HxW``, as ``--resize`` takes sizes and ``predict`` writes them."""
    return f"{shape[1]}x{shape[2]}"


class _InlinePool:
    """The map of an executor, run in this process (one worker needs no pool)."""
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(function, *iterables, chunksize=1):
        return map(function, *iterables)


def _pool(workers: int):
    return _InlinePool() if workers <= 1 else concurrent.futures.ProcessPoolExecutor(workers)


def convert_imageset(root: str, out: str, list_file: str | None = None, labels_file: str | None = None,
                     options: ImagesetOptions | None = None, progress_factory=None) -> ConversionReport:
    """Convert ROOT's images into the dataset ``out`` (or ``out/train`` and ``out/val`` with a val fraction: a
    failure then removes ``out`` when the conversion made it).

    ``progress_factory(total)``, a context manager, yields a callable advanced once per image.
    """
    options = options or ImagesetOptions()
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder")
    names = read_label_names(labels_file) if labels_file else None
    if list_file:
        items = read_list_file(root, list_file)
        names = names or []
        if names and max(label for _, label in items) >= len(names):
            raise DataError(f"{labels_file}: names {len(names)} labels, but {list_file} uses label "
                            f"{max(label for _, label in items)}")
    else:
        items, names = scan_class_folders(root, names)
    parts = {"": items}  # each dataset's folder under OUT, and its items
    if options.val_fraction:
        train, val = split_validation(items, options.val_fraction, options.seed)
        parts = {"train": train, "val": val}
    for part in parts:
        final = os.path.join(out, part) if part else out
        if os.path.exists(final) and not options.overwrite:
            raise DataError(f"{final}: already exists; choose another output or pass --overwrite")
    if options.shuffle:
        rng = numpy.random.default_rng(options.seed)
        parts = {part: [chosen[i] for i in rng.permutation(len(chosen))] for part, chosen in parts.items()}
    report = ConversionReport(label_names=names)
    # with a validation set, OUT's parts and labels are made in OUT.partial and moved into OUT once all are complete:
    # a conversion killed halfway leaves no part that looks finished, only OUT.partial, which a rerun replaces
    if options.val_fraction and os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out}: exists and is no folder, so it cannot hold train/ and val/")
    with staged(out) if options.val_fraction else contextlib.nullcontext(out) as folder:
        with (progress_factory or _no_progress)(len(items)) as advance:
            for part, chosen in parts.items():
                write_dataset(chosen, os.path.join(folder, part) if part else folder, options, names, root, report,
                              advance, os.path.join(out, part) if part else out)
        if names:
            labels = os.path.join(folder, "labels.txt")
            with writing(labels), atomic_open(labels, "w") as handle:
                handle.write("".join(f"{name}\n" for name in names))
    return report
