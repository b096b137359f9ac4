"""The random values netspec draws on the CPU against NumPy's own generator drawing as many float32 values.

    python benchmarks/random_draws.py [--repeats N] [--threads T]

Each row runs one layer's forward pass that draws (DummyData with a
gaussian, uniform or randint filler; Dropout in training) on a batch of the
size the reference timing nets draw, and times NumPy's ``Generator``
(PCG64) drawing the same number of float32 values with ``random`` (or
``standard_normal`` for the gaussian rows), as the median of N runs after a
warm-up, the two sides' runs taken in turns so that a busy moment of the
machine slows both.  netspec's draws are a hash of (seed, rank, layer, draw, index), so
they resume and agree across devices; NumPy's generator is stateful.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

# isort: off
import netspec  # before NumPy, so that it sizes the math libraries' thread pools (netspec.threads)
import numpy
# isort: on

import yaml

from netspec.engine.net import load_net

SHAPES = {"CIFAR-10 quick (100)": [100, 3, 32, 32], "AlexNet (32)": [32, 3, 227, 227]}
FILLERS = {"gaussian": {"type": "gaussian", "std": 1.0}, "uniform": {"type": "uniform", "min": -1, "max": 1},
           "randint": {"type": "randint", "min": 0, "max": 1000}}


def dummy_data(shape: list[int], filler: dict):
    """A TRAIN net of one DummyData layer drawing ``shape`` with ``filler`` at each pass."""
    layer = {"name": "data", "type": "DummyData", "top": "data",
             "dummy_data_param": {"shape": [{"dim": shape}], "data_filler": [filler]}}
    return load_net(yaml.safe_dump({"layers": [layer]}), phase="TRAIN", seed=0)


def dropout(shape: list[int]):
    """A TRAIN net of an Input and a Dropout (ratio 0.5) on it."""
    layers = [{"name": "data", "type": "Input", "top": "data", "input_param": {"shape": [{"dim": shape}]}},
              {"name": "drop", "type": "Dropout", "bottom": "data", "top": "out"}]
    return load_net(yaml.safe_dump({"layers": layers}), phase="TRAIN", seed=0)


def medians_in_turns(first, second, repeats: int) -> tuple[float, float]:
    """The median wall times (ms) of ``first()`` and ``second()`` over ``repeats`` runs each, taken in turns
    after two warm-up runs of each."""
    times: tuple[list[float], list[float]] = ([], [])
    for repeat in range(repeats + 2):
        for function, kept in zip((first, second), times):
            start = time.perf_counter()
            function()
            if repeat >= 2:
                kept.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[0]), 1000 * statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side")
    parser.add_argument("--threads", type=int, default=netspec.threads.all_cores(), help="netspec's threads")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    netspec.threads.use_threads(args.threads)
    generator = numpy.random.default_rng(0)
    print(f"{'draw':<46} {'values':>10} {'netspec ms':>10} {'NumPy ms':>9} {'ratio':>6}")
    for batch, shape in SHAPES.items():
        count = math.prod(shape)
        rows = [(f"DummyData {kind}", dummy_data(shape, filler), kind == "gaussian")
                for kind, filler in FILLERS.items()]
        rows.append(("Dropout (mask, product)", dropout(shape), False))
        for name, net, normal in rows:
            draw = generator.standard_normal if normal else generator.random
            ours, theirs = medians_in_turns(net.forward, lambda: draw(count, dtype=numpy.float32),  # noqa: B023
                                            args.repeats)
            print(f"{name + ', ' + batch:<46} {count:>10,} {ours:>10.2f} {theirs:>9.2f} {theirs / ours:>6.2f}")


if __name__ == "__main__":
    main()
