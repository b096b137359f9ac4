"""The ``netspec`` command: wires options to library calls, and turns user errors into one-line messages."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback

import click

from netspec.engine.net import compile_net
from netspec.engine.registry import (
    layer_class,
    layer_schemas,
    layer_types,
    solver_class,
    solver_types,
)
from netspec.errors import ConfigError, NetspecError
from netspec.spec.net_spec import parse_net


def user_errors(command):
    """Report NetspecError as text on stderr with exit status 1, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except NetspecError as exc:
            report_error(exc)
            sys.exit(1)

    return wrapper


def report_error(exc: NetspecError, prefix: str = "error: ") -> None:
    """Print a user error on stderr, one line per problem."""
    problems = exc.problems if isinstance(exc, ConfigError) else [exc]
    for problem in problems:
        click.echo(f"{prefix}{problem}", err=True)
    if len(problems) > 1:
        click.echo(f"{len(problems)} errors", err=True)


@contextlib.contextmanager
def rank_errors(comm):
    """In a distributed run, report a rank's error with its rank, then end every rank of the job.

    An error all ranks raise together (``every_rank``) is reported by rank 0
    alone and the ranks exit normally; any other ends the job with MPI_Abort,
    so no rank is left waiting for one that has gone.
    """
    if comm.size == 1:
        yield
        return
    try:
        yield
    except NetspecError as exc:
        if exc.every_rank:
            if comm.rank == 0:
                report_error(exc)
            sys.exit(1)
        report_error(exc, f"error: rank {comm.rank}: ")
        comm.abort(1)
    except Exception as exc:  # noqa: BLE001 - a bug: show it, and do not leave the other ranks waiting
        traceback.print_exc()
        click.echo(f"error: rank {comm.rank}: {type(exc).__name__}: {exc}", err=True)
        comm.abort(1)


phase_option = click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default=None,
                            help="phase to build (default: the file's state, else TEST)")
stage_option = click.option("--stage", "stages", multiple=True, help="active stage (repeatable)")
level_option = click.option("--level", type=int, default=None, help="net level for include/exclude rules")


@click.group()
@click.version_option(package_name="netspec")
def main():
    """netspec: declarative deep-learning nets and solvers in YAML."""


@main.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@phase_option
@stage_option
@level_option
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="also check that this weights file loads into the net")
@user_errors
def check(net_file, phase, stages, level, weights):
    """Validate NET_FILE and print every layer's tops, parameters and memory."""
    from netspec.engine.net import Net
    from netspec.inspect.report import net_summary

    spec = parse_net(net_file, layer_schemas())
    graph = compile_net(spec, phase=phase.upper() if phase else None, stages=stages or None, level=level)
    click.echo(net_summary(graph))
    if weights:
        click.echo(Net(graph).load_weights(weights).summary(weights))


@main.command()
@click.argument("layer_type", required=False)
@user_errors
def layers(layer_type):
    """List every layer type, or print the documentation of LAYER_TYPE."""
    from netspec.inspect.report import first_line, layer_doc

    types = layer_types()
    if layer_type is None:
        width = max(len(name) for name in types)
        for name, cls in types.items():
            click.echo(f"{name.ljust(width)}  {first_line(cls).split(':', 1)[-1].strip()}")
        return
    click.echo(layer_doc(layer_class(layer_type)))


@main.command()
@click.argument("solver_type", required=False)
@user_errors
def solvers(solver_type):
    """List every solver type (update rule), or print the formulas of SOLVER_TYPE."""
    from netspec.inspect.report import first_line, solver_doc

    if solver_type is None:
        types = solver_types()
        width = max(len(name) for name in types)
        for name, cls in types.items():
            click.echo(f"{name.ljust(width)}  {first_line(cls).split(':', 1)[-1].strip()}")
        return
    click.echo(solver_doc(solver_class(solver_type)))


@main.command("time")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=50, show_default=True,
              help="timed forward+backward passes")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="untimed passes first")
