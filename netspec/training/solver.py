"""The training loop shared by every update rule (docs/pages/concepts/semantics.md), with testing, snapshots and resume.

One iteration, in Caffe's order: test when due, forward/backward ``iter_size``
times with parameter diffs accumulating, log when due, then the update
(learning rate from the policy, then :class:`netspec.training.optimizer.Optimizer`:
global-norm clipping, division by ``iter_size``, weight decay, the rule,
``w -= step``), then a snapshot when due.  The loss stays on the device until :meth:`Solver.read_losses` brings
the unread ones back in one copy (every iteration on the CPU; on a GPU at display, test and snapshot time, so
the loop never waits for it).  Everything random comes from one seeded backend, and a snapshot holds
every buffer, data position and generator state, so a resumed run continues
bit for bit.

With a communicator of several ranks (:mod:`netspec.training.distributed`) every rank
runs this loop on its share of the data: rank 0's weights are given to all
before the first iteration, gradients (with the loss and any signal's
request) are averaged after backward, test scores are averaged over the
ranks' shares, and only rank 0 writes files.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import signal
import time

import numpy

from netspec.engine.backend import Backend
from netspec.engine.classes import class_problems
from netspec.engine.comm import SingleProcess
from netspec.engine.net import Net, compile_net
from netspec.engine.one_pass import OnePass
from netspec.engine.registry import layer_schemas, solver_class, solver_types
from netspec.engine.trust import OWN, Trust
from netspec.errors import ConfigError, DeviceError, DivergedError, EventsError, Problem
from netspec.solvers.lr_policies import learning_rate, rate_problem
from netspec.spec.net_spec import with_batch_size
from netspec.spec.solver_spec import TEST_EPOCH, SolverSpec, parse_solver
from netspec.training import checkpoint, run_folder
from netspec.training.distributed import GradientExchange, agreed_seed, mean_over_ranks, share_weights
from netspec.training.graphed import GraphedIterations, why_not_graphed
from netspec.training.log import TrainingLog, format_value
from netspec.training.loss_scale import LossScale
from netspec.training.optimizer import Optimizer
from netspec.training.per_class import PerClassAccuracy
from netspec.training.watch import unwatchable_outputs, watches

READ_EVERY = 100  # on a GPU, iterations between reads of the loss when nothing is displayed


def data_source(net: Net) -> str:
    """Where ``net``'s records come from, for a message saying their count is unknown."""
    layer = net.data_layer()
    if layer is None:
        return "it has no data layer"
    return f"its data layer '{layer.name}' ({layer.type}) does not know its size"


