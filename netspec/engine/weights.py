"""Weight files: HDF5, one group per layer, one dataset per learnable blob (docs/pages/concepts/file-formats.md).

Layout::

    /                      attrs: format, netspec_version, net_name, config_hash, iteration
    /<layer>/0, 1...       float arrays, attrs on the group: type

A group is named after its layer with ``%`` and ``/`` percent-escaped (HDF5
reads ``/`` as a path), e.g. ``inception_3a%2F1x1``.

Shared blobs are stored once, under the layer that owns them.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field

import h5py
import numpy

from netspec.atomic import write_bytes
from netspec.data import hdf5_policy
from netspec.data.hdf5 import escape_name, open_failure, unescape_name
from netspec.errors import WeightsError, shown_name
from netspec.version import __version__

FORMAT = "netspec-weights-1"


@dataclass
class LoadReport:
    """What :func:`load_weights` did, layer by layer."""

    copied: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)

    def summary(self, path) -> str:
        """One line saying which layers were copied, kept their fillers, or were left out."""
        parts = [f"weights {os.fspath(path)}: copied {len(self.copied)} layer(s)"]
        if self.reinitialised:
            parts.append(f"shape differs, initialised by fillers: {', '.join(self.reinitialised)}")
        if self.missing:
            parts.append(f"not in the file (keep their fillers): {', '.join(self.missing)}")
        if self.unused:
            parts.append(f"in the file but not the net: {', '.join(map(shown_name, self.unused))}")
        return "; ".join(parts)


def save_weights(net, path: str | os.PathLike, iteration: int = 0, origin: dict[str, str] | None = None) -> None:
    """Write every owned parameter blob of ``net`` to ``path`` atomically (OSError when the disk refuses), with
    ``origin`` (where imported weights came from: :func:`weights_origin` reads it back) among the file's attributes.

    The file is built in memory and written in one piece, so a full disk fails
    cleanly in Python rather than inside the HDF5 library.
    """
    image = io.BytesIO()
    with h5py.File(image, "w") as handle:
        handle.attrs["format"] = FORMAT
        handle.attrs["netspec_version"] = __version__
        handle.attrs["net_name"] = net.graph.name
        handle.attrs["config_hash"] = net.graph.config_hash
        handle.attrs["iteration"] = int(iteration)
        for key, value in (origin or {}).items():
            handle.attrs[f"{ORIGIN}{key}"] = str(value)
        for name, blobs in net.owned_params().items():
            group = handle.create_group(escape_name(name))
            group.attrs["type"] = net.layer_by_name[name].type
            for index, blob in blobs:
                group.create_dataset(str(index), data=net.backend.to_host(blob.data))
    write_bytes(path, image.getbuffer())


ORIGIN = "origin_"  # the prefix of the attributes saying where imported weights came from


def weights_origin(handle) -> dict[str, str]:
    """Where the weights of an open weights file came from (``save_weights``' ``origin``; empty for trained ones)."""
    return {key[len(ORIGIN):]: str(value) for key, value in handle.attrs.items() if key.startswith(ORIGIN)}


@contextlib.contextmanager
def open_weights(path: str | os.PathLike):
    """``({layer: {blob index: dataset}}, root attributes)`` of a weights file, open for reading; nothing is read.

    The file is checked by :mod:`netspec.data.hdf5_policy` first: links,
    external storage and anything but numeric datasets are refused.
    """
    path = os.fspath(path)
    hdf5_policy.regular_file(path, WeightsError)
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("format") != FORMAT:
                raise WeightsError(f"{path}: not a netspec weights file (no '{FORMAT}' format mark)")
            hdf5_policy.check_structure(handle, WeightsError)
            layers = {}
            for name, group in handle.items():
                if not isinstance(group, h5py.Group) or not all(
                        key.isascii() and key.isdigit() and isinstance(group[key], h5py.Dataset) for key in group):
                    raise WeightsError(f"{path}: /{name} is not a layer's group of blobs 0, 1, ...")
                layers[unescape_name(name)] = {int(key): group[key] for key in group}
            yield layers, dict(handle.attrs)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read weights file: {open_failure(path, exc)}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise WeightsError(f"{path}: cannot read weights file: malformed ({exc})") from None


def load_weights(net, path: str | os.PathLike, strict: bool = True) -> LoadReport:
    """Copy blobs into ``net`` by layer name.

    Layers absent from the file keep their initial values (reported as
    ``missing``).  A blob whose shape differs is a WeightsError naming the
    file, layer and blob, unless ``strict`` is False (fine-tuning): then that
    layer keeps its fillers and is reported as ``reinitialised``.  A file
    sharing no layer with the net, and values that are not finite, are
    always errors.  Only the blobs the net takes are read, each after its
    shape is checked.
    """
    report = LoadReport()
    owned = net.owned_params()
    with open_weights(path) as (stored, attrs):
        mismatches = []
        for name, blobs in owned.items():
            if name not in stored:
                report.missing.append(name)
                continue
            problems = []
            for index, blob in blobs:
                if index not in stored[name]:
                    problems.append(f"layer '{name}' blob {index} is missing from the file")
                elif tuple(stored[name][index].shape) != blob.shape:
                    problems.append(f"layer '{name}' blob {index} has shape {tuple(stored[name][index].shape)} "
                                    f"in the file but {blob.shape} in the net")
            if problems and not strict:
                report.reinitialised.append(name)
            else:
                mismatches.extend(problems)
                report.copied.append(name)
        report.unused = [name for name in stored if name not in owned]
        if mismatches:
            raise WeightsError(f"{os.fspath(path)}: {'; '.join(mismatches)}")
        if owned and not report.copied:
            raise WeightsError(
                f"{os.fspath(path)}: the weights are of net '{attrs.get('net_name', '?')}' and share no layer "
                f"with net '{net.graph.name}' (file: {', '.join(map(shown_name, sorted(stored))) or 'none'}; "
                f"net: {', '.join(owned)})")
        values = {(name, index): hdf5_policy.read_dataset(stored[name][index], WeightsError, blob.shape)
                  for name in report.copied for index, blob in owned[name]}
    for (name, index), array in values.items():
        if not numpy.isfinite(array).all():
            raise WeightsError(f"{os.fspath(path)}: layer '{name}' blob {index} holds NaN or infinite values")
    for name in report.copied:
        for index, blob in owned[name]:
            blob.data[...] = net.backend.asarray(values[name, index], dtype=blob.dtype)
    return report
