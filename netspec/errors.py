"""Exceptions for everything a user can cause.

The CLI turns each of these into one line on stderr and exit status 1; library
callers catch them by type.  Nothing a user can cause raises ``AssertionError``
or ``KeyError``.
"""

from __future__ import annotations

import difflib
import reprlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One mistake in a config, located as precisely as we can."""

    message: str
    file: str | None = None
    line: int | None = None
    layer: str | None = None
    key: str | None = None
    via: str | None = None  # for a layer expanded from a module: where the module was used

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        elif self.line:
            where = f"line {self.line}: "
        layer = f"layer '{self.layer}': " if self.layer else ""
        key = f"{self.key}: " if self.key else ""
        via = f" (in {self.via})" if self.via else ""
        return f"{where}{layer}{key}{self.message}{via}"


class NetspecError(Exception):
    """Base class of every error a user can cause.

    ``every_rank`` is true when every rank of a distributed run raises the
    error at the same point (a diverged mean loss), so rank 0 alone reports it.
    """

    every_rank = False


class ConfigError(NetspecError):
    """A net or solver file is wrong; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ShapeError(NetspecError):
    """Blob shapes that a layer cannot accept; ``key`` optionally names the parameter at fault."""

    def __init__(self, message: str, key: str | None = None):
        self.key = key
        super().__init__(message)


class DataError(NetspecError):
    """A dataset file or record that cannot be read."""


class WeightsError(NetspecError):
    """A weights file that does not fit the net it is loaded into."""


class ParamError(NetspecError):
    """A layer parameter whose value is out of range; ``key`` names it (``pooling_param.pad``)."""

    def __init__(self, key: str | None, message: str):
        self.key = key
        super().__init__(message)


class StateError(NetspecError):
    """A solver state that cannot be resumed: unreadable, or from another net or solver."""


class TrainingError(NetspecError):
    """Training cannot go on, e.g. the loss became NaN or infinite."""


class EventsError(TrainingError):
    """The run's events cannot go where they are written (TensorBoard's event file); training stops, with a
    snapshot."""


class DivergedError(TrainingError):
    """The loss or the weights became NaN or infinite."""


class DeviceError(NetspecError):
    """The device asked for cannot be used: an unknown name, no CuPy, or no such GPU."""


class ModelImportError(NetspecError):
    """A model from another framework that cannot be imported (an ONNX file): the file, the node and why."""


class DistributedError(NetspecError):
    """A multi-process run cannot go on: MPI is missing, or another rank stopped answering."""


class _Short(reprlib.Repr):
    """reprlib's shortened repr, applied to dict and list subclasses too (YAML's mappings and lists)."""

    def repr1(self, x, level):
        if isinstance(x, dict) and type(x) is not dict:
            return self.repr_dict(x, level)
        if isinstance(x, list) and type(x) is not list:
            return self.repr_list(x, level)
        return super().repr1(x, level)


_SHORT = _Short()
_SHORT.maxstring = _SHORT.maxother = 60


def shown(value) -> str:
    """``repr(value)`` cut short (a few items, a few levels, 60 characters a string), for error messages."""
    return _SHORT.repr(value)


def shown_name(name) -> str:
    """A name read from a file as a message shows it: control characters escaped, cut short, no quotes."""
    return shown(str(name))[1:-1]


def printable(text: str, one_line: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters (escape sequences that clear the screen, write the
    clipboard or retitle the window) shown escaped, as ``\x1b``; newlines and tabs kept, unless ``one_line``."""
    kept = "" if one_line else "\n\t"
    return "".join(char if char.isprintable() or char in kept else repr(char)[1:-1] for char in str(text))


def first_line(exc: BaseException) -> str:
    """An exception's message, its first line alone (its type's name where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def did_you_mean(word: str, candidates) -> str:
    """A ``"; did you mean 'x'?"`` suffix for the closest candidate, or '' (always for words over 100 characters)."""
    if len(str(word)) > 100:
        return ""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    if not close:
        lowered = {str(c).lower(): str(c) for c in candidates}
        if str(word).lower() in lowered:
            close = [lowered[str(word).lower()]]
    return f"; did you mean '{close[0]}'?" if close else ""
