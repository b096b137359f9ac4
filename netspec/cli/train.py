"""Commands about training: train (one process, or ranks through mpiexec), plot, lr-plot."""

from __future__ import annotations

import os
import sys

import click

from netspec.cli.errors import rank_errors, user_errors
from netspec.cli.options import (
    Integer,
    Real,
    level_option,
    no_python_layers_option,
    outputs_anywhere_option,
    own_net_trust,
    stage_option,
    threads_option,
)
from netspec.engine.comm import SingleProcess
from netspec.inspect.plots import plot_learning_rate, plot_metrics
from netspec.training.distributed import MPICommunicator, launch
from netspec.training.run import TrainOptions, read_solver, schedule_params
from netspec.training.run import train as train_run
from netspec.training.signals import exit_status


@click.command()
@click.argument("solver_file", type=click.Path(dir_okay=False))
@click.option("--device", default=None, help="cpu, gpu or gpu:N (default: the file's solver_mode)")
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="fine-tune: start from these weights, copied by layer name")
@click.option("--resume", type=click.Path(dir_okay=False), default=None, help="continue from a .solverstate.h5")
@click.option("--force", is_flag=True, help="resume even if the net or solver file changed")
@click.option("--max-iter", type=Integer(min=1), default=None, help="override max_iter")
@click.option("--base-lr", type=Real(min=0, min_open=True), default=None, help="override base_lr")
@click.option("--batch-size", type=Integer(min=1), default=None,
              help="override the batch_size of the train net's data layers (test nets keep theirs)")
@click.option("--seed", type=Integer(), default=None, help="override random_seed")
@stage_option
@level_option
@click.option("--out", "run_dir", type=click.Path(file_okay=False), default=None,
              help="run folder for snapshots, metrics.jsonl and config copies (default: the --resume state's "
                   "folder, else snapshot_prefix's folder)")
@click.option("--sigint-effect", type=click.Choice(["stop", "snapshot", "none"]), default="stop", show_default=True,
              help="what Ctrl-C does, at the next iteration boundary")
@click.option("--sighup-effect", type=click.Choice(["snapshot", "stop", "none"]), default="snapshot",
              show_default=True, help="what SIGHUP does")
@outputs_anywhere_option
@no_python_layers_option
@click.option("--debug-info", is_flag=True,
              help="at every display, log each blob's mean |data| and |diff| and each parameter's update ratio")
@click.option("--precision", type=click.Choice(["fp32", "tf32", "bf16-mixed", "fp16-mixed"]), default=None,
              help="on a GPU, how float32 products and convolutions compute: fp32, tf32, or from bfloat16 or float16 "
                   "operands (bf16-mixed, fp16-mixed with loss scaling; default: the solver's precision)")
@click.option("--cuda-graph", is_flag=True,
              help="on a GPU, train each iteration as one CUDA graph once warm (as the solver's cuda_graph: true "
                   "does); a net that cannot be captured trains without, saying why")
@click.option("--tensorboard", is_flag=True,
              help="also write TensorBoard event files into RUN/tensorboard/ (as the solver's tensorboard: true "
                   "does; needs the tensorboard extra)")
@click.option("--distributed", is_flag=True,
              help="be one rank of a data-parallel run started by mpiexec (needs the dist extra)")
@click.option("--collective-timeout", type=Real(min=1), default=600, show_default=True,
              help="distributed: seconds a rank waits for the others before ending the run")
@click.option("--bucket-mb", type=Real(min=0, min_open=True), default=25, show_default=True,
              help="distributed: MB of gradients sent together, while backward goes on")
@click.option("--processes", type=Integer(min=1), default=None,
              help="start this many ranks on this machine (through mpiexec) and train as --distributed")
@threads_option
@user_errors
def train(solver_file, device, weights, resume, force, max_iter, base_lr, batch_size, seed, stages, level, run_dir,
          sigint_effect, sighup_effect, outputs_anywhere, no_python_layers, debug_info, precision, cuda_graph,
          tensorboard, distributed, collective_timeout, bucket_mb, processes):
    """Train the net of SOLVER_FILE, testing, logging and snapshotting as it says.

    With --distributed, run it as `mpiexec -n N netspec train SOLVER_FILE --distributed`:
    each of the N processes learns from its own share of every batch.  --processes N
    starts them on this machine for you.
    """
    if weights and resume:
        raise click.UsageError("give --weights (fine-tune) or --resume (continue), not both")
    if processes and distributed:
        raise click.UsageError("--processes starts the ranks itself; leave out --distributed")
    if processes and processes > 1:
        context = click.get_current_context()
        given = given_arguments(context, leave_out={"processes", "threads"})  # (--threads: not a parameter)
        threads = ["--threads", str(context.meta["threads"])] if context.meta["threads"] else []  # else: a share each
        sys.exit(launch(processes, ["train", *given, "--distributed", *threads]))
    comm = MPICommunicator(collective_timeout, bucket_mb * 2 ** 20) if distributed else SingleProcess()
    options = TrainOptions(device=device, weights=weights, resume=resume, force=force, max_iter=max_iter,
                           base_lr=base_lr, batch_size=batch_size, seed=seed, stages=stages, level=level,
                           run_dir=run_dir, sigint_effect=sigint_effect, sighup_effect=sighup_effect,
                           debug_info=debug_info, precision=precision, cuda_graph=cuda_graph,
                           tensorboard=tensorboard,
                           trust=own_net_trust(no_python_layers, outputs_anywhere, "training"))
    with rank_errors(comm):
        solver = train_run(solver_file, options, comm, say=click.echo)
        if solver.interrupted:
            sys.exit(exit_status(solver.interrupted))


def given_arguments(context: click.Context, leave_out: set[str]) -> list[str]:
    """The command line arguments and options the user gave (not defaulted ones, not ``leave_out``), rebuilt from
    their values."""
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


@click.command()
@click.argument("metrics_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", default="curves.png", show_default=True, type=click.Path(dir_okay=False),
              help="the picture to write (.png, .svg or .pdf)")
@user_errors
def plot(metrics_files, out):
    """Draw train loss, test outputs and learning rate of one or more runs (their metrics.jsonl) into a PNG."""
    plot_metrics(list(metrics_files), out)
    click.echo(f"wrote {out}")


@click.command("lr-plot")
@click.argument("solver_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", default="lr.png", show_default=True, type=click.Path(dir_okay=False),
              help="the picture to write (.png, .svg or .pdf)")
@click.option("--max-iter", type=Integer(min=1), default=None, help="override max_iter")
@user_errors
def lr_plot(solver_file, out, max_iter):
    """Draw the learning rate SOLVER_FILE gives at every iteration, before training."""
    params = schedule_params(read_solver(solver_file, max_iter))
    title = f"{os.path.basename(solver_file)}: {params.lr_policy}" + (
        f", {params.warmup_iter} warm-up iterations" if params.warmup_iter else "")
    iterations, rates = plot_learning_rate(params, out, title)
    click.echo(f"wrote {out}: lr {rates[0]:.6g} at iteration 0, {max(rates):.6g} at most, "
               f"{rates[-1]:.6g} at iteration {iterations[-1]}")
