"""The dashboard's New run page: listing solver files, checking a start, and starting `netspec train` from the form."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from test_dashboard import LOCAL, TOKEN, client, digits_workspace, wait_for

from netspec.training import run_folder


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A workspace with the quickstart's configs (no periodic snapshots) and the digits converted."""
    return digits_workspace(tmp_path_factory)


def start(dashboard, fields: dict) -> object:
    """The New run form posted as the page posts it (same origin, the token in its cookie)."""
    dashboard.cookies.set("netspec_dashboard_token_6006", TOKEN)
    return dashboard.post("/new", data=fields, headers={"origin": LOCAL})


def events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_the_page_lists_the_workspaces_solver_files(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "my_solver.yml").write_text("base_lr: 0.1\n")
    (tmp_path / "configs" / "plain.yaml").write_text("# a solver without solver in its name\ntrain_net: n.yaml\n")
    (tmp_path / "configs" / "net.yaml").write_text("layers: []\n")  # a net, not a solver
    (tmp_path / "configs" / "notes.txt").write_text("net: x\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "solver.yaml").write_text("net: n.yaml\n")
    (tmp_path / "old" / "config").mkdir(parents=True)  # a run folder: its config copies are not offered
    (tmp_path / "old" / "metrics.jsonl").write_text("")
    (tmp_path / "old" / "config" / "solver.yaml").write_text("net: n.yaml\n")
    page = client(tmp_path).get("/new").text
    assert "<option>configs/my_solver.yml</option><option>configs/plain.yaml</option></select>" in page
    assert '<a href="new">New run</a>' in client(tmp_path).get("/").text


def test_a_run_started_from_the_form_is_an_ordinary_run_with_the_overrides(digits):
    answer = start(client(digits, follow_redirects=False),
                        {"solver": "solver.yaml", "max_iter": "5e1", "base_lr": ".5e-2", "batch_size": "1_00",
                         "device": "cpu", "out": "web/first"})
    assert (answer.status_code, answer.headers["location"]) == (303, "run?run=web%2Ffirst")
    out = digits / "web" / "first"
    wait_for(lambda: run_folder.run_state(str(out))[0] == "finished")
    logged = events(out)
    assert logged[0]["lr"] == pytest.approx(0.005) and logged[-1]["iter"] == 50
    assert logged[-1]["epoch"] == pytest.approx(50 * 100 / 1437)  # 100 training rows a batch
    assert (out / "config" / "solver.yaml").read_text() == (digits / "solver.yaml").read_text()
    assert "optimization done at iteration 50" in (out / "train.log").read_text()
    row = {row["run"]: row for row in client(digits).get("/api/runs").json()}["web/first"]
    assert (row["state"], row["iter"]) == ("finished", 50)
    again = start(client(digits), {"solver": "solver.yaml", "out": "web/first"})
    assert again.status_code == 409 and "web/first already holds a run: give another output folder" in again.text


def test_a_second_start_into_a_running_folder_is_refused(digits):
    first = start(client(digits, follow_redirects=False),
                       {"solver": "solver.yaml", "max_iter": "1000000", "out": "busy"})
    assert first.status_code == 303
    out = digits / "busy"
    pid = run_folder.lock_holder(str(out))
    try:
        assert pid is not None
        second = start(client(digits), {"solver": "solver.yaml", "out": "busy"})
        assert second.status_code == 409
        assert f"busy is in use by another training (pid {pid})" in second.text
    finally:
        os.kill(pid, signal.SIGINT)
    wait_for(lambda: run_folder.lock_holder(str(out)) is None)
    assert run_folder.run_state(str(out))[0] == "stopped"


def test_a_bad_solver_shows_its_file_and_line(digits):
    (digits / "bad_solver.yaml").write_text("net: digits_net.yaml\nbase_lr: -1\nmax_iter: 10\n")
    answer = start(client(digits), {"solver": "bad_solver.yaml"})
    assert answer.status_code == 400
    assert "bad_solver.yaml:2: base_lr: must be" in answer.text
    assert "<option selected>bad_solver.yaml</option>" in answer.text  # the form keeps what was asked
    wrong = start(client(digits), {"solver": "solver.yaml", "batch_size": "2.5", "base_lr": "1e-3"})
    assert wrong.status_code == 400 and "batch_size: must be a positive whole number, got &#x27;2.5&#x27;" in wrong.text


def test_a_net_with_python_layers_is_not_run(tmp_path):
    (tmp_path / "solver.yaml").write_text(
        "base_lr: 0.1\nmax_iter: 1\nnet:\n  layers:\n"
        "  - {name: x, type: Python, top: x, python_param: {module: evil, layer: Evil}}\n")
    answer = start(client(tmp_path), {"solver": "solver.yaml", "out": "py"})
    assert answer.status_code == 400
    assert "solver.yaml:5: layer &#x27;x&#x27;" in answer.text and "not run from the dashboard" in answer.text
    assert not (tmp_path / "py").exists()


def test_starting_needs_the_token_the_same_origin_and_paths_in_the_workspace(digits):
    dashboard = client(digits)
    fields = {"solver": "solver.yaml", "out": "never"}
    assert dashboard.post("/new", data=fields, headers={"origin": LOCAL}).status_code == 403
    assert dashboard.post(f"/new?token={TOKEN}", data=fields,
                          headers={"origin": "http://attacker.example"}).status_code == 403
    assert start(client(digits), {"solver": "../solver.yaml"}).status_code == 403
    assert start(client(digits), {"solver": "solver.yaml", "out": "../outside"}).status_code == 403
    assert not (digits / "never").exists()
