"""What the dashboard shows of one run folder: its row in the runs list, its config files, snapshots and net."""

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
from netspec.inspect.drawing import draw, to_dot
from netspec.spec.net_spec import parse_net
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
    """The file to draw the run's train net from, and whether it is a net file (else a solver file with the net
    written inline).

    That is the file the run read (``config/sources.json``) while it still holds the text the run copied into
    ``config/``, so the files its data layers read resolve as they did in training; else the copy.
    """
    try:
        sources = run_folder.read_sources(folder)
    except (OSError, ValueError):
        sources = {}
    sources = sources if isinstance(sources, dict) else {}
    for key, is_net in (("train_net", True), ("solver", False)):
        original = sources.get(key) if isinstance(sources.get(key), str) else None
        copy = run_folder.config_copy(folder, sources, original)
        if copy is not None and regular_file(copy):
            unchanged = regular_file(original) and read_text(original) == read_text(copy)
            return (original if unchanged else copy), is_net
    return None


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