@phase_option
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@click.option("--seed", type=int, default=0, show_default=True, help="seed for fillers and data")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line holding every figure")
@user_errors
def time_command(net_file, iterations, warmup, phase, stages, level, device, seed, as_json):
    """Time forward and backward passes of NET_FILE, layer by layer."""
    from netspec.engine.net import load_net
    from netspec.inspect.report import format_table
    from netspec.inspect.timing import time_net

    net = load_net(net_file, phase=phase.upper() if phase else "TRAIN", device=device, stages=stages or None,
                   level=level, seed=seed)
    try:
        result = time_net(net, iterations=iterations, warmup=warmup)
    finally:
        net.close()
    rows = [[x["name"], x["type"], f"{x['forward_ms']:.3f}", f"{x['backward_ms']:.3f}"] for x in result["layers"]]
    rows.append(["total", "", f"{result['forward_ms']:.3f}", f"{result['backward_ms']:.3f}"])
    click.echo(f"net '{result['net']}' ({result['phase']}) on {result['device']}, batch {result['batch_size']}, "
               f"{iterations} iterations after {warmup} warm-up")
    click.echo(format_table(["layer", "type", "forward ms", "backward ms"], rows, right={2, 3}))
    click.echo(f"{result['ms_per_iter']:.3f} ms per iteration, {result['images_per_s']:.1f} images/s")
    if as_json:
        click.echo(json.dumps(result))


@main.command()
@click.argument("solver_file", type=click.Path(dir_okay=False))
@click.option("--device", default=None, help="cpu, gpu or gpu:N (default: the file's solver_mode)")
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="fine-tune: start from these weights, copied by layer name")
@click.option("--resume", type=click.Path(dir_okay=False), default=None, help="continue from a .solverstate.h5")
@click.option("--force", is_flag=True, help="resume even if the net or solver file changed")
@click.option("--max-iter", type=click.IntRange(min=1), default=None, help="override max_iter")
@click.option("--seed", type=int, default=None, help="override random_seed")
@stage_option
@level_option
@click.option("--out", "run_dir", type=click.Path(file_okay=False), default=None,
              help="run folder for snapshots, metrics.jsonl and config copies (default: snapshot_prefix's folder)")
@click.option("--sigint-effect", type=click.Choice(["stop", "snapshot", "none"]), default="stop", show_default=True,
              help="what Ctrl-C does, at the next iteration boundary")
@click.option("--sighup-effect", type=click.Choice(["snapshot", "stop", "none"]), default="snapshot",
              show_default=True, help="what SIGHUP does")
@click.option("--debug-info", is_flag=True,
              help="at every display, log each blob's mean |data| and |diff| and each parameter's update ratio")
@click.option("--distributed", is_flag=True,
              help="be one rank of a data-parallel run started by mpiexec (needs the dist extra)")
@click.option("--collective-timeout", type=click.FloatRange(min=1), default=600, show_default=True,
              help="distributed: seconds a rank waits for the others before ending the run")
@click.option("--bucket-mb", type=click.FloatRange(min=0, min_open=True), default=25, show_default=True,
              help="distributed: MB of gradients sent together, while backward goes on")
@click.option("--processes", type=click.IntRange(min=1), default=None,
              help="start this many ranks on this machine (through mpiexec) and train as --distributed")
@user_errors
def train(solver_file, device, weights, resume, force, max_iter, seed, stages, level, run_dir, sigint_effect,
          sighup_effect, debug_info, distributed, collective_timeout, bucket_mb, processes):
    """Train the net of SOLVER_FILE, testing, logging and snapshotting as it says.

    With --distributed, run it as `mpiexec -n N netspec train SOLVER_FILE --distributed`:
    each of the N processes learns from its own share of every batch.  --processes N
    starts them on this machine for you.
    """
    from netspec.engine.comm import SingleProcess
    from netspec.training.distributed import MPICommunicator, launch

    if weights and resume:
        raise click.UsageError("give --weights (fine-tune) or --resume (continue), not both")
    if processes and distributed:
        raise click.UsageError("--processes starts the ranks itself; leave out --distributed")
    if processes and processes > 1:
        given = given_arguments(click.get_current_context(), leave_out={"processes"})
        sys.exit(launch(processes, ["train", *given, "--distributed"]))
    comm = MPICommunicator(collective_timeout, bucket_mb * 2 ** 20) if distributed else SingleProcess()
    with rank_errors(comm):
        train_run(comm, solver_file, device, weights, resume, force, max_iter, seed, stages, level, run_dir,
                  sigint_effect, sighup_effect, debug_info)


