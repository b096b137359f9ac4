"""Snapshots of a training run and continuing from one (docs/pages/concepts/file-formats.md).

A snapshot is two files named by :mod:`netspec.training.run_folder`: the
weights and a solver state (:mod:`netspec.training.solver_state`) holding
everything else a resumed run needs to continue bit for bit: the update
rule's history, data positions, generator states, the loss window, the
snapshots kept and the watched outputs.  Both functions here take the
:class:`netspec.training.solver.Solver` whose run it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os

from netspec.errors import StateError, TrainingError, shown
from netspec.solvers.lr_policies import READS_MAX_ITER, multistep_count
from netspec.threads import all_cores, pool_size, pools_sized, use_threads
from netspec.training import run_folder, solver_state

# Solver settings whose change cannot alter the weights a resumed run computes: they decide what is logged, tested
# and written, when training ends, and whether iterations run as a CUDA graph (which computes what eager ones do).
# Any other change (the rule and its constants, the lr schedule, decay, clipping, iter_size, the seed, the device,
# the states of the nets) needs --force.
RESUME_MAY_CHANGE = frozenset({
    "display", "average_loss", "test_iter", "test_interval", "test_interval_epochs", "test_initialization",
    "snapshot", "snapshot_epochs", "snapshot_prefix", "snapshot_after_train", "snapshot_best", "keep_last",
    "early_stop", "tensorboard", "cuda_graph", "max_iter", "max_epoch"})
GPU_ONLY_KEYS = frozenset({"precision", "deterministic"})  # what the CPU computes is the same either way
LENGTH_KEYS = frozenset({"max_iter", "max_epoch"})  # part of the lr schedule for the policies that read max_iter


def save(solver) -> str:
    """Write ``<prefix>_iter_<N>.weights.h5`` and ``.solverstate.h5`` for the solver's iteration; return the state.

    With ``keep_last: K`` the periodic snapshots before the newest K are then
    deleted (the best weights are a separate file and stay).  A folder holding another run's files is refused
    first (:func:`claim_folder`).  In a distributed
    run every rank calls this together and rank 0 writes, keeping each rank's
    own random generator state.
    """
    iteration, comm = solver.iter, solver.comm
    claim_folder(solver)
    weights, state = run_folder.snapshot_paths(solver.spec.snapshot_prefix, iteration)
    kept = [it for it in solver.snapshots if it != iteration] + [iteration]
    dropped = kept[:-solver.params.keep_last] if solver.params.keep_last else []
    kept = kept[len(dropped):]
    if comm.rank == 0:
        try:
            solver.net.save_weights(weights, iteration)
            solver_state.write_state(state, _state_of(solver, weights, kept))
        except OSError as exc:
            if os.path.exists(weights) and solver.last_snapshot_iter != iteration:
                with contextlib.suppress(OSError):  # (a folder made read-only meanwhile keeps it: the error stands)
                    os.remove(weights)  # its state could not be written: a weights file alone is no snapshot
            _unwritten(solver, "the snapshot", weights, exc)
        for old in dropped:
            for path in run_folder.snapshot_paths(solver.spec.snapshot_prefix, old):
                if os.path.exists(path):
                    os.remove(path)
    solver.last_snapshot, solver.last_snapshot_iter = state, iteration
    solver.snapshots = kept
    solver.log.message(f"snapshot at iteration {iteration}: {weights}")
    return state


def claim_folder(solver) -> None:
    """Before a solver would first write into its snapshot folder (one made from Python: netspec train checks as
    it starts), refuse a folder holding another run's files, as netspec train does: never into or over them."""
    if not solver.folder_checked:
        run_folder.refuse_used(run_folder.folder_of(solver.spec.snapshot_prefix), from_python=True)
        solver.folder_checked = True


def save_best(solver) -> None:
    """Write the weights of the best test pass so far (``snapshot_best``), replacing the previous best."""
    claim_folder(solver)
    try:
        solver.net.save_weights(solver.best_weights_path, solver.iter)
    except OSError as exc:
        _unwritten(solver, "the best weights", solver.best_weights_path, exc)


def _unwritten(solver, what: str, path: str, exc: OSError) -> None:
    """Raise TrainingError for a file the disk refused; the snapshots written before are intact."""
    kept = f"the last snapshot, {solver.last_snapshot}, is intact" if solver.last_snapshot else "no snapshot exists"
    raise TrainingError(f"cannot write {what} of iteration {solver.iter} to {os.path.dirname(path)}: "
                        f"{exc.strerror or exc}; {kept}. Training stopped")


