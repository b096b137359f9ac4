"""Hostile zoos, servers and clients: a download takes no more than the card says and the disk has, leaves no
partial file it cannot resume, and ``zoo serve`` outlives malformed and silent clients; bad indexes, cards and
source configs are one line each."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import io
import json
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest
from hostile import file_size_limit, files_under, refuses, run

import netspec
from netspec.engine.weights import FORMAT
from netspec.model_zoo.serve import make_server

ROOT = Path(__file__).parent.parent.parent


def weights_bytes(size: int) -> bytes:
    """A netspec weights file of no layer padded to ``size`` bytes (HDF5 ignores what follows its end)."""
    image = io.BytesIO()
    with h5py.File(image, "w") as handle:
        handle.attrs["format"] = FORMAT
    data = image.getvalue()
    return data + (bytes(range(250)) * (size // 250 + 1))[:size - len(data)]


WEIGHTS = weights_bytes(300_000)  # never loaded into a net: a download checks bytes and structure only
FILES = {"deploy.yaml": b"name: tiny\n", "weights.h5": WEIGHTS}
INDEX = {"format": "netspec-zoo-1", "models": {"tiny": {"versions": ["1"], "latest": "1", "summary": "",
                                                        "task": "image-classification"}}}


def make_zoo(root: Path, sizes: dict[str, int] | None = None, extra_files: tuple[str, ...] = ()) -> Path:
    """A zoo folder holding tiny@1 with FILES; ``sizes`` overrides sizes the card declares, ``extra_files`` are
    listed in the card as well (empty)."""
    folder = root / "models" / "tiny" / "1"
    folder.mkdir(parents=True)
    files = FILES | dict.fromkeys(extra_files, b"")
    lines = ["name: tiny", "version: '1'", "input: {shape: [1, 2, 2], channels: GRAY}", "files:"]
    for name, data in files.items():
        (folder / name).write_bytes(data)
        size = (sizes or {}).get(name, len(data))
        lines.append(f"  - {{path: {name}, size: {size}, sha256: {hashlib.sha256(data).hexdigest()}}}")
    (folder / "model.yaml").write_text("\n".join(lines) + "\n")
    (root / "index.json").write_text(json.dumps(INDEX))
    return root


@pytest.fixture
def serve():
    """Start an HTTP server in a thread; returns its URL.  Every server is shut down after the test."""
    servers = []

    def start(server) -> str:
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class HostileHandler(http.server.BaseHTTPRequestHandler):
    """Serves the index and cards of ``server.zoo`` as they are, and the model's files as ``server.send`` does."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.server.zoo / self.path.lstrip("/")
        if path.suffix in (".json", ".yaml"):
            send_headers(self, len(path.read_bytes()))
            self.wfile.write(path.read_bytes())
        else:
            with contextlib.suppress(ConnectionError):  # the client hung up, as it should
                self.server.send(self, path.read_bytes())


def send_headers(handler, length: int | None, ranges: bool = True) -> None:
    handler.send_response(200)
    if length is not None:
        handler.send_header("Content-Length", str(length))
    if ranges:
        handler.send_header("Accept-Ranges", "bytes")
    handler.end_headers()


def zeros_without_end(handler, data):
    send_headers(handler, None)
    for _ in range(10_000):  # 640 MB at most, if the client never stopped reading
        handler.wfile.write(bytes(1 << 16))


def zeros_of_the_right_length(handler, data):
    send_headers(handler, len(data))
    handler.wfile.write(bytes(len(data)))


def a_terabyte_announced(handler, data):
    send_headers(handler, 10**12)
    handler.wfile.write(data)


