"""The New run page's work: the workspace's solver files, and starting ``netspec train`` on one from the form,
or on a zoo model's configs pointed at a dataset of the workspace (a fine-tuning).

A start is checked here first, as ``netspec train`` would check it (the
solver parsed, its nets compiled; Python layers refused, since a page never
runs user code), and the run folder must be free; then ``python -m netspec
train --no-python-layers`` runs detached (refusing Python layers itself, for
the files may change after the check), writing its output to the run folder's
log, so the run folder is the one the command makes.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass

from netspec.atomic import open_for_writing
from netspec.dashboard.forms import choice, positive_number, whole_number
from netspec.dashboard.workspace import RefusedPathError, Workspace
from netspec.engine.net import compile_net
from netspec.errors import ConfigError, NetspecError
from netspec.model_zoo.finetune import prepare_finetune
from netspec.model_zoo.zoo import Zoo
from netspec.process import netspec_command
from netspec.spec.solver_spec import SolverSpec
from netspec.training import run_folder
from netspec.training.run import read_solver

SOLVER_NAME = re.compile(r".*solver.*\.ya?ml", re.IGNORECASE)
YAML_NAME = re.compile(r".*\.ya?ml", re.IGNORECASE)
NET_KEY = re.compile(rb"^(net|train_net)\s*:", re.MULTILINE)  # a top-level key naming the net to train
SNIFF_BYTES = 64 * 1024  # how much of a YAML file is searched for that key
DEVICES = ("cpu", "gpu")
START_SECONDS = 60.0  # how long a start waits for the training to reach its loop before showing its page
POLL_SECONDS = 0.1


def solver_files(workspace: Workspace) -> list[str]:
    """The solver files in the workspace, relative to it, sorted: YAML files named like ``*solver*.yaml`` or
    with a top-level ``net:``/``train_net:`` key (not parsed: a cheap look).  Run folders' copies are left out."""
    found = []
    for _, entries, is_run in workspace.folders():
        if not is_run:
            found += [workspace.relative(entry.path) for entry in entries
                      if entry.is_file(follow_symlinks=False) and looks_like_solver(entry.path, entry.name)]
    return sorted(found)


def looks_like_solver(path: str, name: str) -> bool:
    """Whether the file ``path`` named ``name`` looks like a solver file (see :func:`solver_files`)."""
    if not YAML_NAME.fullmatch(name) or name.startswith("."):
        return False
    if SOLVER_NAME.fullmatch(name):
        return True
    try:
        with open(path, "rb") as handle:
            return NET_KEY.search(handle.read(SNIFF_BYTES)) is not None
    except OSError:
        return False


@dataclass
class Start:
    """What the form asks for: the solver file, or a zoo model to fine-tune on a dataset folder, and the
    overrides (None: the file's setting)."""

    solver: str = ""
    model: str = ""  # name@version in the zoo, to fine-tune instead of training a solver file
    dataset: str = ""  # the dataset folder it is fine-tuned on, relative to the workspace
    max_iter: int | None = None
    base_lr: float | None = None
    batch_size: int | None = None
    device: str | None = None
    out: str | None = None  # the run folder, relative to the workspace (default: snapshot_prefix's folder)

    @classmethod
    def from_form(cls, form: dict[str, str]) -> Start:
        """The start a submitted form asks for; NetspecError naming a field that is not understood."""
        return cls(solver=form.get("solver", ""), model=form.get("model", ""), dataset=form.get("dataset", ""),
                   max_iter=whole_number(form, "max_iter"), base_lr=positive_number(form, "base_lr"),
                   batch_size=whole_number(form, "batch_size"), device=choice(form, "device", DEVICES),
                   out=form.get("out", "").strip() or None)

    def arguments(self, folder: str) -> list[str]:
        """The ``netspec train`` options for this start into the run folder ``folder``."""
        given = (("--max-iter", self.max_iter), ("--base-lr", self.base_lr), ("--batch-size", self.batch_size),
                 ("--device", self.device), ("--out", folder))
        return [text for option, value in given if value is not None for text in (option, str(value))]


