"""Epoch units, best-model snapshots, keep_last, early stopping and --debug-info, and their bad-input errors."""

from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest
from test_solver import data_solver, tiny_solver

from netspec.errors import ConfigError
from netspec.training.log import TrainingLog

TESTED = {"test_iter": [2], "test_interval": 2}


def snapshot_files(folder):
    return sorted(p.name for p in folder.glob("*.h5"))


def config_errors(make, *args, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as error:
        make(*args, **kwargs)
    return [str(problem) for problem in error.value.problems]


def test_epoch_counts_become_iterations_from_the_data_size(tmp_path):
    # 24 records, batch 5, iter_size 2: an epoch is 2.4 iterations
    solver = data_solver(tmp_path, batch=5, iter_size=2, max_iter=None, max_epoch=5, test_iter=[1],
                         test_interval_epochs=1.0, snapshot_epochs=2.0)
    assert solver.iterations_per_epoch == pytest.approx(2.4)
    assert (solver.params.max_iter, solver.params.test_interval, solver.params.snapshot) == (12, 2, 5)
    assert solver.log.where(6) == "iter 6 (epoch 2.50)"


def test_the_log_shows_epochs_and_metrics_record_them(tmp_path):
    stream = io.StringIO()
    solver = data_solver(tmp_path, batch=6, display=2, max_iter=4, test_iter=[1], test_interval=4,
                         log=TrainingLog(run_dir=str(tmp_path / "run"), stream=stream, progress=False))
    solver.solve()
    assert "iter 2 (epoch 0.50): loss = " in stream.getvalue()
    assert "iter 4 (epoch 1.00): test: loss = " in stream.getvalue()
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(e["phase"], e["epoch"]) for e in events] == [("TEST", 0.0), ("TRAIN", 0.0), ("TRAIN", 0.5),
                                                         ("TEST", 1.0)]


def test_the_best_weights_are_those_of_the_best_test_pass(tmp_path):
    metrics = tmp_path / "run"
    solver = data_solver(tmp_path, batch=4, max_iter=12, base_lr=0.2, snapshot_best={"output": "loss", "mode": "min"},
                         log=TrainingLog(run_dir=str(metrics), quiet=True), **TESTED)
    solver.solve()
    tests = [json.loads(line) for line in (metrics / "metrics.jsonl").read_text().splitlines()]
    tests = [e for e in tests if e["phase"] == "TEST"]
    best = min(tests, key=lambda e: e["loss"])
    assert (solver.best.best, solver.best.best_iter) == (best["loss"], best["iter"])
    path = tmp_path / "snap" / "run_best.weights.h5"
    with h5py.File(path) as handle:
        assert handle.attrs["iteration"] == best["iter"]
    check = data_solver(tmp_path, batch=4, **TESTED)
    check.net.load_weights(path)
    assert check.test_nets[0].score(2)["loss"] == pytest.approx(best["loss"], rel=1e-12)


def test_keep_last_deletes_older_periodic_snapshots_across_a_resume(tmp_path):
    hyper = {"snapshot": 2, "keep_last": 2, "snapshot_best": {"output": "loss", "mode": "min"}, **TESTED}
    solver = data_solver(tmp_path, batch=4, max_iter=10, **hyper)
    solver.solve()
    assert snapshot_files(tmp_path / "snap") == [
        "run_best.weights.h5", "run_iter_10.solverstate.h5", "run_iter_10.weights.h5",
        "run_iter_8.solverstate.h5", "run_iter_8.weights.h5"]
    resumed = data_solver(tmp_path, batch=4, max_iter=14, **hyper)
    resumed.restore(tmp_path / "snap" / "run_iter_10.solverstate.h5", force=True)  # max_iter grew
    assert resumed.best.best == solver.best.best
    resumed.solve()
    assert snapshot_files(tmp_path / "snap") == [
        "run_best.weights.h5", "run_iter_12.solverstate.h5", "run_iter_12.weights.h5",
        "run_iter_14.solverstate.h5", "run_iter_14.weights.h5"]


def test_a_resumed_run_neither_counts_nor_declares_again_the_test_its_state_holds(tmp_path):
    """A snapshot due where a test is (periodic, or the last) is written after that test, so its state holds it:
    testing again on resuming there changes nothing (no second "best so far", no stale pass counted)."""
    hyper = {"snapshot": 4, "snapshot_best": {"output": "loss", "mode": "min"},
             "early_stop": {"output": "loss", "mode": "min", "patience": 5}, "test_iter": [2], "test_interval": 4}
    first = data_solver(tmp_path, batch=4, max_iter=8, **hyper)
    first.solve()
    for iteration in (4, 8):
        stream = io.StringIO()
        resumed = data_solver(tmp_path, batch=4, max_iter=12, log=TrainingLog(stream=stream, progress=False), **hyper)
        resumed.restore(tmp_path / "snap" / f"run_iter_{iteration}.solverstate.h5", force=True)  # max_iter grew
        assert resumed.plateau.last_iter == resumed.best.last_iter == iteration
        before = (resumed.best.best, resumed.best.best_iter, resumed.plateau.stale)
        resumed.step(1)  # tests at the iteration again: the same values
        assert (resumed.best.best, resumed.best.best_iter, resumed.plateau.stale) == before
        assert "so far" not in stream.getvalue() and f"iter {iteration} (epoch" in stream.getvalue()
        resumed.close()
    assert first.best.last_iter == first.plateau.last_iter == 8


