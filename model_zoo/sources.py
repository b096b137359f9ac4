"""Where models come from: folders and ``file://`` URLs, ``http(s)://`` servers, and transfers that resume.

A source reads small files whole (an index, a card, a readme) and fetches
large ones into a ``.part`` file, each cut off at the size it should have.
Both kinds name their files by paths relative to their root, and ``""`` names
the root itself, so a source opened on one file's URL fetches that file.  HTTP
URLs need a host, a numeric port and printable ASCII; redirects are followed
to such http and https URLs only.

A transfer that breaks off (a connection that fails, stalls past the timeout
or closes early, or Ctrl-C) is a :class:`TransferError`; :func:`resumable`
keeps the partial files then when the source can continue them (a folder, or
an HTTP server that answers Range requests) and they hold something, and
removes them after any other failure.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import html.parser
import http.client
import io
import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from netspec.atomic import open_for_writing
from netspec.errors import ConfigError
from netspec.model_zoo.card import PART
from netspec.model_zoo.zoo import ZooError
from netspec.spec.yaml_lines import load_yaml, read_source

SMALL_FILE_LIMIT = 1 << 20  # index.json, model.yaml and a directory listing are never larger
MAX_UNLISTED_BYTES = (1 << 31) - 1  # a file whose size no card lists: protobuf's own limit, so any caffemodel
CHUNK = 1 << 16
ANSWER_TIMEOUTS = 3  # a server's answer (its headers) must come whole within this many timeouts
MIN_RATE = 4096  # bytes a second a transfer keeps up, once its first timeout has passed
FILE_DEADLINE = 3600.0  # seconds one request of a file may take in all (zoo download --deadline)
SOURCES_CONFIG = "zoo.yaml"
SPARE_FRACTION, SPARE_BYTES = 0.05, 64 << 20  # room left on the disk beyond the files of a download


class TransferError(ZooError):
    """A transfer that broke off before the end of the file (connection failed, stalled or closed early)."""


class NotFoundError(ZooError):
    """A file the source does not have (a missing file, HTTP 404)."""


def sources_config_path() -> str:
    """``$NETSPEC_CONFIG_DIR/zoo.yaml`` (default ``~/.config/netspec/zoo.yaml``), where sources are configured."""
    folder = os.environ.get("NETSPEC_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "netspec")
    return os.path.join(folder, SOURCES_CONFIG)


def configured_sources() -> list[str]:
    """The ``sources: [...]`` of :func:`sources_config_path` ([] when the file does not exist)."""
    path = sources_config_path()
    if not os.path.isfile(path):
        return []
    config = load_yaml(*read_source(path)) or {}
    sources = config.get("sources", []) if isinstance(config, dict) else None
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ConfigError(f"{path}: 'sources' must be a list of folders or URLs")
    return sources


class FolderSource:
    """A folder (or ``file://`` URL) to copy from; it can always continue a partial file."""

    resumes = True

    def __init__(self, root: str):
        self.root = root
        self.label = root

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, *relative.split("/")) if relative else self.root

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """A small file's bytes; NotFoundError if missing, ZooError if over ``limit``."""
        path = self._path(relative)
        if not os.path.isfile(path):
            raise NotFoundError(f"{path}: not found")
        if os.path.getsize(path) > limit:
            raise ZooError(f"{path}: larger than {limit:,} bytes, more than such a file ever is")
        with self._open(path) as handle:
            return handle.read()

    def fetch(self, relative: str, partial: str, size: int | None, begin) -> None:
        """Append to ``partial`` the bytes of ``relative`` past its current length, up to ``size`` (None: a size no
        card lists).

        ``begin(total)`` is called before the first byte is copied, with the file's size, and returns the
        ``advance(count)`` of the transfer's progress, which is told first of the bytes ``partial`` keeps.
        """
        path = self._path(relative)
        if not os.path.isfile(path):
            raise NotFoundError(f"{path}: not found")
        with self._open(path) as source, open_for_writing(partial, "ab") as out:
            advance = begin(os.fstat(source.fileno()).st_size)
            advance(out.tell())
            source.seek(out.tell())
            _copy(source, out, size, path, advance)

    def folders(self) -> list[str]:
        """The names of the folders in the root, sorted (hidden ones left out)."""
        if not os.path.isdir(self.root):
            raise NotFoundError(f"{self.root}: not found")
        return sorted(name for name in os.listdir(self.root)
                      if not name.startswith(".") and os.path.isdir(os.path.join(self.root, name)))

    @staticmethod
    def _open(path: str):
        """``path`` open for reading; a ZooError when it cannot be, or is a symbolic link (a model's files are
        copied from regular files only, as a zoo serves them: a link in a model folder could reach any file)."""
        try:
            return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
        except OSError as exc:
            why = "a symbolic link, which netspec never copies from" if exc.errno == errno.ELOOP else exc.strerror
            raise ZooError(f"{path}: cannot read: {why}") from None


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects to http and https URLs only (urllib would follow one to ftp too), under the deadline of
    the request they answer."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urllib.parse.urlparse(newurl).scheme
        if scheme not in ("http", "https"):
            raise urllib.error.HTTPError(newurl, code, f"a redirect to {scheme}: refused", headers, fp)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.deadline = getattr(req, "deadline", None)
        return new


