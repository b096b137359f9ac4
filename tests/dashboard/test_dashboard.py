"""`netspec dashboard`: the runs list and run pages, live metrics, and the security rules, over HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
import uvicorn
from starlette.testclient import TestClient
from test_cli import run

from netspec.dashboard import app as dashboard_app
from netspec.dashboard import metrics
from netspec.dashboard import runs as dashboard_runs
from netspec.dashboard.app import create_app
from netspec.dashboard.metrics import Position
from netspec.dashboard.pages import tail
from netspec.errors import NetspecError
from netspec.training import run_folder

ROOT = Path(__file__).parent.parent.parent
DIGITS = ROOT / "configs" / "digits"
TOKEN = "secret-token"  # noqa: S105 - a test token
PREFIX = "launch-7Qx"  # the path the pages lie under (netspec dashboard draws one per launch)
LOCAL = "http://127.0.0.1:6006"


def event(iteration: int, phase: str = "TRAIN", **outputs) -> dict:
    return {"iter": iteration, "phase": phase, "lr": 0.01, **outputs}


def make_run(folder: Path, events: list[dict], outcome: tuple[str, str] | None = None,
             snapshots: tuple[int, ...] = ()) -> Path:
    """A run folder as netspec train leaves it: metrics, config copies, snapshots, how it ended."""
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "config").mkdir()
    (folder / "config" / "solver.yaml").write_text("base_lr: 0.01  # <b>not markup</b>\n")
    for iteration in snapshots:
        for path in run_folder.snapshot_paths(str(folder / "net"), iteration):
            Path(path).write_bytes(b"h5")
    if outcome:
        run_folder.write_outcome(str(folder), *outcome)
    return folder


def training_events(last: int) -> list[dict]:
    """Train events every 10 iterations and tests every 50 whose best accuracy and loss come at 100."""
    events = []
    for iteration in range(0, last + 1, 10):
        events.append(event(iteration, smoothed_loss=2.0 / (iteration + 1), loss=1.0))
        if iteration % 50 == 0:
            best = iteration == 100
            events.append(event(iteration, "TEST", accuracy=0.9 if best else 0.5, loss=0.1 if best else 0.7))
    return events


def client(root: Path, token_required: bool = False, zoo: Path | None = None, **kwargs) -> TestClient:
    """A client of the dashboard over ``root`` (and the zoo ``zoo``, by default one beside it)."""
    zoo = zoo or root.parent / f"{root.name}-zoo"
    return TestClient(create_app(str(root), TOKEN, token_required, str(zoo), PREFIX), base_url=f"{LOCAL}/{PREFIX}",
                      **kwargs)


def post(test_client: TestClient, path: str, **headers) -> object:
    """A same-origin POST carrying the token, as the page sends it (in its cookie)."""
    test_client.cookies.set("netspec_dashboard_token_6006", TOKEN)
    return test_client.post(path, headers={"origin": LOCAL, **headers})


@pytest.fixture
def workspace(tmp_path):
    make_run(tmp_path / "done", training_events(150), ("finished", "optimization done at iteration 150"), (150,))
    make_run(tmp_path / "exp" / "blew-up", training_events(20), ("diverged", "iteration 25: the loss is nan"))
    make_run(tmp_path / "killed", training_events(30))
    make_run(tmp_path / ".hidden" / "run", training_events(10))
    (tmp_path / "not-a-run" / "config").mkdir(parents=True)
    return tmp_path


def test_the_runs_list_shows_every_run_with_its_state_and_values(workspace):
    with run_folder.locked(str(workspace / "live")):
        (workspace / "live" / "metrics.jsonl").write_text(json.dumps(event(0, smoothed_loss=2.5)) + "\n")
        rows = {row["run"]: row for row in client(workspace).get("/api/runs").json()}
        page = client(workspace).get("/").text
    assert sorted(rows) == ["done", "exp/blew-up", "killed", "live"]
    assert {run: row["state"] for run, row in rows.items()} == {
        "done": "finished", "exp/blew-up": "diverged", "killed": "stopped", "live": "running"}
    assert rows["live"]["message"] == f"pid {os.getpid()}"
    assert rows["killed"]["message"] == "the training ended without recording how (killed?)"
    done = rows["done"]
    assert (done["iter"], done["loss"], done["snapshots"]) == (150, pytest.approx(2 / 151), 2)
    assert done["tests"] == [{"output": "accuracy", "last": 0.5, "best": 0.9, "best_iter": 100},
                             {"output": "loss", "last": 0.7, "best": 0.1, "best_iter": 100}]
    assert '<a href="run?run=exp%2Fblew-up">exp/blew-up</a>' in page
    assert 'class="state state-diverged" title="iteration 25: the loss is nan">diverged' in page
    assert "accuracy: 0.5 <span class=\"best\">(best 0.9 at 100)</span>" in page


def test_a_run_removed_since_the_walk_is_left_out_of_the_list(workspace, monkeypatch):
    from netspec.dashboard.workspace import Workspace

    walked = Workspace.runs
    monkeypatch.setattr(Workspace, "runs", lambda self: [*walked(self), "moved"])  # (as if moved meanwhile)
    rows = client(workspace).get("/api/runs")
    assert rows.status_code == 200 and sorted(row["run"] for row in rows.json()) == ["done", "exp/blew-up", "killed"]


def test_the_list_follows_a_growing_file_and_a_rewritten_one(workspace):
    dashboard = client(workspace)
    assert dashboard.get("/api/runs").json()[0]["iter"] == 150
    with open(workspace / "done" / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(event(200, "TEST", accuracy=0.95, loss=0.05)) + "\n")
    done = dashboard.get("/api/runs").json()[0]
    assert done["iter"] == 200 and done["tests"][0] == {"output": "accuracy", "last": 0.95, "best": 0.95,
                                                        "best_iter": 200}
    replacement = workspace / "done" / "replacement"  # as a resumed run rewrites the file
    replacement.write_text(json.dumps(event(5, smoothed_loss=1.0)) + "\n")
    os.replace(replacement, workspace / "done" / "metrics.jsonl")
    done = dashboard.get("/api/runs").json()[0]
    assert (done["iter"], done["tests"]) == (5, [])


def test_a_damaged_metrics_line_is_skipped_and_named(workspace):
    with open(workspace / "done" / "metrics.jsonl", "a") as handle:
        handle.write('{"iter": 160, "phase": "TR\n[1, 2]\n')
        handle.write(json.dumps(event(170, smoothed_loss=0.01)) + "\n")
    dashboard = client(workspace)
    data = dashboard.get("/api/runs/metrics", params={"run": "done"}).json()
    assert data["damaged"] == [
        {"line": 21, "reason": "not a JSON line (Unterminated string starting at)"},
        {"line": 22, "reason": "not a training event (needs 'iter' and 'phase')"}]
    assert data["events"][-1] == {"iter": 170, "phase": "TRAIN", "test_net": 0, "lr": 0.01, "smoothed_loss": 0.01}
    assert len(data["events"]) == 16 + 4 + 1
    page = dashboard.get("/run", params={"run": "done"}).text
    assert "done: metrics.jsonl line 21 skipped: not a JSON line" in page
    assert "done: metrics.jsonl line 22 skipped: not a training event" in page
    assert dashboard.get("/api/runs").json()[0]["iter"] == 170


def test_a_line_longer_than_any_event_is_read_once_and_named(workspace, monkeypatch):
    with open(workspace / "done" / "metrics.jsonl", "a") as handle:
        handle.write("x" * (3 * metrics.MAX_LINE))  # unterminated: a writer gone mad, or a hostile file
    reads = []
    original = metrics._complete_lines
    monkeypatch.setattr(metrics, "_complete_lines", lambda *args: reads.append(1) or original(*args))
    monkeypatch.setattr(metrics, "MAX_READ", 2 * metrics.MAX_LINE)
    dashboard = client(workspace)
    for _ in range(3):
        data = dashboard.get("/api/runs/metrics", params={"run": "done"}).json()
        assert data["damaged"] == [{"line": 21, "reason": f"a line of over {metrics.MAX_LINE:,} bytes, longer than "
                                                          "any event"}]
        assert data["events"][-1]["iter"] == 150
    assert len(reads) <= 3 + 3  # read through once (in MAX_READ pieces), then only what follows the position
    with open(workspace / "done" / "metrics.jsonl", "a") as handle:
        handle.write("x" * metrics.MAX_LINE + "\n" + json.dumps(event(170, smoothed_loss=0.01)) + "\n" + "{\n")
    data = dashboard.get("/api/runs/metrics", params={"run": "done"}).json()
    assert data["events"][-1]["iter"] == 170
    assert data["damaged"] == [  # the long line named once, its tail not again; the lines after it numbered on
        {"line": 21, "reason": f"a line of over {metrics.MAX_LINE:,} bytes, longer than any event"},
        {"line": 23, "reason": "not a JSON line (Expecting property name enclosed in double quotes)"}]


def test_a_fifo_for_metrics_is_never_waited_on(workspace):
    os.remove(workspace / "killed" / "metrics.jsonl")
    os.mkfifo(workspace / "killed" / "metrics.jsonl")
    rows = {row["run"]: row for row in client(workspace).get("/api/runs").json()}
    assert rows["done"]["iter"] == 150


def test_non_finite_values_reach_the_page_as_gaps(workspace):
    with open(workspace / "killed" / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(event(40, smoothed_loss="nan", loss="inf")) + "\n")
    data = client(workspace).get("/api/runs/metrics", params={"run": "killed"}).json()
    assert data["events"][-1]["smoothed_loss"] is None and data["events"][-1]["loss"] is None


def test_the_run_page_shows_configs_snapshots_overlays_and_the_net(workspace):
    page = client(workspace).get("/run", params={"run": "done", "with": ["killed", "exp/blew-up"]})
    assert page.status_code == 200
    text = page.text
    assert "<h3>solver.yaml</h3><pre>base_lr: 0.01  # &lt;b&gt;not markup&lt;/b&gt;" in text
    assert "<td>net_iter_150.solverstate.h5</td>" in text and "<td>net_iter_150.weights.h5</td>" in text
    assert 'data-runs="[&quot;done&quot;, &quot;killed&quot;, &quot;exp/blew-up&quot;]"' in text
    assert '<input type="checkbox" class="overlay" value="killed" checked> killed' in text
    assert "the run&#x27;s config/ holds no copy of its solver or net" in text
    assert text.count("disabled") == 2  # a run that is not running cannot be stopped or snapshotted
    charts = re.findall(r'<div id="(chart-[a-z]+)" class="chart">', text)
    assert charts == ["chart-loss", "chart-test", "chart-accuracy", "chart-other", "chart-lr"]
    assert re.findall(r'class="log-scale" data-chart="([a-z-]+)"', text) == ["chart-loss", "chart-test"]
    assert '<div class="chart-box" data-optional hidden><div id="chart-other"' in text  # shown once it has a curve
    assert client(workspace).get("/run", params={"run": "done", "with": "../x"}).status_code == 403


def digits_workspace(tmp_path_factory) -> Path:
    """A workspace with the quickstart's configs (no periodic snapshots) and the digits converted."""
    folder = tmp_path_factory.mktemp("workspace")
    for name in ("solver.yaml", "digits_net.yaml"):
        shutil.copy(DIGITS / name, folder / name)
    solver = folder / "solver.yaml"
    solver.write_text(solver.read_text().replace("snapshot: 500", "snapshot: 0"))
    assert run("convert", "digits", folder / "data").returncode == 0
    return folder


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The digits workspace with a short finished run."""
    folder = digits_workspace(tmp_path_factory)
    trained = run("train", folder / "solver.yaml", "--max-iter", "60", "--out", folder / "short")
    assert trained.returncode == 0, trained.stderr
    return folder


def test_the_net_is_drawn_as_svg_or_shown_as_dot_text(digits, monkeypatch):
    dashboard = client(digits)
    row = dashboard.get("/api/runs").json()[0]
    assert (row["run"], row["state"], row["message"]) == ("short", "finished", "optimization done at iteration 60")
    page = dashboard.get("/run", params={"run": "short"}).text
    assert '<img class="net" src="api/runs/net.svg?run=short"' in page
    assert "<h3>digits_net.yaml</h3>" in page and "<h3>sources.json</h3>" in page
    svg = dashboard.get("/api/runs/net.svg", params={"run": "short"})
    assert svg.headers["content-type"] == "image/svg+xml" and b"conv1" in svg.content

    def no_graphviz(graph, out, rankdir="TB"):
        raise NetspecError(f"{out}: drawing svg needs Graphviz")

    monkeypatch.setattr(dashboard_runs, "draw", no_graphviz)
    page = client(digits).get("/run", params={"run": "short"}).text
    assert "the SVG: drawing svg needs Graphviz" in page and '<pre>digraph &quot;DigitsNet&quot;' in page


def test_a_diverged_training_shows_as_diverged_with_its_message(digits, tmp_path):
    solver = tmp_path / "solver.yaml"
    solver.write_text((digits / "solver.yaml").read_text().replace("base_lr: 0.01", "base_lr: 1e6"))
    (tmp_path / "digits_net.yaml").write_text((digits / "digits_net.yaml").read_text().replace(
        "data/", f"{digits}/data/"))
    assert run("train", solver, "--max-iter", "50", "--out", tmp_path / "blown").returncode == 1
    state, message = states(client(tmp_path))["blown"]
    assert state == "diverged" and message.startswith("iteration 2: the loss is nan; the first non-finite output")


def test_a_net_with_python_layers_is_not_imported(tmp_path):
    folder = make_run(tmp_path / "py", training_events(10))
    (folder / "config" / "net.yaml").write_text(
        "layers:\n- {name: x, type: Python, top: x, python_param: {module: evil, layer: Evil}}\n")
    (folder / "config" / "sources.json").write_text(json.dumps({"solver": None, "train_net": "/gone/net.yaml"}))
    page = client(tmp_path).get("/run", params={"run": "py"}).text
    assert "a Python layer imports module &#x27;evil&#x27;, which runs its code" in page


@contextlib.contextmanager
def served(app):
    """``app`` served by uvicorn on a free local port, in a thread; yields the port."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def next_message(response) -> dict:
    """The next server-sent event's fields (comments skipped)."""
    fields = {}
    while True:
        line = response.readline().decode().rstrip("\n")
        if not line and fields:
            return fields
        if line and not line.startswith(":"):
            key, _, value = line.partition(": ")
            fields[key] = value


