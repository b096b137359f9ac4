"""Data-parallel training with `mpiexec -n 2 netspec train ... --distributed` on the CPU, as a user runs it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.datasets import load_digits
from test_cli import run
from test_train_cli import events

from netspec.cli import main
from netspec.data.dataset import DatasetWriter
from netspec.data.records import encode_record, record_key
from netspec.engine.net import load_net
from netspec.training import distributed
from netspec.training.distributed import GradientExchange, find_mpiexec

MPIEXEC = find_mpiexec()
LIMIT = 120  # seconds any launch may take; a hang fails the test instead of stalling the suite

NET = """
name: Tiny
layers:
  - name: data
    type: {data_type}
    top: [data, label]
    {data_block}
  - {{name: conv, type: Convolution, bottom: data, top: conv,
     convolution_param: {{num_output: 4, kernel_size: 3, weight_filler: {{type: xavier}}}}}}
{extra}
  - {{name: relu, type: ReLU, bottom: conv, top: conv}}
  - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
     inner_product_param: {{num_output: 10, weight_filler: {{type: xavier}}}}}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
  - {{name: accuracy, type: Accuracy, bottom: [ip, label], top: accuracy, include: {{phase: TEST}}}}
"""
DATA = ("Data", "data_param: {{source: {folder}, batch_size: {batch}, shuffle_buffer: {shuffle}}}\n"
                "    transform_param: {{crop_size: 6, mirror: true, scale: 0.0625}}")
HDF5 = ("HDF5Data", "hdf5_data_param: {{source: {folder}/digits.h5, batch_size: {batch}, shuffle: true}}")
BATCH_NORM = "  - {{name: bn, type: BatchNorm, bottom: conv, top: conv, batch_norm_param: {{sync: {sync}}}}}"
DROPOUT = "  - {name: drop, type: Dropout, bottom: conv, top: conv, dropout_param: {dropout_ratio: 0.3}}"
SOLVER = """
net: net.yaml
type: {type}
base_lr: {base_lr}
momentum: 0.9
weight_decay: 0.001
lr_policy: fixed
max_iter: {iters}
iter_size: {iter_size}
test_iter: [{test_iter}]
test_interval: {iters}
display: 1
snapshot: {snapshot}
snapshot_prefix: run/tiny
random_seed: 3
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The 8x8 digits as an LMDB dataset (its record 31 unreadable in a copy) and as an HDF5 file."""
    folder = tmp_path_factory.mktemp("dist")
    digits = load_digits()
    images = (digits.images[:64] * 15).astype(np.uint8)[:, None]
    writer = DatasetWriter(str(folder / "lmdb"), "lmdb")
    for image, label in zip(images, digits.target[:64]):
        writer.add(image, int(label), encode_record(image, int(label)))
    writer.finish([str(d) for d in range(10)], "0" * 64, {})
    with h5py.File(folder / "digits.h5", "w") as handle:
        handle["data"] = images.astype(np.float32) / 16
        handle["label"] = digits.target[:64].astype(np.float32)
    shutil.copytree(folder / "lmdb", folder / "broken")
    with lmdb.open(str(folder / "broken")) as env, env.begin(write=True) as txn:
        txn.put(record_key(31), b"\x00\x00")
    return folder


def setup_run(folder: Path, digits: Path, batch: int, solver="SGD", data=DATA, extra="", iters=6,
              snapshot=0, source="lmdb", test_iter=4, shuffle=16, iter_size=1, base_lr=0.05) -> Path:
    """Write net.yaml and solver.yaml into ``folder``; return the solver's path."""
    folder.mkdir(parents=True, exist_ok=True)
    data_type, block = data
    block = block.format(folder=digits / source if data is DATA else digits, batch=batch, shuffle=shuffle)
    (folder / "net.yaml").write_text(NET.format(data_type=data_type, data_block=block, extra=extra))
    (folder / "solver.yaml").write_text(SOLVER.format(type=solver, iters=iters, snapshot=snapshot, test_iter=test_iter,
                                                       iter_size=iter_size, base_lr=base_lr))
    return folder / "solver.yaml"


