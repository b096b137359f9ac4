"""`netspec plot` and `netspec lr-plot`: what they read, what they draw, and their errors."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from test_cli import fails, run
from test_solver import hdf5_source

from netspec.errors import NetspecError
from netspec.inspect.plots import plot_metrics, schedule
from netspec.spec.solver_spec import SolverParams
from netspec.training.run_folder import read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_metrics(path, events):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def trained(it, loss, lr=0.1):
    return {"iter": it, "phase": "TRAIN", "lr": lr, "smoothed_loss": loss, "images_per_s": 10.0}


def scored(it, accuracy, lr=0.1, **extra):
    return {"iter": it, "phase": "TEST", "lr": lr, "accuracy": accuracy, **extra}


def test_a_resumed_runs_later_events_replace_the_repeated_ones(tmp_path):
    path = write_metrics(tmp_path / "m.jsonl", [trained(0, 2.0), trained(10, 1.0), trained(20, 0.5), scored(20, 0.6),
                                                trained(10, 0.9), trained(20, 0.4), scored(20, 0.7)])
    events = read_metrics(path)
    assert [(e["phase"], e["iter"]) for e in events] == [("TRAIN", 0), ("TRAIN", 10), ("TRAIN", 20), ("TEST", 20)]
    assert [e.get("smoothed_loss", e.get("accuracy")) for e in events] == [2.0, 0.9, 0.4, 0.7]


def test_plot_draws_every_run_and_output(tmp_path):
    first = write_metrics(tmp_path / "a" / "metrics.jsonl", [trained(0, 2.0), scored(0, 0.1), trained(10, "nan"),
                                                             scored(10, 0.5, test_net=1)])
    second = write_metrics(tmp_path / "b" / "metrics.jsonl", [trained(0, 3.0, lr=0.2), scored(0, 0.2, lr=0.2)])
    figure = plot_metrics([str(first), str(second)], tmp_path / "curves.png")
    loss_axes, test_axes, lr_axes = figure.axes
    assert [line.get_label() for line in loss_axes.lines] == ["a", "b"]
    assert list(loss_axes.lines[0].get_ydata())[0] == 2.0 and str(loss_axes.lines[0].get_ydata()[1]) == "nan"
    assert [line.get_label() for line in test_axes.lines] == ["a: accuracy", "a: accuracy (test net 1)",
                                                             "b: accuracy"]
    assert list(test_axes.lines[1].get_xdata()) == [10]
    assert list(lr_axes.lines[1].get_ydata()) == [0.2, 0.2]
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_plot_through_the_cli(tmp_path):
    metrics = write_metrics(tmp_path / "run" / "metrics.jsonl", [trained(0, 2.0), scored(0, 0.1)])
    result = run("plot", metrics, "-o", tmp_path / "out.png")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {tmp_path / 'out.png'}"
    assert (tmp_path / "out.png").read_bytes().startswith(PNG_SIGNATURE)


def test_bad_metrics_files_are_named_with_their_line(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(trained(0, 1.0)) + "\n{not json\n")
    result = run("plot", broken, "-o", tmp_path / "x.png")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {broken}:2: not a JSON line (")
    foreign = write_metrics(tmp_path / "foreign.jsonl", [{"step": 3}])
    with pytest.raises(NetspecError, match=r"foreign.jsonl:1: not a training event \(needs 'iter' and 'phase'\)"):
        read_metrics(foreign)
    assert read_metrics(write_metrics(tmp_path / "empty.jsonl", [])) == []
    assert fails("plot", tmp_path / "empty.jsonl", "-o", tmp_path / "x.png") == (
        f"error: {tmp_path}/empty.jsonl: no training events in the file")
    with pytest.raises(NetspecError, match="missing.jsonl: cannot read metrics: No such file or directory"):
        read_metrics(tmp_path / "missing.jsonl")
    assert not (tmp_path / "x.png").exists()


def test_plotting_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    metrics = write_metrics(tmp_path / "m.jsonl", [trained(0, 1.0)])
    with pytest.raises(NetspecError, match=r"plotting needs matplotlib: python3 -m pip install 'netspec\[plot\]'"):
        plot_metrics([str(metrics)], tmp_path / "x.png")


def test_the_schedule_covers_warm_up_and_the_whole_run():
    params = SolverParams(base_lr=0.1, max_iter=100_000, lr_policy="cosine", warmup_iter=1000, warmup_start_lr=0.0)
    iterations, rates = schedule(params)
    assert iterations[0] == 0 and iterations[-1] == 100_000 and 1000 in iterations and len(iterations) <= 20_002
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert max(rates) == rates[iterations.index(1000)]
    assert schedule(SolverParams(base_lr=0.1, max_iter=3))[0] == [0, 1, 2, 3]


def test_lr_plot_through_the_cli_including_epochs(tmp_path):
    net = {"name": "n", "layers": [
        {"name": "data", "type": "HDF5Data", "top": ["x", "y"],
         "hdf5_data_param": {"source": hdf5_source(str(tmp_path)), "batch_size": 6}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "p", "inner_product_param": {"num_output": 2}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "y"], "top": "loss"}]}
    solver = tmp_path / "solver.yaml"
    solver.write_text(yaml.safe_dump({"net": net, "base_lr": 0.1, "max_epoch": 10, "lr_policy": "step",
                                      "gamma": 0.5, "stepsize": 20}))
    result = run("lr-plot", solver, "-o", tmp_path / "lr.png")
    assert result.returncode == 0, result.stderr
    # 24 records in batches of 6: 10 epochs are 40 iterations
    assert result.stdout.strip() == (f"wrote {tmp_path / 'lr.png'}: lr 0.1 at iteration 0, 0.1 at most, "
                                     "0.025 at iteration 40")
    assert (tmp_path / "lr.png").read_bytes().startswith(PNG_SIGNATURE)
