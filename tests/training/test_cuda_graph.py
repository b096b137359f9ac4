"""Training iterations as one CUDA graph (``cuda_graph: true``): graphed training equals eager training bit for
bit, resumes bit-identically, and a run that cannot be captured trains eagerly, saying why in one line.

Marked ``gpu``: on a GPU (``.ci/gpu-session``) the graph is CUDA's; on the GPU stand-in (CI) it is the stand-in's,
which records the work and refuses what CUDA refuses in a capture (tests/engine/test_standin_capture.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from test_gpu_training import MIXED, float32_solver, host_params, straight_and_resumed
from test_solver import MOMENTUM, data_solver

from netspec.engine import capture, gpu_standin
from netspec.layers.inner_product import InnerProduct
from netspec.training.log import TrainingLog

pytestmark = pytest.mark.gpu

CONFIGS = Path(__file__).parent.parent.parent / "configs"
LENET = CONFIGS / "lenet" / "lenet_timing.yaml"
CIFAR10_QUICK = CONFIGS / "cifar10" / "cifar10_quick_timing.yaml"
NETS = {"lenet": LENET, "cifar10_quick": CIFAR10_QUICK, "mixed": MIXED}
# iterations compared: the 50 on a GPU; on the stand-in (NumPy, far slower) enough to cover the warm-up,
# the capture and many launches
ITERATIONS = 12 if gpu_standin.requested() else 50


class Lines(TrainingLog):
    """A quiet training log that keeps its messages."""

    def __init__(self):
        super().__init__(quiet=True)
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def trained(net: Path, tmp_path, graph: bool, iterations: int = ITERATIONS, **hyper):
    solver = float32_solver(net, "gpu", tmp_path / ("graphed" if graph else "eager"), cuda_graph=graph,
                            snapshot=0, **hyper)
    solver.log = Lines()
    solver.step(iterations)
    return solver


@pytest.mark.parametrize("net", sorted(NETS))
def test_graphed_training_gives_the_weights_eager_training_gives(tmp_path, net):
    eager, graphed = trained(NETS[net], tmp_path, False), trained(NETS[net], tmp_path, True)
    assert graphed.graphed is not None and graphed.graphed.graph is not None, graphed.log.lines
    assert graphed.graphed.refused is None
    assert any("captured" in line for line in graphed.log.lines)
    for a, b in zip(host_params(eager), host_params(graphed)):
        assert np.array_equal(a, b)
    assert graphed.smoothed_loss == eager.smoothed_loss


def test_recurrent_and_deconvolution_layers_are_captured_and_train_as_eagerly(tmp_path):
    """LSTM, RNN and a grouped Deconvolution make their products through netspec's cuBLAS handles: captured."""
    gaussian = {"type": "gaussian", "std": 1}
    layers = [
        {"name": "data", "type": "DummyData", "top": ["x", "cont", "image", "target", "picture"],
         "dummy_data_param": {"shape": [{"dim": [4, 3, 5]}, {"dim": [4, 3]}, {"dim": [2, 4, 5, 5]}, {"dim": [4, 3, 2]},
                                        {"dim": [2, 4, 11, 11]}],
                              "data_filler": [gaussian, {"type": "constant", "value": 1}, gaussian, gaussian, gaussian]}},
        {"name": "lstm", "type": "LSTM", "bottom": ["x", "cont"], "top": "h",
         "recurrent_param": {"num_output": 6, "weight_filler": {"type": "uniform", "min": -0.3, "max": 0.3}}},
        {"name": "rnn", "type": "RNN", "bottom": ["h", "cont"], "top": "o",
         "recurrent_param": {"num_output": 2, "weight_filler": {"type": "uniform", "min": -0.3, "max": 0.3}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["o", "target"], "top": "loss"},
        {"name": "up", "type": "Deconvolution", "bottom": "image", "top": "up",
         "convolution_param": {"num_output": 4, "kernel_size": 3, "stride": 2, "group": 2,
                               "weight_filler": {"type": "xavier"}}},
        {"name": "picture_loss", "type": "EuclideanLoss", "bottom": ["up", "picture"], "top": "picture_loss"}]
    net = tmp_path / "net.yaml"
    net.write_text(yaml.safe_dump({"name": "recurrent_and_up", "layers": layers}))
    eager, graphed = trained(net, tmp_path, False, iterations=6), trained(net, tmp_path, True, iterations=6)
    assert graphed.graphed.graph is not None, graphed.log.lines
    for a, b in zip(host_params(eager), host_params(graphed)):
        assert np.array_equal(a, b)


def test_attention_and_resampling_layers_are_captured_and_train_as_eagerly(tmp_path):
    """MatMul, MultiHeadAttention, LayerNorm, Resize's backward pass, adaptive AVE pooling and a depthwise
    Convolution (without cuDNN) make their products through netspec's cuBLAS handles (strided batched) and their
    sums as reductions, never through CuPy's matmul or einsum, which a capture refuses: captured."""
    gaussian = {"type": "gaussian", "std": 1}
    tokens = {"dim": [2, 6, 8]}
    layers = [
        {"name": "data", "type": "DummyData", "top": ["x", "target", "image", "picture"],
         "dummy_data_param": {"shape": [tokens, tokens, {"dim": [2, 4, 5, 7]}, {"dim": [2, 4, 4, 5]}],
                              "data_filler": [gaussian] * 4}},
        {"name": "norm", "type": "LayerNorm", "bottom": "x", "top": "normed", "layer_norm_param": {"axis": 2}},
        {"name": "attention", "type": "MultiHeadAttention", "bottom": "normed", "top": "attended",
         "multi_head_attention_param": {"num_heads": 2}},
        {"name": "gram", "type": "MatMul", "bottom": ["attended", "normed"], "top": "gram",
         "mat_mul_param": {"transpose_b": True}},
        {"name": "mix", "type": "MatMul", "bottom": ["gram", "x"], "top": "mixed"},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["mixed", "target"], "top": "loss", "loss_weight": 0.001},
        {"name": "depthwise", "type": "Convolution", "bottom": "image", "top": "filtered",
         "convolution_param": {"num_output": 4, "kernel_size": 3, "pad": 1, "group": 4,
                               "weight_filler": {"type": "xavier"}}},
        {"name": "up", "type": "Resize", "bottom": "filtered", "top": "up",
         "resize_param": {"height": 9, "width": 11, "mode": "LINEAR"}},
        {"name": "pool", "type": "Pooling", "bottom": "up", "top": "pooled",
         "pooling_param": {"pool": "AVE", "output_size": [4, 5]}},
        {"name": "picture_loss", "type": "EuclideanLoss", "bottom": ["pooled", "picture"], "top": "picture_loss"}]
    net = tmp_path / "net.yaml"
    net.write_text(yaml.safe_dump({"name": "attention_and_resampling", "layers": layers}))
    eager, graphed = trained(net, tmp_path, False, iterations=6), trained(net, tmp_path, True, iterations=6)
    assert graphed.graphed.graph is not None, graphed.log.lines
    for a, b in zip(host_params(eager), host_params(graphed)):
        assert np.array_equal(a, b)


