"""Training that meets a second training, a full disk or a kill -9: nothing is lost, nothing is overwritten, and
the newest snapshot always continues to the result of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hostile import environment, file_size_limit, refuses, run

ROOT = Path(__file__).parent.parent.parent
ITERATIONS = 12


def train(digits: Path, out: Path, *extra, iterations: int = ITERATIONS):
    return run("train", digits / "solver.yaml", "--out", out, "--max-iter", iterations, *extra)


def final_weights(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path) as handle:
        return {f"{layer}/{blob}": handle[layer][blob][()] for layer in handle for blob in handle[layer]}


def _iteration(state: Path) -> int:
    return int(state.name.split("_iter_")[1].split(".")[0])


def newest_state(out: Path) -> Path | None:
    states = sorted(out.glob("*.solverstate.h5"), key=_iteration)
    return states[-1] if states else None


def test_a_second_training_into_a_busy_run_folder_is_refused(digits, tmp_path):
    out = tmp_path / "run"
    solver = tmp_path / "solver.yaml"  # no periodic snapshots: the first run may go on for a while
    solver.write_text((digits / "solver.yaml").read_text().replace("snapshot: 2", "snapshot: 0").replace(
        "net: digits_net.yaml", f"net: {digits / 'digits_net.yaml'}").replace("display: 1", "display: 1000"))
    first = subprocess.Popen([sys.executable, "-m", "netspec", "train", solver, "--out", out, "--max-iter", "1_000_000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment())
    try:
        deadline = time.monotonic() + 60
        while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:  # written once it trains
            time.sleep(0.05)
        assert (out / ".lock").read_text() == str(first.pid)
        assert refuses("train", solver, "--out", out, "--max-iter", 4) == (
            f"error: {out} is in use by another training (pid {first.pid}); wait for it to end, or train into "
            "another folder with --out DIR")
        rank = subprocess.run([sys.executable, "-m", "netspec", "train", solver, "--out", out, "--max-iter", "4"],
                              capture_output=True, text=True, env=environment() | {"OMPI_COMM_WORLD_RANK": "1"})
        assert rank.stderr.strip() == (f"error: {out} is in use by another training (pid {first.pid}); started by "
                                       "mpirun? Its ranks train one run together with netspec train --distributed")
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 128 + signal.SIGTERM, first.stderr.read()
    state = newest_state(out)  # the first run's stop snapshot; its lock went with it
    resumed = train(digits, out, "--resume", state, iterations=_iteration(state) + 2)
    assert resumed.returncode == 0, resumed.stderr


def test_a_full_disk_while_snapshotting_stops_in_one_line_and_keeps_the_earlier_snapshots(digits, tmp_path):
    out = tmp_path / "run"
    assert train(digits, out, iterations=4).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name.endswith(".h5")}
    with file_size_limit(100_000):  # the next snapshot does not fit
        message = refuses("train", digits / "solver.yaml", "--out", out, "--max-iter", 8,
                          "--resume", out / "digits_iter_4.solverstate.h5")
    assert message == (f"error: cannot write the snapshot of iteration 6 to {out}: File too large; the last snapshot, "
                       f"{out}/digits_iter_4.solverstate.h5, is intact. Training stopped")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name.endswith(".h5")} == before
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    resumed = train(digits, out, "--resume", out / "digits_iter_4.solverstate.h5", iterations=8)
    assert resumed.returncode == 0, resumed.stderr


def test_a_full_disk_while_logging_stops_in_one_line_and_leaves_no_torn_line(digits, tmp_path):
    out = tmp_path / "run"
    assert train(digits, out, iterations=4).returncode == 0
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write("\n" * 20_000)  # (blank lines, kept: the file outgrows the configs the run copies first)
    metrics = (out / "metrics.jsonl").read_bytes()
    with file_size_limit(len(metrics) + 10):  # the next event does not fit whole
        message = refuses("train", digits / "solver.yaml", "--out", out, "--max-iter", 8,
                          "--resume", out / "digits_iter_4.solverstate.h5")
    assert message.startswith(f"error: {out}/metrics.jsonl: cannot add the event of iteration 4: ") and message.endswith(
        "; the file keeps the events before it. Training stopped"), message
    kept = (out / "metrics.jsonl").read_bytes()
    assert kept.endswith(b"\n") and all(json.loads(line) for line in kept.splitlines() if line)
    assert json.loads((out / "outcome.json").read_text())["state"] == "failed"


def test_kill_9_at_random_points_always_resumes_to_the_uninterrupted_result(digits, tmp_path):
    reference = tmp_path / "reference"
    assert train(digits, reference).returncode == 0
    expected = final_weights(reference / f"digits_iter_{ITERATIONS}.weights.h5")
    draws = random.Random(17)  # noqa: S311 - kill times, not secrets
    mid_run = 0
    for attempt in range(20):
        out = tmp_path / f"run{attempt}"
        after = draws.choice(range(0, ITERATIONS - 2, 2))  # kill once this snapshot exists (0: before the first),
        delay = draws.uniform(0, 0.05)  # ... a moment later: during an iteration or the next snapshot
        process = subprocess.Popen([sys.executable, "-m", "netspec", "train", digits / "solver.yaml", "--out", out,
                                    "--max-iter", str(ITERATIONS)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=environment())
        marker = out / (f"digits_iter_{after}.solverstate.h5" if after else "metrics.jsonl")
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        state = newest_state(out)
        mid_run += state is not None and _iteration(state) < ITERATIONS
        if state is None:  # killed before its first snapshot: nothing to continue, so start again elsewhere
            out = tmp_path / f"again{attempt}"
        resumed = train(digits, out, *(("--resume", state) if state else ()))
        assert resumed.returncode == 0, (attempt, resumed.stderr)
        got = final_weights(out / f"digits_iter_{ITERATIONS}.weights.h5")
        assert got.keys() == expected.keys()
        assert all(np.array_equal(got[key], expected[key]) for key in expected), attempt
        assert not [name for name in os.listdir(out) if ".tmp-" in name]
    assert mid_run >= 10  # most kills landed between snapshots, not before the first or after the last


def test_a_solver_state_with_an_external_link_is_refused(digits, tmp_path):
    out = tmp_path / "run"
    assert train(digits, out, iterations=2).returncode == 0
    state = out / "digits_iter_2.solverstate.h5"
    with h5py.File(state, "a") as handle:
        handle["elsewhere"] = h5py.ExternalLink("/etc/other.h5", "/x")
    assert refuses("train", digits / "solver.yaml", "--out", out, "--resume", state, "--max-iter", 4) == (
        f"error: {state}: /elsewhere is an external link; netspec reads only what is inside the file")


def test_temporary_files_of_a_killed_run_are_removed_when_it_resumes(digits, tmp_path):
    out = tmp_path / "run"
    assert train(digits, out, iterations=2).returncode == 0
    left = out / f".digits_iter_4.weights.h5.tmp-{_ended_pid()}"  # its writer has ended
    left.write_bytes(b"half a snapshot")
    busy = out / f".export.onnx.tmp-{os.getpid()}"  # a writer still running (this test) keeps its file
    busy.write_bytes(b"being written")
    resumed = train(digits, out, "--resume", out / "digits_iter_2.solverstate.h5", iterations=4)
    assert resumed.returncode == 0, resumed.stderr
    assert f"removed 1 temporary file(s) an interrupted run left in {out}" in resumed.stdout
    assert not left.exists() and busy.exists()


def _ended_pid() -> int:
    """The pid of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