def mpirun(ranks: int, *args, limit: float = LIMIT) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks netspec ...`` with one math thread per process."""
    command = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "netspec", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=limit,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def trained(folder: Path, iteration: int) -> dict[str, np.ndarray]:
    with h5py.File(folder / "run" / f"tiny_iter_{iteration}.weights.h5") as handle:
        return {f"{layer}/{blob}": handle[layer][blob][()] for layer in handle for blob in handle[layer]}


def assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("solver, data, bucket_mb, iter_size", [("SGD", DATA, 25, 1), ("Adam", HDF5, 0.0001, 2)],
                         ids=["SGD-Data-one-bucket", "Adam-HDF5Data-a-bucket-per-blob-iter_size-2"])
def test_two_ranks_of_batch_b_learn_what_one_process_of_batch_2b_does(digits, tmp_path, solver, data, bucket_mb,
                                                                       iter_size):
    one = setup_run(tmp_path / "one", digits, 8, solver, data, test_iter=4, iter_size=iter_size)
    two = setup_run(tmp_path / "two", digits, 4, solver, data, test_iter=8, iter_size=iter_size)  # 4 batches of 4 a rank
    single = run("train", one)
    assert single.returncode == 0, single.stderr
    pair = mpirun(2, "train", two, "--distributed", "--bucket-mb", bucket_mb)
    assert pair.returncode == 0, pair.stderr
    assert_close(trained(tmp_path / "one", 6), trained(tmp_path / "two", 6))
    assert f"distributed over 2 processes: each learns from {4 * iter_size} records per iteration, so one update " \
           f"averages the gradients of {8 * iter_size}" in pair.stdout
    assert "rank 0: pid" in pair.stdout and "rank 1: pid" in pair.stdout
    # rank 0 alone writes: one line per display; the loss and test scores are the ranks' means
    train_one, train_two = events(tmp_path / "one" / "run", "TRAIN"), events(tmp_path / "two" / "run", "TRAIN")
    assert [e["iter"] for e in train_two] == list(range(6))
    for key in ("smoothed_loss", "loss"):
        assert [e[key] for e in train_two] == pytest.approx([e[key] for e in train_one], 1e-4)
    assert all(e["communication_ms"] >= 0 for e in train_two)
    test_one, test_two = events(tmp_path / "one" / "run", "TEST"), events(tmp_path / "two" / "run", "TEST")
    assert [e["iter"] for e in test_two] == [0, 6]
    for a, b in zip(test_one, test_two):
        assert (b["accuracy"], b["loss"]) == pytest.approx((a["accuracy"], a["loss"]), 1e-4)


def test_two_ranks_test_one_pass_as_one_process_does(digits, tmp_path):
    """test_iter: epoch over 63 records: one process of batch 10 scores 6 batches and a tail of 3; of two ranks
    of batch 5, one scores its 32 records as 6 batches and a tail of 2, the other its 31 as 6 and 1, and the
    ranks' scores weigh as many records as each scored."""
    with h5py.File(digits / "digits.h5") as full, h5py.File(tmp_path / "63.h5", "w") as cut:
        for name in ("data", "label"):
            cut[name] = full[name][:63]
    data = ("HDF5Data", f"hdf5_data_param: {{{{source: {tmp_path / '63.h5'}, batch_size: {{batch}}}}}}")
    one = setup_run(tmp_path / "one", digits, 10, data=data, test_iter="epoch")
    two = setup_run(tmp_path / "two", digits, 5, data=data, test_iter="epoch")
    single = run("train", one)
    assert single.returncode == 0, single.stderr
    pair = mpirun(2, "train", two, "--distributed")
    assert pair.returncode == 0, pair.stderr
    test_one, test_two = events(tmp_path / "one" / "run", "TEST"), events(tmp_path / "two" / "run", "TEST")
    assert [e["iter"] for e in test_two] == [e["iter"] for e in test_one] == [0, 6]
    for a, b in zip(test_one, test_two):
        assert (b["accuracy"], b["loss"]) == pytest.approx((a["accuracy"], a["loss"]), 1e-4)
    assert test_one[0]["accuracy"] * 63 == pytest.approx(round(test_one[0]["accuracy"] * 63))  # whole records