def test_a_graph_that_drew_the_same_values_at_every_launch_would_part_from_eager_training(tmp_path, monkeypatch):
    """Each launch draws its own random values (DummyData's, Dropout's): a graph whose draws kept the offsets of
    the capture would train otherwise, and the comparison above would see it."""
    eager = trained(MIXED, tmp_path, False)
    monkeypatch.setattr(capture.Recording, "draw", lambda self, name, offset: offset)
    graphed = trained(MIXED, tmp_path, True)
    assert graphed.graphed.graph is not None
    assert not all(np.array_equal(a, b) for a, b in zip(host_params(eager), host_params(graphed)))


@pytest.mark.parametrize("rule", ["SGD", "Adam"])
def test_a_graphed_run_fed_from_the_host_resumes_bit_identically(tmp_path, rule):
    """A net whose data layer copies batches from the host (HDF5Data, shuffled, with Dropout) under a rule whose
    rates change each iteration (Adam's bias correction): resumed from a snapshot, it continues as it would have."""
    hyper = {"type": rule, "momentum": MOMENTUM[rule], "weight_decay": 0.01, "solver_mode": "GPU", "cuda_graph": True}
    straight, resumed = straight_and_resumed(tmp_path, 9, 4, **hyper)
    eager = data_solver(tmp_path, batch=5, shuffle=True, dropout=True, **{**hyper, "cuda_graph": False})
    eager.step(9)
    assert straight.graphed.graph is not None and resumed.graphed.graph is not None
    for a, b, c in zip(host_params(straight), host_params(resumed), host_params(eager)):
        assert np.array_equal(a, b)
        assert np.array_equal(a, c)


