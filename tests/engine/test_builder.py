"""The Python NetSpec: building nets with L.Type(...), shape errors at once, and YAML that round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_modules import canonical

import netspec
from netspec import L, NetSpec
from netspec.errors import ConfigError, ShapeError

ROOT = Path(__file__).parent.parent.parent


def cifar10_quick() -> NetSpec:
    n = NetSpec("CIFAR10_quick")
    n.data = L.Input(shape=dict(dim=[1, 3, 32, 32]))
    n.conv1 = L.Convolution(n.data, num_output=32, pad=2, kernel_size=5, stride=1)
    n.pool1 = L.Pooling(n.conv1, pool="MAX", kernel_size=3, stride=2)
    n.relu1 = L.ReLU(n.pool1, in_place=True)
    n.conv2 = L.Convolution(n.relu1, num_output=32, pad=2, kernel_size=5, stride=1)
    n.relu2 = L.ReLU(n.conv2, in_place=True)
    n.pool2 = L.Pooling(n.relu2, pool="AVE", kernel_size=3, stride=2)
    n.conv3 = L.Convolution(n.pool2, num_output=64, pad=2, kernel_size=5, stride=1)
    n.relu3 = L.ReLU(n.conv3, in_place=True)
    n.pool3 = L.Pooling(n.relu3, pool="AVE", kernel_size=3, stride=2)
    n.ip1 = L.InnerProduct(n.pool3, num_output=64)
    n.ip2 = L.InnerProduct(n.ip1, num_output=10)
    n.prob = L.Softmax(n.ip2)
    return n


def test_a_python_net_emits_yaml_with_the_same_graph_as_the_config(tmp_path):
    n = cifar10_quick()
    assert n.shape("pool3") == (1, 64, 4, 4) and n.shape("prob") == (1, 10)
    path = tmp_path / "built.yaml"
    path.write_text(n.to_yaml())
    assert canonical(path, "TEST") == canonical(ROOT / "configs" / "cifar10" / "cifar10_quick_deploy.yaml", "TEST")


def test_multiple_tops_blocks_and_layer_keys():
    n = NetSpec("tiny")
    n.data, n.label = L.DummyData(shape=[dict(dim=[4, 3]), dict(dim=[4])], ntop=2,
                                  data_filler=[dict(type="gaussian"), dict(type="constant", value=1)])
    n.ip = L.InnerProduct(n.data, inner_product_param=dict(num_output=2), param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.loss = L.SoftmaxWithLoss(n.ip, n.label, loss_weight=0.5)
    layers = n.to_dict()["layers"]
    assert layers[0]["top"] == ["data", "label"] and layers[1]["param"] == [{"lr_mult": 1}, {"lr_mult": 2}]
    assert layers[2] == {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss",
                         "loss_weight": 0.5}
    net = netspec.load_net(n.to_yaml(), phase="TRAIN", seed=0)
    assert np.isfinite(net.forward())


def test_mistakes_stop_at_the_line_that_makes_them():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 5]))
    with pytest.raises(ShapeError, match=r"layer 'conv' \(Convolution\): Convolution needs a 4-axis bottom"):
        n.conv = L.Convolution(n.data, num_output=3, kernel_size=3)
    with pytest.raises(ConfigError, match="L.InnerProduct: no parameter 'num_ouput'; did you mean 'num_output'"):
        L.InnerProduct(n.data, num_ouput=3)
    with pytest.raises(ConfigError, match="L.Convolutoin: unknown layer type; did you mean 'Convolution'"):
        L.Convolutoin(n.data)
    with pytest.raises(ConfigError, match=r"layer 'ip': inner_product_param.num_output: missing required parameter"):
        n.ip = L.InnerProduct(n.data)
    with pytest.raises(ConfigError, match="NetSpec.x: assign a top of a layer"):
        n.x = 3
    with pytest.raises(AttributeError, match="no top 'dta' yet; did you mean 'data'"):
        L.ReLU(n.dta)
    assert [layer["name"] for layer in n.to_dict()["layers"]] == ["data"]  # the failed layers were not added
    n.a, _ = L.DummyData(shape=[dict(dim=[1]), dict(dim=[1])], ntop=2)
    with pytest.raises(ConfigError, match="a DummyData layer has tops that were never assigned"):
        n.to_yaml()