def given_arguments(context: click.Context, leave_out: set[str]) -> list[str]:
    """The command line arguments and options the user gave (not defaulted ones), rebuilt from their values."""
    arguments = []
    for param in context.command.params:
        source = context.get_parameter_source(param.name)
        if param.name in leave_out or source in (None, click.core.ParameterSource.DEFAULT):
            continue
        value = context.params[param.name]
        if isinstance(param, click.Argument):
            arguments.append(str(value))
        elif param.is_flag:
            arguments += [param.opts[0]] if value else []
        else:
            for item in value if param.multiple else [value]:
                arguments += [param.opts[0], str(item)]
    return arguments


def train_run(comm, solver_file, device, weights, resume, force, max_iter, seed, stages, level, run_dir,
              sigint_effect, sighup_effect, debug_info):
    """The body of ``netspec train``, run by every rank; rank 0 alone prints and writes."""
    import numpy

    from netspec.spec.solver_spec import parse_solver
    from netspec.training.log import TrainingLog
    from netspec.training.signals import signal_effects
    from netspec.training.solver import Solver

    root = comm.rank == 0
    say = click.echo if root else (lambda _text: None)
    spec = parse_solver(solver_file, layer_schemas(), list(solver_types()))
    if max_iter is not None:
        spec.params.max_iter, spec.params.max_epoch = max_iter, None
    if run_dir:
        spec.params.snapshot_prefix = os.path.join(os.path.abspath(run_dir), os.path.basename(spec.snapshot_prefix))
    run_dir = os.path.dirname(os.path.abspath(spec.snapshot_prefix))
    log = TrainingLog(run_dir=run_dir) if root else TrainingLog(quiet=True)
    solver = Solver(spec, device=device, seed=seed, stages=stages or None, level=level, log=log,
                    debug_info=debug_info, comm=comm)
    if resume:
        solver.restore(resume, force=force)
    if weights:
        say(solver.net.load_weights(weights, strict=False).summary(weights))
    if root:
        copy_configs(spec, os.path.join(run_dir, "config"))
    if comm.size > 1:
        for place in comm.places():
            say(place)
        if not any(name in os.environ for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")):
            say("note: OMP_NUM_THREADS is not set, so each process's math library may use every core; give "
                "each its share, e.g. OMP_NUM_THREADS=1 mpiexec -n 2 ... on 2 cores")
    epochs = solver.log.epoch(solver.params.max_iter)
    say(f"training net '{solver.net.name}' on {solver.backend.device}: {solver.params.type}, "
        f"{solver.params.max_iter} iterations" + (f" ({epochs:.2f} epochs)" if epochs else "")
        + f"; run folder {run_dir}")
    try:
        # a loss gone NaN or infinite is reported by the solver, naming the layer; NumPy's warnings would only add noise
        with signal_effects(solver, sigint_effect, sighup_effect), numpy.errstate(over="ignore", invalid="ignore"):
            solver.solve()
    finally:
        solver.close()


@main.command()
@click.argument("metrics_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", default="curves.png", show_default=True, type=click.Path(dir_okay=False),
              help="the PNG to write")
@user_errors
def plot(metrics_files, out):
    """Draw train loss, test outputs and learning rate of one or more runs (their metrics.jsonl) into a PNG."""
    from netspec.inspect.plots import plot_metrics

    plot_metrics(list(metrics_files), out)
    click.echo(f"wrote {out}")


@main.command("lr-plot")
@click.argument("solver_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", default="lr.png", show_default=True, type=click.Path(dir_okay=False),
              help="the PNG to write")
@click.option("--max-iter", type=click.IntRange(min=1), default=None, help="override max_iter")
@user_errors
def lr_plot(solver_file, out, max_iter):
    """Draw the learning rate SOLVER_FILE gives at every iteration, before training."""
    from netspec.inspect.plots import plot_learning_rate
    from netspec.spec.solver_spec import EPOCH_KEYS, parse_solver
    from netspec.training.solver import Solver

    spec = parse_solver(solver_file, layer_schemas(), list(solver_types()))
    params = spec.params
    if max_iter is not None:
        params.max_iter, params.max_epoch = max_iter, None
    if any(getattr(params, key) is not None for key in EPOCH_KEYS):
        params = Solver(spec).params  # the data's size turns epochs into iterations
    title = f"{os.path.basename(solver_file)}: {params.lr_policy}" + (
        f", {params.warmup_iter} warm-up iterations" if params.warmup_iter else "")
    iterations, rates = plot_learning_rate(params, out, title)
    click.echo(f"wrote {out}: lr {rates[0]:.6g} at iteration 0, {max(rates):.6g} at most, "
               f"{rates[-1]:.6g} at iteration {iterations[-1]}")


def copy_configs(spec, folder: str) -> None:
    """Save the exact solver text and the text of every net file it names, as read, into ``folder``.

    ``sources.json`` there records where they were read from (``netspec zoo publish --run`` uses it).
    """
    os.makedirs(folder, exist_ok=True)
    texts = {os.path.basename(spec.file) if spec.file else "solver.yaml": spec.text}
    texts.update({os.path.basename(path): text for path, text in spec.net_texts.items()})
    for name, text in texts.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    sources = {"solver": os.path.abspath(spec.file) if spec.file else None,
               "train_net": spec.train_net.file if spec.train_net.file in spec.net_texts else None}
    with open(os.path.join(folder, "sources.json"), "w", encoding="utf-8") as handle:
        json.dump(sources, handle, indent=1)


@main.command("test")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--weights", type=click.Path(dir_okay=False), required=True, help="trained weights (.weights.h5)")
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=50, show_default=True,
              help="batches to average over")
