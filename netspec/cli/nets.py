"""Commands about nets: check, layers, solvers, render, deploy-net, draw, time, test."""

from __future__ import annotations

import functools
import json
import os

import click
import numpy

from netspec.atomic import atomic_open
from netspec.cli.errors import user_errors
from netspec.cli.options import (
    Dims,
    Integer,
    level_option,
    no_python_layers_option,
    outputs_anywhere_option,
    own_net_trust,
    phase_option,
    python_layers_option,
    stage_option,
    threads_option,
)
from netspec.cli.output import echo
from netspec.engine import onednn
from netspec.engine.backend import gpu_report
from netspec.engine.classes import class_problems
from netspec.engine.deploy import deploy_net_yaml, derive_deploy_net
from netspec.engine.net import Net, compile_file, load_net
from netspec.engine.one_pass import OnePass
from netspec.engine.registry import layer_class, layer_types, solver_class, solver_types
from netspec.engine.trust import Trust
from netspec.errors import ConfigError, NetspecError
from netspec.inspect.confusion import Confusion, check_png
from netspec.inspect.drawing import draw as draw_graph
from netspec.inspect.report import format_table, layer_doc, net_summary, solver_doc, summary
from netspec.inspect.timing import time_net
from netspec.spec.modules import render_net
from netspec.spec.yaml_text import config_yaml
from netspec.threads import thread_counts
from netspec.training.log import format_outputs


@click.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@phase_option()
@stage_option
@level_option
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="also check that this weights file loads into the net")
@python_layers_option
@user_errors
def check(net_file, phase, stages, level, weights, allow_python_layers):
    """Validate NET_FILE and print every layer's tops, parameters and memory."""
    graph = compile_file(net_file, phase.upper() if phase else None, stages or None, level,
                         trust=Trust(python_layers=allow_python_layers))
    errors, warnings = class_problems(graph)
    if errors:
        raise ConfigError(errors)
    echo(net_summary(graph))
    for line in warnings:
        echo(line)
    if weights:
        net = Net(graph, output_folder=Trust(outputs_anywhere=True).output_folder())  # checked, never run
        click.echo(net.load_weights(weights).summary(weights))


@click.command()
@click.argument("layer_type", required=False)
@user_errors
def layers(layer_type):
    """List every layer type, or print the documentation of LAYER_TYPE."""
    if layer_type is None:
        echo_types(layer_types())
        return
    click.echo(layer_doc(layer_class(layer_type)))


@click.command()
@click.argument("solver_type", required=False)
@user_errors
def solvers(solver_type):
    """List every solver type (update rule), or print the formulas of SOLVER_TYPE."""
    if solver_type is None:
        echo_types(solver_types())
        return
    click.echo(solver_doc(solver_class(solver_type)))


def echo_types(types: dict[str, type]) -> None:
    """One line per registered type: its name and the first line of its docstring."""
    width = max(len(name) for name in types)
    for name, cls in types.items():
        click.echo(f"{name.ljust(width)}  {summary(cls)}")


@click.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@user_errors
def render(net_file):
    """Print NET_FILE with its modules, repeats and includes expanded: a plain net file."""
    click.echo(config_yaml(render_net(net_file)), nl=False)


@click.command("deploy-net")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None, help="write here [default: print it]")
@click.option("--input-shape", type=Dims(3), default=None,
              help="C,H,W of one input [default: what the TEST data layer produces, read from its data]")
@click.option("--batch-size", type=Integer(min=1), default=1, show_default=True, help="the Input's first axis")
@stage_option
@level_option
@python_layers_option
@user_errors
def deploy_net(net_file, out, input_shape, batch_size, stages, level, allow_python_layers):
    """Derive the deploy net of a train/val net: Input for the data, losses and accuracy dropped, Softmax added."""
    try:
        derived = derive_deploy_net(net_file, input_shape, batch_size, stages=list(stages) or None, level=level,
                                    trust=Trust(python_layers=allow_python_layers))
    except NetspecError as exc:
        if input_shape is not None:
            raise
        raise NetspecError(f"{exc}; pass the input shape (--input-shape C,H,W) to derive the deploy net without "
                           "the data") from None
    text = deploy_net_yaml(derived, net_file)
    if out is None:
        click.echo(text, nl=False)
        return
    with atomic_open(out, "w") as handle:
        handle.write(text)
    click.echo(f"wrote {out} ({len(derived['layers'])} layers)")


@click.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="net.dot, net.svg or net.png")
@phase_option()
@stage_option
@level_option
@click.option("--rankdir", type=click.Choice(["TB", "LR"]), default="TB", show_default=True,
              help="top to bottom or left to right")
@python_layers_option
@user_errors
def draw(net_file, out, phase, stages, level, rankdir, allow_python_layers):
    """Draw NET_FILE's layer graph with blob shapes on the edges (.svg/.png need Graphviz's dot)."""
    graph = compile_file(net_file, phase.upper() if phase else None, stages or None, level,
                         trust=Trust(python_layers=allow_python_layers))
    draw_graph(graph, out, rankdir)
    click.echo(f"wrote {out} ({len(graph.nodes)} layers)")


@click.command("time")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--iterations", "-n", type=Integer(min=1), default=50, show_default=True,
              help="timed forward+backward passes")