@pytest.mark.parametrize(("hyper", "device", "why"), [
    ({"iter_size": 2}, "gpu", "cuda_graph: iter_size 2 feeds a batch from the host between passes of one update: "
                              "training runs without graphs"),
    ({}, "cpu", "cuda_graph: the device is the CPU, which runs no CUDA graphs: training runs without graphs"),
], ids=["iter_size", "cpu"])
def test_a_setting_that_cannot_be_captured_trains_eagerly_saying_why(tmp_path, hyper, device, why):
    solver = data_solver(tmp_path, batch=4, cuda_graph=True, solver_mode="GPU" if device == "gpu" else "CPU", **hyper)
    assert solver.graphed is None
    assert why in solver.warnings
    solver.step(3)


def test_a_python_layer_trains_eagerly_saying_why(tmp_path, monkeypatch):
    (tmp_path / "passing.py").write_text(
        "import netspec\n\n\n"
        "class Same(netspec.PythonLayer):\n"
        "    def top_shapes(self, shapes):\n        return [shapes[0]]\n\n"
        "    def forward(self, bottom, top):\n        top[0].data[...] = bottom[0].data\n\n"
        "    def backward(self, top, propagate_down, bottom):\n        bottom[0].diff[...] = top[0].diff\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = [{"name": "data", "type": "DummyData", "top": ["x", "y"],
               "dummy_data_param": {"shape": [{"dim": [4, 3]}, {"dim": [4, 2]}],
                                    "data_filler": {"type": "gaussian"}}},
              {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "p",
               "inner_product_param": {"num_output": 2, "weight_filler": {"type": "xavier"}}},
              {"name": "same", "type": "Python", "bottom": "p", "top": "q",
               "python_param": {"module": "passing", "layer": "Same"}},
              {"name": "loss", "type": "EuclideanLoss", "bottom": ["q", "y"], "top": "loss"}]
    net = tmp_path / "net.yaml"
    net.write_text(yaml.safe_dump({"name": "with_python", "layers": layers}))
    solver = float32_solver(net, "gpu", tmp_path, cuda_graph=True)
    assert solver.graphed is None
    assert "cuda_graph: layer 'same' is a Python layer, whose code runs on the host: training runs without graphs" \
        in solver.warnings
    solver.step(3)


def test_a_layer_that_reads_the_device_in_the_capture_is_named_and_the_run_trains_on_as_eager(tmp_path,
                                                                                                monkeypatch):
    """A layer whose forward pass reads the device on the host (refused in a capture): one line names it, the
    iteration the capture could not do is done eagerly, and the run trains as an eager run does."""
    forward = InnerProduct.forward

    def reads_the_device(self, bottom, top):
        forward(self, bottom, top)
        if float(top[0].data.reshape(-1)[0]) > 1e30:  # (never true: the read is the point)
            raise AssertionError

    monkeypatch.setattr(InnerProduct, "forward", reads_the_device)
    eager = trained(MIXED, tmp_path, False, iterations=6)
    graphed = trained(MIXED, tmp_path, True, iterations=6)
    assert graphed.graphed.graph is None
    refused = [line for line in graphed.log.lines if line.startswith("cuda_graph:")]
    assert len(refused) == 1 and "layer 'fc' (forward) cannot be captured" in refused[0], refused
    assert refused[0].endswith("training goes on without graphs")
    for a, b in zip(host_params(eager), host_params(graphed)):
        assert np.array_equal(a, b)


def test_netspec_train_with_cuda_graph_tests_snapshots_and_says_it_captured(tmp_path):
    from test_cli import run
    solver = tmp_path / "solver.yaml"
    solver.write_text(yaml.safe_dump({"net": str(MIXED), "base_lr": 0.001, "momentum": 0.9, "max_iter": 12,
                                      "display": 4, "snapshot": 6, "random_seed": 3, "solver_mode": "GPU",
                                      "snapshot_prefix": str(tmp_path / "run" / "mixed")}))
    result = run("train", str(solver), "--cuda-graph", env={gpu_standin.ENVIRONMENT: "1"}
                 if gpu_standin.requested() else None)
    assert result.returncode == 0, result.stderr
    assert "cuda_graph: iteration 2 captured" in result.stdout
    assert (tmp_path / "run" / "mixed_iter_6.solverstate.h5").exists()
    assert (tmp_path / "run" / "mixed_iter_12.weights.h5").exists()
