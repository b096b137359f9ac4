"""Solver state files: what a resumed run needs besides the weights (docs/pages/concepts/file-formats.md).

Layout (HDF5, written atomically beside its weights file)::

    /                                  attrs: format, netspec_version, iteration, solver_type, lr_step,
                                              rng_state, net_name, net_config_hash, solver_config_hash,
                                              solver_yaml, net_yaml, weights_file, weights_sha256,
                                              progress (JSON: periodic snapshots kept, watched outputs),
                                              world_size (processes of the run), test_rng_state (the
                                              test nets' host generator), random_stream and
                                              test_random_stream (JSON: [stream seed, {layer: draws
                                              made}] of the device's random values, training's and
                                              testing's),
                                              params (JSON: the solver parameters the run used, with
                                              command-line overrides and epochs in iterations), threads
                                              (the math pool's threads: results depend on them)
    /history/<layer>/<blob>/<name>     the update rule's buffers, per learnable blob (layer names escaped as
                                       in weights files: % and / percent-escaped)
    /runtime/<net>/<layer>/<key>       layer run-time state (data positions); <net> is train, test0, ...
    /loss_window                       the recent losses averaged in the log
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from dataclasses import dataclass, field

import h5py
import numpy

from netspec.atomic import write_bytes
from netspec.data import hdf5_policy
from netspec.data.hdf5 import escape_name, open_failure, unescape_name
from netspec.errors import StateError, shown
from netspec.version import __version__

FORMAT = "netspec-solverstate-1"
MAX_THREADS = 1 << 16  # more than any machine has cores
MAX_UNCHECKED_BYTES = 1 << 28  # the datasets no net shape vouches for, together: data positions, the loss window


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
    params: dict = field(default_factory=dict)  # empty in states written before it was recorded
    test_rng_state: str = ""  # empty in states written before test nets had their own generator
    random_stream: list = field(default_factory=list)  # empty in states written before the device streams
    test_random_stream: list = field(default_factory=list)
    threads: int = 0  # the threads the math pool ran on (0 in states written before it was recorded)


_ATTRS = ("iteration", "solver_type", "lr_step", "rng_state", "net_name", "net_config_hash", "solver_config_hash",
          "solver_yaml", "net_yaml", "weights_file", "weights_sha256")


def stream_valid(stream) -> bool:
    """Whether ``stream`` is ``[]`` (an older state) or a ``[stream seed, {name: draws made}]`` netspec writes."""
    def whole(number, bound: int) -> bool:
        return isinstance(number, int) and not isinstance(number, bool) and 0 <= number < bound

    return stream == [] or (isinstance(stream, list) and len(stream) == 2 and whole(stream[0], 2 ** 128)
                            and isinstance(stream[1], dict) and all(whole(count, 2 ** 63)
                                                                    for count in stream[1].values()))


def write_state(path: str | os.PathLike, state: SolverState) -> None:
    """Write ``state`` to ``path`` atomically (OSError when the disk refuses), built in memory first.

    ``weights_file`` is stored relative to the state's folder.
    """
    image = io.BytesIO()
    with h5py.File(image, "w") as handle:
        handle.attrs["format"] = FORMAT
        handle.attrs["netspec_version"] = __version__
        for name in _ATTRS:
            handle.attrs[name] = getattr(state, name)
        handle.attrs["progress"] = json.dumps(state.progress)
        handle.attrs["world_size"] = state.world_size
        handle.attrs["params"] = json.dumps(state.params)
        handle.attrs["test_rng_state"] = state.test_rng_state
        handle.attrs["random_stream"] = json.dumps(state.random_stream)
        handle.attrs["test_random_stream"] = json.dumps(state.test_random_stream)
        handle.attrs["threads"] = state.threads
        for layer, blobs in state.history.items():
            for index, buffers in blobs.items():
                for name, array in buffers.items():
                    handle.create_dataset(f"history/{escape_name(layer)}/{index}/{name}", data=array)
        for net, layers in state.runtime.items():
            for layer, values in layers.items():
                for key, value in values.items():
                    handle.create_dataset(f"runtime/{net}/{escape_name(layer)}/{key}", data=numpy.asarray(value))
        handle.create_dataset("loss_window", data=numpy.asarray(state.loss_window, dtype=numpy.float64))
    write_bytes(path, image.getbuffer())


def read_state(path: str | os.PathLike) -> SolverState:
    """Read a solver state file but its update history (:func:`read_history` reads that).

    A missing, truncated, foreign or unsafe file is a StateError naming it:
    the file is checked by :mod:`netspec.data.hdf5_policy` before anything is
    read, and the data positions and loss window together are bounded by
    :data:`MAX_UNCHECKED_BYTES`.
    """
    with _open(path) as handle:
        missing = [name for name in _ATTRS if name not in handle.attrs]
        if missing:
            raise StateError(f"{os.fspath(path)}: incomplete solver state, missing {', '.join(missing)}")
        values = {name: handle.attrs[name] for name in _ATTRS}
        values["iteration"] = int(values["iteration"])
        values["lr_step"] = int(values["lr_step"])
        state = SolverState(**values, progress=json.loads(handle.attrs.get("progress", "{}")),
                            world_size=int(handle.attrs.get("world_size", 1)),
                            params=json.loads(handle.attrs.get("params", "{}")),
                            test_rng_state=str(handle.attrs.get("test_rng_state", "")),
                            random_stream=json.loads(handle.attrs.get("random_stream", "[]")),
                            test_random_stream=json.loads(handle.attrs.get("test_random_stream", "[]")),
                            threads=int(handle.attrs.get("threads", 0)))
        if not (isinstance(state.progress, dict) and isinstance(state.params, dict) and state.iteration >= 0
                and state.lr_step >= 0 and state.world_size >= 1 and 0 <= state.threads <= MAX_THREADS
                and all(map(stream_valid, (state.random_stream, state.test_random_stream)))):
            raise StateError(f"{os.fspath(path)}: malformed solver state (its iteration, progress, params, world "
                             "size, threads or random streams are not what netspec writes)")
        if os.path.basename(state.weights_file) != state.weights_file or state.weights_file in ("", ".", ".."):
            raise StateError(f"{os.fspath(path)}: its weights_file {shown(state.weights_file)} is not a file name "
                             "beside the state")
        runtime = {net: {layer: dict(values.items()) for layer, values in layers.items()}
                   for net, layers in handle.get("runtime", {}).items()}
        unchecked = [data for layers in runtime.values() for values in layers.values() for data in values.values()]
        unchecked.append(handle["loss_window"])
        total = sum(data.size * data.dtype.itemsize for data in unchecked)
        if total > MAX_UNCHECKED_BYTES:
            raise StateError(f"{os.fspath(path)}: its data positions and loss window hold {total:,} bytes, more than "
                             f"the {MAX_UNCHECKED_BYTES:,} a solver state may")
        for net, layers in runtime.items():
            state.runtime[net] = {unescape_name(layer): {key: _read(data) for key, data in values.items()}
                                  for layer, values in layers.items()}
        state.loss_window = [float(v) for v in _read(handle["loss_window"])]
        return state


def read_history(path: str | os.PathLike, shapes: dict[str, dict[int, tuple]]) -> dict:
    """The update history of a state, ``{layer: {blob index: {buffer name: array}}}``, for the blobs of ``shapes``.

    ``shapes`` (``{layer: {blob index: shape}}``) is the net's: only that
    history is read, each buffer after its shape is checked against it.
    """
    history = {}
    with _open(path) as handle:
        for escaped, blobs in handle.get("history", {}).items():
            layer = unescape_name(escaped)
            for index, buffers in blobs.items() if layer in shapes else ():
                expected = shapes[layer].get(int(index))
                if expected is None:
                    continue
                for buffer in buffers.values():
                    if tuple(buffer.shape) != expected:
                        raise StateError(f"{os.fspath(path)}: layer '{layer}' blob {index} has shape "
                                         f"{tuple(buffer.shape)} in the state but {expected} in the net")
                read = {name: _read(buffer, expected) for name, buffer in buffers.items()}
                for name, values in read.items():
                    if not numpy.isfinite(values).all():  # (as weights holding them are refused)
                        raise StateError(f"{os.fspath(path)}: layer '{layer}' blob {index}: its update history "
                                         f"'{name}' holds NaN or infinite values")
                history.setdefault(layer, {})[int(index)] = read
    return history


@contextlib.contextmanager
def _open(path: str | os.PathLike):
    """A solver state file open for reading, its format and structure checked.

    Failures to read, and a file of another layout, become StateError naming it.
    """
    path = os.fspath(path)
    hdf5_policy.regular_file(path, StateError)
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("format") != FORMAT:
                raise StateError(f"{path}: not a netspec solver state (no '{FORMAT}' format mark)")
            hdf5_policy.check_structure(handle, StateError)
            yield handle
    except OSError as exc:
        raise StateError(f"{path}: cannot read solver state: {open_failure(path, exc)}") from None
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
        raise StateError(f"{path}: cannot read solver state: incomplete or malformed file "
                         f"({shown(str(exc))})") from None


def _read(dataset, shape: tuple | None = None) -> numpy.ndarray:
    return hdf5_policy.read_dataset(dataset, StateError, shape, None if shape else MAX_UNCHECKED_BYTES)


def weights_path(state_path: str | os.PathLike, state: SolverState) -> str:
    """The weights file a state belongs to (stored relative to the state's folder)."""
    return os.path.join(os.path.dirname(os.path.abspath(state_path)), state.weights_file)
