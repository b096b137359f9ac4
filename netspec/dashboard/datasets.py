"""The Datasets pages' work: the dataset folders and image folders of a workspace, what a dataset holds, its
records as PNG images, and image folders converted into datasets in the background with their progress.

A conversion is ``netspec convert imageset`` (class subfolders, one label each) run in a thread of the
dashboard, its images decoded one at a time; it writes the dataset atomically, so a conversion that fails
or is cut short (the dashboard stopped) leaves no dataset behind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from dataclasses import dataclass, field

import numpy

from netspec.dashboard.forms import checked, choice, fraction, whole_number
from netspec.dashboard.workspace import RefusedPathError, Workspace
from netspec.data.dataset import BACKENDS, MANIFEST, Dataset, read_manifest
from netspec.data.images import IMAGE_EXTENSIONS, encode_image
from netspec.data.staging import PARTIAL
from netspec.errors import DataError, NetspecError
from netspec.tools.dataset_info import spread
from netspec.tools.imageset import ImagesetOptions, convert_imageset, parse_size, scan_class_folders

SAMPLES = 48  # records shown in a dataset's grid
ENCODINGS = ("raw", "png", "jpg")
SHOWN_SKIPS = 20  # images that could not be read, named on the page (the rest counted)


def dataset_folders(workspace: Workspace) -> list[str]:
    """The dataset folders (with a ``manifest.json``) under the workspace, relative to it, sorted."""
    return folders_for_datasets(workspace)[0]


def folders_for_datasets(workspace: Workspace) -> tuple[list[str], list[str]]:
    """In one walk of the workspace: its dataset folders (:func:`dataset_folders`), and the folders whose
    subfolders hold images, what a conversion can take as its source; each relative to it, sorted.  What a
    conversion is still writing (in a ``.partial`` folder, renamed into place when complete) is neither: names
    ending in ``.partial`` are the conversions'."""
    datasets, sources = set(), set()
    for folder, entries, is_run in workspace.folders():
        if is_run or any(part.endswith(PARTIAL) for part in workspace.relative(folder).split("/")):
            continue
        if any(entry.name == MANIFEST for entry in entries):
            datasets.add(workspace.relative(folder))
        if folder != workspace.root and any(entry.name.lower().endswith(IMAGE_EXTENSIONS) for entry in entries):
            sources.add(workspace.relative(os.path.dirname(folder)))
    return sorted(datasets), sorted(sources)


def training_sets(datasets: list[str]) -> list[str]:
    """What a fine-tuning can read, of the dataset folders ``datasets``: each of them, and each folder holding a
    ``train`` and a ``val`` one (as a conversion with a validation fraction makes), sorted."""
    held = set(datasets)
    pairs = {path.rpartition("/")[0] or "." for path in datasets
             if path.rpartition("/")[2] == "train" and (path[:-len("train")] + "val") in held}
    return sorted(held | pairs)


def summary(folder: str) -> dict:
    """A dataset's row: backend, records, record shapes, classes; ``problem`` when its manifest is unreadable."""
    try:
        manifest = read_manifest(folder)
    except DataError as exc:
        return {"problem": str(exc)}
    return {"backend": manifest["backend"], "count": manifest["count"], "shapes": manifest["shapes"],
            "classes": len(manifest["label_counts"]), "encoding": manifest["encoding"]}


def histogram(dataset: Dataset) -> list[dict]:
    """``{"label", "name", "count"}`` for each label of the dataset, by label, from its manifest."""
    counts = {int(label): count for label, count in dataset.manifest["label_counts"].items()}
    return [{"label": label, "name": label_name(dataset, label), "count": count}
            for label, count in sorted(counts.items())]


def label_name(dataset: Dataset, label: int) -> str:
    """The class name of ``label`` (the number itself when the dataset names none)."""
    names = dataset.label_names
    return names[label] if 0 <= label < len(names) else str(label)


def samples(dataset: Dataset) -> list[dict]:
    """``{"index", "label", "name"}`` of up to SAMPLES records, evenly spaced through the dataset."""
    return [{"index": index, "label": label, "name": label_name(dataset, label)}
            for index in spread(dataset, SAMPLES) for label in [dataset.label(index)]]


def record_png(dataset: Dataset, index: int) -> bytes:
    """Record ``index`` as a PNG image: pixel values as they are (uint8), others stretched to 0-255;
    grey for one channel, RGB for three, the first channel of any other count."""
    if not 0 <= index < dataset.count:
        raise RefusedPathError(f"no record {index}: the dataset holds {dataset.count}", 404)
    image, _ = dataset.record(index)
    if image.shape[0] not in (1, 3):
        image = image[:1]
    if image.dtype != numpy.uint8:
        image = image.astype(numpy.float64)
        low, high = numpy.nanmin(image), numpy.nanmax(image)
        image = numpy.nan_to_num((image - low) * (255 / (high - low) if high > low else 0)).round().astype(numpy.uint8)
    return encode_image(image, "png")