def test_the_stream_delivers_a_line_appended_while_it_streams(workspace):
    dashboard = client(workspace)
    position = dashboard.get("/api/runs/metrics", params={"run": "done"}).json()["position"]
    with served(create_app(str(workspace), TOKEN, False)) as port:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", f"/api/runs/stream?run=done&since={position}")
        response = connection.getresponse()
        assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
        time.sleep(0.3)
        with open(workspace / "done" / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(event(160, smoothed_loss=0.5)) + "\n")
        written = time.perf_counter()
        message = next_message(response)
        delay = time.perf_counter() - written
        connection.close()
    assert message["event"] == "metrics" and delay < 2
    assert json.loads(message["data"]) == {"events": [{"iter": 160, "phase": "TRAIN", "test_net": 0, "lr": 0.01,
                                                       "smoothed_loss": 0.5}], "damaged": []}
    after = dashboard.get("/api/runs/metrics", params={"run": "done"}).json()["position"]
    assert message["id"] == after  # a reconnecting browser sends it back as Last-Event-ID


def test_the_stream_says_reset_when_the_file_is_rewritten(workspace):
    metrics = workspace / "done" / "metrics.jsonl"
    position = Position(metrics.stat().st_ino, metrics.stat().st_size, 21)

    async def first_message():
        stream = tail(str(metrics), position)
        try:
            return await stream.__anext__()
        finally:
            await stream.aclose()

    replacement = workspace / "done" / "replacement"
    replacement.write_text(json.dumps(event(0, smoothed_loss=1.0)) + "\n")
    os.replace(replacement, metrics)
    assert anyio.run(first_message) == "event: reset\ndata: {}\n\n"


