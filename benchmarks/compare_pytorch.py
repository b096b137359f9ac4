"""netspec against PyTorch eager on the same nets, batch and machine: training and inference speed, memory.

    python benchmarks/compare_pytorch.py [NET.yaml[@BATCH] ...] [--iterations N] [--threads T]
                                         [--inference | --memory | --device gpu[:N] [--cuda-graph]
                                         [--precision fp32|tf32|bf16-mixed|fp16-mixed]] [--rounds R]

For each net (default: LeNet and CIFAR-10 quick) this times forward+backward
with ``netspec time``'s code and with an equivalent PyTorch module built
from the same compiled graph, then prints both throughputs and their ratio.
``NET.yaml@32`` times the net with batch 32 (the first axis of its DummyData
and Input tops).  ``--inference`` times forward passes of deploy nets instead
(default: the deploy nets of LeNet, CIFAR-10 quick, AlexNet and ResNet-50),
built for inference (folded), against PyTorch in eval mode under no_grad and
onnxruntime (if installed) on the model ``netspec export onnx`` writes, each
framework in a process of its own, the three in turn for ``--rounds`` rounds
(the medians printed).
``--memory`` runs a few training steps of each net in a process of each
framework and prints the peak resident memory the steps took beyond the
process's size after its imports.  ``--device gpu`` times training on the GPU
(default: LeNet b64, CIFAR-10 quick b100, AlexNet b128, ResNet-50 b32), data
on the GPU, fp32 with TF32 off in both frameworks and ``cudnn.benchmark`` on in
PyTorch, each iteration timed whole (one synchronisation per timed run), the
two frameworks in turn for ``--rounds`` rounds (the medians printed: a small
net's time is the host's, and the host's speed drifts), and prints the peak
GPU memory of each (CuPy's pool, PyTorch's allocator) and the versions of
everything involved.  With ``--cuda-graph`` netspec's iteration is captured as
one CUDA graph once warm and launched for each (as ``netspec train
--cuda-graph`` trains), and PyTorch is timed both eager and as a step
captured by hand with ``torch.cuda.graph`` (default nets: LeNet b64, CIFAR-10
quick b100, ResNet-20 on CIFAR-10 b128).  ``--precision tf32`` lets both
frameworks run float32 products and convolutions on TF32 tensor cores;
``--precision bf16-mixed`` (``fp16-mixed``) has them take bfloat16 (float16)
operands (PyTorch under ``torch.autocast`` with that type; neither scales
the loss here).  ``--inference --device gpu`` times forward passes of the
deploy nets built for inference (folded) on the GPU against PyTorch under
``no_grad`` (default: LeNet b64, CIFAR-10 quick b100, AlexNet b128,
ResNet-50 b64), in the precision asked.
PyTorch is needed only here (``pip install torch``); netspec never imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# isort: off
import netspec  # before NumPy, so that it sizes the math libraries' thread pools (netspec.threads)
import numpy
# isort: on

from netspec.engine import capture
from netspec.engine.backend import Backend, gpu_report
from netspec.engine.net import Net, compile_net
from netspec.engine.registry import layer_schemas
from netspec.errors import DeviceError
from netspec.inspect.timing import time_net
from netspec.layers.pooling import pool_geometry
from netspec.spec.net_spec import parse_net

INPUT_TYPES = ("DummyData", "Input")
DEFAULT_NETS = ["configs/lenet/lenet_timing.yaml", "configs/cifar10/cifar10_quick_timing.yaml"]
DEFAULT_GPU_NETS = ["configs/lenet/lenet_timing.yaml@64", "configs/cifar10/cifar10_quick_timing.yaml@100",
                    "configs/alexnet/alexnet_timing.yaml@128", "configs/resnet50/resnet50_timing.yaml@32"]
DEFAULT_GRAPH_NETS = ["configs/lenet/lenet_timing.yaml@64", "configs/cifar10/cifar10_quick_timing.yaml@100",
                      "configs/resnet20_cifar10/resnet20_cifar10_timing.yaml@128"]
DEFAULT_DEPLOY_NETS = ["configs/lenet/lenet_deploy.yaml@64", "configs/cifar10/cifar10_quick_deploy.yaml@100",
                       "configs/alexnet/alexnet_deploy.yaml@32", "configs/resnet50/resnet50_deploy.yaml@8"]
DEFAULT_GPU_DEPLOY_NETS = ["configs/lenet/lenet_deploy.yaml@64", "configs/cifar10/cifar10_quick_deploy.yaml@100",
                           "configs/alexnet/alexnet_deploy.yaml@128", "configs/resnet50/resnet50_deploy.yaml@64"]


def load(argument: str, inference: bool = False, device: str = "cpu", precision: str = "fp32"):
    """The TRAIN net of ``NET.yaml`` or ``NET.yaml@BATCH`` (batch: the first axis of its input tops) on
    ``device`` (its products and convolutions in ``precision``), or with ``inference`` its TEST net built
    for inference; BatchNorm statistics set to plausible values.  Blobs share buffers where their lifetimes allow,
    as in ``netspec train`` and ``netspec predict``."""
    path, _, batch = argument.partition("@")
    spec = parse_net(path, layer_schemas())
    for layer in spec.layers:
        if batch and layer.type in INPUT_TYPES:
            block = layer.blocks["dummy_data_param" if layer.type == "DummyData" else "input_param"]
            for shape in block.shape:
                shape.dim[0] = int(batch)
    backend = Backend(device, seed=0)
    backend.precision = precision
    net = Net(compile_net(spec, phase="TEST" if inference else "TRAIN"), backend=backend, inference=inference,
              reuse_memory=True)
    for layer in net.layers:
        if layer.type == "BatchNorm":
            for blob, value in zip(layer.blobs, (0.1, 1.0, 1.0)):  # mean and variance sums, factor
                blob.data[...] = value
    return net


def torch_forward(net, torch, batch: int | None = None):
    """A function computing the same loss as ``net`` with torch ops (in inference nets: its last output), and
    the tensors it reads, on the device of ``net`` (its GPU: CUDA's); ``batch`` repeats the net's inputs to
    that batch size."""
    functional = torch.nn.functional
    where = torch.device(f"cuda:{net.backend.device.partition(':')[2] or 0}" if net.backend.is_gpu else "cpu")

    def tensor(array, requires_grad: bool = False):
        return torch.tensor(numpy.array(net.backend.to_host(array)), device=where, requires_grad=requires_grad)

    params = {name: [tensor(b.data, requires_grad=not net.inference) for b in blobs]
              for name, blobs in net.params.items()}
    inputs = {name: tensor(blob.data) for node, tops in zip(net.nodes, net.top_blobs)
              if not node.bottoms for name, blob in zip(node.tops, tops)}
    if batch is not None:
        inputs = {name: value.repeat(batch // value.shape[0], *[1] * (value.dim() - 1))
                  for name, value in inputs.items()}
    # each BatchNorm's mean and variance, on the device once (a copy within a pass would stop a capture)
    statistics = {name: [tensor(statistic) for statistic in layer.stored_statistics()]
                  for name, layer in net.layer_by_name.items() if layer.type == "BatchNorm"}

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
            elif kind == "ReLU6":
                y = functional.relu6(x[0])
            elif kind == "LRN":
                p = layer.block("lrn_param")
                y = functional.local_response_norm(x[0], p.local_size, p.alpha, p.beta, p.k)
            elif kind == "BatchNorm":
                p = layer.block("batch_norm_param")
                stats = statistics[node.name]
                after = net.nodes[index + 1] if index + 1 < len(net.nodes) else None
                affine = [None, None]
                if after is not None and after.layer.type == "Scale" and after.bottoms == node.tops == after.tops:
                    absorbed.add(index + 1)
                    affine = (params[after.name] + [None])[:2]
                y = functional.batch_norm(x[0], *stats, *affine, training=not layer.global_stats,
                                          momentum=1 - p.moving_average_fraction, eps=p.eps)
            elif kind == "Dropout":
                y = functional.dropout(x[0], layer.block("dropout_param").dropout_ratio, training=not net.inference)
            elif kind == "Softmax":
                y = functional.softmax(x[0], dim=1)
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
        return values[net.nodes[-1].tops[0]] if net.inference else loss

    return run, [p for blobs in params.values() for p in blobs]


def timed(step, iterations: int, warmup: int, synchronize=lambda: None) -> float:
    """Milliseconds per call of ``step``, over ``iterations`` calls after ``warmup`` untimed ones; the device is
    waited for (``synchronize``) before the clock starts and before it stops, never in between."""
    for _ in range(warmup):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    synchronize()
    return 1000 * (time.perf_counter() - start) / iterations


def torch_step(run, parameters, mixed=contextlib.nullcontext):
    """One PyTorch training iteration: the gradients dropped, forward (within ``mixed()``: autocast), backward."""
    def step():
        for p in parameters:
            p.grad = None
        with mixed():
            loss = run()
        loss.backward()

    return step


def netspec_step(net):
    """One netspec training iteration, its loss left on the device."""
    def step():
        net.clear_param_diffs()
        net.device_forward()
        net.backward()

    return step


def netspec_graphed_step(net, warmup: int):
    """:func:`netspec_step` captured as one CUDA graph after ``warmup`` eager runs: its launch."""
    step = netspec_step(net)
    capture.Graph.stream_for(net.backend)
    for _ in range(warmup):
        step()
    return capture.Graph(net.backend, step).launch


def torch_inference_step(torch, run, mixed=contextlib.nullcontext):
    """One PyTorch forward pass without autograd, within ``mixed()`` (autocast)."""
    def step():
        with torch.no_grad(), mixed():
            run()

    return step


def torch_graphed_step(torch, run, parameters, warmup: int, mixed=contextlib.nullcontext):
    """:func:`torch_step` captured by hand as one CUDA graph (PyTorch's recipe: warm-up on a side stream, the
    gradients made in the capture): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            torch_step(run, parameters, mixed)()
    torch.cuda.current_stream().wait_stream(side)
    for p in parameters:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with mixed():
            loss = run()
        loss.backward()
    return graph.replay


def compare_gpu(paths: list[str], device: str, torch, iterations: int, warmup: int, rounds: int,
                graphed: bool = False, precision: str = "fp32", inference: bool = False) -> None:
    """Print the versions in play, then each net's training images/s (the median of ``rounds`` timings taken in
    turn with PyTorch's) and peak GPU memory in netspec and PyTorch on ``device``; with ``graphed``, netspec's
    iterations as a CUDA graph, against PyTorch eager and PyTorch captured; with ``inference``, forward passes of
    the nets built for inference (deploy nets) against PyTorch's without autograd; float32 products and
    convolutions in ``precision`` in both (tf32: on TF32 tensor cores; bf16-mixed, fp16-mixed: from bfloat16 or
    float16 operands, PyTorch's autocast)."""
    for line in gpu_report():
        print(line)
    mixed = contextlib.nullcontext
    if torch is not None:
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        if precision in ("bf16-mixed", "fp16-mixed"):
            mixed = functools.partial(torch.autocast, "cuda", cache_enabled=False,
                                      dtype=torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
        print(f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
              f"precision {precision}, cudnn.benchmark on")
    print(f"{'net':<16} {'batch':>5} {'netspec img/s':>14} {'pytorch img/s':>14} {'ratio':>6} "
          + (f"{'captured img/s':>15} {'ratio':>6} " if graphed else "")
          + f"{'netspec MiB':>12} {'pytorch MiB':>12} {'ratio':>6}")
    for path in paths:
        net = load(path, inference=inference, device=device, precision=precision)
        batch = net.batch_size
        step = net.device_forward if inference else netspec_graphed_step(net, warmup) if graphed else netspec_step(net)
        steps, times = {"netspec": step}, {"netspec": [], "pytorch": [], "captured": []}
        times["netspec"].append(timed(step, iterations, warmup, net.backend.synchronize))
        memory = net.backend.peak_memory()[0] / 2 ** 20
        run = parameters = None
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()
            run, parameters = torch_forward(net, torch)
            steps["pytorch"] = (torch_inference_step(torch, run, mixed) if inference
                                else torch_step(run, parameters, mixed))
            times["pytorch"].append(timed(steps["pytorch"], iterations, warmup, torch.cuda.synchronize))
            their_memory = torch.cuda.max_memory_allocated() / 2 ** 20
            if graphed:
                steps["captured"] = torch_graphed_step(torch, run, parameters, warmup, mixed)
                times["captured"].append(timed(steps["captured"], iterations, warmup, torch.cuda.synchronize))
        for _ in range(rounds - 1):
            for name, each in steps.items():
                times[name].append(timed(each, iterations, warmup,
                                         net.backend.synchronize if name == "netspec" else torch.cuda.synchronize))
        rate = {name: batch / (statistics.median(taken) / 1000) for name, taken in times.items() if taken}
        ours = rate["netspec"]
        line = f"{net.name:<16} {batch:>5} {ours:>14.1f}"
        if torch is not None:
            line += f" {rate['pytorch']:>14.1f} {ours / rate['pytorch']:>6.2f}"
            if graphed:
                line += f" {rate['captured']:>15.1f} {ours / rate['captured']:>6.2f}"
            line += f" {memory:>12.0f} {their_memory:>12.0f} {memory / their_memory:>6.2f}"
        else:
            line += f" {'':>14} {'':>6} " + (f"{'':>15} {'':>6} " if graphed else "") + f"{memory:>12.0f}"
        print(line, flush=True)
        net.close()
        pool = net.backend.xp.get_default_memory_pool()
        del net, run, parameters, steps  # the next net's peak is its own
        gc.collect()
        pool.free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()


def onnxruntime_pass(net, threads: int):
    """A function running one forward pass in onnxruntime of the model ``netspec export onnx`` writes of ``net``,
    on its inputs (None without onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:
        return None
    from netspec.interop.onnx_export import export_onnx

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "net.onnx")
        export_onnx(net, path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {name: net.blobs[name].data for name in net.data_layer().spec.tops}
    return lambda: session.run(None, feed)


INFERENCE_SIDES = ("netspec", "pytorch", "onnxruntime")


def in_child(*arguments: str) -> dict:
    """This script run in a process of its own with ``arguments`` (a child mode): what its last line says."""
    child = subprocess.run([sys.executable, __file__, *arguments], capture_output=True, text=True, check=True)
    return json.loads(child.stdout.splitlines()[-1])


def inference_child(side: str, path: str, torch, threads: int, iterations: int, warmup: int) -> None:
    """In a process of its own: print the forward images/s of one framework (``side``) on the deploy net ``path``
    (folded and frozen in netspec; PyTorch in eval mode without autograd), null where it is not installed."""
    net = load(path, inference=True)
    net.freeze()  # (its weights constants, as in netspec predict; onnxruntime's are too)
    if side == "netspec":
        run = net.forward
    elif side == "pytorch":
        run = None if torch is None else torch.no_grad()(torch_forward(net, torch)[0])
    else:
        run = onnxruntime_pass(net, threads)
    rate = None if run is None else net.batch_size / (timed(run, iterations, warmup) / 1000)
    print(json.dumps({"rate": rate, "net": net.name, "batch": net.batch_size}))


def compare_inference(paths: list[str], threads: int, iterations: int, warmup: int, rounds: int) -> None:
    """Print forward images/s of each deploy net in netspec, PyTorch and onnxruntime, and netspec's ratio to each:
    every framework timed over ``iterations`` passes in a process of its own (two thread pools in one process
    slow each other down), the three in turn, ``rounds`` times (the order turned at each round, so that a slow
    moment of the machine falls on each); the medians of the rounds' images/s and of their ratios."""
    print(f"{'net':<16} {'batch':>5} {'netspec img/s':>14} {'pytorch img/s':>14} {'ratio':>6} "
          f"{'onnxruntime img/s':>18} {'ratio':>6}  (medians of {rounds} round{'s' * (rounds > 1)})")
    for path in paths:
        rates: dict[str, list[float]] = {side: [] for side in INFERENCE_SIDES}
        for number in range(rounds):
            for side in INFERENCE_SIDES[number % 3:] + INFERENCE_SIDES[:number % 3]:
                result = in_child(path, "--inference-child", side, "--threads", str(threads), "--iterations",
                                  str(iterations), "--warmup", str(warmup))
                rates[side].append(result["rate"])
        line = f"{result['net']:<16} {result['batch']:>5} {statistics.median(rates['netspec']):>14.1f}"
        for side, width in (("pytorch", 14), ("onnxruntime", 18)):
            if None not in rates[side]:
                ratio = statistics.median(ours / theirs for ours, theirs in zip(rates["netspec"], rates[side]))
                line += f" {statistics.median(rates[side]):>{width}.1f} {ratio:>6.2f}"
        print(line, flush=True)


def peak_memory_child(framework: str, path: str, torch) -> None:
    """In a process of its own: a few training steps of one framework; print the MB its peak resident memory
    rose above the size after the imports.  PyTorch's module is translated from a batch-1 netspec net (so
    netspec's arrays stay small there) and fed inputs of the real batch."""
    def resident_mb() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    baseline = resident_mb()
    if framework == "netspec":
        net = load(path)
        batch = net.batch_size
        for _ in range(3):
            net.forward_backward()
    else:
        batch = load(path).batch_size if "@" not in path else int(path.partition("@")[2])
        net = load(path.partition("@")[0] + "@1")
        baseline = resident_mb()
        run, parameters = torch_forward(net, torch, batch)
        for _ in range(3):
            for p in parameters:
                p.grad = None
            run().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mb": peak - baseline, "net": net.name, "batch": batch}))


def compare_memory(paths: list[str]) -> None:
    """Print each net's peak training memory in netspec and in PyTorch, each in a fresh process."""
    print(f"{'net':<16} {'batch':>5} {'netspec MB':>10} {'pytorch MB':>10} {'ratio':>6}")
    for path in paths:
        figures = []
        for framework in ("netspec", "pytorch"):
            result = in_child("--memory-child", framework, path)
            figures.append(result["mb"])
        print(f"{result['net']:<16} {result['batch']:>5} {figures[0]:>10.0f} {figures[1]:>10.0f} "
              f"{figures[0] / figures[1]:>6.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nets", nargs="*")
    parser.add_argument("--inference", action="store_true", help="forward passes of deploy nets, folded")
    parser.add_argument("--memory", action="store_true", help="peak training memory, each framework apart")
    parser.add_argument("--memory-child", choices=["netspec", "pytorch"], help=argparse.SUPPRESS)
    parser.add_argument("--inference-child", choices=INFERENCE_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --inference or --device gpu: times each framework runs, in turns")
    parser.add_argument("--threads", type=int, default=netspec.threads.all_cores(), help="for both frameworks")
    parser.add_argument("--device", default="cpu", help="cpu, or gpu[:N] to compare training on a GPU")
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16-mixed", "fp16-mixed"], default="fp32",
                        help="with --device gpu: float32 products and convolutions in fp32, on TF32 tensor cores, "
                             "or from bfloat16 or float16 operands (both frameworks; PyTorch's autocast for the "
                             "mixed ones)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="with --device gpu: netspec's iterations as one CUDA graph, against PyTorch eager and "
                             "captured")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if (args.cuda_graph or args.precision != "fp32") and args.device == "cpu":
        parser.error("--cuda-graph and --precision need --device gpu[:N]")
    if args.cuda_graph and args.inference:
        parser.error("--cuda-graph times training iterations: not with --inference")
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: printing netspec's figures only (pip install torch to compare)")
    netspec.threads.use_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        peak_memory_child(args.memory_child, args.nets[0], torch)
        return 0
    if args.inference_child:
        inference_child(args.inference_child, args.nets[0], torch, args.threads, args.iterations, args.warmup)
        return 0
    if args.memory:
        compare_memory(args.nets or DEFAULT_NETS)
        return 0
    if args.device != "cpu":
        try:
            defaults = (DEFAULT_GPU_DEPLOY_NETS if args.inference else DEFAULT_GRAPH_NETS if args.cuda_graph
                        else DEFAULT_GPU_NETS)
            compare_gpu(args.nets or defaults, args.device, torch, args.iterations, args.warmup, args.rounds,
                        args.cuda_graph, args.precision, args.inference)
        except DeviceError as exc:
            print(f"compare_pytorch: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.inference:
        compare_inference(args.nets or DEFAULT_DEPLOY_NETS, args.threads, args.iterations, args.warmup, args.rounds)
        return 0
    print(f"{'net':<16} {'batch':>5} {'netspec img/s':>14} {'pytorch img/s':>14} {'ratio':>6}")
    for path in args.nets or DEFAULT_NETS:
        net = load(path)
        ours = time_net(net, iterations=args.iterations, warmup=args.warmup)
        line = f"{net.name:<16} {ours['batch_size']:>5} {ours['images_per_s']:>14.1f}"
        if torch is not None:
            run, parameters = torch_forward(net, torch)
            theirs = ours["batch_size"] / (timed(torch_step(run, parameters), args.iterations, args.warmup) / 1000)
            line += f" {theirs:>14.1f} {ours['images_per_s'] / theirs:>6.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
