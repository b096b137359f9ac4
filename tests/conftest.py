"""Tests marked ``gpu`` run on CuPy with a GPU, or on the GPU stand-in (``NETSPEC_GPU_STANDIN=1``); elsewhere they
are skipped, with the reason.  Every netspec a test starts runs on every core (``OMP_NUM_THREADS``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from netspec import threads
from netspec.engine import gpu_standin

# The tests sit in one folder per package they test (tests/layers/, tests/training/...), and a test module imports
# helpers from another by its name (from test_cli import run; names are unique): every folder on the import path.
sys.path[:0] = [str(folder) for folder in sorted(Path(__file__).parent.iterdir())
                if folder.is_dir() and any(folder.glob("test_*.py"))]


def pytest_configure(config):
    """Results depend on the math pools' thread count, which netspec otherwise takes from the cores other
    processes leave idle: every netspec the tests start runs on every core, whatever else the machine runs."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads.all_cores()))


def gpu_missing() -> str | None:
    """Why the tests marked ``gpu`` cannot run here (None when CuPy sees a GPU or the stand-in is on)."""
    if gpu_standin.requested():
        return None
    try:
        import cupy
    except ImportError as error:
        return f"needs CuPy and a GPU (or NETSPEC_GPU_STANDIN=1): CuPy cannot be imported ({str(error).splitlines()[0]})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        return f"needs CuPy and a GPU: CUDA answers {error}"
    return None if count > 0 else "needs CuPy and a GPU: CuPy sees no GPU"


@pytest.hookimpl(trylast=True)  # after -m has deselected: no CuPy import when no gpu test is left to run
def pytest_collection_modifyitems(config, items):
    """Mark every collected test marked ``gpu`` to be skipped when :func:`gpu_missing` gives a reason."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = gpu_missing() if gpu_items else None
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
