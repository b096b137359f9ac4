"""``netspec zoo download``: fetch a model from the first source that has it, check every byte, install.

A source is a zoo folder, a ``file://`` URL or an ``http(s)://`` zoo (e.g.
``netspec zoo serve``).  Nothing is fetched unless the zoo's disk has room for
the files the card lists (plus 5% and 64 MiB to spare).  Files are fetched into
``<zoo>/.partial/<name>@<version>/``, each cut off at the size the card lists and
checked against its sha256, and the model is installed only when all are right.

A transfer that breaks off (a connection that fails, stalls past the timeout
or closes early, or Ctrl-C) keeps its ``.part`` file when the source can
continue it (a folder, or an HTTP server that answers Range requests), and the
next attempt fetches only the rest.  Any other failure (more bytes than the
card lists, fewer from a source that has no more, a wrong sha256, an HTTP
error, a server without Range) removes the model's partial files.  Nothing
else in the zoo changes.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

from netspec.errors import ConfigError
from netspec.model_zoo.card import CARD, PART, ModelCard, file_sha256, parse_card
from netspec.model_zoo.zoo import (
    INDEX,
    MODELS,
    Zoo,
    ZooError,
    parse_index,
    split_ref,
    version_key,
    write_readme,
)
from netspec.spec.yaml_lines import load_yaml, read_source

SMALL_FILE_LIMIT = 1 << 20  # index.json and model.yaml are never larger
CHUNK = 1 << 16
SOURCES_CONFIG = "zoo.yaml"
SPARE_FRACTION, SPARE_BYTES = 0.05, 64 << 20  # room left on the disk beyond the files of a download


class TransferError(ZooError):
    """A transfer that broke off before the end of the file (connection failed, stalled or closed early)."""


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
    """A zoo folder (or ``file://`` URL) to copy from; it can always continue a partial file."""

    resumes = True

    def __init__(self, root: str):
        self.root = root
        self.label = root

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, *relative.split("/"))

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """A small file's bytes; ZooError if missing or over ``limit``."""
        path = self._path(relative)
        if not os.path.isfile(path):
            raise ZooError(f"{path}: not found")
        if os.path.getsize(path) > limit:
            raise ZooError(f"{path}: larger than {limit} bytes, which no index or card is")
        with self._open(path) as handle:
            return handle.read()

    def fetch(self, relative: str, partial: str, size: int, advance) -> None:
        """Append to ``partial`` the bytes of ``relative`` past its current length, up to ``size``."""
        path = self._path(relative)
        if not os.path.isfile(path):
            raise ZooError(f"{path}: not found")
        with self._open(path) as source, open(partial, "ab") as out:
            source.seek(out.tell())
            _copy(source, out, size, path, advance)

    @staticmethod
    def _open(path: str):
        try:
            return open(path, "rb")
        except OSError as exc:
            raise ZooError(f"{path}: cannot read: {exc.strerror}") from None


