"""Mixed precisions on the GPU (``precision: bf16-mixed | fp16-mixed``): training within 16-bit rounding of fp32,
and fp16-mixed's dynamic loss scaling (overflowing updates skipped, the scale halved and grown, the stop where no
scale helps, resume).  Every test here is marked ``gpu`` (the stand-in in CI, a GPU in ``.ci/gpu-session``, whose
layers stage runs this file in parallel with the others)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import yaml
from test_gpu_training import CHANGE_RTOL, MIXED, NETS, float32_solver, host_params, training_changes

import netspec
import netspec.errors
from netspec.training import loss_scale
from netspec.training.log import TrainingLog

pytestmark = pytest.mark.gpu

# ||change in a mixed precision - in fp32|| / ||change in fp32||, each blob: bfloat16 rounds each operand by up to
# 2**-9 (float16 2**-12), and a first convolution's weight gradient sums products that largely cancel, so there it
# shows most (bf16-mixed: 7% after CIFAR-10 quick's 2 iterations on the stand-in)
MIXED_CHANGE_RTOL = 0.2


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_mixed_precision_changes_the_weights_as_fp32_does_to_16_bits_precision(tmp_path, net, precision):
    """The products and convolutions take operands rounded to bfloat16 (8 significant bits) or float16 (11, the
    loss scaled): each blob's change lies within a few percent of fp32's, and differs from it (the rounding is
    there)."""
    exact = training_changes(net, "gpu", tmp_path / "fp32")
    mixed = training_changes(net, "gpu", tmp_path / precision, precision=precision)
    errors = {name: np.linalg.norm(mixed[name] - change) / np.linalg.norm(change) for name, change in exact.items()}
    assert max(errors.values()) <= MIXED_CHANGE_RTOL, errors
    assert max(errors.values()) > CHANGE_RTOL, errors


def overflowing_solver(tmp_path, loss_weight: float, param=(), **hyper):
    """A float32 solver of a net of one InnerProduct and a Euclidean loss of ``loss_weight`` under fp16-mixed
    (``param`` None: the InnerProduct's blobs frozen, lr_mult 0)."""
    layers = [{"name": "data", "type": "DummyData", "top": ["x", "y"],
               "dummy_data_param": {"shape": [{"dim": [8, 6]}, {"dim": [8, 3]}],
                                    "data_filler": [{"type": "gaussian", "std": 1.0}]}},
              {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "p",
               "inner_product_param": {"num_output": 3, "weight_filler": {"type": "xavier"}},
               **({"param": [{"lr_mult": 0}, {"lr_mult": 0}]} if param is None else {})},
              {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "y"], "top": "loss",
               "loss_weight": loss_weight}]
    text = yaml.safe_dump({"net": {"name": "overflowing", "layers": layers}, "base_lr": 1e-9, "momentum": 0.9,
                           "max_iter": 100, "random_seed": 1, "precision": "fp16-mixed",
                           "snapshot_prefix": str(tmp_path / "run"), **hyper})
    stream = io.StringIO()
    return netspec.load_solver(text, device="gpu", log=TrainingLog(stream=stream, progress=False)), stream


def momentum(solver) -> list[np.ndarray]:
    """The solver's update history, every buffer of every blob, on the host."""
    return [array for blobs in solver.optimizer.state().values() for arrays in blobs.values()
            for array in arrays.values()]


