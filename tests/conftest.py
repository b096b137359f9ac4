"""Tests marked ``gpu`` run on CuPy with a GPU, or on the GPU stand-in (``NETSPEC_GPU_STANDIN=1``); elsewhere they
are skipped, with the reason.  Every netspec a test starts runs on every core (``OMP_NUM_THREADS``)."""

from __future__ import annotations

import os

import pytest

from netspec import threads
from netspec.engine import gpu_standin


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
