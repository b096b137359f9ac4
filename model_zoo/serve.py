"""``netspec zoo serve``: a read-only HTTP server for a zoo folder (index, cards, files, Range requests).

Only GET and HEAD are answered.  A path must name a regular file below the
zoo through plain names (no ``..``, no hidden folders such as ``.partial``,
no symbolic links); anything else is 404.  A Range header other than one
``bytes=a-b`` range of at most 18-digit numbers is 416.  A connection that
sends or takes nothing for ``idle_timeout`` seconds is closed, and a request
that fails is logged in one line; the server goes on.
"""

from __future__ import annotations

import http.server
import os
import re
import sys
import urllib.parse

CONTENT_TYPES = {".json": "application/json", ".yaml": "text/yaml; charset=utf-8", ".md": "text/markdown"}
RANGE = re.compile(r"^bytes=(\d{0,18})-(\d{0,18})$")  # larger numbers are no file's offsets
IDLE_TIMEOUT = 60.0  # seconds a connection may stay silent


class ZooRequestHandler(http.server.BaseHTTPRequestHandler):
    """Serves the files of ``server.zoo_root``."""

    server_version = "netspec-zoo"

    def setup(self):
        self.timeout = self.server.idle_timeout  # read by StreamRequestHandler.setup
        super().setup()

    def log_message(self, format, *args):
        if self.server.verbose:
            super().log_message(format, *args)

    def _file(self) -> str | None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if not parts or any(p.startswith(".") or "\\" in p or "\0" in p for p in parts):
            return None
        current = self.server.zoo_root
        for part in parts:
            current = os.path.join(current, part)
            if os.path.islink(current):
                return None
        return current if os.path.isfile(current) else None

    def do_HEAD(self):
        self._serve(send_body=False)

    def do_GET(self):
        self._serve(send_body=True)

    def _serve(self, send_body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_error(404, "not found")
            return
        size = os.path.getsize(path)
        start, end = 0, size - 1
        header = self.headers.get("Range")
        if header:
            match = RANGE.match(header.strip())
            if not match or not (match.group(1) or match.group(2)):
                self.send_error(416, "only one 'bytes=a-b' range is served")
                return
            first, last = match.groups()
            if first:
                start, end = int(first), min(int(last), size - 1) if last else size - 1
            else:
                start = max(0, size - int(last))
            if start > end or start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
        self.send_response(206 if header else 200)
        self.send_header("Content-Type", CONTENT_TYPES.get(os.path.splitext(path)[1], "application/octet-stream"))
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if header:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if send_body:
            with open(path, "rb") as handle:
                handle.seek(start)
                _copy_range(handle, self.wfile, end - start + 1)


def _copy_range(source, out, count: int) -> None:
    remaining = count
    while remaining:
        chunk = source.read(min(remaining, 1 << 16))
        if not chunk:
            return
        out.write(chunk)
        remaining -= len(chunk)


class ZooServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server that reports a failed request in one line instead of a traceback (a client that
    went away or fell silent only when verbose)."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if self.verbose or not isinstance(error, (ConnectionError, TimeoutError)):
            print(f"{client_address[0]}:{client_address[1]}: request failed: {error!r}", file=sys.stderr)


def make_server(root: str, host: str = "127.0.0.1", port: int = 8765, verbose: bool = False,
                idle_timeout: float = IDLE_TIMEOUT) -> ZooServer:
    """A threading HTTP server for the zoo at ``root`` (port 0 picks a free one).

    A connection that sends or takes nothing for ``idle_timeout`` seconds is closed.
    """
    server = ZooServer((host, port), ZooRequestHandler)
    server.zoo_root = os.path.realpath(root)
    server.verbose = verbose
    server.idle_timeout = idle_timeout
    return server

