"""The GPU stand-in's CUDA graphs: while a stream captures, work is recorded and not done; a launch does it again
with the arrays' values of the moment and the host's values of the capture; what CUDA refuses in a capture (a read
on the host, a copy from the host, a wait) raises and loses the capture.  The graphed training step is tested on
this (tests/training/test_cuda_graph.py), so its rules must be CUDA's."""

from __future__ import annotations

import numpy
import pytest

from netspec.engine import blas, gpu_standin
from netspec.engine.gpu_standin import StreamCaptureError

xp = gpu_standin


class FakeBackend:
    """What blas asks of a backend: the stand-in's arrays, float32 products in float32."""

    xp, precision = gpu_standin, "fp32"


def captured(work):
    """The graph of what ``work()`` asks of the device, captured on a stream of its own."""
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        work()
        return stream.end_capture()


def values(array) -> numpy.ndarray:
    return xp.asnumpy(array)


def test_captured_work_is_done_at_each_launch_not_at_capture():
    a = xp.zeros(3, dtype=numpy.float32)
    made = {}

    def step():
        a[...] += 1  # (in place)
        made["b"] = a * 2  # (an array made in the capture: computed again at each launch)
        xp.multiply(made["b"], 0.5, out=made["b"])

    graph = captured(step)
    numpy.testing.assert_array_equal(values(a), 0)
    graph.launch()
    numpy.testing.assert_array_equal(values(a), 1)
    numpy.testing.assert_array_equal(values(made["b"]), 1)
    graph.launch()
    numpy.testing.assert_array_equal(values(a), 2)
    numpy.testing.assert_array_equal(values(made["b"]), 2)


def test_in_place_functions_methods_gathers_and_products_are_recorded():
    rng = numpy.random.default_rng(0)
    left, right = (xp.asarray(rng.standard_normal(shape).astype(numpy.float32)) for shape in ((4, 3), (3, 5)))
    out, filled, copied = xp.zeros((4, 5), numpy.float32), xp.zeros(4, numpy.float32), xp.zeros(4, numpy.float32)
    counts, index = xp.zeros(3, numpy.float32), xp.asarray(numpy.array([0, 2, 2]))
    gathered = {}

    def step():
        blas.product(FakeBackend, left, right, out, add=True)  # (cuBLAS, emulated: added at each launch)
        filled.fill(7)
        xp.copyto(copied, filled)
        xp.add.at(counts, index, 1)
        gathered["rows"] = left[index]

    graph = captured(step)
    for array in (out, filled, copied, counts):
        numpy.testing.assert_array_equal(values(array), 0)
    for launches in (1, 2):
        graph.launch()
        numpy.testing.assert_allclose(values(out), launches * values(left) @ values(right), rtol=1e-6)
        numpy.testing.assert_array_equal(values(copied), 7)
        numpy.testing.assert_array_equal(values(counts), [launches, 0, 2 * launches])
    left[...] = 0  # (a gather reads its array at the launch)
    graph.launch()
    numpy.testing.assert_array_equal(values(gathered["rows"]), 0)


def test_host_values_are_those_of_the_capture():
    a = xp.zeros(2, dtype=numpy.float64)
    rate = [0.5]
    graph = captured(lambda: a.__iadd__(rate[0]))
    rate[0] = 100.0
    graph.launch()
    numpy.testing.assert_array_equal(values(a), 0.5)


@pytest.mark.parametrize("refused", [
    lambda a: float(a[0]),
    lambda a: a.get(),
    lambda a: a.set(numpy.zeros(2)),
    lambda a: a.__setitem__(..., numpy.ones(2)),
    lambda a: xp.asarray(numpy.ones(2)),
    lambda a: a[a > 0],
    lambda a: xp.flatnonzero(a),
    lambda a: xp.cuda.Device().synchronize(),
    lambda a: a @ a,
    lambda a: xp.matmul(a, a),
    lambda a: xp.einsum("i,i->", a, a),
], ids=["float", "get", "set", "assign-host-array", "asarray", "mask", "flatnonzero", "synchronize", "@", "matmul",
        "einsum"])
def test_what_cuda_refuses_in_a_capture_raises_and_loses_it(refused):
    a = xp.zeros(2, dtype=numpy.float64)
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(StreamCaptureError, match="captures a CUDA graph"):
            refused(a)
        assert not stream.is_capturing()
        with pytest.raises(StreamCaptureError, match="invalidated"):
            stream.end_capture()
    float(a[0])  # (reads work again)


def test_the_null_stream_does_not_capture():
    with pytest.raises(StreamCaptureError, match="null stream"):
        xp.cuda.Stream.null.begin_capture()
