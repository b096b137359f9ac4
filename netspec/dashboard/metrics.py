"""A run's metrics.jsonl read from where it was last read: its events for the charts, and a summary for the list.

metrics.jsonl only grows while a run trains (a resumed run rewrites it as a
new file first, see :func:`netspec.training.run_folder.truncate_metrics`), so
each file is read once and then from the end of its last complete line; a
file that was replaced (another inode) or shrank is read again from the start.
A line that is no event is skipped and reported with its number, never raised.

The runs list needs only the last values and the best test values, so its
summary JSON-decodes the test events and the last train event alone and
passes over the other lines as bytes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from netspec.data.files import one_line
from netspec.model_zoo.card import finite_number, per_class_figures
from netspec.training.run_folder import event_outputs

CACHED_FILES = 64  # events of this many metrics files are kept between requests
MAX_LINE = 1 << 20  # bytes of a line: an event is a few hundred
MAX_READ = 16 << 20  # bytes read from a file at a time
MAX_REQUEST = 64 << 20  # bytes one request reads of a file (the rest waits for the next request)
TEST_MARK = b'"TEST"'  # every test event's line holds it (write_event's "phase": "TEST")
MINIMISED = ("loss", "error")  # a test output whose name holds one of these is best when lowest


@dataclass
class Position:
    """Where a metrics file was read up to: its inode, the byte after the last complete line, the next line."""

    inode: int = 0
    offset: int = 0
    line: int = 1

    @property
    def token(self) -> str:
        """The position as a client passes it back (``inode:offset:line``)."""
        return f"{self.inode}:{self.offset}:{self.line}"

    @classmethod
    def parse(cls, token: str) -> Position:
        """A position from its token; the start of no file when the token is not one."""
        if not re.fullmatch(r"[0-9]{1,20}:[0-9]{1,20}:[0-9]{1,20}", token):  # (ASCII digits: "²" is a digit too)
            return cls()
        return cls(*map(int, token.split(":")))


@dataclass
class Chunk:
    """The events of the complete lines after a position, the damaged lines among them, and the new position."""

    events: list[dict]
    damaged: list[dict]  # {"line": number, "reason": text}
    position: Position


def parse_event(line: bytes) -> dict | str:
    """The event of one metrics.jsonl line (outputs as numbers or None, ``per_class`` as
    :func:`~netspec.model_zoo.card.per_class_figures` keeps it), or why the line is none."""
    if len(line) > MAX_LINE:
        return f"a line of over {MAX_LINE:,} bytes, longer than any event"
    try:
        event = json.loads(line)
    except ValueError as exc:  # (not UTF-8, not JSON, a number past Python's digit limit)
        return f"not a JSON line ({getattr(exc, 'msg', None) or one_line(exc)})"
    except RecursionError:
        return "not a JSON line (nested too deeply)"
    if not isinstance(event, dict) or not isinstance(event.get("iter"), int) or event.get("phase") not in (
            "TRAIN", "TEST") or not isinstance(event.get("test_net", 0), int):
        return "not a training event (needs 'iter' and 'phase')"
    clean = {"iter": event["iter"], "phase": event["phase"], "test_net": event.get("test_net", 0)}
    clean.update((key, per_class_figures(value) if key == "per_class" else finite_number(value))
                 for key, value in event.items() if key not in ("iter", "phase", "test_net"))
    return clean


def current(path: str, position: Position) -> Position | None:
    """``position`` when the file there is still the one it was read from, else None (replaced or shrunk)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    fresh = position.inode in (0, info.st_ino) and info.st_size >= position.offset
    return Position(info.st_ino, position.offset, position.line) if fresh else None


def _complete_lines(path: str, position: Position) -> tuple[list[bytes], Position]:
    """The complete lines after ``position`` (at most MAX_READ bytes of them) and the position after them.

    A line being written waits for its end; one that has run past MAX_LINE bytes without ending is no event
    ``write_event`` writes, and is passed over as one damaged line, so it is never read again: a position that
    does not follow a newline lies inside such a line, whose rest is skipped unnamed.  Anything but a regular
    file (a FIFO) holds no lines.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return [], position
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return [], position
        handle.seek(max(position.offset - 1, 0))
        data = handle.read(MAX_READ + min(position.offset, 1))
    if position.offset:
        inside, data = data[:1] != b"\n", data[1:]
        if inside:  # (the rest of a line named when it was passed over)
            rest = data.find(b"\n") + 1 or len(data)
            return [], Position(position.inode, position.offset + rest, position.line)
    end = data.rfind(b"\n") + 1
    if not end and len(data) > MAX_LINE:
        return [data], Position(position.inode, position.offset + len(data), position.line + 1)
    lines = data[:end].split(b"\n")[:-1]
    return lines, Position(position.inode, position.offset + end, position.line + len(lines))


def _chunks(path: str, position: Position):
    """``(lines, position after them)`` of the complete lines after ``position``, MAX_READ bytes at a time, until
    the file's last complete line or MAX_REQUEST bytes (the rest waits for the next request)."""
    budget = MAX_REQUEST
    while budget > 0:
        lines, after = _complete_lines(path, position)
        if after.offset == position.offset:
            return
        yield lines, after
        budget -= after.offset - position.offset
        position = after


