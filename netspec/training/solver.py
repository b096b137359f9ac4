"""The training loop shared by every update rule (DESIGN.md section 4), with testing, snapshots and resume.

One iteration, in Caffe's order: test when due, forward/backward ``iter_size``
times with parameter diffs accumulating, log when due, then the update
(learning rate from the policy, then :class:`netspec.training.optimizer.Optimizer`:
global-norm clipping, division by ``iter_size``, weight decay, the rule,
``w -= step``), then a snapshot when due.  Everything random comes from one seeded backend, and a snapshot holds
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
import difflib
import math
import os
import time

import numpy

from netspec.engine.backend import Backend
from netspec.engine.comm import SingleProcess
from netspec.engine.net import Net, compile_net
from netspec.engine.registry import layer_schemas, solver_class, solver_types
from netspec.errors import (
    ConfigError,
    DistributedError,
    Problem,
    StateError,
    TrainingError,
    did_you_mean,
)
from netspec.solvers.lr_policies import learning_rate, multistep_count
from netspec.spec.solver_spec import (
    EPOCH_KEYS,
    SolverSpec,
    parse_solver,
    with_epochs_resolved,
)
from netspec.training import run_folder, solver_state
from netspec.training.distributed import GradientExchange
from netspec.training.log import TrainingLog, format_value
from netspec.training.optimizer import Optimizer
from netspec.training.watch import OutputWatch


class Solver:
    """A train net, its test nets (sharing the train net's weights) and an update rule.

    ``device``, ``seed``, ``stages`` and ``level`` override the solver file
    (``solver_mode``/``device_id``, ``random_seed``, ``train_state``/``test_state``).
    ``comm`` is the distributed run this process is a rank of (default: none).
    """

    def __init__(self, spec: SolverSpec, device: str | None = None, seed: int | None = None, stages=None,
                 level: int | None = None, dtype=numpy.float32, log: TrainingLog | None = None,
                 debug_info: bool = False, comm=None):
        p = spec.params
        self.spec = spec
        if device is None:
            device = "cpu" if p.solver_mode == "CPU" else f"gpu:{p.device_id}"
        if seed is None and p.random_seed >= 0:
            seed = p.random_seed
        self.comm = comm = comm or SingleProcess()
        if comm.size > 1:  # every rank builds the same nets and reads the same record stream
            if device != "cpu":
                raise DistributedError("distributed training runs on the CPU for now (--device cpu); the GPU path "
                                       "through NCCL is not available yet")
            fresh = int(numpy.random.SeedSequence().entropy % 2 ** 63)
            seed = comm.broadcast_object(fresh if seed is None else seed, "agreeing on the random seed")
        self.backend = Backend(device, seed, comm)
        self.net = self._build(spec.train_net, "TRAIN", p.train_state, stages, level, dtype)
        self.loss_weights = self.net.output_loss_weights
        if not self.net.has_loss():
            raise ConfigError(Problem(f"net '{self.net.name}' has no loss in the TRAIN phase, so there is nothing "
                                      "to minimise (add e.g. a SoftmaxWithLoss layer, or a loss_weight)",
                                      file=spec.train_net.file or spec.file or "<string>"))
        self.test_nets = []
        for index, net_spec in enumerate(spec.test_nets):
            state = p.test_state[index] if p.test_state else None
            net = self._build(net_spec, "TEST", state, stages, level, dtype)
            net.share_trained_layers(self.net)
            self.test_nets.append(net)
        self.iterations_per_epoch = self._iterations_per_epoch()
        self.params = p = self._in_iterations(p)
        rule_cls = solver_class(p.type)
        problems = [spec.problem(message, key) for key, message in rule_cls.check(p)]
        problems += self._check_watched_outputs()
        if problems:
            raise ConfigError(problems)
        self.learnable = self.net.learnable_params()
        self.optimizer = Optimizer(rule_cls, p, self.learnable, self.backend, self.net.dtype)
        self.exchange = GradientExchange(comm, self.net, self.learnable)
        self.weights_agreed = comm.size == 1
        self.culprit: tuple[str, str] | None = None
        self.iter = 0
        self.losses: collections.deque[float] = collections.deque(maxlen=p.average_loss)
        self.log = log or TrainingLog()
        self.log.iterations_per_epoch = self.iterations_per_epoch
        self.debug_info = debug_info
        self.requested: str | None = None
        self.stop_reason: str | None = None
        self.last_test_iter: int | None = None
        self.last_snapshot: str | None = None
        self.last_snapshot_iter: int | None = None
        self.snapshots: list[int] = []
        self.best = self.plateau = None
        if p.snapshot_best:
            self.best = OutputWatch(p.snapshot_best.output, p.snapshot_best.mode, p.snapshot_best.test_net)
        if p.early_stop:
            e = p.early_stop
            self.plateau = OutputWatch(e.output, e.mode, e.test_net, e.min_delta)

    def _iterations_per_epoch(self) -> float | None:
        """Iterations per pass over the train data, when its data layer knows its record count."""
        layer = self.net.data_layer()
        records = layer.record_count() if layer is not None else None
        return records / self.effective_batch_size if records else None

    @property
    def effective_batch_size(self) -> int:
        """Records one update learns from: the batch size times ``iter_size`` times the number of ranks."""
        return self.net.batch_size * self.spec.params.iter_size * self.comm.size

    def _in_iterations(self, p):
        """``p`` with epoch counts turned into iterations; refused when the data's size is unknown."""
        used = [key for key in EPOCH_KEYS if getattr(p, key) is not None]
        if not used:
            return p
        if self.iterations_per_epoch is None:
            layer = self.net.data_layer()
            source = f"its data layer '{layer.name}' ({layer.type})" if layer is not None else "it has no data layer"
            raise ConfigError([self.spec.problem(
                f"counts epochs, but the train net cannot tell how many records an epoch has: {source} does not "
                "know its size; give iteration counts instead, or read the data with HDF5Data", key) for key in used])
        resolved = with_epochs_resolved(p, self.iterations_per_epoch)
        if resolved.warmup_iter >= resolved.max_iter:
            raise ConfigError(self.spec.problem(
                f"must be less than max_iter ({resolved.max_iter} from max_epoch), got {p.warmup_iter}", "warmup_iter"))
        return resolved

    def _check_watched_outputs(self) -> list[Problem]:
        """``snapshot_best`` and ``early_stop`` must name a one-value output of their test net."""
        problems = []
        for key in ("snapshot_best", "early_stop"):
            watch = getattr(self.params, key)
            if watch is None:
                continue
            net = self.test_nets[watch.test_net]
            scalars = [name for name in net.outputs if net.blobs[name].count == 1]
            if watch.output not in scalars:
                problems.append(self.spec.problem(
                    f"test net {watch.test_net} has no one-value output '{watch.output}'"
                    f"{did_you_mean(watch.output, scalars)} (it has: {', '.join(scalars) or 'none'})", key))
        return problems

    def _build(self, net_spec, phase, state, stages, level, dtype) -> Net:
        if stages is None and state is not None:
            stages = state.stage
        if level is None and state is not None:
            level = state.level
        graph = compile_net(net_spec, phase=phase, stages=stages, level=level)
        return Net(graph, dtype=dtype, backend=self.backend)

    @property
    def rule(self):
        """The update rule, with its history buffers."""
        return self.optimizer.rule

    # ---- the loop ---------------------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The policy's rate at the current iteration."""
        return learning_rate(self.params, self.iter)

    def request(self, action: str) -> None:
        """Ask for ``snapshot`` or ``stop`` at the next iteration boundary (signal handlers call this)."""
        if action == "stop" or self.requested is None:
            self.requested = action

    @property
    def stopped_early(self) -> bool:
        """True when training stopped before ``max_iter`` (a requested stop or early stopping)."""
        return self.stop_reason is not None

    def step(self, iterations: int) -> None:
        """Run ``iterations`` iterations (fewer if a stop is requested or early stopping triggers)."""
        p = self.params
        if not self.weights_agreed:
            self.share_weights()
        stop_at = self.iter + iterations
        window_start, window_iter, window_comm = time.perf_counter(), self.iter, self.comm.seconds
        while self.iter < stop_at:
            if (p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization)
                    and self.last_test_iter != self.iter):
                self.test_all()
                if self.plateau is not None and self.plateau.stale >= p.early_stop.patience:
                    self.stop_early()
                    break
            loss = self.forward_backward()
            asked, self.requested = self.requested, None  # a signal from now on counts at the next iteration
            loss, asked = self.exchange.average(loss, asked, self.iter)
            if not math.isfinite(loss):
                self.diverged(loss)
            self.losses.append(loss)
            rate = self.learning_rate
            shown = bool(p.display) and self.iter % p.display == 0
            if shown:
                elapsed = time.perf_counter() - window_start
                done = self.iter + 1 - window_iter
                outputs = self.mean_over_ranks(self.net.scalar_outputs(), f"averaging outputs at iteration {self.iter}")
                communication = (self.comm.seconds - window_comm) * 1000 / done if self.comm.size > 1 else None
                self.log.train(self.iter, rate, self.smoothed_loss, outputs, self.loss_weights,
                               self.effective_batch_size * done / elapsed if elapsed > 0 else 0.0, communication)
                window_start, window_iter, window_comm = time.perf_counter(), self.iter + 1, self.comm.seconds
            if shown and self.debug_info:
                self.log.blob_magnitudes(self.iter, self.net.blob_magnitudes())
            update_ratios = self.optimizer.step(rate, self.iter, measure=shown and self.debug_info)
            if update_ratios:
                self.log.update_ratios(self.iter, update_ratios)
            self.iter += 1
            self.log.advance(self.iter)
            if asked == "snapshot" or (p.snapshot and self.iter % p.snapshot == 0):
                self.snapshot()
            if asked == "stop":
                self.stop_reason = f"stop requested: stopping at iteration {self.iter}"
                self.log.message(self.stop_reason)
                break

    def share_weights(self) -> None:
        """Give every rank rank 0's parameter blobs (learnable or not), as the first thing a distributed run does."""
        for layer, blobs in self.net.owned_params().items():
            for index, blob in blobs:
                host = numpy.ascontiguousarray(self.backend.to_host(blob.data))
                self.comm.broadcast(host, f"receiving rank 0's weights ({layer}[{index}])")
                blob.data[...] = self.backend.asarray(host)
        self.weights_agreed = True

    def stop_early(self) -> None:
        """End training because the ``early_stop`` output has not improved for ``patience`` test passes."""
        watch = self.plateau
        best = f"{format_value(watch.best)} at iteration {watch.best_iter}" if watch.best is not None else "none"
        self.stop_reason = (f"early stop at iteration {self.iter}: test {watch.output} has not improved by more "
                            f"than {format_value(watch.min_delta)} in {watch.stale} test passes (best {best})")
        self.log.message(self.stop_reason)

    def solve(self) -> None:
        """Train up to ``max_iter`` (or an early stop), snapshot at the end, and test the final weights."""
        p = self.params
        self.log.start(self.iter, p.max_iter, resumed=self.iter > 0)
        if self.comm.size > 1:
            per_rank = self.net.batch_size * p.iter_size
            self.log.message(f"distributed over {self.comm.size} processes: each learns from {per_rank} records per "
                             f"iteration, so one update averages the gradients of {self.effective_batch_size} "
                             "(learning rates are not scaled)")
        try:
            self.step(p.max_iter - self.iter)
            if p.snapshot_after_train and self.last_snapshot_iter != self.iter:
                self.snapshot()
            if not self.stopped_early:
                if p.test_interval and self.test_nets and self.last_test_iter != self.iter:
                    self.test_all()
                self.log.message(f"optimization done at iteration {self.iter}")
            if self.best is not None and self.best.best is not None:
                self.log.message(f"best test {self.best.output} = {format_value(self.best.best)} at iteration "
                                 f"{self.best.best_iter}: {self.best_weights_path}")
        finally:
            self.log.close()

    def close(self) -> None:
        """Stop the data layers' threads and close their files, in the train and test nets."""
        for net in (self.net, *self.test_nets):
            net.close()

    @property
    def smoothed_loss(self) -> float:
        """Mean of the last ``average_loss`` losses."""
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")

    def forward_backward(self) -> float:
        """Accumulate gradients over ``iter_size`` batches; return the mean loss.

        The first layer to output a NaN or an infinity is noted for :meth:`diverged`.  In a
        distributed run the last backward pass starts sending the finished gradients.
        """
        self.net.clear_param_diffs()
        loss = 0.0
        for sub in range(self.params.iter_size):
            loss += self.net.forward()
            if not math.isfinite(loss) and self.culprit is None:
                self.culprit = self.net.first_non_finite()
            last = sub == self.params.iter_size - 1
            self.net.backward(self.exchange.layer_done if last else None)
        return loss / self.params.iter_size

    def diverged(self, loss: float) -> None:
        """Raise TrainingError naming the iteration and the first layer whose output is not finite.

        In a distributed run every rank raises it at the same iteration (the loss is their mean).
        """
        if self.culprit:
            where = f"; the first non-finite output is layer '{self.culprit[0]}' top '{self.culprit[1]}'"
        else:
            where = "; it became non-finite on another rank" if self.comm.size > 1 else ""
        kept = f"the last snapshot is {self.last_snapshot}" if self.last_snapshot else "no snapshot was written"
        error = TrainingError(f"iteration {self.iter}: the loss is {loss}{where}. Training stopped; {kept} "
                              "(try a lower base_lr or clip_gradients)")
        error.every_rank = True
        raise error

    def mean_over_ranks(self, values: dict[str, float], what: str) -> dict[str, float]:
        """Each value averaged over the ranks (every rank has the same names, in the same order)."""
        if self.comm.size == 1:
            return values
        names = list(values)
        array = numpy.array([values[name] for name in names], dtype=numpy.float64)
        self.comm.allreduce_mean(array, what)
        return dict(zip(names, array.tolist()))

    def test_all(self) -> dict[int, dict[str, float]]:
        """Score every test net over its ``test_iter`` batches, log the averages, and follow watched outputs.

        With N ranks each scores ``ceil(test_iter / N)`` batches of its share and
        the scores are averaged, so together they cover the records one process would.
        """
        self.last_test_iter = self.iter
        results = {}
        for index, net in enumerate(self.test_nets):
            scores = net.score(-(-self.params.test_iter[index] // self.comm.size))
            scores = self.mean_over_ranks(scores, f"averaging test scores at iteration {self.iter}")
            self.log.test(self.iter, index, self.learning_rate, scores, net.output_loss_weights)
            results[index] = scores
        if self.best is not None and self.best.update(self.iter, results):
            if self.comm.rank == 0:
                self.net.save_weights(self.best_weights_path, self.iter)
            self.log.message(f"best {self.best.output} so far ({format_value(self.best.best)}): "
                             f"{self.best_weights_path}")
        if self.plateau is not None:
            self.plateau.update(self.iter, results)
        return results

    # ---- snapshots ------------------------------------------------------------------------------
    def snapshot(self) -> str:
        """Write ``<prefix>_iter_<N>.weights.h5`` and ``.solverstate.h5``; return the state's path.

        With ``keep_last: K`` the periodic snapshots before the newest K are
        then deleted (the best weights are a separate file and stay).  In a
        distributed run every rank calls this together and rank 0 writes,
        keeping each rank's own random generator state.
        """
        weights, state = self._snapshot_paths(self.iter)
        kept = [it for it in self.snapshots if it != self.iter] + [self.iter]
        dropped = kept[:-self.params.keep_last] if self.params.keep_last else []
        kept = kept[len(dropped):]
        rank_rng_states = self.comm.gather_object(self.backend.rank_rng_state(),
                                                  f"writing the snapshot of iteration {self.iter}")
        if self.comm.rank == 0:
            self._write_snapshot(weights, state, kept, rank_rng_states if self.comm.size > 1 else [])
            for iteration in dropped:
                for path in self._snapshot_paths(iteration):
                    if os.path.exists(path):
                        os.remove(path)
        self.last_snapshot, self.last_snapshot_iter = state, self.iter
        self.snapshots = kept
        self.log.message(f"snapshot at iteration {self.iter}: {weights}")
        return state

    def _write_snapshot(self, weights: str, state: str, kept: list[int], rank_rng_states: list[str]) -> None:
        self.net.save_weights(weights, self.iter)
        runtime = {"train": self.net.runtime_state()}
        runtime.update({f"test{i}": net.runtime_state() for i, net in enumerate(self.test_nets)})
        solver_state.write_state(state, solver_state.SolverState(
            iteration=self.iter, solver_type=self.params.type, rng_state=self.backend.rng_state(),
            net_name=self.net.name, net_config_hash=self.net.graph.config_hash,
            solver_config_hash=self.spec.config_hash, solver_yaml=self.spec.text, net_yaml=self.spec.train_net_text,
            weights_file=os.path.basename(weights), weights_sha256=solver_state.file_sha256(weights),
            lr_step=multistep_count(self.params, self.iter), history=self.optimizer.state(), runtime=runtime,
            loss_window=list(self.losses), progress=self._progress(kept), world_size=self.comm.size,
            rank_rng_states=rank_rng_states))

    @property
    def best_weights_path(self) -> str:
        """Where ``snapshot_best`` keeps the best weights: ``<prefix>_best.weights.h5``."""
        return run_folder.best_weights_path(self.spec.snapshot_prefix)

    def _snapshot_paths(self, iteration: int) -> tuple[str, str]:
        return run_folder.snapshot_paths(self.spec.snapshot_prefix, iteration)

    def _progress(self, snapshots: list[int]) -> dict:
        """The periodic snapshots kept and the watched outputs' state, for the solver state."""
        progress = {"snapshots": snapshots}
        if self.best is not None:
            progress["best"] = self.best.state()
        if self.plateau is not None:
            progress["early_stop"] = self.plateau.state()
        return progress

    def restore(self, path: str | os.PathLike, force: bool = False) -> None:
        """Continue from a solver state: weights, history, data positions, generators and iteration.

        A state from another net or solver file is refused (with a diff) unless ``force``.
        """
        path = os.fspath(path)
        state = solver_state.read_state(path)
        if state.world_size != self.comm.size:
            raise StateError(f"{path}: the state was written by a run of {state.world_size} process(es), this run "
                             f"has {self.comm.size}; resume with the same number (mpiexec -n {state.world_size}), "
                             "or start a new run from its weights with --weights")
        if not force:
            self._check_same_config(path, state)
        if state.solver_type != self.params.type:
            raise StateError(f"{path}: the state is of a {state.solver_type} solver, this solver is "
                             f"{self.params.type}; their histories differ, so it cannot continue")
        weights = solver_state.weights_path(path, state)
        if not os.path.isfile(weights):
            raise StateError(f"{path}: its weights file {weights} is missing")
        if solver_state.file_sha256(weights) != state.weights_sha256:
            raise StateError(f"{path}: its weights file {weights} has changed since the state was written")
        self.optimizer.load_state(state.history, path)
        self.net.load_weights(weights)
        self.iter = state.iteration
        self.losses.clear()
        self.losses.extend(state.loss_window)
        self.net.restore_runtime_state(state.runtime.get("train", {}))
        for index, net in enumerate(self.test_nets):
            net.restore_runtime_state(state.runtime.get(f"test{index}", {}))
        self.backend.set_rng_state(state.rng_state)
        if state.rank_rng_states:
            self.backend.set_rank_rng_state(state.rank_rng_states[self.comm.rank])
        self.snapshots = [int(it) for it in state.progress.get("snapshots", [state.iteration])]
        for key, watch in (("best", self.best), ("early_stop", self.plateau)):
            if watch is not None and key in state.progress:
                watch.restore(state.progress[key])
        self.last_snapshot, self.last_snapshot_iter = path, state.iteration
        self.log.message(f"resumed from {path} at iteration {self.iter}")

    def _check_same_config(self, path: str, state) -> None:
        changes = []
        if state.solver_config_hash != self.spec.config_hash:
            changes.append(("solver", state.solver_yaml, self.spec.text))
        if state.net_config_hash != self.net.graph.config_hash:
            # an inline net's text is the solver file's
            changes.append(("net", state.net_yaml or state.solver_yaml, self.spec.train_net_text or self.spec.text))
        if not changes:
            return
        lines = []
        for what, before, after in changes:
            lines.extend(difflib.unified_diff(before.splitlines(), after.splitlines(), f"{what} in the state",
                                              f"{what} now", lineterm="", n=1))
        names = " and ".join(dict.fromkeys(what for what, _, _ in changes))
        raise StateError(f"{path}: the {names} changed since this state was written; resume with --force to "
                         "continue anyway. Changes:\n" + "\n".join(lines))



def load_solver(source, device: str | None = None, seed: int | None = None, stages=None, level: int | None = None,
                dtype=numpy.float32, log: TrainingLog | None = None, debug_info: bool = False, comm=None) -> Solver:
    """Read and validate a solver file (path or YAML text) with its nets, and build it on a device.

    ``comm`` (a :class:`netspec.training.distributed.MPICommunicator`) makes this process one rank of a
    distributed run.
    """
    spec = parse_solver(source, layer_schemas(), list(solver_types()))
    return Solver(spec, device=device, seed=seed, stages=stages, level=level, dtype=dtype, log=log,
                  debug_info=debug_info, comm=comm)
