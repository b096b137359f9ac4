"""A workspace someone else made: links where netspec writes, modules where Python looks, a lock that is not the
run's.  No file outside the run folder changes, no module of the workspace runs, no process but a training of
that folder is signalled."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import refuses, run

from netspec.atomic import atomic_path, open_for_writing, write_bytes
from netspec.dashboard.metrics import Position
from netspec.errors import NetspecError
from netspec.process import netspec_command

ROOT = Path(__file__).parent.parent.parent
PRECIOUS = "the user's own file\n"


def precious(tmp_path: Path, text: str = PRECIOUS) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


# every file and folder a training writes in its run folder: refused when it is a link (appended to, or written
# into), or replaced by the new file without following the link (written whole, then renamed into place: the
# configs, outcome.json, and the snapshots, whose temporary names the last test here covers)
REFUSED = {".lock": "is a symbolic link, which netspec never writes to",
           "metrics.jsonl": "is a symbolic link, which netspec never writes to",
           "config": "is a symbolic link, which netspec never writes through"}
REPLACED = ["config/solver.yaml", "config/digits_net.yaml", "config/sources.json", "outcome.json"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_link_where_training_appends_or_writes_into_is_refused(digits, tmp_path, name):
    text = "" if name == "metrics.jsonl" else PRECIOUS  # (metrics in a run folder mean a run already there)
    target = precious(tmp_path, text)
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(target.parent if name == "config" else target, out / name)
    line = refuses("train", digits / "solver.yaml", "--out", out, "--max-iter", 4)
    assert str(out / name) in line and REFUSED[name] in line, line
    assert target.read_text() == text and os.listdir(target.parent) == ["precious.txt"]


def test_a_link_where_training_writes_a_whole_file_is_replaced_never_followed(digits, tmp_path):
    target = precious(tmp_path)
    out = tmp_path / "run"
    (out / "config").mkdir(parents=True)
    for name in REPLACED:
        os.symlink(target, out / name)
    result = run("train", digits / "solver.yaml", "--out", out, "--max-iter", 4)
    assert result.returncode == 0, result.stderr
    assert target.read_text() == PRECIOUS
    for name in REPLACED:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name
    assert json.loads((out / "outcome.json").read_text())["state"] == "finished"


def test_a_link_or_fifo_under_a_temporary_name_is_never_written_through(tmp_path):
    target = precious(tmp_path)
    path = tmp_path / "out.bin"
    with atomic_path(path) as temporary:
        pass  # (learns the temporary name this process uses for path)
    os.symlink(target, temporary)
    write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and target.read_text() == PRECIOUS and not os.path.lexists(temporary)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="fifo is a FIFO, which netspec never writes to"):
        open_for_writing(tmp_path / "fifo", "a")  # (at once: a FIFO nobody reads would block an open)


@pytest.mark.parametrize("command, name, written", [
    (["draw", ROOT / "configs" / "lenet" / "lenet_timing.yaml"], "net.dot", b"digraph"),
    (["lr-plot", ROOT / "configs" / "lenet" / "lenet_solver.yaml"], "lr.png", b"\x89PNG"),
    (["plot", "metrics"], "curves.svg", b"<?xml")])
def test_an_output_file_given_as_a_link_is_replaced_never_written_through(tmp_path, command, name, written):
    target = precious(tmp_path)
    os.symlink(target, tmp_path / name)
    metrics_of_a_run(tmp_path / "metrics")
    result = run(*[tmp_path / "metrics" if part == "metrics" else part for part in command], "-o", tmp_path / name)
    assert result.returncode == 0, result.stderr
    assert target.read_text() == PRECIOUS and (tmp_path / name).read_bytes().startswith(written)
    assert not (tmp_path / name).is_symlink()


def metrics_of_a_run(path: Path) -> None:
    """A metrics.jsonl of three training events at ``path``."""
    path.write_text("".join(json.dumps({"phase": "TRAIN", "iter": i, "smoothed_loss": 1 / (i + 1), "lr": 0.01}) + "\n"
                            for i in range(3)))


@pytest.mark.parametrize("out, why", [("a file/lr.png", "cannot write"),
                                      ("lr.weird", "choose a .png, .svg or .pdf file")])
def test_a_picture_that_cannot_be_written_is_one_line_naming_it(tmp_path, out, why):
    (tmp_path / "a file").write_text(PRECIOUS)
    for command in (["lr-plot", ROOT / "configs" / "lenet" / "lenet_solver.yaml"], ["plot", tmp_path / "metrics"]):
        metrics_of_a_run(tmp_path / "metrics")
        line = refuses(*command, "-o", tmp_path / out)
        assert line.startswith(f"error: {tmp_path / out}") and why in line, line


def test_no_module_of_the_working_folder_runs_in_a_process_netspec_starts(tmp_path):
    marker = tmp_path / "ran"
    for module in ("click", "json", "yaml", "numpy", "random"):
        (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'a').write('{module} ')\n")
    result = subprocess.run(netspec_command("layers"), cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"the workspace's modules ran: {marker.read_text()}"
    assert "Convolution" in result.stdout


def test_a_net_swapped_for_python_layers_after_the_dashboards_check_is_still_refused(tmp_path):
    """The New run page checks a start, then spawns the training; a file changed in between (a Python layer
    added) is refused by the training itself, before it imports the module."""
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from netspec.dashboard.new_run import spawn

    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (tmp_path / "solver.yaml").write_text(
        "base_lr: 0.1\nmax_iter: 1\nnet:\n  layers:\n"
        "  - {name: x, type: Python, top: x, python_param: {module: evil, layer: Evil}}\n")
    with pytest.raises(NetspecError) as refused:  # spawn as the page does once its check has passed
        spawn(str(tmp_path / "solver.yaml"), ["--out", str(tmp_path / "run")], str(tmp_path / "run"), str(tmp_path))
    assert "a Python layer imports module 'evil', which runs its code: this training was started with " \
           "--no-python-layers" in str(refused.value)
    assert not marker.exists()


def dashboard_client(workspace: Path):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from starlette.testclient import TestClient

    from netspec.dashboard.app import create_app

    client = TestClient(create_app(str(workspace), "token", False, str(workspace.parent / "zoo")),
                        base_url="http://127.0.0.1:8000")
    client.cookies.set("netspec_dashboard_token_8000", "token")
    return client


def looks_like_a_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"phase": "TRAIN", "iter": 0, "lr": 0.1, "loss": 1.0,
                                                      "smoothed_loss": 1.0}) + "\n")


@pytest.mark.parametrize("link", [os.symlink, os.link])  # (a hard link: a file of another folder's name too)
def test_stop_never_signals_the_holder_of_what_a_run_folders_lock_links_to(tmp_path, link):
    workspace = tmp_path / "workspace"
    looks_like_a_run(workspace / "run")
    elsewhere = tmp_path / "other.lock"
    with open(elsewhere, "w") as held:  # this very process holds it: a signal would end the test
        fcntl.flock(held, fcntl.LOCK_EX)
        link(elsewhere, workspace / "run" / ".lock")
        os.utime(workspace / "run" / "metrics.jsonl")
        answer = dashboard_client(workspace).post("/api/runs/stop?run=run", headers={"origin": "http://127.0.0.1:8000"})
    assert (answer.status_code, answer.text) == (409, "run is not running")


def test_stop_never_signals_a_process_that_is_no_training(tmp_path):
    workspace = tmp_path / "workspace"
    looks_like_a_run(workspace / "run")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; handle = open(sys.argv[1], 'a'); "
                               "fcntl.flock(handle, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(workspace / "run" / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.utime(workspace / "run" / "metrics.jsonl")
        answer = dashboard_client(workspace).post("/api/runs/stop?run=run", headers={"origin": "http://127.0.0.1:8000"})
        assert answer.status_code == 409 and answer.text == (
            f"run: its lock is held by pid {holder.pid}, which is no netspec training: nothing sent")
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_run_keeps_train_and_test_nets_of_one_file_name_apart(digits, tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "digits_net.yaml").write_text((digits / "digits_net.yaml").read_text().replace(
        "source: data/", f"source: {digits}/data/") + "# the test net\n")
    solver = tmp_path / "solver.yaml"
    solver.write_text((digits / "solver.yaml").read_text().replace(
        "net: digits_net.yaml", f"train_net: {digits / 'digits_net.yaml'}\ntest_net: [{tmp_path / 'test' / 'digits_net.yaml'}]"))
    out = tmp_path / "run"
    result = run("train", solver, "--out", out, "--max-iter", 2)
    assert result.returncode == 0, result.stderr
    sources = json.loads((out / "config" / "sources.json").read_text())
    copies = {os.path.basename(os.path.dirname(path)): name for path, name in sources["copies"].items()}
    assert sorted(copies.values()) == ["digits_net.2.yaml", "digits_net.yaml"]
    assert (out / "config" / copies["test"]).read_text().endswith("# the test net\n")
    assert not (out / "config" / copies[digits.name]).read_text().endswith("# the test net\n")


def test_publishing_a_run_whose_train_net_changed_since_is_refused(digits, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("solver.yaml", "digits_net.yaml"):
        (work / name).write_text((digits / name).read_text().replace("source: data/", f"source: {digits}/data/"))
    out = tmp_path / "run"
    assert run("train", work / "solver.yaml", "--out", out, "--max-iter", 2).returncode == 0
    (work / "digits_net.yaml").write_text((work / "digits_net.yaml").read_text().replace("num_output: 10",
                                                                                         "num_output: 11"))
    line = refuses("zoo", "publish", "--name", "m", "--run", out, "--zoo", tmp_path / "zoo")
    assert f"its train net {work / 'digits_net.yaml'} has changed since the run trained it" in line, line
    assert not (tmp_path / "zoo" / "models").exists()


def test_a_run_folder_named_through_a_link_is_trained_into(digits, tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "run")  # the folder the user names may be a link; nothing inside it
    result = run("train", digits / "solver.yaml", "--out", tmp_path / "run", "--max-iter", 2)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "real" / "metrics.jsonl").exists()


def test_an_array_file_never_writes_through_a_link_at_its_temporary_name(tmp_path):
    import numpy as np

    from netspec.atomic import temporary_path
    from netspec.data.hdf5 import write_arrays

    target = precious(tmp_path)
    out = tmp_path / "rows.h5"
    os.symlink(target, temporary_path(out))
    write_arrays(str(out), {"data": np.zeros((3, 2), dtype=np.float32), "label": np.arange(3.0)})
    assert target.read_text() == PRECIOUS and not out.is_symlink() and out.stat().st_size > 0


def test_training_refuses_a_lock_with_another_name(digits, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "other.lock").write_text("")
    os.link(tmp_path / "other.lock", out / ".lock")
    line = refuses("train", digits / "solver.yaml", "--out", out, "--max-iter", 2)
    assert line == f"error: {out / '.lock'} has other names (a hard link to another file): remove it, or train " \
                   "into another folder with --out DIR"


def test_the_runs_list_survives_any_outcome_file_and_metrics_line(tmp_path):
    workspace = tmp_path / "workspace"
    for name in ("fifo", "nested", "huge", "metrics"):
        looks_like_a_run(workspace / name)
    os.mkfifo(workspace / "fifo" / "outcome.json")  # (nothing ever writes it: opening it would wait forever)
    (workspace / "nested" / "outcome.json").write_text("[" * 100_000 + "]" * 100_000)
    with open(workspace / "huge" / "outcome.json", "wb") as handle:
        handle.truncate(1 << 30)  # (sparse: 1 GiB of zeros read on every poll)
    with open(workspace / "metrics" / "metrics.jsonl", "ab") as handle:
        handle.write(b"[" * 200_000 + b"]" * 200_000 + b"\n\xff\n" + b'{"iter": ' + b"9" * 5000 + b'}\n')
        handle.write(b'{"phase": "TRAIN", "iter": 1, "lr": 0.1, "smoothed_loss": 1.0, "loss": ' + b"9" * 400 + b'}\n')
    client = dashboard_client(workspace)
    rows = {row["run"]: row for row in client.get("/api/runs").json()}
    assert {rows[name]["message"] for name in ("fifo", "nested", "huge")} == {"outcome.json cannot be read"}
    answer = client.get("/api/runs/metrics", params={"run": "metrics"}).json()
    assert [event["loss"] for event in answer["events"]] == [1.0, None]  # (400 digits: no float holds them)
    damaged = answer["damaged"]
    assert [line["reason"] for line in damaged] == [
        "not a JSON line (nested too deeply)", "not a JSON line ('utf-8' codec can't decode byte 0xff in position "
        "0: invalid start byte)", "not a JSON line (Exceeds the limit (4300 digits) for integer string conversion: "
        "value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit)"]
    for token in ("²:0:1", "1:" + "9" * 5000 + ":1", "1:2"):  # (no position a file has: read from the start)
        assert Position.parse(token) == Position()
    assert Position.parse("7:120:4") == Position(7, 120, 4)
    line = refuses("plot", workspace / "metrics" / "metrics.jsonl", "-o", tmp_path / "plot.png")
    assert line.startswith(f"error: {workspace / 'metrics' / 'metrics.jsonl'}:2: not a JSON line (nested too "
                           "deeply)"), line
