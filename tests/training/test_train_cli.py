"""`netspec convert digits`, `netspec train` and `netspec test` as a user runs them, and their bad-input errors."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_cli import run

ROOT = Path(__file__).parent.parent.parent
DIGITS = ROOT / "configs" / "digits"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The quickstart's configs copied to a fresh folder, with the digits converted beside them."""
    folder = tmp_path_factory.mktemp("digits")
    for name in ("solver.yaml", "adamw_solver.yaml", "digits_net.yaml"):
        shutil.copy(DIGITS / name, folder / name)
    result = run("convert", "digits", folder / "data")
    assert result.returncode == 0, result.stderr
    assert "wrote 1437 training and 360 test digits" in result.stdout
    return folder


def events(run_dir: Path, phase: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["phase"] == phase]


def test_quickstart_trains_digits_to_high_accuracy(digits):
    result = run("train", digits / "solver.yaml", "--max-iter", "400")
    assert result.returncode == 0, result.stderr
    run_dir = digits / "runs"
    tests = events(run_dir, "TEST")
    assert [e["iter"] for e in tests] == [0, 200, 400]
    assert tests[-1]["accuracy"] >= 0.95
    assert f"iter 400 (epoch 17.81): test: accuracy = {tests[-1]['accuracy']:.4g}" in result.stdout
    assert re.fullmatch(r"memory: blobs [1-9][0-9.]* MiB \(train and test nets, data and diff\); peak [1-9][0-9.]* "
                        r"MiB \(the process's peak resident memory\)", result.stdout.splitlines()[-1])
    assert tests[-1]["epoch"] == pytest.approx(400 * 64 / 1437)
    train = events(run_dir, "TRAIN")
    assert [e["iter"] for e in train] == list(range(0, 400, 50))
    assert all(set(e) >= {"iter", "phase", "lr", "loss"} for e in train)
    assert (run_dir / "config" / "solver.yaml").read_text() == (digits / "solver.yaml").read_text()
    assert (run_dir / "config" / "digits_net.yaml").exists()
    weights = run_dir / "digits_iter_400.weights.h5"
    assert weights.exists() and (run_dir / "digits_iter_400.solverstate.h5").exists()
    scored = run("test", digits / "digits_net.yaml", "--weights", weights, "--iterations", "3", "--json")
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout.splitlines()[-1])["outputs"]["accuracy"] == pytest.approx(tests[-1]["accuracy"])


def test_resume_through_the_cli_matches_an_uninterrupted_run(digits, tmp_path):
    straight = run("train", digits / "solver.yaml", "--max-iter", "60", "--out", tmp_path / "straight")
    first = run("train", digits / "solver.yaml", "--max-iter", "30", "--out", tmp_path / "resumed")
    assert straight.returncode == 0 and first.returncode == 0
    second = run("train", digits / "solver.yaml", "--max-iter", "60", "--out", tmp_path / "resumed",
                 "--resume", tmp_path / "resumed" / "digits_iter_30.solverstate.h5")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout
    with h5py.File(tmp_path / "straight" / "digits_iter_60.weights.h5") as a, \
            h5py.File(tmp_path / "resumed" / "digits_iter_60.weights.h5") as b:
        for layer in a:
            for blob in a[layer]:
                assert np.array_equal(a[layer][blob][()], b[layer][blob][()])


def test_fine_tuning_reports_copied_and_reinitialised_layers(digits, tmp_path):
    run("train", digits / "solver.yaml", "--max-iter", "1", "--out", tmp_path / "base")
    wider = tmp_path / "wider"
    shutil.copytree(digits, wider, ignore=shutil.ignore_patterns("runs"))
    net = wider / "digits_net.yaml"
    net.write_text(net.read_text().replace("num_output: 10,", "num_output: 12,"))
    result = run("train", wider / "solver.yaml", "--max-iter", "1", "--weights", tmp_path / "base" /
                 "digits_iter_1.weights.h5")
    assert result.returncode == 0, result.stderr
    assert "copied 3 layer(s); shape differs, initialised by fillers: ip2" in result.stdout


