"""The one place that knows numpy from cupy.

Layers never import numpy or cupy for array math: they use ``self.xp`` (the
array module of their backend) and the helpers here.  Random numbers for
initialisation always come from a numpy generator on the host, so a net starts
from the same weights on every device; per-iteration randomness (dropout
masks) comes from :meth:`Backend.random`, values made on the device from
(seed, rank, layer, the layer's draw number) alone.

A backend also knows its process's place in a distributed run (``comm``, see
:mod:`netspec.training.distributed`): the host generator is the same on every rank (so
all build the same net and read the same data order) while each rank's
stream of device values is its own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import resource
import time
from collections.abc import Callable

import numpy

from netspec import threads
from netspec.engine import gpu_standin, kernels
from netspec.engine.comm import SingleProcess
from netspec.errors import DataError, DeviceError

CHECKS_KEPT = 1000  # checks a GPU backend keeps before reading them all


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
        self._checks: list[tuple] = []  # (failures, first value, describe) of checks not raised yet
        self.defer_checks = self.is_gpu  # whether checks wait for the next read (on a GPU: it is not waited for)
        self._workspace = None  # (see workspace)
        self.seed(seed)

    @property
    def is_gpu(self) -> bool:
        """True when arrays live on a GPU."""
        return self.xp is not numpy

    def seed(self, seed: int | None) -> None:
        """Reseed the host generator and the device's streams of random values (None: from the OS).

        The streams (:meth:`random`) of rank R are keyed by ``(stream seed, R)``, so ranks draw different
        dropout masks, and start again at draw 0; the stream seed is ``seed``, or drawn from the OS, and kept
        in :attr:`stream` so that a snapshot can give it back.
        """
        self.seed_value = seed
        self.host_rng = numpy.random.default_rng(seed)
        self.stream = (numpy.random.SeedSequence().entropy if seed is None else seed, {})

    @property
    def stream(self) -> tuple[int, dict[str, int]]:
        """``(stream seed, {name: draws made})``: what :meth:`random`'s values depend on (with the rank);
        snapshots keep it."""
        return self._stream_seed, dict(self.draws)

    @stream.setter
    def stream(self, value: tuple[int, dict[str, int]]) -> None:
        self._stream_seed, self.draws = int(value[0]), {str(name): int(count) for name, count in value[1].items()}
        words = numpy.random.SeedSequence([self._stream_seed, self.comm.rank]).generate_state(1, numpy.uint64)
        self._stream_key = int(words[0])

    def random(self, shape, dtype=numpy.float32, name: str = ""):
        """Values uniform in [0, 1) of ``shape`` (a tuple, an int, or None for one value), made on the device:
        the next draw of the stream ``name`` (a layer draws from the stream of its name).

        Draw n of stream ``name`` is a hash (SplitMix64's finaliser) of each
        element's index plus a 64-bit offset mixed from (stream key, name, n):
        it depends only on the stream seed, the rank, the name and n (a layer's
        n counts its forward passes), never on a generator's state or on other
        layers, so a run that restores :attr:`stream` (snapshots keep it)
        continues with the same values on any device.  Values carry as many
        random bits as the dtype's significand (24 for float32).
        """
        xp, dtype = self.xp, numpy.dtype(dtype)
        shape = _shape(shape)
        offset = self.next_offset(name)
        kept = {2: 11, 4: 24}.get(dtype.itemsize, 53)  # the bits the dtype's significand holds
        if kernels.compiled(xp):
            values = xp.empty(shape, dtype=dtype)
            kernels.uniform(values, offset, kept)
            return values
        if xp is numpy:
            values = numpy.empty(shape, dtype=dtype)

            def draw(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
                _hash_into(bits[0], spare, start, offset, kept)
                # (exact: the bits fit the significand; read as int64, which converts faster than uint64)
                numpy.multiply(bits[0].view(numpy.int64), dtype.type(2.0 ** -kept), out=part, casting="unsafe")

            _in_chunks(values, 1, draw)
            return values
        bits = xp.arange(math.prod(shape), dtype=numpy.uint64)
        bits += numpy.uint64(offset)  # (wrapping past 2**64)
        _mix_in_place(bits)
        bits >>= numpy.uint64(64 - kept)
        values = bits.astype(dtype)
        values *= dtype.type(2.0 ** -kept)
        return values.reshape(shape)

    def standard_normal(self, shape, dtype=numpy.float64, name: str = ""):
        """Values of the standard normal distribution of ``shape``, made on the device from the next two draws of
        the stream ``name`` (:meth:`random`'s, as float64): Box-Muller's ``sqrt(-2 log(1 - u)) cos(2 pi v)``."""
        xp, shape = self.xp, _shape(shape)
        if kernels.compiled(xp):
            values = xp.empty(shape, dtype=dtype)
            kernels.standard_normal(values, self.next_offset(name), self.next_offset(name))
            return values
        if xp is numpy:
            values = numpy.empty(shape, dtype=dtype)
            radii, angles = self.next_offset(name), self.next_offset(name)

            def draw(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
                radius, angle = bits  # (every array below is one of these three, for no temporaries)
                for hashes, offset in ((radius, radii), (angle, angles)):
                    _hash_into(hashes, spare, start, offset, 53)
                u = numpy.multiply(radius, 2.0 ** -53, out=spare.view(numpy.float64))
                squared = numpy.multiply(numpy.log1p(numpy.negative(u, out=u), out=u), -2.0, out=u)
                turn = numpy.multiply(angle, 2.0 ** -53, out=radius.view(numpy.float64))
                turn *= 2.0 * math.pi
                if values.dtype.itemsize > 4:
                    numpy.multiply(numpy.sqrt(squared, out=squared), numpy.cos(turn, out=turn), out=part)
                    return
                # (float32 runs many times faster; the logarithm in float64 keeps the radius precise at u near
                # 0 and 1)
                narrow = angle.view(numpy.float32)
                length, cosine = narrow[:len(part)], narrow[len(part):]
                numpy.copyto(length, squared, casting="same_kind")
                numpy.copyto(cosine, turn, casting="same_kind")
                numpy.multiply(numpy.sqrt(length, out=length), numpy.cos(cosine, out=cosine), out=part)

            _in_chunks(values, 2, draw)
            return values
        radius = xp.sqrt(-2.0 * xp.log1p(-self.random(shape, numpy.float64, name)))
        return (radius * xp.cos(2.0 * math.pi * self.random(shape, numpy.float64, name))).astype(dtype)

    def next_offset(self, name: str) -> int:
        """The 64-bit offset of the next draw of stream ``name`` (mixed from the stream key, the name and the
        draw's number), counting the draw."""
        count = self.draws.get(name, 0)
        self.draws[name] = count + 1
        return _mixed(self._stream_key ^ _mixed(_stream_label(name) ^ _mixed(count)))

    def fork(self) -> Backend:
        """A backend on the same device and ranks with generators of its own, seeded from this one's seed.

        Test nets draw from one, so testing never changes the random numbers training sees.
        """
        seed = self.seed_value
        if seed is not None:
            seed = int(numpy.random.SeedSequence([seed, 1]).generate_state(1)[0])
        return Backend(self.device, seed, self.comm)

    def rng_state(self) -> str:
        """The host generator's state as JSON text, for solver states (which keep :attr:`stream` beside it)."""
        return json.dumps(self.host_rng.bit_generator.state)

    def set_rng_state(self, text: str) -> None:
        """Restore a state from :meth:`rng_state`."""
        self.host_rng.bit_generator.state = json.loads(text)

    def asarray(self, array, dtype=None):
        """``array`` on this device (copied from the host when needed)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_host(self, array) -> numpy.ndarray:
        """``array`` as a numpy array on the host."""
        if self.is_gpu:
            return self.xp.asnumpy(array)
        return numpy.asarray(array)

    def check_later(self, bad, values, describe: Callable[[int | str, int], str]) -> None:
        """Note a check of ``values`` whose failures ``bad`` marks: a DataError of ``describe(the first failing
        value, as the blob holds it, how many fail)``.  On the CPU it is raised at once; on a GPU
        (:attr:`defer_checks`) the count and the first value are taken on the device and :meth:`raise_checks`
        raises it when the host next reads (every CHECKS_KEPT notes at the latest), so the GPU is not waited
        for."""
        flat = bad.reshape(-1)
        if not flat.size:
            return
        check = (self.xp.count_nonzero(flat), values.reshape(-1)[self.xp.argmax(flat)], describe)
        if not self.defer_checks:
            self._raise_failed(int(check[0]), *check[1:])
            return
        self._checks.append(check)
        if len(self._checks) >= CHECKS_KEPT:
            self.raise_checks()

    def raise_checks(self) -> None:
        """Raise the DataError of the first check noted by :meth:`check_later` that failed (all are then
        forgotten); the counts come to the host in one copy."""
        if not self._checks:
            return
        checks, self._checks = self._checks, []
        counts = self.to_host(self.xp.stack([self.xp.asarray(count) for count, _, _ in checks])).tolist()
        for count, (_, first, describe) in zip(counts, checks):
            self._raise_failed(count, first, describe)

    def _raise_failed(self, count: int, first, describe: Callable[[int | str, int], str]) -> None:
        """The DataError of a check with ``count`` failures, the first being ``first`` (on the device); none
        when it has none."""
        if count:
            value = self.to_host(first)[()]  # in the blob's dtype: float32 1.7 shows as 1.7
            shown = int(value) if float(value).is_integer() and abs(float(value)) < 2 ** 53 else str(value)
            raise DataError(describe(shown, count))

    def workspace(self, count: int, dtype):
        """Scratch space for ``count`` values of ``dtype``, shared by every layer on this backend: a layer uses
        it within one pass (its columns, say), so the next one may overwrite it.  It grows to the largest asked
        for and stays; layers ask at setup for what they will use, so it is made once."""
        size = count * numpy.dtype(dtype).itemsize
        if self._workspace is None or self._workspace.size < size:
            self._workspace = None  # (the smaller one given back first)
            self._workspace = self.xp.empty(size, dtype=numpy.uint8)
        return self._workspace[:size].view(dtype)

    def address(self, array) -> int:
        """Where ``array``'s memory starts on its device (arrays sharing memory share it)."""
        return array.data.ptr if self.is_gpu else array.__array_interface__["data"][0]

    def peak_memory(self) -> tuple[int, str]:
        """``(bytes, what they are)``: on the CPU the most memory the process has held so far; on a GPU what
        CuPy's pool holds now, which keeps the blocks freed since the peak (unless given back) and leaves out
        memory taken beside it."""
        if self.is_gpu:
            return self.xp.get_default_memory_pool().total_bytes(), "CuPy's memory pool on the GPU"
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "the process's peak resident memory"

    def synchronize(self) -> None:
        """Wait for queued device work (timing needs it on a GPU)."""
        if self.is_gpu:
            self.xp.cuda.Device().synchronize()

    def mark(self):
        """A mark in the device's queue of work, to time what runs between two (:meth:`elapsed_ms`): on a GPU a
        CUDA event recorded on the current stream (the GPU takes its time when it gets there; the host does not
        wait), on the CPU the host's clock."""
        if self.is_gpu:
            event = self.xp.cuda.Event()
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, start, end) -> float:
        """Milliseconds from mark ``start`` to mark ``end`` (on a GPU, once the GPU has got to ``end``)."""
        if self.is_gpu:
            end.synchronize()
            return float(self.xp.cuda.get_elapsed_time(start, end))
        return 1000 * (end - start)


class DeviceGenerator:
    """The part of NumPy's ``Generator`` that the fillers use, drawing from a backend's stream ``name`` of device
    values (:meth:`Backend.random`): a filler given one makes its values on the device."""

    def __init__(self, backend: Backend, name: str = ""):
        self.backend, self.name = backend, name

    def random(self, size, dtype=numpy.float64):
        """Values uniform in [0, 1)."""
        return self.backend.random(size, dtype, self.name)

    def uniform(self, low: float = 0.0, high: float = 1.0, size=None):
        """Values uniform in [low, high), as float64."""
        values = self.random(size)
        values *= high - low  # (in place: a large draw allocates once)
        values += low
        return values

    def integers(self, low: int, high: int, size=None):
        """Whole numbers low, low + 1, ..., high - 1, as int64: the floor of :meth:`uniform`'s values."""
        xp = self.backend.xp
        if kernels.compiled(xp):
            values = xp.empty(_shape(size), dtype=numpy.int64)
            kernels.integers(values, self.backend.next_offset(self.name), low, high)
            return values
        drawn = self.uniform(low, high, size)
        values = xp.floor(drawn, out=drawn).astype(numpy.int64)
        return xp.minimum(values, high - 1, out=values)  # (a product rounded up to high)

    def standard_normal(self, size, dtype=numpy.float64):
        """Values of the standard normal distribution (:meth:`Backend.standard_normal`)."""
        return self.backend.standard_normal(size, dtype, self.name)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size=None):
        """Values of the normal distribution of mean ``loc`` and standard deviation ``scale``, as float64."""
        return loc + scale * self.standard_normal(size)


def _shape(shape) -> tuple[int, ...]:
    """A shape given as a tuple, an int, or None for one value, as a tuple."""
    return () if shape is None else (shape,) if isinstance(shape, int) else tuple(shape)


MASK64 = 2 ** 64 - 1
MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # SplitMix64's constants


@functools.cache
def _stream_label(name: str) -> int:
    """A stream's name as a 64-bit number, the same in every process (Python's own hash of a str is not)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _mixed(value: int) -> int:
    """SplitMix64's finaliser of a whole number (taken modulo 2**64), on the host."""
    value = value * MIX[0] & MASK64
    value = (value ^ value >> 30) * MIX[1] & MASK64
    value = (value ^ value >> 27) * MIX[2] & MASK64
    return value ^ value >> 31


HOST_CHUNK = 65536  # values a host draw makes at a time: its arrays stay in the core's cache
_POSITIONS = numpy.arange(HOST_CHUNK, dtype=numpy.uint64)
THREADED_VALUES = 1 << 20  # values from which a host draw runs on every core


def _in_chunks(values: numpy.ndarray, hashes: int, draw: Callable) -> None:
    """``draw(start, part, bits, spare)`` over the flat ``values``, HOST_CHUNK at a time, with room for the
    chunk's ``hashes`` arrays of hashes (``bits``, uint64) and a ``spare`` one, on every core (a part of the values
    each: :func:`netspec.threads.in_parts`) where they are many enough to pay for the threads' start."""
    flat = values.reshape(-1)

    def run(part: slice) -> None:
        room = numpy.empty((hashes + 1, min(HOST_CHUNK, part.stop - part.start)), dtype=numpy.uint64)
        for start in range(part.start, part.stop, HOST_CHUNK):
            count = min(HOST_CHUNK, part.stop - start)
            draw(start, flat[start:start + count], list(room[:hashes, :count]), room[hashes, :count])

    if flat.size < THREADED_VALUES:
        run(slice(0, flat.size))
    else:
        threads.in_parts(flat.size, run)


def _hash_into(bits: numpy.ndarray, spare: numpy.ndarray, start: int, offset: int, kept: int) -> None:
    """The top ``kept`` bits of the hashes of elements ``start .. start + len(bits) - 1`` of the draw at
    ``offset`` (:meth:`Backend.random`'s bits), written into ``bits`` (uint64; ``spare`` as large) on the host."""
    numpy.add(_POSITIONS[:len(bits)], numpy.uint64((offset + start) & MASK64), out=bits)  # (wrapping past 2**64)
    _mix_in_place(bits, spare, kept)
    bits >>= numpy.uint64(64 - kept)


def _mix_in_place(values, spare=None, kept: int = 64) -> None:
    """:func:`_mixed` of every value of a uint64 array, in place (products wrap modulo 2**64 on NumPy and CuPy),
    as far as its top ``kept`` bits go: the last step changes none of the top 31, so it is left out for those.
    ``spare`` (an array of the same shape) takes the shifted copies instead of temporaries."""
    for step, (multiplier, shift) in enumerate(zip(MIX, (30, 27, 31))):
        values *= numpy.uint64(multiplier)
        if step == 2 and kept <= 31:  # (v ^ v >> 31) >> (64 - kept) is v >> (64 - kept) there
            return
        shifted = values >> numpy.uint64(shift) if spare is None else \
            numpy.right_shift(values, numpy.uint64(shift), out=spare)
        values ^= shifted


def gpu_report() -> list[str]:
    """Lines on the GPUs CuPy sees: CuPy's version, the CUDA runtime's and the driver's, then each GPU's name,
    compute capability and free and total memory; one line saying why there is none otherwise."""
    if gpu_standin.requested():
        return [f"gpu: {gpu_standin.DESCRIPTION}", "gpu:0: the stand-in: proves no CUDA kernel and no speed"]
    try:
        import cupy
    except ImportError as exc:
        return [f"gpu: none: CuPy cannot be imported ({_first_line(exc)}; pip install -e '.[gpu]')"]
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
        versions = f"CUDA runtime {_cuda_version(runtime.runtimeGetVersion())}, driver {_driver_release()} " \
                   f"(CUDA {_cuda_version(runtime.driverGetVersion())})"
    except runtime.CUDARuntimeError as exc:
        return [f"gpu: none: CUDA answers {exc} (CuPy {cupy.__version__}, driver {_driver_release()})"]
    lines = [f"gpu: CuPy {cupy.__version__}, {versions}"]
    for index in range(count):
        properties = runtime.getDeviceProperties(index)
        with cupy.cuda.Device(index):
            free, total = runtime.memGetInfo()
        lines.append(f"gpu:{index}: {properties['name'].decode()}, compute capability {properties['major']}."
                     f"{properties['minor']}, {free / 2 ** 30:.1f} GiB free of {total / 2 ** 30:.1f} GiB")
    return lines if count else [*lines, "gpu: none: CUDA sees no GPU"]


def _first_line(exc: BaseException) -> str:
    """An exception's message, its first line alone."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _cuda_version(number: int) -> str:
    """CUDA's version number (13000) as people write it (13.0)."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _driver_release() -> str:
    """The NVIDIA driver's release, from the kernel module's version file ('unknown' where there is none)."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as handle:
            words = handle.readline().split()
    except OSError:
        return "unknown"
    return next((word for word in words if word[:1].isdigit() and "." in word), "unknown")


def _import_cupy(device: str):
    """The array module of ``device`` (``gpu`` or ``gpu:N``): CuPy with that GPU made current, or the stand-in
    (:mod:`netspec.engine.gpu_standin`) where ``NETSPEC_GPU_STANDIN=1``; a DeviceError saying why otherwise."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if gpu_standin.requested():
        if index:
            raise DeviceError(f"device '{device}' is not here: the GPU stand-in has one device, gpu:0")
        return gpu_standin
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError(f"device '{device}' needs CuPy, which cannot be imported ({_first_line(exc)}): "
                          "pip install -e '.[gpu]'") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise DeviceError(f"device '{device}' cannot be used: CUDA answers {exc} (driver {_driver_release()}, "
                          f"CuPy {cupy.__version__}; `netspec device-query` says more)") from None
    if index >= count:
        raise DeviceError(f"device '{device}' is not here: CuPy sees {count} GPU(s)"
                          + (f", gpu:0 to gpu:{count - 1}" if count else ""))
    cupy.cuda.Device(index).use()
    return cupy