def test_fp16_mixed_skips_an_overflowing_update_halves_the_scale_and_doubles_it_after_good_ones(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.setattr(loss_scale, "INITIAL_SCALE", 2.0 ** 40)  # (scaled gradients far past 65,504)
    monkeypatch.setattr(loss_scale, "GROWTH_INTERVAL", 3)
    solver, said = overflowing_solver(tmp_path, 1.0)
    before = host_params(solver)
    solver.step(1)
    assert solver.loss_scale.scale == 2.0 ** 39 and solver.iter == 1
    for a, b in zip(before, host_params(solver)):
        assert np.array_equal(a, b)  # (skipped: the weights as they were...)
    assert not any(np.any(array) for array in momentum(solver))  # (... and the momentum too)
    assert "iteration 0: loss scale 1.09951e+12 -> 5.49756e+11: the gradients overflowed float16, so this update " \
           "is skipped" in said.getvalue()
    while solver.loss_scale.good_updates == 0:  # (halving until the scaled gradients fit)
        solver.step(1)
    scale = solver.loss_scale.scale
    assert scale < 2.0 ** 39 and any(np.any(array) for array in momentum(solver))  # (an update went through)
    skipped = solver.loss_scale.skipped
    assert skipped == solver.iter - 1 and solver.net.loss_scale == 1.0  # (reset for a backward pass from Python)
    solver.step(2)  # (3 good updates in a row: the scale doubles, back to the one that overflowed last...)
    assert solver.loss_scale.state() == {"scale": 2 * scale, "good_updates": 0, "skipped": skipped}
    assert f"loss scale {scale:g} -> {2 * scale:g}\n" in said.getvalue()
    solver.step(1)  # (... which overflows again)
    assert solver.loss_scale.state() == {"scale": scale, "good_updates": 0, "skipped": skipped + 1}


def test_fp16_mixed_stops_where_the_gradients_overflow_even_at_the_lowest_scale(tmp_path, monkeypatch):
    monkeypatch.setattr(loss_scale, "INITIAL_SCALE", 4.0)
    solver, said = overflowing_solver(tmp_path, 1e9)  # (1e9 seeds: past float16's 65,504 at any scale >= 1)
    solver.step(1)
    solver.snapshot()
    with pytest.raises(netspec.errors.DivergedError) as error:
        solver.step(10)
    assert str(error.value) == (
        "iteration 2: the gradients overflow float16 (fp16-mixed) even with the loss scale at its lowest, 1. "
        f"Training stopped; the last snapshot is {tmp_path}/run_iter_1.solverstate.h5 (use bf16-mixed or fp32, or "
        "a smaller loss_weight)")
    assert "loss scale 4 -> 2" in said.getvalue() and "loss scale 2 -> 1" in said.getvalue()


def test_fp16_mixed_counts_only_the_updates_made_for_adam_and_trains_a_net_without_learnable_blobs(tmp_path,
                                                                                                   monkeypatch):
    """A skipped update is no update: Adam's bias correction counts the updates made (as with PyTorch's
    GradScaler); and a net whose blobs all have lr_mult 0 has nothing to check."""
    monkeypatch.setattr(loss_scale, "INITIAL_SCALE", 2.0 ** 40)
    solver, _ = overflowing_solver(tmp_path, 1.0, type="Adam")
    counted = []
    step = solver.optimizer.step
    monkeypatch.setattr(solver.optimizer, "step", lambda rate, made, measure=False: counted.append(made) or
                        step(rate, made, measure))
    while not counted:
        solver.step(1)
    solver.step(1)
    assert solver.loss_scale.skipped > 0 and counted == [0, 1]
    frozen, _ = overflowing_solver(tmp_path / "frozen", 1.0, param=None)
    assert not frozen.optimizer.segments
    frozen.step(2)
    assert frozen.iter == 2


def test_fp16_mixed_resumes_bit_identically_with_its_loss_scale(tmp_path, monkeypatch):
    monkeypatch.setattr(loss_scale, "GROWTH_INTERVAL", 2)
    straight = float32_solver(MIXED, "gpu", tmp_path / "straight", precision="fp16-mixed")
    straight.step(7)
    interrupted = float32_solver(MIXED, "gpu", tmp_path / "interrupted", precision="fp16-mixed")
    interrupted.step(3)
    resumed = float32_solver(MIXED, "gpu", tmp_path / "resumed", precision="fp16-mixed")
    resumed.restore(interrupted.snapshot())
    assert resumed.loss_scale.state() == interrupted.loss_scale.state()
    resumed.step(4)
    assert resumed.loss_scale.state() == straight.loss_scale.state()
    assert straight.loss_scale.scale > loss_scale.INITIAL_SCALE  # (it grew: the state carried a changing scale)
    for a, b in zip(host_params(straight), host_params(resumed)):
        assert np.array_equal(a, b)


def test_a_state_with_a_malformed_loss_scale_is_refused_in_one_line(tmp_path):
    import h5py

    solver = float32_solver(MIXED, "gpu", tmp_path, precision="fp16-mixed")
    solver.step(1)
    state = solver.snapshot()
    with h5py.File(state, "r") as handle:
        progress = json.loads(handle.attrs["progress"])
    for malformed in ({"scale": float("nan"), "good_updates": 0, "skipped": 0},
                      {"scale": 3.0, "good_updates": 0, "skipped": 0},  # (not a power of two: unscaling inexact)
                      {"scale": 2.0, "good_updates": "1", "skipped": 0}):
        with h5py.File(state, "r+") as handle:
            handle.attrs["progress"] = json.dumps({**progress, "loss_scale": malformed})
        with pytest.raises(netspec.errors.StateError, match=r"its loss scale and its counts are malformed "
                                                            r"\(.a loss scale of "):
            float32_solver(MIXED, "gpu", tmp_path / "again", precision="fp16-mixed").restore(state)
