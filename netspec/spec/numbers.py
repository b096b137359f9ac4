"""Numbers as people write them: ``1e-3``, ``5E-4``, ``.5``, ``-.5``, ``1_000``, ``+2``.

PyYAML reads YAML 1.1, where a float needs a dot and a signed exponent, so
``5e-4`` or ``1e3`` would come back as strings.  :data:`FLOAT_YAML_1_1_MISSES`
matches the forms it misses (the config loader resolves them as floats), and
:func:`parse_number` reads the same forms from the command line.  An integer
field takes a float with no fractional part (``max_iter: 1e4``).
"""

from __future__ import annotations

import math
import re

FLOAT_YAML_1_1_MISSES = re.compile(r"""^[-+]?(?:
    [0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+     # an exponent: 1e3, 5E-4, 1.5e3
    | \.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?          # a leading dot with a sign: -.5, +.5e2
)$""", re.VERBOSE)
FIRST_CHARACTERS = "-+0123456789."


def parse_number(text: str) -> int | float:
    """An int or float from text; ValueError when it is not a number."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def as_int(value) -> int | None:
    """``value`` as an int when it is an integer or a float without fractional part, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None