def test_the_adamw_example_counts_epochs_keeps_the_best_and_stops_early(digits):
    result = run("train", digits / "adamw_solver.yaml")
    assert result.returncode == 0, result.stderr
    assert "AdamW, 899 iterations (40.04 epochs)" in result.stdout
    assert ("early stop at iteration 810: test loss has not improved by more than 0.001 in 3 test passes"
            in result.stdout)
    run_dir = digits / "runs-adamw"
    tests = events(run_dir, "TEST")
    assert [e["iter"] for e in tests] == list(range(0, 811, 90))
    best = max(tests, key=lambda e: e["accuracy"])
    assert best["accuracy"] >= 0.97
    assert f"best test accuracy = {best['accuracy']:.4g} at iteration {best['iter']}" in result.stdout
    assert sorted(p.name for p in run_dir.glob("digits_adamw_*")) == [
        "digits_adamw_best.weights.h5", "digits_adamw_iter_675.solverstate.h5", "digits_adamw_iter_675.weights.h5",
        "digits_adamw_iter_810.solverstate.h5", "digits_adamw_iter_810.weights.h5"]
    scored = run("test", digits / "digits_net.yaml", "--weights", run_dir / "digits_adamw_best.weights.h5",
                 "--iterations", "3", "--json")
    assert json.loads(scored.stdout.splitlines()[-1])["outputs"]["accuracy"] == pytest.approx(best["accuracy"])


