"""Each class's accuracy over a whole test pass in metrics.jsonl, from an Accuracy layer's second top."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from test_cli import ok
from test_train_cli import events

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The quickstart with the digits converted and its Accuracy given a per-class top."""
    folder = tmp_path_factory.mktemp("digits")
    shutil.copy(ROOT / "configs" / "digits" / "solver.yaml", folder / "solver.yaml")
    net = (ROOT / "configs" / "digits" / "digits_net.yaml").read_text()
    assert "top: accuracy," in net
    (folder / "digits_net.yaml").write_text(net.replace("top: accuracy,", "top: [accuracy, per_class],"))
    ok("convert", "digits", folder / "data")
    return folder


@pytest.mark.parametrize("test_iter, batch", [("epoch", 100), ("[3]", 120)])
def test_a_test_event_holds_each_class_accuracy_over_the_pass(digits, tmp_path, test_iter, batch):
    """One pass with a tail, and three whole batches: each class's hits over its records, as the report counts
    them from the scores (not the mean of the batches' per-class accuracies)."""
    net = (digits / "digits_net.yaml").read_text().replace("batch_size: 120", f"batch_size: {batch}")
    (tmp_path / "net.yaml").write_text(net.replace("source: data/", f"source: {digits}/data/"))
    solver = re.sub(r"^test_iter:.*$", f"test_iter: {test_iter}", (digits / "solver.yaml").read_text(),
                    flags=re.MULTILINE)
    (tmp_path / "solver.yaml").write_text(solver.replace("net: digits_net.yaml", "net: net.yaml"))
    ok("train", tmp_path / "solver.yaml", "--max-iter", 20, "--out", tmp_path / "run")
    logged = events(tmp_path / "run", "TEST")[-1]
    report = json.loads(ok("test", tmp_path / "net.yaml", "--weights", tmp_path / "run" / "digits_iter_20.weights.h5",
                           "--report", "--json").splitlines()[-1])["report"]
    assert report["records"] == [36] * 10
    assert logged["per_class"] == {"per_class": pytest.approx(report["recall"], abs=1e-9)}
    assert "per_class" not in [key for key in logged if isinstance(logged[key], float)]  # (no output of its own)
