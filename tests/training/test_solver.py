"""The training loop against closed-form SGD, lr policies, iter_size, sharing with test nets, and resume."""

from __future__ import annotations

import io
import math
import os
import re
import signal

import h5py
import numpy as np
import pytest
import yaml
from devices import DEVICES

import netspec
from netspec.data.hdf5 import write_arrays, write_file_list
from netspec.engine.backend import Backend
from netspec.engine.registry import solver_class, solver_types
from netspec.errors import ConfigError, DataError, StateError, TrainingError
from netspec.solvers.lr_policies import learning_rate
from netspec.spec.solver_spec import SolverParams
from netspec.training.log import TrainingLog
from netspec.training.optimizer import Optimizer
from netspec.training.signals import signal_effects

QUIET = TrainingLog(quiet=True)
N, IN, OUT = 4, 3, 2


def tiny_solver(tmp_path, **hyper):
    """A float64 solver for ``p = W x + b`` under EuclideanLoss, fed by an Input layer."""
    net = {"name": "tiny", "layers": [
        {"name": "data", "type": "Input", "top": ["x", "y"],
         "input_param": {"shape": [{"dim": [N, IN]}, {"dim": [N, OUT]}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "p",
         "param": [{"lr_mult": 1, "decay_mult": 1}, {"lr_mult": 2, "decay_mult": 0}],
         "inner_product_param": {"num_output": OUT, "weight_filler": {"type": "gaussian", "std": 0.5},
                                 "bias_filler": {"type": "uniform", "min": -1, "max": 1}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "y"], "top": "loss"}]}
    text = yaml.safe_dump({"net": net, "max_iter": 100, "snapshot_prefix": str(tmp_path / "tiny"),
                           "random_seed": 3, **hyper})
    solver = netspec.load_solver(text, dtype=np.float64, log=QUIET)
    rng = np.random.default_rng(0)
    solver.net.blobs["x"].data[...] = rng.standard_normal((N, IN))
    solver.net.blobs["y"].data[...] = rng.standard_normal((N, OUT))
    return solver


def sgd_step(p, h, g, rate, t):
    h[0] = p.momentum * h[0] + rate * g
    return h[0]


def nesterov_step(p, h, g, rate, t):
    previous = h[0]
    h[0] = p.momentum * h[0] + rate * g
    return (1 + p.momentum) * h[0] - p.momentum * previous


def adagrad_step(p, h, g, rate, t):
    h[0] = h[0] + g ** 2
    return rate * g / (np.sqrt(h[0]) + p.delta)


def rmsprop_step(p, h, g, rate, t):
    h[0] = p.rms_decay * h[0] + (1 - p.rms_decay) * g ** 2
    return rate * g / (np.sqrt(h[0]) + p.delta)


def adadelta_step(p, h, g, rate, t):
    h[0] = p.momentum * h[0] + (1 - p.momentum) * g ** 2
    update = g * np.sqrt((h[1] + p.delta) / (h[0] + p.delta))
    h[1] = p.momentum * h[1] + (1 - p.momentum) * update ** 2
    return rate * update


def adam_step(p, h, g, rate, t):
    h[0] = p.momentum * h[0] + (1 - p.momentum) * g
    h[1] = p.momentum2 * h[1] + (1 - p.momentum2) * g ** 2
    return rate * np.sqrt(1 - p.momentum2 ** (t + 1)) / (1 - p.momentum ** (t + 1)) * h[0] / (np.sqrt(h[1]) + p.delta)


# The update rules written out independently of solvers/, one per registered type
REFERENCE_RULES = {"SGD": sgd_step, "Nesterov": nesterov_step, "AdaGrad": adagrad_step, "RMSProp": rmsprop_step,
                   "AdaDelta": adadelta_step, "Adam": adam_step, "AdamW": adam_step}
DECOUPLED_DECAY = {"AdamW"}  # decay added to the rule's step times the rate, not to the gradient


def reference_run(solver, iterations):
    """Caffe's loop, written out: clip the accumulated gradient, average, decay, then the rule."""
    p = solver.params
    rule = REFERENCE_RULES[p.type]
    x, y = (np.array(solver.backend.to_host(solver.net.blobs[name].data)) for name in "xy")
    weights = [np.array(solver.backend.to_host(blob.data)) for blob in solver.net.params["ip"]]
    lr_mults, decay_mults = (1.0, 2.0), (1.0, 0.0)
    history = [[np.zeros_like(w), np.zeros_like(w)] for w in weights]
    for it in range(iterations):
        dp = (x @ weights[0].T + weights[1] - y) / N
        grads = [p.iter_size * dp.T @ x, p.iter_size * dp.sum(0)]
        if p.clip_gradients >= 0:
            norm = math.sqrt(sum((g ** 2).sum() for g in grads))
            if norm > p.clip_gradients:
                grads = [g * p.clip_gradients / norm for g in grads]
        rate = learning_rate(p, it)
        for i in range(2):
            g = grads[i] / p.iter_size
            decay = p.weight_decay * decay_mults[i]
            regularizer = decay * (weights[i] if p.regularization_type == "L2" else np.sign(weights[i]))
            if p.type in DECOUPLED_DECAY:
                step = rule(p, history[i], g, rate * lr_mults[i], it) + rate * lr_mults[i] * regularizer
            else:
                step = rule(p, history[i], g + regularizer, rate * lr_mults[i], it)
            weights[i] = weights[i] - step
    return weights


MOMENTUM = {"SGD": 0.9, "Nesterov": 0.9, "AdaGrad": 0.0, "RMSProp": 0.0, "AdaDelta": 0.95, "Adam": 0.9, "AdamW": 0.9}
MATRIX = [
    {},
    {"weight_decay": 0.05},
    {"weight_decay": 0.05, "lr_policy": "cosine", "min_lr": 0.01, "warmup_iter": 2, "warmup_start_lr": 0.02},
    {"weight_decay": 0.1, "regularization_type": "L1", "lr_policy": "step", "gamma": 0.5, "stepsize": 2},
    {"clip_gradients": 0.1, "delta": 1e-6, "rms_decay": 0.9, "momentum2": 0.99},
    {"weight_decay": 0.01, "iter_size": 3, "clip_gradients": 0.5},
]


def fused(solver, on: bool):
    """The solver, its update run once per group of blobs (as on a GPU) when ``on``, else once per blob."""
    solver.optimizer = Optimizer(solver_class(solver.params.type), solver.params, solver.net.learnable_groups(),
                                 solver.backend, solver.net.dtype, fused=on)
    assert len(solver.optimizer.segments) == len(solver.net.learnable_groups() if on else solver.optimizer.places)
    return solver


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hyper", MATRIX, ids=["plain", "l2", "l2_cosine_warmup", "l1_step", "clip", "iter_size"])
@pytest.mark.parametrize("rule", sorted(REFERENCE_RULES))
def test_every_rule_matches_its_closed_form(tmp_path, rule, hyper, device):
    """Six steps of each rule against the loop written out, on the CPU and on a GPU, where each group's update
    is the rule's one kernel (its ``step_kernel``)."""
    solver = tiny_solver(tmp_path, type=rule, base_lr=0.1, momentum=MOMENTUM[rule], solver_mode=device.upper(),
                         **hyper)
    expected = reference_run(solver, 6)
    solver.step(6)
    assert solver.iter == 6
    for blob, want in zip(solver.net.params["ip"], expected):
        np.testing.assert_allclose(solver.backend.to_host(blob.data), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("hyper", MATRIX, ids=["plain", "l2", "l2_cosine_warmup", "l1_step", "clip", "iter_size"])
@pytest.mark.parametrize("rule", sorted(REFERENCE_RULES))
def test_an_update_by_group_is_the_update_blob_by_blob(tmp_path, rule, hyper):
    runs = []
    for grouped in (False, True):
        solver = fused(data_solver(tmp_path, 5, type=rule, base_lr=0.1, momentum=MOMENTUM[rule], **hyper), grouped)
        assert len(solver.optimizer.segments) == (1 if grouped else 4)  # (every blob has lr_mult 1, decay_mult 1)
        solver.step(6)
        runs.append(param_arrays(solver))
    (group,) = solver.net.learnable_groups()
    gaps = np.ones(group.data.shape, bool)
    for param, offset in group.members:
        gaps[offset:offset + param.blob.count] = False
    assert gaps.any() and not group.data[gaps].any()  # the alignment's gaps stay zeros
    for by_blob, by_group in zip(*runs):  # (the clipping norm sums in another order)
        np.testing.assert_allclose(by_group, by_blob, rtol=1e-13, atol=1e-15)


def test_an_update_by_group_keeps_nan_out_of_the_gaps_between_blobs(tmp_path):
    runs = []
    for grouped in (False, True):  # delta 0 makes 0 / 0 in the gaps: cleared with the gradients, never clipped
        solver = fused(data_solver(tmp_path, 5, type="AdaGrad", momentum=0, delta=0, clip_gradients=0.01), grouped)
        with np.errstate(divide="ignore", invalid="ignore"):
            solver.step(4)
        runs.append(param_arrays(solver))
    for by_blob, by_group in zip(*runs):
        assert np.isfinite(by_group).all()
        np.testing.assert_allclose(by_group, by_blob, rtol=1e-13, atol=1e-15)


def test_a_layer_that_gives_a_learnable_blob_new_arrays_stops_training_in_a_line(tmp_path):
    solver = tiny_solver(tmp_path, type="SGD", base_lr=0.1)
    weights = solver.net.params["ip"][0]
    weights.data = weights.data.copy()
    with pytest.raises(TrainingError, match=r"^layer 'ip' replaced the arrays of its learnable blob 0, so the update "
                                            r"would no longer reach it"):
        solver.step(1)


def test_the_rule_reads_each_iterations_rate_from_one_array_on_the_device(tmp_path):
    solver = tiny_solver(tmp_path, type="Adam", base_lr=0.1, momentum=0.9, lr_policy="step", gamma=0.5, stepsize=2)
    seen = []
    compute_update = solver.optimizer.rule.compute_update

    def spy(index, diff, rate):
        seen.append((np.shares_memory(rate, solver.optimizer.scalars), float(rate)))
        compute_update(index, diff, rate)

    solver.optimizer.rule.compute_update = spy
    solver.step(4)
    assert len(seen) == 8 and all(shared for shared, _ in seen)  # the weights', then the bias's (lr_mult 2)
    expected = [0.1 * 0.5 ** (it // 2) * math.sqrt(1 - 0.999 ** (it + 1)) / (1 - 0.9 ** (it + 1)) for it in range(4)]
    np.testing.assert_allclose([rate for _, rate in seen[::2]], expected, rtol=1e-12)
    np.testing.assert_allclose([rate for _, rate in seen[1::2]], 2 * np.array(expected), rtol=1e-12)


def test_every_registered_rule_is_in_the_matrix():
    assert set(REFERENCE_RULES) == set(solver_types())


@pytest.mark.parametrize("rule", ["AdaGrad", "RMSProp"])
def test_rules_without_momentum_refuse_it(tmp_path, rule):
    with pytest.raises(ConfigError, match=f"momentum: {rule} takes no momentum"):
        tiny_solver(tmp_path, type=rule, base_lr=0.1, momentum=0.9)


@pytest.mark.parametrize("grouped", [False, True], ids=["by_blob", "by_group"])
@pytest.mark.parametrize("rule", sorted(REFERENCE_RULES))
def test_every_rule_resumes_bit_identically(tmp_path, rule, grouped):
    hyper = {"type": rule, "momentum": MOMENTUM[rule], "weight_decay": 0.01}
    straight = fused(data_solver(tmp_path, batch=5, shuffle=True, **hyper), grouped)
    straight.step(8)
    interrupted = fused(data_solver(tmp_path, batch=5, shuffle=True, **hyper), grouped)
    interrupted.step(3)
    resumed = fused(data_solver(tmp_path, batch=5, shuffle=True, **hyper), not grouped)  # the state is blob by blob
    resumed.restore(interrupted.snapshot())
    resumed.step(5)
    for a, b in zip(param_arrays(straight), param_arrays(resumed)):
        assert np.array_equal(a, b)


def test_lr_policies_match_caffe_formulas():
    def rate(policy, iteration, **kw):
        return learning_rate(SolverParams(base_lr=0.1, max_iter=10, lr_policy=policy, **kw), iteration)

    assert rate("fixed", 7) == 0.1
    assert [rate("step", i, gamma=0.5, stepsize=3) for i in (0, 2, 3, 7)] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    assert rate("exp", 2, gamma=0.9) == pytest.approx(0.081)
    assert rate("inv", 10, gamma=0.1, power=1.0) == pytest.approx(0.05)
    assert [rate("multistep", i, gamma=0.1, stepvalue=[2, 5]) for i in (1, 2, 4, 5, 9)] == pytest.approx(
        [0.1, 0.01, 0.01, 0.001, 0.001])
    assert rate("poly", 5, power=2.0) == pytest.approx(0.025)
    assert rate("sigmoid", 5, gamma=1.0, stepsize=5) == pytest.approx(0.05)
    assert rate("sigmoid", 7, gamma=1.0, stepsize=5) == pytest.approx(0.1 / (1 + math.exp(-2)))
    assert rate("sigmoid", 0, gamma=1.0, stepsize=5000) == 0.0
    assert [rate("cosine", i, min_lr=0.02) for i in (0, 5, 10)] == pytest.approx([0.1, 0.06, 0.02])


def test_warmup_rises_linearly_to_the_policys_rate_and_then_hands_over():
    p = SolverParams(base_lr=0.1, max_iter=10, lr_policy="step", gamma=0.5, stepsize=4, warmup_iter=4,
                     warmup_start_lr=0.01)
    assert [learning_rate(p, i) for i in range(7)] == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05, 0.05, 0.05])
    from_zero = SolverParams(base_lr=0.1, max_iter=10, lr_policy="cosine", warmup_iter=5)
    target = 0.05 * (1 + math.cos(math.pi / 2))
    assert [learning_rate(from_zero, i) for i in (0, 1, 5, 10)] == pytest.approx([0.0, target / 5, target, 0.0])


def hdf5_source(folder, rows=24):
    """Two HDF5 files of random (x, y) rows and their list file; returns the list's path."""
    rng = np.random.default_rng(1)
    files = []
    for index in range(2):
        path = os.path.join(folder, f"part{index}.h5")
        write_arrays(path, {"x": rng.standard_normal((rows // 2, IN)), "y": rng.standard_normal((rows // 2, OUT))})
        files.append(path)
    write_file_list(os.path.join(folder, "list.txt"), files)
    return os.path.join(folder, "list.txt")


def data_solver(tmp_path, batch, iter_size=1, shuffle=False, dropout=False, log=QUIET, source=None, **hyper):
    """A float64 solver of a two-layer net fed by HDF5Data (24 rows, or the list file ``source``), snapshotting
    under ``tmp_path/snap``."""
    layers = [
        {"name": "data", "type": "HDF5Data", "top": ["x", "y"],
         "hdf5_data_param": {"source": source or hdf5_source(str(tmp_path)), "batch_size": batch,
                             "shuffle": shuffle}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "x", "top": "h",
         "inner_product_param": {"num_output": 5, "weight_filler": {"type": "xavier"}}},
        {"name": "ip2", "type": "InnerProduct", "bottom": "h", "top": "p",
         "inner_product_param": {"num_output": OUT, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "y"], "top": "loss"}]
    if dropout:
        layers.insert(2, {"name": "drop", "type": "Dropout", "bottom": "h", "top": "h",
                          "include": {"phase": "TRAIN"}})
    text = yaml.safe_dump({"net": {"name": "data_net", "layers": layers}, "max_iter": 100, "base_lr": 0.05,
                           "momentum": 0.9, "iter_size": iter_size, "random_seed": 5,
                           "snapshot_prefix": str(tmp_path / "snap" / "run"), **hyper})
    return netspec.load_solver(text, dtype=np.float64, log=log)


def param_arrays(solver):
    return [b.data.copy() for blobs in solver.net.params.values() for b in blobs]


def test_iter_size_equals_a_larger_batch(tmp_path):
    small = data_solver(tmp_path, batch=4, iter_size=3)
    large = data_solver(tmp_path, batch=12)
    small.step(5)
    large.step(5)
    for a, b in zip(param_arrays(small), param_arrays(large)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_resume_continues_bit_identically(tmp_path):
    hyper = {"weight_decay": 0.01, "lr_policy": "multistep", "gamma": 0.5, "stepvalue": [4, 9],
             "test_iter": [2], "test_interval": 4}
    straight = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    straight.step(14)
    interrupted = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    interrupted.step(6)
    state = interrupted.snapshot()
    assert state.endswith("run_iter_6.solverstate.h5")
    resumed = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    resumed.restore(state)
    assert resumed.iter == 6
    resumed.step(8)
    for a, b in zip(param_arrays(straight), param_arrays(resumed)):
        assert np.array_equal(a, b)
    assert list(straight.losses) == list(resumed.losses)


def test_resume_without_a_seed_continues_bit_identically(tmp_path):
    # the seeds drawn from the OS, the device stream's too, are in the snapshot
    hyper = {"random_seed": -1, "test_iter": [2], "test_interval": 4}
    first = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    first.step(6)
    state = first.snapshot()
    first.step(8)
    resumed = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    resumed.restore(state)
    resumed.step(8)
    for a, b in zip(param_arrays(first), param_arrays(resumed)):
        assert np.array_equal(a, b)
    assert list(first.losses) == list(resumed.losses)


def test_testing_never_changes_what_training_computes(tmp_path):
    # the test net's HDF5Data reshuffles when it wraps around: test nets draw from a generator of their own
    runs = [data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **tests)
            for tests in ({}, {"test_iter": [3], "test_interval": 2}, {"test_iter": [7], "test_interval": 3})]
    for solver in runs:
        solver.step(12)
    for other in runs[1:]:
        for a, b in zip(param_arrays(runs[0]), param_arrays(other)):
            assert np.array_equal(a, b)


def resumed_log(solver_args: dict, state: str, **changes) -> tuple[object, str]:
    """A data solver with ``changes`` resumed from ``state``, and what its log said."""
    stream = io.StringIO()
    solver = data_solver(**{**solver_args, **changes}, log=TrainingLog(stream=stream, progress=False))
    solver.restore(state)
    return solver, stream.getvalue()


def test_resume_accepts_changes_that_cannot_alter_training_and_lists_them(tmp_path):
    args = {"tmp_path": tmp_path, "batch": 5, "shuffle": True, "dropout": True, "test_iter": [2], "test_interval": 4}
    straight = data_solver(**args)
    straight.step(14)
    first = data_solver(**args)
    first.step(6)
    changes = {"display": 3, "test_iter": [3], "test_interval": 5, "snapshot": 4, "keep_last": 2, "max_iter": 200,
               "snapshot_best": {"output": "loss", "mode": "min"}, "snapshot_prefix": str(tmp_path / "elsewhere")}
    resumed, said = resumed_log(args, first.snapshot(), **changes)
    resumed.step(8)
    for a, b in zip(param_arrays(straight), param_arrays(resumed)):
        assert np.array_equal(a, b)
    (line,) = [line for line in said.splitlines() if line.startswith("resuming with changed settings")]
    assert line.startswith("resuming with changed settings that do not alter training: ")
    for shown in ("max_iter 100 -> 200", "test_iter [2] -> [3]", "test_interval 4 -> 5", "display 0 -> 3",
                  "snapshot 0 -> 4", "keep_last null -> 2", 'snapshot_best null -> {"output": "loss"',
                  f'snapshot_prefix "{tmp_path}/snap/run" -> "{tmp_path}/elsewhere"'):
        assert shown in line


def test_resume_on_the_cpu_accepts_a_changed_precision_or_determinism(tmp_path):
    """The CPU computes the same with either: a changed setting is listed, not refused."""
    args = {"tmp_path": tmp_path, "batch": 5}
    straight = data_solver(**args)
    straight.step(4)
    first = data_solver(**args)
    first.step(2)
    resumed, said = resumed_log(args, first.snapshot(), precision="tf32", deterministic=True)
    resumed.step(2)
    for a, b in zip(param_arrays(straight), param_arrays(resumed)):
        assert np.array_equal(a, b)
    assert ('resuming with changed settings that do not alter training: deterministic False -> True, precision '
            '"fp32" -> "tf32"') in said


@pytest.mark.parametrize(("first", "changes", "shown"), [
    ({}, {"base_lr": 0.1}, "base_lr 0.05 -> 0.1"),
    ({}, {"random_seed": 6, "momentum": 0.5}, "momentum 0.9 -> 0.5, random_seed 5 -> 6"),
    ({}, {"iter_size": 2, "weight_decay": 1e-3}, "weight_decay 0.0 -> 0.001, iter_size 1 -> 2"),
    ({"lr_policy": "poly", "power": 1.0}, {"max_iter": 200}, "max_iter 100 -> 200"),  # poly reads max_iter
])
def test_resume_refuses_changes_that_alter_training_unless_forced(tmp_path, first, changes, shown):
    args = {"tmp_path": tmp_path, "batch": 5, **first}
    solver = data_solver(**args)
    solver.step(2)
    state = solver.snapshot()
    with pytest.raises(StateError) as error:
        resumed_log(args, state, **changes)
    assert str(error.value) == (f"{state}: the solver changed since this state was written ({shown}), which alters "
                                "training; resume with --force to continue anyway")
    forced = data_solver(**{**args, **changes}, log=TrainingLog(stream=io.StringIO(), progress=False))
    forced.restore(state, force=True)
    assert f"resuming with --force despite changes that alter training: {shown}" in forced.log.stream.getvalue()
    assert forced.iter == 2


def test_test_nets_share_the_train_nets_weights(tmp_path):
    solver = data_solver(tmp_path, batch=4, test_iter=[1], test_interval=1)
    solver.step(2)
    test_net = solver.test_nets[0]
    assert test_net.phase == "TEST"
    for name, blobs in solver.net.params.items():
        for mine, theirs in zip(blobs, test_net.params[name]):
            assert np.shares_memory(mine.data, theirs.data)


def test_signals_request_a_snapshot_or_a_stop_between_iterations(tmp_path):
    solver = tiny_solver(tmp_path, base_lr=0.01)
    with signal_effects(solver, sigint="snapshot", sighup="stop"):
        os.kill(os.getpid(), signal.SIGINT)
        solver.step(3)
        assert solver.iter == 3 and os.path.exists(tmp_path / "tiny_iter_1.solverstate.h5")
        os.kill(os.getpid(), signal.SIGHUP)
        solver.solve()
    assert solver.stopped_early and solver.iter == 4
    assert os.path.exists(tmp_path / "tiny_iter_4.weights.h5")
    with signal_effects(solver, sigint="none"):
        os.kill(os.getpid(), signal.SIGINT)
        solver.step(1)
    assert solver.iter == 5


def test_a_non_finite_loss_stops_with_the_iteration_and_layer(tmp_path):
    solver = tiny_solver(tmp_path, base_lr=1e30, snapshot=1)
    with pytest.raises(TrainingError) as error, np.errstate(over="ignore", invalid="ignore"):
        solver.step(20)
    stopped_at = solver.iter
    assert str(error.value).startswith(
        f"iteration {stopped_at}: the loss is inf; the first non-finite output is layer 'loss' top 'loss'. "
        f"Training stopped; the last snapshot is {tmp_path}/tiny_iter_{stopped_at}.solverstate.h5")
    fresh = tiny_solver(tmp_path, base_lr=0.1)
    fresh.net.params["ip"][1].data[0] = np.nan
    with pytest.raises(TrainingError, match="iteration 0: the loss is nan; the first non-finite output is layer 'ip' "
                                            "top 'p'.*no snapshot was written"):
        fresh.step(1)


def test_with_iter_size_the_culprit_is_the_batch_that_went_non_finite(tmp_path):
    source = hdf5_source(str(tmp_path))
    with h5py.File(tmp_path / "part0.h5", "a") as handle:
        handle["x"][1, 0] = np.inf  # in the first of the two batches of iteration 0
    solver = data_solver(tmp_path, batch=4, iter_size=2, source=source)
    with np.errstate(invalid="ignore"), pytest.raises(TrainingError, match="^iteration 0: the loss is nan; the first non-finite output is layer "
                                            "'data' top 'x'"):
        solver.step(1)


def test_losses_read_at_display_time_only_train_the_same(tmp_path, monkeypatch):
    # as on a GPU: the loss stays on the device and is read every read_every iterations (display time), in one copy
    hyper = {"average_loss": 4, "clip_gradients": 0.5, "test_iter": [2], "test_interval": 10}
    every = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    every.step(20)
    deferred = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    assert deferred.read_every == 1  # on the CPU a read costs nothing
    deferred.read_every = 8
    reads = []
    monkeypatch.setattr(Backend, "to_host", lambda self, array: reads.append(array.shape) or np.asarray(array))
    deferred.step(20)
    monkeypatch.undo()
    # the test at 0 (one output, scored in one read), 8 losses, the 2 before the test at 10, the test, 8 losses,
    # and the 2 when step ends
    assert reads == [(1,), (8,), (2,), (1,), (8,), (2,)]
    assert list(deferred.losses) == list(every.losses)
    for a, b in zip(param_arrays(every), param_arrays(deferred)):
        assert np.array_equal(a, b)


def test_a_non_finite_loss_read_later_names_its_iteration_and_the_culprit_now(tmp_path):
    solver = tiny_solver(tmp_path, base_lr=1e30)
    solver.read_every = 10
    with pytest.raises(TrainingError) as error, np.errstate(over="ignore", invalid="ignore"):
        solver.step(20)
    assert solver.iter == 9 and re.match(r"iteration [1-8]: the loss is (inf|nan); at iteration 9 the first "
                                         r"non-finite output is layer '\w+' top '\w+'\. Training stopped; no "
                                         r"snapshot was written", str(error.value)), str(error.value)


def test_a_bad_label_checked_on_the_device_is_raised_when_the_losses_are_read(tmp_path):
    # as on a GPU: the check waits on the device for the next read; index 0 stands in for the label meanwhile
    text = yaml.safe_dump({"net": {"name": "labels", "layers": [
        {"name": "data", "type": "Input", "top": ["x", "y"], "input_param": {"shape": [{"dim": [N, IN]}, {"dim": [N]}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "p", "inner_product_param": {"num_output": 3}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["p", "y"], "top": "loss"}]},
        "max_iter": 10, "base_lr": 0.1, "snapshot_prefix": str(tmp_path / "s"), "random_seed": 1})
    solver = netspec.load_solver(text, dtype=np.float64, log=QUIET)
    solver.read_every, solver.backend.defer_checks = 4, True
    solver.net.blobs["y"].data[...] = 1
    solver.step(2)
    solver.net.blobs["y"].data[1:3] = [1.5, 7]
    with pytest.raises(DataError, match=r"^layer 'loss': label 1\.5 of bottom 'y' is not a class index 0 to 2 \(2 such "
                                        r"labels in the batch\)$"):
        solver.step(5)
    assert solver.iter == 5  # read with the losses of iterations 2 to 5 (step read those before)


def test_layer_names_with_slashes_snapshot_and_resume(tmp_path):
    text = yaml.safe_dump({"net": {"name": "slashes", "layers": [
        {"name": "data", "type": "Input", "top": ["x", "y"],
         "input_param": {"shape": [{"dim": [N, IN]}, {"dim": [N, OUT]}]}},
        {"name": "block/fc", "type": "InnerProduct", "bottom": "x", "top": "p",
         "inner_product_param": {"num_output": OUT, "weight_filler": {"type": "gaussian"}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "y"], "top": "loss"}]},
        "max_iter": 10, "base_lr": 0.1, "momentum": 0.9, "snapshot_prefix": str(tmp_path / "s"), "random_seed": 1})
    first = netspec.load_solver(text, dtype=np.float64, log=QUIET)
    first.step(2)
    resumed = netspec.load_solver(text, dtype=np.float64, log=QUIET)
    resumed.restore(first.snapshot())
    assert np.array_equal(resumed.rule.history[0][0], first.rule.history[0][0])
    assert np.array_equal(resumed.net.params["block/fc"][0].data, first.net.params["block/fc"][0].data)


def test_a_snapshot_in_a_folder_made_read_only_meanwhile_fails_in_one_line(tmp_path, monkeypatch):
    solver = data_solver(tmp_path, batch=4)
    solver.step(2)

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    remove = os.remove
    monkeypatch.setattr("netspec.training.solver_state.write_state", refused)
    monkeypatch.setattr(os, "remove", lambda path: refused() if path.endswith(".weights.h5") else remove(path))
    with pytest.raises(TrainingError, match="cannot write the snapshot of iteration 2 to .*: Operation not permitted; "
                                            "no snapshot exists. Training stopped"):
        solver.snapshot()


@pytest.mark.parametrize(("precision", "why"), [("tf32", "the CPU has no TF32"),
                                                ("bf16-mixed", "netspec mixes precisions on a GPU only")])
def test_precision_tf32_or_bf16_mixed_on_the_cpu_trains_in_fp32_saying_so(tmp_path, precision, why):
    solver = data_solver(tmp_path, batch=4, precision=precision)
    assert solver.backend.precision == "fp32"
    assert f"precision {precision}: {why}, so training computes in fp32" in solver.warnings


def test_a_solver_of_python_never_snapshots_into_another_runs_folder_but_continues_its_own(tmp_path):
    """As netspec train refuses a folder holding another run: the first snapshot of a fresh solver refuses it
    (naming the state to restore), a solver that restored a state of that folder snapshots on beside it, and one
    that snapshotted there keeps doing so whatever state it restores."""
    first = tiny_solver(tmp_path, base_lr=0.01)
    first.step(2)
    state = first.snapshot()
    second = tiny_solver(tmp_path, base_lr=0.01)
    second.step(2)
    with pytest.raises(netspec.errors.NetspecError, match=f"{tmp_path} already holds a run \\(2 snapshot file\\(s\\)\\); "
                                                          f"continue it with solver.restore\\('{re.escape(state)}'\\), "
                                                          "give the solver another snapshot_prefix, or move it away"):
        second.snapshot()
    second.restore(state)
    second.step(1)
    assert second.snapshot().endswith("tiny_iter_3.solverstate.h5")
    first.step(2)
    assert first.snapshot().endswith("tiny_iter_4.solverstate.h5")  # (its own folder: on as before)
    elsewhere = tiny_solver(tmp_path / "other", base_lr=0.01)
    elsewhere.step(1)
    (tmp_path / "other").mkdir()
    elsewhere.snapshot()
    elsewhere.restore(state)  # (a state of another folder: its own snapshots stay its own)
    assert elsewhere.snapshot().endswith("tiny_iter_2.solverstate.h5")


def test_a_solver_of_python_refuses_another_runs_folder_before_it_trains(tmp_path):
    """Solving refuses it at once, not after max_iter iterations whose final snapshot could not be written."""
    tiny_solver(tmp_path, base_lr=0.01).snapshot()
    solver = tiny_solver(tmp_path, base_lr=0.01)
    with pytest.raises(netspec.errors.NetspecError, match="already holds a run"):
        solver.solve()
    assert solver.iter == 0
