"""What the dashboard shows of one run folder: its row in the runs list, its per-class accuracies, its config
files, snapshots and net."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from dataclasses import dataclass

from netspec.dashboard.metrics import MetricsCache
from netspec.engine.net import compile_net
from netspec.engine.registry import layer_schemas
from netspec.errors import NetspecError
from netspec.graph.compiler import included
from netspec.inspect.drawing import draw, to_dot
from netspec.model_zoo.publish import dataset_label_names
from netspec.spec.net_spec import NetState, parse_net
from netspec.training import run_folder
from netspec.training.run import read_solver

MAX_TEXT = 256 * 1024  # a config file longer than this is shown cut off


def row(run: str, folder: str, cache: MetricsCache) -> dict:
    """The runs list's row of run ``run`` (its path in the workspace) in ``folder``, ready for JSON."""
    state, message = run_folder.run_state(folder)
    summary = cache.summary(run_folder.metrics_path(folder))
    tests = []
    for net, event in sorted(summary.last_tests.items()):
        for output in run_folder.event_outputs(event):
            best, best_iter = summary.best.get((net, output), (None, None))
            tests.append({"output": output if net == 0 else f"{output} (test net {net})", "last": event[output],
                          "best": best, "best_iter": best_iter})
    train = summary.last_train or {}
    return {"run": run, "state": state, "message": message, "iter": summary.last_iter,
            "loss": train.get("smoothed_loss"), "lr": train.get("lr"), "tests": tests,
            "snapshots": len(snapshots(folder))}


@dataclass
class PerClass:
    """One table of each class's accuracy in a test pass (None: the pass held no record of the class), by class
    index; ``names`` name the classes (their numbers are shown unless there are as many names as figures);
    ``previous`` holds the figures of the pass before for a change column ([]: there was none; None: no column)."""

    caption: str
    figures: list[float | None]
    names: list[str]
    previous: list[float | None] | None = None


def per_class(folder: str, cache: MetricsCache) -> list[PerClass]:
    """A table for each per-class top (an Accuracy's second top) of each test net whose last test pass recorded
    its classes' accuracies, with those of the pass before and the classes' names (:func:`class_names`)."""
    summary = cache.summary(run_folder.metrics_path(folder))
    tables, names = [], None
    for net, event in sorted(summary.last_tests.items()):
        before = summary.previous_tests.get(net, {}).get("per_class") or {}
        for top, figures in (event.get("per_class") or {}).items():
            names = class_names(folder) if names is None else names
            caption = f"{top} at iteration {event['iter']}" + ("" if net == 0 else f" (test net {net})")
            tables.append(PerClass(caption, figures, names.get((net, top), []), before.get(top, [])))
    return tables


def class_names(folder: str) -> dict[tuple[int, str], list[str]]:
    """``{(test net, per-class top): class names}`` as the manifest of the dataset each such Accuracy's labels
    come from (a Data layer's) names them, read from the run's solver (:func:`config_source`) without building
    a net; {} when the solver cannot be read."""
    solver = config_source(folder, sources_of(folder), "solver")
    try:
        spec = read_solver(solver) if solver else None
        names = {}
        for index, net in enumerate(spec.test_nets if spec else []):
            given = spec.params.test_state[index] if spec.params.test_state else net.state
            state = NetState(phase="TEST", level=given.level, stage=list(given.stage))
            layers = [layer for layer in net.layers if included(layer, state)]
            for layer in layers:
                if layer.type == "Accuracy" and len(layer.tops) > 1 and len(layer.bottoms) > 1:
                    labels = layer.bottoms[1:2]  # (the Data layer giving them: its second top)
                    data = next((each for each in layers if not each.bottoms and each.tops[1:2] == labels), None)
                    names[index, layer.tops[1]] = dataset_label_names(data) if data is not None else []
        return names
    except (NetspecError, OSError):
        return {}


