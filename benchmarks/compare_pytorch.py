"""Training throughput of netspec against PyTorch eager on the same nets, batch and machine.

    python benchmarks/compare_pytorch.py [NET.yaml[@BATCH] ...] [--iterations N] [--threads T]

For each net (default: LeNet and CIFAR-10 quick) this times forward+backward
with ``netspec time``'s code and with an equivalent PyTorch module built
from the same compiled graph, then prints both throughputs and their ratio.
``NET.yaml@32`` times the net with batch 32 (the first axis of its DummyData
and Input tops).
PyTorch is needed only here (``pip install torch``); netspec never imports it.
"""

from __future__ import annotations

import argparse
import sys
import time

# isort: off
import netspec  # before NumPy, so that it sizes the math libraries' thread pools (netspec.threads)
import numpy
# isort: on

from netspec.engine.net import Net, compile_net
from netspec.engine.registry import layer_schemas
from netspec.inspect.timing import time_net
from netspec.layers.pooling import pool_geometry
from netspec.spec.net_spec import parse_net

INPUT_TYPES = ("DummyData", "Input")
DEFAULT_NETS = ["configs/lenet/lenet_timing.yaml", "configs/cifar10/cifar10_quick_timing.yaml"]


def load(argument: str):
    """The TRAIN net of ``NET.yaml`` or ``NET.yaml@BATCH`` (batch: the first axis of its input tops)."""
    path, _, batch = argument.partition("@")
    spec = parse_net(path, layer_schemas())
    for layer in spec.layers:
        if batch and layer.type in INPUT_TYPES:
            block = layer.blocks["dummy_data_param" if layer.type == "DummyData" else "input_param"]
            for shape in block.shape:
                shape.dim[0] = int(batch)
    return Net(compile_net(spec, phase="TRAIN"), seed=0)


def torch_forward(net, torch):
    """A function computing the same loss as ``net`` with torch ops, and the tensors it reads."""
    functional = torch.nn.functional
    params = {name: [torch.tensor(numpy.array(b.data), requires_grad=True) for b in blobs]
              for name, blobs in net.params.items()}
    inputs = {name: torch.tensor(numpy.array(blob.data)) for node, tops in zip(net.nodes, net.top_blobs)
              if not node.bottoms for name, blob in zip(node.tops, tops)}

    def run():
        values = dict(inputs)
        loss = 0
        absorbed = set()  # a Scale right after a BatchNorm: PyTorch's affine batch_norm does both
        for index, node in enumerate(net.nodes):
            if index in absorbed:
                continue
            layer = net.layer_by_name[node.name]
            kind = layer.type
            x = [values[b] for b in node.bottoms]
            w = params.get(node.name, [])
            if kind in INPUT_TYPES + ("HDF5Data",):
                continue
            if kind == "Convolution":
                geo = layer.geometry(node.bottom_shapes[0])
                y = functional.conv2d(x[0], w[0], w[1] if len(w) > 1 else None, geo.stride, geo.pad, geo.dilation,
                                      layer.params.group)
            elif kind == "Pooling":
                p = layer.block("pooling_param")
                geo = pool_geometry(p, node.bottom_shapes[0])
                pool = functional.max_pool2d if p.pool == "MAX" else functional.avg_pool2d
                y = pool(x[0], geo.kernel, geo.stride, geo.pad, ceil_mode=True)
            elif kind == "InnerProduct":
                y = functional.linear(x[0].flatten(1), w[0], w[1] if len(w) > 1 else None)
            elif kind == "ReLU":
                y = functional.relu(x[0])
            elif kind == "LRN":
                p = layer.block("lrn_param")
                y = functional.local_response_norm(x[0], p.local_size, p.alpha, p.beta, p.k)
            elif kind == "BatchNorm" and not layer.global_stats:
                p = layer.block("batch_norm_param")
                stats = [torch.zeros(x[0].shape[1]), torch.ones(x[0].shape[1])]
                after = net.nodes[index + 1] if index + 1 < len(net.nodes) else None
                affine = [None, None]
                if after is not None and after.layer.type == "Scale" and after.bottoms == node.tops == after.tops:
                    absorbed.add(index + 1)
                    affine = (params[after.name] + [None])[:2]
                y = functional.batch_norm(x[0], *stats, *affine, training=True,
                                          momentum=1 - p.moving_average_fraction, eps=p.eps)
            elif kind == "Dropout":
                y = functional.dropout(x[0], layer.block("dropout_param").dropout_ratio, training=True)
            elif kind == "Scale" and layer.fast is not None:  # (a learned factor per channel)
                shape = (1, -1) + (1,) * (x[0].dim() - 2)
                y = x[0] * w[0].reshape(shape) + (w[1].reshape(shape) if len(w) > 1 else 0)
            elif kind == "Eltwise" and layer.block("eltwise_param").operation == "SUM":
                y = sum(value * c for value, c in zip(x, layer.coefficients(len(x))))
            elif kind == "Split":
                y = [x[0]] * len(node.tops)
            elif kind == "SoftmaxWithLoss":
                y = functional.cross_entropy(x[0], x[1].long())
                loss = loss + y
            elif kind == "Accuracy":
                continue
            else:
                raise SystemExit(f"compare_pytorch: no PyTorch translation for layer type {kind}")
            for name, value in zip(node.tops, y if isinstance(y, list) else [y]):
                values[name] = value
        return loss

    return run, [p for blobs in params.values() for p in blobs]


def time_torch(run, parameters, iterations: int, warmup: int) -> float:
    """Milliseconds per forward+backward iteration."""
    for _ in range(warmup):
        run().backward()
    start = time.perf_counter()
    for _ in range(iterations):
        for p in parameters:
            p.grad = None
        run().backward()
    return 1000 * (time.perf_counter() - start) / iterations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nets", nargs="*", default=DEFAULT_NETS)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=netspec.threads.all_cores(), help="for both frameworks")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: printing netspec's figures only (pip install torch to compare)")
    netspec.threads.use_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"{'net':<16} {'batch':>5} {'netspec img/s':>14} {'pytorch img/s':>14} {'ratio':>6}")
    for path in args.nets:
        net = load(path)
        ours = time_net(net, iterations=args.iterations, warmup=args.warmup)
        line = f"{net.name:<16} {ours['batch_size']:>5} {ours['images_per_s']:>14.1f}"
        if torch is not None:
            run, parameters = torch_forward(net, torch)
            theirs = ours["batch_size"] / (time_torch(run, parameters, args.iterations, args.warmup) / 1000)
            line += f" {theirs:>14.1f} {ours['images_per_s'] / theirs:>6.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
