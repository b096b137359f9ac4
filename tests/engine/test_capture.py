"""netspec.engine.capture: work captured as a CUDA graph draws, at each launch, the random values the same work
would draw eagerly; its deferred checks are raised as eager ones are; a capture refused leaves the backend as it
was and says why.  Marked ``gpu``: CUDA's graphs on a GPU, the stand-in's in CI."""

from __future__ import annotations

import numpy
import pytest

from netspec.engine.backend import Backend, DeviceGenerator
from netspec.engine.capture import CaptureError, Graph
from netspec.errors import DataError

pytestmark = pytest.mark.gpu


def graphed_backend() -> Backend:
    backend = Backend("gpu", seed=7)
    Graph.stream_for(backend)
    return backend


def test_each_launch_draws_what_the_next_eager_pass_would():
    eager, graphed = Backend("gpu", seed=7), graphed_backend()
    outs = [backend.xp.zeros((3, 5), dtype=numpy.float32) for backend in (eager, graphed)]

    def draw(backend, out):
        def work():
            backend.random(out.shape, numpy.float32, "drop", out=out)
            backend.standard_normal(out.shape, numpy.float32, "data", out=out * 0)  # (two draws, one value array)
            DeviceGenerator(backend, "labels").integers(0, 10, out.shape, numpy.float32, out=out)
            return out
        return work

    draw(eager, outs[0])()
    draw(graphed, outs[1])()  # (an eager pass first, as warm-up)
    graph = Graph(graphed, draw(graphed, outs[1]))
    for _ in range(4):
        draw(eager, outs[0])()
        graph.launch()
        numpy.testing.assert_array_equal(eager.to_host(outs[0]), graphed.to_host(outs[1]))
    assert eager.draws == graphed.draws == {"drop": 5, "data": 10, "labels": 5}


def test_a_check_deferred_in_the_graph_is_raised_at_the_next_read_after_the_launch_that_failed_it():
    backend = graphed_backend()
    labels = backend.xp.zeros(4, dtype=numpy.float32)

    def work():
        backend.check_later(labels >= 3, labels, lambda value, count: f"{count} label(s) of 3 or more, first {value}")

    work()
    graph = Graph(backend, work)
    graph.launch()
    backend.raise_checks()  # (nothing failed)
    labels[2] = 5
    graph.launch()
    with pytest.raises(DataError, match="1 label.s. of 3 or more, first 5"):
        backend.raise_checks()


@pytest.mark.parametrize(("refused", "why"), [
    (lambda backend, a: float(a[0]), "reading a device array on the host|D2H"),
    (lambda backend, a: backend.workspace(1 << 20, numpy.float32), "the shared workspace would grow"),
    (lambda backend, a: backend.check_later(a[:3] > 1, a[:3], lambda value, count: "bad"),
     "a deferred check of values of a new size"),
    (lambda backend, a: a @ a, "matmul"),
], ids=["read", "workspace", "new-check-size", "cupy-matmul"])
def test_a_refused_capture_says_why_and_leaves_the_draw_counts_as_they_were(refused, why):
    backend = graphed_backend()
    a = backend.xp.zeros(4, dtype=numpy.float32)
    backend.workspace(16, numpy.float32)
    backend.random(4, numpy.float32, "x", out=a)

    def work():
        backend.random(4, numpy.float32, "x", out=a)
        refused(backend, a)

    with pytest.raises(CaptureError, match=why):
        Graph(backend, work)
    assert backend.draws == {"x": 1} and backend.capture is None
    work()  # (and the stream works eagerly again)