def _state_of(solver, weights: str, kept: list[int]) -> solver_state.SolverState:
    """The solver state to write beside ``weights``."""
    runtime = {"train": solver.net.runtime_state()}
    runtime.update({f"test{i}": net.runtime_state() if one_pass is None else one_pass.start  # (where passes start)
                    for i, (net, one_pass) in enumerate(zip(solver.test_nets, solver.test_passes))})
    progress = {"snapshots": kept}
    if solver.best is not None:
        progress["best"] = solver.best.state()
    if solver.plateau is not None:
        progress["early_stop"] = solver.plateau.state()
    if solver.loss_scale is not None:
        progress["loss_scale"] = solver.loss_scale.state()
    spec = solver.spec
    return solver_state.SolverState(
        iteration=solver.iter, solver_type=solver.params.type, rng_state=solver.backend.rng_state(),
        net_name=solver.net.name, net_config_hash=solver.net.graph.config_hash,
        solver_config_hash=spec.config_hash, solver_yaml=spec.text, net_yaml=spec.train_net_text,
        weights_file=os.path.basename(weights), weights_sha256=solver_state.file_sha256(weights),
        lr_step=multistep_count(solver.params, solver.iter), history=solver.optimizer.state(), runtime=runtime,
        loss_window=list(solver.losses), progress=progress, world_size=solver.comm.size,
        test_rng_state=solver.test_backend.rng_state(), random_stream=list(solver.backend.stream),
        test_random_stream=list(solver.test_backend.stream), params=_params_of(solver), threads=pool_size())


def _params_of(solver) -> dict:
    """The solver parameters the run uses (overrides applied, epochs in iterations), as JSON data."""
    return json.loads(json.dumps(dataclasses.asdict(solver.params)))


def restore(solver, path: str | os.PathLike, force: bool = False) -> None:
    """Continue ``solver`` from a solver state: weights, history, data positions, generators and iteration.

    Changed settings that cannot alter training (display, snapshots, tests,
    the length) are listed and accepted; a changed net or other setting is
    refused unless ``force``.
    """
    path = os.fspath(path)
    state = solver_state.read_state(path)
    weights = _check_resumable(solver, path, state, force)
    solver.optimizer.load_state(solver_state.read_history(path, solver.optimizer.history_shapes()), path)
    solver.net.load_weights(weights)
    solver.iter = state.iteration
    solver.losses.clear()
    solver.losses.extend(state.loss_window)
    with _malformed(path, "data positions"):
        solver.net.restore_runtime_state(state.runtime.get("train", {}))
        for index, (net, one_pass) in enumerate(zip(solver.test_nets, solver.test_passes)):
            net.restore_runtime_state(state.runtime.get(f"test{index}", {}))
            if one_pass is not None:
                one_pass.start = net.runtime_state()  # (the first batch of the run it continues: its order)
    with _malformed(path, "random generator states"):
        solver.backend.set_rng_state(state.rng_state)
        if state.test_rng_state:
            solver.test_backend.set_rng_state(state.test_rng_state)
        if state.random_stream:
            solver.backend.stream, solver.test_backend.stream = state.random_stream, state.test_random_stream
        else:
            solver.log.message(f"{path} predates the device's random stream: dropout masks from here on differ "
                               "from those the original run would have drawn")
    with _malformed(path, "progress (snapshots kept, watched outputs)"):
        solver.snapshots = [int(it) for it in state.progress.get("snapshots", [state.iteration])]
        for key, watch in (("best", solver.best), ("early_stop", solver.plateau)):
            if watch is not None and key in state.progress:
                watch.restore(state.progress[key])
    with _malformed(path, "loss scale and its counts"):
        if solver.loss_scale is not None and "loss_scale" in state.progress:
            solver.loss_scale.load_state(state.progress["loss_scale"])
    solver.last_snapshot, solver.last_snapshot_iter = path, state.iteration
    solver.folder_checked = solver.folder_checked or \
        os.path.dirname(os.path.abspath(path)) == run_folder.folder_of(solver.spec.snapshot_prefix)
    solver.log.message(f"resumed from {path} at iteration {solver.iter}")


