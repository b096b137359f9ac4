"""The forward time of each layer added after Caffe's core, against PyTorch's equivalent op, on the CPU.

    python benchmarks/layers_vs_pytorch.py [TYPE ...] [--repeats N] [--rounds R] [--threads T]

Each row builds a net of one Input and the layer (float32, its weights
drawn from +-0.1) for forward passes only (``inference=True``, as PyTorch
runs under no_grad), fills the input, and times the layer's forward pass alone
against the PyTorch op that computes the same thing on the same arrays
(eager, under no_grad), both after warm-up, as the median of N runs, with
the same thread count, each framework in a process of its own, the two
processes in turns for R rounds (``--rounds``; the ratio is the median of
the rounds' ratios); a row whose two tops differ says so.  The shapes are
ones a real net feeds the layer.
Rows whose PyTorch op computes a little more or less say so in their note.
PyTorch is needed only here (``pip install torch``); netspec never imports it.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# isort: off
import netspec  # before NumPy, so that it sizes the math libraries' thread pools (netspec.threads)
import numpy
# isort: on

import yaml

from netspec.engine.net import load_net


@dataclass
class Row:
    """One layer at one shape, and the PyTorch code that computes the same top from the same inputs."""

    type: str
    shapes: list[tuple[int, ...]]
    params: dict
    torch_op: Callable  # (torch, torch.nn.functional, bottoms, the layer's blobs; as tensors) -> () -> top
    note: str = ""
    integers: dict[int, int] = field(default_factory=dict)  # bottom index -> values drawn from range(n)
    fixed: dict[int, Callable] = field(default_factory=dict)  # bottom index -> its values for a shape


def contrastive(torch, a, b, sim, margin=1.0):
    """Caffe's ContrastiveLoss in PyTorch."""
    d = torch.linalg.vector_norm(a - b, dim=1)
    return (sim * d ** 2 + (1 - sim) * torch.clamp(margin - d, min=0) ** 2).sum() / (2 * len(a))


def first_step_zero(shape):
    """Caffe's sequence-continuation flags for one sequence per column: 0 at the first step, 1 after."""
    cont = numpy.ones(shape)
    cont[0] = 0
    return cont


def lstm(torch, x, params):
    """torch's LSTM with the layer's weights (Caffe's gate order i, f, o, g; torch's i, f, g, o)."""
    w_xc, b_c, w_hc = params
    hidden = w_hc.shape[1]
    order = torch.cat([torch.arange(0, 2 * hidden), torch.arange(3 * hidden, 4 * hidden),
                       torch.arange(2 * hidden, 3 * hidden)])
    module = torch.nn.LSTM(x.shape[2], hidden)
    module.weight_ih_l0.data, module.weight_hh_l0.data = w_xc[order], w_hc[order]
    module.bias_ih_l0.data, module.bias_hh_l0.data = b_c[order], torch.zeros_like(b_c)
    return lambda: module(x)[0]


def attention(torch, x, params):
    """torch's MultiheadAttention (batch first) with the layer's weights."""
    width = x.shape[2]
    module = torch.nn.MultiheadAttention(width, 8, batch_first=True)
    module.in_proj_weight.data, module.in_proj_bias.data = params[0], params[1]
    module.out_proj.weight.data, module.out_proj.bias.data = params[2], params[3]
    return lambda: module(x, x, x, need_weights=False)[0]


