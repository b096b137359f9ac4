"""--threads: one count sizes oneDNN's pool (OpenBLAS then keeps one thread) or, without oneDNN, OpenBLAS's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from netspec import threads
from netspec.engine import onednn

ROOT = Path(__file__).parent.parent.parent


def time_lenet(*options, **environment) -> str:
    result = subprocess.run([sys.executable, "-m", "netspec", "time", ROOT / "configs/lenet/lenet_timing.yaml",
                             "-n", "1", "--warmup", "0", *options], capture_output=True, text=True,
                            env={**os.environ, **environment})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_threads_size_onednn_and_leave_openblas_one():
    assert "threads: 1 (oneDNN), OpenBLAS 1" in time_lenet("--threads", "1")
    assert f"threads: {threads.all_cores()} (oneDNN), OpenBLAS 1" in time_lenet("--threads", str(threads.all_cores()))


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_without_threads_the_environment_decides():
    assert "threads: 1 (oneDNN), OpenBLAS 1" in time_lenet(OMP_NUM_THREADS="1")


def test_without_onednn_threads_size_openblas():
    assert "threads: OpenBLAS 1\n" in time_lenet("--threads", "1", NETSPEC_ONEDNN="0")


def test_a_count_below_one_is_refused():
    result = subprocess.run([sys.executable, "-m", "netspec", "time", "net.yaml", "--threads", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "'--threads': 0 is not in the range x>=1" in result.stderr


@pytest.mark.parametrize("environment, sized", [({}, False), ({"OMP_NUM_THREADS": "1"}, True)])
def test_pools_count_as_sized_by_the_user_not_by_netspec_itself(environment, sized):
    """``import netspec`` sets OPENBLAS_NUM_THREADS itself; only the user's settings silence the distributed note."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", "import netspec.threads as t; print(t.pools_sized())"],
                            capture_output=True, text=True, env={**clean, **environment})
    assert result.stdout.strip() == str(sized), result.stderr


@pytest.mark.parametrize("given, expected", [({}, "3000 -"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "- PASSIVE"),
                                             ({"GOMP_SPINCOUNT": "50"}, "50 -")])
def test_idle_openmp_threads_spin_briefly_unless_the_user_chose(given, expected):
    environment = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    probe = subprocess.run([sys.executable, "-c", "import netspec, os; print(os.environ.get('GOMP_SPINCOUNT', '-'), "
                            "os.environ.get('OMP_WAIT_POLICY', '-'))"],
                           capture_output=True, text=True, env=environment | given, check=True)
    assert probe.stdout.strip() == expected  # (set before oneDNN's OpenMP runtime loads and reads it)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_without_threads_a_core_another_process_keeps_busy_is_left_to_it():
    """On two cores beside a busy process, the pools take one thread and say why (OMP_NUM_THREADS unset)."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{first}}})\nwhile True: pass"])
    clean = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    try:
        time.sleep(0.5)  # (it runs)
        result = subprocess.run([sys.executable, "-m", "netspec", "time", ROOT / "configs/lenet/lenet_timing.yaml",
                                 "-n", "1", "--warmup", "0"], capture_output=True, text=True, env=clean,
                                preexec_fn=lambda: os.sched_setaffinity(0, {first, second}))
        assert result.returncode == 0, result.stderr
        assert "(1 of 2 cores busy with other processes at the start)" in result.stdout, result.stdout
        probe = subprocess.run([sys.executable, "-c", "from netspec import threads; print(threads.idle_cores())"],
                               capture_output=True, text=True, env=clean, check=True,
                               preexec_fn=lambda: os.sched_setaffinity(0, {first, second}))
        assert probe.stdout.strip() == "1"
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN is off: {onednn.why_unavailable()}")
def test_a_resumed_run_takes_the_threads_of_the_run_it_continues(tmp_path):
    """Results depend on the thread count: without --threads a resume keeps the state's, and ends bit for bit
    where the uninterrupted run does."""
    clean = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    (tmp_path / "data").mkdir()
    solver = tmp_path / "solver.yaml"
    solver.write_text((ROOT / "configs" / "digits" / "solver.yaml").read_text().replace("snapshot: 500", "snapshot: 4"))
    (tmp_path / "digits_net.yaml").write_text((ROOT / "configs" / "digits" / "digits_net.yaml").read_text())

    def netspec(*args) -> str:
        result = subprocess.run([sys.executable, "-m", "netspec", *map(str, args)], capture_output=True, text=True,
                                env=clean, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout

    netspec("convert", "digits", "data")
    netspec("train", solver, "--max-iter", 8, "--threads", 1, "--out", tmp_path / "whole")
    netspec("train", solver, "--max-iter", 4, "--threads", 1, "--out", tmp_path / "part")
    resumed = netspec("train", solver, "--max-iter", 8, "--resume", tmp_path / "part" / "digits_iter_4.solverstate.h5")
    assert "threads: 1 (oneDNN), OpenBLAS 1" in resumed, resumed  # (so noted, unless the busy cores chose 1 too)
    with h5py.File(tmp_path / "whole" / "digits_iter_8.weights.h5") as whole, \
            h5py.File(tmp_path / "part" / "digits_iter_8.weights.h5") as part:
        for layer in whole:
            np.testing.assert_array_equal(whole[layer]["0"][()], part[layer]["0"][()], err_msg=layer)


def test_parts_cover_the_batch_once_on_several_threads_and_failures_come_back():
    seen, names = np.zeros(1000, dtype=int), set()

    def count(part):
        seen[part] += 1
        names.add(threading.current_thread().name)
        threads.in_parts(10, lambda inner: None)  # (a call from a part runs its parts itself: no deadlock)

    threads.use_threads(2)
    try:
        threads.in_parts(1000, count)
        assert (seen == 1).all() and len(names) == min(2, threads.all_cores())

        def fail_late(part):
            if part.stop == 1000:
                raise ValueError("the last part fails")

        with pytest.raises(ValueError, match="the last part fails"):
            threads.in_parts(1000, fail_late)
        # two callers at once each get their own parts back
        totals = []
        callers = [threading.Thread(target=lambda: totals.append(_summed(threads))) for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(30)
        assert totals == [sum(range(5000))] * 4
    finally:
        threads.use_threads(None)


def _summed(module) -> int:
    values, parts = np.arange(5000), []
    module.in_parts(5000, lambda part: parts.append(int(values[part].sum())))
    return sum(parts)
