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


def test_training_reads_the_gpu_only_where_the_display_interval_says(tmp_path):
    """Every device-to-host copy CUDA makes (counted by CUPTI through PyTorch's profiler, which the GPU image
    has) is one of the solver's reads through ``Backend.to_host``, and those happen at display time only."""
    torch_profiler = pytest.importorskip("torch.profiler", reason="counting CUDA copies needs PyTorch's profiler")
    text = yaml.safe_dump({"net": str(CIFAR10_QUICK), "base_lr": 0.001, "momentum": 0.9, "max_iter": 40,
                           "display": 10, "random_seed": 1, "snapshot_prefix": str(tmp_path / "run")})
    solver = netspec.load_solver(text, device="gpu", log=QUIET, reuse_memory=True)
    solver.step(2)  # (warm-up: kernels compiled, buffers made)
    reads = []
    to_host = solver.backend.to_host
    solver.backend.to_host = lambda array: reads.append(1) or to_host(array)
    with torch_profiler.profile(activities=[torch_profiler.ProfilerActivity.CUDA]) as profile:
        solver.step(20)  # iterations 2..21: displays at 10 and 20, and the read of the rest at the end
        solver.backend.synchronize()
    assert any(event.device_type.name == "CUDA" for event in profile.key_averages()), (
        "PyTorch's profiler saw none of CuPy's CUDA activity, so it cannot count the copies: count them another way")
    copies = sum(event.count for event in profile.key_averages() if "DtoH" in event.key)
    assert copies == len(reads), f"{copies} device-to-host copies, {len(reads)} of them reads of the solver"
    assert len(reads) <= 3 * 3  # per read: the deferred checks, the losses not read yet, the outputs
