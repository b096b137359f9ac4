"""The Models pages' work: the local zoo's models, a finished run published into it, and predictions of a
model on an uploaded image.

Models loaded for predictions are kept (one per model, with the card file's modification time, so a
model replaced with ``--force`` is loaded again); a lock lets one request at a time use each net.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from netspec.dashboard.forms import choice, positive_number
from netspec.dashboard.workspace import RefusedPathError
from netspec.errors import NetspecError
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
    """The models of a zoo loaded for predictions (on the CPU), each used by one request at a time."""

    def __init__(self, zoo: Zoo):
        self.zoo = zoo
        self._lock = threading.Lock()
        self._loaded: dict[str, tuple[float, Model, threading.Lock]] = {}  # folder -> (card mtime, model, lock)

    def predict(self, ref: str, data: bytes, name: str) -> dict:
        """The top classes of the image file bytes ``data`` (named ``name``) by the model ``name@version``:
        ``{"input", "predictions": [{"label", "name", "probability"}], "note"}``; DataError when they are not
        an image, ZooError when the model cannot be used."""
        model, lock = self._model(ref)
        adjustments = Adjustments(model.card)
        prepared = image_input(data, name, model.card, adjustments)
        with lock:
            result = model.classify([prepared], TOP_K)[0]
        return {**result, "note": str(adjustments) if adjustments else ""}

    def _model(self, ref: str) -> tuple[Model, threading.Lock]:
        folder = self.zoo.folder(*self.zoo.resolve(ref))
        modified = os.stat(os.path.join(folder, CARD)).st_mtime
        with self._lock:
            kept = self._loaded.get(folder)
            if kept is None or kept[0] != modified:
                kept = (modified, load(folder), threading.Lock())  # checks every file against the card
                self._loaded[folder] = kept
            return kept[1], kept[2]
