"""How fast `netspec dashboard` answers over a large workspace.

Makes RUNS run folders of ITERATIONS logged iterations each (a train event
every iteration, a test every 100) in a temporary folder, serves them with
uvicorn on a local port, and times over HTTP: the runs page (first response
of a fresh server, then again, then after every file grew by a line), a run
page and its data endpoint, and how long a line appended to metrics.jsonl
takes to reach a client of the event stream.

    python benchmarks/dashboard.py [--runs 50] [--iterations 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import uvicorn

from netspec.dashboard.app import create_app
from netspec.training import run_folder

TOKEN = "benchmark"  # noqa: S105 - a throwaway token for a local server


def make_workspace(root: Path, runs: int, iterations: int) -> None:
    """``runs`` run folders with ``iterations`` train events each, tests every 100, configs and a snapshot."""
    for index in range(runs):
        folder = root / f"group{index % 5}" / f"run{index:02d}"
        (folder / "config").mkdir(parents=True)
        (folder / "config" / "solver.yaml").write_text(f"base_lr: 0.01\nmax_iter: {iterations}\n")
        lines = []
        for iteration in range(iterations):
            lines.append(json.dumps({"iter": iteration, "phase": "TRAIN", "lr": 0.01 * 0.9999 ** iteration,
                                     "epoch": iteration / 22.45, "smoothed_loss": 2.3 / (1 + iteration / 500),
                                     "images_per_s": 2400.0 + index, "loss": 2.3 / (1 + iteration / 400)}))
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
        time.sleep(0.13)  # land at different points of the stream's polling
    connection.close()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=10_000)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