@pytest.mark.parametrize("label, shown", [(1.7, "1.7"), (1e30, "1e+30"), (-1, "-1"), (np.nan, "nan")])
def test_a_label_that_is_no_class_stops_training_with_its_value(tmp_path, label, shown):
    with h5py.File(tmp_path / "train.h5", "w") as handle:
        handle["data"] = np.zeros((4, 3), dtype=np.float32)
        handle["label"] = np.array([0, label, 2, 3], dtype=np.float64)
    (tmp_path / "train.txt").write_text("train.h5\n")
    (tmp_path / "solver.yaml").write_text("""net:
  layers:
    - {name: data, type: HDF5Data, top: [data, label], hdf5_data_param: {source: train.txt, batch_size: 4}}
    - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 10}}
    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
base_lr: 0.1
max_iter: 2
snapshot_prefix: run/s
""")
    assert refuses("train", tmp_path / "solver.yaml") == (
        f"error: layer 'loss': label {shown} of bottom 'label' is not a class index 0 to 9 (1 such labels in the "
        "batch)")


def test_resume_continues_in_the_states_folder_and_never_into_another_run(digits, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train(digits, first, iterations=2).returncode == 0
    assert train(digits, second, iterations=2).returncode == 0
    before = {p.name: p.read_bytes() for p in second.iterdir() if p.is_file() and p.name != ".lock"}
    assert refuses("train", digits / "solver.yaml", "--out", second, "--max-iter", 4,
                   "--resume", first / "digits_iter_2.solverstate.h5").startswith(f"error: {second} already holds a run")
    assert {p.name: p.read_bytes() for p in second.iterdir() if p.is_file() and p.name != ".lock"} == before
    resumed = run("train", digits / "solver.yaml", "--max-iter", 4, "--resume", first / "digits_iter_2.solverstate.h5")
    assert resumed.returncode == 0, resumed.stderr
    assert f"run folder {first}" in resumed.stdout and (first / "digits_iter_4.solverstate.h5").exists()
    assert not (digits / "runs").exists()


@pytest.mark.parametrize("how, expected", [
    ("unwritten positions", "declares 1,048,576 bytes but stores none"),
    ("many positions", "its data positions and loss window hold 1,572,875,552 bytes, more than the 268,435,456"),
    ("deep progress", "cannot read solver state: incomplete or malformed file"),
    ("bad generator", "its random generator states are malformed"),
    ("weights elsewhere", "its weights_file '../../etc/passwd' is not a file name beside the state"),
    ("list progress", "malformed solver state (its iteration, progress, params, world size, threads or random "),
    ("negative iteration", "malformed solver state (its iteration, progress, params, world size, threads or random"),
    ("a billion threads", "malformed solver state (its iteration, progress, params, world size, threads or random "),
    ("threads as text", "cannot read solver state: incomplete or malformed file"),
    ("infinite iteration", "cannot read solver state: incomplete or malformed file"),
    ("history of NaN", "layer 'conv1' blob 0: its update history 'history' holds NaN or infinite values"),
    ("odd snapshots", "its progress (snapshots kept, watched outputs) are malformed"),
    ("generator overflow", "its random generator states are malformed"),
    ("file cursor", "the saved position is for 1 files, the list now names 1"),
    ("row order", "the saved row order is not an order of the file's 1437 rows"),
])
def test_a_malformed_solver_state_is_refused_in_one_line(digits, tmp_path, how, expected):
    out = tmp_path / "run"
    assert train(digits, out, iterations=2).returncode == 0
    state = out / "digits_iter_2.solverstate.h5"
    with h5py.File(state, "a") as handle:
        if how.endswith("positions"):  # a few KB on disk, a megabyte or gigabytes when read
            for index in range(1500 if how == "many positions" else 1):
                handle.create_dataset(f"runtime/train/digits/k{index}", shape=(1 << 18,), dtype="f4",
                                      chunks=(1 << 16,))
        elif how == "deep progress":
            handle.attrs["progress"] = "[" * 100_000 + "]" * 100_000
        elif how == "bad generator":
            handle.attrs["rng_state"] = '{"bit_generator": "PCG64"}'
        elif how == "weights elsewhere":
            handle.attrs["weights_file"] = "../../etc/passwd"
        elif how == "list progress":
            handle.attrs["progress"] = "[1, 2]"
        elif how == "negative iteration":
            handle.attrs["iteration"] = -5
        elif how.endswith("threads"):
            handle.attrs["threads"] = 10 ** 9
        elif how == "threads as text":
            handle.attrs["threads"] = "many"
        elif how == "infinite iteration":
            handle.attrs["iteration"] = np.inf
        elif how == "history of NaN":
            handle["history/conv1/0/history"][0] = np.nan
        elif how == "odd snapshots":
            handle.attrs["progress"] = '{"snapshots": ["x"]}'
        elif how == "generator overflow":
            handle.attrs["rng_state"] = '{"bit_generator": "PCG64", "state": {"state": -1, "inc": -1}}'
        elif how == "file cursor":
            handle["runtime/train/digits/file_cursor"][()] = 99
        else:  # a row order of the right length that repeats rows
            handle["runtime/train/digits/row_order"][:2] = 0
    assert expected in refuses("train", digits / "solver.yaml", "--resume", state, "--max-iter", 4)


SCHEDULES = [("lr_policy: exp\ngamma: 1.0e+300\n", "lr_policy 'exp' gives no finite learning rate at iteration 1000"),
             ("lr_policy: poly\npower: -1\n", "lr_policy 'poly' gives no finite learning rate at iteration 1000"),
             ("lr_policy: inv\ngamma: -0.002\npower: 0.75\n",
              "lr_policy 'inv' gives no finite learning rate at iteration 500"),
             ("lr_policy: inv\ngamma: -0.0015\npower: 1\n",
              "lr_policy 'inv' gives a negative learning rate at iteration 667")]
RULES = [("type: Adam\nmomentum: 1\n", "Adam needs momentum below 1, got 1"),
         ("type: Adam\nmomentum2: 1.5\n", "Adam needs momentum2 below 1, got 1.5")]


@pytest.mark.parametrize("command, settings, line", [("train", *case) for case in SCHEDULES + RULES] +
                         [("lr-plot", *case) for case in SCHEDULES])
def test_a_schedule_or_rule_that_would_divide_by_zero_or_overflow_is_refused_before_training(
        digits, tmp_path, command, settings, line):
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"net: {digits / 'digits_net.yaml'}\nbase_lr: 0.01\nmax_iter: 1000\n{settings}")
    refused = refuses(command, solver, *(["--out", tmp_path / "run"] if command == "train" else
                                        ["-o", tmp_path / "lr.png"]))
    assert refused.startswith(f"error: {solver}:") and line in refused, refused
    assert not (tmp_path / "run").exists() and not (tmp_path / "lr.png").exists()


