"""Caffe files in, netspec files out: ``netspec import caffe | caffe-solver | caffemodel``.

Each function reads the Caffe file, converts it (:mod:`netspec.interop.caffe_import`),
checks the result and writes it; the report lists what had no netspec equivalent.
"""

from __future__ import annotations

import dataclasses
import os

import yaml

from netspec.atomic import write_bytes
from netspec.data.transform import save_mean
from netspec.engine.net import Net, load_net
from netspec.engine.registry import layer_class, layer_schemas
from netspec.engine.trust import Trust
from netspec.errors import ConfigError
from netspec.interop.caffe_import import (
    CaffePaths,
    ImportReport,
    copy_caffemodel,
    find_caffe_root,
    import_net,
    import_solver,
)
from netspec.interop.caffemodel import read_caffemodel, read_mean
from netspec.interop.prototxt import read_prototxt
from netspec.spec.net_spec import parse_net
from netspec.spec.yaml_text import config_yaml


def _out_path(prototxt: str, out: str | None) -> str:
    """Where an imported file goes: ``out``, else beside the .prototxt with .yaml."""
    return out or os.path.splitext(prototxt)[0] + ".yaml"


def imported_yaml(data: dict, source: str, command: str) -> str:
    """``data`` (a net or solver) as the YAML text of an imported file, headed by where and how it was imported."""
    return (f"# imported from {source} by netspec {command}\n"
            + config_yaml(data))


def _write(prototxt: str, out: str, data: dict, command: str, check=None) -> str:
    """Write ``data`` as YAML to ``out``; ``check(text)`` may refuse it first.  Returns the text."""
    text = imported_yaml(data, os.path.basename(prototxt), f"import {command}")
    if check is not None:
        try:
            check(text)
        except ConfigError as exc:  # (its lines are of YAML never written: name the prototxt, by layer and key)
            raise ConfigError([dataclasses.replace(problem, file=prototxt, line=None)
                               for problem in exc.problems]) from None
    write_bytes(out, text.encode("utf-8"))
    return text


def _imported(prototxt: str, out: str | None, caffe_root: str | None, convert):
    """``convert(message, paths)`` of the parsed .prototxt, its paths read against the Caffe root; the report notes it.

    The root is ``caffe_root``, else the Caffe checkout around the file, if any.
    """
    out = _out_path(prototxt, out)
    root = caffe_root or find_caffe_root(prototxt)
    how = "--caffe-root" if caffe_root else "the nearest folder above the file holding examples/ or models/"
    paths = CaffePaths(root and os.path.abspath(root), os.path.dirname(os.path.abspath(out)), how)
    data, report = convert(read_prototxt(prototxt), paths)
    note = paths.note(prototxt)
    if note:
        report.notes.insert(0, note)
    return out, data, report


def import_net_file(prototxt: str, out: str | None = None,
                    caffe_root: str | None = None) -> tuple[str, dict, ImportReport]:
    """Convert a Caffe net (current or V1 format) into a netspec net file, validated before it is written.

    Relative paths are read as Caffe run from ``caffe_root`` would (default: the
    checkout around the file).  Returns the path written, the net as plain data, and the import report.
    """
    out, net, report = _imported(prototxt, out, caffe_root, import_net)
    _convert_means(net, out, report)
    _write(prototxt, out, net, "caffe", check=lambda text: parse_net(text, layer_schemas()))
    writers = [f"'{layer['name']}' ({layer['type']})" for layer in net.get("layers", [])
               if layer_class(layer["type"]).writes_files]
    if writers:
        report.notes.append(f"{out}: layer {', '.join(writers)} writes files: inside the run folder when training, "
                            "the current directory otherwise (--allow-absolute-outputs lets it write elsewhere)")
    return out, net, report


def _convert_means(net: dict, out: str, report: ImportReport) -> None:
    """Caffe's .binaryproto mean files written as netspec's .npy beside the net ``out``, the layers pointed at them;
    one not there is named, with the command that converts it."""
    folder = os.path.dirname(os.path.abspath(out))
    for layer in net.get("layers", []):
        mean = layer.get("transform_param", {}).get("mean_file")
        if not isinstance(mean, str) or not mean.endswith(".binaryproto"):
            continue
        converted = os.path.splitext(os.path.basename(mean))[0] + ".npy"
        source = os.path.join(folder, os.path.expanduser(mean))
        if not os.path.isfile(source):
            report.notes.append(f"layer '{layer['name']}': transform_param.mean_file {mean} is a Caffe .binaryproto, "
                                f"not there: once it is, netspec convert caffe-mean {mean} -o {converted}, and point "
                                "mean_file at the .npy")
            continue
        save_mean(read_mean(source), os.path.join(folder, converted))
        layer["transform_param"]["mean_file"] = converted
        report.notes.append(f"layer '{layer['name']}': converted the Caffe mean {mean} into {converted} "
                            "(netspec's mean format)")


def import_solver_file(prototxt: str, out: str | None = None,
                       caffe_root: str | None = None) -> tuple[str, ImportReport]:
    """Convert a Caffe solver into a netspec solver file; returns the path written and the report.

    Paths are rewritten as for :func:`import_net_file`.
    """
    out, solver, report = _imported(prototxt, out, caffe_root, import_solver)
    text = _write(prototxt, out, solver, "caffe-solver")
    if solver.get("solver_mode") == "GPU":
        line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith("solver_mode:"))
        report.notes.append(f"{out}:{line}: solver_mode: GPU trains on the GPU; on a machine without one pass "
                            "--device cpu to netspec train (or set solver_mode: CPU)")
    return out, report


def import_caffemodel_file(net_file: str, caffemodel: str, out: str,
                           where: str | None = None) -> tuple[Net, list[str], list[str]]:
    """Copy the weights of ``caffemodel`` into a netspec weights file ``out``, for the net of ``net_file``: a Caffe
    .prototxt, or a netspec net (``.yaml``/``.yml``, such as ``netspec import caffe`` writes).  Blobs that do not
    fit the net are named with ``where`` (default: the caffemodel's path).

    Returns the net holding them, the layers the caffemodel lacks (they keep
    their fillers) and the caffemodel's layers the net does not have.
    """
    if net_file.lower().endswith((".yaml", ".yml")):
        source = net_file
    else:
        spec, _ = import_net(read_prototxt(net_file))
        source = yaml.safe_dump(spec, sort_keys=False)
    # the net's weights are copied, it is never run
    net = load_net(source, phase="TEST", trust=Trust(outputs_anywhere=True))
    missing, unused = copy_caffemodel(net, read_caffemodel(caffemodel), where or caffemodel)
    net.save_weights(out)
    return net, missing, unused