def test_synchronised_batch_norm_matches_one_process_and_per_rank_statistics_do_not(digits, tmp_path):
    one = setup_run(tmp_path / "one", digits, 8, extra=BATCH_NORM.format(sync="true"))
    synced = setup_run(tmp_path / "synced", digits, 4, extra=BATCH_NORM.format(sync="true"))
    local = setup_run(tmp_path / "local", digits, 4, extra=BATCH_NORM.format(sync="false"))
    assert run("train", one).returncode == 0
    for solver in (synced, local):
        result = mpirun(2, "train", solver, "--distributed")
        assert result.returncode == 0, result.stderr
    assert_close(trained(tmp_path / "one", 6), trained(tmp_path / "synced", 6))
    by_rank, whole = trained(tmp_path / "local", 6), trained(tmp_path / "one", 6)
    assert not np.allclose(by_rank["bn/0"], whole["bn/0"], rtol=1e-3)  # rank 0's own statistics


def test_a_two_rank_run_resumed_at_two_ranks_continues_bit_for_bit(digits, tmp_path):
    straight = setup_run(tmp_path / "straight", digits, 4, "Adam", extra=DROPOUT, iters=8, snapshot=4)
    resumed = setup_run(tmp_path / "resumed", digits, 4, "Adam", extra=DROPOUT, iters=8, snapshot=4)
    assert mpirun(2, "train", straight, "--distributed").returncode == 0
    first = mpirun(2, "train", resumed, "--distributed", "--max-iter", "4")
    assert first.returncode == 0, first.stderr
    state = tmp_path / "resumed" / "run" / "tiny_iter_4.solverstate.h5"
    second = mpirun(2, "train", resumed, "--distributed", "--resume", state)
    assert second.returncode == 0, second.stderr
    a, b = trained(tmp_path / "straight", 8), trained(tmp_path / "resumed", 8)
    assert a.keys() == b.keys() and all(np.array_equal(a[name], b[name]) for name in a)
    refused = run("train", resumed, "--resume", state)
    assert refused.returncode == 1
    assert "the state was written by a run of 2 process(es), this run has 1; resume with the same number " \
           "(mpiexec -n 2)" in refused.stderr


def test_a_rank_that_raises_ends_every_rank_with_its_message_and_the_snapshot_survives(digits, tmp_path):
    solver = setup_run(tmp_path, digits, 4, iters=20, snapshot=2, source="broken", shuffle=0)
    started = time.monotonic()
    result = mpirun(2, "train", solver, "--distributed")
    assert result.returncode != 0 and time.monotonic() - started < 60
    # rank 1 reads the odd records: record 31 at its fourth batch
    assert "error: rank 1: " in result.stderr and "record 00000031: bad record" in result.stderr
    assert "Traceback" not in result.stderr
    assert trained(tmp_path, 2)["conv/0"].shape == (4, 1, 3, 3)


def test_a_diverging_run_stops_every_rank_at_the_same_iteration_with_one_message(digits, tmp_path):
    result = mpirun(2, "train", setup_run(tmp_path, digits, 4, iters=50, base_lr=1e12), "--distributed")
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1  # rank 0's message alone: no MPI_Abort, no NumPy warnings
    assert result.stderr.startswith("error: iteration ") and "the loss is nan" in result.stderr


