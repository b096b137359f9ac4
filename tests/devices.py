"""The devices the layer checks run on: ``@pytest.mark.parametrize("device", DEVICES)``.

The GPU runs are marked ``gpu``: ``pytest -m gpu`` runs them alone, and
``conftest.py`` skips them where CuPy or a GPU is missing.
"""

from __future__ import annotations

import pytest

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