@pytest.mark.parametrize("path", ["..", "../outside", "exp/../../outside", "/etc", "//etc", "exp\\..\\..",
                                  ".hidden/run", "escape", "escape/inner", "a\0b"])
def test_paths_out_of_the_workspace_are_refused(tmp_path, path):
    workspace = tmp_path / "ws"
    make_run(workspace / "exp", training_events(10))
    make_run(workspace / ".hidden" / "run", training_events(10))
    make_run(tmp_path / "outside" / "inner", training_events(10))
    (workspace / "escape").symlink_to(tmp_path / "outside")
    dashboard = client(workspace)
    for endpoint in ("/run", "/api/runs/metrics", "/api/runs/stream", "/api/runs/net.svg"):
        answer = dashboard.get(endpoint, params={"run": path})
        assert (answer.status_code, answer.text) == (403, f"{path!r}: outside the workspace")
    assert [row["run"] for row in dashboard.get("/api/runs").json()] == ["exp"]


def test_url_encoded_traversal_is_refused_and_missing_runs_are_404(tmp_path):
    make_run(tmp_path / "exp", training_events(10))
    dashboard = client(tmp_path)
    assert dashboard.get("/run?run=%2E%2E%2Fexp").status_code == 403
    assert dashboard.get("/run?run=exp%2F%2E%2E%2F%2E%2E").status_code == 403
    assert dashboard.get("/static/..%2F..%2Fapp.py").status_code == 404
    missing = dashboard.get("/run", params={"run": "nothing"})
    assert (missing.status_code, missing.text) == (404, "'nothing': no such folder in the workspace")
    (tmp_path / "plain").mkdir()
    assert dashboard.get("/run", params={"run": "plain"}).status_code == 404
    assert dashboard.get("/run").status_code == 400


