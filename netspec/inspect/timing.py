"""Per-layer timing of forward and backward passes (``netspec time``)."""

from __future__ import annotations

import time

from netspec.engine.net import Net
from netspec.threads import thread_counts


def time_net(net: Net, iterations: int = 50, warmup: int = 5) -> dict:
    """Run ``warmup`` untimed iterations, then ``iterations`` timed ones; return averages in ms.

    Each layer's pass is timed between two marks in the device's queue
    (:meth:`Backend.mark`: CUDA events on a GPU, read once an iteration is
    done, so the layers run as in training, without a wait between them).

    The result holds ``paths`` (:meth:`Net.paths`), ``threads`` (the math
    libraries' pools), ``ms_per_iter``, ``forward_ms``, ``backward_ms``,
    ``images_per_s`` (batch size of the first top over the time per
    iteration), ``layers``, a list of per-layer forward/backward times,
    ``blob_bytes`` (:meth:`Net.memory_bytes`) and ``peak_bytes`` with
    ``peak_of`` (:meth:`Backend.peak_memory`, after the timed passes).
    """
    backend = net.backend
    count = len(net.layers)
    forward = [0.0] * count
    backward = [0.0] * count
    for _ in range(warmup):
        net.forward_backward()
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        net.clear_param_diffs()
        marks = [backend.mark()]
        for index in range(count):
            net.forward_layer(index)
            marks.append(backend.mark())
        for index in reversed(range(count)):
            net.backward_layer(index)
            marks.append(backend.mark())
        spans = [backend.elapsed_ms(begin, end) for begin, end in zip(marks, marks[1:])]
        for index in range(count):
            forward[index] += spans[index]
            backward[index] += spans[2 * count - 1 - index]
    total = time.perf_counter() - start
    backend.raise_checks()
    peak, peak_of = backend.peak_memory()
    ms_per_iter = 1000 * total / iterations
    batch = net.batch_size
    layers = [{"name": layer.name, "type": layer.type, "forward_ms": f / iterations, "backward_ms": b / iterations}
              for layer, f, b in zip(net.layers, forward, backward)]
    return {
        "net": net.name,
        "phase": net.phase,
        "device": backend.device,
        "paths": net.paths(),
        "threads": thread_counts(),
        "iterations": iterations,
        "batch_size": batch,
        "ms_per_iter": ms_per_iter,
        "forward_ms": sum(x["forward_ms"] for x in layers),
        "backward_ms": sum(x["backward_ms"] for x in layers),
        "images_per_s": batch / (ms_per_iter / 1000),
        "layers": layers,
        "blob_bytes": net.memory_bytes(),
        "peak_bytes": peak,
        "peak_of": peak_of,
    }
