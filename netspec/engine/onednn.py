"""oneDNN, Intel's CPU primitives for deep learning, through its C API (``libdnnl.so.3``, loaded with ctypes).

The library comes from the ``onednn-cpu-gomp`` package (oneDNN 3.2), which
installs it in the environment's ``lib`` folder (:mod:`netspec.threads` finds
it, and sizes the thread pools).  :func:`library` loads it
once; it is None when ``NETSPEC_ONEDNN=0``, on a machine without it, or when
it fails to load, and :func:`why_unavailable` then says why in a few words,
so layers keep their NumPy path.

The binding stays thin: a primitive (:mod:`netspec.engine.primitives`) is
created once per layer and shape, its memory objects wrap the NumPy arrays it is given at each call (no copies of
float32 arrays in the plain layout NumPy uses), and where a primitive computes
faster in a blocked layout of its own choosing, the arrays are reordered into
buffers of that layout and back (scratch buffers every primitive shares).
Between layers it runs, no reorder is needed: the layer writing a blob in a
blocked layout holds it there (:func:`hold_outputs`, where its net made room:
a :class:`Vacancy`), the layers after it build their primitives in that
layout where they can (:func:`layout_of`), and the blob's plain array is
brought up to date only when something else reads it (:class:`HeldArray`).
One stream and those buffers serve the process: run nets from one thread at a
time.  The constants below are oneDNN's documented C API values
(``dnnl_types.h``).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy

from netspec import threads
from netspec.engine.blob import BlobArray

CPU_ENGINE = 1
IN_ORDER_STREAM = 1
F32 = 3
DATA_TYPE_UNDEF = 0  # (a post-op's data type left to oneDNN: the output's)
FORMAT_TAGS = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6}  # ndims -> the plain tag a, ab, abc, abcd, abcde
ANY = 1  # format tag: the layout the primitive computes fastest in
CHANNEL_BLOCKS_OF_8 = 102  # format tag aBcd8b (nChw8c): channels in blocks of 8, innermost
FORWARD_TRAINING, FORWARD_INFERENCE = 64, 96
BACKWARD, BACKWARD_DATA = 128, 160
CONVOLUTION_DIRECT = 1
ELTWISE_RELU, ELTWISE_RELU_USE_DST = 0x20, 0x100  # (the second's backward reads the output, so runs in place)
ELTWISE_SOFT_RELU, ELTWISE_HARDSIGMOID, ELTWISE_SWISH, ELTWISE_HARDSWISH = 0x27, 0x28, 0x2C, 0x34
ELTWISE_GELU_TANH, ELTWISE_GELU_ERF = 0x2B, 0x31
ELTWISE_TANH_USE_DST, ELTWISE_ELU_USE_DST, ELTWISE_LOGISTIC_USE_DST = 0x101, 0x102, 0x104
ELTWISE_CLIP_V2_USE_DST = 0x106
BINARY_ADD, BINARY_MUL = 0x1FFF0, 0x1FFF1
POOLING_MAX, POOLING_AVG_INCLUDE_PADDING = 0x1FF, 0x2FF
LRN_ACROSS_CHANNELS, LRN_WITHIN_CHANNEL = 0xAFF, 0xBFF
SOFTMAX_ACCURATE, SOFTMAX_LOG = 0x30000, 0x30001  # (the maximum subtracted before exp; the log-softmax)
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ARG_SRC_1 = 2  # a binary operation's second input
ARG_POST_OPS = 32768  # the post-op i's arguments are ARG_POST_OPS * (i + 1) | its argument
ARG_WORKSPACE = 64
ARG_MULTIPLE_SRC = 1024  # the first of a sum's inputs; the i-th is ARG_MULTIPLE_SRC + i
ARG_MEAN, ARG_VARIANCE, ARG_SCALE, ARG_SHIFT, ARG_DIFF_SCALE, ARG_DIFF_SHIFT = 49, 50, 51, 52, 255, 256
NORMALIZE_GLOBAL_STATS, NORMALIZE_SCALE, NORMALIZE_SHIFT = 0x1, 0x2, 0x4
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS, ARG_DIFF_BIAS = 129, 145, 161, 169
QUERY_SRC, QUERY_DIFF_SRC, QUERY_WEIGHTS, QUERY_DIFF_WEIGHTS, QUERY_DST, QUERY_DIFF_DST = 129, 130, 131, 132, 133, 134
QUERY_WORKSPACE = 135
QUERY_IMPLEMENTATION = 8  # dnnl_query_impl_info_str
REFERENCE_IMPLEMENTATIONS = ("ref", "simple")  # how the names of oneDNN's slow, portable implementations begin
MAX_DIMS = 12

T = TypeVar("T")
Handle = ctypes.c_void_p
Array = numpy.ndarray | BlobArray  # what a primitive reads or writes: a float32 array, or a blob's (held or plain)
Dims = ctypes.c_int64 * MAX_DIMS


class OneDnnError(RuntimeError):
    """oneDNN refused a call (a primitive it has no implementation for); the caller falls back to NumPy."""


class ExecArg(ctypes.Structure):
    """``dnnl_exec_arg_t``: which argument of a primitive a memory object is."""

    _fields_ = [("arg", ctypes.c_int), ("memory", Handle)]


REPLAYED_CALLS = ("dnnl_memory_set_data_handle", "dnnl_primitive_execute", "dnnl_stream_wait")


class Recording:
    """The oneDNN calls a stretch of a pass made (memory pointed at arrays, primitives run, the stream waited for),
    to be made again as they were by :meth:`replay`, without the Python that chose them
    (:class:`netspec.engine.recorded.RecordedPass`).  It keeps every array it pointed memory at, so that none is
    freed while a replay may write or read it; ``complete`` is False where the stretch made any other call (a
    primitive created, a layout asked for): then its calls do not stand for it.  ``pointed`` is the memory of its
    library's :meth:`Library.point`, which a replay makes wrong, so it empties it first (:meth:`Library.record`
    makes recordings with it)."""

    def __init__(self, pointed: dict | None = None) -> None:
        self.calls: list[tuple[str, Callable, tuple]] = []  # (name, function, arguments)
        self.arrays: list[numpy.ndarray] = []
        self.complete = True
        self._pointed = pointed

    def note(self, name: str, function: Callable, args: tuple) -> None:
        """Keep a call the library made (any but :data:`REPLAYED_CALLS` leaves the recording incomplete)."""
        if name in REPLAYED_CALLS:
            self.calls.append((name, function, args))
        else:
            self.complete = False

    def replay(self) -> None:
        """Make every call again, in order; OneDnnError at the first oneDNN refuses."""
        if self._pointed is not None:
            self._pointed.clear()
        for name, function, args in self.calls:
            status = function(*args)
            if status != 0:
                raise OneDnnError(f"{name} failed (oneDNN status {status}) in a recorded pass")


class Library:
    """The loaded library, its CPU engine and one in-order stream; ``recording``, where set, notes every call
    made (:class:`Recording`).

    A static net gives a primitive the same arrays at every pass, so :meth:`point` remembers the array each memory
    object was last pointed at and skips the call when it is given that array again (a few microseconds a layer,
    much of a small layer's time); a replayed recording points memory again, so it forgets them all.
    """

    def __init__(self, path: str):
        self.recording: Recording | None = None
        self._pointed: dict[int, weakref.ref] = {}  # memory object -> the array it uses (memory is never freed)
        self.dll = ctypes.CDLL(path)
        version = self.dll.dnnl_version
        version.restype = ctypes.POINTER(ctypes.c_int * 4)
        self.version = ".".join(map(str, version().contents[:3]))
        self.dll.dnnl_primitive_desc_query_md.restype = ctypes.c_void_p
        self.dll.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        self.engine = Handle()
        self.call("dnnl_engine_create", ctypes.byref(self.engine), CPU_ENGINE, ctypes.c_size_t(0))
        self.stream = Handle()
        self.call("dnnl_stream_create", ctypes.byref(self.stream), self.engine, ctypes.c_uint(IN_ORDER_STREAM))

    def call(self, name: str, *args) -> None:
        """Call ``name``; OneDnnError when it does not return dnnl_success."""
        function = getattr(self.dll, name)
        if self.recording is not None:
            self.recording.note(name, function, args)
        status = function(*args)
        if status != 0:
            raise OneDnnError(f"{name} failed (oneDNN status {status})")

    def memory_desc(self, shape: tuple[int, ...], tag: int | None = None) -> Handle:
        """A float32 memory descriptor in the plain (C-order) layout, or ``tag`` (:data:`ANY`: the primitive's)."""
        desc = Handle()
        self.call("dnnl_memory_desc_create_with_tag", ctypes.byref(desc), len(shape), Dims(*shape), F32,
                  tag or FORMAT_TAGS[len(shape)])
        return desc

    def channels_last(self, shape: tuple[int, ...]) -> Handle:
        """A float32 memory descriptor of an (N, C, H, W) ``shape`` stored channels last (N, H, W, C)."""
        n, c, h, w = shape
        return self.strided(shape, (h * w * c, 1, w * c, c))

    def strided(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> Handle:
        """A float32 memory descriptor of ``shape`` laid out with ``strides`` (in elements)."""
        desc = Handle()
        self.call("dnnl_memory_desc_create_with_strides", ctypes.byref(desc), len(shape), Dims(*shape), F32,
                  Dims(*strides))
        return desc

    def implementation(self, descriptor: Handle) -> str:
        """The name of the implementation a primitive descriptor chose (``jit:avx2``, ``simple_nchw:any``)."""
        name = ctypes.c_char_p()
        self.call("dnnl_primitive_desc_query", descriptor, QUERY_IMPLEMENTATION, 0, ctypes.byref(name))
        return (name.value or b"").decode()

    def chosen(self, descriptor: Handle, query: int) -> Handle:
        """The memory descriptor a primitive descriptor chose for ``query``."""
        return Handle(self.dll.dnnl_primitive_desc_query_md(descriptor, query, 0))

    def primitive(self, descriptor: Handle) -> Handle:
        """The primitive of a primitive descriptor."""
        primitive = Handle()
        self.call("dnnl_primitive_create", ctypes.byref(primitive), descriptor)
        return primitive

    def reorder(self, source: Handle, target: Handle) -> Handle:
        """A primitive copying data from one layout to another."""
        descriptor = Handle()
        self.call("dnnl_reorder_primitive_desc_create", ctypes.byref(descriptor), source, self.engine, target,
                  self.engine, None)
        return self.primitive(descriptor)

    def memory(self, desc: Handle) -> Handle:
        """A memory object for ``desc`` that owns no buffer: :meth:`point` gives it one."""
        memory = Handle()
        self.call("dnnl_memory_create", ctypes.byref(memory), desc, self.engine, None)
        return memory

    def owned_memory(self, desc: Handle) -> tuple[Handle, numpy.ndarray]:
        """A memory object for ``desc`` with a buffer of its own (keep the array as long as the memory)."""
        buffer = numpy.empty(self.dll.dnnl_memory_desc_get_size(desc), dtype=numpy.uint8)
        memory = self.memory(desc)
        self.point(memory, buffer)
        return memory, buffer

    def point(self, memory: Handle, array: numpy.ndarray, strided: bool = False) -> None:
        """Make ``memory`` use the buffer of ``array`` without copying it: a C-contiguous array, or with
        ``strided`` a view laid out as the memory's descriptor says."""
        if not strided and not array.flags.c_contiguous:
            raise OneDnnError("oneDNN takes C-contiguous arrays")
        if self.recording is not None:
            self.recording.arrays.append(array)
        elif (pointed := self._pointed.get(memory.value)) is not None and pointed() is array:
            return  # (the same array object: the same buffer)
        self.call("dnnl_memory_set_data_handle", memory, Handle(array.ctypes.data))
        self._pointed[memory.value] = weakref.ref(array)

    def record(self) -> Recording:
        """Start noting the calls made (in :attr:`recording`, which the caller sets back to None at the end)."""
        self.recording = Recording(self._pointed)
        return self.recording

    def run(self, primitive: Handle, args: dict[int, Handle]) -> None:
        """Queue ``primitive`` on ``{argument: memory object}``."""
        packed = (ExecArg * len(args))(*args.items())  # (each (argument, memory) pair fills an ExecArg)
        self.call("dnnl_primitive_execute", primitive, self.stream, len(args), packed)

    def wait(self) -> None:
        """Wait until everything queued has run."""
        self.call("dnnl_stream_wait", self.stream)


@functools.cache
def _load() -> tuple[Library | None, str]:
    if os.environ.get(threads.ONEDNN_SWITCH, "1") == "0":
        return None, f"{threads.ONEDNN_SWITCH}=0"
    path = threads.onednn_path()
    if not os.path.isfile(path):
        return None, f"{threads.ONEDNN_LIBRARY} is not installed (pip install onednn-cpu-gomp)"
    try:
        return Library(path), ""
    except (OSError, AttributeError, OneDnnError) as exc:
        return None, f"{path} did not load: {exc}"


def library() -> Library | None:
    """The loaded oneDNN library, or None (see :func:`why_unavailable`)."""
    return _load()[0]


def why_unavailable() -> str:
    """Why :func:`library` is None, in a few words ('' when it is loaded)."""
    return _load()[1]


# ONEDNN_MAX_CPU_ISA's names and the bits of oneDNN's dnnl_cpu_isa_t for each (each ISA's include those below it)
ISA_BITS = {"SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xF, "AVX2_VNNI_2": 0x1F, "AVX512_CORE": 0x27,
            "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xE7, "AVX512_CORE_FP16": 0x1EF,
            "AVX512_CORE_AMX": 0xFE7, "AVX512_CORE_AMX_FP16": 0x1FEF}


def isa_note(lib: Library) -> str | None:
    """What is amiss with ``ONEDNN_MAX_CPU_ISA``, in a few words: a name oneDNN does not know, or an ISA this CPU
    lacks (oneDNN then runs the best it has, named); None where it is unset, ``ALL``, or one the CPU has."""
    asked = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if asked in ("", "ALL", "DEFAULT"):
        return None
    effective = lib.dll.dnnl_get_effective_cpu_isa()
    runs = next((name for name, bits in ISA_BITS.items() if bits == effective), hex(effective))
    bits = ISA_BITS.get(asked)
    if bits is None:
        return f"ONEDNN_MAX_CPU_ISA={asked} names no ISA oneDNN knows, so it runs {runs}; it knows " \
               f"{', '.join(ISA_BITS)} and ALL"
    if effective & bits != bits:
        return f"ONEDNN_MAX_CPU_ISA={asked} is more than this CPU has: oneDNN runs {runs}"
    return None


def library_for(layer) -> Library | None:
    """The library when ``layer`` runs on the CPU in float32 and oneDNN is loaded; None when NumPy must run it."""
    if layer.backend.is_gpu or layer.dtype != numpy.float32:
        return None
    return library()


def attempt(layer, build: Callable[[Library], T]) -> T | None:
    """``build(library)``: ``layer``'s oneDNN primitives, or None when NumPy must run it, because oneDNN is off
    or cannot take the layer (:func:`library_for`) or refuses its settings; then ``layer.onednn_refused`` says
    how, and ``netspec time`` names the layer."""
    lib = library_for(layer)
    if lib is None:
        return None
    try:
        return build(lib)
    except OneDnnError as exc:
        layer.onednn_refused = str(exc)
        return None


def attempt_in(layer, layout: Handle | None, build: Callable[[Library, Handle | None], T]) -> T | None:
    """:func:`attempt` of ``build(library, layout)``: ``layer``'s primitives in ``layout``, the blocked one a blob
    it reads or writes is held in (None: the layouts the primitives choose, else plain arrays).  Where oneDNN
    refuses that layout for the layer's geometry (or has only a reference implementation for it:
    :func:`refuse_reference`), the layer alone is built without it (``build(library, None)``), its arrays
    reordered, and ``layer.layout_refused`` says why, for the paths line."""
    lib = library_for(layer)
    layer.layout_refused = None
    if layout is not None and lib is not None:
        try:
            return build(lib, layout)
        except OneDnnError as exc:
            layer.layout_refused = str(exc)
    return attempt(layer, lambda lib: build(lib, None))


def refuse_reference(lib: Library, descriptor: Handle, layout: Handle | None) -> None:
    """OneDnnError where ``descriptor`` was made for a given blocked ``layout`` but only a reference
    implementation runs it there: :func:`attempt_in` then builds the layer without that layout."""
    name = lib.implementation(descriptor)
    if layout is not None and name.startswith(REFERENCE_IMPLEMENTATIONS):
        raise OneDnnError(f"only oneDNN's reference implementation ({name}) runs it in its input's blocked layout")


_scratch: dict[int, numpy.ndarray] = {}


def scratch(slot: int, nbytes: int) -> numpy.ndarray:
    """A buffer of at least ``nbytes`` for the blocked copies of argument ``slot``, shared by every primitive: a
    blocked copy lives only while its primitive runs, so one buffer an argument serves them all."""
    buffer = _scratch.get(slot)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _scratch[slot] = numpy.empty(nbytes, dtype=numpy.uint8)
    return buffer


class Vacancy:
    """Room a net makes on a blob for a held copy of its data or diff (:class:`HeldArray`), which the first layer
    that writes the array in a blocked layout fills (:func:`hold`): ``place(nbytes)`` gives the buffer."""

    def __init__(self, place: Callable[[int], numpy.ndarray]):
        self.place = place

    def plain_access(self, array: numpy.ndarray) -> None:
        """Nothing is held yet: the plain array is the only one."""

    def overwrite(self) -> None:
        """Nothing is held yet: the plain array is the only one."""


PLAIN, HELD, BOTH = "plain", "held", "both"  # which of a held array's two copies holds the latest values


class HeldArray:
    """A blob's data or diff held in a blocked layout (``desc``) in ``buffer``, the copy consecutive layers on
    oneDNN read and write, so that no reorder runs between them; the blob's plain array is brought up to date only
    when something reads it (:class:`netspec.engine.blob.Blob`)."""

    def __init__(self, lib: Library, shape: tuple[int, ...], desc: Handle, buffer: numpy.ndarray):
        self.lib, self.desc, self.buffer = lib, desc, buffer
        plain = lib.memory_desc(shape)
        self.memory, self.plain = lib.memory(desc), lib.memory(plain)
        lib.point(self.memory, buffer)
        self.to_plain, self.to_held = lib.reorder(desc, plain), lib.reorder(plain, desc)
        self.latest = PLAIN
        self.plain_used = False  # whether anything has read or written the plain array

    def plain_access(self, array: numpy.ndarray) -> None:
        """Copy the held values into ``array`` (the plain one) when they are newer; the plain array holds the
        latest values from now on."""
        if self.latest == HELD:
            self.lib.point(self.plain, array)
            self.lib.run(self.to_plain, {ARG_SRC: self.memory, ARG_DST: self.plain})
            self.lib.wait()
        self.latest, self.plain_used = PLAIN, True

    def overwrite(self) -> None:
        """The plain array is being written whole: it holds the latest values from now on."""
        self.latest, self.plain_used = PLAIN, True

    def current(self, array: numpy.ndarray) -> Handle:
        """The held memory for a primitive to read, up to date with ``array`` (the plain one) first."""
        if self.latest == PLAIN:
            self.lib.point(self.plain, array)
            self.lib.run(self.to_held, {ARG_SRC: self.plain, ARG_DST: self.memory})
            self.latest = BOTH
        return self.memory


BLOCK = 16  # the widest channel block oneDNN's float32 layouts use on x86 (AVX-512: 16; AVX2: 8)


def held_elements(shape: tuple[int, ...]) -> int:
    """The elements a blob of ``shape`` may need held in a blocked layout: its channels (axis 1 of a 4-D blob)
    padded to a whole number of blocks."""
    if len(shape) != 4:
        return math.prod(shape)
    n, c, h, w = shape
    return n * -(-c // BLOCK) * BLOCK * h * w


def holdable(graph, keep=()) -> set[str]:
    """The blobs of ``graph`` (a compiled graph) that oneDNN's layers may hold in blocked layouts when it runs
    them: the 4-D ones that only layers taking held arrays (``takes_held``) read and write, but the outputs and
    ``keep`` (none without oneDNN).  A layer that does not (a NumPy layer, a Python layer, which may keep views
    of its arrays from pass to pass) sees plain arrays only."""
    if library() is None:
        return set()
    other = {name for node in graph.nodes if not node.layer.takes_held for name in (*node.bottoms, *node.tops)}
    return ({name for name, shape in graph.blob_shapes.items() if len(shape) == 4}
            - {*graph.outputs, *keep, *other})


def layout_of(array: BlobArray) -> Handle | None:
    """The blocked layout a blob holds ``array`` in, or None (plain)."""
    held = array.held
    return held.desc if isinstance(held, HeldArray) else None


def may_overlap(first: BlobArray, second: BlobArray) -> bool:
    """Whether the memory of two blobs' arrays (each one's plain array and held copy) may overlap (a memory plan
    that shares buffers between blobs whose lifetimes never meet gives them the same)."""
    def storage(array: BlobArray) -> list[numpy.ndarray]:
        held = array.held
        return [array.stored(), *([held.buffer] if isinstance(held, HeldArray) else [])]

    return any(numpy.may_share_memory(one, other) for one in storage(first) for other in storage(second))


def common_layout(arrays: list[BlobArray]) -> Handle | None:
    """The blocked layout all of ``arrays`` are held in, or None where some are not, or differ."""
    layouts = [layout_of(array) for array in arrays]
    lib = library()
    if None in layouts or lib is None or not all(lib.dll.dnnl_memory_desc_equal(layouts[0], other)
                                                  for other in layouts[1:]):
        return None
    return layouts[0]


def hold(array: BlobArray, desc: Handle | None) -> None:
    """Hold ``array`` in the blocked layout ``desc`` (None: nothing), where its net made room for that (a
    :class:`Vacancy`) and no layer held it yet."""
    blob, vacancy, lib = array.blob, array.held, library()
    if not isinstance(vacancy, Vacancy) or desc is None or lib is None:
        return
    held = HeldArray(lib, blob.shape, desc, vacancy.place(lib.dll.dnnl_memory_desc_get_size(desc)))
    if array.is_diff:
        blob.held_diff = held
    else:
        blob.held_data = held


def hold_outputs(fast, tops: list) -> None:
    """Hold the data of each of the blobs ``tops`` in the blocked layout the primitives ``fast`` write them in
    (``fast.layout``), and their diffs in the one they read those in (``fast.gradient_layout``), where the net
    made room: the layer writing them calls this as it is set up, and the layers after it compute in those
    layouts where they can."""
    for top in tops:
        hold(top.values, fast.layout)
        hold(top.gradient, fast.gradient_layout)


def constant(array: numpy.ndarray) -> bool:
    """Whether ``array`` cannot change: it and every array it views are read-only (a frozen net's weights:
    :meth:`netspec.engine.net.Net.freeze`), down to one that owns its memory."""
    while array.flags.writeable is False:
        if array.base is None:
            return True
        if not isinstance(array.base, numpy.ndarray):
            return False
        array = array.base
    return False


_freezes = 0  # how many times a net was frozen in this process (the ConstantCopy and FromConstants made before: stale)


def forget_constants() -> None:
    """Make every :class:`ConstantCopy` and :class:`FromConstants` made so far stale, so that the next call for
    it copies (computes) its arrays again:
    a net frozen again (:meth:`netspec.engine.net.Net.freeze`) after its weights were made writable, changed,
    and made read-only once more computes with their new values."""
    global _freezes
    _freezes += 1


class ConstantCopy:
    """A primitive's own copy of one :func:`constant` array in another layout, made at the first call for it and
    kept while the same array comes (the copy keeps the array, so that no other can take its place in memory),
    until :func:`forget_constants`."""

    def __init__(self):
        self.array: numpy.ndarray | None = None
        self.buffer: numpy.ndarray | None = None
        self.made = -1  # (the value of _freezes when it was made)

    def buffer_for(self, array: numpy.ndarray, nbytes: int) -> tuple[numpy.ndarray, bool]:
        """``(buffer, fresh)``: the buffer of ``nbytes`` holding ``array``'s copy, or (``fresh``) one the caller
        fills now."""
        if (self.made == _freezes and self.array is not None
                and self.array.__array_interface__ == array.__array_interface__):
            return self.buffer, False
        self.array, self.buffer, self.made = array, numpy.empty(nbytes, dtype=numpy.uint8), _freezes
        return self.buffer, True


class FromConstants:
    """Arrays computed from :func:`constant` arrays (a frozen net's weights folded with its BatchNorm), computed at
    the first call for them and kept, read-only (so constants too), while the same constants come, until
    :func:`forget_constants`; computed at every call from arrays that may change."""

    def __init__(self):
        self.sources: list[numpy.ndarray] = []  # (kept, so that no other array can take their place in memory)
        self.arrays: tuple[numpy.ndarray, ...] = ()
        self.made = -1  # (the value of _freezes when they were computed)

    def get(self, sources: list[numpy.ndarray], compute: Callable[[], tuple[numpy.ndarray, ...]]
            ) -> tuple[numpy.ndarray, ...]:
        """``compute()``'s arrays, from ``sources`` (every array it reads)."""
        if not all(constant(array) for array in sources):
            return compute()
        if self.made != _freezes or [a.__array_interface__ for a in self.sources] != [
                a.__array_interface__ for a in sources]:
            self.sources, self.arrays, self.made = sources, compute(), _freezes
            for array in self.arrays:
                array.flags.writeable = False
        return self.arrays


class Operand:
    """One argument of a primitive (``slot``: its oneDNN argument): the plain float32 array a layer holds or a
    blob's array (:class:`BlobArray`) and, when the primitive works faster in a blocked layout of its own choosing,
    the reorders into and out of a :func:`scratch` buffer in that layout; none where the blob holds the array in
    that layout (:class:`HeldArray`)."""

    def __init__(self, lib: Library, shape: tuple[int, ...], chosen: Handle | None = None, slot: int | None = None):
        self.lib, self.slot = lib, slot
        plain = lib.memory_desc(shape)
        self.plain = lib.memory(plain)
        self.memory = self.plain
        self.blocked = chosen is not None and bool(chosen.value) and not lib.dll.dnnl_memory_desc_equal(chosen, plain)
        self.layout = chosen if self.blocked else None
        self.writing: HeldArray | None = None  # the held array :meth:`write` gave
        self.fits: dict[HeldArray, bool] = {}  # {a held array: whether it is in this operand's layout}
        self.constant_copy = ConstantCopy()  # (the blocked copy of a constant array)
        if self.blocked:
            if slot is None:
                raise ValueError("an operand in a blocked layout needs its slot (its oneDNN argument)")
            self.memory, self.nbytes = lib.memory(chosen), lib.dll.dnnl_memory_desc_get_size(chosen)
            self.to_chosen = lib.reorder(plain, chosen)
            self.to_plain = lib.reorder(chosen, plain)

    def held(self, array: Array) -> HeldArray | None:
        """The held copy of ``array`` (a :class:`BlobArray`) where it is in this operand's layout, else None."""
        held = array.held if isinstance(array, BlobArray) else None
        if not isinstance(held, HeldArray) or not self.blocked:
            return None
        fits = self.fits.get(held)
        if fits is None:
            fits = self.fits[held] = bool(self.lib.dll.dnnl_memory_desc_equal(held.desc, self.layout))
        return held if fits else None

    def read(self, array: Array) -> Handle:
        """The memory a primitive reads ``array`` from (reordered into the blocked buffer when there is one; a
        :func:`constant` array into one of the operand's own, once)."""
        held = self.held(array)
        if held is not None:
            return held.current(array.stored())
        plain = array.array() if isinstance(array, BlobArray) else array
        if self.blocked and constant(plain):
            return self._constant(plain)
        self._point(plain)
        if self.blocked:
            self.lib.run(self.to_chosen, {ARG_SRC: self.plain, ARG_DST: self.memory})
        return self.memory

    def _constant(self, array: numpy.ndarray) -> Handle:
        """The memory holding ``array`` (a constant) in the blocked layout, reordered at the first call for it
        (:class:`ConstantCopy`)."""
        buffer, fresh = self.constant_copy.buffer_for(array, self.nbytes)
        self.lib.point(self.memory, buffer)
        if fresh:
            self.lib.point(self.plain, array)
            self.lib.run(self.to_chosen, {ARG_SRC: self.plain, ARG_DST: self.memory})
        return self.memory

    def write(self, array: Array) -> Handle:
        """The memory a primitive writes ``array`` into (call :meth:`written` after the primitive ran)."""
        self.writing = self.held(array)
        if self.writing is not None:
            return self.writing.memory
        self._point(array.overwritten() if isinstance(array, BlobArray) else array)
        return self.memory

    def written(self) -> None:
        """Copy what the primitive wrote in the blocked layout into the array given to :meth:`write` (none where
        the blob holds it in that layout: the held copy is the newer one now)."""
        if self.writing is not None:
            self.writing.latest = HELD
        elif self.blocked:
            self.lib.run(self.to_plain, {ARG_SRC: self.memory, ARG_DST: self.plain})

    def _point(self, array: numpy.ndarray) -> None:
        if array.dtype != numpy.float32:
            raise OneDnnError("oneDNN's primitives here take float32 arrays")
        self.lib.point(self.plain, array)
        if self.blocked:
            self.lib.point(self.memory, scratch(self.slot, self.nbytes))
