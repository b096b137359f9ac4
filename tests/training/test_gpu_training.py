"""Training on the GPU: what training changes equals the CPU's, resume is bit-identical, the update by group is the
update blob by blob, and the host reads the GPU only where the display interval says.

Every test here is marked ``gpu``: ``pytest -m gpu`` runs them on a machine with CuPy and a GPU
(``.ci/gpu-session``) or on the GPU stand-in (``NETSPEC_GPU_STANDIN=1``, as CI does); ``conftest.py`` skips
them, saying why, elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from test_solver import MOMENTUM, QUIET, data_solver, fused, param_arrays

import netspec
import netspec.errors
from netspec.engine import cublas, cudnn_conv, gpu_standin
from netspec.layers.inner_product import InnerProduct
from netspec.training import checkpoint

pytestmark = pytest.mark.gpu

CIFAR10_QUICK = Path(__file__).parent.parent.parent / "configs" / "cifar10" / "cifar10_quick_timing.yaml"
MIXED = Path(__file__).parent.parent / "gpu_nets" / "mixed.yaml"  # BatchNorm, Dropout, Eltwise, GELU, Embed...
NETS = {"cifar10_quick": CIFAR10_QUICK, "mixed": MIXED}
# Iterations compared: CIFAR-10 quick's first weights start at std 1e-4 and its overlapping 3x3 MAX windows then
# choose between nearly equal values, so after a few steps a rounding difference flips a choice and the runs part
# (at base_lr 0.01, a weight gradient 1e-3 apart after 2 iterations between NumPy and oneDNN on one CPU); the mixed
# net stays within 2e-6 over 20.
ITERATIONS = {"cifar10_quick": 2, "mixed": 20}
CHANGE_RTOL = 1e-4  # ||change on GPU - on CPU|| / ||change on CPU||, each blob (float32 rounding: about 1e-6)


def host_params(solver) -> list[np.ndarray]:
    """Copies on the host of every parameter blob's data."""
    return [np.array(solver.backend.to_host(array)) for array in param_arrays(solver)]


def float32_solver(net: Path, device: str, tmp_path, **hyper):
    """A float32 solver of ``net`` (momentum, weight decay, a seed; deterministic cuDNN engines, so that runs repeat
    bit for bit) on ``device``, as ``netspec train`` builds it."""
    text = yaml.safe_dump({"net": str(net), "base_lr": 0.001, "momentum": 0.9, "weight_decay": 0.004,
                           "max_iter": 100, "random_seed": 1, "snapshot_prefix": str(tmp_path / device / "run"),
                           "deterministic": True, **hyper})
    return netspec.load_solver(text, device=device, log=QUIET, reuse_memory=True)


def training_changes(net: str, device: str, tmp_path, **hyper) -> dict[str, np.ndarray]:
    """What ITERATIONS of training change in each learnable blob of NETS[net] (after minus before), in float64."""
    solver = float32_solver(NETS[net], device, tmp_path, **hyper)
    names = [f"{layer}[{index}]" for layer, blobs in solver.net.params.items() for index in range(len(blobs))]
    before = host_params(solver)
    solver.step(ITERATIONS[net])
    return {name: after.astype(np.float64) - start for name, start, after in zip(names, before, host_params(solver))}


def assert_same_changes(on_gpu: dict[str, np.ndarray], on_cpu: dict[str, np.ndarray]) -> None:
    """Each blob's change on the GPU lies within CHANGE_RTOL of its change on the CPU (Euclidean norms)."""
    for name, expected in on_cpu.items():
        error, size = np.linalg.norm(on_gpu[name] - expected), np.linalg.norm(expected)
        assert size > 0, f"{name}: training did not change it on the CPU"
        assert error <= CHANGE_RTOL * size, (
            f"{name}: training changed it on the GPU by {error / size:.2e} of its change on the CPU ({size:.3g})")


