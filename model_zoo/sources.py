"""Where models come from: folders and ``file://`` URLs, ``http(s)://`` servers, and transfers that resume.

A source reads small files whole (an index, a card, a readme) and fetches
large ones into a ``.part`` file, each cut off at the size it should have.
Both kinds name their files by paths relative to their root, and ``""`` names
the root itself, so a source opened on one file's URL fetches that file.  HTTP
redirects are followed to http and https URLs only.

A transfer that breaks off (a connection that fails, stalls past the timeout
or closes early, or Ctrl-C) is a :class:`TransferError`; :func:`resumable`
keeps the partial files then when the source can continue them (a folder, or
an HTTP server that answers Range requests), and removes them after any other
failure.
"""

from __future__ import annotations

import contextlib
import html.parser
import http.client
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

from netspec.errors import ConfigError
from netspec.model_zoo.zoo import ZooError
from netspec.spec.yaml_lines import load_yaml, read_source

SMALL_FILE_LIMIT = 1 << 20  # index.json, model.yaml and a directory listing are never larger
MAX_UNLISTED_BYTES = (1 << 31) - 1  # a file whose size no card lists: protobuf's own limit, so any caffemodel
CHUNK = 1 << 16
SOURCES_CONFIG = "zoo.yaml"


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

    def fetch(self, relative: str, partial: str, size: int | None, advance) -> None:
        """Append to ``partial`` the bytes of ``relative`` past its current length, up to ``size`` (None: a size no
        card lists)."""
        path = self._path(relative)
        if not os.path.isfile(path):
            raise NotFoundError(f"{path}: not found")
        with self._open(path) as source, open(partial, "ab") as out:
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
        try:
            return open(path, "rb")
        except OSError as exc:
            raise ZooError(f"{path}: cannot read: {exc.strerror}") from None


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects to http and https URLs only (urllib would follow one to ftp too)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urllib.parse.urlparse(newurl).scheme
        if scheme not in ("http", "https"):
            raise urllib.error.HTTPError(newurl, code, f"a redirect to {scheme}: refused", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpRedirects)


class HttpSource:
    """An HTTP(S) server; every request gives up after ``timeout`` seconds without data.

    ``resumes`` says whether the server can continue a partial file: true
    until it sends a file without ``Accept-Ranges: bytes``.
    """

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        self.label = url.rstrip("/")
        self.resumes = True

    def _open(self, relative: str, start: int = 0):
        url = urllib.parse.urljoin(self.url.rstrip("/") + "/", urllib.parse.quote(relative)) if relative else self.url
        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the source's scheme is http(s)
        try:
            return _OPENER.open(request, timeout=self.timeout), url
        except urllib.error.HTTPError as exc:
            kind = NotFoundError if exc.code == 404 else ZooError
            raise kind(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise TransferError(f"{url}: cannot connect: {reason}") from None

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """A small file's bytes; NotFoundError on HTTP 404, ZooError if the server fails or sends over ``limit``."""
        response, url = self._open(relative)
        with response:
            try:
                data = response.read(limit + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise ZooError(f"{url}: the server stopped answering ({exc})") from None
        if len(data) > limit:
            raise ZooError(f"{url}: larger than {limit:,} bytes, more than such a file ever is")
        return data

    def fetch(self, relative: str, partial: str, size: int | None, advance) -> None:
        """Write ``relative`` to ``partial``, asking only for the bytes past its current length when it has some.

        ``size`` is the size the card lists, or None when none does (the server's Content-Length then says it).
        """
        start = os.path.getsize(partial) if os.path.exists(partial) else 0
        response, url = self._open(relative, start)
        with response:
            resumed = response.status == 206
            self.resumes = resumed or response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"
            if start and not resumed:
                advance(-start)  # the server sends the whole file again
                start = 0
            expected = None if response.length is None else start + response.length
            if size is not None and expected is not None and expected != size:
                raise ZooError(f"{url}: the server has {expected} bytes where the card lists {size}; refused")
            with open(partial, "ab" if resumed else "wb") as out:
                _copy(response, out, size, url, advance)
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


def _copy(source, out, size: int | None, where: str, advance) -> None:
    """Copy until end of data, refusing more than ``size`` bytes in all (:data:`MAX_UNLISTED_BYTES` when None); a
    read that fails or stalls is a TransferError."""
    limit = MAX_UNLISTED_BYTES if size is None else size
    while True:
        try:
            chunk = source.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            of = "" if size is None else f" of {size}"
            raise TransferError(f"{where}: the transfer stopped after {out.tell()}{of} bytes ({exc})") from None
        if not chunk:
            return
        if out.tell() + len(chunk) > limit:
            most = (f"the {size} bytes the card lists" if size is not None else
                    f"{limit:,} bytes, the most netspec takes of a file no card lists")
            raise ZooError(f"{where}: more than {most}; refused")
        try:
            out.write(chunk)
        except OSError as exc:
            raise ZooError(f"{out.name}: cannot write: {exc.strerror}") from None
        advance(len(chunk))


def open_source(source: str, timeout: float):
    """A FolderSource or HttpSource for a folder path or URL."""
    scheme = urllib.parse.urlparse(source).scheme
    if scheme in ("http", "https"):
        return HttpSource(source, timeout)
    if scheme == "file":
        return FolderSource(urllib.request.url2pathname(urllib.parse.urlparse(source).path))
    if scheme and len(scheme) > 1:
        raise ZooError(f"{source}: unsupported source (use a folder, file://, http:// or https://)")
    return FolderSource(source)


@contextlib.contextmanager
def resumable(partial_dir: str, source=None):
    """Run the transfers of one download into ``partial_dir``, keeping or removing its files when one fails.

    A TransferError or Ctrl-C keeps them when ``source`` can continue them
    (the TransferError then says to run the command again); any other
    failure removes them.  ``source`` None: nothing is fetched that could resume.
    """
    try:
        yield
    except (TransferError, KeyboardInterrupt) as exc:
        resumes = source is not None and source.resumes
        if not resumes:
            remove_partial(partial_dir)
        if isinstance(exc, TransferError):
            then = ("run the same command again to resume" if resumes else
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


def remove_partial(partial_dir: str) -> None:
    """Remove the partial files of one download, and the zoo's ``.partial`` folder when nothing else is in it."""
    shutil.rmtree(partial_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(partial_dir))


@contextlib.contextmanager
def without_progress(_total: int | None):
    """A progress display that shows nothing (the default of the downloads)."""
    yield lambda _count: None
