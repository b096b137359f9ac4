"""The memory plan: buffers shared by blobs whose lifetimes never meet, and nets that compute the same with it."""

from __future__ import annotations

import os

import numpy as np
import pytest

import netspec
from netspec.engine import onednn
from netspec.engine.net import Net, compile_net
from netspec.engine.outputs import OutputFolder
from netspec.engine.registry import layer_schemas
from netspec.engine.trust import Trust
from netspec.graph.memory import (
    ALIGNMENT,
    data_aliases,
    data_plan,
    diff_plan,
    pack,
    param_groups,
    split_aliases,
    sum_aliases,
    written_from,
)
from netspec.inspect.report import memory_estimate
from netspec.spec.net_spec import parse_net

CONFIGS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "configs")


def graph_of(source: str, batch: int | None = None, phase: str = "TRAIN"):
    """The graph of a config file (or YAML text), its DummyData/Input batch set to ``batch``."""
    spec = parse_net(os.path.join(CONFIGS, source) if source.endswith(".yaml") else source, layer_schemas())
    for layer in spec.layers:
        if batch and layer.type in ("DummyData", "Input"):
            block = layer.blocks["dummy_data_param" if layer.type == "DummyData" else "input_param"]
            for shape in block.shape:
                shape.dim[0] = batch
    return compile_net(spec, phase=phase, trust=Trust.own())  # (the tests' own)


def assert_lifetimes_apart(plan, lifetimes, sizes):
    """No two arrays in one buffer are live at one step, and each buffer holds its largest array."""
    for one in plan.buffer_of:
        assert plan.buffers[plan.buffer_of[one]] >= sizes[one]
        for other in plan.buffer_of:
            if one < other and plan.buffer_of[one] == plan.buffer_of[other]:
                (a, b), (c, d) = lifetimes[one], lifetimes[other]
                assert b < c or d < a, f"{one} {lifetimes[one]} and {other} {lifetimes[other]} share a buffer"


def test_pack_never_puts_live_arrays_together_and_reuses_what_is_free():
    rng = np.random.default_rng(0)
    for _ in range(200):
        count = int(rng.integers(1, 30))
        starts = rng.integers(0, 40, count)
        lifetimes = {f"b{i}": (int(s), int(s + rng.integers(0, 8))) for i, s in enumerate(starts)}
        sizes = {name: int(rng.integers(1, 1000)) for name in lifetimes}
        plan = pack(lifetimes, sizes)
        assert set(plan.buffer_of) == set(lifetimes)
        assert_lifetimes_apart(plan, lifetimes, sizes)
    chain = {f"b{i}": (i, i + 1) for i in range(10)}  # each array read by the next step only: two buffers
    assert len(pack(chain, dict.fromkeys(chain, 5)).buffers) == 2


def test_pack_grows_a_free_buffer_rather_than_opening_one():
    plan = pack({"small": (0, 0), "large": (1, 1)}, {"small": 10, "large": 100})
    assert plan.buffers == [100] and plan.buffer_of == {"small": 0, "large": 0}


NET = """
force_backward: false
layers:
  - {name: data, type: Input, top: [data, label], input_param: {shape: [{dim: [4, 3, 6, 6]}, {dim: [4]}]}}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution_param: {num_output: 4, kernel_size: 3,
     weight_filler: {type: gaussian, std: 0.1}}}
  - {name: relu, type: ReLU, bottom: conv, top: conv}
  - {name: halves, type: Slice, bottom: conv, top: [left, right], slice_param: {axis: 1}}
  - {name: fc, type: InnerProduct, bottom: left, top: fc, inner_product_param: {num_output: 5,
     weight_filler: {type: gaussian, std: 0.1}}}
  - {name: fc_twin, type: InnerProduct, bottom: left, top: fc_twin, param: [{name: shared_w}, {name: shared_b}],
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.1}}}
  - {name: fc_again, type: InnerProduct, bottom: right, top: fc_again, param: [{name: shared_w}, {name: shared_b}],
     inner_product_param: {num_output: 5}}
  - {name: sum, type: Eltwise, bottom: [fc, fc_twin, fc_again], top: sum}
  - {name: loss, type: SoftmaxWithLoss, bottom: [sum, label], top: loss}
  - {name: aux, type: EuclideanLoss, bottom: [fc, fc_twin], top: aux, loss_weight: 0.5}
  - {name: accuracy, type: Accuracy, bottom: [sum, label], top: accuracy}
"""