@pytest.mark.parametrize("net", sorted(NETS))
def test_training_changes_the_weights_as_on_the_cpu(tmp_path, net):
    on_cpu = training_changes(net, "cpu", tmp_path)
    on_gpu = training_changes(net, "gpu", tmp_path)
    assert set(on_gpu) == set(on_cpu)
    assert_same_changes(on_gpu, on_cpu)


def test_a_wrong_weight_gradient_on_the_gpu_fails_the_comparison(tmp_path, monkeypatch):
    """The comparison above catches a weight gradient 1% off in one layer type (InnerProduct's), in that layer or
    in the layers its error reaches first."""
    on_cpu = training_changes("mixed", "cpu", tmp_path)
    backward = InnerProduct.backward

    def one_percent_off(self, top, propagate_down, bottom):
        backward(self, top, propagate_down, bottom)
        self.blobs[0].diff *= 1.01

    monkeypatch.setattr(InnerProduct, "backward", one_percent_off)
    on_gpu = training_changes("mixed", "gpu", tmp_path)
    with pytest.raises(AssertionError, match=r"training changed it on the GPU by"):
        assert_same_changes(on_gpu, on_cpu)


def test_a_net_with_convolution_pooling_dropout_and_embed_resumes_bit_identically_on_the_gpu(tmp_path):
    straight = float32_solver(MIXED, "gpu", tmp_path / "straight")
    straight.step(8)
    interrupted = float32_solver(MIXED, "gpu", tmp_path / "interrupted")
    interrupted.step(3)
    resumed = float32_solver(MIXED, "gpu", tmp_path / "resumed")
    resumed.restore(interrupted.snapshot())
    resumed.step(5)
    for a, b in zip(host_params(straight), host_params(resumed)):
        assert np.array_equal(a, b)


def straight_and_resumed(tmp_path, iterations: int, stop: int, **hyper):
    """Two runs of :func:`data_solver` (shuffled, with Dropout) for ``iterations``: one straight, one stopped at
    ``stop``, snapshotted and resumed in a new solver."""
    straight = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    straight.step(iterations)
    interrupted = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    interrupted.step(stop)
    resumed = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **hyper)
    resumed.restore(interrupted.snapshot())
    resumed.step(iterations - stop)
    return straight, resumed


@pytest.mark.parametrize("rule", sorted(MOMENTUM))
def test_every_rule_resumes_bit_identically_on_the_gpu(tmp_path, rule):
    hyper = {"type": rule, "momentum": MOMENTUM[rule], "weight_decay": 0.01, "solver_mode": "GPU"}
    straight, resumed = straight_and_resumed(tmp_path, 8, 3, **hyper)
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


def device_reads(solver, action) -> tuple[int, int]:
    """``(reads of the GPU, the solver's reads through Backend.to_host)`` while ``action()`` runs.

    On the stand-in every read of device values is counted (:mod:`netspec.engine.gpu_standin`); on a GPU every
    device-to-host copy CUDA makes, counted by CUPTI through PyTorch's profiler, which the GPU image has."""
    reads = []
    to_host = solver.backend.to_host
    solver.backend.to_host = lambda array: reads.append(1) or to_host(array)
    try:
        if gpu_standin.requested():
            gpu_standin.reset_counts()
            action()
            return sum(gpu_standin.reads.values()), len(reads)
        torch_profiler = pytest.importorskip("torch.profiler", reason="counting CUDA copies needs PyTorch's profiler")
        with torch_profiler.profile(activities=[torch_profiler.ProfilerActivity.CUDA]) as profile:
            action()
            solver.backend.synchronize()
    finally:
        solver.backend.to_host = to_host
    assert any(event.device_type.name == "CUDA" for event in profile.key_averages()), (
        "PyTorch's profiler saw none of CuPy's CUDA activity, so it cannot count the copies: count them another way")
    return sum(event.count for event in profile.key_averages() if "DtoH" in event.key), len(reads)