def test_beyond_loopback_every_request_needs_the_token(workspace):
    anyone = client(workspace, token_required=True)
    refused = anyone.get("/")
    assert refused.status_code == 403 and "needs the dashboard's token" in refused.text
    assert anyone.get("/api/runs", params={"token": "wrong"}).status_code == 403
    assert anyone.get("/static/dashboard.js").status_code == 403
    visitor = client(workspace, token_required=True)
    first = visitor.get("/", params={"token": TOKEN})
    assert first.status_code == 200
    # the cookie goes to the pages' secret path only: a browser sends a host's cookies to all its ports, and counts
    # them as one site (SameSite), so a server on another port never learns it; the port in its name keeps two
    # dashboards from taking each other's
    assert first.headers["set-cookie"] == (f"netspec_dashboard_token_6006={TOKEN}; Path=/{PREFIX}/; HttpOnly; "
                                           "SameSite=Strict")
    assert visitor.get("/api/runs").status_code == 200  # the cookie carries it from now on
    remote = TestClient(create_app(str(workspace), TOKEN, True), base_url="http://192.0.2.7:6006")
    assert remote.get("/", params={"token": TOKEN}).status_code == 200  # any Host, with the token
    other_port = TestClient(create_app(str(workspace), "another-token", True), base_url="http://127.0.0.1:6007")
    second = other_port.get("/", params={"token": "another-token"})
    assert second.headers["set-cookie"].startswith("netspec_dashboard_token_6007=another-token;")