def test_debug_info_through_the_cli(digits, tmp_path):
    result = run("train", digits / "solver.yaml", "--max-iter", "1", "--debug-info", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "iter 0 (epoch 0.00) debug: blob conv1: mean |data| = " in result.stdout
    assert "iter 0 (epoch 0.00) debug: param conv1[0]: mean |w| = " in result.stdout


def test_base_lr_and_batch_size_override_the_files(digits, tmp_path):
    result = run("train", digits / "solver.yaml", "--max-iter", "5e1", "--base-lr", ".5e-2", "--batch-size", "1_00",
                 "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert events(tmp_path, "TRAIN")[0]["lr"] == pytest.approx(0.005)  # inv policy: base_lr at iteration 0
    assert events(tmp_path, "TEST")[-1]["epoch"] == pytest.approx(50 * 100 / 1437)  # 100 training rows a batch
    # as with --max-iter, the config copies are the files as written
    assert (tmp_path / "config" / "solver.yaml").read_text() == (digits / "solver.yaml").read_text()


def test_bad_base_lr_and_batch_size_are_refused(digits, tmp_path):
    for option, message in (("--base-lr", "0.0 is not in the range x>0"), ("--batch-size", "0 is not in the range x>=1")):
        refused = run("train", digits / "solver.yaml", option, "0")
        assert refused.returncode == 2 and f"'{option}': {message}" in refused.stderr
    write(tmp_path, "net.yaml", "layers:\n- {name: data, type: DummyData, top: data, dummy_data_param: {shape: {dim: [2, 3]}}}\n"
          "- {name: loss, type: EuclideanLoss, bottom: [data, data], top: loss}\n")
    solver = write(tmp_path, "solver.yaml", "net: net.yaml\nbase_lr: 0.1\nmax_iter: 1\n")
    assert "no data layer with a batch_size, nor an Input layer, in the TRAIN phase" in fails(
        "train", solver, "--batch-size", "4")
    # an Input layer takes the batch size as its first axis
    write(tmp_path, "net.yaml", "layers:\n- {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3]}}}\n"
          "- {name: loss, type: EuclideanLoss, bottom: [data, data], top: loss}\n")
    assert run("train", solver, "--batch-size", "4").returncode == 0


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def fails(*args) -> str:
    result = run(*args)
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("error: ")
    return result.stderr


def test_bad_solver_files_get_one_located_message_each(tmp_path, digits):
    net = str(digits / "digits_net.yaml")
    cases = {
        "missing_net": ("net: nowhere.yaml\nbase_lr: 0.1\nmax_iter: 10\n",
                        f"missing_net.yaml:1: net: net file '{tmp_path}/nowhere.yaml' does not exist"),
        "no_test_net": (f"train_net: {net}\ntest_iter: [3]\nbase_lr: 0.1\nmax_iter: 10\n",
                        "no_test_net.yaml:2: test_iter: test_iter needs one value per test net: 0 test net(s), "
                        "1 value(s); add test_net"),
        "zero_iter": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 0\n",
                      "zero_iter.yaml:3: max_iter: must be a positive integer, got 0"),
        "negative_lr": (f"net: {net}\nbase_lr: -0.1\nmax_iter: 10\n",
                        "negative_lr.yaml:2: base_lr: must be a positive number, got -0.1"),
        "policy": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\nlr_policy: stpe\n",
                   "policy.yaml:4: lr_policy: 'stpe' is not one of fixed, step, exp, inv, multistep, poly, sigmoid, "
                   "cosine; "
                   "did you mean 'step'?"),
        "type": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\ntype: SDG\n",
                 "type.yaml:4: type: unknown solver type 'SDG'; did you mean 'SGD'? (netspec solvers lists them)"),
        "stepvalue": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\nlr_policy: multistep\ngamma: 0.1\n"
                      "stepvalue: [5, 3]\n", "stepvalue.yaml:6: stepvalue: values must increase, got [5, 3]"),
        "typo": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\nmomentun: 0.9\n",
                 "typo.yaml:4: unknown parameter 'momentun'; did you mean 'momentum'?"),
        "adagrad_momentum": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\ntype: AdaGrad\nmomentum: 0.9\n",
                             "adagrad_momentum.yaml:5: momentum: AdaGrad takes no momentum; remove it or set it to 0"),
        "keep_last": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\nkeep_last: 0\n",
                      "keep_last.yaml:4: keep_last: must be at least 1 (the newest snapshot is always kept), got 0"),
        "early_stop": (f"net: {net}\nbase_lr: 0.1\nmax_iter: 10\ntest_iter: [1]\ntest_interval: 5\n"
                       "early_stop: {output: acuracy, mode: max, patience: 2}\n",
                       "early_stop.yaml:6: early_stop: test net 0 has no one-value output 'acuracy'; did you mean "
                       "'accuracy'? (it has: accuracy, loss)"),
    }
    for name, (text, message) in cases.items():
        stderr = fails("train", write(tmp_path, f"{name}.yaml", text))
        assert stderr.strip().splitlines() == [stderr.strip()], (name, stderr)  # the one mistake, no follow-on
        assert stderr.strip().endswith(message), (name, stderr)


def test_every_solver_error_is_reported_at_once(tmp_path):
    solver = write(tmp_path, "many.yaml", "net: {name: n, layers: [{name: d, type: Inptu, top: d}]}\n"
                                          "base_lr: 0\nmax_iter: -1\n")
    lines = fails("train", solver).strip().splitlines()
    assert lines[-1] == "3 errors"
    assert "unknown layer type 'Inptu'; did you mean 'Input'?" in lines[0]


def test_epochs_with_data_of_unknown_size_are_refused(tmp_path):
    write(tmp_path, "input.yaml", "layers:\n  - {name: d, type: Input, top: [d, y], "
                                  "input_param: {shape: [{dim: [2, 3]}, {dim: [2, 2]}]}}\n"
                                  "  - {name: ip, type: InnerProduct, bottom: d, top: p, "
                                  "inner_product_param: {num_output: 2}}\n"
                                  "  - {name: loss, type: EuclideanLoss, bottom: [p, y], top: loss}\n")
    solver = write(tmp_path, "solver.yaml", "net: input.yaml\nbase_lr: 0.1\nmax_epoch: 3\n")
    assert fails("train", solver).strip() == (
        f"error: {solver}:3: max_epoch: counts epochs, but the train net cannot tell how many records an epoch has: "
        "its data layer 'd' (Input) does not know its size; give iteration counts instead, or read the data with "
        "HDF5Data")