ROWS = [
    Row("Deconvolution", [(8, 64, 56, 56)],
        {"convolution_param": {"num_output": 64, "kernel_size": 4, "stride": 2, "pad": 1}},
        lambda torch, fn, x, p: lambda: fn.conv_transpose2d(x[0], p[0], p[1], stride=2, padding=1)),
    Row("Crop", [(8, 21, 120, 120), (8, 1, 100, 100)], {"crop_param": {"axis": 2, "offset": 10}},
        lambda torch, fn, x, p: lambda: x[0][:, :, 10:110, 10:110].contiguous()),
    Row("Embed", [(64, 128)], {"embed_param": {"input_dim": 10_000, "num_output": 256}},
        lambda torch, fn, x, p: lambda: fn.embedding(x[0].long(), p[0]) + p[1], integers={0: 10_000}),
    Row("LSTM", [(64, 32, 256), (64, 32)], {"recurrent_param": {"num_output": 256}},
        lambda torch, fn, x, p: lstm(torch, x[0], p), "32 sequences of 64 steps", fixed={1: first_step_zero}),
    Row("SPP", [(8, 256, 16, 16)], {"spp_param": {"pyramid_height": 3}},
        lambda torch, fn, x, p: lambda: torch.cat([fn.adaptive_max_pool2d(x[0], 2 ** i).flatten(1)
                                                  for i in range(3)], 1),
        "torch: adaptive max pooling at 1, 2, 4 bins (the same bins when they divide the map)"),
    Row("Pooling", [(32, 512, 14, 14)], {"pooling_param": {"pool": "AVE", "output_size": 7}},
        lambda torch, fn, x, p: lambda: fn.adaptive_avg_pool2d(x[0], 7), "adaptive, output 7x7 (dividing)"),
    Row("Pooling", [(32, 256, 13, 13)], {"pooling_param": {"pool": "MAX", "output_size": 6}},
        lambda torch, fn, x, p: lambda: fn.adaptive_max_pool2d(x[0], 6), "adaptive, output 6x6 (windows overlap)"),
    Row("Im2col", [(8, 64, 56, 56)], {"convolution_param": {"kernel_size": 3, "pad": 1}},
        lambda torch, fn, x, p: lambda: fn.unfold(x[0], 3, padding=1).view(8, 576, 56, 56)),
    Row("Convolution", [(32, 144, 56, 56)],
        {"convolution_param": {"num_output": 144, "group": 144, "kernel_size": 3, "pad": 1}},
        lambda torch, fn, x, p: lambda: fn.conv2d(x[0], p[0], p[1], padding=1, groups=144),
        "depthwise (group = channels), as in MobileNetV2"),
    Row("LayerNorm", [(32, 197, 768)], {"layer_norm_param": {"axis": 2}},
        lambda torch, fn, x, p: lambda: fn.layer_norm(x[0], (768,), p[0], p[1])),
    Row("GELU", [(32, 197, 3072)], {},
        lambda torch, fn, x, p: lambda: fn.gelu(x[0])),
    Row("MatMul", [(384, 197, 64), (384, 197, 64)], {"mat_mul_param": {"transpose_b": True}},
        lambda torch, fn, x, p: lambda: torch.matmul(x[0], x[1].transpose(1, 2))),
    Row("MultiHeadAttention", [(32, 64, 256)], {"multi_head_attention_param": {"num_heads": 8}},
        lambda torch, fn, x, p: attention(torch, x[0], p)),
    Row("ReLU6", [(32, 96, 56, 56)], {}, lambda torch, fn, x, p: lambda: fn.relu6(x[0])),
    Row("HardSigmoid", [(32, 96, 56, 56)], {"hard_sigmoid_param": {"alpha": 1 / 6}},
        lambda torch, fn, x, p: lambda: fn.hardsigmoid(x[0])),
    Row("HardSwish", [(32, 96, 56, 56)], {}, lambda torch, fn, x, p: lambda: fn.hardswish(x[0])),
    Row("Swish", [(32, 96, 56, 56)], {}, lambda torch, fn, x, p: lambda: fn.silu(x[0])),
    Row("Permute", [(32, 96, 56, 56)], {"permute_param": {"order": [0, 2, 3, 1]}},
        lambda torch, fn, x, p: lambda: x[0].permute(0, 2, 3, 1).contiguous()),
    Row("Tile", [(256, 1024)], {"tile_param": {"axis": 1, "tiles": 4}},
        lambda torch, fn, x, p: lambda: x[0].repeat(1, 4)),
    Row("BatchReindex", [(256, 4096), (256,)], {},
        lambda torch, fn, x, p: lambda: x[0].index_select(0, x[1].long()), integers={1: 256}),
    Row("ContrastiveLoss", [(4096, 128), (4096, 128), (4096,)], {},
        lambda torch, fn, x, p: lambda: contrastive(torch, *x), integers={2: 2}),
    Row("MultinomialLogisticLoss", [(1024, 1000), (1024,)], {},
        lambda torch, fn, x, p: lambda: fn.nll_loss(torch.log(torch.clamp(x[0], min=1e-20)), x[1].long()),
        integers={1: 1000}),
]