@click.option("--phase", type=click.Choice(["TRAIN", "TEST"], case_sensitive=False), default="TEST",
              show_default=True, help="phase to build")
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line holding every figure")
@user_errors
def test_command(net_file, weights, iterations, phase, stages, level, device, as_json):
    """Score trained WEIGHTS on NET_FILE: each output averaged over N batches."""
    from netspec.engine.net import load_net
    from netspec.training.log import format_outputs

    net = load_net(net_file, phase=phase.upper(), device=device, stages=stages or None, level=level)
    net.load_weights(weights)
    try:
        scores = net.score(iterations)
    finally:
        net.close()
    click.echo(f"net '{net.name}' ({net.phase}), weights {weights}, {iterations} batches of {net.batch_size}")
    click.echo(format_outputs(scores, net.output_loss_weights)
               or "the net has no one-element outputs to average")
    if as_json:
        click.echo(json.dumps({"net": net.name, "weights": weights, "iterations": iterations,
                               "batch_size": net.batch_size, "outputs": scores}))


@main.group()
def convert():
    """Turn datasets into files the data layers read."""


@convert.command("digits")
@click.argument("out_dir", type=click.Path(file_okay=False))
@user_errors
def convert_digits_command(out_dir):
    """Write scikit-learn's 8x8 digits to OUT_DIR as HDF5 (train.h5/test.h5 and list files)."""
    from netspec.tools.digits import convert_digits

    counts = convert_digits(out_dir)
    click.echo(f"wrote {counts['train']} training and {counts['test']} test digits to {out_dir} "
               f"(train.txt, test.txt list the HDF5 files)")


def parse_size(value: str | None) -> tuple[int, int] | None:
    """``HxW`` (e.g. 32x32) as ``(H, W)``."""
    if value is None:
        return None
    height, sep, width = value.lower().partition("x")
    if not sep or not height.isdigit() or not width.isdigit() or int(height) < 1 or int(width) < 1:
        raise click.BadParameter(f"expected HxW such as 32x32, got '{value}'", param_hint="--resize")
    return int(height), int(width)


@convert.command("imageset")
@click.argument("paths", nargs=-1, required=True, metavar="ROOT [LISTFILE] OUT")
@click.option("--backend", type=click.Choice(["lmdb", "hdf5"]), default="lmdb", show_default=True)
@click.option("--resize", metavar="HxW", default=None, help="resize every image to H x W (bilinear)")
@click.option("--gray", is_flag=True, help="one grey channel instead of RGB")
@click.option("--shuffle", is_flag=True, help="write the records in a random order (see --seed)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of --shuffle and --val-fraction")
@click.option("--encoded", type=click.Choice(["none", "png", "jpg"]), default="none", show_default=True,
              help="store records as raw pixels or as PNG/JPEG files (LMDB only)")
@click.option("--workers", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="all cores",
              help="decoding processes")
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.0,
              help="also write a validation set with this fraction of each class: OUT/train and OUT/val")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), default=None,
              help="class names, one a line (line k names label k); with class folders it fixes their labels")
