"""Throughput of the data pipeline: the converter, the Data layer, and training fed from LMDB.

    python benchmarks/data_pipeline.py [--workers 2] [--iterations 20] [--repeats 3] [--keep DIR]

1. ``convert imageset`` on synthetic PNG class folders of 32x32 and 256x256
   images with ``--workers``: images per second.
2. The Data layer alone on 32x32 PNG-encoded records with crop, mirror and a
   mean file: records per second delivered.
3. CIFAR-10 quick trained (SGD steps) from LMDB with the same transforms,
   with raw (the default) and with PNG-encoded records, against the same net
   fed by DummyData: images per second and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy
from PIL import Image

import netspec
from netspec.tools.imageset import ImagesetOptions, convert_imageset
from netspec.tools.mean import compute_mean
from netspec.training.log import TrainingLog

CIFAR = Path(__file__).parent.parent / "configs" / "cifar10" / "cifar10_quick_timing.yaml"


def synthetic_images(root: Path, count: int, size: int, classes: int = 10) -> None:
    """``count`` smooth random colour images (gradients plus noise, so PNG compresses as photos do)."""
    rng = numpy.random.default_rng(0)
    ramp = numpy.linspace(0, 1, size)
    for index in range(count):
        colour = rng.uniform(0, 255, (1, 1, 3))
        field = ramp[:, None, None] * colour + ramp[None, :, None] * (255 - colour) / 2
        pixels = numpy.clip(field + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(numpy.uint8)
        folder = root / f"class{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{index:06d}.png")


def time_conversion(work: Path, size: int, count: int, workers: int) -> float:
    root = work / f"png{size}"
    synthetic_images(root, count, size)
    start = time.perf_counter()
    convert_imageset(str(root), str(work / f"db{size}"), options=ImagesetOptions(workers=workers))
    return count / (time.perf_counter() - start)


def data_layers(source: Path, mean: Path, batch: int, prefetch: int) -> str:
    transform = f"{{crop_size: 28, mirror: true, mean_file: {mean}, scale: 0.0078125}}"
    return "".join(
        f"  - name: cifar\n    type: Data\n    top: [data, label]\n    include: {{phase: {phase}}}\n"
        f"    transform_param: {transform}\n"
        f"    data_param: {{source: {source}, batch_size: {batch}, prefetch: {prefetch}}}\n"
        for phase in ("TRAIN", "TEST"))


def cifar_from(source: Path, mean: Path) -> str:
    """CIFAR-10 quick with its DummyData inputs replaced by Data layers reading ``source`` (28x28 crops)."""
    text = CIFAR.read_text()
    start, end = text.index("  - name: cifar\n"), text.index("  - name: conv1\n")
    return text[:start] + data_layers(source, mean, 100, 4) + text[end:]


def cifar_dummy_28() -> str:
    """CIFAR-10 quick on DummyData inputs of the same 28x28 size as the crops."""
    return CIFAR.read_text().replace("dim: [100, 3, 32, 32]", "dim: [100, 3, 28, 28]")


def time_loader(source: Path, mean: Path, iterations: int) -> float:
    net = netspec.load_net(f"layers:\n{data_layers(source, mean, 100, 4)}"
                           "  - {name: s, type: Silence, bottom: [data, label]}\n", phase="TRAIN", seed=0)
    net.forward()
    start = time.perf_counter()
    for _ in range(iterations):
        net.forward()
    elapsed = time.perf_counter() - start
    net.close()
    return 100 * iterations / elapsed


def time_training(net_text: str, work: Path, iterations: int) -> float:
    (work / "net.yaml").write_text(net_text)
    solver_text = (f"net: {work / 'net.yaml'}\nbase_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.004\n"
                   f"max_iter: {iterations + 3}\nrandom_seed: 0\nsnapshot_prefix: {work / 'snap'}\n")
    solver = netspec.load_solver(solver_text, log=TrainingLog(quiet=True))
    solver.step(3)
    start = time.perf_counter()
    solver.step(iterations)
    elapsed = time.perf_counter() - start
    solver.close()
    return 100 * iterations / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=20, help="timed training iterations per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per net (the median is shown)")
    parser.add_argument("--keep", type=Path, default=None, help="folder for the generated data (default: temporary)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        for size, count in ((32, 5000), (256, 500)):
            rate = time_conversion(work, size, count, args.workers)
            print(f"convert imageset {size}x{size} PNG, --workers {args.workers}: {rate:.0f} images/s")
        root = work / "png32"
        convert_imageset(str(root), str(work / "db32png"), options=ImagesetOptions(workers=args.workers,
                                                                                   encoding="png"))
        mean = work / "mean.npy"
        numpy.save(mean, compute_mean(str(work / "db32png")))
        print(f"Data layer, 32x32 PNG records, crop 28 + mirror + mean, batch 100: "
              f"{time_loader(work / 'db32png', mean, args.iterations * 5):.0f} records/s")
        nets = {"DummyData": cifar_dummy_28(), "raw": cifar_from(work / "db32", mean),
                "PNG": cifar_from(work / "db32png", mean)}
        rates = {name: [] for name in nets}
        for _ in range(args.repeats):  # interleaved, so that a noisy neighbour hits all three alike
            for name, text in nets.items():
                rates[name].append(time_training(text, work, args.iterations))
        median = {name: statistics.median(values) for name, values in rates.items()}
        print(f"CIFAR-10 quick training, batch 100, {os.cpu_count()} cores, median of {args.repeats}: "
              f"DummyData {median['DummyData']:.0f} img/s")
        for name in ("raw", "PNG"):
            print(f"  from LMDB of {name} records, crop 28 + mirror + mean: {median[name]:.0f} img/s, "
                  f"ratio {median[name] / median['DummyData']:.2f}")

if __name__ == "__main__":
    main()
