"""The dashboard's Per class tables over HTTP: a run page's, from the per_class of its last test events (class
names from the manifest of the dataset its TEST phase reads, escaped), and a zoo model's, from its card."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy
import pytest
from test_dashboard import client, event, make_run

import netspec
from netspec.data.dataset import DatasetWriter
from netspec.model_zoo.publish import PublishRequest, publish
from netspec.model_zoo.zoo import Zoo

ROOT = Path(__file__).parent.parent.parent
HOSTILE = "<script>alert(1)</script>"
SOLVER = "net: net.yaml\nbase_lr: 0.01\nmax_iter: 200\ntest_iter: [1, 1]\ntest_interval: 50\n"
NET = """layers:
  - {name: data, type: Data, top: [data, label], data_param: {source: data/train, batch_size: 3},
     include: {phase: TRAIN}}
  - {name: data, type: Data, top: [data, label], data_param: {source: data/test, batch_size: 3},
     include: {phase: TEST}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
  - {name: accuracy, type: Accuracy, bottom: [ip, label], top: [accuracy, per_class], include: {phase: TEST}}
"""


def dataset(folder: Path, names: list[str]) -> None:
    """A dataset of one 1x2x2 record of each class, its classes named ``names``."""
    writer = DatasetWriter(str(folder))
    for label in range(len(names)):
        writer.add(numpy.zeros((1, 2, 2), dtype=numpy.uint8), label)
    writer.finish(names, "0" * 64, {})


def pass_event(iteration: int, figures: list, net: int = 0, top: str = "per_class") -> dict:
    """A test event of test net ``net`` with the per-class accuracies ``figures`` of the Accuracy top ``top``."""
    return event(iteration, "TEST", test_net=net, accuracy=0.5, per_class={top: figures})


@pytest.fixture
def workspace(tmp_path) -> Path:
    """Runs written by hand: "named" (its solver and net beside it, its TEST data's classes named, one of them
    hostile; two test nets), "numbered" (no config it read: its classes numbered) and "plain" (no per_class)."""
    dataset(tmp_path / "data" / "train", ["train-a", "train-b", "train-c"])
    dataset(tmp_path / "data" / "test", ["cat", HOSTILE, "dog"])
    (tmp_path / "solver.yaml").write_text(SOLVER)
    (tmp_path / "net.yaml").write_text(NET)
    named = make_run(tmp_path / "named", [event(0, smoothed_loss=1.0), pass_event(50, [0.5, 0.25, None]),
                                          pass_event(50, [0.0, 0.0, 0.0], net=1), event(100, smoothed_loss=0.5),
                                          pass_event(100, [0.75, 0.25, 1.0]), pass_event(100, [1, 1, 1], net=1)])
    (named / "config" / "solver.yaml").write_text(SOLVER)
    (named / "config" / "sources.json").write_text(json.dumps({"solver": str(tmp_path / "solver.yaml"),
                                                               "train_net": None}))
    make_run(tmp_path / "numbered", [pass_event(10, [0.5, "nan", 1.0, 0.25], top="<b>top</b>")])
    make_run(tmp_path / "plain", [event(10, "TEST", accuracy=0.5)])
    return tmp_path


def rows(page: str, caption: str) -> list[str]:
    """The rows of the per-class table captioned ``caption``."""
    table = re.search(f"<caption>{re.escape(caption)}</caption>.*?<tbody>(.*?)</tbody>", page)
    assert table, page
    return re.findall(r"<tr[^>]*>.*?</tr>", table.group(1))


def test_a_run_page_shows_each_class_accuracy_of_its_last_test_pass_with_the_change(workspace):
    dashboard = client(workspace)
    page = dashboard.get("/run", params={"run": "named"}).text
    assert '<section id="per-class">\n<h2>Per class</h2>' in page
    assert "<th>class</th><th>label</th><th>accuracy</th><th>change</th>" in page
    assert rows(page, "per_class at iteration 100") == [
        "<tr><td>cat</td><td>0</td><td>0.75</td><td>+0.25</td></tr>",
        '<tr class="lowest"><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>1</td><td>0.25</td><td>+0</td></tr>',
        "<tr><td>dog</td><td>2</td><td>1</td><td>–</td></tr>"]  # (no record of it in the pass before)
    assert rows(page, "per_class at iteration 100 (test net 1)") == [  # all alike: none marked
        f"<tr><td>{name}</td><td>{label}</td><td>1</td><td>+1</td></tr>"
        for label, name in enumerate(["cat", "&lt;script&gt;alert(1)&lt;/script&gt;", "dog"])]
    assert HOSTILE not in page
    with open(workspace / "named" / "metrics.jsonl", "a") as handle:  # the next pass, as training appends it
        handle.write(json.dumps(pass_event(150, [0.5, 0.5, 0.75])) + "\n")
    page = dashboard.get("/run", params={"run": "named"}).text
    assert rows(page, "per_class at iteration 150") == [
        '<tr class="lowest"><td>cat</td><td>0</td><td>0.5</td><td>-0.25</td></tr>',
        '<tr class="lowest"><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>1</td><td>0.5</td><td>+0.25</td></tr>',
        "<tr><td>dog</td><td>2</td><td>0.75</td><td>-0.25</td></tr>"]
    events = dashboard.get("/api/runs/metrics", params={"run": "named"}).json()["events"]
    assert events[-1]["per_class"] == {"per_class": [0.5, 0.5, 0.75]}


def test_without_class_names_the_classes_are_numbered_and_a_run_without_figures_shows_none(workspace):
    dashboard = client(workspace)
    page = dashboard.get("/run", params={"run": "numbered"}).text
    assert rows(page, "&lt;b&gt;top&lt;/b&gt; at iteration 10") == [
        "<tr><td>0</td><td>0</td><td>0.5</td><td>–</td></tr>", "<tr><td>1</td><td>1</td><td>–</td><td>–</td></tr>",
        "<tr><td>2</td><td>2</td><td>1</td><td>–</td></tr>",
        '<tr class="lowest"><td>3</td><td>3</td><td>0.25</td><td>–</td></tr>']
    assert "<b>top</b>" not in page
    events = dashboard.get("/api/runs/metrics", params={"run": "numbered"}).json()["events"]
    assert events[0]["per_class"] == {"<b>top</b>": [0.5, None, 1.0, 0.25]}  # ("nan" as JSON has no NaN)
    assert '<section id="per-class" hidden></section>' in dashboard.get("/run", params={"run": "plain"}).text
    assert [test["output"] for test in dashboard.get("/api/runs").json()[1]["tests"]] == ["accuracy"]


def test_a_model_page_shows_the_per_class_accuracies_its_card_records(tmp_path):
    weights = tmp_path / "digits.weights.h5"
    deploy = ROOT / "configs" / "digits" / "digits_deploy.yaml"
    netspec.load_net(str(deploy), seed=3).save_weights(weights, iteration=7)
    figures = [0.9, 0.1, None, *[1.0] * 7]
    make_run(tmp_path / "workspace" / "run", [pass_event(7, figures)])
    (tmp_path / "labels.txt").write_text("".join(f"{name}\n" for name in ["zero", HOSTILE, *"23456789"]))
    zoo = Zoo(str(tmp_path / "zoo"))
    for name, run in (("tested", tmp_path / "workspace" / "run"), ("untested", None)):
        publish(PublishRequest(name=name, net=str(deploy), weights=str(weights), run_dir=run and str(run),
                               labels_file=str(tmp_path / "labels.txt")), zoo)
    dashboard = client(tmp_path / "workspace", zoo=tmp_path / "zoo")
    page = dashboard.get("/model", params={"ref": "tested@1"}).text
    assert "in the last test pass of its training; the lowest marked." in page
    assert rows(page, "per_class")[:3] == [
        "<tr><td>zero</td><td>0</td><td>0.9</td></tr>",
        '<tr class="lowest"><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>1</td><td>0.1</td></tr>',
        "<tr><td>2</td><td>2</td><td>–</td></tr>"]
    assert "<th>change</th>" not in page and HOSTILE not in page
    assert '<section id="per-class" hidden></section>' in dashboard.get("/model", params={"ref": "untested@1"}).text
