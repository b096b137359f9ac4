"""MemoryData: batches from arrays handed over in Python, training through the API, Caffe's files, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from test_cli import run

import netspec
from netspec.errors import ConfigError, DataError
from netspec.tools.digits import load_digits, split


def memory_net(tops=("data", "label"), batch_size=2, name="mem", extra=()) -> str:
    layers = [{"name": name, "type": "MemoryData", "top": list(tops),
               "memory_data_param": {"batch_size": batch_size, "channels": 1, "height": 2, "width": 3}},
              *extra]
    return yaml.safe_dump({"name": "memory", "layers": layers})


def test_batches_go_through_the_rows_in_order_and_wrap_around():
    net = netspec.load_net(memory_net())
    data = np.arange(5 * 6, dtype=np.float64).reshape(5, 1, 2, 3)
    labels = np.arange(5) * 10
    net.set_input_arrays(data, labels)
    data[...] = -1  # the layer kept a copy
    served = []
    for _ in range(4):
        net.forward()
        assert net.blobs["data"].data.dtype == np.float32
        served.append(list(net.blobs["label"].data.astype(int)))
        assert (net.blobs["data"].data[:, 0, 0, 0] == net.blobs["label"].data / 10 * 6).all()
    assert served == [[0, 10], [20, 30], [40, 0], [10, 20]]
    net.set_input_arrays(np.zeros((1, 1, 2, 3)), [7])  # new arrays start from their first row
    net.forward()
    assert list(net.blobs["label"].data) == [7, 7]


def test_a_solver_trains_on_arrays_handed_to_its_nets(tmp_path):
    images, labels = load_digits()
    net = {"name": "mlp", "layers": [
        {"name": "digits", "type": "MemoryData", "top": ["data", "label"],
         "memory_data_param": {"batch_size": 64, "channels": 1, "height": 8, "width": 8}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "data", "top": "ip1",
         "inner_product_param": {"num_output": 64, "weight_filler": {"type": "xavier"}}},
        {"name": "relu1", "type": "ReLU", "bottom": "ip1", "top": "ip1"},
        {"name": "ip2", "type": "InnerProduct", "bottom": "ip1", "top": "ip2",
         "inner_product_param": {"num_output": 10, "weight_filler": {"type": "xavier"}}},
        {"name": "accuracy", "type": "Accuracy", "bottom": ["ip2", "label"], "top": "accuracy",
         "include": {"phase": "TEST"}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"], "top": "loss"}]}
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(net))
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmomentum: 0.9\nmax_iter: 300\n"
                                          "test_iter: [5]\ntest_interval: 1000\ntest_initialization: false\n"
                                          "random_seed: 1\nsnapshot_prefix: runs/mlp\n")
    solver = netspec.load_solver(str(tmp_path / "solver.yaml"))
    train, test = split(labels)
    solver.net.set_input_arrays(images[train], labels[train])
    solver.test_nets[0].set_input_arrays(images[test], labels[test])
    solver.step(300)
    assert solver.test_all()[0]["accuracy"] >= 0.85  # 5 batches of 64 of the test digits; chance is 0.1


@pytest.mark.parametrize("arrays, message", [
    ((np.zeros((4, 1, 3, 2)), np.zeros(4)),
     "layer 'mem': data of shape (4, 1, 3, 2) does not fit the layer's rows: give (N, 1, 2, 3) with N >= 1"),
    ((np.zeros((0, 1, 2, 3)), np.zeros(0)),
     "layer 'mem': data of shape (0, 1, 2, 3) does not fit the layer's rows: give (N, 1, 2, 3) with N >= 1"),
    ((np.zeros((4, 1, 2, 3)), None), "layer 'mem': its top 'label' needs labels"),
    ((np.zeros((4, 1, 2, 3)), np.zeros((4, 1))),
     "layer 'mem': labels of shape (4, 1) do not fit 4 rows of data: give (4,)"),
])
def test_arrays_that_do_not_fit_are_refused_in_one_line(arrays, message):
    net = netspec.load_net(memory_net())
    with pytest.raises(DataError) as error:
        net.set_input_arrays(*arrays)
    assert str(error.value) == message


def test_the_layer_is_found_or_named():
    with pytest.raises(DataError, match="^layer 'mem': has no label top, so it takes no labels$"):
        netspec.load_net(memory_net(tops=("data",))).set_input_arrays(np.zeros((1, 1, 2, 3)), [0])
    unlabelled = netspec.load_net(memory_net(tops=("data",)))
    unlabelled.set_input_arrays(np.ones((1, 1, 2, 3)))
    unlabelled.forward()
    assert (unlabelled.blobs["data"].data == 1).all()
    second = {"name": "other", "type": "MemoryData", "top": "more",
              "memory_data_param": {"batch_size": 1, "channels": 1, "height": 2, "width": 3}}
    two = netspec.load_net(memory_net(tops=("data",), extra=[second]))
    with pytest.raises(DataError) as error:
        two.set_input_arrays(np.zeros((1, 1, 2, 3)))
    assert str(error.value) == ("net 'memory': set_input_arrays needs a MemoryData layer, and one only "
                                "(its MemoryData layers: 'mem', 'other')")
    two.set_input_arrays(np.full((1, 1, 2, 3), 2.0), layer="other")
    with pytest.raises(DataError, match="a MemoryData layer named 'nope'"):
        two.set_input_arrays(np.zeros((1, 1, 2, 3)), layer="nope")
    plain = netspec.load_net("layers: [{name: x, type: Input, top: x, input_param: {shape: {dim: [1]}}}]")
    with pytest.raises(DataError, match=r"\(its MemoryData layers: none\)$"):
        plain.set_input_arrays(np.zeros((1, 1, 2, 3)))


def test_a_net_run_before_its_arrays_are_set_says_how_to_set_them(tmp_path):
    with pytest.raises(DataError, match=r"^layer 'mem': MemoryData has no arrays: hand them over with "
                                        r"net.set_input_arrays\(data, labels\) before running the net$"):
        netspec.load_net(memory_net()).forward()
    extra = [{"name": "loss", "type": "EuclideanLoss", "bottom": ["data", "data"], "top": "loss"}]
    (tmp_path / "net.yaml").write_text(memory_net(tops=("data",), extra=extra))
    result = run("time", tmp_path / "net.yaml", "--iterations", "1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: layer 'mem': MemoryData has no arrays") and result.stderr.count("\n") == 1


def test_sizes_must_be_positive():
    with pytest.raises(ConfigError, match="memory_data_param.height: must be positive, got 0"):
        netspec.load_net(memory_net().replace("height: 2", "height: 0"))


def test_caffe_memory_data_layers_import(tmp_path):
    current = tmp_path / "current.prototxt"
    current.write_text('layer { name: "mem" type: "MemoryData" top: "data" top: "label"\n'
                       '  memory_data_param { batch_size: 4 channels: 1 height: 2 width: 3 } }\n')
    v1 = tmp_path / "v1.prototxt"
    v1.write_text('layers { name: "mem" type: MEMORY_DATA top: "data" top: "label"\n'
                  '  memory_data_param { batch_size: 4 channels: 1 height: 2 width: 3 } }\n')
    for source in (current, v1):
        out = tmp_path / f"{source.stem}.yaml"
        result = run("import", "caffe", source, "-o", out)
        assert result.returncode == 0, result.stderr
        net = netspec.load_net(str(out))
        assert net.blobs["data"].shape == (4, 1, 2, 3) and net.blobs["label"].shape == (4,)