@click.option("--warmup", type=Integer(min=0), default=5, show_default=True, help="untimed passes first")
@phase_option("TRAIN")
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@click.option("--seed", type=Integer(), default=0, show_default=True, help="seed for fillers and data")
@threads_option
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line holding every figure")
@outputs_anywhere_option
@no_python_layers_option
@user_errors
def time_command(net_file, iterations, warmup, phase, stages, level, device, seed, as_json, outputs_anywhere,
                 no_python_layers):
    """Time forward and backward passes of NET_FILE, layer by layer."""
    net = load_net(net_file, phase=phase.upper(), device=device, stages=stages or None, level=level,
                   trust=own_net_trust(no_python_layers, outputs_anywhere, "timing"), seed=seed, reuse_memory=True)
    try:
        result = time_net(net, iterations=iterations, warmup=warmup)
    finally:
        net.close()
    rows = [[x["name"], x["type"], f"{x['forward_ms']:.3f}", f"{x['backward_ms']:.3f}"] for x in result["layers"]]
    rows.append(["total", "", f"{result['forward_ms']:.3f}", f"{result['backward_ms']:.3f}"])
    echo(f"net '{result['net']}' ({result['phase']}) on {result['device']}, batch {result['batch_size']}, "
         f"{iterations} iterations after {warmup} warm-up")
    click.echo(f"paths: {result['paths']}")
    click.echo(f"threads: {result['threads']}")
    click.echo(format_table(["layer", "type", "forward ms", "backward ms"], rows, right={2, 3}))
    click.echo(f"{result['ms_per_iter']:.3f} ms per iteration, {result['images_per_s']:.1f} images/s")
    click.echo(f"memory: blobs {result['blob_bytes'] / 2 ** 20:.1f} MiB (data and diff); peak "
               f"{result['peak_bytes'] / 2 ** 20:.1f} MiB ({result['peak_of']})")
    if as_json:
        click.echo(json.dumps(result))


@click.command("device-query")
@user_errors
def device_query():
    """Print the devices nets can run on here: the CPU (cores, NumPy, oneDNN, threads) and each GPU CuPy sees
    (name, compute capability, free memory, with the CuPy, CUDA and driver versions)."""
    lib = onednn.library()
    fast = f"oneDNN {lib.version}" if lib is not None else f"oneDNN off ({onednn.why_unavailable()})"
    click.echo(f"cpu: {os.cpu_count()} cores, NumPy {numpy.__version__}, {fast}; threads: {thread_counts()}")
    for line in gpu_report():
        click.echo(line)


DEFAULT_TEST_BATCHES = 50  # netspec test on a net whose data layer cannot tell its size


@click.command("test")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--weights", type=click.Path(dir_okay=False), required=True, help="trained weights (.weights.h5)")
@click.option("--iterations", "-n", type=Integer(min=1), default=None,
              help="batches to average over [default: one pass over the dataset, every record once, where the "
                   "data layer knows its size, else 50]")
@threads_option
@phase_option("TEST")
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line holding every figure")
@click.option("--report", is_flag=True,
              help="also each class's precision and recall (its accuracy), and the confusion matrix")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="with --report: also draw the confusion matrix into this PNG")
@outputs_anywhere_option
@no_python_layers_option
@user_errors
def test_command(net_file, weights, iterations, phase, stages, level, device, as_json, report, out,
                 outputs_anywhere, no_python_layers):
    """Score trained WEIGHTS on NET_FILE: each output averaged over one pass of its dataset (or N batches)."""
    if out is not None and not report:
        raise click.UsageError("-o draws the confusion matrix of --report: add --report")
    if out is not None:
        check_png(out)
    # (a report reads the scores after each pass, so no blob may reuse their memory)
    load = functools.partial(load_net, net_file, phase=phase.upper(), device=device, stages=stages or None,
                             level=level, trust=own_net_trust(no_python_layers, outputs_anywhere, "test"),
                             inference=True, reuse_memory=not report)
    net = load()
    one_pass = None
    try:
        net.load_weights(weights)
        net.freeze()
        records = net.record_count()
        confusion = Confusion(net) if report else None
        if out is not None:
            check_png(out, confusion.classes)
        after_each = confusion.add if confusion else None
        if iterations is None and records:
            one_pass = OnePass(net, lambda batch: load(batch_size=batch))
            scores = one_pass.score(after_each)
            iterations, scored, note = one_pass.passes, one_pass.describe(), one_pass.note
        else:
            iterations = iterations or DEFAULT_TEST_BATCHES
            scores = net.score(iterations, after_each)
            scored = f"{iterations} batches of {net.batch_size}" + (
                f", {min(iterations * net.batch_size, records):,} of the dataset's {records:,} records" if records
                else "")
            note = net.coverage(iterations)
    finally:
        net.close()
        if one_pass is not None:
            one_pass.close()
    echo(f"net '{net.name}' ({net.phase}), weights {weights}: {scored}")
    if note:
        echo(f"note: {note}")
    click.echo(f"paths: {net.paths()}")
    click.echo(format_outputs(scores, net.output_loss_weights)
               or "the net has no one-element outputs to average")
    if confusion is not None:
        click.echo(confusion.text())
    if out is not None:
        confusion.write_png(out, net.name)
        click.echo(f"wrote {out} (the {confusion.classes} x {confusion.classes} confusion matrix)")
    if as_json:
        click.echo(json.dumps({"net": net.name, "weights": weights, "iterations": iterations,
                               "batch_size": net.batch_size, "records": one_pass.rows if one_pass else None,
                               "outputs": scores}
                              | ({"report": confusion.figures()} if confusion is not None else {})))