class _Deadline:
    """The connections a request opens, shut once ``seconds`` have passed: a server that answers a byte at a time,
    each within the socket's timeout, would hold a request forever."""

    def __init__(self, seconds: float):
        self.seconds, self.passed, self.connections = seconds, False, []
        self.timer = threading.Timer(seconds, self._shut)
        self.timer.daemon = True

    def connection(self, cls, *args, **kwargs):
        """A connection of ``cls``, watched."""
        connection = cls(*args, **kwargs)
        self.connections.append(connection)
        return connection

    def _shut(self) -> None:
        self.passed = True
        for connection in self.connections:
            if connection.sock is not None:
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)


class _WatchedHttp(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(req.deadline.connection, http.client.HTTPConnection), req)


class _WatchedHttps(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(functools.partial(req.deadline.connection, http.client.HTTPSConnection), req,
                            context=self._context)


_OPENER = urllib.request.build_opener(_HttpRedirects, _WatchedHttp, _WatchedHttps)


class HttpSource:
    """An HTTP(S) server; every request gives up after ``timeout`` seconds without data, its answer's headers
    after ``ANSWER_TIMEOUTS`` times that in all, a transfer that stays under MIN_RATE bytes a second once
    ``timeout`` seconds have passed, and one not done after ``deadline`` seconds (what it got is kept: the next
    download continues from there where the server can resume).

    ``resumes`` says whether the server can continue a partial file: true
    until it sends a file without ``Accept-Ranges: bytes``.
    """

    def __init__(self, url: str, timeout: float, deadline: float = FILE_DEADLINE):
        self.url, self.timeout, self.deadline = url, timeout, deadline
        self.label = url.rstrip("/")
        self.resumes = True

    def _open(self, relative: str, start: int = 0):
        url = urllib.parse.urljoin(self.url.rstrip("/") + "/", urllib.parse.quote(relative)) if relative else self.url
        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the source's scheme is http(s)
        request.deadline = _Deadline(ANSWER_TIMEOUTS * self.timeout)
        request.deadline.timer.start()
        try:
            response = _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            kind = NotFoundError if exc.code == 404 else ZooError
            raise kind(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (http.client.InvalidURL, ValueError) as exc:  # the source's URL was checked: a redirect's is wrong
            raise ZooError(f"{url}: redirects to a URL netspec cannot fetch: {exc}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if request.deadline.passed:
                raise self._too_slow(url, request.deadline) from None
            reason = getattr(exc, "reason", exc)
            raise TransferError(f"{url}: cannot connect: {reason}") from None
        finally:
            request.deadline.timer.cancel()
        if request.deadline.passed:  # (headers cut short by the deadline can still parse)
            response.close()
            raise self._too_slow(url, request.deadline)
        return response, url

    @staticmethod
    def _too_slow(url: str, deadline: _Deadline) -> TransferError:
        return TransferError(f"{url}: the server sent no whole answer in {deadline.seconds:g} s; refused")

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """A small file's bytes; NotFoundError on HTTP 404, ZooError if the server fails or sends over ``limit``."""
        response, url = self._open(relative)
        buffer = io.BytesIO()
        with response:
            try:
                _copy(response, buffer, None, url, lambda count: None, self.timeout, limit + 1)
            except TransferError as exc:
                raise ZooError(str(exc)) from None
        data = buffer.getvalue()
        if len(data) > limit:
            raise ZooError(f"{url}: larger than {limit:,} bytes, more than such a file ever is")
        return data

    def fetch(self, relative: str, partial: str, size: int | None, begin) -> None:
        """Write ``relative`` to ``partial``, asking only for the bytes past its current length when it has some.

        ``size`` is the size the card lists, or None when none does (the server's Content-Length then says it,
        and a file it says is larger than :data:`MAX_UNLISTED_BYTES` is refused before any byte is read).
        ``begin(total)`` is called before the first byte is copied, with the file's size (None: the server does not
        say), and returns the ``advance(count)`` of the transfer's progress, which is told first of the bytes
        ``partial`` keeps.
        """
        start = os.path.getsize(partial) if os.path.exists(partial) else 0
        response, url = self._open(relative, start)
        with response:
            resumed = response.status == 206
            self.resumes = resumed or response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"
            kept = start if resumed else 0  # else the server sends the whole file again
            expected = None if response.length is None else kept + response.length
            if size is not None and expected is not None and expected != size:
                raise ZooError(f"{url}: the server has {expected} bytes where the card lists {size}; refused")
            if size is None and expected is not None and expected > MAX_UNLISTED_BYTES:
                raise ZooError(f"{url}: the server has {expected:,} bytes, more than the {MAX_UNLISTED_BYTES:,} "
                               "netspec takes of a file no card lists; refused")
            advance = begin(expected)
            advance(kept)
            with open_for_writing(partial, "ab" if resumed else "wb") as out:
                _copy(response, out, size, url, advance, self.timeout, deadline=self.deadline)
            if response.length:
                raise TransferError(f"{url}: the connection closed after {os.path.getsize(partial)} of {expected} "
                                    "bytes")

    def folders(self) -> list[str]:
        """The folders the server's directory listing of the root links to (``name/``), in its order."""
        page = self.read("").decode("utf-8", errors="replace")
        links = _Links()
        links.feed(page)
        names = (urllib.parse.unquote(href[:-1]) for href in links.hrefs if href.endswith("/"))
        return list(dict.fromkeys(name for name in names
                                  if name and not name.startswith(".") and not set("/\\?#:\0") & set(name)))


class _Links(html.parser.HTMLParser):
    """The ``href`` of every link of an HTML page."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def _copy(source, out, size: int | None, where: str, advance, grace: float | None = None,
          keep: int | None = None, deadline: float | None = None) -> None:
    """Copy until end of data, refusing more than ``size`` bytes in all (:data:`MAX_UNLISTED_BYTES` when None); a
    read that fails or stalls, (with ``grace`` seconds) a transfer slower than MIN_RATE bytes a second once
    they have passed, or (with ``deadline``) one not done after that many seconds, is a TransferError.  With
    ``keep``, stop quietly once that many bytes are copied (the caller refuses a file that long)."""
    limit = MAX_UNLISTED_BYTES if size is None else size
    start, copied = time.monotonic(), 0
    while True:
        try:
            chunk = source.read1(CHUNK)  # (what has come: the loop sees a slow server's every byte)
        except (OSError, http.client.HTTPException) as exc:
            of = "" if size is None else f" of {size}"
            raise TransferError(f"{where}: the transfer stopped after {out.tell()}{of} bytes ({exc})") from None
        if not chunk or (keep is not None and out.tell() >= keep):
            return
        copied += len(chunk)
        elapsed = time.monotonic() - start
        if grace is not None and elapsed > grace and copied < MIN_RATE * elapsed:
            raise TransferError(f"{where}: {copied} bytes in {elapsed:.0f} s, slower than the {MIN_RATE:,} bytes a "
                                "second a transfer must keep; stopped (run the command again to continue)")
        if deadline is not None and elapsed > deadline:
            raise TransferError(f"{where}: not done after {deadline:g} s (--deadline); stopped after {copied} bytes "
                                "(run the command again to continue)")
        if out.tell() + len(chunk) > limit:
            most = (f"the {size} bytes the card lists" if size is not None else
                    f"{limit:,} bytes, the most netspec takes of a file no card lists")
            raise ZooError(f"{where}: more than {most}; refused")
        try:
            out.write(chunk)
        except OSError as exc:
            raise ZooError(f"{out.name}: cannot write: {exc.strerror}") from None
        advance(len(chunk))


def http_url_problem(url: str) -> str | None:
    """Why no server can answer the http(s) URL ``url`` (no host, a port that is no number, a space, control or
    non-ASCII character), or None."""
    if any(not " " < character < "\x7f" for character in url):
        return "a space, a control or a non-ASCII character (percent-encode it)"
    try:
        parsed = urllib.parse.urlparse(url)
        host, _ = parsed.hostname, parsed.port  # the port raises ValueError when it is no number
    except ValueError as exc:
        return str(exc)
    return None if host else "no host"


def open_source(source: str, timeout: float, deadline: float = FILE_DEADLINE):
    """A FolderSource or HttpSource (``timeout`` and ``deadline`` in seconds, see it) for a folder path or URL."""
    try:
        scheme = urllib.parse.urlparse(source).scheme
    except ValueError as exc:
        raise ZooError(f"{source}: not a URL netspec can fetch: {exc}") from None
    if scheme in ("http", "https"):
        problem = http_url_problem(source)
        if problem:
            raise ZooError(f"{source}: not a URL netspec can fetch: {problem}")
        return HttpSource(source, timeout, deadline)
    if scheme == "file":
        return FolderSource(urllib.request.url2pathname(urllib.parse.urlparse(source).path))
    if scheme and len(scheme) > 1:
        raise ZooError(f"{source}: unsupported source (use a folder, file://, http:// or https://)")
    return FolderSource(source)


def location(source, relative: str) -> str:
    """Where file ``relative`` of ``source`` is, for messages."""
    return f"{source.label}/{relative}" if relative else source.label


def fetch_file(source, relative: str, target: str, size: int | None, begin) -> None:
    """Fetch file ``relative`` of ``source`` to ``target`` through ``target.part``, continuing what a stopped
    attempt left there; ``size``: the size the card lists (None: none does).  ``begin(total)`` starts the
    transfer's progress, as the sources' ``fetch`` says."""
    partial = target + PART
    source.fetch(relative, partial, size, begin)
    if size is not None and os.path.getsize(partial) != size:
        raise ZooError(f"{location(source, relative)}: the source has {os.path.getsize(partial)} of the {size} bytes "
                       "the card lists; the download was discarded")
    os.replace(partial, target)


def check_room(needed: int, zoo_root: str, what: str) -> None:
    """Refuse the download of ``what`` when the disk of the zoo ``zoo_root`` has not ``needed`` bytes free, and
    some to spare."""
    spare = int(needed * SPARE_FRACTION) + SPARE_BYTES
    folder = zoo_root
    while not os.path.isdir(folder):  # the zoo, or the folder it will be made in
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free
    if needed + spare > free:
        raise ZooError(f"not enough disk space to download {what}: its files need {needed:,} more bytes and "
                       f"{spare:,} to spare, {folder} has {free:,} bytes free")


@contextlib.contextmanager
def resumable(partial_dir: str, source=None):
    """Run the transfers of one download into ``partial_dir``, keeping or removing its files when one fails.

    A TransferError or Ctrl-C keeps them when ``source`` can continue them
    and they hold any byte (the TransferError then says to run the command
    again); any other failure removes them.  ``source`` None: nothing is
    fetched that could resume.
    """
    try:
        yield
    except (TransferError, KeyboardInterrupt) as exc:
        resumes = source is not None and source.resumes
        kept = resumes and _holds_data(partial_dir)
        if not kept:
            remove_partial(partial_dir)
        if isinstance(exc, TransferError) and (kept or not resumes):
            then = ("run the same command again to resume" if kept else
                    "the server cannot resume a download, so its partial files were removed")
            raise ZooError(f"{exc}; {then}") from None
        raise
    except BaseException:
        remove_partial(partial_dir)
        raise


def make_partial_folder(partial_dir: str, zoo_root: str) -> None:
    """Create the folder of one download's partial files; ZooError when the zoo cannot be written."""
    try:
        os.makedirs(partial_dir, exist_ok=True)
    except OSError as exc:
        raise ZooError(f"{zoo_root}: cannot write to the zoo: {exc.strerror}") from None


def _holds_data(partial_dir: str) -> bool:
    """Whether a download's folder of partial files holds any byte."""
    try:
        with os.scandir(partial_dir) as entries:
            return any(entry.is_file() and entry.stat().st_size for entry in entries)
    except FileNotFoundError:
        return False


def remove_partial(partial_dir: str) -> None:
    """Remove the partial files of one download, and the zoo's ``.partial`` folder when nothing else is in it."""
    shutil.rmtree(partial_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(partial_dir))


@contextlib.contextmanager
def without_progress(_total: int | None):
    """A progress display that shows nothing (the default of the downloads)."""
    yield lambda _count: None