def test_the_pages_lie_under_the_launchs_prefix_and_link_within_it(workspace):
    outside = TestClient(create_app(str(workspace), TOKEN, False, prefix=PREFIX), base_url=LOCAL)
    assert outside.get("/").status_code == 404 and outside.get("/api/runs").status_code == 404
    assert outside.get(f"/{PREFIX}").status_code == 200  # (redirected to /PREFIX/)
    page = client(workspace).get("/run", params={"run": "done"}).text
    links = re.findall(r'(?:href|src|action)="([^"]*)"', page)
    assert links and not [link for link in links if link.startswith("/") or "//" in link]  # relative, all of them


def test_on_loopback_reads_are_open_to_local_names_only(workspace):
    assert client(workspace).get("/").status_code == 200
    for host in ("localhost:6006", "[::1]:6006", "127.0.0.1"):
        assert client(workspace).get("/", headers={"host": host}).status_code == 200
    rebound = client(workspace).get("/", headers={"host": "attacker.example:6006"})
    assert rebound.status_code == 403 and "answers to localhost / 127.0.0.1 only" in rebound.text


def test_posts_need_the_token_the_same_origin_and_a_small_body(workspace):
    dashboard = client(workspace)
    path = "/api/runs/stop?run=done"
    with_token = f"{path}&token={TOKEN}"
    assert dashboard.post(path, headers={"origin": LOCAL}).status_code == 403
    no_origin = dashboard.post(with_token)
    assert no_origin.status_code == 403 and "cross-origin request refused" in no_origin.text
    for origin in ("http://attacker.example", "null", "http://127.0.0.1:6007"):
        assert dashboard.post(with_token, headers={"origin": origin}).status_code == 403
    assert dashboard.post(with_token, headers={"referer": LOCAL + "/run?run=done"}).status_code == 409
    answer = dashboard.post(with_token, headers={"origin": LOCAL})
    assert (answer.status_code, answer.text) == (409, "done is not running")
    assert dashboard.post(path, headers={"origin": LOCAL}).status_code == 409  # the cookie a request with it set
    assert post(dashboard, path, **{"content-length": str(2 ** 30)}).status_code == 413
    assert dashboard.post(with_token, headers={"origin": LOCAL}, content=b"x" * (2 ** 20 + 1)).status_code == 413
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_snapshot_and_stop_signal_a_real_training(digits):
    out = digits / "live"
    training = subprocess.Popen([sys.executable, "-m", "netspec", "train", str(digits / "solver.yaml"),
                                 "--max-iter", "1000000", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size > 0)
        dashboard = client(digits)
        assert states(dashboard)["live"] == ("running", f"pid {training.pid}")
        asked = post(dashboard, "/api/runs/snapshot?run=live")
        assert (asked.status_code, asked.text) == (200, f"asked live (pid {training.pid}) for a snapshot (SIGHUP)")
        wait_for(lambda: list(out.glob("digits_iter_*.weights.h5")))
        assert training.poll() is None  # a snapshot, and training goes on
        stopped = post(dashboard, "/api/runs/stop?run=live")
        assert stopped.text == f"asked live (pid {training.pid}) for a stop (SIGINT)"
        assert training.wait(60) == 128 + signal.SIGINT
    finally:
        if training.poll() is None:
            training.kill()
    state, message = states(dashboard)["live"]
    assert state == "stopped" and message.startswith("stop requested (SIGINT): stopping at iteration")
    assert post(dashboard, "/api/runs/stop?run=live").status_code == 409


def states(dashboard: TestClient) -> dict[str, tuple[str, str]]:
    return {row["run"]: (row["state"], row["message"]) for row in dashboard.get("/api/runs").json()}


def wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_snapshot_waits_for_the_training_loop(tmp_path):
    folder = make_run(tmp_path / "starting", training_events(10))
    time.sleep(0.02)
    with run_folder.locked(str(folder)):  # a training building its nets: metrics.jsonl is older than the lock
        answer = post(client(tmp_path), "/api/runs/snapshot?run=starting")
    assert (answer.status_code, answer.text) == (409, "starting has not started training yet: ask again in a moment")


def test_static_files_are_the_dashboards_own_and_plotly_as_shipped(workspace):
    dashboard = client(workspace)
    plotly = dashboard.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and plotly.headers["content-type"].startswith("text/javascript")
    assert plotly.content == Path(dashboard_app.static_files()["plotly.min.js"]).read_bytes()
    assert "EventSource" in dashboard.get("/static/dashboard.js").text
    assert dashboard.get("/static/other.js").status_code == 404


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_command_prints_a_url_with_its_token_and_serves(workspace):
    port = free_port()
    everywhere = "0.0.0.0"  # noqa: S104 - listening beyond loopback is what this test is about
    command = subprocess.Popen([sys.executable, "-m", "netspec", "dashboard", str(workspace), "--host", everywhere,
                                "--port", str(port), "--token", TOKEN], stdout=subprocess.PIPE, text=True)
    try:
        first = command.stdout.readline()
        prefix = re.fullmatch(rf"netspec dashboard of {re.escape(str(workspace))}: http://[^/]+:{port}/([\w-]{{16}})/"
                              rf"\?token={TOKEN}\n", first).group(1)
        assert "every request needs the token" in command.stdout.readline()

        def status(path: str) -> int | None:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", path)
                return connection.getresponse().status
            except ConnectionRefusedError:
                return None

        wait_for(lambda: status("/") is not None, 30)
        assert (status(f"/{prefix}/"), status(f"/{prefix}/?token={TOKEN}"), status(f"/?token={TOKEN}")) == (403, 200, 404)
    finally:
        command.send_signal(signal.SIGINT)
        command.wait(10)


def test_without_the_extra_the_command_says_what_to_install():
    blocked = ("import sys; sys.modules['starlette'] = None; from netspec.cli import main; "
               "main(['dashboard'])")
    result = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (
        1, "error: netspec dashboard needs starlette: python3 -m pip install 'netspec[dashboard]'\n")
