"""``netspec zoo download``: fetch a model from the first source that has it, check every byte, install.

A source is a zoo folder, a ``file://`` URL or an ``http(s)://`` zoo (e.g.
``netspec zoo serve``).  Files are fetched into ``<zoo>/.partial/<name>@<version>/``
(resuming from what an earlier attempt left, with HTTP Range requests), each
checked against the size and sha256 of the card, and the model is installed
only when all are right.  A download that breaks off keeps its partial file
for the next attempt; nothing else in the zoo changes.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

import yaml

from netspec.errors import ConfigError
from netspec.model_zoo.card import CARD, ModelCard, file_sha256, parse_card
from netspec.model_zoo.zoo import (
    INDEX,
    MODELS,
    Zoo,
    ZooError,
    check_index,
    split_ref,
    version_key,
    write_readme,
)

SMALL_FILE_LIMIT = 1 << 20  # index.json and model.yaml are never larger
CHUNK = 1 << 16
SOURCES_CONFIG = "zoo.yaml"


def sources_config_path() -> str:
    """``$NETSPEC_CONFIG_DIR/zoo.yaml`` (default ``~/.config/netspec/zoo.yaml``), where sources are configured."""
    folder = os.environ.get("NETSPEC_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "netspec")
    return os.path.join(folder, SOURCES_CONFIG)


def configured_sources() -> list[str]:
    """The ``sources: [...]`` of :func:`sources_config_path` ([] when the file does not exist)."""
    path = sources_config_path()
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as handle:
        try:
            config = yaml.safe_load(handle) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    sources = config.get("sources", []) if isinstance(config, dict) else None
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ConfigError(f"{path}: 'sources' must be a list of folders or URLs")
    return sources


class FolderSource:
    """A zoo folder (or ``file://`` URL) to copy from."""

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
        with open(path, "rb") as handle:
            return handle.read()

    def fetch(self, relative: str, partial: str, size: int, advance) -> None:
        """Append to ``partial`` the bytes of ``relative`` past its current length, up to ``size``."""
        path = self._path(relative)
        if not os.path.isfile(path):
            raise ZooError(f"{path}: not found")
        with open(path, "rb") as source, open(partial, "ab") as out:
            source.seek(out.tell())
            _copy(source, out, size, path, advance)


class HttpSource:
    """An HTTP(S) zoo; every request gives up after ``timeout`` seconds without data."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url.rstrip("/") + "/", timeout
        self.label = url

    def _open(self, relative: str, start: int = 0):
        url = urllib.parse.urljoin(self.url, urllib.parse.quote(relative))
        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the source's scheme is http(s)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout), url  # noqa: S310 - as above
        except urllib.error.HTTPError as exc:
            raise ZooError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ZooError(f"{url}: cannot connect: {reason}") from None

    def read(self, relative: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        response, url = self._open(relative)
        with response:
            try:
                data = response.read(limit + 1)
            except OSError as exc:
                raise ZooError(f"{url}: the server stopped answering ({exc})") from None
        if len(data) > limit:
            raise ZooError(f"{url}: larger than {limit} bytes, which no index or card is")
        return data

    def fetch(self, relative: str, partial: str, size: int, advance) -> None:
        start = os.path.getsize(partial) if os.path.exists(partial) else 0
        response, url = self._open(relative, start)
        with response:
            resumed = response.status == 206
            with open(partial, "ab" if resumed else "wb") as out:
                if start and not resumed:
                    advance(-start)  # the server sent the whole file again
                _copy(response, out, size, url, advance)


def _copy(source, out, size: int, where: str, advance) -> None:
    """Copy until end of data, refusing more than ``size`` bytes in all; a stalled read is a ZooError."""
    while True:
        try:
            chunk = source.read(CHUNK)
        except OSError as exc:
            raise ZooError(f"{where}: the transfer stopped after {out.tell()} of {size} bytes ({exc}); run the same "
                           "command again to resume") from None
        if not chunk:
            return
        if out.tell() + len(chunk) > size:
            raise ZooError(f"{where}: more than the {size} bytes the card lists; refused")
        out.write(chunk)
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
            index = check_index(json.loads(source.read(INDEX)), f"{source.label}/{INDEX}")
        except (ZooError, ValueError) as exc:
            reasons.append(f"{source.label}: {exc}" if isinstance(exc, ValueError) else str(exc))
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
    os.makedirs(partial_dir, exist_ok=True)
    total = sum(entry.size for entry in card.files)
    with progress_factory(total) as advance:
        for entry in card.files:
            target = os.path.join(partial_dir, entry.path)
            if os.path.exists(target) and _intact(target, entry):
                advance(entry.size)
                continue
            partial = target + ".part"
            if os.path.exists(partial):
                advance(os.path.getsize(partial))
            source.fetch(f"{base}/{entry.path}", partial, entry.size, advance)
            if os.path.getsize(partial) != entry.size:
                raise ZooError(f"{source.label}/{base}/{entry.path}: got {os.path.getsize(partial)} of "
                               f"{entry.size} bytes; run the same command again to resume")
            if not _intact(partial, entry):
                os.remove(partial)
                raise ZooError(f"{source.label}/{base}/{entry.path}: the sha256 does not match the card; the download "
                               "was discarded")
            os.replace(partial, target)
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
    shutil.rmtree(partial_dir)
    return card


def _intact(path: str, entry) -> bool:
    """True when the file at ``path`` has the size and sha256 of card entry ``entry``."""
    return os.path.getsize(path) == entry.size and file_sha256(path) == entry.sha256


def read_index(zoo_dir: str | None, source: str | None) -> tuple[dict, str]:
    """The index of the local zoo (``zoo_dir``, or the default one), or of a source folder or URL, and where it is."""
    if source is None:
        local = Zoo(zoo_dir)
        return local.index(), local.root
    opened = open_source(source, timeout=30)
    try:
        return check_index(json.loads(opened.read(INDEX)), f"{source}/{INDEX}"), source
    except ValueError as exc:
        raise ZooError(f"{source}/{INDEX}: not JSON ({exc})") from None