@pytest.mark.parametrize("net", sorted(NETS))
def test_training_reads_the_gpu_only_where_the_display_interval_says(tmp_path, net):
    """Every read of the GPU is one of the solver's through ``Backend.to_host``, and those happen at display
    time only (GELU, Eltwise MAX, per-class Accuracy, adaptive MAX pooling and Embed included)."""
    solver = float32_solver(NETS[net], "gpu", tmp_path, max_iter=40, display=10)
    solver.step(2)  # (warm-up: kernels compiled, buffers made)
    copies, reads = device_reads(solver, lambda: solver.step(20))  # iterations 2..21: displays at 10 and 20, and the
    assert copies == reads, f"{copies} reads of the GPU, {reads} of them the solver's"  # rest read at the end
    assert reads <= 3 * 3  # per read: the deferred checks, the losses not read yet, the outputs


def test_a_snapshot_checks_every_weight_for_nan_in_one_read(tmp_path):
    solver = float32_solver(MIXED, "gpu", tmp_path)
    solver.step(1)
    assert device_reads(solver, solver.net.first_non_finite_param) == (1, 1)
    solver.net.params["fc"][1].data[2] = float("nan")
    assert solver.net.first_non_finite_param() == ("fc", 1)


@pytest.mark.parametrize("older", [False, True])
def test_resume_refuses_a_changed_precision_or_determinism_unless_forced(tmp_path, monkeypatch, older):
    """On a GPU they change what is computed.  A state written before the two settings existed ran with their
    defaults (fp32, not deterministic), which resuming compares with."""
    args = {"tmp_path": tmp_path, "batch": 5, "solver_mode": "GPU"}
    solver = data_solver(**args)
    solver.step(2)
    if older:
        recorded = checkpoint._params_of
        monkeypatch.setattr(checkpoint, "_params_of", lambda solver: {
            key: value for key, value in recorded(solver).items() if key not in ("precision", "deterministic")})
    state = solver.snapshot()
    monkeypatch.undo()
    shown = 'deterministic False -> True, precision "fp32" -> "tf32"'
    with pytest.raises(netspec.errors.StateError, match=f"the solver changed since this state was written "
                                                        f"\\({shown}\\), which alters training"):
        data_solver(**args, precision="tf32", deterministic=True).restore(state)
    forced = data_solver(**args, precision="tf32", deterministic=True)
    forced.restore(state, force=True)
    assert forced.iter == 2


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16-mixed", "fp16-mixed"])
def test_the_solvers_precision_reaches_every_product(tmp_path, monkeypatch, precision):
    """The solver's precision reaches the cuBLAS handles of the products (TF32's tensor cores for tf32 alone)
    and, on a GPU, cuDNN's graphs (and the test nets' backend)."""
    handles, graphs = [], []
    if gpu_standin.requested():
        monkeypatch.setattr(gpu_standin.cuda.cublas, "current_handle", lambda tf32=False: handles.append(tf32) or 0)
    else:  # (netspec's cuBLAS binding, and cuDNN's graphs where cuDNN runs)
        current_handle = cublas.CuBlas.current_handle
        monkeypatch.setattr(cublas.CuBlas, "current_handle",
                            lambda self, tf32=False: handles.append(tf32) or current_handle(self, tf32))
        graphs_for = cudnn_conv.graphs_for
        monkeypatch.setattr(cudnn_conv, "graphs_for",
                            lambda *args, **kwargs: graphs.append(args[10]) or graphs_for(*args, **kwargs))
    solver = float32_solver(MIXED, "gpu", tmp_path, precision=precision)
    assert solver.backend.precision == solver.test_backend.precision == precision
    solver.step(2)
    assert handles and set(handles) == {precision == "tf32"}
    if cudnn_conv.runs_on(solver.backend.xp):
        assert graphs and set(graphs) == {precision}
    assert all(np.isfinite(values).all() for values in host_params(solver))