def test_early_stop_ends_training_when_the_output_stops_improving(tmp_path):
    stream = io.StringIO()
    solver = data_solver(tmp_path, batch=4, base_lr=1e-9, test_iter=[6], test_interval=3,
                         early_stop={"output": "loss", "mode": "min", "patience": 2, "min_delta": 1e-3},
                         log=TrainingLog(stream=stream, progress=False))
    solver.solve()
    assert solver.iter == 6 and solver.stopped_early
    assert solver.stop_reason.startswith("early stop at iteration 6: test loss has not improved by more than "
                                         "0.001 in 2 test passes (best ")
    assert solver.stop_reason.endswith(" at iteration 0)")
    assert solver.stop_reason in stream.getvalue()
    assert (tmp_path / "snap" / "run_iter_6.weights.h5").exists()


def test_early_stop_waits_while_the_output_improves(tmp_path):
    solver = data_solver(tmp_path, batch=4, max_iter=12, base_lr=0.01, test_iter=[6], test_interval=2,
                         early_stop={"output": "loss", "mode": "min", "patience": 1})
    solver.solve()
    assert solver.iter == 12 and not solver.stopped_early and solver.plateau.best_iter == 12


def test_debug_info_logs_blob_magnitudes_and_update_ratios(tmp_path):
    stream = io.StringIO()
    solver = tiny_solver(tmp_path, base_lr=0.1, display=1)
    solver.log, solver.debug_info = TrainingLog(stream=stream, progress=False), True
    before = solver.net.params["ip"][0].data.copy()
    solver.step(1)
    ratio = np.linalg.norm(solver.net.params["ip"][0].data - before) / np.linalg.norm(before)
    lines = stream.getvalue().splitlines()
    assert any(line.startswith("iter 0 debug: blob p: mean |data| = ") for line in lines)
    assert (f"iter 0 debug: param ip[0]: mean |w| = {np.abs(before).mean():.4g}, update/weight = {ratio:.4g}"
            in lines)


def test_bad_training_options_are_refused_before_training(tmp_path):
    def errors(**hyper):
        return config_errors(data_solver, tmp_path, batch=4, **hyper)

    [message] = errors(keep_last=0)
    assert message.endswith("keep_last: must be at least 1 (the newest snapshot is always kept), got 0")
    [message] = errors(early_stop={"output": "los", "mode": "min", "patience": 2}, **TESTED)
    assert message.endswith("early_stop: test net 0 has no one-value output 'los'; did you mean 'loss'? "
                            "(it has: loss)")
    [message] = errors(snapshot_best={"output": "loss", "mode": "min"})
    assert message.endswith("snapshot_best: follows test results, so it needs a test net and test_interval "
                            "(or test_interval_epochs)")
    [message] = errors(snapshot_best={"output": "loss", "mode": "best"}, **TESTED)
    assert message.endswith("snapshot_best.mode: 'best' is not one of max, min")
    test_net, patience = errors(early_stop={"output": "loss", "mode": "min", "patience": 0, "test_net": 1}, **TESTED)
    assert test_net.endswith("early_stop: test_net 1 does not exist (the solver has 1 test net(s), numbered from 0)")
    assert patience.endswith("early_stop: patience must be at least 1, got 0")
    assert errors(max_epoch=2)[0].endswith("max_epoch: give the length of training as max_iter or max_epoch, "
                                           "not both")
    assert errors(max_iter=None)[0].endswith("max_iter: give the length of training as max_iter or max_epoch")
    assert errors(min_lr=0.01)[0].endswith("min_lr: only the cosine policy uses min_lr (lr_policy is 'fixed')")
    assert errors(warmup_iter=100)[0].endswith("warmup_iter: must be less than max_iter (100), got 100")
    assert errors(test_iter=[1], test_interval=2, test_interval_epochs=1.0)[0].endswith(
        "test_interval_epochs: give test_interval or test_interval_epochs, not both")


def test_epochs_need_a_data_layer_that_knows_its_size(tmp_path):
    [message] = config_errors(tiny_solver, tmp_path, base_lr=0.1, max_iter=None, max_epoch=3)
    assert message.endswith("max_epoch: counts epochs, but the train net cannot tell how many records an epoch "
                            "has: its data layer 'data' (Input) does not know its size; give iteration counts "
                            "instead, or read the data with HDF5Data")
