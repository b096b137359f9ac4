"""How fast `netspec dashboard` answers over a large workspace.

Makes RUNS run folders of ITERATIONS logged iterations each (a train event
every iteration, a test every 100) in a temporary folder, serves them with
uvicorn on a local port, and times over HTTP: the runs page (first response
of a fresh server, then again, then after every file grew by a line), a run
page and its data endpoint, and how long a line appended to metrics.jsonl
takes to reach a client of the event stream.

With --browser it then drives a headless Chromium (Playwright, with the Chromium
on the PATH or named by $NETSPEC_CHROMIUM, never Playwright's downloaded ones)
against a fresh server and times what a person sees: the first paint and first
contentful paint of the runs page and of a run page, how long the run page takes
to draw every point of its three charts, all from navigation start, and how
long a line appended to metrics.jsonl takes to show in the page's loss curve.

    python benchmarks/dashboard.py [--runs 50] [--iterations 10000]
    python benchmarks/dashboard.py --browser [--runs 50] [--iterations 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn

from netspec.dashboard.app import create_app
from netspec.training import run_folder

TOKEN = "benchmark"  # noqa: S105 - a throwaway token for a local server
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Run in a run page before its own scripts: checks every animation frame whether each chart's traces hold the
# points WANTED names (chart id -> points in each of its traces) and keeps the performance.now() of the first
# frame they do, that is milliseconds since navigation start, in window.chartsDrawnAt.
CHARTS_DRAWN = """
const WANTED = %s;
function chartsDrawn() {
  const drawn = Object.entries(WANTED).every(([id, points]) => {
    const chart = document.getElementById(id);
    return chart && chart.data && chart.data.length > 0 && chart.data.every((trace) => trace.x.length === points);
  });
  if (drawn) window.chartsDrawnAt = performance.now(); else requestAnimationFrame(chartsDrawn);
}
requestAnimationFrame(chartsDrawn);
"""
# whether the loss chart's first trace ends at the given iteration
LOSS_ENDS_AT = """(iteration) => {
  const chart = document.getElementById("chart-loss");
  const x = chart && chart.data && chart.data.length > 0 ? chart.data[0].x : [];
  return x.length > 0 && x[x.length - 1] === iteration;
}"""


def train_event(index: int, iteration: int) -> dict:
    """The TRAIN event that run number ``index`` of the workspace logs at ``iteration``."""
    return {"iter": iteration, "phase": "TRAIN", "lr": 0.01 * 0.9999 ** iteration, "epoch": iteration / 22.45,
            "smoothed_loss": 2.3 / (1 + iteration / 500), "images_per_s": 2400.0 + index,
            "loss": 2.3 / (1 + iteration / 400)}


def make_workspace(root: Path, runs: int, iterations: int) -> None:
    """``runs`` run folders with ``iterations`` train events each, tests every 100, configs and a snapshot."""
    for index in range(runs):
        folder = root / f"group{index % 5}" / f"run{index:02d}"
        (folder / "config").mkdir(parents=True)
        (folder / "config" / "solver.yaml").write_text(f"base_lr: 0.01\nmax_iter: {iterations}\n")
        lines = []
        for iteration in range(iterations):
            lines.append(json.dumps(train_event(index, iteration)))
            if iteration % 100 == 0:
                lines.append(json.dumps({"iter": iteration, "phase": "TEST", "lr": 0.01, "epoch": iteration / 22.45,
                                         "accuracy": 1 - 0.9 / (1 + iteration / 300), "loss": 2 / (1 + iteration)}))
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        for path in run_folder.snapshot_paths(str(folder / "net"), iterations):
            Path(path).write_bytes(b"\0" * 1024)
        run_folder.write_outcome(str(folder), "finished", f"optimization done at iteration {iterations}")


@contextlib.contextmanager
def served(root: Path):
    """A fresh dashboard over ``root`` on a free local port; yields the port."""
    server = uvicorn.Server(uvicorn.Config(create_app(str(root), TOKEN, False), host="127.0.0.1", port=0,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def timed_get(port: int, path: str) -> tuple[float, int]:
    """Seconds until the whole response to GET ``path`` arrived, and its size in bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    connection.close()
    assert response.status == 200, (path, response.status, body[:200])
    return elapsed, len(body)


