"""Each built-in rule's one-kernel GPU update (its ``step_kernel`` inside :func:`netspec.engine.kernels.update`),
built as C++ for the CPU and run where the GPU would run it: six steps of every rule under every setting of the
closed-form test match the loop written out, as its array code does.  (The GPU stand-in runs the array code, and
only a GPU runs CUDA: this is what checks the kernels' arithmetic on every commit.)"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import types

import numpy as np
import pytest

from netspec.engine import kernels
from netspec.engine.registry import solver_class
from netspec.training import optimizer
from tests.training.test_solver import MATRIX, MOMENTUM, REFERENCE_RULES, reference_run, tiny_solver

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the update kernels for the CPU")

C_TYPES = {"int32": ("int", ctypes.c_int), "float64": ("double", ctypes.c_double), "bool": ("bool", ctypes.c_bool)}


class HostKernel:
    """An elementwise kernel of scalar and ``raw T`` inputs and ``T`` outputs, as a C++ loop over the outputs'
    elements (``T`` the outputs' type): the statements CuPy would compile for the GPU, compiled by the host's."""

    built: dict[str, ctypes.CDLL] = {}  # source -> library, for the session

    def __init__(self, folder, name, params, outputs, body):
        self.inputs = [param.split() for param in params.split(",")]
        self.outputs = [param.split()[-1] for param in outputs.split(",")]
        self.folder, self.name, self.body = folder, name, body

    def function(self, dtype):
        arguments = ["long n_"]
        for *raw, kind, name in self.inputs:
            arguments.append(f"T* {name}" if raw else f"{C_TYPES[kind][0]} {name}")
        arguments += [f"T* {name}_" for name in self.outputs]
        references = " ".join(f"T& {name} = {name}_[i];" for name in self.outputs)
        source = (f"#include <cmath>\nusing std::sqrt;\ntypedef {'double' if dtype == np.float64 else 'float'} T;\n"
                  f'extern "C" void {self.name}({", ".join(arguments)}) {{\n'
                  f"  for (long i = 0; i < n_; ++i) {{ {references}\n{self.body}\n  }}\n}}\n")
        if source not in self.built:
            path = self.folder / hashlib.sha256(source.encode()).hexdigest()
            path.with_suffix(".cpp").write_text(source)
            subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-o", path.with_suffix(".so"), path.with_suffix(".cpp")],
                           check=True)
            self.built[source] = ctypes.CDLL(str(path.with_suffix(".so")))
        return getattr(self.built[source], self.name)

    def __call__(self, *args):
        inputs, outputs = args[:len(self.inputs)], args[len(self.inputs):]
        values = [ctypes.c_long(outputs[0].size)]
        for (*raw, kind, _), value in zip(self.inputs, inputs):
            values.append(value.ctypes.data_as(ctypes.c_void_p) if raw else C_TYPES[kind][1](value))
        for array in outputs:
            assert array.flags.c_contiguous and array.dtype == outputs[0].dtype
            values.append(array.ctypes.data_as(ctypes.c_void_p))
        self.function(outputs[0].dtype)(*values)


@pytest.fixture
def updates_on_the_host(monkeypatch, tmp_path_factory):
    """The optimizer takes its kernels as compiled and runs :func:`kernels.update` with each kernel built for the
    host; the names of the kernels that ran."""
    folder, ran = tmp_path_factory.getbasetemp(), []

    def elementwise(name, params, outputs, body, preamble="", arrays=()):
        ran.append(name)
        return HostKernel(folder, name, params, outputs, body)

    def update(*args):
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "_elementwise", elementwise)
            kernels.update(*args)

    monkeypatch.setattr(optimizer, "kernels", types.SimpleNamespace(compiled=lambda xp: True, update=update))
    return ran


@pytest.mark.parametrize("hyper", MATRIX, ids=["plain", "l2", "l2_cosine_warmup", "l1_step", "clip", "iter_size"])
@pytest.mark.parametrize("rule", sorted(REFERENCE_RULES))
def test_every_rules_update_kernel_matches_its_closed_form(tmp_path, rule, hyper, updates_on_the_host):
    solver = tiny_solver(tmp_path, type=rule, base_lr=0.1, momentum=MOMENTUM[rule], **hyper)
    expected = reference_run(solver, 6)
    solver.step(6)
    assert updates_on_the_host == [kernels.update_name(rule)] * 12  # (two groups: lr_mult 1 and 2, six steps)
    for blob, want in zip(solver.net.params["ip"], expected):
        np.testing.assert_allclose(blob.data, want, rtol=1e-12, atol=1e-14)


def test_a_rule_that_computes_its_update_anew_does_not_inherit_a_kernel():
    """A subclass overriding ``compute_update`` runs its own array code on a GPU, not its parent's kernel; one
    that only changes how the decay is applied (AdamW) keeps it."""
    sgd = solver_class("SGD")

    class Halved(sgd):
        def compute_update(self, index, diff, rate):
            super().compute_update(index, diff, rate)
            diff *= 0.5

    assert sgd.step_kernel and not Halved.step_kernel and not Halved.step_hyper
    assert solver_class("AdamW").step_kernel == solver_class("Adam").step_kernel