@dataclass
class ConversionRequest:
    """What the New dataset form asks: the image folder, the dataset folder to make, the imageset options."""

    source: str
    out: str
    options: ImagesetOptions

    @classmethod
    def from_form(cls, form: dict[str, str]) -> ConversionRequest:
        """The conversion a submitted form asks for; NetspecError naming a field that is not understood."""
        source, out = form.get("source", "").strip(), form.get("out", "").strip()
        if not source or not out:
            raise NetspecError("give the image folder and the dataset folder to make")
        backend = choice(form, "backend", BACKENDS, "lmdb")
        encoding = choice(form, "encoding", ENCODINGS, "raw")
        if encoding != "raw" and backend != "lmdb":
            raise NetspecError("encoding: PNG and JPEG records are for LMDB datasets; HDF5 ones hold raw pixels")
        resize = form.get("resize", "").strip()
        try:
            size = parse_size(resize) if resize else None
        except ValueError as exc:
            raise NetspecError(f"resize: {exc}") from None
        options = ImagesetOptions(backend=backend, resize=size, gray=checked(form, "gray"),
                                  shuffle=checked(form, "shuffle"), seed=whole_number(form, "seed", least=0) or 0,
                                  encoding=encoding, val_fraction=fraction(form, "val_fraction"),
                                  strict=checked(form, "strict"))
        return cls(source, out, options)


@dataclass
class Conversion:
    """A conversion started from the page, as the page shows it."""

    number: int
    source: str
    out: str
    state: str = "running"  # then finished or failed
    total: int = 0
    done: int = 0
    message: str = ""
    skipped: list[str] = field(default_factory=list)

    def view(self) -> dict:
        """The conversion as JSON for the page: its progress, and the images skipped (the first SHOWN_SKIPS)."""
        return {"number": self.number, "source": self.source, "out": self.out, "state": self.state,
                "total": self.total, "done": self.done, "message": self.message,
                "skipped": self.skipped[:SHOWN_SKIPS], "skipped_count": len(self.skipped)}


class Conversions:
    """The conversions started from this dashboard (kept while it runs), each in its own thread."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace
        self._lock = threading.Lock()
        self._started: list[Conversion] = []
        self._numbers = itertools.count(1)

    def views(self) -> list[dict]:
        """Every conversion, the newest first."""
        with self._lock:
            return [conversion.view() for conversion in reversed(self._started)]

    def start(self, request: ConversionRequest) -> Conversion:
        """Check ``request`` and start it; RefusedPathError for paths outside the workspace or a dataset folder
        that exists or is being made (409), DataError when the image folder has no class folders of images."""
        root = self.workspace.folder(request.source)
        out = self.workspace.path(request.out)
        for taken in (out, out + PARTIAL):
            if os.path.lexists(taken):
                raise RefusedPathError(f"{self.workspace.relative(taken)} already exists: choose another dataset "
                                       "folder (nothing is replaced from the page)", 409)
        scan_class_folders(root, None)
        with self._lock:
            if any(c.state == "running" and c.out == self.workspace.relative(out) for c in self._started):
                raise RefusedPathError(f"{request.out} is being made by another conversion", 409)
            conversion = Conversion(next(self._numbers), self.workspace.relative(root), self.workspace.relative(out))
            self._started.append(conversion)
        threading.Thread(target=self._convert, args=(conversion, root, out, request.options), daemon=True,
                         name=f"conversion {conversion.number}").start()
        return conversion

    def _relative(self, message: str) -> str:
        """``message`` naming the workspace's files by their paths in it, as the page does."""
        return message.replace(self.workspace.root + os.sep, "")

    def _convert(self, conversion: Conversion, root: str, out: str, options: ImagesetOptions) -> None:
        @contextlib.contextmanager
        def progress(total: int):
            conversion.total = total

            def advance():
                conversion.done += 1

            yield advance

        try:
            report = convert_imageset(root, out, options=options, progress_factory=progress)
        except Exception as exc:  # noqa: BLE001 - whatever ends a conversion is shown on the page, not lost in a thread
            message = str(exc) if isinstance(exc, NetspecError) else f"{type(exc).__name__}: {exc}"
            conversion.state, conversion.message = "failed", self._relative(message)
            return
        conversion.skipped = [self._relative(problem) for problem in report.skipped]
        written = ", ".join(f"{count} records to {self.workspace.relative(path)}"
                            for path, count in report.written.items())
        conversion.state, conversion.message = "finished", f"wrote {written}" + (
            f"; skipped {len(report.skipped)} image(s) that could not be read" if report.skipped else "")