@click.option("--strict", is_flag=True, help="stop at the first image that cannot be read instead of skipping it")
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists (once the new dataset is complete)")
@user_errors
def convert_imageset_command(paths, backend, resize, gray, shuffle, seed, encoded, workers, val_fraction,
                             labels_file, strict, overwrite):
    """Convert the images under ROOT into a dataset folder OUT that the Data layer reads.

    With LISTFILE, its lines are Caffe's 'relative/path label'; without it,
    each subfolder of ROOT is a class, labelled in sorted order (written to labels.txt).
    """
    from netspec.cli.progress import progress_bar
    from netspec.tools.imageset import ImagesetOptions, convert_imageset

    if len(paths) not in (2, 3):
        raise click.UsageError(f"expected ROOT [LISTFILE] OUT, got {len(paths)} path(s)")
    root, list_file, out = (paths[0], None, paths[1]) if len(paths) == 2 else paths
    if encoded != "none" and backend == "hdf5":
        raise click.UsageError("--encoded stores image files in LMDB records; HDF5 datasets hold raw pixels")
    options = ImagesetOptions(backend=backend, resize=parse_size(resize), gray=gray, shuffle=shuffle, seed=seed,
                              encoding="raw" if encoded == "none" else encoded, workers=workers,
                              val_fraction=val_fraction, strict=strict, overwrite=overwrite)
    report = convert_imageset(root, out, list_file, labels_file, options,
                              progress_factory=lambda total: progress_bar(total, "converting"))
    for problem in report.skipped:
        click.echo(f"skipped {problem}", err=True)
    for path, count in report.written.items():
        click.echo(f"wrote {count} records to {path}")
    if report.skipped:
        click.echo(f"skipped {len(report.skipped)} image(s) that could not be read (--strict stops instead)")


@convert.command("arrays")
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--data-key", default="data", show_default=True, help="the .npz array holding the rows")
@click.option("--label-key", default=None, help="the .npz array or .csv column holding labels [default: label, "
                                                 "when present]")
@click.option("--chunk", type=click.IntRange(min=1), default=4096, show_default=True, help="rows copied at a time")
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists")
@user_errors
def convert_arrays_command(source, out, data_key, label_key, chunk, overwrite):
    """Convert numeric rows (.npz, .npy, or .csv with a header) into the HDF5 file OUT (datasets data, label)."""
    from netspec.tools.arrays import convert_arrays

    shapes = convert_arrays(source, out, data_key, label_key, chunk, overwrite)
    click.echo(f"wrote {out}: " + ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
               + " (HDF5Data reads it as source)")


@main.command("compute-mean")
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the .npy to write (C x H x W)")
@user_errors
def compute_mean_command(dataset, out):
    """Write the per-pixel mean of DATASET's records (for transform_param.mean_file)."""
    import numpy

    from netspec.atomic import atomic_path
    from netspec.cli.progress import progress_bar
    from netspec.data.dataset import read_manifest
    from netspec.tools.mean import compute_mean

    count = read_manifest(dataset)["count"]
    with progress_bar(count, "averaging") as advance:
        mean = compute_mean(dataset, advance)
    with atomic_path(out) as temporary, open(temporary, "wb") as handle:
        numpy.save(handle, mean)
    channels = ", ".join(f"{value:.4g}" for value in mean.mean(axis=(1, 2)))
    click.echo(f"wrote the mean of {count} records to {out} (shape {list(mean.shape)}); per-channel means: "
               f"mean_value: [{channels}]")


@main.group()
def data():
    """Look into datasets."""


@data.command("inspect")
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("--grid", type=click.IntRange(min=1), default=4, show_default=True, help="samples per side of the grid")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="draw a grid of samples with their labels into this PNG")
@user_errors
def data_inspect_command(dataset, grid, out):
    """Show DATASET's record count, shapes, dtype and label histogram; with -o, a grid of samples."""
    from netspec.data.dataset import Dataset
    from netspec.tools.dataset_info import describe, sample_grid

    opened = Dataset(dataset)
    try:
        for line in describe(opened):
            click.echo(line)
        if out:
            shown = sample_grid(opened, grid, out)
            click.echo(f"wrote {len(shown)} samples to {out}")
    finally:
        opened.close()


# ---- the model zoo ------------------------------------------------------------------------------
zoo_option = click.option("--zoo", "zoo_dir", type=click.Path(file_okay=False), default=None,
                          help="zoo folder [default: $NETSPEC_ZOO, else ~/.local/share/netspec/zoo]")


