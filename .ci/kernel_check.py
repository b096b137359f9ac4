"""Compile netspec's CUDA kernels without a GPU, as CuPy would compile them on one: a check before a device session.

Every kernel of :mod:`netspec.engine.kernels` is an ``ElementwiseKernel``
whose CUDA source CuPy writes at its first launch, from the argument types of
that launch, and compiles with NVRTC.  Without a GPU nothing launches, so a
typing or syntax error in a kernel would first show on the device, in the
minutes a session has there.  This finds it on the CPU, in two steps:

1. ``record``: as a pytest plugin (``PYTHONPATH=.ci python3 -m pytest -p
   kernel_check -m gpu tests``, with ``NETSPEC_GPU_STANDIN=1`` and
   ``NETSPEC_KERNEL_LAUNCHES=FILE``), the GPU tests run on the stand-in with
   the kernels taken as compiled: each launch is noted (the kernel's text and
   its arguments' types and layouts), none runs, so most of those tests fail,
   which is expected; the launches go to FILE as JSON.
2. ``python kernel_check.py compile FILE``, in an environment with CuPy
   (``cupy-cuda13x``) and NVRTC (``nvidia-cuda-nvrtc``, ``nvidia-cuda-runtime``
   for the headers), writes each launch's source with CuPy's own code
   generator, for its 32-bit and, where a kernel has one, its 64-bit index,
   and compiles it for compute capability 9.0 (H100, H200).  Exit 1 naming
   each kernel NVRTC refuses, with its log and source.

``.ci/gpu-session --prepare`` runs both.  The generator's entry points are
CuPy's internals (``cupy._core._kernel``) as of CuPy 14; a later CuPy may move
them, and the compile step then fails saying so.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys

LAUNCHES = "NETSPEC_KERNEL_LAUNCHES"  # where the record step writes the launches
ARCH = "compute_90"


# ---- record: a pytest plugin -----------------------------------------------------------------------------------

def _argument(value) -> dict:
    """A launch argument's type: an array's dtype, dimensions and contiguity, or a scalar's dtype or Python type."""
    import numpy

    host = getattr(value, "_host", value)  # (the stand-in's device arrays hold NumPy arrays)
    if isinstance(host, numpy.ndarray):
        return {"array": host.dtype.str, "ndim": host.ndim, "contiguous": bool(host.flags.c_contiguous)}
    if isinstance(host, numpy.generic):
        return {"scalar": host.dtype.str}
    return {"python": type(host).__name__}


def pytest_configure(config) -> None:
    """Take every kernel as compiled and note its launches instead of running them."""
    from netspec.engine import blas, gpu_standin, kernels

    launches: dict[str, dict] = {}
    config._kernel_launches = launches

    def kernel(name, params, outputs, body, preamble):
        def launch(*args, **kwargs):
            record = {"kernel": [name, params, outputs, body, preamble], "arguments": [_argument(a) for a in args]}
            launches[json.dumps(record, sort_keys=True)] = record
        return launch

    kernels._kernel = kernel
    kernels.compiled = lambda xp: getattr(xp, "__name__", "") != "numpy"
    blas._library = lambda xp: getattr(getattr(xp, "cuda", None), "cublas", None)  # (the stand-in's cuBLAS)
    softmax_loss = kernels.softmax_loss

    def softmax_loss_on_the_standin(*args, **kwargs):  # (it makes its outputs with ``import cupy``)
        sys.modules["cupy"] = gpu_standin
        try:
            return softmax_loss(*args, **kwargs)
        finally:
            del sys.modules["cupy"]

    kernels.softmax_loss = softmax_loss_on_the_standin


def pytest_unconfigure(config) -> None:
    """Write the launches noted, and the kernels :mod:`netspec.engine.kernels` defines (the built-in update rules'
    included) that none launched."""
    from netspec.engine import kernels
    from netspec.engine.registry import solver_class, solver_types

    launches = getattr(config, "_kernel_launches", None)
    if launches is not None:
        defined = set(re.findall(r'_elementwise\(\s*"(\w+)"', inspect.getsource(kernels)))
        rules = (solver_class(name) for name in solver_types())
        defined |= {kernels.update_name(rule.type) for rule in rules
                    if rule.step_kernel and rule.__module__.startswith("netspec.solvers")}
        unlaunched = sorted(defined - {record["kernel"][0] for record in launches.values()})
        with open(os.environ[LAUNCHES], "w") as file:
            json.dump({"launches": list(launches.values()), "unlaunched": unlaunched}, file)