def test_a_net_without_a_loss_is_refused(tmp_path):
    net = write(tmp_path, "noloss.yaml", "layers:\n  - {name: d, type: Input, top: d, "
                                         "input_param: {shape: {dim: [2, 3]}}}\n"
                                         "  - {name: ip, type: InnerProduct, bottom: d, top: p, "
                                         "inner_product_param: {num_output: 2}}\n")
    solver = write(tmp_path, "solver.yaml", "net: noloss.yaml\nbase_lr: 0.1\nmax_iter: 10\n")
    assert "has no loss in the TRAIN phase" in fails("train", solver)
    assert f"{net}" in fails("train", solver)


def test_bad_resume_states_and_weights_leave_snapshots_untouched(digits, tmp_path):
    out = tmp_path / "run"
    assert run("train", digits / "solver.yaml", "--max-iter", "2", "--out", out).returncode == 0
    state = out / "digits_iter_2.solverstate.h5"
    before = {p.name: p.read_bytes() for p in out.glob("*.h5")}

    truncated = tmp_path / "truncated.solverstate.h5"
    truncated.write_bytes(state.read_bytes()[:500])
    assert f"{truncated}: cannot read solver state: not a readable HDF5 file" in fails(
        "train", digits / "solver.yaml", "--resume", truncated)

    changed = tmp_path / "changed"
    shutil.copytree(digits, changed, ignore=shutil.ignore_patterns("runs"))
    (changed / "digits_net.yaml").write_text((changed / "digits_net.yaml").read_text().replace(
        "num_output: 128", "num_output: 64"))
    stderr = fails("train", changed / "solver.yaml", "--resume", state, "--out", out)
    assert "the net changed since this state was written; resume with --force" in stderr
    assert "-    inner_product_param: {num_output: 128" in stderr
    assert "+    inner_product_param: {num_output: 64" in stderr
    stderr = fails("train", changed / "solver.yaml", "--resume", state, "--out", out, "--force")
    assert "layer 'ip1' blob 0 has shape (128, 256) in the state but (64, 256) in the net" in stderr

    foreign = write(tmp_path, "foreign.yaml", "layers:\n  - {name: other, type: Input, top: d, "
                                              "input_param: {shape: {dim: [2, 3]}}}\n"
                                              "  - {name: fc, type: InnerProduct, bottom: d, top: p, "
                                              "inner_product_param: {num_output: 2}}\n")
    foreign_weights = tmp_path / "foreign.h5"
    import netspec

    netspec.load_net(str(foreign)).save_weights(foreign_weights)
    stderr = fails("train", digits / "solver.yaml", "--weights", foreign_weights, "--out", tmp_path / "fine-tuned")
    assert "share no layer with net 'DigitsNet'" in stderr
    assert {p.name: p.read_bytes() for p in out.glob("*.h5")} == before


