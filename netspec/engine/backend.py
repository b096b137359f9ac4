"""The one place that knows numpy from cupy.

Layers never import numpy or cupy for array math: they use ``self.xp`` (the
array module of their backend) and the helpers here.  Random numbers for
initialisation always come from a numpy generator on the host, so a net starts
from the same weights on every device; per-iteration randomness (dropout
masks, DummyData's fillers) comes from :meth:`Backend.random` and the draws
built on it, values made on the device from (seed, rank, layer, the layer's
draw number) alone.

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
from dataclasses import dataclass

import numpy

from netspec import threads
from netspec.engine import cudnn_conv, gpu_standin, kernels
from netspec.engine.capture import CaptureError
from netspec.engine.comm import SingleProcess
from netspec.errors import DataError, DeviceError, first_line

CHECKS_KEPT = 1000  # checks a GPU backend notes before reading them


@dataclass
class _Marks:
    """Where the checks of values of one size and type failed first: at each position the number of the first
    check that failed there (-1: none yet) and the value it failed on."""

    when: object
    value: object
    noted: int = 0  # the number of the last check noted into them


@dataclass
class _Staging:
    """One of the two places values of one shape and type go through on their way to the GPU: a page-locked host
    buffer (made when first needed), the host array the last copy read (kept until the copy is done), the event of
    that copy (None: none yet); for batches also a device buffer and the event of the current stream's last read
    of it."""

    host: numpy.ndarray | None = None
    source: numpy.ndarray | None = None
    copied: object = None
    device: object = None
    read: object = None


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
        self._marks: dict[tuple, _Marks] = {}  # (size, dtype) -> where the checks of such values failed first
        self._describes: dict[int, Callable] = {}  # the describe function of each check noted since the last read
        self._noted = 0  # checks noted so far (each one's number)
        self.defer_checks = self.is_gpu  # whether checks wait for the next read (on a GPU: it is not waited for)
        self._workspace = None  # (see workspace)
        self._workspace_views: dict = {}  # (bytes, dtype) -> the view of the workspace workspace() gave for them
        self._ones: dict = {}  # dtype -> the vector of ones (see ones)
        self._staging: dict[tuple, list[_Staging]] = {}  # (shape, dtype) -> the two places of upload
        self._batch_staging: dict[tuple, list[_Staging]] = {}  # ... of upload_batch
        self._copy_stream = None  # the stream upload_batch copies on (made when first needed)
        self.capture = None  # what the CUDA graph being captured notes (netspec.engine.capture.Recording)
        self.graph_pools: list = []  # the memory pools of the CUDA graphs captured on this backend
        self.deterministic = False  # only deterministic algorithms where there is a choice (cuDNN's engines)
        # how float32 products and convolutions compute on a GPU (the solver's precision): fp32; tf32, on TF32's
        # tensor cores; bf16-mixed and fp16-mixed, from their operands rounded to 16 bits (netspec.engine.half)
        self.precision = "fp32"
        self._half = None  # the scratch of half_scratch
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

    def random(self, shape, dtype=numpy.float32, name: str = "", out=None):
        """Values uniform in [0, 1) of ``shape`` (a tuple, an int, or None for one value), made on the device:
        the next draw of the stream ``name`` (a layer draws from the stream of its name).

        Draw n of stream ``name`` is made of 64-bit hashes (SplitMix64's
        finaliser) of an index plus a 64-bit offset mixed from (stream key,
        name, n): it depends only on the stream seed, the rank, the name and n
        (a layer's n counts its forward passes), never on a generator's state
        or on other layers, so a run that restores :attr:`stream` (snapshots
        keep it) continues with the same values on any device.  Values carry
        as many random bits as the dtype's significand: float64 value i is
        the top 53 bits of hash i; float32 (float16) value i the top 24 (11)
        bits of the draw's 32-bit word i, hash j making words 2j (its low
        half) and 2j + 1 (its high half).  ``out``, a C-contiguous array of
        ``shape`` and ``dtype``, takes the values (and is returned).
        """
        xp, dtype = self.xp, numpy.dtype(dtype)
        values = _output(xp, _shape(shape), dtype, out)
        offset = self.next_offset(name)
        kept = _kept_bits(dtype)
        if kernels.compiled(xp):
            kernels.uniform(values, offset, kept)
            return values
        if xp is not numpy:
            bits = _device_bits(xp, values.size, offset, words=kept < 53)
            bits >>= bits.dtype.type(bits.dtype.itemsize * 8 - kept)
            values[...] = (bits.astype(dtype) * dtype.type(2.0 ** -kept)).reshape(values.shape)
            return values
        if kept == 53:
            def draw(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
                hashes = _hash_into(bits[0], spare, start, offset)
                hashes >>= numpy.uint64(11)
                # (exact: the bits fit the significand; read as int64, which converts faster than uint64)
                numpy.multiply(hashes.view(numpy.int64), 2.0 ** -53, out=part)

            _in_chunks(values, 1, draw)
            return values

        def draw_words(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
            words = _words_into(bits[0], spare, start, offset, len(part))
            words >>= numpy.uint32(32 - kept)
            numpy.copyto(part, words.view(numpy.int32), casting="unsafe")  # (exact; faster than a mixed multiply)
            part *= dtype.type(2.0 ** -kept)

        _in_chunks(values, 1, draw_words, values_per_hash=2)
        return values

    def random_at_least(self, shape, threshold: float, dtype=numpy.float32, name: str = ""):
        """``random(shape, dtype, name) >= threshold`` (booleans, the threshold in ``dtype``) from the same draw;
        on the CPU a float32 or float16 draw compares its words with the threshold's without making the
        values (a dropout mask)."""
        dtype = numpy.dtype(dtype)
        kept = _kept_bits(dtype)
        if self.xp is not numpy or kept == 53:
            return self.random(shape, dtype, name) >= dtype.type(threshold)
        offset = self.next_offset(name)
        level = float(dtype.type(threshold))
        # the first k with k * 2**-kept >= level (2**kept: none; a NaN level is met by none)
        least = math.ceil(level * 2.0 ** kept) if 0 < level < 1 else 0 if level <= 0 else 2 ** kept
        mask = numpy.full(_shape(shape), least <= 0)
        if 0 < least < 2 ** kept:
            word = numpy.uint32(least << (32 - kept))  # (k >= least exactly where k's word >= this)

            def draw(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
                numpy.greater_equal(_words_into(bits[0], spare, start, offset, len(part)), word, out=part)

            _in_chunks(mask, 1, draw, values_per_hash=2)
        return mask

    def standard_normal(self, shape, dtype=numpy.float64, name: str = "", out=None):
        """Values of the standard normal distribution of ``shape``, made on the device from the next two draws of
        the stream ``name`` (:meth:`random`'s, as float64, of half as many values): Box-Muller's pair from
        ``u`` and ``v``, value 2j ``sqrt(-2 log(1 - u_j)) cos(2 pi v_j)`` and value 2j + 1 the same with ``sin``
        (``out`` as :meth:`random`'s)."""
        xp = self.xp
        values = _output(xp, _shape(shape), numpy.dtype(dtype), out)
        if kernels.compiled(xp):
            kernels.standard_normal(values, self.next_offset(name), self.next_offset(name))
            return values
        radii, angles = self.next_offset(name), self.next_offset(name)
        if xp is not numpy:
            count = values.size
            radius, turn = (_device_bits(xp, (count + 1) // 2, offset, words=False) >> numpy.uint64(11)
                            for offset in (radii, angles))
            radius = xp.sqrt(-2.0 * xp.log(1.0 - radius.astype(numpy.float64) * 2.0 ** -53))
            turn = turn.astype(numpy.float64) * 2.0 ** -53
            turn *= 2.0 * math.pi
            pairs = xp.empty(2 * len(radius))
            pairs[0::2], pairs[1::2] = radius * xp.cos(turn), radius * xp.sin(turn)
            values[...] = pairs[:count].astype(values.dtype).reshape(values.shape)
            return values

        def draw(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
            radius, angle = bits  # (every array below is one of these three, for no temporaries)
            for hashes, offset in ((radius, radii), (angle, angles)):
                _hash_into(hashes, spare, start, offset)
                hashes >>= numpy.uint64(11)
            # 1 - u, exact (u is a multiple of 2**-53 below 1); its log runs twice as fast as log1p(-u) on AVX2
            remaining = numpy.multiply(radius.view(numpy.int64), -2.0 ** -53, out=spare.view(numpy.float64))
            remaining += 1.0
            squared = numpy.multiply(numpy.log(remaining, out=remaining), -2.0, out=remaining)
            turn = numpy.multiply(angle.view(numpy.int64), 2.0 ** -53, out=radius.view(numpy.float64))
            turn *= 2.0 * math.pi
            odd = len(part) // 2  # (the values 2j + 1: one fewer than the pairs where the draw ends on a cos)
            if values.dtype.itemsize > 4:
                length = numpy.sqrt(squared, out=squared)
                numpy.multiply(length, numpy.cos(turn, out=angle.view(numpy.float64)), out=part[0::2])
                numpy.multiply(length[:odd], numpy.sin(turn, out=turn)[:odd], out=part[1::2])
                return
            # (float32 runs many times faster; the logarithm in float64 keeps the radius precise at u near 0 and 1)
            pairs = len(radius)
            narrow = angle.view(numpy.float32)
            length, cosine = narrow[:pairs], narrow[pairs:]
            numpy.copyto(length, squared, casting="same_kind")
            numpy.copyto(cosine, turn, casting="same_kind")
            numpy.sqrt(length, out=length)
            sine = numpy.sin(cosine, out=spare.view(numpy.float32)[:pairs])
            numpy.multiply(length, numpy.cos(cosine, out=cosine), out=part[0::2])
            numpy.multiply(length[:odd], sine[:odd], out=part[1::2])

        _in_chunks(values, 2, draw, values_per_hash=2)
        return values

    def next_offset(self, name: str):
        """The 64-bit offset of the next draw of stream ``name`` (mixed from the stream key, the name and the
        draw's number), counting the draw; while a CUDA graph is captured, the device value (0-d) in which each
        launch finds the offset of its draw (:meth:`netspec.engine.capture.Recording.draw`)."""
        count = self.draws.get(name, 0)
        self.draws[name] = count + 1
        offset = _mixed(self._stream_key ^ _mixed(_stream_label(name) ^ _mixed(count)))
        return offset if self.capture is None else self.capture.draw(name, offset)

    def fork(self) -> Backend:
        """A backend on the same device and ranks with generators of its own, seeded from this one's seed.

        Test nets draw from one, so testing never changes the random numbers training sees.
        """
        seed = self.seed_value
        if seed is not None:
            seed = int(numpy.random.SeedSequence([seed, 1]).generate_state(1)[0])
        forked = Backend(self.device, seed, self.comm)
        forked.deterministic = self.deterministic
        forked.precision = self.precision
        return forked

    def rng_state(self) -> str:
        """The host generator's state as JSON text, for solver states (which keep :attr:`stream` beside it)."""
        return json.dumps(self.host_rng.bit_generator.state)

    def set_rng_state(self, text: str) -> None:
        """Restore a state from :meth:`rng_state`."""
        self.host_rng.bit_generator.state = json.loads(text)

    def asarray(self, array, dtype=None):
        """``array`` on this device (copied from the host when needed)."""
        return self.xp.asarray(array, dtype=dtype)

    def upload(self, values, out) -> None:
        """Copy the host array ``values`` into the device array ``out`` (C-contiguous), cast to its dtype and
        broadcast to its shape as ``out[...] = values`` would: a few values the work reads (the rates of an update,
        the offsets of a graph's random draws).  On a GPU the host does not wait for the copy, nor is a temporary
        made on the device: the values go into one of two page-locked host buffers kept for that shape and type,
        copied from there in the current stream's order (every kernel before has read ``out``'s old values, every
        one after sees the new); a buffer is refilled only when its last copy is done."""
        if not self.is_gpu:
            out[...] = values
            return
        staging = self._next_staging(self._staging, out)
        out.set(self._page_locked_source(staging, values, out), stream=self.xp.cuda.get_current_stream())
        staging.copied.record()

    def upload_batch(self, values, out) -> None:
        """Copy a data layer's batch (the host array ``values``) into the device array ``out`` as :meth:`upload`
        does, without holding up the GPU's work.  On a GPU the copy runs on a stream of its own into one of two
        device buffers kept for ``out``'s shape and type, while the work queued before it runs; the current stream
        waits for that copy only to copy the buffer into ``out`` in its own order.  ``values`` made by
        :meth:`host_empty` (page-locked, of ``out``'s shape and type) are copied from where they are; others
        through a page-locked buffer first."""
        if not self.is_gpu:
            out[...] = values
            return
        cuda = self.xp.cuda
        staging = self._next_staging(self._batch_staging, out)
        if staging.device is None:  # (its memory may have been read by work queued before: waited for below)
            staging.device = self.xp.empty_like(out)
            staging.read = cuda.Event(disable_timing=True)
            staging.read.record()
        if self._copy_stream is None:
            self._copy_stream = cuda.Stream(non_blocking=True)
        source = self._page_locked_source(staging, values, out)
        self._copy_stream.wait_event(staging.read)  # (the current stream has copied the buffer's last batch out)
        staging.device.set(source, stream=self._copy_stream)
        staging.copied.record(self._copy_stream)
        current = cuda.get_current_stream()
        current.wait_event(staging.copied)
        self.xp.copyto(out, staging.device)
        staging.read.record(current)

    def _next_staging(self, rings: dict, out) -> _Staging:
        """The next of the two places kept in ``rings`` for ``out``'s shape and type (made when first asked for),
        once the copy that last went through it is done."""
        key = (out.shape, out.dtype)
        ring = rings.get(key)
        if ring is None:
            ring = rings[key] = [_Staging(copied=self.xp.cuda.Event(disable_timing=True)) for _ in range(2)]
        staging = ring.pop(0)
        ring.append(staging)
        if staging.source is not None:
            staging.copied.synchronize()
            staging.source = None  # (its memory may now be made into another array)
        return staging

    def _page_locked_source(self, staging: _Staging, values, out) -> numpy.ndarray:
        """What the device copies ``values`` from: themselves where :meth:`host_empty` made them as ``out`` is,
        else the staging's page-locked buffer, filled with them as ``out[...] = values`` would be.  It is kept in
        the staging until the copy is done."""
        if not (self._made_page_locked(values) and values.shape == out.shape and values.dtype == out.dtype):
            if staging.host is None:
                staging.host = self._page_locked(out.shape, out.dtype)
            numpy.copyto(staging.host, values, casting="unsafe")
            values = staging.host
        staging.source = values
        return values

    def host_empty(self, shape, dtype) -> numpy.ndarray:
        """An empty host array for a batch on its way to this device (:meth:`upload_batch`): page-locked on a GPU,
        so that the copy reads it where it is.  Any thread may ask (data layers make their batches ahead, in
        threads of their own)."""
        if not self.is_gpu:
            return numpy.empty(shape, dtype=dtype)
        self.xp.cuda.Device(_gpu_index(self.device)).use()  # (a thread of its own starts on GPU 0: never touched)
        return self._page_locked(shape, dtype)

    def _made_page_locked(self, array) -> bool:
        """Whether ``array`` is the whole of a page-locked host buffer (as :meth:`host_empty` makes them)."""
        return isinstance(array, numpy.ndarray) and isinstance(array.base, self.xp.cuda.PinnedMemoryPointer)

    def _page_locked(self, shape, dtype) -> numpy.ndarray:
        """An empty host array the GPU copies from without the host waiting (CuPy's pinned memory)."""
        if self.xp is gpu_standin:
            return gpu_standin.empty_pinned(shape, dtype)
        import cupyx  # (only reached on CuPy)
        return cupyx.empty_pinned(shape, dtype=dtype)

    def to_host(self, array) -> numpy.ndarray:
        """``array`` as a numpy array on the host."""
        if self.is_gpu:
            return self.xp.asnumpy(array)
        return numpy.asarray(array)

    def check_later(self, bad, values, describe: Callable[[int | str, int], str]) -> None:
        """Note a check of ``values`` whose failures ``bad`` marks: a DataError of ``describe(the first failing
        value, as the blob holds it, how many fail)``.  On the CPU it is raised at once.  On a GPU
        (:attr:`defer_checks`) it is not waited for: one kernel marks, at each position where it fails and no
        earlier check of values of that size failed, the check's number and the value; when the host next reads
        (:meth:`raise_checks`; every CHECKS_KEPT notes at the latest) the first check that failed is raised, with
        its count and its first value, as it would have been at once (no check before it failed anywhere, so
        every position it failed at holds its number)."""
        flat, values = bad.reshape(-1), values.reshape(-1)
        if not flat.size:
            return
        if not self.defer_checks:
            count = int(self.xp.count_nonzero(flat))
            if count:
                self._raise_failed(count, values[int(self.xp.argmax(flat))], describe)
            return
        key = (flat.size, values.dtype)
        marks = self._marks.get(key)
        if marks is None:
            self._refuse_in_capture("a deferred check of values of a new size (its marks made)")
            marks = self._marks[key] = _Marks(self.xp.full(flat.size, -1, dtype=numpy.int64),
                                              self.xp.zeros(flat.size, dtype=values.dtype))
        self._noted += 1
        self._describes[self._noted] = describe
        marks.noted = self._noted
        if self.capture is not None:
            self.capture.checks.append((self._noted, describe, marks))
        if kernels.compiled(self.xp):
            kernels.mark_failures(flat, values, self._noted, marks.when, marks.value)
        else:
            first = flat & (marks.when < 0)
            marks.when[...] = self.xp.where(first, self._noted, marks.when)
            marks.value[...] = self.xp.where(first, values, marks.value)
        if len(self._describes) >= CHECKS_KEPT and self.capture is None:  # (a capture reads nothing)
            self.raise_checks()

    def note_checks(self, checks: list[tuple[int, Callable, _Marks]]) -> None:
        """Note again checks a captured graph makes at each launch: ``(number, describe, marks)`` as
        :meth:`check_later` noted them at the capture."""
        for number, describe, marks in checks:
            self._describes[number] = describe
            marks.noted = max(marks.noted, number)

    def raise_checks(self) -> None:
        """Raise the DataError of the first check noted by :meth:`check_later` that failed (all are then
        forgotten); the marks come to the host in one copy."""
        if not self._describes:
            return
        describes, self._describes = self._describes, {}
        since = min(describes)  # (marks no check used since the last read hold nothing, and go: sizes change)
        self._marks = {key: marks for key, marks in self._marks.items() if marks.noted >= since}
        kept = list(self._marks.values())
        whens = self.to_host(self.xp.concatenate([marks.when for marks in kept]))
        failed = whens[whens >= 0]
        if not failed.size:
            return
        first = int(failed.min())
        for marks in kept:  # (the first check's values are of one size: one of the marks holds its failures)
            when, whens = whens[:marks.when.size], whens[marks.when.size:]
            if (when == first).any():
                count, value = int((when == first).sum()), marks.value[int(numpy.argmax(when == first))]
        for marks in kept:
            marks.when.fill(-1)
        self._raise_failed(count, value, describes[first])

    def _raise_failed(self, count: int, first, describe: Callable[[int | str, int], str]) -> None:
        """The DataError of a check with ``count`` failures, the first being ``first`` (on the device)."""
        value = self.to_host(first)[()]  # in the blob's dtype: float32 1.7 shows as 1.7
        shown = int(value) if float(value).is_integer() and abs(float(value)) < 2 ** 53 else str(value)
        raise DataError(describe(shown, count))

    def workspace(self, count: int, dtype):
        """Scratch space for ``count`` values of ``dtype``, shared by every layer on this backend: a layer uses
        it within one pass (its columns, say), so the next one may overwrite it.  It grows to the largest asked
        for and stays; layers ask at setup for what they will use, so it is made once.  The same request gets the
        same view (on a GPU making one is a call of the host's): reshape it into a new array, never in place."""
        dtype = numpy.dtype(dtype)
        view = self._workspace_views.get((count, dtype))
        if view is not None:
            return view
        size = count * dtype.itemsize
        if self._workspace is None or self._workspace.size < size:
            self._refuse_in_capture("the shared workspace would grow")
            self._workspace_views.clear()
            self._workspace = None  # (the smaller one given back first)
            self._workspace = self.xp.empty(size, dtype=numpy.uint8)
        view = self._workspace_views[(count, dtype)] = self._workspace[:size].view(dtype)
        return view

    def half_scratch(self, *counts: int) -> list:
        """uint16 arrays of ``counts`` values each, apart, for 16-bit copies of a product's or a convolution's
        operands (precision bf16-mixed or fp16-mixed: :mod:`netspec.engine.half`); each starts HALF_ALIGNMENT values
        after a multiple of it.  Every layer shares them within one pass, as the workspace; they grow to the
        largest asked for and stay."""
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + -(-count // HALF_ALIGNMENT) * HALF_ALIGNMENT)
        if self._half is None or self._half.size < starts[-1]:
            self._refuse_in_capture("the 16-bit scratch would grow")
            self._half = None  # (the smaller one given back first)
            self._half = self.xp.empty(starts[-1], dtype=numpy.uint16)
        return [self._half[start:start + count] for start, count in zip(starts, counts)]

    def ones(self, count: int, dtype):
        """A vector of at least ``count`` ones of ``dtype`` on this device, the one every caller shares (made once,
        grown as needed): what :func:`netspec.engine.blas.sums` multiplies by."""
        dtype = numpy.dtype(dtype)
        held = self._ones.get(dtype)
        if held is None or held.size < count:
            self._refuse_in_capture("the vector of ones would grow")
            held = self._ones[dtype] = self.xp.ones(count, dtype=dtype)
        return held

    def _refuse_in_capture(self, what: str) -> None:
        """CaptureError where a CUDA graph is being captured: arrays the work of earlier launches reads would move
        (``what`` says which)."""
        if self.capture is not None:
            raise CaptureError(f"{what} in the capture, where arrays must stay where they are")

    def address(self, array) -> int:
        """Where ``array``'s memory starts on its device (arrays sharing memory share it)."""
        return array.data.ptr if self.is_gpu else array.__array_interface__["data"][0]

    def peak_memory(self) -> tuple[int, str]:
        """``(bytes, what they are)``: on the CPU the most memory the process has held so far; on a GPU what
        CuPy's pools hold now (its default one and the CUDA graphs' own), which keep the blocks freed since the
        peak (unless given back) and leave out memory taken beside them."""
        if self.is_gpu:
            pools = [self.xp.get_default_memory_pool(), *self.graph_pools]
            return sum(pool.total_bytes() for pool in pools), "CuPy's memory pools on the GPU"
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

    def random(self, size, dtype=numpy.float64, out=None):
        """Values uniform in [0, 1) (``out`` as :meth:`Backend.random`'s)."""
        return self.backend.random(size, dtype, self.name, out)

    def uniform(self, low: float = 0.0, high: float = 1.0, size=None):
        """Values uniform in [low, high), as float64."""
        values = self.random(size)
        values *= high - low  # (in place: a large draw allocates once)
        values += low
        return values

    def integers(self, low: int, high: int, size=None, dtype=numpy.int64, out=None):
        """Whole numbers low, low + 1, ..., high - 1, in ``dtype`` (unlike NumPy's, a float one too: DummyData's
        class labels), ``out`` as :meth:`Backend.random`'s.  With ``span = high - low`` at most WORD_SPAN, value
        i is ``low + (w_i span >> 32)`` for the draw's 32-bit word ``w_i`` (:meth:`Backend.random`'s); up to
        2**32, ``low + (h_i span >> 64)`` for its 64-bit hash ``h_i``: each whole number comes up within
        span / 2**32 (span / 2**64) of its share.  ``low`` and ``high`` lie within +-2**53."""
        span = high - low
        if not (0 < span <= 2 ** 32 and low >= -2 ** 53 and high <= 2 ** 53):
            raise ValueError(f"integers needs low < high within +-2**53 and at most 2**32 apart, got {low} and "
                             f"{high}")
        xp, words = self.backend.xp, span <= WORD_SPAN
        values = _output(xp, _shape(size), numpy.dtype(dtype), out)
        offset = self.backend.next_offset(self.name)
        if kernels.compiled(xp):
            kernels.integers(values, offset, low, span, words)
            return values
        if xp is not numpy:
            bits = _device_bits(xp, values.size, offset, words)
            whole = ((bits.astype(numpy.uint64) * numpy.uint64(span)) >> numpy.uint64(32) if words
                     else _high_products(bits, span))
            whole = whole.astype(numpy.int64)
            whole += low
            values[...] = whole.reshape(values.shape)
            return values

        def draw_words(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
            drawn = _words_into(bits[0], spare, start, offset, len(part))
            for first in range(0, len(part), len(spare)):  # (the products of as many words as spare holds at once)
                count = min(len(spare), len(part) - first)
                product = spare[:count].view(numpy.float64)  # (w span below 2**48: exact, and faster than uint64)
                # (one pass each: NumPy's casts are vectorised alone, but buffered within a product or a floor)
                numpy.copyto(product, drawn[first:first + count], casting="unsafe")
                product *= span * 2.0 ** -32
                numpy.floor(product, out=product)
                if low:
                    product += low  # (exact: within 2**53)
                numpy.copyto(part[first:first + count], product, casting="unsafe")

        def draw_hashes(start: int, part: numpy.ndarray, bits: list[numpy.ndarray], spare: numpy.ndarray) -> None:
            whole = _high_products(_hash_into(bits[0], spare, start, offset), span, spare)
            numpy.add(whole.view(numpy.int64), numpy.int64(low), out=part, casting="unsafe")

        if words:
            _in_chunks(values, 1, draw_words, values_per_hash=2)
        else:
            _in_chunks(values, 1, draw_hashes)
        return values

    def standard_normal(self, size, dtype=numpy.float64, out=None):
        """Values of the standard normal distribution (:meth:`Backend.standard_normal`)."""
        return self.backend.standard_normal(size, dtype, self.name, out)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size=None):
        """Values of the normal distribution of mean ``loc`` and standard deviation ``scale``, as float64."""
        return loc + scale * self.standard_normal(size)


def _shape(shape) -> tuple[int, ...]:
    """A shape given as a tuple, an int, or None for one value, as a tuple."""
    return () if shape is None else (shape,) if isinstance(shape, int) else tuple(shape)


HALF_ALIGNMENT = 128  # values (256 bytes) at which each part of half_scratch starts: tensor cores' alignment
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


def _kept_bits(dtype: numpy.dtype) -> int:
    """The random bits a value of ``dtype`` (float16, 32 or 64) takes: its significand's."""
    return {2: 11, 4: 24}.get(dtype.itemsize, 53)


def _output(xp, shape: tuple[int, ...], dtype: numpy.dtype, out):
    """``out``, checked to be a C-contiguous array of ``shape`` and ``dtype``, or a new array (a draw's values)."""
    if out is None:
        return xp.empty(shape, dtype=dtype)
    if tuple(out.shape) != shape or out.dtype != dtype or not out.flags.c_contiguous:
        strided = "" if out.flags.c_contiguous else ", not C-contiguous"
        raise ValueError(f"out must be a C-contiguous {dtype} array of shape {shape}, got a {out.dtype} array of "
                         f"shape {tuple(out.shape)}{strided}")
    return out


WORD_SPAN = 2 ** 16  # the most whole numbers DeviceGenerator.integers makes from a 32-bit word each


def _high_products(hashes, span: int, spare=None):
    """``h span >> 64`` of each uint64 hash ``h`` (``span`` at most 2**32), in place in ``hashes`` (``spare``, as
    large, takes the low halves' products): ``(h_high span + (h_low span >> 32)) >> 32``, every sum below 2**64."""
    low = numpy.bitwise_and(hashes, numpy.uint64(2 ** 32 - 1), out=spare)
    low *= numpy.uint64(span)
    low >>= numpy.uint64(32)
    hashes >>= numpy.uint64(32)
    hashes *= numpy.uint64(span)
    hashes += low
    hashes >>= numpy.uint64(32)
    return hashes


def _device_bits(xp, count: int, offset: int, words: bool):
    """The first ``count`` hashes (uint64) of the draw at ``offset``, or its first ``count`` 32-bit words
    (``words``), as array code on the device."""
    bits = xp.arange((count + 1) // 2 if words else count, dtype=numpy.uint64)
    bits += kernels.offset_argument(offset)  # (wrapping past 2**64)
    _mix_in_place(bits)
    return bits.view(numpy.uint32)[:count] if words else bits


HOST_CHUNK = 65536  # hashes a host draw makes at a time: its arrays stay in the core's cache
# positions times the mix's first multiplier: (p + c) m is p m + c m (modulo 2**64), one product a chunk fewer
_POSITIONS_MULTIPLIED = numpy.arange(HOST_CHUNK, dtype=numpy.uint64) * numpy.uint64(MIX[0])
THREADED_VALUES = 1 << 20  # values from which a host draw runs on every core


def _in_chunks(values: numpy.ndarray, hashes: int, draw: Callable, values_per_hash: int = 1) -> None:
    """``draw(start, part, bits, spare)`` over the flat ``values``, HOST_CHUNK hashes at a time (``start`` the
    first hash's index, ``part`` the values they make, ``values_per_hash`` each), with room for the chunk's
    ``hashes`` arrays of hashes (``bits``, uint64) and a ``spare`` one, on every core (a part of the hashes each:
    :func:`netspec.threads.in_parts`) where the values are many enough to pay for the threads' start."""
    flat = values.reshape(-1)
    per = values_per_hash

    def run(part: slice) -> None:
        room = numpy.empty((hashes + 1, min(HOST_CHUNK, part.stop - part.start)), dtype=numpy.uint64)
        for start in range(part.start, part.stop, HOST_CHUNK):
            count = min(HOST_CHUNK, part.stop - start)
            draw(start, flat[per * start:per * (start + count)], list(room[:hashes, :count]), room[hashes, :count])

    total = -(-flat.size // per)
    if flat.size < THREADED_VALUES:
        run(slice(0, total))
    else:
        threads.in_parts(total, run)


def _words_into(bits: numpy.ndarray, spare: numpy.ndarray, start: int, offset: int, count: int) -> numpy.ndarray:
    """The first ``count`` 32-bit words of :func:`_hash_into`'s hashes (each hash's low half, then its high
    half), a view of ``bits``."""
    return _hash_into(bits, spare, start, offset).view(numpy.uint32)[:count]


def _hash_into(bits: numpy.ndarray, spare: numpy.ndarray, start: int, offset: int) -> numpy.ndarray:
    """``bits`` (uint64; ``spare`` as large) filled with hashes ``start .. start + len(bits) - 1`` of the draw at
    ``offset`` (:meth:`Backend.random`'s), on the host."""
    numpy.add(_POSITIONS_MULTIPLIED[:len(bits)], numpy.uint64((offset + start) * MIX[0] & MASK64), out=bits)
    _mix_multiplied_in_place(bits, spare)
    return bits


def _mix_in_place(values) -> None:
    """:func:`_mixed` of every value of a uint64 array, in place (products wrap modulo 2**64 on NumPy and CuPy)."""
    values *= numpy.uint64(MIX[0])
    _mix_multiplied_in_place(values)


def _mix_multiplied_in_place(values, spare=None) -> None:
    """:func:`_mix_in_place` of values already multiplied by its first multiplier.  ``spare`` (an array of the
    same shape) takes the shifted copies instead of temporaries."""
    for multiplier, shift in zip((*MIX[1:], None), (30, 27, 31)):
        shifted = values >> numpy.uint64(shift) if spare is None else \
            numpy.right_shift(values, numpy.uint64(shift), out=spare)
        values ^= shifted
        if multiplier is not None:
            values *= numpy.uint64(multiplier)


def gpu_report() -> list[str]:
    """Lines on the GPUs CuPy sees: CuPy's version, the CUDA runtime's and the driver's, then each GPU's name,
    compute capability and free and total memory, and cuDNN's version (or why it does not run); one line saying
    why there is no GPU otherwise."""
    if gpu_standin.requested():
        return [f"gpu: {gpu_standin.DESCRIPTION}", "gpu:0: the stand-in: proves no CUDA kernel and no speed"]
    try:
        import cupy
    except ImportError as exc:
        return [f"gpu: none: CuPy cannot be imported ({first_line(exc)}; pip install -e '.[gpu]')"]
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
    if not count:
        return [*lines, "gpu: none: CUDA sees no GPU"]
    why = cudnn_conv.unavailable()
    return [*lines, f"cudnn: {cudnn_conv.version()}" if why is None else f"cudnn: none: {why}"]



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


def _gpu_index(device: str) -> int:
    """The number N of the GPU ``gpu:N`` (0 for ``gpu``)."""
    return int(device.split(":", 1)[1]) if ":" in device else 0


def _import_cupy(device: str):
    """The array module of ``device`` (``gpu`` or ``gpu:N``): CuPy with that GPU made current, or the stand-in
    (:mod:`netspec.engine.gpu_standin`) where ``NETSPEC_GPU_STANDIN=1``; a DeviceError saying why otherwise."""
    index = _gpu_index(device)
    if gpu_standin.requested():
        if index:
            raise DeviceError(f"device '{device}' is not here: the GPU stand-in has one device, gpu:0")
        return gpu_standin
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError(f"device '{device}' needs CuPy, which cannot be imported ({first_line(exc)}): "
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