def launch(solver: Path, *args, until: str = "snapshot at iteration") -> tuple[subprocess.Popen, dict[int, int]]:
    """Start a 2-rank run; return it and ``{rank: pid}`` once it prints a line starting with ``until``."""
    command = [MPIEXEC, "-n", "2", sys.executable, "-m", "netspec", "train", str(solver), "--distributed", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    pids = {}
    for line in process.stdout:
        if line.startswith("rank ") and ": pid " in line:
            rank, rest = line[5:].split(": pid ")
            pids[int(rank)] = int(rest.split()[0])
        if line.startswith(until):
            return process, pids
    raise AssertionError(f"the run ended before printing '{until}': {process.communicate()[1]}")


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """Wait (bounded) for a launched run; its return code and the rest of its output (stdout and stderr)."""
    stdout, stderr = process.communicate(timeout=LIMIT)
    return process.returncode, stdout + stderr


def test_a_rank_that_dies_ends_every_rank_and_the_snapshot_survives(digits, tmp_path):
    solver = setup_run(tmp_path, digits, 4, iters=100000, snapshot=2)
    process, pids = launch(solver)
    os.kill(pids[1], signal.SIGKILL)
    code, output = finish(process)
    assert code != 0
    # mpiexec names a rank's process (under load MPICH may name rank 0's, which it ended in turn) and the signal
    assert any(f"PID {pid}" in output for pid in pids.values()) and "Killed" in output
    assert trained(tmp_path, 2)["ip/0"].shape == (10, 64)


def test_a_rank_that_hangs_makes_the_others_give_up_after_the_timeout(digits, tmp_path):
    solver = setup_run(tmp_path, digits, 4, iters=100000, snapshot=2)
    process, pids = launch(solver, "--collective-timeout", "3")
    os.kill(pids[1], signal.SIGSTOP)
    started = time.monotonic()
    code, output = finish(process)
    assert code != 0 and time.monotonic() - started < 30
    # rank 0 waits in whichever collective rank 1 was stopped before (gradients, or the outputs shown)
    assert "error: rank 0: the other ranks did not answer within 3 s while averaging " in output
    assert trained(tmp_path, 2)["ip/0"].shape == (10, 64)


def test_a_signal_to_one_rank_acts_on_every_rank_at_the_same_iteration(digits, tmp_path):
    solver = setup_run(tmp_path, digits, 4, iters=100000, snapshot=0)
    process, pids = launch(solver, until="iter 2")
    os.kill(pids[1], signal.SIGHUP)  # snapshot
    for line in process.stdout:
        if line.startswith("snapshot at iteration"):
            break
    os.kill(pids[1], signal.SIGINT)  # stop
    code, output = finish(process)
    assert code == 130, output  # every rank stopped by the interrupt, after the snapshot
    stopped = int(output.split("stop requested (SIGINT): stopping at iteration ")[1].split()[0])
    assert f"snapshot at iteration {stopped}" in output
    assert trained(tmp_path, stopped)["ip/0"].shape == (10, 64)


def test_processes_starts_the_ranks_itself_with_a_share_of_the_cores_each(digits, tmp_path):
    solver = setup_run(tmp_path, digits, 4)
    result = run("train", solver, "--processes", "2", "--seed", "5", "--stage", "unused", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "distributed over 2 processes" in result.stdout and "rank 1: pid" in result.stdout
    assert "; threads: 1 (oneDNN)" in result.stdout or "; threads: OpenBLAS 1" in result.stdout  # (without oneDNN)
    assert "neither --threads nor OMP_NUM_THREADS is set" not in result.stdout
    assert [e["iter"] for e in events(tmp_path / "run", "TRAIN")] == list(range(6))
    both = run("train", solver, "--processes", "2", "--distributed")
    assert both.returncode == 2 and "--processes starts the ranks itself; leave out --distributed" in both.stderr


def test_processes_without_mpiexec_says_how_to_install_one(digits, tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "find_mpiexec", lambda: None)
    result = CliRunner().invoke(main, ["train", str(setup_run(tmp_path, digits, 4)), "--processes", "2"])
    assert result.exit_code == 1
    assert result.output.startswith("error: starting 2 processes needs mpiexec, and there is none beside Python or "
                                    "on the PATH: pip install 'netspec[dist]'")


def test_distributed_runs_refuse_a_gpu_with_a_clear_message(digits, tmp_path):
    result = mpirun(2, "train", setup_run(tmp_path, digits, 4), "--distributed", "--device", "gpu")
    assert result.returncode != 0
    assert "distributed training runs on the CPU for now (--device cpu)" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_mpi4py_distributed_says_how_to_install_it(digits, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "mpi4py.py").write_text("raise ImportError('No module named mpi4py')\n")
    solver = setup_run(tmp_path / "run", digits, 4)
    result = subprocess.run([sys.executable, "-m", "netspec", "train", str(solver), "--distributed"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(blocker)})
    assert result.returncode == 1
    assert result.stderr.startswith("error: --distributed needs mpi4py") and "pip install 'netspec[dist]'" \
        in result.stderr


class TwinComm:
    """Two ranks that hold the same values: a sum doubles them.  Records when each bucket starts."""

    rank, size, seconds = 0, 2, 0.0

    def __init__(self, bucket_bytes):
        self.bucket_bytes = bucket_bytes
        self.log: list[str] = []

    def start_allreduce(self, array):
        self.log.append(f"start {len(array)}")
        array *= 2

    def progress(self, requests):
        self.log.append("progress")

    def wait(self, requests, what):
        self.log.append(f"wait {len(requests)}: {what}")


SHARED = """
layers:
  - {name: in, type: Input, top: [data, label], input_param: {shape: [{dim: [2, 3]}, {dim: [2]}]}}
  - {name: ip1, type: InnerProduct, bottom: data, top: h1, param: [{name: w}, {name: b}],
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: relu, type: ReLU, bottom: h1, top: h1}
  - {name: ip2, type: InnerProduct, bottom: h1, top: h2, param: [{name: w}, {name: b}],
     inner_product_param: {num_output: 3}}
  - {name: ip3, type: InnerProduct, bottom: h2, top: out, inner_product_param: {num_output: 4,
     weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [out, label], top: loss}
"""


def test_buckets_start_while_backward_goes_on_and_shared_weights_wait_for_their_last_user():
    net = load_net(SHARED, phase="TRAIN", seed=0)
    net.blobs["data"].data[...] = np.arange(6).reshape(2, 3) / 6
    net.blobs["label"].data[...] = [1, 3]
    learnable = net.learnable_params()  # ip1's w (9 values) and b (3), shared with ip2; ip3's w (12) and b (4)
    comm = TwinComm(bucket_bytes=64)
    exchange = GradientExchange(comm, net, learnable)
    # ip3's blobs first (backward is done with them after layer 4), then the shared ones (after layer 1, not 3)
    assert [(b.start, b.end, b.ready) for b in exchange.buckets] == [(0, 16, 4), (16, 31, 1)]
    net.clear_param_diffs()
    loss = net.forward()

    def layer_done(index):
        comm.log.append(f"layer {index}")
        exchange.layer_done(index)

    net.backward(layer_done)
    expected = [lp.blob.diff.copy() for lp in learnable]
    assert comm.log == ["layer 5", "layer 4", "start 16", "progress", "layer 3", "progress", "layer 2", "progress",
                        "layer 1", "progress", "layer 0", "progress"]
    mean_loss, request = exchange.average(loss, "snapshot", 7)
    assert comm.log[-2:] == ["start 15", "wait 2: averaging gradients at iteration 7"]  # with the loss and flags
    assert (mean_loss, request) == (pytest.approx(loss), "snapshot")
    for lp, before in zip(learnable, expected):
        np.testing.assert_allclose(lp.blob.diff, before)


FUSED_UNIT = """
layers:
  - {name: data, type: Input, top: [data, label], input_param: {shape: [{dim: [2, 3, 4, 4]}, {dim: [2]}]}}
  - {name: conv, type: Convolution, bottom: data, top: c, convolution_param: {num_output: 4, kernel_size: 3}}
  - {name: bn, type: BatchNorm, bottom: c, top: c}
  - {name: scale, type: Scale, bottom: c, top: c, scale_param: {bias_term: true}}
  - {name: ip, type: InnerProduct, bottom: c, top: out, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [out, label], top: loss}
"""


def test_the_gradients_of_an_absorbed_scale_wait_for_the_layer_that_computes_them():
    net = load_net(FUSED_UNIT, phase="TRAIN", seed=0)
    if not net.absorbed_by:
        pytest.skip("oneDNN is off: nothing is fused")
    assert net.absorbed_by == {3: 2}
    exchange = GradientExchange(TwinComm(bucket_bytes=4), net, net.learnable_params())
    ready = {id(blob): bucket.ready for bucket in exchange.buckets for blob, _ in bucket.blobs}
    assert [ready[id(blob)] for blob in net.params["scale"]] == [2, 2]  # BatchNorm's turn, not the skipped Scale's
