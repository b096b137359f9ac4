"""The one place that knows numpy from cupy.

Layers never import numpy or cupy for array math: they use ``self.xp`` (the
array module of their backend) and the helpers here.  Random numbers for
initialisation always come from a numpy generator on the host, so a net starts
from the same weights on every device; per-iteration randomness (dropout
masks) uses the device generator.

A backend also knows its process's place in a distributed run (``comm``, see
:mod:`netspec.training.distributed`): the host generator is the same on every rank (so
all build the same net and read the same data order) while each rank's
per-iteration generator is its own.
"""

from __future__ import annotations

import json

import numpy

from netspec.engine.comm import SingleProcess
from netspec.errors import DeviceError


class Backend:
    """A device: its array module, random generators, transfers, and the ranks it trains with."""

    def __init__(self, device: str = "cpu", seed: int | None = None, comm=None):
        self.device = device
        self.comm = comm or SingleProcess()
        if device == "cpu":
            self.xp = numpy
        elif device == "gpu" or (device.startswith("gpu:") and device[4:].isdigit()):
            self.xp = _import_cupy(device)
        else:
            raise DeviceError(f"unknown device '{device}': use cpu, gpu or gpu:N")
        self.seed(seed)

    @property
    def is_gpu(self) -> bool:
        """True when arrays live on a GPU."""
        return self.xp is not numpy

    def seed(self, seed: int | None) -> None:
        """Reseed the host and device generators (None: from the OS).

        With several ranks the per-iteration generator of rank R is seeded
        with ``(seed, R)``, so ranks draw different dropout masks.
        """
        self.seed_value = seed
        self.host_rng = numpy.random.default_rng(seed)
        if self.is_gpu:
            self.rng = self.xp.random.default_rng(seed)
        elif self.comm.size > 1:
            self.rng = numpy.random.default_rng(None if seed is None else [seed, self.comm.rank])
        else:
            self.rng = self.host_rng

    def fork(self) -> Backend:
        """A backend on the same device and ranks with generators of its own, seeded from this one's seed.

        Test nets draw from one, so testing never changes the random numbers training sees.
        """
        seed = self.seed_value
        if seed is not None:
            seed = int(numpy.random.SeedSequence([seed, 1]).generate_state(1)[0])
        return Backend(self.device, seed, self.comm)

    def rng_state(self) -> str:
        """The host generator's state as JSON text, for solver states.

        On a CPU this is every random number netspec draws.  On a GPU the device
        generator (dropout masks, DummyData) is not included yet.
        """
        return json.dumps(self.host_rng.bit_generator.state)

    def set_rng_state(self, text: str) -> None:
        """Restore a state from :meth:`rng_state`."""
        self.host_rng.bit_generator.state = json.loads(text)

    def rank_rng_state(self) -> str:
        """This rank's own per-iteration generator state as JSON text ("" when it is the host's)."""
        if self.is_gpu or self.rng is self.host_rng:
            return ""
        return json.dumps(self.rng.bit_generator.state)

    def set_rank_rng_state(self, text: str) -> None:
        """Restore a state from :meth:`rank_rng_state`."""
        if text:
            self.rng.bit_generator.state = json.loads(text)

    def asarray(self, array, dtype=None):
        """``array`` on this device (copied from the host when needed)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_host(self, array) -> numpy.ndarray:
        """``array`` as a numpy array on the host."""
        if self.is_gpu:
            return self.xp.asnumpy(array)
        return numpy.asarray(array)

    def synchronize(self) -> None:
        """Wait for queued device work (timing needs it on a GPU)."""
        if self.is_gpu:
            self.xp.cuda.Device().synchronize()


def _import_cupy(device: str):
    try:
        import cupy
    except ImportError:
        raise DeviceError(f"device '{device}' needs CuPy: pip install -e '.[gpu]'") from None
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0
    if index >= count:
        raise DeviceError(f"device '{device}' is not here: CuPy sees {count} GPU(s)")
    cupy.cuda.Device(index).use()
    return cupy
