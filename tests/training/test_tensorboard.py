"""`netspec train --tensorboard` and `tensorboard: true`: event files holding metrics.jsonl's numbers, resumed
runs, and the error without tensorboardX."""

from __future__ import annotations

import shutil
import struct
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tensorboardX.proto.event_pb2 import Event, SessionLog
from test_cli import run

from netspec.cli import main
from netspec.errors import NetspecError
from netspec.training.run_folder import read_metrics
from netspec.training.tensorboard import FLUSH_SECONDS, TensorBoardEvents, scalars, summary_writer_class

ROOT = Path(__file__).parent.parent.parent
DIGITS = ROOT / "configs" / "digits"


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The quickstart's configs with the digits converted beside them, and a solver testing and snapshotting often."""
    folder = tmp_path_factory.mktemp("digits")
    for name in ("solver.yaml", "digits_net.yaml"):
        shutil.copy(DIGITS / name, folder / name)
    result = run("convert", "digits", folder / "data")
    assert result.returncode == 0, result.stderr
    often = (folder / "solver.yaml").read_text().replace("display: 50", "display: 10")
    often = often.replace("test_interval: 200", "test_interval: 20").replace("snapshot: 500", "snapshot: 30")
    (folder / "often.yaml").write_text(often)
    return folder


def records(path: Path):
    """The Event messages of an event file: TFRecords of a uint64 length, its CRC, the data and the data's CRC."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        start = offset + 12
        yield Event.FromString(data[start:start + length])
        offset = start + length + 4


def shown(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows of a folder's event files: tag -> [(step, value), ...].

    Files are read in name order (their names start with the time); a session start at step S hides the events
    read before it from S on (tensorboardX's purge_step).
    """
    points: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in records(path):
            if event.session_log.status == SessionLog.START:
                points = {tag: [(step, value) for step, value in steps if step < event.step]
                          for tag, steps in points.items()}
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: steps for tag, steps in points.items() if steps}


def logged(run_dir: Path) -> dict[str, dict[int, float]]:
    """The same from metrics.jsonl, with the tags the digits net's outputs get."""
    expected: dict[str, dict[int, float]] = {}
    for event in read_metrics(run_dir / "metrics.jsonl"):
        if event["phase"] == "TRAIN":
            values = {"lr": event["lr"], "train/smoothed_loss": event["smoothed_loss"], "train/loss": event["loss"]}
        else:
            values = {"test/accuracy": event["accuracy"], "test/loss": event["loss"]}
        for tag, value in values.items():
            expected.setdefault(tag, {})[event["iter"]] = value
    return expected


def assert_same(run_dir: Path) -> None:
    """The event files show exactly the scalars of metrics.jsonl (as float32)."""
    events, metrics = shown(run_dir / "tensorboard"), logged(run_dir)
    assert sorted(events) == ["lr", "test/accuracy", "test/loss", "train/loss", "train/smoothed_loss"]
    assert sorted(events) == sorted(metrics)
    for tag, steps in metrics.items():
        assert [step for step, _ in events[tag]] == sorted(steps), tag  # each step once, in order
        assert dict(events[tag]) == pytest.approx(steps, rel=1e-6), tag