def test_resume_after_editing_the_solver_file(digits, tmp_path):
    out = tmp_path / "run"
    assert run("train", digits / "solver.yaml", "--max-iter", "2", "--out", out).returncode == 0
    state = out / "digits_iter_2.solverstate.h5"
    edited = tmp_path / "edited"
    shutil.copytree(digits, edited, ignore=shutil.ignore_patterns("runs", "data"))
    (edited / "data").symlink_to(digits / "data")
    text = (digits / "solver.yaml").read_text()
    (edited / "solver.yaml").write_text(text.replace("display: 50", "display: 1").replace("snapshot: 500",
                                                                                         "snapshot: 2"))
    result = run("train", edited / "solver.yaml", "--max-iter", "4", "--out", out, "--resume", state)
    assert result.returncode == 0, result.stderr
    assert ("resuming with changed settings that do not alter training: max_iter 2 -> 4, display 50 -> 1, "
            "snapshot 500 -> 2\n") in result.stdout
    assert (out / "digits_iter_4.weights.h5").exists()

    (edited / "solver.yaml").write_text(text.replace("base_lr: 0.01", "base_lr: 2e-2"))
    stderr = fails("train", edited / "solver.yaml", "--max-iter", "2", "--out", out, "--resume", state)
    assert stderr == (f"error: {state}: the solver changed since this state was written (base_lr 0.01 -> 0.02), "
                      "which alters training; resume with --force to continue anyway\n")
    forced = run("train", edited / "solver.yaml", "--max-iter", "3", "--out", out, "--resume", state, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "resuming with --force despite changes that alter training: base_lr 0.01 -> 0.02\n" in forced.stdout


def interrupt(args: list, number: signal.Signals) -> tuple[int, str]:
    """Start ``netspec train ARGS``, send signal ``number`` once it has logged iteration 50, and wait for the end."""
    process = subprocess.Popen([sys.executable, "-m", "netspec", "train", *map(str, args)], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("iter 50 "):
            process.send_signal(number)
    return process.wait(timeout=120), "".join(output)


@pytest.mark.parametrize(("number", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_run_stopped_by_a_signal_snapshots_and_exits_non_zero(digits, tmp_path, number, status):
    solver = tmp_path / "solver.yaml"
    solver.write_text((digits / "solver.yaml").read_text().replace("net: digits_net.yaml",
                                                                   f"net: {digits / 'digits_net.yaml'}")
                      + "snapshot_after_train: false\n")  # the snapshot of an interrupt is written all the same
    code, output = interrupt([solver, "--max-iter", "1_000_000", "--out", tmp_path / "run"], number)
    assert code == status, output
    stopped = int(output.split(f"stop requested ({number.name}): stopping at iteration ")[1].split()[0])
    assert (tmp_path / "run" / f"digits_iter_{stopped}.solverstate.h5").exists()
    assert "optimization done" not in output
    finished = run("train", solver, "--out", tmp_path / "run", "--max-iter", stopped + 1,
                   "--resume", tmp_path / "run" / f"digits_iter_{stopped}.solverstate.h5")
    assert finished.returncode == 0, finished.stderr  # so `netspec train ... && next step` goes on only now


def test_a_fresh_run_refuses_a_folder_holding_another_run(digits, tmp_path):
    out = tmp_path / "run"
    assert run("train", digits / "solver.yaml", "--max-iter", "2", "--out", out).returncode == 0
    def run_files():
        return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}  # lock: a pid

    before = run_files()
    stderr = fails("train", digits / "solver.yaml", "--max-iter", "4", "--out", out)
    assert stderr == (f"error: {out} already holds a run (metrics.jsonl, 2 snapshot file(s)); continue it with "
                      f"--resume {out}/digits_iter_2.solverstate.h5, train into another folder with --out DIR, or "
                      "move it away\n")
    assert run_files() == before
    resumed = run("train", digits / "solver.yaml", "--max-iter", "4", "--out", out,
                  "--resume", out / "digits_iter_2.solverstate.h5")
    assert resumed.returncode == 0, resumed.stderr
    # the resumed run redoes the events of iteration 2 on: metrics.jsonl holds each event once
    kept = b"".join(line for line in before["metrics.jsonl"].splitlines(keepends=True) if json.loads(line)["iter"] < 2)
    after = (out / "metrics.jsonl").read_bytes()
    assert after.startswith(kept) and len(after) > len(kept)
    events = [(e["phase"], e["iter"]) for e in map(json.loads, after.splitlines())]
    assert len(events) == len(set(events)) and ("TEST", 2) in events
    assert (out / "digits_iter_4.solverstate.h5").exists()


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="this machine may have a GPU to use")
def test_a_gpu_solver_on_a_machine_without_cupy_says_to_train_on_the_cpu(digits, tmp_path):
    solver = write(tmp_path, "gpu.yaml", (digits / "solver.yaml").read_text().replace(
        "net: digits_net.yaml", f"net: {digits / 'digits_net.yaml'}") + "solver_mode: GPU\n")
    stderr = fails("train", solver, "--max-iter", "1", "--out", tmp_path / "run")
    assert stderr == (f"error: {solver}:16: solver_mode: device 'gpu:0' needs CuPy, which cannot be imported (No "
                      "module named 'cupy'): pip install -e '.[gpu]'; pass --device cpu to train on the CPU\n")
    assert run("train", solver, "--max-iter", "1", "--out", tmp_path / "run", "--device", "cpu").returncode == 0


def test_a_classifier_of_fewer_classes_than_the_dataset_is_refused_and_of_more_warned(digits, tmp_path):
    net = (digits / "digits_net.yaml").read_text()
    line = next(n for n, text in enumerate(net.splitlines(), 1) if "num_output: 10" in text) - 5  # (the layer)
    for outputs in (7, 12):
        (digits / f"net{outputs}.yaml").write_text(net.replace("num_output: 10", f"num_output: {outputs}"))
        (digits / f"solver{outputs}.yaml").write_text((digits / "solver.yaml").read_text().replace(
            "net: digits_net.yaml", f"net: net{outputs}.yaml"))
    where = "its top 'ip2' scores {} classes, but the labels of layer 'digits' have 10"
    for command in (("check", digits / "net7.yaml"), ("train", digits / "solver7.yaml", "--out", tmp_path / "r7")):
        result = run(*command)
        assert result.returncode == 1 and not (tmp_path / "r7").exists(), result.stderr
        assert result.stderr.strip() == (f"error: {digits / 'net7.yaml'}:{line}: layer 'ip2': {where.format(7)}: "
                                         "give it num_output: 10"), result.stderr
    warning = f"warning: layer 'ip2': {where.format(12)}; 2 output(s) stand for no class"
    assert warning in run("check", digits / "net12.yaml").stdout.splitlines()
    trained = run("train", digits / "solver12.yaml", "--out", tmp_path / "r12", "--max-iter", 2)
    assert trained.returncode == 0 and trained.stdout.splitlines().count(warning) == 1, trained.stdout


def test_scoring_says_how_much_of_the_test_data_it_read(digits, tmp_path):
    trained = run("train", digits / "solver.yaml", "--out", tmp_path / "run", "--max-iter", 2)
    assert trained.returncode == 0 and "note: test net" not in trained.stdout  # (3 batches of 120: the 360, once)
    weights = tmp_path / "run" / "digits_iter_2.weights.h5"
    once = run("test", digits / "digits_net.yaml", "--weights", weights)
    assert once.returncode == 0 and once.stdout.startswith(
        f"net 'DigitsNet' (TEST), weights {weights}: 360 records, each once: 3 batches of 120\n")
    again = run("test", digits / "digits_net.yaml", "--weights", weights, "-n", 4)
    assert "note: 4 batch(es) of 120 score 480 records of a 360-record dataset: 120 of them count again (the data " \
           "wraps around)" in again.stdout
    (digits / "short.yaml").write_text((digits / "solver.yaml").read_text().replace("test_iter: epoch",
                                                                                    "test_iter: [2]"))
    short = run("train", digits / "short.yaml", "--out", tmp_path / "short", "--max-iter", 2)
    assert short.stdout.count("note: test net 0: 2 batch(es) of 120 score 240 of the 360 records: 120 never "
                              "(test_iter 2)") == 1, short.stdout


def test_the_report_counts_every_record_scored_and_agrees_with_the_accuracy(digits, tmp_path):
    assert run("train", digits / "solver.yaml", "--out", tmp_path / "run", "--max-iter", 20).returncode == 0
    weights = tmp_path / "run" / "digits_iter_20.weights.h5"
    result = run("test", digits / "digits_net.yaml", "--weights", weights, "--report", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])
    matrix, report = np.array(figures["report"]["confusion"]), figures["report"]
    assert matrix.shape == (10, 10) and matrix.sum() == 360 and report["classes"] == [str(k) for k in range(10)]
    assert abs(np.trace(matrix) / 360 - figures["outputs"]["accuracy"]) < 1e-6  # (no ties in float scores)
    for k in range(10):
        assert report["records"][k] == matrix[k].sum()
        assert report["recall"][k] == pytest.approx(matrix[k, k] / matrix[k].sum())
        assert report["precision"][k] == (pytest.approx(matrix[k, k] / matrix[:, k].sum()) if matrix[:, k].sum()
                                          else None)
    assert "confusion (rows: labels, columns: predictions):" in result.stdout
    deploy = run("test", ROOT / "configs" / "digits" / "digits_deploy.yaml", "--weights", weights, "--report")
    assert (deploy.returncode, deploy.stderr.strip()) == (1, "error: net 'DigitsNet' has no Accuracy or "
                                                             "SoftmaxWithLoss layer to report on")


def test_the_report_draws_its_confusion_matrix_into_a_png(digits, tmp_path):
    from PIL import Image

    from netspec.inspect.confusion import Confusion

    assert run("train", digits / "solver.yaml", "--out", tmp_path / "run", "--max-iter", 20).returncode == 0
    weights, out = tmp_path / "run" / "digits_iter_20.weights.h5", tmp_path / "plots" / "confusion.png"
    result = run("test", digits / "digits_net.yaml", "--weights", weights, "--report", "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out} (the 10 x 10 confusion matrix)" in result.stdout.splitlines()
    assert "class   records  precision  recall (accuracy)" in result.stdout.splitlines()
    report = json.loads(result.stdout.splitlines()[-1])["report"]  # (the JSON line still ends the output)
    drawn = Confusion.of(report["classes"], report["confusion"]).picture("DigitsNet").image
    with Image.open(out) as image:  # the picture of the very matrix the report counted, title and all
        assert image.format == "PNG" and np.array_equal(np.asarray(image), np.asarray(drawn))
    target = tmp_path / "kept.txt"
    target.write_text("kept")
    (tmp_path / "link.png").symlink_to(target)
    linked = run("test", digits / "digits_net.yaml", "--weights", weights, "--report", "-o", tmp_path / "link.png")
    assert linked.returncode == 0 and target.read_text() == "kept" and not (tmp_path / "link.png").is_symlink()


def test_a_confusion_png_without_report_or_of_another_kind_is_refused(digits, tmp_path):
    weights = tmp_path / "none.weights.h5"  # (refused before any weights are read)
    alone = run("test", digits / "digits_net.yaml", "--weights", weights, "-o", tmp_path / "c.png")
    assert alone.returncode == 2 and alone.stderr.splitlines()[-1] == (
        "Error: -o draws the confusion matrix of --report: add --report")
    jpeg = run("test", digits / "digits_net.yaml", "--weights", weights, "--report", "--out", tmp_path / "c.jpg")
    assert (jpeg.returncode, jpeg.stderr) == (1, f"error: {tmp_path / 'c.jpg'}: the confusion matrix is drawn as "
                                                 "PNG: give a .png file\n")
    assert run("train", digits / "solver.yaml", "--out", tmp_path / "run", "--max-iter", 2).returncode == 0
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "c.png"
    unwritable = run("test", digits / "digits_net.yaml", "--weights", tmp_path / "run" / "digits_iter_2.weights.h5",
                     "--report", "-o", out)
    assert unwritable.returncode == 1 and "confusion (rows: labels, columns: predictions):" in unwritable.stdout
    assert re.fullmatch(f"error: {re.escape(str(out))}: cannot write: [^\n]+\n", unwritable.stderr), \
        unwritable.stderr
    assert not list(tmp_path.glob("**/*.png"))
