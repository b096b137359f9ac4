"""Training that meets a second training, a full disk or a kill -9: nothing is lost, nothing is overwritten, and
the newest snapshot always continues to the result of a run that was never interrupted."""

from __future__ import annotations

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
from hostile import file_size_limit, refuses, run

ROOT = Path(__file__).parent.parent.parent
ITERATIONS = 12


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The digits quickstart's files and data, snapshotting every 2 iterations."""
    folder = tmp_path_factory.mktemp("digits")
    result = run("convert", "digits", folder / "data")
    assert result.returncode == 0, result.stderr
    (folder / "digits_net.yaml").write_text((ROOT / "configs" / "digits" / "digits_net.yaml").read_text())
    solver = (ROOT / "configs" / "digits" / "solver.yaml").read_text()
    (folder / "solver.yaml").write_text(solver.replace("snapshot: 500", "snapshot: 2").replace("display: 50",
                                                                                                 "display: 1"))
    return folder


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
    first = subprocess.Popen([sys.executable, "-m", "netspec", "train", digits / "solver.yaml", "--out", out,
                              "--max-iter", "1_000_000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("*.solverstate.h5")) and time.monotonic() < deadline:
            time.sleep(0.1)
        for extra in ((), ("--resume", newest_state(out))):
            assert refuses("train", digits / "solver.yaml", "--out", out, "--max-iter", 4, *extra) == (
                f"error: {out} is in use by another training (pid {first.pid}); wait for it to end, or train into "
                "another folder with --out DIR")
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


def test_kill_9_at_random_points_always_resumes_to_the_uninterrupted_result(digits, tmp_path):
    reference = tmp_path / "reference"
    assert train(digits, reference).returncode == 0
    expected = final_weights(reference / f"digits_iter_{ITERATIONS}.weights.h5")
    draws = random.Random(17)  # noqa: S311 - kill times, not secrets
    first_snapshot, end = _run_seconds(digits, tmp_path)
    for attempt in range(20):
        out = tmp_path / f"run{attempt}"
        process = subprocess.Popen([sys.executable, "-m", "netspec", "train", digits / "solver.yaml", "--out", out,
                                    "--max-iter", str(ITERATIONS)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        time.sleep(draws.uniform(0.9 * first_snapshot, first_snapshot + 0.7 * (end - first_snapshot)))
        process.send_signal(signal.SIGKILL)
        process.wait()
        state = newest_state(out)
        if state is None:  # killed before its first snapshot: nothing to continue, so start again elsewhere
            out = tmp_path / f"again{attempt}"
        resumed = train(digits, out, *(("--resume", state) if state else ()))
        assert resumed.returncode == 0, (attempt, resumed.stderr)
        got = final_weights(out / f"digits_iter_{ITERATIONS}.weights.h5")
        assert got.keys() == expected.keys()
        assert all(np.array_equal(got[key], expected[key]) for key in expected), attempt
        assert not [name for name in os.listdir(out) if ".tmp-" in name]


def _run_seconds(digits: Path, tmp_path: Path) -> tuple[float, float]:
    """Seconds from starting ``netspec train`` to its first snapshot, and to its end, on this machine."""
    out = tmp_path / "timing"
    process = subprocess.Popen([sys.executable, "-m", "netspec", "train", digits / "solver.yaml", "--out", out,
                                "--max-iter", str(ITERATIONS)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    while not (out / "digits_iter_2.solverstate.h5").exists() and process.poll() is None:
        time.sleep(0.005)
    first = time.monotonic() - started
    process.wait()
    return first, time.monotonic() - started


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
    left = out / ".digits_iter_4.weights.h5.tmp-99999"
    left.write_bytes(b"half a snapshot")
    resumed = train(digits, out, "--resume", out / "digits_iter_2.solverstate.h5", iterations=4)
    assert resumed.returncode == 0, resumed.stderr
    assert f"removed 1 temporary file(s) an interrupted run left in {out}" in resumed.stdout
    assert not left.exists()


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
