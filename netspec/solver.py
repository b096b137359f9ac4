"""The training loop shared by every update rule (DESIGN.md section 4), with testing, snapshots and resume.

One iteration, in Caffe's order: test when due, forward/backward ``iter_size``
times with parameter diffs accumulating, log when due, then the update
(learning rate from the policy, global-norm clipping, division by
``iter_size``, weight decay, the rule, ``w -= step``), then a snapshot when
due.  Everything random comes from one seeded backend, and a snapshot holds
every buffer, data position and generator state, so a resumed run continues
bit for bit.
"""

from __future__ import annotations

import collections
import difflib
import math
import os
import time

import numpy

from netspec import solver_state
from netspec.backend import Backend
from netspec.config import did_you_mean
from netspec.errors import ConfigError, Problem, StateError, TrainingError
from netspec.graph import compile_net
from netspec.net import Net
from netspec.registry import layer_schemas, solver_class, solver_types
from netspec.solver_config import EPOCH_KEYS, SolverSpec, parse_solver, with_epochs_resolved
from netspec.solvers.lr_policies import learning_rate, multistep_count
from netspec.training_log import TrainingLog, format_value
from netspec.watch import OutputWatch


class Solver:
    """A train net, its test nets (sharing the train net's weights) and an update rule.

    ``device``, ``seed``, ``stages`` and ``level`` override the solver file
    (``solver_mode``/``device_id``, ``random_seed``, ``train_state``/``test_state``).
    """

    def __init__(self, spec: SolverSpec, device: str | None = None, seed: int | None = None, stages=None,
                 level: int | None = None, dtype=numpy.float32, log: TrainingLog | None = None,
                 debug_info: bool = False):
        p = spec.params
        self.spec = spec
        if device is None:
            device = "cpu" if p.solver_mode == "CPU" else f"gpu:{p.device_id}"
        if seed is None and p.random_seed >= 0:
            seed = p.random_seed
        self.backend = Backend(device, seed)
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
        self.rule = rule_cls(p, [lp.blob.shape for lp in self.learnable], self.backend.xp, self.net.dtype)
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
        return records / (self.net.batch_size * self.spec.params.iter_size) if records else None

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
        stop_at = self.iter + iterations
        window_start, window_iter = time.perf_counter(), self.iter
        while self.iter < stop_at:
            if (p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization)
                    and self.last_test_iter != self.iter):
                self.test_all()
                if self.plateau is not None and self.plateau.stale >= p.early_stop.patience:
                    self.stop_early()
                    break
            self.losses.append(self.forward_backward())
            rate = self.learning_rate
            shown = bool(p.display) and self.iter % p.display == 0
            if shown:
                elapsed = time.perf_counter() - window_start
                images = self.net.batch_size * p.iter_size * (self.iter + 1 - window_iter)
                outputs = self.net.scalar_outputs()
                self.log.train(self.iter, rate, self.smoothed_loss, outputs, self.loss_weights,
                               images / elapsed if elapsed > 0 else 0.0)
                window_start, window_iter = time.perf_counter(), self.iter + 1
            if shown and self.debug_info:
                self.log.blob_magnitudes(self.iter, self.net.blob_magnitudes())
            update_ratios = self.apply_update(rate, measure=shown and self.debug_info)
            if update_ratios:
                self.log.update_ratios(self.iter, update_ratios)
            self.iter += 1
            self.log.advance(self.iter)
            if self.requested == "snapshot" or (p.snapshot and self.iter % p.snapshot == 0):
                self.snapshot()
            if self.requested == "stop":
                self.stop_reason = f"stop requested: stopping at iteration {self.iter}"
                self.log.message(self.stop_reason)
                break
            self.requested = None

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
        """Accumulate gradients over ``iter_size`` batches; return the mean loss (stop if not finite)."""
        self.net.clear_param_diffs()
        loss = 0.0
        for _ in range(self.params.iter_size):
            loss += self.net.forward()
            if not math.isfinite(loss):
                self.diverged(loss)
            self.net.backward()
        return loss / self.params.iter_size

    def diverged(self, loss: float) -> None:
        """Raise TrainingError naming the iteration and the first layer whose output is not finite."""
        culprit = self.net.first_non_finite()
        where = f"; the first non-finite output is layer '{culprit[0]}' top '{culprit[1]}'" if culprit else ""
        kept = f"the last snapshot is {self.last_snapshot}" if self.last_snapshot else "no snapshot was written"
        raise TrainingError(f"iteration {self.iter}: the loss is {loss}{where}. Training stopped; {kept} "
                            "(try a lower base_lr or clip_gradients)")

    def apply_update(self, rate: float, measure: bool = False) -> list[tuple[str, float, float]]:
        """Clip, normalise, regularise and apply the rule's step to every learnable blob.

        With ``measure``, return ``(layer[index], mean |w|, ||step|| / ||w||)`` for each blob.
        """
        p, xp = self.params, self.backend.xp
        if p.clip_gradients >= 0:
            norm = math.sqrt(sum(float(xp.vdot(lp.blob.diff, lp.blob.diff)) for lp in self.learnable))
            if norm > p.clip_gradients:
                scale = p.clip_gradients / norm
                for lp in self.learnable:
                    lp.blob.diff *= scale
        decoupled = self.rule.decoupled_decay
        ratios = []
        for index, lp in enumerate(self.learnable):
            diff, data = lp.blob.diff, lp.blob.data
            if p.iter_size > 1:
                diff *= 1.0 / p.iter_size
            decay = p.weight_decay * lp.decay_mult
            if decay and not decoupled:
                diff += decay * self._regularizer(data)
            self.rule.compute_update(index, diff, rate * lp.lr_mult, self.iter)
            if decay and decoupled:
                diff += (rate * lp.lr_mult * decay) * self._regularizer(data)
            if measure:
                weight_norm = float(xp.linalg.norm(data))
                ratio = float(xp.linalg.norm(diff)) / weight_norm if weight_norm else math.inf
                ratios.append((f"{lp.layer}[{lp.index}]", float(xp.abs(data).mean()), ratio))
            data -= diff
        return ratios

    def _regularizer(self, data):
        """The decay's direction: ``w`` for L2, ``sign(w)`` for L1."""
        return data if self.params.regularization_type == "L2" else self.backend.xp.sign(data)

    def test_all(self) -> dict[int, dict[str, float]]:
        """Score every test net over its ``test_iter`` batches, log the averages, and follow watched outputs."""
        self.last_test_iter = self.iter
        results = {}
        for index, net in enumerate(self.test_nets):
            scores = net.score(self.params.test_iter[index])
            self.log.test(self.iter, index, self.learning_rate, scores, net.output_loss_weights)
            results[index] = scores
        if self.best is not None and self.best.update(self.iter, results):
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
        then deleted (the best weights are a separate file and stay).
        """
        weights, state = self._snapshot_paths(self.iter)
        kept = [it for it in self.snapshots if it != self.iter] + [self.iter]
        dropped = kept[:-self.params.keep_last] if self.params.keep_last else []
        kept = kept[len(dropped):]
        self.net.save_weights(weights, self.iter)
        history = {}
        for lp, buffers in zip(self.learnable, self.rule.history):
            history.setdefault(lp.layer, {})[lp.index] = {
                name: self.backend.to_host(buffer) for name, buffer in zip(self.rule.history_names, buffers)}
        runtime = {"train": self.net.runtime_state()}
        runtime.update({f"test{i}": net.runtime_state() for i, net in enumerate(self.test_nets)})
        solver_state.write_state(state, solver_state.SolverState(
            iteration=self.iter, solver_type=self.params.type, rng_state=self.backend.rng_state(),
            net_name=self.net.name, net_config_hash=self.net.graph.config_hash,
            solver_config_hash=self.spec.config_hash, solver_yaml=self.spec.text, net_yaml=self.spec.train_net_text,
            weights_file=os.path.basename(weights), weights_sha256=solver_state.file_sha256(weights),
            lr_step=multistep_count(self.params, self.iter), history=history, runtime=runtime,
            loss_window=list(self.losses), progress=self._progress(kept)))
        self.last_snapshot, self.last_snapshot_iter = state, self.iter
        self.snapshots = kept
        self.log.message(f"snapshot at iteration {self.iter}: {weights}")
        for iteration in dropped:
            for path in self._snapshot_paths(iteration):
                if os.path.exists(path):
                    os.remove(path)
        return state

    @property
    def best_weights_path(self) -> str:
        """Where ``snapshot_best`` keeps the best weights: ``<prefix>_best.weights.h5``."""
        return f"{self.spec.snapshot_prefix}_best.weights.h5"

    def _snapshot_paths(self, iteration: int) -> tuple[str, str]:
        prefix = f"{self.spec.snapshot_prefix}_iter_{iteration}"
        return f"{prefix}.weights.h5", f"{prefix}.solverstate.h5"

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
        self._restore_history(path, state)
        self.net.load_weights(weights)
        self.iter = state.iteration
        self.losses.clear()
        self.losses.extend(state.loss_window)
        self.net.restore_runtime_state(state.runtime.get("train", {}))
        for index, net in enumerate(self.test_nets):
            net.restore_runtime_state(state.runtime.get(f"test{index}", {}))
        self.backend.set_rng_state(state.rng_state)
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

    def _restore_history(self, path: str, state) -> None:
        for lp, buffers in zip(self.learnable, self.rule.history):
            saved = state.history.get(lp.layer, {}).get(lp.index)
            if saved is None or any(name not in saved for name in self.rule.history_names):
                raise StateError(f"{path}: no update history for layer '{lp.layer}' blob {lp.index}")
            for name, buffer in zip(self.rule.history_names, buffers):
                if saved[name].shape != buffer.shape:
                    raise StateError(f"{path}: layer '{lp.layer}' blob {lp.index} has shape {saved[name].shape} "
                                     f"in the state but {buffer.shape} in the net")
                buffer[...] = self.backend.asarray(saved[name], dtype=buffer.dtype)


def load_solver(source, device: str | None = None, seed: int | None = None, stages=None, level: int | None = None,
                dtype=numpy.float32, log: TrainingLog | None = None, debug_info: bool = False) -> Solver:
    """Read and validate a solver file (path or YAML text) with its nets, and build it on a device."""
    spec = parse_solver(source, layer_schemas(), list(solver_types()))
    return Solver(spec, device=device, seed=seed, stages=stages, level=level, dtype=dtype, log=log,
                  debug_info=debug_info)
