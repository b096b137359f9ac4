"""Where a netspec training iteration's time goes on a GPU: the host's time against the GPU's, and on what.

    python benchmarks/gpu_profile.py [NET.yaml[@BATCH] ...] [--device gpu[:N]] [--iterations N] [--calls N]

For each net (default: LeNet b64 and CIFAR-10 quick b100) this runs the
iteration ``compare_pytorch.py --device gpu`` times (forward and backward)
and prints:

- the time of an iteration with the GPU kept busy (many in a row, one
  synchronisation), and the host's time to enqueue one (a few in a row behind
  an idle GPU): where the two are close, the GPU waits for the host, and fewer
  or cheaper calls are what make the net faster;
- with PyTorch installed, the CUDA kernels by their GPU time (PyTorch's
  profiler records every kernel of the process, CuPy's and cuBLAS's too) and
  the GPU's busy time per iteration;
- the host's calls by their own time (cProfile; CuPy's compiled functions show
  as built-ins, and the time of an ``ElementwiseKernel`` launch as its caller's).

On the GPU stand-in (``NETSPEC_GPU_STANDIN=1``) it runs, but its figures are
NumPy's on the CPU.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from compare_pytorch import load, netspec_step, timed  # (it imports netspec before NumPy, as netspec.threads needs)

DEFAULT_NETS = ["configs/lenet/lenet_timing.yaml@64", "configs/cifar10/cifar10_quick_timing.yaml@100"]


def enqueue_time(step, synchronize, calls: int = 5) -> float:
    """Milliseconds the host takes to make one call of ``step``, over ``calls`` in a row after the device is idle
    (few enough that the GPU's queue never fills and holds the host back)."""
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    host = 1000 * (time.perf_counter() - start) / calls
    synchronize()
    return host


def kernel_table(step, synchronize, iterations: int, rows: int) -> None:
    """Print the CUDA kernels of ``iterations`` calls of ``step`` by GPU time (PyTorch's profiler), if PyTorch is
    installed."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("(PyTorch is not installed: no kernel table; pip install torch)")
        return
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(iterations):
            step()
        synchronize()
    events = profiler.key_averages()
    busy = sum(event.self_device_time_total for event in events) / 1000 / iterations
    print(f"GPU busy {busy:.3f} ms an iteration; kernels over {iterations} iterations:")
    print(events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60))


def host_calls(step, synchronize, iterations: int, rows: int) -> None:
    """Print the host's calls during ``iterations`` calls of ``step`` by their own time (cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iterations):
        step()
    synchronize()
    profiler.disable()
    print(f"host calls over {iterations} iterations, by their own time:")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nets", nargs="*")
    parser.add_argument("--device", default="gpu", help="gpu or gpu:N")
    parser.add_argument("--iterations", type=int, default=200, help="timed iterations (a tenth are profiled)")
    parser.add_argument("--calls", type=int, default=40, help="rows of each table")
    args = parser.parse_args()
    for path in args.nets or DEFAULT_NETS:
        net = load(path, device=args.device)
        step, synchronize = netspec_step(net), net.backend.synchronize
        for _ in range(20):  # (kernels compiled, memory pools filled)
            step()
        busy = timed(step, args.iterations, 0, synchronize)
        print(f"== {net.name} batch {net.batch_size} on {args.device}: {busy:.3f} ms an iteration with the GPU kept "
              f"busy; the host enqueues one in {enqueue_time(step, synchronize):.3f} ms", flush=True)
        profiled = max(1, args.iterations // 10)
        kernel_table(step, synchronize, profiled, args.calls)
        host_calls(step, synchronize, profiled, args.calls)
        net.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
