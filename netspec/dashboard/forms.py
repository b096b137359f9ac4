"""Fields of the dashboard's forms, read as people write them: numbers (``1e-3``, ``.5``, ``1_000``), check boxes
and choices; a field that is not understood is a NetspecError naming it."""

from __future__ import annotations

import urllib.parse

from netspec.errors import NetspecError
from netspec.spec.numbers import as_int, parse_number


def parse_form(body: bytes) -> dict[str, str]:
    """A submitted form (``application/x-www-form-urlencoded``) as field -> value (the last, when repeated)."""
    return {key: values[-1] for key, values in urllib.parse.parse_qs(body.decode(errors="replace")).items()}


def number(form: dict[str, str], field: str) -> int | float | None:
    """A field's number, None when left empty."""
    text = form.get(field, "").strip()
    if not text:
        return None
    try:
        return parse_number(text)
    except ValueError:
        raise NetspecError(f"{field}: {text!r} is not a number") from None


def whole_number(form: dict[str, str], field: str, least: int = 1) -> int | None:
    """A field's whole number of at least ``least`` (``1e4`` counts), None when left empty."""
    value = number(form, field)
    if value is not None and (as_int(value) is None or value < least):
        kind = "a positive whole number" if least == 1 else f"a whole number of at least {least}"
        raise NetspecError(f"{field}: must be {kind}, got {form[field].strip()!r}")
    return None if value is None else as_int(value)


def positive_number(form: dict[str, str], field: str) -> float | None:
    """A field's finite number above 0, None when left empty."""
    value = number(form, field)
    if value is not None and not 0 < value < float("inf"):
        raise NetspecError(f"{field}: must be a finite number above 0, got {form[field].strip()!r}")
    return None if value is None else float(value)


def fraction(form: dict[str, str], field: str) -> float:
    """A field's number in [0, 1), 0 when left empty."""
    value = number(form, field)
    if value is not None and not 0 <= value < 1:
        raise NetspecError(f"{field}: must be at least 0 and below 1, got {form[field].strip()!r}")
    return float(value or 0)


def checked(form: dict[str, str], field: str) -> bool:
    """Whether a check box was ticked (browsers send only ticked ones)."""
    return form.get(field, "") not in ("", "0", "off", "false")


def choice(form: dict[str, str], field: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
    """A field that must be one of ``choices``; ``default`` when left empty."""
    value = form.get(field, "").strip() or default
    if value is not None and value not in choices:
        raise NetspecError(f"{field}: {value!r} is not one of {', '.join(choices)}")
    return value