def test_the_flag_writes_the_scalars_of_metrics_jsonl(digits, tmp_path):
    result = run("train", digits / "solver.yaml", "--max-iter", "60", "--tensorboard", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert_same(tmp_path / "run")
    events = shown(tmp_path / "run" / "tensorboard")
    assert [step for step, _ in events["test/accuracy"]] == [0, 60]
    assert [step for step, _ in events["train/loss"]] == [0, 50]
    assert events["test/accuracy"][-1][1] > 0.5


def test_the_solver_key_writes_them_too(digits, tmp_path):
    solver = digits / "tensorboard_solver.yaml"
    solver.write_text((digits / "solver.yaml").read_text() + "tensorboard: true\n")
    result = run("train", solver, "--max-iter", "10", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert_same(tmp_path / "run")
    plain = run("train", digits / "solver.yaml", "--max-iter", "1", "--out", tmp_path / "plain")
    assert plain.returncode == 0 and not (tmp_path / "plain" / "tensorboard").exists()


def test_a_resumed_run_adds_a_file_and_hides_the_events_it_writes_again(digits, tmp_path):
    run_dir = tmp_path / "run"
    first = run("train", digits / "often.yaml", "--max-iter", "50", "--tensorboard", "--out", run_dir)
    assert first.returncode == 0, first.stderr
    (first_file,) = (run_dir / "tensorboard").iterdir()
    written = first_file.read_bytes()
    # from iteration 30 (not a test iteration): the first run's events after 30, its final test at 50 among them,
    # are dropped from metrics.jsonl and hidden in TensorBoard
    second = run("train", digits / "often.yaml", "--max-iter", "70", "--tensorboard", "--out", run_dir,
                 "--resume", run_dir / "digits_iter_30.solverstate.h5")
    assert second.returncode == 0, second.stderr
    assert_same(run_dir)
    assert [step for step, _ in shown(run_dir / "tensorboard")["test/accuracy"]] == [0, 20, 40, 60, 70]
    # from the end of that run: its final test at 70 stays
    third = run("train", digits / "often.yaml", "--max-iter", "80", "--tensorboard", "--out", run_dir,
                "--resume", run_dir / "digits_iter_70.solverstate.h5")
    assert third.returncode == 0, third.stderr
    assert_same(run_dir)
    assert [step for step, _ in shown(run_dir / "tensorboard")["test/accuracy"]] == [0, 20, 40, 60, 70, 80]
    assert len(list((run_dir / "tensorboard").iterdir())) == 3
    assert first_file.read_bytes() == written


def test_each_test_net_has_its_own_tags():
    train = {"iter": 10, "phase": "TRAIN", "lr": 0.01, "epoch": 0.5, "smoothed_loss": 1.5, "images_per_s": 900.0,
             "loss": 1.25, "accuracy": 0.5}
    assert scalars(train) == {"lr": 0.01, "train/smoothed_loss": 1.5, "train/loss": 1.25, "train/accuracy": 0.5}
    assert scalars({"iter": 10, "phase": "TEST", "lr": 0.01, "accuracy": 0.75}) == {"test/accuracy": 0.75}
    second = {"iter": 10, "phase": "TEST", "lr": 0.01, "test_net": 1, "accuracy": 0.25}
    assert scalars(second) == {"test1/accuracy": 0.25}


def test_events_reach_the_file_while_the_run_goes_on(tmp_path):
    events = TensorBoardEvents(str(tmp_path), purge_step=0)
    try:
        events.record({"iter": 0, "phase": "TRAIN", "lr": 0.5, "smoothed_loss": 2.0, "loss": 2.0})
        events.record({"iter": 10, "phase": "TEST", "lr": 0.5, "accuracy": 0.75})
        deadline = time.monotonic() + FLUSH_SECONDS + 5
        while "test/accuracy" not in shown(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert shown(tmp_path) == {"lr": [(0, 0.5)], "train/smoothed_loss": [(0, 2.0)], "train/loss": [(0, 2.0)],
                                   "test/accuracy": [(10, 0.75)]}
    finally:
        events.close()


def test_without_tensorboardx_the_flag_is_one_line_before_training(digits, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # importing it fails
    with pytest.raises(NetspecError, match=r"pip install -e '\.\[tensorboard\]'"):
        summary_writer_class()
    result = CliRunner().invoke(main, ["train", str(digits / "solver.yaml"), "--tensorboard", "--out",
                                       str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.output == ("error: TensorBoard event files (--tensorboard, or tensorboard: true in the solver) "
                             "need tensorboardX: pip install -e '.[tensorboard]'\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (tensorboardX's thread dies)
def test_a_writer_that_dies_on_a_full_disk_stops_training_with_a_snapshot_and_one_line(digits, tmp_path, monkeypatch):
    from tensorboardX import event_file_writer

    write_event = event_file_writer.EventsWriter.write_event
    written = []

    def fills_the_disk(self, event):
        written.append(1)
        if len(written) > 20:  # the disk is full from the 21st event on: the writer's thread dies
            raise OSError(28, "No space left on device")
        write_event(self, event)

    monkeypatch.setattr(event_file_writer.EventsWriter, "write_event", fills_the_disk)
    started = time.monotonic()
    result = CliRunner().invoke(main, ["train", str(digits / "often.yaml"), "--tensorboard", "--out",
                                       str(tmp_path / "run"), "--max-iter", "400"])
    assert time.monotonic() - started < 120  # never waits on the dead writer
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path / 'run' / 'tensorboard'}: TensorBoard's event writer has stopped (a "
                           "full disk?), so the events of iteration "), last
    stopped = int(last.split("events of iteration ")[1].split()[0])
    assert f"snapshot at iteration {stopped}: " in result.output  # the weights as they were when the writer died
    assert (tmp_path / "run" / f"digits_iter_{stopped}.solverstate.h5").exists()
    assert '"state": "failed"' in (tmp_path / "run" / "outcome.json").read_text()