def start(workspace: Workspace, wanted: Start, zoo: Zoo) -> str:
    """Check ``wanted`` and start its training; the run folder, relative to the workspace.

    A fine-tuning is prepared first (its net and solver written into the run
    folder's ``finetune/``, the model taken from ``zoo``).  A bad
    solver or net is a NetspecError with its ``file:line`` messages; a path out
    of the workspace a RefusedPathError; a folder holding a run or a running
    training a RefusedPathError with status 409.  The training that fails
    before reaching its loop (within START_SECONDS) is a NetspecError with its
    output.
    """
    weights = []
    if wanted.model and wanted.solver:
        raise NetspecError("choose a solver file or a model to fine-tune, not both")
    if wanted.model:
        if not wanted.dataset or not wanted.out:
            raise NetspecError("to fine-tune a model, choose the dataset and name the run folder")
        model = zoo.folder(*zoo.resolve(wanted.model))  # a model of the zoo, never a folder the form names
        folder = workspace.path(wanted.out)
        refuse_busy(workspace, folder)
        prepared = prepare_finetune(model, workspace.folder(wanted.dataset), folder)
        solver, weights = prepared.solver, ["--weights", prepared.weights]
    elif wanted.solver:
        solver = workspace.file(wanted.solver)
    else:
        raise NetspecError("choose a solver file, or a model to fine-tune")
    spec = read_solver(solver, wanted.max_iter, wanted.base_lr, wanted.batch_size)
    check_nets(spec)
    if not wanted.model:
        folder = workspace.path(wanted.out) if wanted.out else os.path.realpath(
            run_folder.folder_of(spec.snapshot_prefix))
        if not workspace.holds(folder):
            raise RefusedPathError(f"the solver's run folder {folder} is outside the workspace: give an output "
                                   "folder", 403)
        refuse_busy(workspace, folder)
    spawn(solver, wanted.arguments(folder) + weights, folder, workspace.root)
    return workspace.relative(folder)


def refuse_busy(workspace: Workspace, folder: str) -> None:
    """RefusedPathError (409) when a training writes to the run folder ``folder``, or it holds a run already."""
    relative = workspace.relative(folder)
    holder = run_folder.lock_holder(folder)
    if holder is not None:
        raise RefusedPathError(f"{relative} is in use by another training (pid {holder}): wait for it to end, or "
                               "give another output folder", 409)
    try:
        run_folder.refuse_used(folder)
    except NetspecError:
        raise RefusedPathError(f"{relative} already holds a run: give another output folder", 409) from None


def check_nets(spec: SolverSpec) -> None:
    """Compile the solver's train and test nets as training will; ConfigError when one has Python layers."""
    nets = [spec.train_net, *spec.test_nets]
    python = {(layer.file, layer.line): layer for net in nets for layer in net.layers if layer.type == "Python"}
    if python:
        raise ConfigError([layer.problem("a Python layer runs its module's code, so this config is not run from "
                                         "the dashboard: start it with netspec train", "type")
                           for layer in python.values()])
    states = [spec.params.train_state, *(spec.params.test_state or [None] * len(spec.test_nets))]
    for net, phase, state in zip(nets, ["TRAIN"] + ["TEST"] * len(spec.test_nets), states):
        compile_net(net, phase=phase, stages=state.stage if state else None, level=state.level if state else None)


def spawn(solver: str, arguments: list[str], folder: str, cwd: str) -> None:
    """Run ``netspec train solver arguments --no-python-layers`` detached (its own session, so it outlives the
    dashboard), its output appended to the run folder's log; return once it trains, or raise NetspecError with
    its output when it ends with an error first.  (The training refuses Python layers itself: its files may
    change after the page's check.)"""
    log_path = run_folder.train_log_path(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        log = open_for_writing(log_path, "ab")
    except OSError as exc:
        raise NetspecError(f"{folder}: cannot write the run's log: {exc.strerror}") from None
    with log:
        offset = log.tell()
        process = subprocess.Popen(netspec_command("train", solver, *arguments, "--no-python-layers"), cwd=cwd,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + START_SECONDS
    while process.poll() is None and time.monotonic() < deadline and not (
            run_folder.lock_holder(folder) == process.pid and run_folder.loop_started(folder)):
        time.sleep(POLL_SECONDS)
    if process.poll() is None:
        threading.Thread(target=process.wait, daemon=True).start()  # reaps it when it ends
    elif process.returncode != 0:
        with open(log_path, "rb") as log:
            log.seek(offset)
            raise NetspecError(log.read().decode("utf-8", errors="replace").strip()
                               or f"netspec train ended with status {process.returncode}")
