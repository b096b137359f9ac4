"""The command line as a user runs it: output, exit status, and one-line errors without tracebacks."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import click
import numpy as np
import pytest
import yaml

import netspec
from netspec.cli import COMMANDS, main
from netspec.engine import backend
from netspec.errors import DeviceError
from netspec.inspect.timing import time_net

ROOT = Path(__file__).parent.parent.parent
LENET = ROOT / "configs" / "lenet" / "lenet_timing.yaml"


def run(*args, cwd=None, env=None):
    """Run ``netspec ARGS`` (in ``cwd``, with ``env`` added to the environment); no traceback allowed."""
    result = subprocess.run([sys.executable, "-m", "netspec", *map(str, args)], capture_output=True, text=True,
                            cwd=cwd, env={**os.environ, **(env or {})})
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(*args) -> str:
    """Run a command that must succeed; its stdout."""
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def fails(*args) -> str:
    """Run a command that must fail with exactly one line on stderr; that line."""
    result = run(*args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, (result.stdout, result.stderr)
    return result.stderr.strip()


def test_check_prints_layers_and_totals():
    result = run("check", LENET, "--phase", "TRAIN")
    assert result.returncode == 0
    assert "net 'LeNet' (TRAIN, level 0): 9 layers" in result.stdout
    assert "conv1  Convolution      (64, 20, 24, 24)" in result.stdout
    assert "learnable parameters: 431,080" in result.stdout
    assert "outputs: loss" in result.stdout
    # LeNet: conv1 2*20*24*24*25 + 20*24*24, pool1 20*12*12*4, conv2 2*50*8*8*500 + 50*8*8, pool2 50*4*4*4,
    # ip1 2*500*800 + 500, relu1 500, ip2 2*10*500 + 10, loss 1; per image, times the batch of 64
    per_image = (576_000 + 11_520) + 11_520 + (3_200_000 + 3_200) + 3_200 + (800_000 + 500) + 500 + (10_000 + 10)
    flops = [line for line in result.stdout.splitlines() if line.startswith("forward FLOPs")][0]
    assert flops == f"forward FLOPs: {(64 * per_image + 1) / 1e6:.4g} M per batch of 64"


def test_check_reports_every_error_with_location(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 3, 8, 8]}}}
  - {name: conv, type: Convolutoin, bottom: data, top: conv}
  - {name: pool, type: Pooling, bottom: dta, top: pool, pooling_param: {pool: MAXIMUM, kernel_size: 2}}
""")
    result = run("check", bad)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"error: {bad}:3: layer 'conv': type: unknown layer type 'Convolutoin'; did you mean " \
                       "'Convolution'? (netspec layers lists them)"
    assert lines[1].startswith(f"error: {bad}:4: layer 'pool': pooling_param.pool: 'MAXIMUM' is not one of MAX, AVE")
    assert lines[-1] == "2 errors"
    bad.write_text(bad.read_text().replace("Convolutoin", "Convolution, convolution_param: {num_output: 2, "
                                                          "kernel_size: 3}").replace("MAXIMUM", "MAX"))
    result = run("check", bad)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {bad}:4: layer 'pool': bottom: bottom 'dta' is not produced by any "
                                     "earlier layer; did you mean 'data'?")


def test_check_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("layers: [\n")
    result = run("check", bad)
    assert result.returncode == 1 and f"{bad}:2: malformed YAML" in result.stderr
    result = run("check", tmp_path / "nowhere.yaml")
    assert result.returncode == 1 and "nowhere.yaml: cannot read the file" in result.stderr


