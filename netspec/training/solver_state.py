"""Solver state files: what a resumed run needs besides the weights (DESIGN.md section 6).

Layout (HDF5, written atomically beside its weights file)::

    /                                  attrs: format, netspec_version, iteration, solver_type, lr_step,
                                              rng_state, net_name, net_config_hash, solver_config_hash,
                                              solver_yaml, net_yaml, weights_file, weights_sha256,
                                              progress (JSON: periodic snapshots kept, watched outputs),
                                              world_size (processes of the run), rank_rng_states (JSON:
                                              each rank's own generator, distributed runs only),
                                              test_rng_state (the test nets' generator),
                                              params (JSON: the solver parameters the run used, with
                                              command-line overrides and epochs in iterations)
    /history/<layer>/<blob>/<name>     the update rule's buffers, per learnable blob (layer names escaped as
                                       in weights files: % and / percent-escaped)
    /runtime/<net>/<layer>/<key>       layer run-time state (data positions); <net> is train, test0, ...
    /loss_window                       the recent losses averaged in the log
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import h5py
import numpy

from netspec.atomic import atomic_path
from netspec.data.hdf5 import escape_name, open_failure, unescape_name
from netspec.errors import StateError
from netspec.version import __version__

FORMAT = "netspec-solverstate-1"


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class SolverState:
    """The contents of a solver state file."""

    iteration: int
    solver_type: str
    rng_state: str
    net_name: str
    net_config_hash: str
    solver_config_hash: str
    solver_yaml: str
    net_yaml: str
    weights_file: str
    weights_sha256: str
    lr_step: int = 0
    history: dict[str, dict[int, dict[str, numpy.ndarray]]] = field(default_factory=dict)
    runtime: dict[str, dict[str, dict[str, numpy.ndarray]]] = field(default_factory=dict)
    loss_window: list[float] = field(default_factory=list)
    progress: dict = field(default_factory=dict)
    world_size: int = 1
    rank_rng_states: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)  # empty in states written before it was recorded
    test_rng_state: str = ""  # empty in states written before test nets had their own generator


_ATTRS = ("iteration", "solver_type", "lr_step", "rng_state", "net_name", "net_config_hash", "solver_config_hash",
          "solver_yaml", "net_yaml", "weights_file", "weights_sha256")


def write_state(path: str | os.PathLike, state: SolverState) -> None:
    """Write ``state`` to ``path`` atomically; ``weights_file`` is stored relative to the state's folder."""

    with atomic_path(path) as temporary, h5py.File(temporary, "w") as handle:
        handle.attrs["format"] = FORMAT
        handle.attrs["netspec_version"] = __version__
        for name in _ATTRS:
            handle.attrs[name] = getattr(state, name)
        handle.attrs["progress"] = json.dumps(state.progress)
        handle.attrs["world_size"] = state.world_size
        handle.attrs["rank_rng_states"] = json.dumps(state.rank_rng_states)
        handle.attrs["params"] = json.dumps(state.params)
        handle.attrs["test_rng_state"] = state.test_rng_state
        for layer, blobs in state.history.items():
            for index, buffers in blobs.items():
                for name, array in buffers.items():
                    handle.create_dataset(f"history/{escape_name(layer)}/{index}/{name}", data=array)
        for net, layers in state.runtime.items():
            for layer, values in layers.items():
                for key, value in values.items():
                    handle.create_dataset(f"runtime/{net}/{escape_name(layer)}/{key}", data=numpy.asarray(value))
        handle.create_dataset("loss_window", data=numpy.asarray(state.loss_window, dtype=numpy.float64))


def read_state(path: str | os.PathLike) -> SolverState:
    """Read a solver state file; a missing, truncated or foreign file is a StateError naming it."""
    path = os.fspath(path)
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("format") != FORMAT:
                raise StateError(f"{path}: not a netspec solver state (no '{FORMAT}' format mark)")
            missing = [name for name in _ATTRS if name not in handle.attrs]
            if missing:
                raise StateError(f"{path}: incomplete solver state, missing {', '.join(missing)}")
            values = {name: handle.attrs[name] for name in _ATTRS}
            values["iteration"] = int(values["iteration"])
            values["lr_step"] = int(values["lr_step"])
            state = SolverState(**values, progress=json.loads(handle.attrs.get("progress", "{}")),
                                world_size=int(handle.attrs.get("world_size", 1)),
                                rank_rng_states=json.loads(handle.attrs.get("rank_rng_states", "[]")),
                                params=json.loads(handle.attrs.get("params", "{}")),
                                test_rng_state=str(handle.attrs.get("test_rng_state", "")))
            for layer, blobs in handle.get("history", {}).items():
                state.history[unescape_name(layer)] = {int(index): {name: buf[()] for name, buf in buffers.items()}
                                        for index, buffers in blobs.items()}
            for net, layers in handle.get("runtime", {}).items():
                state.runtime[net] = {unescape_name(layer): {key: data[()] for key, data in values.items()}
                                      for layer, values in layers.items()}
            state.loss_window = [float(v) for v in handle["loss_window"][()]]
            return state
    except (OSError, KeyError) as exc:
        reason = open_failure(path, exc) if isinstance(exc, OSError) else f"incomplete file ({exc})"
        raise StateError(f"{path}: cannot read solver state: {reason}") from None


def weights_path(state_path: str | os.PathLike, state: SolverState) -> str:
    """The weights file a state belongs to (stored relative to the state's folder)."""
    return os.path.join(os.path.dirname(os.path.abspath(state_path)), state.weights_file)