def take_threads(path: str | os.PathLike) -> None:
    """Size the math pools as the run that wrote the state at ``path`` had them, unless the user chose a size:
    results depend on the count, and oneDNN picks its kernels for it as the nets are built, so this comes
    first.  (A state that cannot be read is left for :func:`restore` to refuse.)"""
    if pools_sized():
        return
    try:
        recorded = solver_state.read_state(path).threads
    except StateError:
        return
    recorded = min(recorded, all_cores())  # (a state from a larger machine: no more threads than cores)
    if recorded and recorded != pool_size():
        use_threads(recorded, note="as the run it continues had, for a bit-for-bit continuation: --threads sets "
                                   "another")


@contextlib.contextmanager
def _malformed(path: str, what: str):
    """Turn what a hand-edited or hostile state makes restoring ``what`` raise into one StateError."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
        raise StateError(f"{path}: its {what} are malformed ({shown(str(exc))})") from None


def _check_resumable(solver, path: str, state: solver_state.SolverState, force: bool) -> str:
    """Refuse a state this solver cannot continue from; return the path of the state's weights."""
    if state.world_size != solver.comm.size:
        raise StateError(f"{path}: the state was written by a run of {state.world_size} process(es), this run "
                         f"has {solver.comm.size}; resume with the same number (mpiexec -n {state.world_size}), "
                         "or start a new run from its weights with --weights")
    _review_changes(solver, path, state, force)
    if state.solver_type != solver.params.type:
        raise StateError(f"{path}: the state is of a {state.solver_type} solver, this solver is "
                         f"{solver.params.type}; their histories differ, so it cannot continue")
    weights = solver_state.weights_path(path, state)
    if not os.path.isfile(weights):
        raise StateError(f"{path}: its weights file {weights} is missing")
    if solver_state.file_sha256(weights) != state.weights_sha256:
        raise StateError(f"{path}: its weights file {weights} has changed since the state was written")
    return weights


def _review_changes(solver, path: str, state: solver_state.SolverState, force: bool) -> None:
    """Accept changed settings that cannot alter training, listing them; refuse the others unless ``force``.

    Raises StateError naming the changed solver settings (old and new values)
    and showing the train net's diff.
    """
    accepted, altering = _solver_changes(solver, state)
    net_changed = state.net_config_hash != solver.net.graph.config_hash
    if accepted:
        solver.log.message(f"resuming with changed settings that do not alter training: {', '.join(accepted)}")
    if not (altering or net_changed):
        return
    if force:
        forced = altering + (["the net"] if net_changed else [])
        solver.log.message(f"resuming with --force despite changes that alter training: {', '.join(forced)}")
        return
    names = " and ".join(name for name, changed in (("solver", altering), ("net", net_changed)) if changed)
    message = f"{path}: the {names} changed since this state was written"
    if altering:
        message += f" ({', '.join(altering)}), which alters training"
    message += "; resume with --force to continue anyway"
    if net_changed:
        spec = solver.spec
        before, after = state.net_yaml or state.solver_yaml, spec.train_net_text or spec.text  # inline: the solver's
        message += ". Changes:\n" + "\n".join(difflib.unified_diff(
            before.splitlines(), after.splitlines(), "net in the state", "net now", lineterm="", n=1))
    raise StateError(message)


def _solver_changes(solver, state: solver_state.SolverState) -> tuple[list[str], list[str]]:
    """The solver settings that differ from the state's, as ``key old -> new``: (harmless, altering training)."""
    if not state.params:  # a state from before settings were recorded: only the file's hash is known
        same = state.solver_config_hash == solver.spec.config_hash
        return [], [] if same else ["the solver file"]
    now, then = _params_of(solver), _defaults(solver.params)
    harmless = RESUME_MAY_CHANGE - (LENGTH_KEYS if solver.params.lr_policy in READS_MAX_ITER else set())
    if not solver.backend.is_gpu:
        harmless |= GPU_ONLY_KEYS
    accepted, altering = [], []
    for key, value in now.items():
        before = state.params.get(key, then.get(key, value))  # (a key the state lacks: the run had its default)
        if before != value:
            (accepted if key in harmless else altering).append(f"{key} {_shown(before)} -> {_shown(value)}")
    return accepted, altering


def _defaults(params) -> dict:
    """The JSON values of the defaults of the solver settings that have one: what a run whose state was written
    before a setting existed ran with (a new setting's default keeps the behaviour from before it)."""
    values = {}
    for field in dataclasses.fields(params):
        if field.metadata.get("required"):
            continue
        values[field.name] = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    return json.loads(json.dumps(values))


def _shown(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list, str)) or value is None else str(value)
