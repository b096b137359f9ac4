"""Scaling of data-parallel training on the CPU: CIFAR-10 quick on 1 and on N MPI ranks.

    python benchmarks/distributed_scaling.py [--ranks 2] [--iterations 60] [--repeats 3]

Trains CIFAR-10 quick (batch 100 per process, DummyData inputs so that every
run does the same work per image) with ``netspec train`` as a user would:
once as a single process with one math thread, once as
``mpiexec -n N ... --distributed`` with one math thread per rank, and, for
comparison, as a single process with N threads and as N independent
single-thread runs at once (no communication: what the cores and memory allow
N processes).  Reports images/s (from the display events of metrics.jsonl,
the first left out as warm-up), the scaling efficiency
``images/s at N ranks / (N * images/s at 1 rank)`` and the time per iteration
the ranks spend in collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from netspec.training.distributed import find_mpiexec

CIFAR = Path(__file__).parent.parent / "configs" / "cifar10" / "cifar10_quick_timing.yaml"
MPIEXEC = find_mpiexec()


def start(work: Path, name: str, iterations: int, ranks: int, threads: int) -> tuple[subprocess.Popen, Path]:
    """Begin one training run in ``work/name``; the process and its run folder."""
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    solver = run_dir / "solver.yaml"
    solver.write_text(f"net: {CIFAR}\nbase_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.004\nmax_iter: {iterations}\n"
                      f"display: 10\nrandom_seed: 0\nsnapshot_after_train: false\nsnapshot_prefix: {run_dir}/cifar\n")
    command = [sys.executable, "-m", "netspec", "train", str(solver)]
    if ranks > 1:
        command = [MPIEXEC, "-n", str(ranks), *command, "--distributed"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment), run_dir


def measured(process: subprocess.Popen, run_dir: Path) -> tuple[float, float | None]:
    """Median images/s over a finished run's display events, and its mean communication ms per iteration."""
    _, errors = process.communicate()
    if process.returncode:
        sys.exit(f"training failed: {errors.decode()}")
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shown = [e for e in events if e["phase"] == "TRAIN"][1:]  # the first window holds the warm-up
    communication = [e["communication_ms"] for e in shown if "communication_ms" in e]
    return (statistics.median(e["images_per_s"] for e in shown),
            statistics.mean(communication) if communication else None)


def train(work: Path, iterations: int, ranks: int, threads: int, copies: int) -> tuple[float, float | None]:
    """Images/s of ``copies`` runs at once (summed) and the communication ms per iteration (ranks > 1)."""
    runs = [start(work, f"run{copy}_{ranks}x{threads}", iterations, ranks, threads) for copy in range(copies)]
    results = [measured(*run) for run in runs]
    return sum(rate for rate, _ in results), results[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60, help="training iterations per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (the median is shown)")
    args = parser.parse_args()
    if MPIEXEC is None:
        sys.exit("no mpiexec found: pip install 'netspec[dist]' mpich")
    kinds = {"1 process, 1 thread": (1, 1, 1), f"{args.ranks} ranks, 1 thread each": (args.ranks, 1, 1),
             f"1 process, {args.ranks} threads": (1, args.ranks, 1),
             f"{args.ranks} independent 1-thread runs at once, together": (1, 1, args.ranks)}
    results: dict[str, list[tuple[float, float | None]]] = {name: [] for name in kinds}
    with tempfile.TemporaryDirectory() as temporary:
        for _ in range(args.repeats):  # interleaved, so that a noisy neighbour hits every kind alike
            for name, (ranks, threads, copies) in kinds.items():
                results[name].append(train(Path(temporary), args.iterations, ranks, threads, copies))
    speed = {name: statistics.median(rate for rate, _ in runs) for name, runs in results.items()}
    print(f"CIFAR-10 quick, batch 100 per process, {os.cpu_count()} cores, median of {args.repeats} runs "
          f"of {args.iterations} iterations:")
    for name, rate in speed.items():
        print(f"  {name}: {rate:.0f} images/s")
    single, parallel = speed["1 process, 1 thread"], speed[f"{args.ranks} ranks, 1 thread each"]
    communication = statistics.median(c for _, c in results[f"{args.ranks} ranks, 1 thread each"])
    seconds_per_iteration = 100 * args.ranks / parallel
    print(f"scaling efficiency at {args.ranks} ranks: {parallel / (args.ranks * single):.2f} "
          f"(images/s at {args.ranks} ranks / ({args.ranks} x images/s at 1 rank))")
    print(f"communication: {communication:.1f} ms per iteration "
          f"({communication / 1000 / seconds_per_iteration:.1%} of an iteration)")


if __name__ == "__main__":
    main()