def test_check_weights_of_another_shape_or_net(tmp_path):
    deploy = ROOT / "configs" / "lenet" / "lenet_deploy.yaml"
    good = tmp_path / "lenet.h5"
    netspec.load_net(str(deploy)).save_weights(good)
    result = run("check", LENET, "--weights", good)
    assert result.returncode == 0 and "weights" in result.stdout and "copied 4 layer(s)" in result.stdout
    other = tmp_path / "other.yaml"
    other.write_text(deploy.read_text().replace("num_output: 500", "num_output: 400"))
    result = run("check", other, "--weights", good)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"error: {good}: layer 'ip1' blob 0 has shape (500, 800) in the file "
                                            "but (400, 800) in the net")
    foreign = tmp_path / "foreign.h5"
    netspec.load_net("name: tiny\nlayers:\n  - {name: d, type: Input, top: d, input_param: {shape: {dim: [1, 3]}}}\n"
                     "  - {name: fc, type: InnerProduct, bottom: d, top: fc, inner_product_param: {num_output: 2}}\n"
                     ).save_weights(foreign)
    result = run("check", LENET, "--weights", foreign)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {foreign}: the weights are of net 'tiny' and share no layer with net "
                                     "'LeNet' (file: fc; net: conv1, conv2, ip1, ip2)")


def test_layers_lists_and_documents():
    result = run("layers")
    assert result.returncode == 0
    assert len(result.stdout.strip().splitlines()) == len(netspec.engine.registry.layer_types())
    doc = run("layers", "Pooling").stdout
    for text in ("ceil", "bottoms: 1   tops: 1   in place: no", "pooling_param:", "round_mode", "CEIL", "Example"):
        assert text in doc
    result = run("layers", "Polling")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: unknown layer type 'Polling'; did you mean 'Pooling'? " \
                                    "(netspec layers lists them)"


def test_time_prints_table_and_json():
    result = run("time", LENET, "--iterations", "2", "--warmup", "1", "--json")
    assert result.returncode == 0
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["batch_size"] == 64 and figures["phase"] == "TRAIN"
    assert figures["images_per_s"] > 0 and figures["ms_per_iter"] > 0
    assert [layer["name"] for layer in figures["layers"]][:3] == ["mnist", "conv1", "pool1"]
    assert "images/s" in result.stdout
    assert "phase to build  [default: TRAIN]" in run("time", "--help").stdout  # what it does without --phase
    assert figures["peak_bytes"] > figures["blob_bytes"] > 0 and figures["peak_of"].startswith("the process's")
    assert f"memory: blobs {figures['blob_bytes'] / 2 ** 20:.1f} MiB (data and diff); peak " in result.stdout


@pytest.mark.gpu
def test_time_on_the_gpu_times_each_layer_between_events_without_waiting_between_layers(monkeypatch):
    net = netspec.load_net(str(LENET), device="gpu")
    waits = []
    monkeypatch.setattr(net.backend, "synchronize", lambda: waits.append(1))
    figures = time_net(net, iterations=3, warmup=1)
    assert waits == [1]  # after the warm-up alone: the layers' times come from events
    assert figures["device"] == "gpu" and all(layer["forward_ms"] >= 0 for layer in figures["layers"])
    assert 0 < figures["forward_ms"] + figures["backward_ms"] <= figures["ms_per_iter"]  # (a layer may queue nothing)


