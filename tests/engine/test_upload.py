"""Backend.upload and upload_batch: host values copied into a device array, cast and broadcast as
``out[...] = values`` would, through two reused page-locked buffers on a GPU (no temporary on the device); a data
layer's batch on a stream of its own."""

from __future__ import annotations

import numpy
import pytest
from devices import DEVICES

from netspec.engine import gpu_standin
from netspec.engine.backend import Backend


@pytest.mark.parametrize("device", DEVICES)
def test_every_upload_lands_whole_cast_and_broadcast_as_an_assignment_would(device):
    backend, rng = Backend(device), numpy.random.default_rng(3)
    out = backend.xp.zeros((4, 3), dtype=numpy.float32)
    batches = [rng.standard_normal((4, 3)) for _ in range(5)]  # (float64: cast on the way; more than two buffers)
    gpu_standin.reset_counts()
    for batch in batches:
        backend.upload(batch, out)
        numpy.testing.assert_array_equal(backend.to_host(out), batch.astype(numpy.float32))
    backend.upload(numpy.arange(3), out)  # (a row for every row)
    numpy.testing.assert_array_equal(backend.to_host(out), numpy.tile(numpy.arange(3, dtype=numpy.float32), (4, 1)))
    if device == "gpu":
        assert gpu_standin.uploads == {"set": 6}  # (no device temporary: asarray would count)
        assert [len(ring) for ring in backend._staging.values()] == [2]


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_batches_reach_the_device_on_a_stream_of_their_own(device, monkeypatch):
    """A data layer's batch: copied on a stream of its own (on a GPU) into a device buffer, which the current
    stream copies into ``out`` once that copy is done; a batch in a page-locked array from ``host_empty`` is copied
    from where it is, others through a page-locked buffer first."""
    backend = Backend(device)
    out = backend.xp.zeros((4, 3), dtype=numpy.float32)
    streams = []
    if device == "gpu":
        queue = gpu_standin._Stream.queue
        monkeypatch.setattr(gpu_standin._Stream, "queue", lambda self, work: streams.append(self) or queue(self, work))
    for value in range(5):
        batch = backend.host_empty((4, 3), numpy.float32)
        batch[...] = value
        backend.upload_batch(batch, out)
        numpy.testing.assert_array_equal(backend.to_host(out), numpy.full((4, 3), value, numpy.float32))
    backend.upload_batch(numpy.arange(3), out)  # (pageable, cast and broadcast)
    numpy.testing.assert_array_equal(backend.to_host(out), numpy.tile(numpy.arange(3, dtype=numpy.float32), (4, 1)))
    if device == "gpu":
        assert len(streams) == 6 and len(set(streams)) == 1  # (each copy queued on the one copy stream...)
        assert streams[0] is not gpu_standin.cuda.get_current_stream()  # (... not the current one)
        (ring,) = backend._batch_staging.values()
        assert [staging.host is not None for staging in ring] == [False, True]  # (one page-locked buffer, once)


@pytest.mark.gpu
def test_the_stand_in_refuses_a_set_that_cupy_refuses():
    array = gpu_standin.zeros((2, 2), dtype=numpy.float32)
    with pytest.raises(ValueError, match="CuPy refuses a mismatch"):
        array.set(numpy.zeros((2, 2)))
    with pytest.raises(TypeError, match="Only numpy.ndarray"):
        array.set([[0, 0], [0, 0]])
