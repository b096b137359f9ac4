"""The Models pages' work: the local zoo's models, a finished run published into it, and predictions of a
model on an uploaded image.

The last few models used for predictions stay loaded (each with its card file's modification time, so
a model replaced with ``--force`` is loaded again); a lock lets one request at a time use each net.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from netspec.dashboard.forms import choice, positive_number
from netspec.dashboard.workspace import RefusedPathError
from netspec.errors import DataError, NetspecError
from netspec.model_zoo.card import CARD, ModelCard, check_name, check_version
from netspec.model_zoo.predict import Adjustments, Model, image_input, load
from netspec.model_zoo.publish import PublishRequest, publish
from netspec.model_zoo.zoo import Zoo, ZooError, version_key
from netspec.training import run_folder

TOP_K = 5
LICENSES = ("unspecified", "CC-BY-4.0", "CC-BY-SA-4.0", "CC0-1.0", "MIT", "Apache-2.0", "BSD-3-Clause",
            "proprietary")


def models(zoo: Zoo) -> list[dict]:
    """Every model of the zoo, newest version first within each name: ``{"ref", "card"}`` or ``{"ref",
    "problem"}`` when its card cannot be read."""
    found = []
    for name, entry in sorted(zoo.index()["models"].items()):
        for version in sorted(entry["versions"], key=version_key, reverse=True):
            ref = f"{name}@{version}"
            try:
                found.append({"ref": ref, "card": zoo.card(ref)})
            except NetspecError as exc:
                found.append({"ref": ref, "problem": str(exc)})
    return found


def finetunable(found: list[dict]) -> list[str]:
    """The models (of :func:`models`) that can be fine-tuned: with weights, train net and solver."""
    return [model["ref"] for model in found if "card" in model and model["card"].weights and
            model["card"].train_net and model["card"].solver]


def publishable(folder: str) -> str | None:
    """Why the run in ``folder`` cannot be published now, or None when it can (it ended, with snapshot weights)."""
    state, _ = run_folder.run_state(folder)
    if state == "running":
        return "the run is still training: stop it, or wait for it to finish"
    if run_folder.last_snapshot_weights(folder) is None:
        return "the run has no snapshot weights to publish"
    return None


@dataclass
class PublishForm:
    """What the Publish form asks: the model's name, version, summary, licence, authors and input scale."""

    name: str
    version: str
    summary: str
    license: str
    authors: list[str]
    scale: float | None  # None: the run's transform_param's, else 1

    @classmethod
    def from_form(cls, form: dict[str, str]) -> PublishForm:
        """The publication a submitted form asks for; ConfigError/NetspecError naming a field not understood."""
        name, version = form.get("name", "").strip(), form.get("version", "").strip() or "1"
        check_name(name)
        check_version(version)
        authors = [author.strip() for author in form.get("authors", "").split(",") if author.strip()]
        return cls(name, version, form.get("summary", "").strip(), choice(form, "license", LICENSES, "unspecified"),
                   authors, positive_number(form, "scale"))


def publish_run(zoo: Zoo, folder: str, wanted: PublishForm) -> ModelCard:
    """Publish the run in ``folder`` as ``wanted`` says (deploy net derived from its train net, its latest
    snapshot's weights); ZooError when it cannot be published or the zoo has that version already."""
    problem = publishable(folder)
    if problem:
        raise ZooError(problem)
    if os.path.exists(zoo.folder(wanted.name, wanted.version)):
        raise RefusedPathError(f"{wanted.name}@{wanted.version} is already in the zoo {zoo.root}: give another "
                               "version (nothing is replaced from the page)", 409)
    return publish(PublishRequest(name=wanted.name, version=wanted.version, run_dir=folder, summary=wanted.summary,
                                  license=wanted.license, authors=wanted.authors, scale=wanted.scale), zoo)


class Predictors:
    """The models of a zoo loaded for predictions (on the CPU): the KEPT last used, each used by one request at
    a time (a model loading holds up only the requests for it), and one model's net running at a time (the nets
    of a process share oneDNN's stream and scratch buffers)."""

    KEPT = 4

    def __init__(self, zoo: Zoo):
        self.zoo = zoo
        self._lock = threading.Lock()
        self._running = threading.Lock()  # held while a model's net runs
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # model folder -> its model, least recent first

    def predict(self, ref: str, data: bytes, name: str) -> dict:
        """The top classes of the image file bytes ``data`` (named ``name``) by the model ``name@version``:
        ``{"input", "predictions": [{"label", "name", "probability"}], "note"}``; DataError when they are not
        an image, ZooError when the model cannot be used."""
        if not data:
            raise DataError(f"{name}: empty file")
        loaded = self._entry(ref)
        with loaded.lock:
            if loaded.model is None:
                loaded.model = load(loaded.folder)  # checks every file against the card
            adjustments = Adjustments(loaded.model.card)
            prepared = image_input(data, name, loaded.model.card, adjustments)
            with self._running:
                result = loaded.model.classify([prepared], TOP_K)[0]
        return {**result, "note": str(adjustments) if adjustments else ""}

    def _entry(self, ref: str) -> Loaded:
        """The entry of the model ``ref`` (a new one when its card changed: replaced with --force)."""
        folder = self.zoo.folder(*self.zoo.resolve(ref))
        try:
            modified = os.stat(os.path.join(folder, CARD)).st_mtime
        except OSError as exc:
            raise ZooError(f"{ref}: cannot read its card in {folder} ({exc.strerror}); netspec zoo verify checks "
                           "the zoo") from None
        with self._lock:
            loaded = self._loaded.get(folder)
            if loaded is None or loaded.modified != modified:
                loaded = self._loaded[folder] = Loaded(folder, modified)
            self._loaded.move_to_end(folder)
            while len(self._loaded) > self.KEPT:
                self._loaded.popitem(last=False)
            return loaded


@dataclass
class Loaded:
    """A model of the zoo as predictions use it: loaded on first use, by one request at a time."""

    folder: str
    modified: float  # its card's modification time when it was loaded
    model: Model | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