@pytest.mark.parametrize("setting", ["max_iter: 100000000000000000000", "iter_size: 1000000000000",
                                     "test_iter: [99999999999]\ntest_interval: 10"])
def test_counts_past_caffes_int32_that_would_train_or_test_for_ever_are_refused(digits, tmp_path, setting):
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"net: {digits / 'digits_net.yaml'}\nbase_lr: 0.01\n{'' if 'max_iter' in setting else 'max_iter: 10'}"
                      f"\n{setting}\n")
    key, value = setting.split(":")[0], setting.split(":")[1].split("\n")[0].strip(" []")
    assert refuses("train", solver, "--out", tmp_path / "run") == (
        f"error: {solver}:4: {key}: must be at most 2,147,483,647, as in Caffe, got "
        f"{int(value):,}")


def test_a_run_folder_that_cannot_be_made_is_one_line(digits, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    assert refuses("train", digits / "solver.yaml", "--out", tmp_path / "file" / "run", "--max-iter", 2) == (
        f"error: {tmp_path}/file/run: cannot use it as the run folder: Not a directory")


def test_a_randint_filler_beyond_whole_float_numbers_is_refused(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: data, type: DummyData, top: x, dummy_data_param: {shape: [{dim: [2]}], "
                   "data_filler: [{type: randint, min: 0, max: 1e30}]}}\n")
    assert "randint needs whole numbers min < max (at most 2**53, and 2**32 apart)" in refuses("time", net, "-n", 1)


def test_a_mistyped_resume_path_is_one_line_and_creates_nothing(digits, tmp_path):
    typo = tmp_path / "typo1" / "typo2" / "digits_iter_2.solverstate.h5"
    assert refuses("train", digits / "solver.yaml", "--resume", typo) == f"error: {typo}: no such solver state file"
    assert not (tmp_path / "typo1").exists()


def test_a_leftover_with_a_pid_no_process_can_have_is_removed(digits, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    left = out / ".x.tmp-9999999999"
    left.write_bytes(b"")
    assert train(digits, out, iterations=2).returncode == 0
    assert not left.exists()


def test_a_caffe_hdf5_file_declaring_billions_of_unwritten_rows_is_refused(tmp_path):
    with h5py.File(tmp_path / "train.h5", "w") as handle:
        handle.create_dataset("data", shape=(10 ** 10, 3), dtype="f4", chunks=(1024, 3))
        handle.create_dataset("label", shape=(10 ** 10,), dtype="f4", chunks=(1024,))
    (tmp_path / "train.txt").write_text("train.h5\n")
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: data, type: HDF5Data, top: [data, label], "
                   "hdf5_data_param: {source: train.txt, batch_size: 4}}\n")
    assert "dataset 'data' declares 120,000,000,000 bytes but stores none" in refuses("time", net, "-n", 1)