class HttpSource:
    """An HTTP(S) zoo; every request gives up after ``timeout`` seconds without data.

    ``resumes`` says whether the server can continue a partial file: true
    until it sends a file without ``Accept-Ranges: bytes``.
    """

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url.rstrip("/") + "/", timeout
        self.label = url
        self.resumes = True

    def _open(self, relative: str, start: int = 0):
        url = urllib.parse.urljoin(self.url, urllib.parse.quote(relative))
        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the source's scheme is http(s)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout), url  # noqa: S310 - as above
        except urllib.error.HTTPError as exc:
            raise ZooError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise TransferError(f"{url}: cannot connect: {reason}") from None

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """A small file's bytes; ZooError if the server fails or sends more than ``limit``."""
        response, url = self._open(relative)
        with response:
            try:
                data = response.read(limit + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise ZooError(f"{url}: the server stopped answering ({exc})") from None
        if len(data) > limit:
            raise ZooError(f"{url}: larger than {limit} bytes, which no index or card is")
        return data

    def fetch(self, relative: str, partial: str, size: int, advance) -> None:
        """Write ``relative`` to ``partial``, asking only for the bytes past its current length when it has some."""
        start = os.path.getsize(partial) if os.path.exists(partial) else 0
        response, url = self._open(relative, start)
        with response:
            resumed = response.status == 206
            self.resumes = resumed or response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"
            if start and not resumed:
                advance(-start)  # the server sends the whole file again
                start = 0
            if response.length is not None and start + response.length != size:
                raise ZooError(f"{url}: the server has {start + response.length} bytes where the card lists {size}; "
                               "refused")
            with open(partial, "ab" if resumed else "wb") as out:
                _copy(response, out, size, url, advance)
            if response.length:
                raise TransferError(f"{url}: the connection closed after {os.path.getsize(partial)} of {size} bytes")


def _copy(source, out, size: int, where: str, advance) -> None:
    """Copy until end of data, refusing more than ``size`` bytes in all; a read that fails or stalls is a
    TransferError."""
    while True:
        try:
            chunk = source.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise TransferError(f"{where}: the transfer stopped after {out.tell()} of {size} bytes ({exc})") from None
        if not chunk:
            return
        if out.tell() + len(chunk) > size:
            raise ZooError(f"{where}: more than the {size} bytes the card lists; refused")
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


def find(ref: str, sources: list) -> tuple[object, str, str]:
    """The first source whose index has ``ref``: ``(source, name, version)``; ZooError listing why none did."""
    name, version = split_ref(ref)
    reasons = []
    for source in sources:
        try:
            index = parse_index(source.read(INDEX), f"{source.label}/{INDEX}")
        except ZooError as exc:
            reasons.append(str(exc))
            continue
        entry = index["models"].get(name)
        if entry is None or (version and version not in entry["versions"]):
            reasons.append(f"{source.label}: has no {ref}")
            continue
        return source, name, version or max(entry["versions"], key=version_key)
    if not sources:
        raise ZooError(f"no zoo sources to look for {ref} in: give one with --from FOLDER|URL, or list them under "
                       f"'sources:' in {sources_config_path()}")
    raise ZooError(f"no source has {ref}: " + "; ".join(reasons))


def download(ref: str, sources: list, zoo: Zoo, force: bool = False, progress_factory=None) -> ModelCard:
    """Fetch ``name[@version]`` from the first source that has it, verify every file, install into ``zoo``."""
    source, name, version = find(ref, sources)
    if os.path.exists(zoo.folder(name, version)) and not force:
        raise ZooError(f"{name}@{version} is already in the zoo {zoo.root}; pass --force to replace it")
    base = f"{MODELS}/{name}/{version}"
    card_text = source.read(f"{base}/{CARD}")
    card = parse_card(card_text.decode("utf-8", errors="replace"), f"{source.label}/{base}/{CARD}")
    if (card.name, card.version) != (name, version):
        raise ZooError(f"{source.label}/{base}/{CARD}: the card is of {card.ref}, not {name}@{version}")
    partial_dir = os.path.join(zoo.root, ".partial", f"{name}@{version}")
    _check_room(card, partial_dir, zoo.root)
    try:
        os.makedirs(partial_dir, exist_ok=True)
    except OSError as exc:
        raise ZooError(f"{zoo.root}: cannot write to the zoo: {exc.strerror}") from None
    total = sum(entry.size for entry in card.files)
    try:
        with (progress_factory or _without_progress)(total) as advance:
            for entry in card.files:
                _fetch_file(source, f"{base}/{entry.path}", os.path.join(partial_dir, entry.path), entry, advance)
    except (TransferError, KeyboardInterrupt) as exc:
        if not source.resumes:
            _remove_partial(partial_dir)
        if isinstance(exc, TransferError):
            then = ("run the same command again to resume" if source.resumes else
                    "the server cannot resume a download, so its partial files were removed")
            raise ZooError(f"{exc}; {then}") from None
        raise
    except BaseException:
        _remove_partial(partial_dir)
        raise
    staged = zoo.staging_folder(name)
    try:
        for entry in card.files:
            os.replace(os.path.join(partial_dir, entry.path), os.path.join(staged, entry.path))
        with open(os.path.join(staged, CARD), "wb") as handle:
            handle.write(card_text)
        write_readme(staged, card)
        zoo.install(staged, force=force)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _remove_partial(partial_dir)
    return card


@contextlib.contextmanager
def _without_progress(_total: int):
    """A progress display that shows nothing (the default of :func:`download`)."""
    yield lambda _count: None


def _check_room(card: ModelCard, partial_dir: str, root: str) -> None:
    """Refuse a download that the disk of the zoo ``root`` has no room for: what is still to fetch, and some spare."""
    missing = 0
    for entry in card.files:
        target = os.path.join(partial_dir, entry.path)
        if not os.path.exists(target):
            part = target + PART
            missing += entry.size - (min(os.path.getsize(part), entry.size) if os.path.exists(part) else 0)
    spare = int(missing * SPARE_FRACTION) + SPARE_BYTES
    folder = root
    while not os.path.isdir(folder):  # the zoo, or the folder it will be made in
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free
    if missing + spare > free:
        raise ZooError(f"not enough disk space to download {card.ref}: its files need {missing:,} more bytes and "
                       f"{spare:,} to spare, {folder} has {free:,} bytes free")


def _fetch_file(source, relative: str, target: str, entry, advance) -> None:
    """Fetch one file of the card to ``target`` (through ``target.part``), checking its size and sha256."""
    if os.path.exists(target) and _intact(target, entry):
        advance(entry.size)
        return
    partial = target + PART
    if os.path.exists(partial):
        advance(os.path.getsize(partial))
    source.fetch(relative, partial, entry.size, advance)
    where = f"{source.label}/{relative}"
    if os.path.getsize(partial) != entry.size:
        raise ZooError(f"{where}: the source has {os.path.getsize(partial)} of the {entry.size} bytes the card lists; "
                       "the download was discarded")
    if not _intact(partial, entry):
        raise ZooError(f"{where}: the sha256 does not match the card; the download was discarded")
    os.replace(partial, target)


def _remove_partial(partial_dir: str) -> None:
    """Remove the partial files of one download, and the zoo's ``.partial`` folder when nothing else is in it."""
    shutil.rmtree(partial_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(partial_dir))


def _intact(path: str, entry) -> bool:
    """True when the file at ``path`` has the size and sha256 of card entry ``entry``."""
    return os.path.getsize(path) == entry.size and file_sha256(path) == entry.sha256


def read_index(zoo_dir: str | None, source: str | None) -> tuple[dict, str]:
    """The index of the local zoo (``zoo_dir``, or the default one), or of a source folder or URL, and where it is."""
    if source is None:
        local = Zoo(zoo_dir)
        return local.index(), local.root
    return parse_index(open_source(source, timeout=30).read(INDEX), f"{source}/{INDEX}"), source