def test_diff_plan_keeps_diffs_nothing_writes_and_shares_the_rest():
    graph = graph_of(NET)
    plan = diff_plan(graph)
    assert "data" not in plan.buffer_of and "label" not in plan.buffer_of  # no backward reaches them
    assert {"conv", "left", "right", "fc", "sum", "loss", "aux"} <= set(plan.buffer_of)
    assert len(plan.buffers) < len(plan.buffer_of)
    only_read = graph_of(NET.replace("top: [left, right], slice_param: {axis: 1}",
                                     "top: [left, right, unused], slice_param: {axis: 1, slice_point: [1, 2]}"))
    assert "unused" not in diff_plan(only_read).buffer_of  # its producer reads it, nothing writes it: zeros of its own


def test_data_plan_keeps_outputs_inputs_and_what_is_asked_apart():
    graph = graph_of(NET, phase="TEST")
    plan = data_plan(graph, keep=["fc"])
    assert not {"data", "label", "loss", "aux", "accuracy", "fc"} & set(plan.buffer_of)
    assert {"conv", "left", "right", "fc_twin", "fc_again"} <= set(plan.buffer_of)
    assert data_aliases(graph, keep=["fc"])["sum"] == "fc_again"  # (its last reader: the sum takes its data)


def test_a_residual_sum_lives_from_the_convolution_that_may_compute_it():
    graph = graph_of("resnet50/resnet50_deploy.yaml", batch=1, phase="TEST")
    names = [node.name for node in graph.nodes]
    end = names.index("res2a")  # (Eltwise of res2a_branch1 and res2a_branch2c, after its BatchNorm and Scale)
    assert written_from(graph, end) == names.index("res2a_branch2c") == end - 3
    assert written_from(graph, names.index("res2a_relu")) == names.index("res2a_relu")
    plan = data_plan(graph, keep=["res2a_branch1"])  # (the shortcut kept: the sum has data of its own)
    assert plan.buffer_of["res2a"] != plan.buffer_of["res2a_branch2b"]  # (the convolution's input)
    aliases = data_aliases(graph)  # (else it takes the shortcut's, which lives from before the convolution)
    assert aliases["res2a"] == aliases["res2b"] == "res2a_branch1" and "res2a" not in data_plan(graph).buffer_of


def test_split_tops_nothing_changes_read_their_bottoms_data():
    graph = graph_of(NET)
    aliases = split_aliases(graph)
    assert {"left_halves_0_split_0": "left", "sum_sum_0_split_1": "sum"}.items() <= aliases.items()
    net = Net(graph, seed=0)
    for top, bottom in aliases.items():
        assert net.blobs[top].data is net.blobs[bottom].data


SUMS = """
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 3, 4, 4]}}}
  - {name: a, type: ReLU, bottom: data, top: a}
  - {name: b, type: Sigmoid, bottom: a, top: b}
  - {name: sum, type: Eltwise, bottom: [a, b], top: s}
  - {name: out, type: TanH, bottom: s, top: out}
"""


@pytest.mark.parametrize(("change", "keep", "taken"), [
    ((), (), "a"),
    (("top: out}", "top: out}\n  - {name: later, type: TanH, bottom: a, top: later}"), (), "b"),  # a read later
    (("bottom: [a, b]", "bottom: [data, b]"), (), "b"),  # an input's data
    ((), ("a",), "b"),
    ((), ("s",), None),
    (("bottom: [a, b]", "bottom: [a, a]"), (), None),  # read twice
    (("top: s}", "top: s, eltwise_param: {operation: PROD}}"), (), None),  # not a sum
], ids=["first", "read-later", "input", "kept", "top-kept", "twice", "product"])
def test_a_sum_takes_the_data_of_a_bottom_it_reads_last(change, keep, taken):
    graph = graph_of(SUMS.replace(*change) if change else SUMS, phase="TEST")
    assert sum_aliases(graph, keep).get("s") == taken