def regular_file(path: str) -> bool:
    """Whether ``path`` is a regular file itself (not a symbolic link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_text(path: str) -> str:
    """A config file's text (cut off after MAX_TEXT bytes, undecodable bytes replaced)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_TEXT + 1)
    text = data[:MAX_TEXT].decode("utf-8", errors="replace")
    return text + ("\n... (cut off)" if len(data) > MAX_TEXT else "")


def config_files(folder: str) -> list[tuple[str, str]]:
    """``(name, text)`` of each file the run keeps in ``config/`` (solver, nets, sources.json), by name."""
    config = os.path.join(folder, run_folder.CONFIG)
    if not os.path.isdir(config) or os.path.islink(config):
        return []
    return [(name, read_text(os.path.join(config, name))) for name in sorted(os.listdir(config))
            if regular_file(os.path.join(config, name))]


def snapshots(folder: str) -> list[dict]:
    """The run's snapshot files: name, size in bytes and modification time, in name order."""
    found = []
    for name in run_folder.snapshot_files(os.listdir(folder)):
        path = os.path.join(folder, name)
        if regular_file(path):
            info = os.stat(path)
            found.append({"name": name, "size": info.st_size, "modified": info.st_mtime})
    return found


@dataclass
class Drawing:
    """A run's train net drawn: SVG, or the DOT text when Graphviz cannot draw; ``message`` says why not."""

    svg: bytes | None = None
    dot: str | None = None
    message: str | None = None


class NetDrawings:
    """The train net of each run (its copy in ``config/``) drawn, kept while the copy is unchanged.

    Nets with Python layers are refused, as ``netspec draw`` refuses them: a page never imports user code.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._drawn: dict[str, tuple[tuple, Drawing]] = {}

    def drawing(self, folder: str) -> Drawing:
        """The drawing of the run in ``folder``."""
        found = train_net_source(folder)
        if found is None:
            return Drawing(message="the run's config/ holds no copy of its solver or net")
        source, is_net = found
        info = os.stat(source)
        key = (info.st_size, info.st_mtime_ns)
        with self._lock:
            if source in self._drawn and self._drawn[source][0] == key:
                return self._drawn[source][1]
        drawing = draw_net(source, is_net)
        with self._lock:
            self._drawn[source] = (key, drawing)
        return drawing


def train_net_source(folder: str) -> tuple[str, bool] | None:
    """The file to draw the run's train net from (:func:`config_source`), and whether it is a net file (else a
    solver file with the net written inline)."""
    sources = sources_of(folder)
    for key, is_net in (("train_net", True), ("solver", False)):
        source = config_source(folder, sources, key)
        if source is not None:
            return source, is_net
    return None


def sources_of(folder: str) -> dict:
    """Where the run read its config files (``config/sources.json``); {} when that cannot be read."""
    try:
        sources = run_folder.read_sources(folder)
    except (OSError, ValueError):
        sources = {}
    return sources if isinstance(sources, dict) else {}


def config_source(folder: str, sources: dict, key: str) -> str | None:
    """The ``key`` config file of the run (``solver``, ``train_net``): the file the run read while it still holds
    the text the run copied into ``config/``, so the files its data layers read resolve as they did in training;
    else the copy; None without a copy."""
    original = sources.get(key) if isinstance(sources.get(key), str) else None
    copy = run_folder.config_copy(folder, sources, original)
    if copy is None or not regular_file(copy):
        return None
    return original if regular_file(original) and read_text(original) == read_text(copy) else copy


def draw_net(source: str, is_net: bool) -> Drawing:
    """Draw the TRAIN phase of the net in ``source`` (a net file, or a solver file with its net inline) as SVG."""
    try:
        spec = parse_net(source, layer_schemas()) if is_net else read_solver(source).train_net
        graph = compile_net(spec, phase="TRAIN")
    except NetspecError as exc:
        return Drawing(message=f"the net cannot be drawn: {exc}")
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "net.svg")
        try:
            draw(graph, out)
        except NetspecError as exc:
            return Drawing(dot=to_dot(graph), message=str(exc).replace(out, "the SVG"))
        with open(out, "rb") as handle:
            return Drawing(svg=handle.read())