def build(row: Row, rng: numpy.random.Generator):
    """The net of an Input and the row's layer, its input filled: (net, the layer's index, bottom arrays)."""
    names = [f"b{i}" for i in range(len(row.shapes))]
    layers = [{"name": "input", "type": "Input", "top": names,
               "input_param": {"shape": [{"dim": list(s)} for s in row.shapes]}},
              {"name": "layer", "type": row.type, "bottom": names, "top": "top", **row.params}]
    net = load_net(yaml.safe_dump({"layers": layers}), phase="TEST", inference=True, seed=0)  # (as torch's no_grad)
    for blob in net.layers[-1].blobs:
        blob.data[...] = rng.uniform(-0.1, 0.1, blob.shape)
    bottoms = []
    for i, (name, shape) in enumerate(zip(names, row.shapes)):
        if i in row.fixed:
            values = row.fixed[i](shape)
        elif i in row.integers:
            values = rng.integers(0, row.integers[i], shape)
        else:
            values = rng.uniform(0.01, 1, shape)
        net.blobs[name].data[...] = values
        bottoms.append(net.blobs[name].data)
    return net, len(net.layers) - 1, bottoms


def median_ms(function, repeats: int) -> float:
    """The median wall time of ``function()`` over ``repeats`` runs, after two warm-up runs."""
    for _ in range(2):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_side(side: str, rows: list[Row], repeats: int, threads: int) -> list[dict]:
    """Time every row on one side ("netspec" or "torch"); the torch side also checks the tops agree."""
    netspec.threads.use_threads(threads)
    if side == "torch":
        import torch  # only here: netspec never imports it
        import torch.nn.functional as fn

        torch.set_num_threads(threads)
    rng = numpy.random.default_rng(0)
    results = []
    for row in rows:
        net, index, bottoms = build(row, rng)
        if side == "netspec":
            results.append({"ms": median_ms(functools.partial(net.forward_layer, index), repeats)})
            continue
        net.forward_layer(index)
        with torch.no_grad():
            inputs = [torch.from_numpy(b) for b in bottoms]
            blobs = [torch.from_numpy(blob.data) for blob in net.layers[index].blobs]
            op = row.torch_op(torch, fn, inputs, blobs)
            results.append({"ms": median_ms(op, repeats),
                            "same": bool(numpy.allclose(op().numpy(), net.blobs["top"].data, rtol=1e-3, atol=1e-4))})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("types", nargs="*", help="layer types to time (default: every row)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side")
    parser.add_argument("--threads", type=int, default=netspec.threads.all_cores(), help="for both frameworks")
    parser.add_argument("--rounds", type=int, default=3, help="times each side runs, in turns")
    parser.add_argument("--side", choices=["netspec", "torch"], help=argparse.SUPPRESS)  # one side, in a child
    args = parser.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    unknown = sorted(set(args.types) - {row.type for row in ROWS})
    if unknown:
        parser.error(f"no row times {', '.join(unknown)}; the rows' types: "
                     f"{', '.join(sorted({row.type for row in ROWS}))}")
    rows = [row for row in ROWS if not args.types or row.type in args.types]
    if args.side:
        print(json.dumps(time_side(args.side, rows, args.repeats, args.threads)))
        return
    # each framework in a process of its own (two OpenMP pools in one process slow each other down), the two in
    # turns, round after round, so that a busy moment of the machine does not fall on one side only
    rounds: list[dict[str, list[dict]]] = []
    for number in range(args.rounds):
        rounds.append({})
        for side in ("netspec", "torch")[::1 if number % 2 == 0 else -1]:  # (each side first in every other round)
            child = subprocess.run([sys.executable, __file__, *args.types, "--repeats", str(args.repeats),
                                    "--threads", str(args.threads), "--side", side],
                                   capture_output=True, text=True, check=True)
            rounds[-1][side] = json.loads(child.stdout.splitlines()[-1])
    print(f"{'layer':<24} {'bottom shape':<22} {'netspec ms':>10} {'torch ms':>9} {'ratio':>6}  note "
          f"(the ratio: the median of {args.rounds} rounds')")
    for index, row in enumerate(rows):
        ours = statistics.median(sides["netspec"][index]["ms"] for sides in rounds)
        theirs = statistics.median(sides["torch"][index]["ms"] for sides in rounds)
        ratio = statistics.median(sides["torch"][index]["ms"] / sides["netspec"][index]["ms"] for sides in rounds)
        same = all(sides["torch"][index]["same"] for sides in rounds)
        shape = "x".join(map(str, row.shapes[0]))
        note = row.note if same else f"TOPS DIFFER {row.note}"
        print(f"{row.type:<24} {shape:<22} {ours:>10.3f} {theirs:>9.3f} {ratio:>6.2f}  {note}")


if __name__ == "__main__":
    main()
