"""A net's convolutions one by one on a GPU: netspec's cuDNN passes against PyTorch's.

    python benchmarks/cudnn_convolutions.py [NET.yaml[@BATCH]] [--device gpu[:N]]
                                            [--precision fp32|tf32|bf16-mixed|fp16-mixed] [--iterations N]
                                            [--rounds R] [--list]

For each distinct geometry of the net's Convolution layers (default: the
ResNet-50 timing net at batch 64) this times the three passes of one layer of
that geometry: the forward product (fprop), the input's gradient (dgrad) and
the weights' gradient (wgrad), as netspec's layer runs them (its forward
pass, and its backward pass asked for one gradient at a time: on cuDNN where
it runs, the rounding of the operands to 16 bits and the widening of the
result included under the mixed precisions) and as PyTorch makes them
(``torch.nn.functional.conv2d``, ``torch.nn.grad.conv2d_input`` and
``conv2d_weight``, ``cudnn.benchmark`` on, TF32 as ``--precision`` says, the
operands in bfloat16 or float16 for the mixed precisions).  Each time is the
median of ``--rounds`` timings of ``--iterations`` calls, the two frameworks
in turn, one synchronisation each; the totals weigh each geometry by the
layers that have it.  ``--list`` prints the geometries only (no GPU needed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

from compare_pytorch import load, timed  # (it imports netspec before NumPy, as netspec.threads needs)

from netspec.errors import DeviceError

DEFAULT_NET = "configs/resnet50/resnet50_timing.yaml@64"
PASSES = ("fprop", "dgrad", "wgrad")


def geometries(net) -> list[tuple[tuple, int]]:
    """``[((the first Convolution of a geometry, its bottoms, its tops), how many layers have that geometry)]``, in
    the net's order."""
    first: dict[tuple, int] = {}
    counts: Counter = Counter()
    for index, (layer, bottom) in enumerate(zip(net.layers, net.bottom_blobs)):
        if layer.type == "Convolution":
            geo = layer.geo
            key = (tuple(bottom[0].shape), tuple(layer.blobs[0].shape), geo.pad, geo.stride, geo.dilation,
                   layer.params.group)
            counts[first.setdefault(key, index)] += 1
    return [((net.layers[index], net.bottom_blobs[index], net.top_blobs[index]), count)
            for index, count in counts.items()]


def describe(layer, bottom) -> str:
    """A geometry in a few words: input, weights, stride, padding."""
    geo = layer.geo
    return (f"{'x'.join(map(str, bottom[0].shape))} * {'x'.join(map(str, layer.blobs[0].shape))} "
            f"s{geo.stride[0]} p{geo.pad[0]}")


def netspec_passes(layer, bottom, top) -> dict:
    """Each pass of ``layer`` as a call: its forward pass, and its backward pass making one gradient."""
    def backward(data: bool, weights: bool):
        def call():
            layer.param_propagate_down = [weights] * len(layer.blobs)
            layer.backward(top, [data], bottom)
        return call

    return {"fprop": lambda: layer.forward(bottom, top), "dgrad": backward(True, False),
            "wgrad": backward(False, True)}


def torch_passes(torch, layer, bottom, top, device: str, precision: str) -> dict:
    """The same passes in PyTorch, on copies of the layer's arrays (16-bit under the mixed precisions)."""
    geo, p = layer.geo, layer.params
    where = torch.device(f"cuda:{device.partition(':')[2] or 0}")
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision, torch.float32)

    def tensor(array):
        return torch.as_tensor(layer.backend.to_host(array), device=where).to(dtype)

    x, w, dy = tensor(bottom[0].data), tensor(layer.blobs[0].data), tensor(top[0].diff)
    options = {"stride": geo.stride, "padding": geo.pad, "dilation": geo.dilation, "groups": p.group}
    grad = torch.nn.grad
    return {"fprop": lambda: torch.nn.functional.conv2d(x, w, None, **options),
            "dgrad": lambda: grad.conv2d_input(x.shape, w, dy, **options),
            "wgrad": lambda: grad.conv2d_weight(x, w.shape, dy, **options)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("net", nargs="?", default=DEFAULT_NET, help="NET.yaml[@BATCH] (default: %(default)s)")
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16-mixed", "fp16-mixed"], default="fp32")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="print the geometries only, on the CPU")
    args = parser.parse_args()
    if args.list:
        for (layer, bottom, _), count in geometries(load(args.net)):
            print(f"{count:>3} x {layer.name:<24} {describe(layer, bottom)}")
        return 0
    try:
        net = load(args.net, device=args.device, precision=args.precision)
    except DeviceError as exc:
        print(f"cudnn_convolutions: {exc}", file=sys.stderr)
        return 1
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: printing netspec's times only (pip install torch to compare)")
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    net.device_forward()
    net.backward()  # (every diff holds a gradient: the passes start from real values)
    print(f"{net.name}, precision {args.precision}; {net.paths()}")
    print(f"{'layers':>6} {'geometry':<44} {'pass':<6} {'netspec ms':>10} {'pytorch ms':>10} {'ratio':>6}")
    totals: Counter = Counter()
    for (layer, bottom, top), count in geometries(net):
        ours = netspec_passes(layer, bottom, top)
        theirs = torch_passes(torch, layer, bottom, top, args.device, args.precision) if torch else {}
        for name in PASSES:
            times = {"netspec": [], "pytorch": []}
            for _ in range(args.rounds):
                times["netspec"].append(timed(ours[name], args.iterations, args.warmup, net.backend.synchronize))
                if theirs:
                    times["pytorch"].append(timed(theirs[name], args.iterations, args.warmup,
                                                  torch.cuda.synchronize))
            mine = statistics.median(times["netspec"])
            totals["netspec"] += count * mine
            line = f"{count:>6} {describe(layer, bottom):<44} {name:<6} {mine:>10.3f}"
            if theirs:
                other = statistics.median(times["pytorch"])
                totals["pytorch"] += count * other
                line += f" {other:>10.3f} {other / mine:>6.2f}"
            print(line, flush=True)
    summary = f"{'':>6} {'all the convolutions, each pass':<44} {'':<6} {totals['netspec']:>10.2f}"
    if torch is not None:
        summary += f" {totals['pytorch']:>10.2f} {totals['pytorch'] / totals['netspec']:>6.2f}"
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
