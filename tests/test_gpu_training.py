"""Training on the GPU: the CPU's weights within float32 tolerance, a bit-identical resume, the update by group.

Every test here is marked ``gpu``: ``pytest -m gpu`` runs them on a machine with CuPy and a GPU
(``.ci/gpu-session``), and ``conftest.py`` skips them, saying why, elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from test_solver import MOMENTUM, QUIET, data_solver, fused, param_arrays

import netspec

pytestmark = pytest.mark.gpu

CIFAR10_QUICK = Path(__file__).parent.parent / "configs" / "cifar10" / "cifar10_quick_timing.yaml"


def host_params(solver) -> list[np.ndarray]:
    """Copies on the host of every parameter blob's data."""
    return [np.array(solver.backend.to_host(array)) for array in param_arrays(solver)]


def test_cifar10_quick_trains_on_the_gpu_to_the_cpus_weights(tmp_path):
    weights = []
    for device in ("cpu", "gpu"):
        text = yaml.safe_dump({"net": str(CIFAR10_QUICK), "base_lr": 0.001, "momentum": 0.9, "weight_decay": 0.004,
                               "max_iter": 20, "random_seed": 1, "snapshot_prefix": str(tmp_path / device / "run")})
        solver = netspec.load_solver(text, device=device, log=QUIET, reuse_memory=True)
        assert solver.optimizer.fused == (device == "gpu")
        solver.step(20)
        weights.append(host_params(solver))
    for on_cpu, on_gpu in zip(*weights):  # the same fillers and DummyData draws on both devices
        np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("rule", sorted(MOMENTUM))
def test_every_rule_resumes_bit_identically_on_the_gpu(tmp_path, rule):
    hyper = {"type": rule, "momentum": MOMENTUM[rule], "weight_decay": 0.01, "solver_mode": "GPU"}
    straight = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    straight.step(8)
    interrupted = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    interrupted.step(3)
    resumed = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    resumed.restore(interrupted.snapshot())
    resumed.step(5)
    for a, b in zip(host_params(straight), host_params(resumed)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("rule", sorted(MOMENTUM))
def test_the_gpus_update_by_group_is_the_update_blob_by_blob(tmp_path, rule):
    runs = []
    for grouped in (False, True):
        solver = fused(data_solver(tmp_path, 5, type=rule, base_lr=0.1, momentum=MOMENTUM[rule], weight_decay=0.01,
                                   clip_gradients=0.5, solver_mode="GPU"), grouped)
        solver.step(6)
        runs.append(host_params(solver))
    for by_blob, by_group in zip(*runs):
        np.testing.assert_allclose(by_group, by_blob, rtol=1e-12, atol=1e-15)