def stream_delay(port: int, metrics: Path, run: str, repeats: int) -> list[float]:
    """Seconds from appending a line to metrics.jsonl until the event stream delivered it, ``repeats`` times."""
    _, _ = timed_get(port, f"/api/runs/metrics?run={run}")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", f"/api/runs/metrics?run={run}")
    position = json.loads(connection.getresponse().read())["position"]
    connection.request("GET", f"/api/runs/stream?run={run}&since={position}")
    response = connection.getresponse()
    delays = []
    for repeat in range(repeats):
        with open(metrics, "a") as handle:
            handle.write(json.dumps({"iter": 10 ** 6 + repeat, "phase": "TRAIN", "lr": 0.001, "smoothed_loss": 0.1})
                         + "\n")
        written = time.perf_counter()
        while not response.readline().startswith(b"data: "):
            pass
        delays.append(time.perf_counter() - written)
        time.sleep(0.05 * repeat)  # land at different points of the stream's polling (a fixed pause would not)
    connection.close()
    return delays


def chromium() -> str | None:
    """The Chromium executable to drive: $NETSPEC_CHROMIUM, else the first of CHROMIUM_NAMES on the PATH."""
    named = os.environ.get("NETSPEC_CHROMIUM")
    if named:
        return named if os.path.isfile(named) else None
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def logged(metrics: Path) -> tuple[dict[str, int], int]:
    """The points each trace of each chart of a run page should hold for ``metrics`` (every TRAIN line of
    this workspace has a loss and a learning rate, every TEST line the same outputs), and its last iteration."""
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = sum(event["phase"] == "TRAIN" for event in events)
    test = len(events) - train
    return {"chart-loss": train, "chart-test": test, "chart-lr": train}, max(event["iter"] for event in events)


def paints(page) -> dict[str, float]:
    """Milliseconds from navigation start to the page's first paint and first contentful paint."""
    page.wait_for_function("() => performance.getEntriesByName('first-contentful-paint').length > 0")
    return page.evaluate("Object.fromEntries(performance.getEntriesByType('paint')"
                         ".map((entry) => [entry.name, entry.startTime]))")


