"""Caffe files in, netspec files out: ``netspec import caffe | caffe-solver | caffemodel``.

Each function reads the Caffe file, converts it (:mod:`netspec.interop.caffe_import`),
checks the result and writes it; the report lists what had no netspec equivalent.
"""

from __future__ import annotations

import os

import yaml

from netspec.engine.net import Net, load_net
from netspec.engine.registry import layer_schemas
from netspec.interop.caffe_import import ImportReport, copy_caffemodel, import_net, import_solver
from netspec.interop.caffemodel import read_caffemodel
from netspec.interop.prototxt import read_prototxt
from netspec.spec.net_spec import parse_net


def _write(prototxt: str, out: str | None, data: dict, command: str, check=None) -> str:
    """Write ``data`` as YAML (default: beside the .prototxt, .yaml); ``check(text)`` may refuse it first."""
    out = out or os.path.splitext(prototxt)[0] + ".yaml"
    text = (f"# imported from {os.path.basename(prototxt)} by netspec import {command}\n"
            + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))
    if check is not None:
        check(text)
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(text)
    return out


def import_net_file(prototxt: str, out: str | None = None) -> tuple[str, dict, ImportReport]:
    """Convert a Caffe net (current or V1 format) into a netspec net file, validated before it is written.

    Returns the path written, the net as plain data, and the import report.
    """
    net, report = import_net(read_prototxt(prototxt))
    out = _write(prototxt, out, net, "caffe", check=lambda text: parse_net(text, layer_schemas()))
    return out, net, report


def import_solver_file(prototxt: str, out: str | None = None) -> tuple[str, ImportReport]:
    """Convert a Caffe solver into a netspec solver file; returns the path written and the report."""
    solver, report = import_solver(read_prototxt(prototxt))
    return _write(prototxt, out, solver, "caffe-solver"), report


def import_caffemodel_file(prototxt: str, caffemodel: str, out: str) -> tuple[Net, list[str], list[str]]:
    """Copy the weights of ``caffemodel`` (for the net of ``prototxt``) into a netspec weights file ``out``.

    Returns the net holding them, the layers the caffemodel lacks (they keep
    their fillers) and the caffemodel's layers the net does not have.
    """
    spec, _ = import_net(read_prototxt(prototxt))
    net = load_net(yaml.safe_dump(spec, sort_keys=False), phase="TEST")
    missing, unused = copy_caffemodel(net, read_caffemodel(caffemodel), caffemodel)
    net.save_weights(out)
    return net, missing, unused