def parse_floats(value: str | None, option: str) -> list[float] | None:
    """``1,2.5,3`` as floats."""
    if value is None:
        return None
    try:
        return [float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got '{value}'", param_hint=option) from None


@main.group()
def zoo():
    """Publish, share, download and check trained models."""


@zoo.command("publish")
@click.option("--name", required=True, help="model name (lower-case letters, digits, '.', '_', '-')")
@click.option("--version", "version", default="1", show_default=True)
@click.option("--net", "net_file", required=True, type=click.Path(dir_okay=False), help="the deploy net")
@click.option("--weights", required=True, type=click.Path(dir_okay=False), help="trained weights (.weights.h5)")
@click.option("--run", "run_dir", type=click.Path(file_okay=False), default=None,
              help="the training run folder: metrics, provenance, preprocessing and configs come from it")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), default=None,
              help="class names, one a line")
@click.option("--license", "license_", default="unspecified", show_default=True)
@click.option("--summary", default="", help="one line describing the model")
@click.option("--author", "authors", multiple=True, help="an author (repeatable)")
@click.option("--scale", type=float, default=None, help="input scale (default: the run's transform_param, else 1)")
@click.option("--mean-value", default=None, help="per-channel input mean, e.g. 104,117,123")
@click.option("--channels", type=click.Choice(["RGB", "GRAY"]), default=None,
              help="input channels [default: GRAY for 1 channel, RGB for 3]")
@zoo_option
@click.option("--force", is_flag=True, help="replace an existing name@version")
@user_errors
def zoo_publish(name, version, net_file, weights, run_dir, labels_file, license_, summary, authors, scale, mean_value,
                channels, zoo_dir, force):
    """Publish a deploy net and its trained weights as NAME@VERSION in a zoo."""
    from netspec.model_zoo.publish import PublishRequest, publish
    from netspec.model_zoo.zoo import Zoo

    request = PublishRequest(name=name, version=version, net=net_file, weights=weights, run_dir=run_dir,
                             labels_file=labels_file, license=license_, summary=summary, authors=list(authors),
                             scale=scale, mean_value=parse_floats(mean_value, "--mean-value"), channels=channels,
                             force=force)
    target = Zoo(zoo_dir)
    card = publish(request, target)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in card.metrics.items())
    click.echo(f"published {card.ref} to {target.folder(card.name, card.version)}"
               + (f" ({metrics})" if metrics else ""))


@zoo.command("list")
@zoo_option
@click.option("--from", "source", default=None, help="list another zoo (folder or URL) instead")
@click.option("--builtin", is_flag=True, help="the reference architectures shipped with netspec (no weights)")
@user_errors
def zoo_list(zoo_dir, source, builtin):
    """List the models of a zoo, each with its versions."""
    from netspec.inspect.report import format_table

    if builtin:
        from netspec.model_zoo.builtin import builtin_cards

        rows = [[c.name, "x".join(map(str, c.input.shape)), c.net, c.summary] for c in builtin_cards()]
        click.echo(format_table(["name", "input", "net (config only)", "summary"], rows))
        return
    index, where = zoo_index(zoo_dir, source)
    if not index["models"]:
        click.echo(f"{where}: no models")
        return
    rows = [[name, ", ".join(entry["versions"]), entry.get("task", ""), entry.get("summary", "")]
            for name, entry in index["models"].items()]
    click.echo(format_table(["name", "versions", "task", "summary"], rows))


def zoo_index(zoo_dir: str | None, source: str | None) -> tuple[dict, str]:
    """The index of the local zoo, or of a source folder or URL."""
    from netspec.model_zoo.download import open_source
    from netspec.model_zoo.zoo import INDEX, Zoo, check_index

    if source is None:
        local = Zoo(zoo_dir)
        return local.index(), local.root
    opened = open_source(source, timeout=30)
    try:
        return check_index(json.loads(opened.read(INDEX)), f"{source}/{INDEX}"), source
    except ValueError as exc:
        raise NetspecError(f"{source}/{INDEX}: not JSON ({exc})") from None


@zoo.command("show")
@click.argument("ref", metavar="NAME[@VERSION]")
@zoo_option
@user_errors
def zoo_show(ref, zoo_dir):
    """Print the card of a model (its README)."""
    from netspec.model_zoo.card import readme
    from netspec.model_zoo.zoo import Zoo

    click.echo(readme(Zoo(zoo_dir).card(ref)), nl=False)