# ---- compile: with CuPy and NVRTC ------------------------------------------------------------------------------

def _sources(record: dict):
    """``(label, source)`` of each kernel CuPy would compile for the launch ``record``: the 32-bit index and, where
    the kernel has one, the 64-bit."""
    import cupy
    import numpy
    from cupy._core import _carray, _kernel, _scalar, core

    ndarray, indexer, scalar = 1, 2, 3  # cupy._core._kernel._ArgKind
    name, params, outputs, body, preamble = record["kernel"]
    kernel = cupy.ElementwiseKernel(params, outputs, body, f"netspec_{name}", preamble=preamble)
    inputs, outs = kernel.in_params, kernel.out_params
    arguments = record["arguments"] + [{"array": None}] * (len(inputs) + len(outs) - len(record["arguments"]))

    def array_type(argument):
        return numpy.dtype(argument["array"]).type if argument.get("array") else None

    in_types, out_types, type_map = _kernel._decide_params_type(
        inputs, outs, tuple(array_type(a) for a in arguments[:len(inputs)]),
        tuple(array_type(a) for a in arguments[len(inputs):]))
    kinds = []  # (dtype, ndim, contiguous) of each array argument, (dtype,) of each scalar
    for param, dtype, argument in zip(inputs + outs, tuple(in_types) + tuple(out_types), arguments):
        if "array" not in argument:  # (a scalar, cast to the parameter's type)
            kinds.append((dtype,))
        elif param.raw:  # (indexed by the kernel itself, as passed)
            kinds.append((dtype, argument.get("ndim", 1), argument.get("contiguous", True)))
        else:  # (broadcast and flattened by CuPy; a broadcast 0-d array has a stride of 0)
            kinds.append((dtype, 1, argument.get("contiguous", True) and argument.get("ndim", 1) > 0))

    def info(kind, narrow_index: bool):
        if len(kind) == 1:
            return _kernel._ArgInfo(scalar, _scalar.CScalar, kind[0], 0, True, True)
        return _kernel._ArgInfo(ndarray, cupy.ndarray, *kind, narrow_index)

    header = "".join(f"#include <{path}>\n" for path in core._cupy_header_list)
    narrow = "typedef int index_t;"
    for label, text in (("32-bit", preamble), ("64-bit", preamble.replace(narrow, "typedef long long index_t;"))):
        if label == "64-bit" and narrow not in preamble:
            continue
        narrow_index = label == "32-bit"  # (CuPy indexes arrays of 2**31 values or more, the 64-bit case, in 64 bits)
        arrays = tuple(info(kind, narrow_index) for kind in kinds)
        code = _kernel._get_elementwise_kernel_code(
            arrays + (_kernel._ArgInfo(indexer, _carray.Indexer, None, 1, True, narrow_index),),
            type_map, tuple(inputs + outs) + (_kernel.ParameterInfo("CIndexer _ind", False),), body,
            f"netspec_{name}", text)
        yield f"{name} ({label}; {', '.join(str(numpy.dtype(t)) for t in in_types)})", header + code


def compile_launches(path: str) -> int:
    """Compile every launch in the file ``path`` with NVRTC; the number of kernels NVRTC refused or none
    launched."""
    from cupy._core import core
    from cupy.cuda import compiler

    options = core.assemble_cupy_compiler_options(()) + (f"-arch={ARCH}",)
    with open(path) as file:
        noted = json.load(file)
    records = noted["launches"]
    seen, refused = set(), 0
    for record in records:
        for label, source in _sources(record):
            if source in seen:
                continue
            seen.add(source)
            try:
                compiler._NVRTCProgram(source, "kernel.cu").compile(options)
            except Exception as exc:  # noqa: BLE001 - NVRTC's log is the message, whatever its class
                refused += 1
                print(f"REFUSED {label}:\n{exc}\n{source}")
    kernels = sorted({record["kernel"][0] for record in records})
    print(f"kernel check: {len(seen)} sources of {len(kernels)} kernels ({', '.join(kernels)}) for {ARCH}, "
          f"{refused} refused by NVRTC")
    if noted["unlaunched"]:
        print(f"kernel check: never launched by the GPU tests, so not checked: {', '.join(noted['unlaunched'])}")
    return refused + len(noted["unlaunched"])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "compile":
        sys.exit(f"usage: {sys.argv[0]} compile LAUNCHES.json")
    sys.exit(1 if compile_launches(sys.argv[2]) else 0)
