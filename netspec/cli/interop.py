"""Commands about other formats: export onnx, import caffe | caffemodel | caffe-solver | onnx."""

from __future__ import annotations

import click

from netspec.cli.errors import user_errors
from netspec.cli.options import Dims, Integer, level_option, python_layers_option, stage_option
from netspec.cli.output import echo
from netspec.engine.net import load_net
from netspec.engine.trust import Trust
from netspec.interop.caffe_files import import_caffemodel_file, import_net_file, import_solver_file
from netspec.interop.onnx_export import export_onnx
from netspec.interop.onnx_import import import_onnx_file


@click.group()
def export():
    """Write nets in other formats."""


@export.command("onnx")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--weights", type=click.Path(dir_okay=False),
              help="trained weights (.weights.h5) [default: none: the fillers' values, to check a net's export]")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the .onnx file to write")
@click.option("--opset", type=Integer(13, 21), default=17, show_default=True, help="ONNX opset version")
@click.option("--unfolded", is_flag=True, help="keep each BatchNorm and Scale after a convolution as its own "
              "operators [default: folded into the convolution's weights and bias]")
@stage_option
@level_option
@python_layers_option
@user_errors
def export_onnx_command(net_file, weights, out, opset, unfolded, stages, level, allow_python_layers):
    """Export NET_FILE's inference (TEST) graph with its weights as an ONNX model."""
    net = load_net(net_file, phase="TEST", stages=stages or None, level=level, inference=not unfolded,
                   trust=Trust(python_layers=allow_python_layers, outputs_anywhere=True))  # never run here
    if weights:
        net.load_weights(weights)
    else:
        echo("note: no --weights: the model holds the fillers' values, not trained weights", err=True)
    export_onnx(net, out, opset)
    click.echo(f"wrote {out} (opset {opset}, {len(net.nodes)} layers, inputs "
               f"{', '.join(f'{n} {list(net.blobs[n].shape)}' for n in net.data_layer().spec.tops)})")


@click.group("import")
def import_group():
    """Bring nets, solvers and weights over from Caffe and ONNX."""


imported_yaml_option = click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
                                    help="the YAML to write [default: beside the input, .yaml]")
caffe_root_option = click.option("--caffe-root", type=click.Path(file_okay=False, exists=True), default=None,
                                 help="the folder Caffe runs from, which its relative paths are read against "
                                      "[default: the nearest folder above the file holding examples/ or models/]")


def echo_report(report) -> None:
    """The fields an import dropped, and its notes, each once (a train_val net's TRAIN and TEST data layers are
    often one name, with the same notes)."""
    for item in dict.fromkeys(report.dropped):
        echo(f"dropped (no netspec equivalent): {item}")
    for note in dict.fromkeys(report.notes):
        echo(f"note: {note}")


@import_group.command("caffe")
@click.argument("prototxt", type=click.Path(dir_okay=False))
@imported_yaml_option
@caffe_root_option
@user_errors
def import_caffe(prototxt, out, caffe_root):
    """Convert a Caffe net (.prototxt, current or V1 format) into a netspec net file."""
    out, net, report = import_net_file(prototxt, out, caffe_root)
    click.echo(f"wrote {out} ({len(net['layers'])} layers)")
    echo_report(report)


@import_group.command("caffemodel")
@click.argument("net_file", metavar="NET", type=click.Path(dir_okay=False))
@click.argument("caffemodel", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the netspec weights to write")
@user_errors
def import_caffemodel(net_file, caffemodel, out):
    """Convert Caffe weights (.caffemodel) for NET, a Caffe .prototxt or a netspec .yaml net (as import caffe writes
    it), into a netspec weights file."""
    net, missing, unused = import_caffemodel_file(net_file, caffemodel, out)
    click.echo(f"wrote {out}: {len(net.owned_params()) - len(missing)} layer(s) of weights")
    if missing:
        echo(f"not in the caffemodel (keep their fillers): {', '.join(missing)}")
    if unused:
        echo(f"in the caffemodel but not the net: {', '.join(unused)}")


@import_group.command("caffe-solver")
@click.argument("prototxt", type=click.Path(dir_okay=False))
@imported_yaml_option
@caffe_root_option
@user_errors
def import_caffe_solver(prototxt, out, caffe_root):
    """Convert a Caffe solver (.prototxt) into a netspec solver file."""
    out, report = import_solver_file(prototxt, out, caffe_root)
    click.echo(f"wrote {out}")
    echo_report(report)


@import_group.command("onnx")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="the net to write [default: beside MODEL, .yaml]")
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="the weights to write [default: beside the net, .weights.h5]")
@click.option("--batch", type=Integer(1), default=None, help="the inputs' first axis (where the model leaves it "
              "dynamic, or to change it)")
@click.option("--input-shape", type=Dims(None), default=None,
              help="the inputs' other axes (needed where the model leaves them dynamic), e.g. 3,224,224")
@click.option("--fold-batchnorm", is_flag=True, help="fold each BatchNormalization after a convolution into its "
              "weights and bias [default: a BatchNorm, its statistics kept, and a Scale, which fine-tuning trains]")
@user_errors
def import_onnx_command(model, out, weights, batch, input_shape, fold_batchnorm):
    """Convert an ONNX model (from PyTorch, TensorFlow/Keras, Caffe2...) into a netspec net and its weights."""
    out, weights, imported = import_onnx_file(model, out, weights, batch, input_shape, fold_batchnorm)
    inputs = [layer for layer in imported.net["layers"] if layer["type"] == "Input"]
    echo(f"wrote {out} ({len(inputs)} input(s) and {len(imported.net['layers']) - len(inputs)} layers, opset "
         f"{imported.opset}"
         f"{', from ' + imported.producer if imported.producer else ''}) and {weights}; inputs "
         + ", ".join(f"{layer['name']} {layer['input_param']['shape'][0]['dim']}" for layer in inputs))
    for line in imported.summary():
        echo(f"  {line}")