@zoo.command("verify")
@click.argument("ref", metavar="[NAME[@VERSION]]", required=False)
@zoo_option
@user_errors
def zoo_verify(ref, zoo_dir):
    """Re-hash every file of one model (or of every model) against its card."""
    from netspec.model_zoo.zoo import Zoo, ZooError

    local = Zoo(zoo_dir)
    problems = local.verify(ref)
    if problems:
        raise ZooError(f"{len(problems)} problem(s): " + "; ".join(problems))
    click.echo(f"{ref or 'every model'} in {local.root}: every file matches its card")


@zoo.command("remove")
@click.argument("ref", metavar="NAME[@VERSION]")
@zoo_option
@user_errors
def zoo_remove(ref, zoo_dir):
    """Delete one version of a model, or all its versions."""
    from netspec.model_zoo.zoo import Zoo

    for removed in Zoo(zoo_dir).remove(ref):
        click.echo(f"removed {removed}")


@zoo.command("serve")
@zoo_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port")
@click.option("--verbose", is_flag=True, help="log every request")
@user_errors
def zoo_serve(zoo_dir, host, port, verbose):
    """Serve a zoo read-only over HTTP until interrupted."""
    from netspec.model_zoo.serve import make_server
    from netspec.model_zoo.zoo import Zoo

    local = Zoo(zoo_dir)
    local.index()  # refuse a broken zoo before serving it
    try:
        server = make_server(local.root, host, port, verbose)
    except OSError as exc:
        raise NetspecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    click.echo(f"serving {local.root} at http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@zoo.command("download")
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--from", "sources", multiple=True,
              help="folder or URL to look in (repeatable, tried in order) [default: the sources of "
                   "~/.config/netspec/zoo.yaml]")
@zoo_option
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30, show_default=True,
              help="seconds without data before giving up")
@click.option("--force", is_flag=True, help="replace the model if the zoo already has that version")
@user_errors
def zoo_download(ref, sources, zoo_dir, timeout, force):
    """Download a model, check the size and sha256 of every file, then install it."""
    from netspec.cli.progress import progress_bar
    from netspec.model_zoo.download import configured_sources, download, open_source
    from netspec.model_zoo.zoo import Zoo

    opened = [open_source(s, timeout) for s in (sources or configured_sources())]
    local = Zoo(zoo_dir)
    card = download(ref, opened, local, force=force,
                    progress_factory=lambda total: progress_bar(total, "downloading", in_bytes=True))
    size = sum(f.size for f in card.files)
    click.echo(f"installed {card.ref} ({len(card.files)} files, {size} bytes, all verified) in "
               f"{local.folder(card.name, card.version)}")


@main.command()
@click.argument("model")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--top-k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of lines")
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@zoo_option
@user_errors
def predict(model, inputs, top_k, as_json, device, zoo_dir):
    """Classify image files (or .npy arrays) with MODEL, a zoo name[@version] or a model folder."""
    from netspec.model_zoo.card import read_card
    from netspec.model_zoo.predict import load, model_folder, read_inputs
    from netspec.model_zoo.predict import predict as predict_inputs

    folder = model_folder(model, zoo_dir)
    prepared = read_inputs(list(inputs), read_card(folder))
    net, card = load(folder, device=device, batch_size=min(len(prepared), 64))
    results = predict_inputs(net, card, folder, prepared, top_k)
    if as_json:
        click.echo(json.dumps({"model": card.ref, "results": results}))
        return
    for result in results:
        best = ", ".join(f"{p['name']} {p['probability']:.4f}" for p in result["predictions"])
        click.echo(f"{result['input']}: {best}")


@main.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@user_errors
def render(net_file):
    """Print NET_FILE with its modules, repeats and includes expanded: a plain net file."""
    import yaml

    from netspec.spec.modules import render_net

    click.echo(yaml.safe_dump(render_net(net_file), sort_keys=False, default_flow_style=None, width=120), nl=False)


@main.command()
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="net.dot, net.svg or net.png")
@phase_option
@stage_option
@level_option
@click.option("--rankdir", type=click.Choice(["TB", "LR"]), default="TB", show_default=True,
              help="top to bottom or left to right")
@user_errors
def draw(net_file, out, phase, stages, level, rankdir):
    """Draw NET_FILE's layer graph with blob shapes on the edges (.svg/.png need Graphviz's dot)."""
    from netspec.inspect.drawing import draw as draw_graph

    graph = compile_net(parse_net(net_file, layer_schemas()), phase=phase.upper() if phase else None,
                        stages=stages or None, level=level)
    draw_graph(graph, out, rankdir)
    click.echo(f"wrote {out} ({len(graph.nodes)} layers)")