WITHOUT_ONEDNN = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")


@pytest.mark.parametrize("path", [pytest.param("onednn", marks=WITHOUT_ONEDNN), "numpy",
                                  pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_sum_written_over_its_second_bottom_adds_it_first(path, monkeypatch):
    if path == "numpy":
        monkeypatch.setattr(onednn, "library_for", lambda layer: None)
    text = SUMS.replace("bottom: [a, b], top: s}", "bottom: [b, a], top: s, eltwise_param: {coeff: [2, 0.5]}}")
    text = text.replace("top: out}", "top: out}\n  - {name: later, type: TanH, bottom: b, top: later}")
    plain = Net(graph_of(text, phase="TEST"), seed=0, inference=True)
    shared = Net(graph_of(text, phase="TEST"), device="gpu" if path == "gpu" else "cpu", seed=0, inference=True,
                 reuse_memory=True)
    assert shared.blobs["s"].shares_data(shared.blobs["a"])
    assert (shared.layer_by_name["sum"].fast is not None) == (path == "onednn")
    for net in (plain, shared):
        net.blobs["data"].data[...] = net.backend.xp.asarray(np.linspace(-2, 2, 96).reshape(2, 3, 4, 4))
        net.forward()
    np.testing.assert_allclose(shared.backend.to_host(shared.blobs["out"].data), plain.blobs["out"].data, rtol=1e-6)


def twin_nets(graph_factory, inference=False):
    """The same net twice, from one seed: blobs in arrays of their own, and sharing buffers."""
    return [Net(graph_factory(), seed=0, inference=inference, reuse_memory=reuse) for reuse in (False, True)]


TRAIN_NETS = [(NET, None), ("lenet/lenet_timing.yaml", 8), ("cifar10/cifar10_quick_timing.yaml", 4),
              ("googlenet/googlenet_timing.yaml", 1), ("resnet50/resnet50_timing.yaml", 1)]


@pytest.mark.parametrize(("source", "batch"), TRAIN_NETS, ids=lambda value: str(value).split("/")[0][:12])
def test_shared_diffs_give_bit_identical_gradients_in_less_memory(source, batch):
    plain, shared = twin_nets(lambda: graph_of(source, batch))
    for net in (plain, shared):
        for layer in net.layers:
            if layer.type == "BatchNorm":
                for blob, value in zip(layer.blobs, (0.1, 1.0, 1.0)):
                    blob.data[...] = value
    for _ in range(2):  # the second pass finds the buffers holding the first's values
        losses = [net.forward_backward() for net in (plain, shared)]
        assert losses[0] == losses[1]
        for name, blobs in plain.owned_params().items():
            for (index, mine), (_, theirs) in zip(blobs, shared.owned_params()[name]):
                assert np.array_equal(mine.diff, theirs.diff), f"{name} {index}"
    assert shared.memory_bytes() < plain.memory_bytes()


INFERENCE_NETS = [(NET, None), ("googlenet/googlenet_deploy.yaml", 1), ("resnet50/resnet50_deploy.yaml", 1)]


@pytest.mark.parametrize(("source", "batch"), INFERENCE_NETS, ids=lambda value: str(value).split("/")[0][:12])
def test_shared_data_gives_identical_outputs_pass_after_pass(source, batch):
    plain, shared = twin_nets(lambda: graph_of(source, batch, phase="TEST"), inference=True)
    rng = np.random.default_rng(1)
    inputs = [name for layer, node in zip(plain.layers, plain.nodes) if layer.type == "Input" for name in node.tops]
    for _ in range(2):
        values = {name: rng.integers(0, 3, plain.blobs[name].shape) for name in inputs}
        for net in (plain, shared):
            for name, value in values.items():
                net.blobs[name].data[...] = value
            net.forward()
        for name in plain.outputs:
            assert np.array_equal(plain.blobs[name].data, shared.blobs[name].data), name
    assert shared.memory_bytes() < plain.memory_bytes()


def test_kept_blobs_stay_readable_after_the_pass():
    graph = graph_of(NET, phase="TEST")
    plain = Net(graph, seed=0, inference=True)
    kept = Net(graph_of(NET, phase="TEST"), seed=0, inference=True, reuse_memory=True, keep=("fc_twin",))
    for net in (plain, kept):
        net.blobs["data"].data[...] = 1.0
        net.forward()
    assert np.array_equal(plain.blobs["fc_twin"].data, kept.blobs["fc_twin"].data)


def test_learnable_blobs_lie_in_one_flat_buffer_per_pair_of_multipliers():
    graph = graph_of("lenet/lenet_timing.yaml", 8)
    groups = param_groups(graph)
    assert groups.multipliers == [(1.0, 1.0), (2.0, 1.0)]  # the weights, then the biases (lr_mult 2)
    assert all(offset % ALIGNMENT == 0 for _, offset in groups.place.values())
    net = Net(graph, seed=0)
    learnable = net.learnable_groups()
    assert [len(group.members) for group in learnable] == [4, 4]
    for group in learnable:
        for param, offset in group.members:
            assert np.shares_memory(param.blob.data, group.data) and np.shares_memory(param.blob.diff, group.diff)
            assert np.array_equal(group.data[offset:offset + param.blob.count], param.blob.data.reshape(-1))
    assert not Net(graph_of("lenet/lenet_timing.yaml", 8, phase="TEST"), seed=0, inference=True).learnable_groups()


def test_shared_and_frozen_blobs_stay_out_of_the_groups():
    net = Net(graph_of(NET.replace("{name: shared_b}", "{name: shared_b, lr_mult: 0}")), seed=0)
    (group,) = net.learnable_groups()
    names = [(param.layer, param.index) for param, _ in group.members]
    assert names == [("conv", 0), ("conv", 1), ("fc", 0), ("fc", 1), ("fc_twin", 0)]
    assert net.params["fc_again"][0].data.base is not None
    assert np.shares_memory(net.params["fc_again"][0].data, group.data)  # a view of its owner's, in the group
    assert not np.shares_memory(net.params["fc_twin"][1].data, group.data)  # lr_mult 0: its own array


def gradients(net):
    net.forward_backward()
    return {f"{name}[{index}]": blob.diff.copy() for name, blobs in net.owned_params().items() for index, blob in blobs}


def test_a_layer_that_sends_nothing_back_leaves_no_stale_gradient(tmp_path):
    text = """
force_backward: true
layers:
  - {name: data, type: Input, top: [data, label], input_param: {shape: [{dim: [4, 6]}, {dim: [4]}]}}
  - {name: fc1, type: InnerProduct, bottom: data, top: fc1, inner_product_param: {num_output: 5,
     weight_filler: {type: gaussian, std: 0.5}}}
  - {name: relu, type: ReLU, bottom: fc1, top: fc1}
  - {name: save, type: HDF5Output, bottom: fc1, hdf5_output_param: {file_name: out.h5}}
  - {name: fc2, type: InnerProduct, bottom: fc1, top: fc2, inner_product_param: {num_output: 3,
     weight_filler: {type: gaussian, std: 0.5}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc2, label], top: loss}
"""
    nets = [Net(graph_of(text), seed=0, reuse_memory=reuse, output_folder=OutputFolder(str(tmp_path / str(reuse))))
            for reuse in (False, True)]
    for net in nets:
        net.blobs["data"].data[...] = np.linspace(-1, 1, 24).reshape(4, 6)
        net.blobs["label"].data[...] = [0, 1, 2, 1]
    plain, shared = (gradients(net) for net in nets)
    for net in nets:
        net.close()
    assert plain.keys() == shared.keys() and all(np.array_equal(plain[key], shared[key]) for key in plain)


def test_python_layers_blobs_keep_arrays_of_their_own(tmp_path, monkeypatch):
    (tmp_path / "memory_plan_layers.py").write_text(
        "import netspec\n\n"
        "class Twice(netspec.PythonLayer):\n"
        "    def top_shapes(self, bottom_shapes):\n"
        "        return [bottom_shapes[0]]\n"
        "    def forward(self, bottom, top):\n"
        "        top[0].data[...] = 2 * bottom[0].data\n"
        "    def backward(self, top, propagate_down, bottom):\n"
        "        bottom[0].diff[...] = 2 * top[0].diff\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = NET.replace("{name: relu, type: ReLU, bottom: conv, top: conv}",
                       "{name: twice, type: Python, bottom: conv, top: twice, python_param: "
                       "{module: memory_plan_layers, layer: Twice}}").replace("bottom: conv, top: [left", "bottom: twice, top: [left")
    assert not {"conv", "twice"} & set(diff_plan(graph_of(text)).buffer_of)
    assert not {"conv", "twice"} & set(data_plan(graph_of(text, phase="TEST")).buffer_of)
    assert "conv" in diff_plan(graph_of(NET)).buffer_of and "conv" in data_plan(graph_of(NET, phase="TEST")).buffer_of


def test_a_forward_only_net_keeps_losses_that_another_layer_reads():
    text = """
layers:
  - {name: data, type: Input, top: [a, b], input_param: {shape: [{dim: [2, 3]}, {dim: [2, 3]}]}}
  - {name: loss, type: EuclideanLoss, bottom: [a, b], top: l}
  - {name: doubled, type: Power, bottom: l, top: twice, power_param: {scale: 2}}
"""
    losses = []
    for reuse in (False, True):
        net = Net(graph_of(text, phase="TEST"), seed=0, inference=True, reuse_memory=reuse)
        net.blobs["a"].data[...] = 1.0
        net.blobs["b"].data[...] = -1.0
        losses.append(net.forward())
    assert losses[0] == losses[1] == 6.0


def test_a_solvers_nets_count_the_weights_they_share_once(tmp_path):
    text = (f"net: {os.path.join(CONFIGS, 'lenet', 'lenet_timing.yaml')}\nbase_lr: 0.01\nmax_iter: 1\n"
            f"test_iter: [1]\ntest_interval: 1\nsnapshot_prefix: {tmp_path / 'run'}\n")
    solver = netspec.load_solver(text, reuse_memory=True)
    train, test = solver.net, solver.test_nets[0]
    shared = sum(2 * blob.data.nbytes for blobs in test.params.values() for blob in blobs)  # (data and diff)
    assert train.memory_bytes(test) == train.memory_bytes() + test.memory_bytes() - shared
    assert solver.memory_report().startswith(f"memory: blobs {train.memory_bytes(test) / 2 ** 20:.1f} MiB (train")


@pytest.mark.parametrize(("source", "batch", "phase"), [(NET, None, "TRAIN"), (NET, None, "TEST"),
                                                        ("resnet50/resnet50_timing.yaml", 1, "TRAIN"),
                                                        ("googlenet/googlenet_deploy.yaml", 1, "TEST")],
                         ids=["train", "test", "resnet50_train", "googlenet_deploy"])
def test_netspec_check_says_what_the_net_will_hold(source, batch, phase, monkeypatch):
    monkeypatch.setattr(onednn, "holdable", lambda graph, keep=(): set())  # (blocked copies pad channels: below)
    graph = graph_of(source, batch, phase)
    data, gradients, held, buffers = memory_estimate(graph)
    net = Net(graph, seed=0, inference=phase == "TEST", reuse_memory=True)
    params = sum(array.nbytes for blobs in net.owned_params().values() for _, blob in blobs
                 for array in ((blob.data, blob.diff) if blob.has_diff else (blob.data,)))
    assert net.memory_bytes() - params == held
    assert held < data + gradients and buffers >= 2


def test_blocked_copies_take_the_plans_room_not_more(monkeypatch):
    if onednn.library() is None:
        pytest.skip(f"oneDNN is off: {onednn.why_unavailable()}")
    graph = graph_of("resnet50/resnet50_timing.yaml", 1)
    net = Net(graph, seed=0, reuse_memory=True)
    assert any(isinstance(blob.held_diff, onednn.HeldArray) for blob in net.blobs.values())
    monkeypatch.setattr(onednn, "holdable", lambda graph, keep=(): set())
    assert net.memory_bytes() <= Net(graph, seed=0, reuse_memory=True).memory_bytes()
