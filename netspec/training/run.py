"""A whole training run as ``netspec train`` makes it: solver, run folder, resume or fine-tune, signals, solve.

Every rank of a distributed run calls :func:`train`; rank 0 alone prints
(through ``say``) and writes.  The command line only parses options into a
:class:`TrainOptions` and reports errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy

from netspec.engine.comm import SingleProcess
from netspec.engine.registry import layer_schemas, solver_types
from netspec.engine.trust import OWN, Trust
from netspec.errors import ConfigError, DivergedError, NetspecError, StateError
from netspec.solvers.lr_policies import rate_problem
from netspec.spec.net_spec import with_batch_size
from netspec.spec.solver_spec import SolverParams, SolverSpec, parse_solver
from netspec.threads import pools_sized, thread_counts
from netspec.training import checkpoint, run_folder
from netspec.training.log import TrainingLog
from netspec.training.signals import signal_effects
from netspec.training.solver import Solver


@dataclass
class TrainOptions:
    """What ``netspec train`` takes besides the solver file; None leaves the file's setting."""

    device: str | None = None
    weights: str | None = None  # fine-tune: start from these weights, copied by layer name
    resume: str | None = None  # continue from this .solverstate.h5
    force: bool = False  # resume even if the net or solver file changed
    max_iter: int | None = None
    base_lr: float | None = None
    batch_size: int | None = None  # rows per batch of the train net's data layers
    seed: int | None = None
    stages: tuple[str, ...] = ()
    level: int | None = None
    run_dir: str | None = None  # the run folder (default: snapshot_prefix's folder)
    sigint_effect: str = "stop"
    sighup_effect: str = "snapshot"
    debug_info: bool = False
    precision: str | None = None  # fp32, tf32, bf16-mixed or fp16-mixed (None: the solver's)
    cuda_graph: bool = False  # train each iteration as one CUDA graph (as the solver's cuda_graph: true does)
    tensorboard: bool = False  # also write TensorBoard event files (as the solver's tensorboard: true does)
    trust: Trust = OWN  # Python layers import their modules; files are written inside the run folder


def read_solver(solver_file: str, max_iter: int | None = None, base_lr: float | None = None,
                batch_size: int | None = None) -> SolverSpec:
    """Parse a solver file with its nets; ``max_iter`` replaces the file's length (in iterations or epochs),
    ``base_lr`` its rate and ``batch_size`` that of the train net's data layers (:func:`with_batch_size`)."""
    spec = parse_solver(solver_file, layer_schemas(), list(solver_types()))
    if max_iter is not None:
        spec.params.max_iter, spec.params.max_epoch = max_iter, None
    if base_lr is not None:
        spec.params.base_lr = base_lr
    if batch_size is not None:
        spec.train_net = with_batch_size(spec.train_net, batch_size, "TRAIN")
    return spec


def schedule_params(spec: SolverSpec) -> SolverParams:
    """The solver's parameters with epoch counts turned into iterations.

    Epochs need the train data's size, so a solver counting them builds its nets (and closes them).  A schedule
    without a finite rate at some iteration is a ConfigError, as when a Solver is built.
    """
    if not spec.epoch_keys:
        if (why := rate_problem(spec.params)) is not None:
            raise ConfigError(spec.problem(why, "lr_policy"))
        return spec.params
    solver = Solver(spec)
    try:
        return solver.params
    finally:
        solver.close()