def read_from(path: str, position: Position) -> Chunk:
    """The events after ``position`` (call :func:`current` first); a damaged line is named, not raised."""
    return _events(*_complete_lines(path, position), position.line)


def _events(lines: list[bytes], after: Position, first_line: int) -> Chunk:
    """The events of ``lines`` (the first numbered ``first_line``), read up to ``after``."""
    events, damaged = [], []
    for line_number, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        event = parse_event(line)
        if isinstance(event, str):
            damaged.append({"line": line_number, "reason": event})
        else:
            events.append(event)
    return Chunk(events, damaged, after)


@dataclass
class Summary:
    """What the runs list (and a run page's per-class tables) show of a metrics file: the last train event, the
    last test event of each test net and the one of the pass before, and the best test values."""

    position: Position = field(default_factory=Position)
    last_iter: int | None = None
    last_train: dict | None = None
    last_tests: dict[int, dict] = field(default_factory=dict)  # test net -> its last event
    previous_tests: dict[int, dict] = field(default_factory=dict)  # test net -> its event of the pass before
    best: dict[tuple[int, str], tuple[float, int]] = field(default_factory=dict)  # (net, output) -> (value, iter)

    def add(self, lines: list[bytes]) -> None:
        """Take in the lines after the summary's position (test events decoded, train lines only the last)."""
        others = []
        for line in lines:
            if TEST_MARK in line:
                self._take(parse_event(line))
            elif line.strip():
                others.append(line)
        for line in reversed(others):  # the last train event: the last of these lines that is one
            event = parse_event(line)
            if not isinstance(event, str):
                self._take(event)
                return

    def _take(self, event: dict | str) -> None:
        if isinstance(event, str):
            return
        self.last_iter = max(event["iter"], self.last_iter if self.last_iter is not None else event["iter"])
        if event["phase"] == "TRAIN":
            self.last_train = event
            return
        net = event["test_net"]
        if net in self.last_tests:
            self.previous_tests[net] = self.last_tests[net]
        self.last_tests[net] = event
        for output in event_outputs(event):
            value = event[output]
            if value is not None and better(output, value, self.best.get((net, output), (None,))[0]):
                self.best[(net, output)] = (value, event["iter"])


def better(output: str, value: float, best: float | None) -> bool:
    """Whether ``value`` beats ``best``: lower for outputs named like a loss or an error, else higher."""
    if best is None:
        return True
    return value < best if any(word in output.lower() for word in MINIMISED) else value > best


class MetricsCache:
    """Metrics files read so far (their events as JSON, and their summaries), extended by what was appended since.

    Events are kept as JSON text, ready to send and far smaller than their dicts.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._events: OrderedDict[str, tuple[Position, list[str], list[dict]]] = OrderedDict()
        self._summaries: dict[str, Summary] = {}

    def events_json(self, path: str) -> tuple[str, list[dict], Position]:
        """Every event of the file as a JSON array, its damaged lines, and the position after them."""
        with self._lock:
            position, parts, damaged = self._events.pop(path, (Position(), [], []))
            position = current(path, position)
            if position is None:
                position, parts, damaged = current(path, Position()) or Position(), [], []
            for lines, after in _chunks(path, position) if os.path.isfile(path) else ():
                chunk = _events(lines, after, position.line)
                if chunk.events:
                    parts = [*parts, ",".join(json.dumps(event, separators=(",", ":")) for event in chunk.events)]
                damaged, position = damaged + chunk.damaged, after
            self._events[path] = (position, parts, damaged)
            while len(self._events) > CACHED_FILES:
                self._events.popitem(last=False)
            return "[" + ",".join(parts) + "]", damaged, position

    def summary(self, path: str) -> Summary:
        """The file's :class:`Summary` (an empty one when there is no file)."""
        with self._lock:
            summary = self._summaries.get(path, Summary())
            position = current(path, summary.position)
            if position is None:
                summary, position = Summary(), current(path, Position())
                if position is None:
                    return summary
            summary.position = position
            for lines, summary.position in _chunks(path, position):
                summary.add(lines)
            self._summaries[path] = summary
            return summary