def test_the_memory_of_blobs_counts_shared_arrays_once_and_only_the_diffs_backward_uses():
    net = netspec.load_net(yaml.safe_dump({"force_backward": True, "layers": [
        {"name": "data", "type": "Input", "top": "x", "input_param": {"shape": [{"dim": [4, 10]}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y", "inner_product_param": {"num_output": 3}},
        {"name": "relu", "type": "ReLU", "bottom": "y", "top": "y"},  # in place: y's arrays
        {"name": "a", "type": "Power", "bottom": "y", "top": "a"},  # y feeds two layers: a Split sharing its data
        {"name": "b", "type": "Power", "bottom": "y", "top": "b"}]}), dtype=np.float64)
    # x, y, a, b: data and diff; the split's two tops: a diff each; ip's weights and bias: data and diff
    assert net.memory_bytes() == 8 * (2 * (40 + 12 + 12 + 12) + 2 * 12 + 2 * (30 + 3))
    text = yaml.safe_dump({"layers": [
        {"name": "data", "type": "Input", "top": "x", "input_param": {"shape": [{"dim": [4, 10]}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y", "inner_product_param": {"num_output": 3}}]})
    assert netspec.load_net(text, dtype=np.float64, inference=True).memory_bytes() == 8 * (40 + 12 + 30 + 3)


def test_time_reports_bad_data_files(tmp_path):
    (tmp_path / "list.txt").write_text("gone.h5\n")
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: d, type: HDF5Data, top: [data], hdf5_data_param: {source: list.txt, "
                   "batch_size: 2}}\n")
    result = run("time", net)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {net}:2: layer 'd': hdf5_data_param.source: {tmp_path}/gone.h5: "
                                     "cannot open HDF5 file: no such file")


def test_python_api_matches_design(tmp_path):
    net = netspec.load_net(str(LENET), phase="TRAIN", device="cpu")
    loss = net.forward()
    net.backward()
    assert loss > 0 and net.blobs["conv1"].diff.shape == (64, 20, 24, 24)
    assert net.params["conv1"][0].data.shape == (20, 1, 5, 5) and net.params["conv1"][0].diff.any()
    net.save_weights(tmp_path / "w.h5")
    again = netspec.load_net(str(LENET), phase="TEST")
    again.load_weights(tmp_path / "w.h5")
    np.testing.assert_array_equal(again.params["ip2"][0].data, net.params["ip2"][0].data)


def test_unknown_or_unavailable_device_is_one_line():
    result = run("time", LENET, "--device", "tpu")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: unknown device 'tpu': use cpu, gpu or gpu:N"
    try:
        import cupy  # noqa: F401
    except ImportError:
        result = run("time", LENET, "--device", "gpu")
        assert result.returncode == 1
        assert result.stderr.strip() == ("error: device 'gpu' needs CuPy, which cannot be imported (No module named "
                                         "'cupy'): pip install -e '.[gpu]'")
    beyond = run("time", LENET, "--device", "gpu:1", env={"NETSPEC_GPU_STANDIN": "1"})
    assert (beyond.returncode, beyond.stderr.strip()) == (
        1, "error: device 'gpu:1' is not here: the GPU stand-in has one device, gpu:0")


def test_a_cuda_error_is_named_where_cupy_cannot_use_the_gpu(monkeypatch):
    """A driver too old for CuPy's CUDA: the CUDA error says why, never "0 GPUs"."""
    class CUDARuntimeError(RuntimeError):
        pass

    def refuse():
        raise CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
                               "version")

    runtime = types.SimpleNamespace(CUDARuntimeError=CUDARuntimeError, getDeviceCount=refuse)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.0.1",
                                                                   cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(backend, "_driver_release", lambda: "535.104.05")
    monkeypatch.delenv("NETSPEC_GPU_STANDIN", raising=False)
    with pytest.raises(DeviceError) as info:
        backend.Backend("gpu")
    assert str(info.value) == (
        "device 'gpu' cannot be used: CUDA answers cudaErrorInsufficientDriver: CUDA driver version is insufficient "
        "for CUDA runtime version (driver 535.104.05, CuPy 14.0.1; `netspec device-query` says more)")
    assert backend.gpu_report() == [
        "gpu: none: CUDA answers cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
        "version (CuPy 14.0.1, driver 535.104.05)"]


def test_a_batch_beyond_the_devices_memory_names_the_layer_and_the_bytes(tmp_path):
    net = tmp_path / "huge.yaml"
    net.write_text(LENET.read_text().replace("[{dim: [64, 1, 28, 28]}, {dim: [64]}]",
                                             "[{dim: [100_000_000, 1, 28, 28]}, {dim: [100_000_000]}]"))
    assert "100_000_000" in net.read_text()
    result = run("time", net)
    assert (result.returncode, result.stderr.strip()) == (1, (
        "error: layer 'mnist': out of cpu memory while setting it up: blob 'data' [100000000, 1, 28, 28] needs "
        "313,600,000,000 bytes for its data; use a smaller batch_size, or check the sizes that make that shape"))


def test_device_query_names_the_cpu_and_the_gpus():
    result = run("device-query")
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[0].startswith(f"cpu: {os.cpu_count()} cores, NumPy {np.__version__}, ")
    if importlib.util.find_spec("cupy") is None:
        assert lines[1:] == ["gpu: none: CuPy cannot be imported (No module named 'cupy'; pip install -e '.[gpu]')"]
    standin = run("device-query", env={"NETSPEC_GPU_STANDIN": "1"})
    assert standin.stdout.splitlines()[1:] == [
        "gpu: netspec's GPU stand-in (NumPy on the CPU with CuPy's rules; NETSPEC_GPU_STANDIN=1)",
        "gpu:0: the stand-in: proves no CUDA kernel and no speed"]


def test_the_gpu_report_gives_versions_and_each_gpus_memory(monkeypatch):
    runtime = types.SimpleNamespace(  # a stand-in for CuPy's CUDA runtime, answering as on a machine with one H200
        CUDARuntimeError=RuntimeError, getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000, memGetInfo=lambda: (139 * 2 ** 30, 140 * 2 ** 30),
        getDeviceProperties=lambda index: {"name": b"NVIDIA H200", "major": 9, "minor": 0})
    cuda = types.SimpleNamespace(runtime=runtime, Device=lambda index: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.0.1", cuda=cuda))
    monkeypatch.setattr(backend, "_driver_release", lambda: "580.65.06")
    monkeypatch.setattr(backend.cudnn_conv, "unavailable", lambda: None)
    monkeypatch.setattr(backend.cudnn_conv, "version", lambda: "cuDNN 9.19.0 (frontend 1.23.0)")
    assert backend.gpu_report() == [
        "gpu: CuPy 14.0.1, CUDA runtime 13.0, driver 580.65.06 (CUDA 13.0)",
        "gpu:0: NVIDIA H200, compute capability 9.0, 139.0 GiB free of 140.0 GiB",
        "cudnn: cuDNN 9.19.0 (frontend 1.23.0)"]
    monkeypatch.setattr(backend.cudnn_conv, "unavailable", lambda: "off (NETSPEC_CUDNN=0)")
    assert backend.gpu_report()[2:] == ["cudnn: none: off (NETSPEC_CUDNN=0)"]
    monkeypatch.setattr(runtime, "getDeviceCount", lambda: 0)
    assert backend.gpu_report()[1:] == ["gpu: none: CUDA sees no GPU"]


def test_solvers_lists_rules_and_prints_their_formulas():
    listing = run("solvers")
    assert listing.returncode == 0
    assert {line.split()[0] for line in listing.stdout.splitlines()} == {
        "SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam", "AdamW"}
    adam = run("solvers", "Adam")
    assert adam.returncode == 0 and "sqrt(1 - b2^t) / (1 - b1^t)" in adam.stdout and "poly" in adam.stdout
    assert "decay to the gradient" in adam.stdout and "warmup_start_lr + " in adam.stdout
    adamw = run("solvers", "AdamW")
    assert "+ d * w)" in adamw.stdout and "(decoupled)" in adamw.stdout and "cos(pi * iter / max_iter)" in adamw.stdout
    wrong = run("solvers", "Adma")
    assert wrong.returncode == 1 and wrong.stderr.strip() == "error: unknown solver type 'Adma'; did you mean 'Adam'?"


def test_a_net_file_given_to_train_is_named_as_one_and_help_shows_no_empty_bounds(tmp_path):
    net = ROOT / "configs" / "digits" / "digits_net.yaml"
    result = run("train", net, "--out", tmp_path / "run")
    line = next(n for n, text in enumerate(net.read_text().splitlines(), 1) if text.startswith("layers:"))
    assert (result.returncode, result.stderr.strip()) == (1, f"error: {net}:{line}: this is a net file (it has "
                                                              "'layers'), not a solver: give a solver file, which "
                                                              "names it with net: (netspec check takes a net file)")
    assert "None]" not in run("check", "--help").stdout


def test_help_lists_every_command_from_the_table_without_importing_any():
    code = ("import sys\nfrom netspec.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('netspec.cli.', 'netspec.engine')) or m == 'numpy'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout
    for name in COMMANDS:
        assert f"\n  {name} " in result.stdout


def test_the_command_table_says_what_each_command_says_of_itself():
    context = click.Context(main)
    for name, (_, _, line) in COMMANDS.items():
        command = main.get_command(context, name)
        assert command.name == name and " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split()) == line, name


def test_import_netspec_loads_no_array_library():
    code = "import sys, netspec\nprint(sorted(m for m in sys.modules if m in ('numpy', 'h5py', 'netspec.layers')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "[]\n"