def train(solver_file: str, options: TrainOptions, comm=None, say: Callable[[str], None] = print) -> Solver:
    """Train as the solver file says, in its run folder; returns the closed solver (its state after the run).

    The run folder is ``run_dir``, else the folder of the state a resumed run
    continues, else the folder of the solver's ``snapshot_prefix``.  ``comm``
    makes this process one rank of a distributed run.  Signals act at the
    next iteration boundary (``sigint_effect``, ``sighup_effect``).
    """
    comm = comm or SingleProcess()
    root = comm.rank == 0
    spec = read_solver(solver_file, options.max_iter, options.base_lr, options.batch_size)
    spec.params.cuda_graph = spec.params.cuda_graph or options.cuda_graph
    spec.params.precision = options.precision or spec.params.precision
    if options.resume and not os.path.isfile(options.resume):
        raise StateError(f"{options.resume}: no such solver state file")
    resumed_in = os.path.dirname(os.path.abspath(options.resume)) if options.resume else None
    if options.run_dir or resumed_in:
        spec.params.snapshot_prefix = run_folder.prefix_in(options.run_dir or resumed_in, spec.snapshot_prefix)
    folder = run_folder.folder_of(spec.snapshot_prefix)
    if not root:
        return _train(spec, folder, options, comm, _silent)
    with run_folder.locked(folder):
        left = run_folder.remove_leftovers(folder)
        if left:
            say(f"removed {len(left)} temporary file(s) an interrupted run left in {folder}")
        if folder != resumed_in:  # a fresh run, or a resumed one moving to --out: the folder must hold no other run
            run_folder.refuse_used(folder)
        run_folder.clear_outcome(folder)
        try:
            solver = _train(spec, folder, options, comm, say)
        except NetspecError as exc:
            if os.path.exists(run_folder.metrics_path(folder)):  # one that failed before training leaves no trace
                run_folder.write_outcome(folder, "diverged" if isinstance(exc, DivergedError) else "failed", str(exc))
            raise
        run_folder.write_outcome(folder, *_outcome(solver))
        return solver


def _outcome(solver: Solver) -> tuple[str, str]:
    """How a training that returned ended: stopped by a signal, or finished (perhaps early)."""
    if solver.interrupted:
        return "stopped", solver.stop_reason
    return "finished", solver.stop_reason or f"optimization done at iteration {solver.iter}"


def _train(spec: SolverSpec, folder: str, options: TrainOptions, comm, say: Callable[[str], None]) -> Solver:
    """The run itself, in ``folder`` (whose lock rank 0 holds)."""
    root = comm.rank == 0
    tensorboard = options.tensorboard or spec.params.tensorboard
    log = TrainingLog(run_dir=folder, tensorboard=tensorboard) if root else TrainingLog(quiet=True)
    if options.resume:
        checkpoint.take_threads(options.resume)
    solver = Solver(spec, device=options.device, seed=options.seed, stages=options.stages or None,
                    level=options.level, log=log, debug_info=options.debug_info, comm=comm,
                    trust=options.trust, reuse_memory=True)
    try:
        if options.resume:
            solver.restore(options.resume, force=options.force)
            if root:
                log.kept_events = run_folder.truncate_metrics(folder, solver.iter,
                                                              solver.tests_on_resuming_at(solver.iter))
        solver.folder_checked = True  # (train checked it as it took its lock)
        if options.weights:
            say(solver.net.load_weights(options.weights, strict=False).summary(options.weights))
        if root:
            run_folder.write_configs(folder, spec)
        if comm.size > 1:
            _describe_ranks(comm, say)
        epochs = solver.log.epoch(solver.params.max_iter)
        say(f"training net '{solver.net.name}' on {solver.backend.device}: {solver.params.type}, "
            f"{solver.params.max_iter} iterations" + (f" ({epochs:.2f} epochs)" if epochs else "")
            + f"; run folder {folder}")
        say(f"paths: {solver.net.paths()}; threads: {thread_counts()}")
        for line in solver.warnings:
            say(line)
        # a loss gone NaN or infinite is reported by the solver, naming the layer; NumPy's warnings would only add noise
        with signal_effects(solver, options.sigint_effect, options.sighup_effect), \
                numpy.errstate(over="ignore", invalid="ignore"):
            solver.solve()
    finally:
        solver.close()
    return solver


def _describe_ranks(comm, say: Callable[[str], None]) -> None:
    """Where each rank runs, and a note when the ranks may fight over the cores."""
    for place in comm.places():
        say(place)
    if not pools_sized():
        say("note: neither --threads nor OMP_NUM_THREADS is set, so each process's math library may use every "
            "core; give each its share, e.g. mpiexec -n 2 netspec train ... --threads 1 on 2 cores")


def _silent(_text: str) -> None:
    """Ranks other than 0 print nothing."""