class Solver:
    """A train net, its test nets (sharing the train net's weights) and an update rule.

    ``device``, ``seed``, ``stages`` and ``level`` override the solver file
    (``solver_mode``/``device_id``, ``random_seed``, ``train_state``/``test_state``).
    ``comm`` is the distributed run this process is a rank of (default: none).
    ``trust`` says what the nets may do (:class:`~netspec.engine.trust.Trust`;
    by default a user's own: Python layers import their modules, layers that
    write files write inside the run folder; the dashboard starts its runs
    with Python layers refused).  The test nets run forward passes only (their
    layers fused as in :func:`netspec.load_net` with ``inference``).  With
    ``reuse_memory`` (as ``netspec train`` runs) the train net's diffs and the
    test nets' data share buffers where their lifetimes allow (see
    :class:`netspec.Net`); ``debug_info``, which prints every blob's diff,
    turns it off.
    """

    def __init__(self, spec: SolverSpec, device: str | None = None, seed: int | None = None, stages=None,
                 level: int | None = None, dtype=numpy.float32, log: TrainingLog | None = None,
                 debug_info: bool = False, comm=None, trust: Trust = OWN, reuse_memory: bool = False):
        p = spec.params
        self.spec = spec
        if seed is None and p.random_seed >= 0:
            seed = p.random_seed
        self.comm = comm = comm or SingleProcess()
        self.backend = self._backend(device, seed)
        self.backend.deterministic = p.deterministic
        self.backend.precision = p.precision if self.backend.is_gpu else "fp32"
        self.loss_scale = LossScale() if self.backend.precision == "fp16-mixed" else None
        self.output_folder = trust.output_folder(run_folder.folder_of(spec.snapshot_prefix))
        self.reuse_memory = reuse_memory and not debug_info
        self.trust = trust
        self.net = self._build(spec.train_net, "TRAIN", p.train_state, stages, level, dtype, self.backend)
        self.loss_weights = self.net.output_loss_weights
        if not self.net.has_loss():
            raise ConfigError(Problem(f"net '{self.net.name}' has no loss in the TRAIN phase, so there is nothing "
                                      "to minimise (add e.g. a SoftmaxWithLoss layer, or a loss_weight)",
                                      file=spec.train_net.file or spec.file or "<string>"))
        self.test_backend = self.backend.fork()  # testing draws its own random numbers, never training's
        self.test_nets, self.test_passes = [], []  # a test net's OnePass where its test_iter is epoch, else None
        for index, net_spec in enumerate(spec.test_nets):
            state = p.test_state[index] if p.test_state else None
            net = self._build(net_spec, "TEST", state, stages, level, dtype, self.test_backend, inference=True)
            net.share_trained_layers(self.net)
            self.test_nets.append(net)
            self.test_passes.append(self._one_pass(index, net, functools.partial(
                self._build, phase="TEST", state=state, stages=stages, level=level, dtype=dtype,
                backend=self.test_backend, inference=True), net_spec) if p.test_iter[index] == TEST_EPOCH else None)
        self.iterations_per_epoch = self._iterations_per_epoch()
        self.params = p = spec.in_iterations(self.iterations_per_epoch, data_source(self.net))
        rule_cls = solver_class(p.type)
        problems = [spec.problem(message, key) for key, message in rule_cls.check(p)]
        if (why := rate_problem(p)) is not None:
            problems.append(spec.problem(why, "lr_policy"))
        problems += [spec.problem(message, key) for key, message in unwatchable_outputs(p, self.test_nets)]
        checked = [class_problems(net.graph) for net in (self.net, *self.test_nets)]
        problems += list({(error.file, error.line, error.layer): error  # (one a classifier, of TRAIN's or TEST's)
                          for errors, _ in checked for error in errors}.values())
        if problems:
            raise ConfigError(problems)
        self.warnings = list(dict.fromkeys(line for _, lines in checked for line in lines))  # (said when it starts)
        self.warnings += [f"note: test net {index}: {coverage} (test_iter {iterations})"
                          for index, (net, iterations) in enumerate(zip(self.test_nets, p.test_iter))
                          if iterations != TEST_EPOCH and (coverage := net.coverage(iterations))]
        self.warnings += [f"note: test net {index}: {one_pass.note}" for index, one_pass in enumerate(self.test_passes)
                          if one_pass is not None and one_pass.note]
        self.learnable = self.net.learnable_params()
        self.optimizer = Optimizer(rule_cls, p, self.net.learnable_groups(), self.backend, self.net.dtype)
        self.exchange = GradientExchange(comm, self.net, self.learnable)
        self.weights_agreed = comm.size == 1
        self.iter = 0
        self.losses: collections.deque[float] = collections.deque(maxlen=p.average_loss)
        self.unread: list[tuple[int, object]] = []  # (iteration, its loss on the device) not read back yet
        self.culprit: tuple[str, str] | None = None  # the first non-finite output, noted where reads are free
        # iterations between reads of the loss: every one on the CPU, where a read costs nothing; on a GPU at
        # display time only (or every READ_EVERY), so that training never waits for the device
        self.read_every = (p.display or READ_EVERY) if self.backend.is_gpu else 1
        self.log = log or TrainingLog()
        self.log.iterations_per_epoch = self.iterations_per_epoch
        self.debug_info = debug_info
        self.requested: str | None = None
        self.requested_by: signal.Signals | None = None
        self.stop_reason: str | None = None
        self.interrupted: signal.Signals | None = None  # the signal that stopped training
        self.last_test_iter: int | None = None
        self.snapshot_pending = False  # a periodic snapshot waits for its iteration's test (:meth:`step`)
        self.last_snapshot: str | None = None
        self.last_snapshot_iter: int | None = None
        # whether the folder its snapshots go to was found to hold no other run's (netspec train checks it as it
        # starts; from Python, the first snapshot does, unless the solver continues a state of that folder)
        self.folder_checked = False
        self.snapshots: list[int] = []
        self.best, self.plateau = watches(p)
        if p.precision != "fp32" and not self.backend.is_gpu:
            why = "the CPU has no TF32" if p.precision == "tf32" else "netspec mixes precisions on a GPU only"
            self.warnings.append(f"precision {p.precision}: {why}, so training computes in fp32")
        self.graphed: GraphedIterations | None = None  # the iterations as a CUDA graph (cuda_graph)
        if p.cuda_graph:
            why = why_not_graphed(self)
            if why is None:
                self.graphed = GraphedIterations(self)
            else:
                self.warnings.append(f"cuda_graph: {why}: training runs without graphs")

    def _backend(self, device: str | None, seed: int | None) -> Backend:
        """The device to train on: ``device``, else the file's ``solver_mode``/``device_id`` (located if unusable)."""
        p = self.spec.params
        chosen = device if device is not None else "cpu" if p.solver_mode == "CPU" else f"gpu:{p.device_id}"
        try:
            return Backend(chosen, agreed_seed(self.comm, seed, chosen), self.comm)
        except DeviceError as exc:
            if device is not None:
                raise
            raise ConfigError(self.spec.problem(f"{exc}; pass --device cpu to train on the CPU",
                                                "solver_mode")) from None

    def _iterations_per_epoch(self) -> float | None:
        """Iterations per pass over the train data, when its data layer knows its record count."""
        layer = self.net.data_layer()
        records = layer.record_count() if layer is not None else None
        return records / self.effective_batch_size if records else None

    def _one_pass(self, index: int, net: Net, build, net_spec) -> OnePass:
        """The scorer of test net ``index`` over one pass of its data (``test_iter: epoch``), its last records
        through a tail that ``build`` makes from ``net_spec``; ConfigError where the net's data layer cannot
        tell its size."""
        if not net.record_count():
            raise ConfigError(self.spec.problem(f"test net {index} is tested over one pass of its data (epoch), "
                                                f"but {data_source(net)}: give its batches per test pass",
                                                "test_iter"))
        return OnePass(net, lambda batch: build(with_batch_size(net_spec, batch, "TEST")), self.comm.rank,
                       self.comm.size)

    @property
    def effective_batch_size(self) -> int:
        """Records one update learns from: the batch size times ``iter_size`` times the number of ranks."""
        return self.net.batch_size * self.spec.params.iter_size * self.comm.size

    def _build(self, net_spec, phase, state, stages, level, dtype, backend, inference: bool = False) -> Net:
        if stages is None and state is not None:
            stages = state.stage
        if level is None and state is not None:
            level = state.level
        graph = compile_net(net_spec, phase=phase, stages=stages, level=level, trust=self.trust)
        return Net(graph, dtype=dtype, backend=backend, output_folder=self.output_folder, inference=inference,
                   reuse_memory=self.reuse_memory)

    @property
    def rule(self):
        """The update rule, with its history buffers."""
        return self.optimizer.rule

    # ---- the loop ---------------------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The policy's rate at the current iteration."""
        return learning_rate(self.params, self.iter)

    def request(self, action: str, by: signal.Signals | None = None) -> None:
        """Ask for ``snapshot`` or ``stop`` at the next iteration boundary; signal handlers pass their signal."""
        if action == "stop" or self.requested is None:
            self.requested, self.requested_by = action, by

    @property
    def stopped_early(self) -> bool:
        """True when training stopped before ``max_iter`` (a requested stop or early stopping)."""
        return self.stop_reason is not None

    def step(self, iterations: int, finish_snapshots: bool = True) -> None:
        """Run ``iterations`` iterations (fewer if a stop is requested or early stopping triggers).

        A periodic snapshot due at an iteration that also tests is written once that test has run, so that its
        state holds what the test found (a run resumed from it neither counts the test twice nor declares its
        best again); at the last iteration that waits for the next call, unless ``finish_snapshots``.
        """
        p = self.params
        if p.snapshot or p.snapshot_best is not None:  # (before training: never a run trained, then refused)
            checkpoint.claim_folder(self)
        if not self.weights_agreed:
            share_weights(self.comm, self.net)
            self.weights_agreed = True
        stop_at = self.iter + iterations
        window_start, window_iter, window_comm = time.perf_counter(), self.iter, self.comm.seconds
        while self.iter < stop_at:
            plateaued = False
            if self.tests_at(self.iter) and self.last_test_iter != self.iter:
                self.test_all()
                plateaued = self.plateau is not None and self.plateau.stale >= p.early_stop.patience
            self.write_pending_snapshot()
            if plateaued:
                self.stop_early()
                break
            if self.graphed is not None:
                loss = self.graphed.iteration(self.learning_rate, self.iter)  # (and the update)
            else:
                if self.loss_scale is not None:
                    self.net.loss_scale = self.loss_scale.scale
                loss = self.forward_backward()
            asked, self.requested = self.requested, None  # a signal from now on counts at the next iteration
            stopped_by = self.requested_by if asked == "stop" else None
            loss, asked = self.exchange.average(loss, asked, self.iter)
            self.unread.append((self.iter, loss))
            rate = self.learning_rate
            shown = bool(p.display) and self.iter % p.display == 0
            if shown or len(self.unread) >= self.read_every:
                self.read_losses()
            if shown:
                elapsed = time.perf_counter() - window_start
                done = self.iter + 1 - window_iter
                outputs = mean_over_ranks(self.comm, self.net.scalar_outputs(),
                                          f"averaging outputs at iteration {self.iter}")
                communication = (self.comm.seconds - window_comm) * 1000 / done if self.comm.size > 1 else None
                self.log.train(self.iter, rate, self.smoothed_loss, outputs, self.loss_weights,
                               self.effective_batch_size * done / elapsed if elapsed > 0 else 0.0, communication)
                window_start, window_iter, window_comm = time.perf_counter(), self.iter + 1, self.comm.seconds
            if shown and self.debug_info:
                self.log.blob_magnitudes(self.iter, self.net.blob_magnitudes())
            if self.graphed is None and (self.loss_scale is None or self.unscaled()):
                made = self.iter - (self.loss_scale.skipped if self.loss_scale else 0)  # (the updates made before)
                update_ratios = self.optimizer.step(rate, made, measure=shown and self.debug_info)
                if update_ratios:
                    self.log.update_ratios(self.iter, update_ratios)
            self.net.loss_scale = 1.0  # (a backward pass from Python after the step is seeded as usual)
            self.iter += 1
            self.log.advance(self.iter)
            if asked == "snapshot" or (p.snapshot and self.iter % p.snapshot == 0):
                self.snapshot_pending = True
                if asked == "snapshot" or not self.tests_at(self.iter):
                    self.write_pending_snapshot()
            if asked == "stop":
                self.interrupted = stopped_by or signal.SIGINT  # (another rank's signal is not named: SIGINT)
                self.stop_reason = f"stop requested ({self.interrupted.name}): stopping at iteration {self.iter}"
                self.log.message(self.stop_reason)
                break
        self.read_losses()
        if finish_snapshots:
            self.write_pending_snapshot()

    def unscaled(self) -> bool:
        """Under fp16-mixed, divide the gradients by the loss scale (:mod:`netspec.training.loss_scale`); return
        whether they are finite, so that the update goes on.  Where they overflowed the update is skipped and the
        scale halved; each change of the scale is said in the log; an overflow at the lowest scale stops training
        (DivergedError)."""
        scale = self.loss_scale
        before = scale.scale
        finite = scale.unscale(self.backend, [segment.diff for segment in self.optimizer.segments])
        if not scale.after(finite):
            self.read_losses()  # (a loss that is NaN or infinite is said first: that is divergence, not float16)
            self._stop(f"iteration {self.iter}: the gradients overflow float16 (fp16-mixed) even with the loss scale "
                       f"at its lowest, {before:g}", "use bf16-mixed or fp32, or a smaller loss_weight")
        if scale.scale != before:
            skipped = "" if finite else ": the gradients overflowed float16, so this update is skipped"
            self.log.message(f"iteration {self.iter}: loss scale {before:g} -> {scale.scale:g}{skipped}")
        return finite

    def write_pending_snapshot(self) -> None:
        """Write the periodic snapshot that waited for its iteration's test, if one did."""
        if self.snapshot_pending:
            self.snapshot_pending = False
            self.snapshot()

    def tests_at(self, iteration: int) -> bool:
        """Whether the schedule tests before training iteration ``iteration`` (``test_interval``)."""
        p = self.params
        return bool(p.test_interval and self.test_nets and iteration % p.test_interval == 0
                    and (iteration > 0 or p.test_initialization))

    def tests_on_resuming_at(self, iteration: int) -> bool:
        """Whether a run resumed at ``iteration`` tests there: on schedule, or at once when it has nothing
        left to train (:meth:`solve` tests the final weights)."""
        final = iteration >= self.params.max_iter and bool(self.params.test_interval and self.test_nets)
        return self.tests_at(iteration) or final

    def stop_early(self) -> None:
        """End training because the ``early_stop`` output has not improved for ``patience`` test passes."""
        self.stop_reason = self.plateau.plateau_message(self.iter)
        self.log.message(self.stop_reason)

    def solve(self) -> None:
        """Train up to ``max_iter`` (or an early stop), snapshot at the end, and test the final weights."""
        p = self.params
        if p.snapshot_after_train:
            checkpoint.claim_folder(self)
        self.log.start(self.iter, p.max_iter)
        if self.comm.size > 1:
            per_rank = self.net.batch_size * p.iter_size
            self.log.message(f"distributed over {self.comm.size} processes: each learns from {per_rank} records per "
                             f"iteration, so one update averages the gradients of {self.effective_batch_size} "
                             "(learning rates are not scaled)")
        try:
            try:
                self.step(p.max_iter - self.iter, finish_snapshots=False)
            except EventsError:
                if self.last_snapshot_iter != self.iter:
                    self.snapshot()  # (the weights are sound: only the events cannot be written)
                raise
            try:  # the final weights tested first, so that the last snapshot's state holds what the test found
                if not self.stopped_early and p.test_interval and self.test_nets and self.last_test_iter != self.iter:
                    self.test_all()
            finally:
                if (self.snapshot_pending or p.snapshot_after_train or self.interrupted) and \
                        self.last_snapshot_iter != self.iter:
                    self.snapshot()
                self.snapshot_pending = False
            if not self.stopped_early:
                self.log.message(f"optimization done at iteration {self.iter}")
            if self.best is not None and self.best.best is not None:
                self.log.message(f"best test {self.best.output} = {format_value(self.best.best)} at iteration "
                                 f"{self.best.best_iter}: {self.best_weights_path}")
            self.log.message(self.memory_report())
        finally:
            self.log.close()

    def memory_report(self) -> str:
        """A line with the bytes the nets' blobs hold and the peak the device has seen (:meth:`Backend.peak_memory`)."""
        peak, what = self.backend.peak_memory()
        blobs = self.net.memory_bytes(*self.test_nets)
        return f"memory: blobs {blobs / 2 ** 20:.1f} MiB (train and test nets, data and diff); peak " \
               f"{peak / 2 ** 20:.1f} MiB ({what})"

    def close(self) -> None:
        """Stop the data layers' threads and close their files, in the train and test nets."""
        for net in (self.net, *self.test_nets):
            net.close()
        for one_pass in self.test_passes:
            if one_pass is not None:
                one_pass.close()

    @property
    def smoothed_loss(self) -> float:
        """Mean of the last ``average_loss`` losses."""
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")

    def forward_backward(self):
        """Accumulate gradients over ``iter_size`` batches; return the mean loss, on the device.

        In a distributed run the last backward pass starts sending the finished gradients.
        """
        self.net.clear_param_diffs()
        loss = 0.0
        for sub in range(self.params.iter_size):
            batch_loss = self.net.device_forward()
            if self.read_every == 1 and self.culprit is None and not math.isfinite(self.backend.to_host(batch_loss)):
                self.culprit = self.net.first_non_finite()  # (with iter_size, a later batch may be finite)
            loss = loss + batch_loss
            last = sub == self.params.iter_size - 1
            self.net.backward(self.exchange.layer_done if last else None)
        return loss / self.params.iter_size

    def read_losses(self) -> None:
        """Bring the losses not read yet to the host, in one transfer, into the average of the last
        ``average_loss``; the first that is NaN or infinite stops training (:meth:`diverged`)."""
        self.backend.raise_checks()  # (a bad label, say, from the iterations not read yet)
        if not self.unread:
            return
        xp = self.backend.xp
        values = self.backend.to_host(xp.stack([xp.asarray(loss, dtype=numpy.float64) for _, loss in self.unread]))
        iterations, self.unread = [iteration for iteration, _ in self.unread], []
        for iteration, loss in zip(iterations, values.tolist()):
            if not math.isfinite(loss):
                self.diverged(iteration, loss, iterations[-1])
            self.losses.append(loss)

    def diverged(self, iteration: int, loss: float, outputs_of: int) -> None:
        """Raise DivergedError naming the iteration whose loss was ``loss`` and the first layer whose output is
        not finite: noted at that iteration where the loss is read every iteration (the CPU), else in the
        outputs of iteration ``outputs_of``, the last forward pass.

        In a distributed run every rank raises it at the same iteration (the loss is their mean).
        """
        culprit, outputs_of = (self.culprit, iteration) if self.culprit else (self.net.first_non_finite(), outputs_of)
        when = "" if iteration == outputs_of else f" at iteration {outputs_of}"
        if culprit:
            where = f";{when} the first non-finite output is layer '{culprit[0]}' top '{culprit[1]}'"
        else:
            where = "; it became non-finite on another rank" if self.comm.size > 1 else ""
        self._stop(f"iteration {iteration}: the loss is {loss}{where}")

    def _stop(self, what: str, hint: str = "try a lower base_lr or clip_gradients") -> None:
        """Raise DivergedError saying ``what`` went wrong, which snapshot is the last good one, and ``hint``."""
        kept = f"the last snapshot is {self.last_snapshot}" if self.last_snapshot else "no snapshot was written"
        error = DivergedError(f"{what}. Training stopped; {kept} ({hint})")
        error.every_rank = True
        raise error

    def test_all(self) -> dict[int, dict[str, float]]:
        """Score every test net over its ``test_iter`` batches, log the averages, and follow watched outputs.

        With N ranks each scores ``ceil(test_iter / N)`` batches of its share and
        the scores are averaged, so together they cover the records one process would.  The losses are read
        first (:meth:`read_losses`).
        """
        self.read_losses()
        self.last_test_iter = self.iter
        results = {}
        what = f"averaging test scores at iteration {self.iter}"
        for index, (net, one_pass) in enumerate(zip(self.test_nets, self.test_passes)):
            per_class = PerClassAccuracy(net)
            counted = per_class.add if per_class else None
            if one_pass is None:
                scores = net.score(-(-self.params.test_iter[index] // self.comm.size), counted)
                scores = mean_over_ranks(self.comm, scores, what)
            else:  # each rank's averages weigh as much as they are means of (records, valid labels)
                scores = one_pass.score(counted)
                weights = mean_over_ranks(self.comm, one_pass.weights, what)
                scores = mean_over_ranks(self.comm, {name: value * one_pass.weights[name]
                                                     for name, value in scores.items()}, what)
                scores = {name: value / weights[name] if weights[name] else 0.0 for name, value in scores.items()}
            self.log.test(self.iter, index, self.learning_rate, scores, net.output_loss_weights,
                          per_class.figures(net, self.comm, what) if per_class else None)
            results[index] = scores
        if self.best is not None and self.best.update(self.iter, results):
            if self.comm.rank == 0:
                checkpoint.save_best(self)
            self.log.message(f"best {self.best.output} so far ({format_value(self.best.best)}): "
                             f"{self.best_weights_path}")
        if self.plateau is not None:
            self.plateau.update(self.iter, results)
        return results

    # ---- snapshots ------------------------------------------------------------------------------
    def snapshot(self) -> str:
        """Write this iteration's weights and solver state (see :func:`netspec.training.checkpoint.save`).

        The losses are read first; a NaN or infinite one, or weights holding a NaN or an infinity, are never
        written: training stops instead, naming the iteration or the blob, and the last snapshot, which is
        still good.  A solver made from Python refuses a folder holding another run's snapshots, as training
        into it would (:func:`netspec.training.checkpoint.claim_folder`).
        """
        self.read_losses()
        bad = self.net.first_non_finite_param()
        if bad is not None:
            self._stop(f"iteration {self.iter}: layer '{bad[0]}' blob {bad[1]} holds NaN or infinite values, so "
                       "no snapshot is written")
        return checkpoint.save(self)

    def restore(self, path: str | os.PathLike, force: bool = False) -> None:
        """Continue from a solver state; ``force`` accepts a changed net or solver file.

        See :func:`netspec.training.checkpoint.restore`.
        """
        checkpoint.restore(self, path, force)

    @property
    def best_weights_path(self) -> str:
        """Where ``snapshot_best`` keeps the best weights: ``<prefix>_best.weights.h5``."""
        return run_folder.best_weights_path(self.spec.snapshot_prefix)



def load_solver(source, device: str | None = None, seed: int | None = None, stages=None, level: int | None = None,
                dtype=numpy.float32, log: TrainingLog | None = None, debug_info: bool = False, comm=None,
                reuse_memory: bool = False, trust: Trust = OWN) -> Solver:
    """Read and validate a solver file (path or YAML text) with its nets, and build it on a device.

    ``comm`` (a :class:`netspec.training.distributed.MPICommunicator`) makes this process one rank of a
    distributed run; ``reuse_memory`` lets blobs share buffers and ``trust`` says what the nets may do
    (:class:`Solver`).
    """
    spec = parse_solver(source, layer_schemas(), list(solver_types()))
    return Solver(spec, device=device, seed=seed, stages=stages, level=level, dtype=dtype, log=log,
                  debug_info=debug_info, comm=comm, reuse_memory=reuse_memory, trust=trust)