def half_then_close(handler, data, ranges: bool = True):
    send_headers(handler, len(data), ranges)
    handler.wfile.write(data[:len(data) // 2])


def hostile_server(zoo: Path, send) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HostileHandler)
    server.daemon_threads = True
    server.zoo, server.send = zoo, send
    return server


# ---- downloads ----------------------------------------------------------------------------------
@pytest.mark.parametrize("send, message", [
    (zeros_without_end, "weights.h5: more than the 300000 bytes the card lists; refused"),
    (zeros_of_the_right_length, "weights.h5: the sha256 does not match the card; the download was discarded"),
    (a_terabyte_announced, "weights.h5: the server has 1000000000000 bytes where the card lists 300000; refused"),
])
def test_a_server_sending_other_bytes_than_the_card_leaves_nothing_behind(tmp_path, serve, send, message):
    url = serve(hostile_server(make_zoo(tmp_path / "source"), send))
    zoo = tmp_path / "zoo"
    assert refuses("zoo", "download", "tiny", "--from", url, "--zoo", zoo).endswith(message)
    assert files_under(zoo) == set()


def test_a_transfer_that_breaks_off_keeps_its_part_only_for_a_server_that_can_resume(tmp_path, serve):
    source = make_zoo(tmp_path / "source")
    zoo = tmp_path / "zoo"
    url = serve(hostile_server(source, half_then_close))
    assert refuses("zoo", "download", "tiny", "--from", url, "--zoo", zoo).endswith(
        "weights.h5: the connection closed after 150000 of 300000 bytes; run the same command again to resume")
    assert (zoo / ".partial" / "tiny@1" / "weights.h5.part").read_bytes() == WEIGHTS[:150_000]
    result = run("zoo", "download", "tiny", "--from", serve(make_server(source, port=0)), "--zoo", zoo)
    assert result.returncode == 0, result.stderr
    assert (zoo / "models" / "tiny" / "1" / "weights.h5").read_bytes() == WEIGHTS
    assert ".partial" not in files_under(zoo)

    shutil.rmtree(zoo)
    url = serve(hostile_server(source, lambda handler, data: half_then_close(handler, data, ranges=False)))
    assert refuses("zoo", "download", "tiny", "--from", url, "--zoo", zoo).endswith(
        "the server cannot resume a download, so its partial files were removed")
    assert files_under(zoo) == set()


def test_a_card_larger_than_the_disk_is_refused_before_anything_is_written(tmp_path):
    source = make_zoo(tmp_path / "source", sizes={"weights.h5": 10**15})
    zoo = tmp_path / "zoo"
    needed = 10**15 + len(FILES["deploy.yaml"])
    spare = needed // 20 + (64 << 20)
    assert re.fullmatch(f"error: not enough disk space to download tiny@1: its files need {needed:,} more bytes and "
                        f"{spare:,} to spare, {re.escape(str(tmp_path))} has [0-9,]+ bytes free",
                        refuses("zoo", "download", "tiny", "--from", source, "--zoo", zoo))
    assert not zoo.exists()


@pytest.mark.parametrize("name", ["README.md", "weights.h5.part"])
def test_a_card_listing_a_name_the_zoo_writes_itself_is_refused(tmp_path, name):
    source = make_zoo(tmp_path / "source", extra_files=(name,))
    assert refuses("zoo", "download", "tiny", "--from", source, "--zoo", tmp_path / "zoo") == (
        f"error: {source}/models/tiny/1/model.yaml:4: files: '{name}' is a name the zoo gives its own files "
        "(model.yaml, README.md, *.part); rename the model's file")


def test_a_file_of_a_source_folder_that_is_a_link_is_never_copied_even_when_the_card_matches(tmp_path):
    """A link in a model folder could reach any file the user can read (a key, /etc/...): copied from regular
    files only, as zoo serve serves them."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own key\n")
    source = make_zoo(tmp_path / "source", extra_files=("notes.txt",))
    folder = source / "models" / "tiny" / "1"
    (folder / "notes.txt").unlink()
    (folder / "notes.txt").symlink_to(secret)
    card = (folder / "model.yaml").read_text().replace(hashlib.sha256(b"").hexdigest(),
                                                     hashlib.sha256(secret.read_bytes()).hexdigest())
    (folder / "model.yaml").write_text(card.replace("notes.txt, size: 0", f"notes.txt, size: {secret.stat().st_size}"))
    assert refuses("zoo", "download", "tiny", "--from", source, "--zoo", tmp_path / "zoo") == (
        f"error: {folder / 'notes.txt'}: cannot read: a symbolic link, which netspec never copies from")
    assert not (tmp_path / "zoo" / "models").exists()


# ---- zoo serve ----------------------------------------------------------------------------------
def test_the_server_survives_malformed_ranges_and_closes_silent_connections(tmp_path, serve):
    source = make_zoo(tmp_path / "source")
    port = int(serve(make_server(source, port=0, idle_timeout=1)).rsplit(":", 1)[1])

    def get(path, headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()

    for header in ("bytes=" + "9" * 5000 + "-", "bytes=-" + "9" * 5000, "bytes=1-2,5-6", "bytes=x-", "lines=1-2"):
        assert get("/models/tiny/1/weights.h5", {"Range": header})[0] == 416, header
    assert get("/models/tiny/1/weights.h5", {"Range": "bytes=10-19"}) == (206, WEIGHTS[10:20])

    for opening in (b"", b"GET /index.json HTTP/1.0\r\n"):  # nothing, or a request that never ends
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            silent.sendall(opening)
            started = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 5
    assert get("/index.json") == (200, json.dumps(INDEX).encode())


def test_zoo_serve_takes_its_idle_timeout_from_the_command_line(tmp_path):
    source = make_zoo(tmp_path / "source")
    server = subprocess.Popen([sys.executable, "-m", "netspec", "zoo", "serve", "--zoo", source, "--port", "0",
                               "--idle-timeout", "1"], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([server.stdout], [], [], 60)
        assert ready, "zoo serve did not start"
        port = int(server.stdout.readline().split("http://127.0.0.1:")[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            started = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 5
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---- indexes and configs ------------------------------------------------------------------------
def test_a_deep_or_mistyped_index_is_one_line_naming_it(tmp_path):
    source = make_zoo(tmp_path / "source")
    index = source / "index.json"
    deep = '{"format": "netspec-zoo-1", "models": {"tiny": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    mistyped = json.dumps(INDEX | {"models": {"tiny": {"versions": [3]}}})
    summary = json.dumps(INDEX | {"models": {"tiny": {"versions": ["1"], "summary": [[[[["deep"]]]]]}}})
    for text, problem in [
        (deep, "not a netspec zoo index (nested too deeply)"),
        (mistyped, "invalid index: model 'tiny': a version must be a string such as \"1\", not the number 3"),
        (summary, "invalid index: model 'tiny': 'summary' must be a string, not a list"),
    ]:
        index.write_text(text)
        assert refuses("zoo", "list", "--zoo", source) == f"error: {index}: {problem}"
        assert refuses("zoo", "list", "--from", source) == f"error: {index}: {problem}"
        assert refuses("zoo", "download", "tiny", "--from", source, "--zoo", tmp_path / "zoo") == (
            f"error: no source has tiny: {index}: {problem}")


def test_a_malformed_or_deep_sources_config_is_one_line_naming_it(tmp_path):
    config = tmp_path / "config" / "zoo.yaml"
    config.parent.mkdir()
    environment = {"NETSPEC_CONFIG_DIR": str(config.parent)}
    for text in ("sources: [\n", "sources: " + "[" * 5000 + "]" * 5000 + "\n"):
        config.write_text(text)
        assert refuses("zoo", "download", "tiny", "--zoo", tmp_path / "zoo", env=environment).startswith(
            f"error: {config}:")


# ---- publish ------------------------------------------------------------------------------------
def test_publish_takes_a_run_that_never_displayed_nor_tested(tmp_path):
    work = tmp_path / "digits"
    shutil.copytree(ROOT / "configs" / "digits", work, ignore=shutil.ignore_patterns("data", "runs"))
    (work / "solver.yaml").write_text("net: digits_net.yaml\nbase_lr: 0.01\nmax_iter: 2\ndisplay: 0\n"
                                      "snapshot_prefix: run/digits\n")
    for args in (("convert", "digits", work / "data"), ("train", work / "solver.yaml"),
                 ("zoo", "publish", "--name", "quiet", "--run", work / "run", "--scale", "0.00392156862745098",
                  "--zoo", tmp_path / "zoo")):
        result = run(*args)
        assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"published quiet@1 to {tmp_path}/zoo/models/quiet/1"


def test_a_zoo_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    zoo = tmp_path / "file" / "zoo"
    assert refuses("zoo", "download", "tiny", "--from", make_zoo(tmp_path / "source"), "--zoo", zoo) == (
        f"error: {zoo}: cannot write to the zoo: Not a directory")


def test_download_from_python_needs_no_progress_display(tmp_path):
    from netspec.model_zoo.download import download
    from netspec.model_zoo.sources import open_source
    from netspec.model_zoo.zoo import Zoo

    card = download("tiny", [open_source(str(make_zoo(tmp_path / "source")), 5)], Zoo(str(tmp_path / "zoo")))
    assert card.ref == "tiny@1" and (tmp_path / "zoo" / "models" / "tiny" / "1" / "weights.h5").read_bytes() == WEIGHTS


def test_a_models_words_reach_the_terminal_without_control_characters(tmp_path):
    deploy = Path(__file__).parent.parent.parent / "configs" / "digits" / "digits_deploy.yaml"
    weights = tmp_path / "w.h5"
    netspec.load_net(str(deploy), seed=1).save_weights(weights)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(["\x1b[31mred"] + [str(digit) for digit in range(1, 10)]) + "\n")
    evil = "digits \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J"  # writes the clipboard, clears the screen
    published = run("zoo", "publish", "--name", "evil", "--net", deploy, "--weights", weights, "--summary", evil,
                    "--labels", labels, "--zoo", tmp_path / "zoo")
    assert published.returncode == 0, published.stderr
    for command in (("zoo", "list", "--zoo", tmp_path / "zoo"), ("zoo", "show", "evil", "--zoo", tmp_path / "zoo")):
        result = run(*command)
        assert result.returncode == 0 and "\x1b" not in result.stdout + result.stderr, command
        assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in result.stdout


class Dripping(http.server.BaseHTTPRequestHandler):
    """Serves the zoo it is given (``server.zoo_root``) two bytes a second: every answer's headers
    (``server.drip = "headers"``), the weights after their headers ("body"), or the first answer (the index)
    after its headers ("index")."""

    def do_GET(self):
        path = self.server.zoo_root / self.path.lstrip("/")
        data = path.read_bytes() if path.is_file() else b""
        head = (f"HTTP/1.0 {200 if path.is_file() else 404} OK\r\nContent-Length: {len(data)}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        if self.server.drip == "body" and path.suffix != ".h5":  # (the index and the card come at once)
            head, data = head + data, b""
        if self.server.drip == "index":  # (the headers at once, the index a byte at a time)
            self.server.drip = "body"
        if self.server.drip == "steady":  # (the weights at 5 KiB/s, above MIN_RATE; the rest at once)
            with contextlib.suppress(OSError):
                self.wfile.write(head)
                step = 512 if path.suffix == ".h5" else len(data) or 1
                for start in range(0, len(data), step):
                    self.wfile.write(data[start:start + step])
                    self.wfile.flush()
                    time.sleep(0.1 if path.suffix == ".h5" else 0)
            return
        slow, fast = (head, data) if self.server.drip == "headers" else (data, head)
        with contextlib.suppress(OSError):
            if self.server.drip == "body":
                self.wfile.write(fast)
            for index in range(len(slow)):
                self.wfile.write(slow[index:index + 1])
                self.wfile.flush()
                time.sleep(0.5)
            if self.server.drip == "headers":
                self.wfile.write(fast)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("drip, expected, options", [
    ("headers", "the server sent no whole answer in 6 s; refused", ()),
    ("body", "slower than the 4,096 bytes a second a transfer must keep", ()),
    ("index", "slower than the 4,096 bytes a second a transfer must keep", ()),
    ("steady", "not done after 1 s (--deadline); stopped after", ("--deadline", 1)),  # (fast enough, too long)
])
def test_a_server_that_answers_a_byte_at_a_time_is_given_up_on(tmp_path, drip, expected, options):
    zoo = make_zoo(tmp_path / "zoo")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dripping)
    server.daemon_threads, server.zoo_root, server.drip = True, zoo, drip
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        line = refuses("zoo", "download", "tiny", "--from", f"http://127.0.0.1:{server.server_address[1]}", "--zoo",
                       tmp_path / "local", "--timeout", 2, *options, timeout=60)
        assert expected in line, line
        assert time.monotonic() - started < 30
    finally:
        server.shutdown()


def test_publishing_onto_a_full_disk_is_one_line_and_leaves_the_zoo_as_it_was(tmp_path):
    deploy = Path(__file__).parent.parent.parent / "configs" / "digits" / "digits_deploy.yaml"
    weights = tmp_path / "w.h5"
    netspec.load_net(str(deploy), seed=1).save_weights(weights)
    (tmp_path / "zoo").mkdir()
    with file_size_limit(weights.stat().st_size // 2):  # the weights' copy does not fit
        line = refuses("zoo", "publish", "--name", "m", "--net", deploy, "--weights", weights, "--zoo",
                       tmp_path / "zoo")
    assert line == f"error: {tmp_path / 'zoo'}: cannot publish m@1: File too large; the zoo is as it was", line
    assert files_under(tmp_path / "zoo") <= {".staging"}


def test_a_download_onto_a_full_disk_names_the_file_it_could_not_write(tmp_path):
    zoo = make_zoo(tmp_path / "zoo")
    with file_size_limit(len(WEIGHTS) // 2):  # the weights do not fit
        line = refuses("zoo", "download", "tiny", "--from", zoo, "--zoo", tmp_path / "local")
    assert re.search(r"error: \S+/weights\.h5\S*: cannot write: File too large", line), line  # (a path, no number)