@main.group()
def export():
    """Write nets in other formats."""


@export.command("onnx")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.option("--weights", required=True, type=click.Path(dir_okay=False), help="trained weights (.weights.h5)")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the .onnx file to write")
@click.option("--opset", type=click.IntRange(13, 21), default=17, show_default=True, help="ONNX opset version")
@stage_option
@level_option
@user_errors
def export_onnx_command(net_file, weights, out, opset, stages, level):
    """Export NET_FILE's inference (TEST) graph with its weights as an ONNX model."""
    from netspec.atomic import atomic_path
    from netspec.engine.net import load_net
    from netspec.interop.onnx_export import export_onnx

    net = load_net(net_file, phase="TEST", stages=stages or None, level=level)
    net.load_weights(weights)
    with atomic_path(out) as temporary:
        export_onnx(net, temporary, opset)
    click.echo(f"wrote {out} (opset {opset}, {len(net.nodes)} layers, inputs "
               f"{', '.join(f'{n} {list(net.blobs[n].shape)}' for n in net.data_layer().spec.tops)})")


@main.group("import")
def import_group():
    """Bring nets, solvers and weights over from Caffe."""


imported_yaml_option = click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
                                    help="the YAML to write [default: beside the input, .yaml]")


def write_imported(prototxt: str, out: str | None, data: dict, command: str, check=None) -> str:
    """Write imported ``data`` as YAML (default: beside the .prototxt); ``check(text)`` may refuse it first."""
    import yaml

    out = out or os.path.splitext(prototxt)[0] + ".yaml"
    text = (f"# imported from {os.path.basename(prototxt)} by netspec import {command}\n"
            + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))
    if check is not None:
        check(text)
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(text)
    return out


def echo_report(report) -> None:
    """The fields an import dropped, and its notes."""
    for item in report.dropped:
        click.echo(f"dropped (no netspec equivalent): {item}")
    for note in report.notes:
        click.echo(f"note: {note}")


@import_group.command("caffe")
@click.argument("prototxt", type=click.Path(dir_okay=False))
@imported_yaml_option
@user_errors
def import_caffe(prototxt, out):
    """Convert a Caffe net (.prototxt, current or V1 format) into a netspec net file."""
    from netspec.interop.caffe_import import import_net
    from netspec.interop.prototxt import read_prototxt

    net, report = import_net(read_prototxt(prototxt))
    out = write_imported(prototxt, out, net, "caffe", check=lambda text: parse_net(text, layer_schemas()))
    click.echo(f"wrote {out} ({len(net['layers'])} layers)")
    echo_report(report)


@import_group.command("caffemodel")
@click.argument("prototxt", type=click.Path(dir_okay=False))
@click.argument("caffemodel", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the netspec weights to write")
@user_errors
def import_caffemodel(prototxt, caffemodel, out):
    """Convert Caffe weights (.caffemodel) for the net of PROTOTXT into a netspec weights file."""
    import yaml

    from netspec.engine.net import load_net
    from netspec.interop.caffe_import import copy_caffemodel, import_net
    from netspec.interop.caffemodel import read_caffemodel
    from netspec.interop.prototxt import read_prototxt

    spec, _ = import_net(read_prototxt(prototxt))
    net = load_net(yaml.safe_dump(spec, sort_keys=False), phase="TEST")
    missing, unused = copy_caffemodel(net, read_caffemodel(caffemodel), caffemodel)
    net.save_weights(out)
    click.echo(f"wrote {out}: {len(net.owned_params()) - len(missing)} layer(s) of weights")
    if missing:
        click.echo(f"not in the caffemodel (keep their fillers): {', '.join(missing)}")
    if unused:
        click.echo(f"in the caffemodel but not the net: {', '.join(unused)}")


@import_group.command("caffe-solver")
@click.argument("prototxt", type=click.Path(dir_okay=False))
@imported_yaml_option
@user_errors
def import_caffe_solver(prototxt, out):
    """Convert a Caffe solver (.prototxt) into a netspec solver file."""
    from netspec.interop.caffe_import import import_solver
    from netspec.interop.prototxt import read_prototxt

    solver, report = import_solver(read_prototxt(prototxt))
    click.echo(f"wrote {write_imported(prototxt, out, solver, 'caffe-solver')}")
    echo_report(report)