def browser_figures(executable: str, port: int, metrics: Path, run: str,
                    repeats: int) -> tuple[list[tuple[str, float]], list[float], list[str]]:
    """What a person sees in headless Chromium: (label, milliseconds from navigation start) rows for the runs
    page and the run page of ``run`` (whose metrics.jsonl is ``metrics``), each first in a new browser context
    (nothing cached) and then reloaded; the seconds from appending a TRAIN line to metrics.jsonl until the
    page's loss curve ends at it, ``repeats`` times; and any script errors the pages reported."""
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}"
    rows, delays, problems = [], [], []
    wanted, last = logged(metrics)
    with sync_playwright() as playwright:
        # Chromium refuses to start as root without --no-sandbox
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            def new_page(name: str, init_script: str | None = None):
                page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                if init_script:
                    page.add_init_script(init_script)
                page.on("pageerror", lambda error: problems.append(f"{name}: {error}"))
                page.on("console", lambda message: problems.append(f"{name}: {message.text}")
                        if message.type == "error" else None)
                page.goto("about:blank")  # the browser's own start-up is not the page's
                return page

            runs_page = new_page("runs page")
            for label, load in (("runs page, first visit", lambda: runs_page.goto(base + "/")),
                                ("runs page, reloaded", runs_page.reload)):
                load()
                times = paints(runs_page)
                rows += [(f"{label}: first paint", times["first-paint"]),
                         (f"{label}: first contentful paint", times["first-contentful-paint"])]
            runs_page.context.close()

            page = new_page("run page", CHARTS_DRAWN % json.dumps(wanted))
            for label, load in (("run page, first visit", lambda: page.goto(f"{base}/run?run={run}")),
                                ("run page, reloaded", page.reload)):
                load()
                times = paints(page)
                page.wait_for_function("() => window.chartsDrawnAt !== undefined", timeout=120_000)
                rows += [(f"{label}: first paint", times["first-paint"]),
                         (f"{label}: first contentful paint", times["first-contentful-paint"]),
                         (f"{label}: all chart points drawn", page.evaluate("window.chartsDrawnAt"))]

            for repeat in range(repeats):
                time.sleep(0.05 * repeat)  # land at different points of the server's polling and the page's batching
                iteration = last + 1 + repeat
                with open(metrics, "a") as handle:
                    handle.write(json.dumps(train_event(0, iteration)) + "\n")
                written = time.perf_counter()
                page.wait_for_function(LOSS_ENDS_AT, arg=iteration, polling="raf", timeout=30_000)
                delays.append(time.perf_counter() - written)
        finally:
            browser.close()
    return rows, delays, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--browser", action="store_true",
                        help="also time the pages in headless Chromium (needs Chromium and playwright)")
    args = parser.parse_args()
    executable = chromium() if args.browser else None
    if args.browser:
        try:
            import playwright.sync_api  # noqa: F401 - only to know it is there
        except ImportError:
            sys.exit("--browser needs the playwright Python package (pip install playwright; never its browsers)")
        if executable is None:
            sys.exit(f"--browser needs a Chromium executable: none of {', '.join(CHROMIUM_NAMES)} is on the PATH "
                     "and $NETSPEC_CHROMIUM names no file")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        start = time.perf_counter()
        make_workspace(root, args.runs, args.iterations)
        size = sum(path.stat().st_size for path in root.rglob("metrics.jsonl"))
        print(f"workspace: {args.runs} runs x {args.iterations:,} iterations, {size / 2 ** 20:.0f} MB of "
              f"metrics.jsonl (made in {time.perf_counter() - start:.1f} s)")
        run = "group0/run00"
        rows = []
        with served(root) as port:
            rows.append(("runs page, first response of a fresh server", *timed_get(port, "/")))
            rows.append(("runs page again", *timed_get(port, "/")))
            for metrics in root.rglob("metrics.jsonl"):
                with open(metrics, "a") as handle:
                    handle.write(json.dumps({"iter": args.iterations, "phase": "TEST", "lr": 0.001,
                                             "accuracy": 0.99, "loss": 0.01}) + "\n")
            rows.append(("runs page after every file grew a line", *timed_get(port, "/")))
            rows.append(("run page, first response", *timed_get(port, f"/run?run={run}")))
            rows.append(("run data endpoint (every event), first", *timed_get(port, f"/api/runs/metrics?run={run}")))
            rows.append(("run data endpoint again", *timed_get(port, f"/api/runs/metrics?run={run}")))
            other = "group1/run01"
            rows.append(("another run's data endpoint, first", *timed_get(port, f"/api/runs/metrics?run={other}")))
            delays = stream_delay(port, root / run / "metrics.jsonl", run, 10)
        for label, seconds, size in rows:
            print(f"{label:<48} {seconds * 1000:8.1f} ms  {size / 1024:8.1f} KB")
        print(f"{'new metrics line to a stream client':<48} {statistics.median(delays) * 1000:8.1f} ms  "
              f"(median of {len(delays)}, max {max(delays) * 1000:.0f} ms)")
        if not args.browser:
            return
        print("in headless Chromium, a fresh server; times from navigation start:")
        with served(root) as port:
            rows, delays, problems = browser_figures(executable, port, root / run / "metrics.jsonl", run, 10)
        for label, milliseconds in rows:
            print(f"{label:<48} {milliseconds:8.1f} ms")
        label = "new metrics line to the page's loss curve"
        print(f"{label:<48} {statistics.median(delays) * 1000:8.1f} ms  "
              f"(median of {len(delays)}, max {max(delays) * 1000:.0f} ms)")
        for problem in problems:
            print(f"script error in the {problem}")


if __name__ == "__main__":
    main()
