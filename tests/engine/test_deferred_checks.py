"""Checks a GPU backend defers (Backend.check_later): the first that failed is raised at the next read, with its
count, first value and message, however many checks came after it, of whatever size, and wherever they failed."""

from __future__ import annotations

import numpy
import pytest
from devices import DEVICES

from netspec.engine.backend import Backend
from netspec.errors import DataError


def _deferring(device: str):
    """A backend of ``device`` that defers its checks, and a function noting one check on it (the failures, the
    values, a name its message starts with)."""
    backend = Backend(device)
    backend.defer_checks = True

    def note(failing: list[bool], values: list[float], name: str) -> None:
        bad = backend.asarray(numpy.array(failing))
        backend.check_later(bad, backend.asarray(numpy.array(values, numpy.float32)),
                            lambda value, count: f"{name}: {value} ({count})")
    return backend, note


@pytest.mark.parametrize("device", DEVICES)
def test_the_first_check_that_failed_is_raised_with_its_count_and_first_value(device):
    backend, note = _deferring(device)
    note([False, False, False, False], [0, 1, 2, 3], "a")  # passes
    note([False, True, False, True], [0, 1.5, 2, 7], "a")  # the first to fail: at 1.5 and 7
    note([True, True, False, False], [-1, -2, 2, 3], "b")  # later, another site
    note([True, True, True, True], [9, 9, 9, 9], "a")  # later, where the first failed too
    with pytest.raises(DataError, match=r"^a: 1\.5 \(2\)$"):
        backend.raise_checks()
    backend.raise_checks()  # (all forgotten)
    note([False, False, False, False], [0, 1, 2, 3], "a")
    note([False, False, True, False], [0, 1, 8, 3], "b")  # the first now: the marks were cleared
    with pytest.raises(DataError, match=r"^b: 8 \(1\)$"):
        backend.raise_checks()


@pytest.mark.parametrize("device", DEVICES)
def test_checks_of_other_sizes_and_messages_keep_their_own(device):
    backend, note = _deferring(device)
    note([False, False, False], [0, 1, 2], "three")
    note([False, True], [0, -4], "two")  # the first to fail
    note([True, True, True], [5, 6, 7], "three")
    note([True, False], [-9, 1], "two, again")  # same size, another message, later
    with pytest.raises(DataError, match=r"^two: -4 \(1\)$"):
        backend.raise_checks()


@pytest.mark.parametrize("device", DEVICES)
def test_a_check_that_never_failed_raises_nothing(device):
    backend, note = _deferring(device)
    for _ in range(3):
        note([False, False], [0, 1], "a")
    backend.raise_checks()


@pytest.mark.parametrize("device", DEVICES)
def test_the_marks_of_a_size_no_check_uses_any_more_are_given_back_at_a_read(device):
    backend, note = _deferring(device)
    note([False, False, False], [0, 1, 2], "three")
    backend.raise_checks()
    note([False, False], [0, 1], "two")  # (the batch's size changed: the three values' marks hold nothing now)
    backend.raise_checks()
    assert [marks.when.size for marks in backend._marks.values()] == [2]
