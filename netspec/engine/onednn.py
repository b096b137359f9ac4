"""oneDNN, Intel's CPU primitives for deep learning, through its C API (``libdnnl.so.3``, loaded with ctypes).

The library comes from the ``onednn-cpu-gomp`` package (oneDNN 3.2), which
installs it in the environment's ``lib`` folder (:mod:`netspec.threads` finds
it, and sizes the thread pools).  :func:`library` loads it
once; it is None when ``NETSPEC_ONEDNN=0``, on a machine without it, or when
it fails to load, and :func:`why_unavailable` then says why in a few words,
so layers keep their NumPy path.

The binding stays thin: a primitive is created once per layer and shape, its
memory objects wrap the NumPy arrays it is given at each call (no copies of
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
from collections.abc import Callable
from typing import TypeVar

import numpy

from netspec import threads
from netspec.engine.blob import BlobArray

CPU_ENGINE = 1
IN_ORDER_STREAM = 1
F32 = 3
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


class Library:
    """The loaded library, its CPU engine and one in-order stream."""

    def __init__(self, path: str):
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
        status = getattr(self.dll, name)(*args)
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

    def point(self, memory: Handle, array: numpy.ndarray) -> None:
        """Make ``memory`` use the buffer of ``array`` (C-contiguous) without copying it."""
        if not array.flags.c_contiguous:
            raise OneDnnError("oneDNN takes C-contiguous arrays")
        self.call("dnnl_memory_set_data_handle", memory, Handle(array.ctypes.data))

    def run(self, primitive: Handle, args: dict[int, Handle]) -> None:
        """Queue ``primitive`` on ``{argument: memory object}``."""
        packed = (ExecArg * len(args))(*(ExecArg(arg, memory) for arg, memory in args.items()))
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
        self.kept: tuple[numpy.ndarray, numpy.ndarray] | None = None  # (a constant array, its blocked copy)
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
        """The memory holding ``array`` (a constant) in the blocked layout, reordered at the first call for it (the
        operand keeps the array, so that no other can take its place in memory while its copy is kept)."""
        if self.kept is None or self.kept[0].__array_interface__ != array.__array_interface__:
            self.kept = array, numpy.empty(self.nbytes, dtype=numpy.uint8)
            self.lib.point(self.plain, array)
            self.lib.point(self.memory, self.kept[1])
            self.lib.run(self.to_chosen, {ARG_SRC: self.plain, ARG_DST: self.memory})
        else:
            self.lib.point(self.memory, self.kept[1])
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


class Weighted:
    """A layer with weights as three oneDNN primitives: forward, backward data and backward weights.

    A subclass creates the primitive descriptors and says where each argument
    lives (:meth:`bind`); this class runs them.  Parameter gradients overwrite
    what they are given, so callers accumulate.
    """

    def bind(self, lib: Library, descriptors: dict[str, Handle], shapes: dict[str, tuple], chosen: bool,
             bias: int | None) -> None:
        """Create the primitives of ``descriptors`` (forward, data, weights) and their operands.

        ``shapes`` gives the plain shapes of x, w and y; with ``chosen`` the
        arguments take the layouts the descriptors chose (else plain); ``bias``
        is the bias' length, None without one.
        """
        self.lib = lib
        self.primitives = {name: lib.primitive(pd) for name, pd in descriptors.items()}
        queries = {"forward": {ARG_SRC: ("x", QUERY_SRC), ARG_WEIGHTS: ("w", QUERY_WEIGHTS), ARG_DST: ("y", QUERY_DST)},
                   "data": {ARG_DIFF_DST: ("y", QUERY_DIFF_DST), ARG_WEIGHTS: ("w", QUERY_WEIGHTS),
                            ARG_DIFF_SRC: ("x", QUERY_DIFF_SRC)},
                   "weights": {ARG_SRC: ("x", QUERY_SRC), ARG_DIFF_DST: ("y", QUERY_DIFF_DST),
                               ARG_DIFF_WEIGHTS: ("w", QUERY_DIFF_WEIGHTS)}}
        self.operands = {(name, arg): Operand(lib, shapes[blob], lib.chosen(descriptors[name], query) if chosen
                                              else None, slot=arg)
                         for name, args in queries.items() for arg, (blob, query) in args.items()}
        if bias is not None:
            self.operands["forward", ARG_BIAS] = Operand(lib, (bias,))
            self.operands["weights", ARG_DIFF_BIAS] = Operand(lib, (bias,))

    @property
    def layout(self) -> Handle | None:
        """The blocked layout the output is written in (None: plain)."""
        return self.operands["forward", ARG_DST].layout

    @property
    def gradient_layout(self) -> Handle | None:
        """The blocked layout the output's gradient is read in (None: plain)."""
        return self.operands["data", ARG_DIFF_DST].layout

    def _run(self, name: str, reads: dict, writes: dict) -> None:
        args = {arg: self.operands[name, arg].read(array) for arg, array in reads.items()}
        args.update({arg: self.operands[name, arg].write(array) for arg, array in writes.items()})
        self.lib.run(self.primitives[name], args)
        for arg in writes:
            self.operands[name, arg].written()
        self.lib.wait()

    def forward(self, x: Array, w: numpy.ndarray, b: numpy.ndarray | None, y: Array) -> None:
        """``y = x * w + b``, written into ``y``."""
        reads = {ARG_SRC: x, ARG_WEIGHTS: w} | ({ARG_BIAS: b} if b is not None else {})
        self._run("forward", reads, {ARG_DST: y})

    def backward_data(self, dy: Array, w: numpy.ndarray, dx: Array) -> None:
        """The input's gradient, written into ``dx``."""
        self._run("data", {ARG_DIFF_DST: dy, ARG_WEIGHTS: w}, {ARG_DIFF_SRC: dx})

    def backward_weights(self, x: Array, dy: Array, dw: numpy.ndarray,
                         db: numpy.ndarray | None) -> None:
        """The weights' (and bias') gradients, written into ``dw`` (and ``db``): callers accumulate."""
        writes = {ARG_DIFF_WEIGHTS: dw} | ({ARG_DIFF_BIAS: db} if db is not None else {})
        self._run("weights", {ARG_SRC: x, ARG_DIFF_DST: dy}, writes)

    def backward(self, x: Array, dy: Array, dx: Array | None, weights, bias,
                 learn: list[bool]) -> None:
        """A layer's backward: the ``weights`` and ``bias`` blobs' gradients added to their diffs where
        ``learn`` (their param_propagate_down) says, the input's written into ``dx`` unless it is None."""
        self.accumulate(x, dy, dx, weights.data, weights.diff, None if bias is None else bias.diff, learn)

    def accumulate(self, x: Array, dy: Array, dx: Array | None, w: numpy.ndarray,
                   w_diff: numpy.ndarray, b_diff: numpy.ndarray | None, learn: list[bool]) -> None:
        """:meth:`backward` on arrays (views of a blob's arrays included): the weights' and bias' gradients
        added to ``w_diff`` and ``b_diff`` (None: no bias) where ``learn`` says, the input's written into ``dx``
        unless it is None, from the weights ``w``."""
        learn_weights, learn_bias = learn[0], b_diff is not None and learn[1]
        if learn_weights or learn_bias:
            dw = numpy.empty_like(w_diff)
            db = numpy.empty_like(b_diff) if b_diff is not None else None
            self.backward_weights(x, dy, dw, db)
            if learn_weights:
                w_diff += dw
            if learn_bias:
                b_diff += db
        if dx is not None:
            self.backward_data(dy, w, dx)


def convolution_descriptors(lib: Library, input_shape, weights_shape, output_shape, group: int, stride, pad,
                            dilation, bias: bool) -> tuple[dict, list, list]:
    """For one geometry: the plain shapes of x, w and y (grouped weights as (G, O/G, C/G, kh, kw)), the memory
    descriptors x, w, b, y (layouts left to the primitive; b None without bias), and oneDNN's geometry
    arguments (strides, gaps between taps, padding before and after)."""
    o, c_per_group, kh, kw = weights_shape
    shapes = {"x": tuple(input_shape), "y": tuple(output_shape),
              "w": (group, o // group, c_per_group, kh, kw) if group > 1 else tuple(weights_shape)}
    descriptors = [lib.memory_desc(shapes[name], ANY) for name in ("x", "w")]
    descriptors += [lib.memory_desc((o,)) if bias else None, lib.memory_desc(shapes["y"], ANY)]
    pad_r = [(out - 1) * s + (k - 1) * d + 1 - size - p
             for out, s, k, d, size, p in zip(output_shape[2:], stride, (kh, kw), dilation, input_shape[2:], pad)]
    geometry = [Dims(*stride), Dims(*(d - 1 for d in dilation)), Dims(*pad), Dims(*pad_r)]
    return shapes, descriptors, geometry


class Convolution(Weighted):
    """2-D convolution for one geometry.

    Shapes are Caffe's: input (N, C, H, W), weights (O, C/G, kh, kw), bias
    (O,), output (N, O, H', W').  ``dilation`` is Caffe's (1: none); oneDNN
    counts the gaps, so it receives ``dilation - 1``.  oneDNN picks the
    layouts it computes fastest in (the input's is ``layout`` where given: the
    one its blob is held in), and the gradients' are those of the values they
    belong to where it computes them there; arrays are reordered to and from
    them.  OneDnnError when oneDNN has no implementation for the geometry.
    """

    def __init__(self, lib: Library, input_shape, weights_shape, output_shape, group: int, stride, pad, dilation,
                 bias: bool, layout: Handle | None = None):
        shapes, (x, w, b, y), geometry = convolution_descriptors(lib, input_shape, weights_shape, output_shape, group,
                                                                 stride, pad, dilation, bias)
        forward, found = Handle(), None
        lib.call("dnnl_convolution_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                 FORWARD_TRAINING, CONVOLUTION_DIRECT, layout or x, w, b, y, *geometry, None)
        refuse_reference(lib, forward, layout)
        for values, results in ((lib.chosen(forward, QUERY_SRC), lib.chosen(forward, QUERY_DST)), (x, y)):
            data, weights = Handle(), Handle()
            try:
                lib.call("dnnl_convolution_backward_data_primitive_desc_create", ctypes.byref(data), lib.engine,
                         CONVOLUTION_DIRECT, values, w, results, *geometry, forward, None)
                lib.call("dnnl_convolution_backward_weights_primitive_desc_create", ctypes.byref(weights),
                         lib.engine, CONVOLUTION_DIRECT, values, w, b, results, *geometry, forward, None)
            except OneDnnError:  # (then in the layouts oneDNN picks for them)
                continue
            found = data, weights
            if not any(lib.implementation(pd).startswith(REFERENCE_IMPLEMENTATIONS) for pd in found):
                break
        if found is None:
            raise OneDnnError(f"oneDNN has no backward pass for this convolution ({input_shape} to {output_shape})")
        data, weights = found
        self.bind(lib, {"forward": forward, "data": data, "weights": weights}, shapes, chosen=True,
                  bias=weights_shape[0] if bias else None)


class InnerProduct(Weighted):
    """A fully connected layer on plain matrices: input (M, K), weights (N, K), bias (N,), output (M, N)."""

    def __init__(self, lib: Library, rows: int, inputs: int, outputs: int, bias: bool):
        shapes = {"x": (rows, inputs), "w": (outputs, inputs), "y": (rows, outputs)}
        x, w, y = (lib.memory_desc(shapes[name]) for name in ("x", "w", "y"))
        b = lib.memory_desc((outputs,)) if bias else None
        forward, data, weights = Handle(), Handle(), Handle()
        lib.call("dnnl_inner_product_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                 FORWARD_TRAINING, x, w, b, y, None)
        lib.call("dnnl_inner_product_backward_data_primitive_desc_create", ctypes.byref(data), lib.engine,
                 x, w, y, forward, None)
        lib.call("dnnl_inner_product_backward_weights_primitive_desc_create", ctypes.byref(weights), lib.engine,
                 x, w, b, y, forward, None)
        self.bind(lib, {"forward": forward, "data": data, "weights": weights}, shapes, chosen=False,
                  bias=outputs if bias else None)


class Passes:
    """Base of the layers' forward and backward primitives over arguments held in ``self.operands``
    (``{oneDNN argument: Operand}``), with the workspace, if any, the forward pass leaves for backward."""

    workspace = None  # (memory, its buffer)
    layout = None  # the blocked layout the output is written in (None: plain)

    @property
    def gradient_layout(self) -> Handle | None:
        """The blocked layout the output's gradient is read in (None: plain): the output's."""
        return self.layout

    def _run(self, primitive: Handle, reads: dict[int, Array], writes: dict[int, Array],
             ready: dict[int, Handle] | None = None) -> None:
        """Run ``primitive`` on ``reads`` and ``writes`` (arrays) and ``ready`` (memory objects as they are)."""
        args = {arg: self.operands[arg].read(array) for arg, array in reads.items()}
        args.update({arg: self.operands[arg].write(array) for arg, array in writes.items()})
        args.update(ready or {})
        if self.workspace is not None:
            args[ARG_WORKSPACE] = self.workspace[0]
        self.lib.run(primitive, args)
        for arg in writes:
            self.operands[arg].written()
        self.lib.wait()


class Pooling(Passes):
    """2-D MAX or average pooling primitives (forward for training, backward) on (N, C, H, W) arrays.

    ``pad`` pads before, ``far_pad`` after (Caffe's ceil rounding needs more
    there).  MAX keeps the position of each window's maximum in a workspace
    for backward.  Averages divide by the whole window, padding and overhang
    included (oneDNN's ``include_padding``); the layer rescales to its own
    divisor.  The input is taken in ``layout`` (a blocked one its blob is held
    in) where a jit implementation pools it there, else plain, else (where
    only a reference implementation pools the plain layout, on AVX2 CPUs) in
    channel blocks of 8; ``layout`` then says which blocked one, if any.
    """

    def __init__(self, lib: Library, input_shape, output_shape, kernel, stride, pad, far_pad, maximum: bool,
                 layout: Handle | None = None):
        self.lib = lib
        shapes = tuple(input_shape), tuple(output_shape)
        algorithm = POOLING_MAX if maximum else POOLING_AVG_INCLUDE_PADDING
        geometry = [Dims(*stride), Dims(*kernel), Dims(0, 0), Dims(*pad), Dims(*far_pad)]
        candidates = [lib.memory_desc(shapes[0], tag) for tag in (None, CHANNEL_BLOCKS_OF_8)]
        for x in ([layout] if layout is not None else []) + candidates:
            forward = Handle()
            lib.call("dnnl_pooling_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                     FORWARD_TRAINING, algorithm, x, lib.memory_desc(shapes[1], ANY), *geometry, None)
            if not lib.implementation(forward).startswith(REFERENCE_IMPLEMENTATIONS):
                break
        y, backward = lib.chosen(forward, QUERY_DST), Handle()
        lib.call("dnnl_pooling_backward_primitive_desc_create", ctypes.byref(backward), lib.engine, algorithm,
                 x, y, *geometry, forward, None)
        self.forward_primitive, self.backward_primitive = lib.primitive(forward), lib.primitive(backward)
        layouts = {ARG_SRC: (shapes[0], x), ARG_DIFF_SRC: (shapes[0], x), ARG_DST: (shapes[1], y),
                   ARG_DIFF_DST: (shapes[1], y)}
        self.operands = {arg: Operand(lib, shape, desc, slot=arg) for arg, (shape, desc) in layouts.items()}
        self.layout = self.operands[ARG_DST].layout
        workspace = lib.chosen(forward, QUERY_WORKSPACE)
        self.workspace = lib.owned_memory(workspace) if workspace.value else None  # (memory, its buffer)

    def forward(self, x: Array, y: Array) -> None:
        """The pooled ``x``, written into ``y`` (arrays, or blobs' arrays: :class:`BlobArray`)."""
        self._run(self.forward_primitive, {ARG_SRC: x}, {ARG_DST: y})

    def backward(self, dy: Array, dx: Array) -> None:
        """The input's gradient from the last :meth:`forward`, written into ``dx``."""
        self._run(self.backward_primitive, {ARG_DIFF_DST: dy}, {ARG_DIFF_SRC: dx})


class ScaledNormalization(Passes):
    """Base of the normalizations with a learned scale and shift: their backward pass for a layer, whose
    parameters' diffs accumulate while oneDNN overwrites the gradients it writes."""

    def backward(self, dy: Array, dx: Array, arrays: dict[int, numpy.ndarray]) -> None:
        """The input's gradient written into ``dx``, the scale's and shift's into ``arrays``."""
        raise NotImplementedError

    def backward_into(self, dy: Array, dx: Array | None, arrays: dict[int, numpy.ndarray], blobs: list,
                      learn: list[bool]) -> None:
        """:meth:`backward` for a layer: the input's gradient written into ``dx`` (None: not wanted), the scale's
        and shift's added to the diffs of ``blobs`` (the scale's and the shift's blobs) where ``learn`` says."""
        diffs = [numpy.empty_like(blob.diff) for blob in blobs]
        if dx is None:  # (not wanted: written aside)
            dx = numpy.empty_like(dy.stored() if isinstance(dy, BlobArray) else dy)
        self.backward(dy, dx,
                      {**arrays, **dict(zip((ARG_DIFF_SCALE, ARG_DIFF_SHIFT), diffs))})
        for blob, diff, wanted in zip(blobs, diffs, learn):
            if wanted:
                blob.diff += diff


class Normalization(ScaledNormalization):
    """oneDNN's batch normalization on float32 (N, C, ...) arrays of one shape, forward and backward:
    ``y = scale_c * (x - mean_c) / sqrt(variance_c + eps) + shift_c``.

    ``flags`` combine NORMALIZE_GLOBAL_STATS (mean and variance are given;
    without it the forward pass takes them over N and the spatial axes,
    variance biased, and writes them out), NORMALIZE_SCALE and
    NORMALIZE_SHIFT (backward then also writes their gradients, which it must
    be given arrays for).  4-D arrays are computed in ``layout`` (a blocked one
    their blob is held in), else in channel blocks of 8 (faster than oneDNN's
    plain code even with the reorders).  With ``keeps_input``
    the forward pass keeps its input, in that layout, for backward: layers in
    place after it may overwrite the array (inference nets need no copy).
    Channel arrays are (C,), given by oneDNN argument (``{ARG_MEAN: mean,
    ARG_VARIANCE: variance, ARG_SCALE: ...}``).
    """

    def __init__(self, lib: Library, shape, eps: float, flags: int, keeps_input: bool = True,
                 layout: Handle | None = None):
        self.lib = lib
        shape = tuple(shape)
        data = layout or lib.memory_desc(shape, CHANNEL_BLOCKS_OF_8 if len(shape) == 4 else None)
        epsilon, flags_ = ctypes.c_float(eps), ctypes.c_uint(flags)
        forward, backward = Handle(), Handle()
        lib.call("dnnl_batch_normalization_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                 FORWARD_TRAINING, data, data, epsilon, flags_, None)
        learns = flags & (NORMALIZE_SCALE | NORMALIZE_SHIFT)
        lib.call("dnnl_batch_normalization_backward_primitive_desc_create", ctypes.byref(backward), lib.engine,
                 BACKWARD if learns else BACKWARD_DATA, data, data, data, epsilon, flags_, forward, None)
        self.forward_primitive, self.backward_primitive = lib.primitive(forward), lib.primitive(backward)
        self.operands = {arg: Operand(lib, shape, data, slot=arg)
                         for arg in (ARG_SRC, ARG_DST, ARG_DIFF_SRC, ARG_DIFF_DST)}
        self.operands.update({arg: Operand(lib, (shape[1],)) for arg in (ARG_MEAN, ARG_VARIANCE, ARG_SCALE, ARG_SHIFT,
                                                                          ARG_DIFF_SCALE, ARG_DIFF_SHIFT)})
        self.layout = self.operands[ARG_DST].layout
        plain = lib.memory_desc(shape)
        self.input, self.keep, self.copy = lib.memory(plain), lib.reorder(plain, data), lib.reorder(data, data)
        self.kept = lib.owned_memory(data) if keeps_input else None  # the input for backward: (memory, its buffer)

    def forward(self, x: Array, y: Array, channels: dict[int, numpy.ndarray]) -> None:
        """Normalise ``x`` into ``y`` (arrays, or blobs' arrays: :class:`BlobArray`; the batch statistics written
        into ``channels`` unless given there)."""
        if self.kept is None:
            self._run(self.forward_primitive, {ARG_SRC: x, **channels}, {ARG_DST: y})
            return
        held = self.operands[ARG_SRC].held(x)
        if held is not None and held.latest != PLAIN:
            self.lib.run(self.copy, {ARG_SRC: held.memory, ARG_DST: self.kept[0]})
        else:
            self.lib.point(self.input, x.array() if isinstance(x, BlobArray) else x)
            self.lib.run(self.keep, {ARG_SRC: self.input, ARG_DST: self.kept[0]})
        self._run(self.forward_primitive, channels, {ARG_DST: y}, {ARG_SRC: self.kept[0]})

    def backward(self, dy: Array, dx: Array, channels: dict[int, numpy.ndarray]) -> None:
        """The input's gradient from the output's (and the scale's and shift's, into ``channels``), after
        :meth:`forward` and with the statistics it used."""
        self._run(self.backward_primitive, {ARG_DIFF_DST: dy, **channels}, {ARG_DIFF_SRC: dx}, {ARG_SRC: self.kept[0]})


class LayerNormalization(ScaledNormalization):
    """oneDNN's layer normalization on plain float32 (rows, width) arrays of one shape, forward and backward: each
    row normalised over its width, ``y_rj = scale_j * (x_rj - mean_r) / sqrt(variance_r + eps) + shift_j``.

    The forward pass takes each row's mean and (biased) variance and writes
    them out, (rows,) arrays; backward reads them back, with the same input.
    ``flags``: NORMALIZE_SCALE and NORMALIZE_SHIFT (backward then also writes
    their gradients, (width,) arrays it must be given), or 0.  Arrays are
    given by oneDNN argument (``{ARG_MEAN: mean, ARG_VARIANCE: variance,
    ARG_SCALE: ...}``).
    """

    def __init__(self, lib: Library, rows: int, width: int, eps: float, flags: int):
        self.lib = lib
        data, statistics = lib.memory_desc((rows, width)), lib.memory_desc((rows,))
        epsilon, flags_ = ctypes.c_float(eps), ctypes.c_uint(flags)
        forward, backward = Handle(), Handle()
        lib.call("dnnl_layer_normalization_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                 FORWARD_TRAINING, data, data, statistics, epsilon, flags_, None)
        lib.call("dnnl_layer_normalization_backward_primitive_desc_create", ctypes.byref(backward), lib.engine,
                 BACKWARD if flags else BACKWARD_DATA, data, data, data, statistics, epsilon, flags_, forward, None)
        self.forward_primitive, self.backward_primitive = lib.primitive(forward), lib.primitive(backward)
        shapes = {(rows, width): (ARG_SRC, ARG_DST, ARG_DIFF_SRC, ARG_DIFF_DST), (rows,): (ARG_MEAN, ARG_VARIANCE),
                  (width,): (ARG_SCALE, ARG_SHIFT, ARG_DIFF_SCALE, ARG_DIFF_SHIFT)}
        self.operands = {arg: Operand(lib, shape) for shape, args in shapes.items() for arg in args}

    def forward(self, x: numpy.ndarray, y: numpy.ndarray, arrays: dict[int, numpy.ndarray]) -> None:
        """Normalise ``x`` into ``y``, each row's mean and variance written into ``arrays``."""
        self._run(self.forward_primitive, {ARG_SRC: x, **arrays}, {ARG_DST: y})

    def backward(self, dy: numpy.ndarray, dx: numpy.ndarray, arrays: dict[int, numpy.ndarray]) -> None:
        """The input's gradient from the output's (and the scale's and shift's, into ``arrays``), with ``arrays``
        holding the input (ARG_SRC) and the statistics :meth:`forward` wrote for it."""
        self._run(self.backward_primitive, {ARG_DIFF_DST: dy, **arrays}, {ARG_DIFF_SRC: dx})


class Unary(Passes):
    """Base of the primitives from one plain float32 array to another of its shape, forward and backward; backward
    reads the output's gradient and ``backward_reads``: the input (ARG_SRC) or the output (ARG_DST: such a
    primitive runs in place)."""

    backward_reads = ARG_SRC

    def bind(self, lib: Library, shape, forward: Handle, backward: Handle, layout: Handle | None = None) -> None:
        """Create the primitives of the descriptors ``forward`` and ``backward`` and their operands (in ``layout``,
        None: plain)."""
        self.lib = lib
        self.forward_primitive, self.backward_primitive = lib.primitive(forward), lib.primitive(backward)
        self.operands = {arg: Operand(lib, tuple(shape), layout, slot=arg)
                         for arg in (ARG_SRC, ARG_DST, ARG_DIFF_SRC, ARG_DIFF_DST)}
        self.layout = self.operands[ARG_DST].layout

    def forward(self, x: Array, y: Array) -> None:
        """``f(x)``, written into ``y`` (arrays, or blobs' arrays: :class:`BlobArray`)."""
        self._run(self.forward_primitive, {ARG_SRC: x}, {ARG_DST: y})

    def backward(self, x: Array | None, y: Array, dy: Array, dx: Array) -> None:
        """The input's gradient from the output's ``dy`` and the output ``y`` or the input ``x`` (as
        ``backward_reads`` says; the other may be None), written into ``dx``."""
        data = y if self.backward_reads == ARG_DST else x
        self._run(self.backward_primitive, {self.backward_reads: data, ARG_DIFF_DST: dy}, {ARG_DIFF_SRC: dx})


class Elementwise(Unary):
    """One of oneDNN's element-wise functions (``algorithm``, with its ``alpha`` and ``beta``) on float32 arrays
    of one shape, plain or in ``layout`` (a blocked one their blob is held in), forward and backward.  Algorithms
    named ``..._USE_DST`` take the output in backward, and so run in place; the others take the input."""

    def __init__(self, lib: Library, shape, algorithm: int, alpha: float = 0.0, beta: float = 0.0,
                 layout: Handle | None = None):
        self.backward_reads = ARG_DST if algorithm >= ELTWISE_RELU_USE_DST else ARG_SRC  # (those come from 0x100)
        data = layout or lib.memory_desc(tuple(shape))
        forward, backward = Handle(), Handle()
        constants = ctypes.c_float(alpha), ctypes.c_float(beta)
        lib.call("dnnl_eltwise_forward_primitive_desc_create", ctypes.byref(forward), lib.engine, FORWARD_TRAINING,
                 algorithm, data, data, *constants, None)
        lib.call("dnnl_eltwise_backward_primitive_desc_create", ctypes.byref(backward), lib.engine, algorithm, data,
                 data, data, *constants, forward, None)
        self.bind(lib, shape, forward, backward, layout)


class Softmax(Unary):
    """oneDNN's softmax, ``y_k = exp(x_k - max_j x_j) / sum_j exp(x_j - max_j x_j)`` along ``axis`` of plain
    float32 arrays of one shape (with ``log``: its logarithm, ``x_k - max_j x_j - log sum_j exp(x_j - max_j
    x_j)``), forward and backward (from the output: it runs in place)."""

    backward_reads = ARG_DST

    def __init__(self, lib: Library, shape, axis: int, log: bool = False):
        data = lib.memory_desc(tuple(shape))
        algorithm = SOFTMAX_LOG if log else SOFTMAX_ACCURATE
        forward, backward = Handle(), Handle()
        lib.call("dnnl_softmax_forward_primitive_desc_create", ctypes.byref(forward), lib.engine, FORWARD_TRAINING,
                 algorithm, data, data, ctypes.c_int(axis), None)
        lib.call("dnnl_softmax_backward_primitive_desc_create", ctypes.byref(backward), lib.engine, algorithm,
                 data, data, data, ctypes.c_int(axis), forward, None)
        self.bind(lib, shape, forward, backward)


class Sum:
    """``y = sum_i scales_i * x_i`` over float32 arrays of one shape (on every thread), plain or in ``layout`` (a
    blocked one their blobs are held in): a scaled copy with one input.  Two inputs unscaled are added by
    oneDNN's binary primitive (a jit implementation), the rest by its sum (a portable one)."""

    def __init__(self, lib: Library, shape, scales: list[float], layout: Handle | None = None):
        self.lib = lib
        data = layout or lib.memory_desc(tuple(shape))
        descriptor = Handle()
        if scales == [1.0, 1.0]:
            lib.call("dnnl_binary_primitive_desc_create", ctypes.byref(descriptor), lib.engine, BINARY_ADD, data,
                     data, data, None)
            self.arguments = [ARG_SRC, ARG_SRC_1]
        else:
            lib.call("dnnl_sum_primitive_desc_create", ctypes.byref(descriptor), lib.engine, data, len(scales),
                     (ctypes.c_float * len(scales))(*scales), (Handle * len(scales))(*[data] * len(scales)), None)
            self.arguments = [ARG_MULTIPLE_SRC + i for i in range(len(scales))]
        self.primitive = lib.primitive(descriptor)
        self.inputs = [Operand(lib, tuple(shape), layout, slot=arg) for arg in self.arguments]
        self.output = Operand(lib, tuple(shape), layout, slot=ARG_DST)
        self.layout = self.gradient_layout = self.output.layout  # (the gradients are summed alike)

    def __call__(self, inputs: list[Array], out: Array) -> None:
        """The scaled sum of ``inputs`` (one array per scale), written into ``out`` (arrays, or blobs' arrays:
        :class:`BlobArray`)."""
        args = {arg: operand.read(array) for arg, operand, array in zip(self.arguments, self.inputs, inputs)}
        self.lib.run(self.primitive, {**args, ARG_DST: self.output.write(out)})
        self.output.written()
        self.lib.wait()


class Copy:
    """A copy between two float32 arrays of one shape laid out with any strides (views into bigger arrays, or a
    source repeated along an axis by a stride of 0): oneDNN's reorder, on every thread."""

    def __init__(self, lib: Library, shape, source_strides, target_strides):
        source, target = lib.strided(tuple(shape), tuple(source_strides)), lib.strided(tuple(shape),
                                                                                        tuple(target_strides))
        self.lib, self.primitive = lib, lib.reorder(source, target)
        self.source, self.target = lib.memory(source), lib.memory(target)

    def __call__(self, source: numpy.ndarray, target: numpy.ndarray) -> None:
        """Copy ``source`` into ``target``, arrays (or views) with the strides given."""
        for memory, array in ((self.source, source), (self.target, target)):
            self.lib.call("dnnl_memory_set_data_handle", memory, Handle(array.ctypes.data))
        self.lib.run(self.primitive, {ARG_SRC: self.source, ARG_DST: self.target})
        self.lib.wait()


def element_strides(array: numpy.ndarray) -> tuple[int, ...]:
    """The strides of ``array`` in elements."""
    return tuple(stride // array.itemsize for stride in array.strides)


class LocalResponseNormalization(Passes):
    """oneDNN's LRN on plain float32 (N, C, H, W) arrays of one shape, forward and backward:
    ``y = x * (k + alpha / n^d * sum of x^2 over the window)^-beta`` with ``n`` the window's size, over ``n``
    channels (``across``, d = 1) or an ``n x n`` window in the channel (d = 2), zeros beyond the edges.

    The arrays are taken in ``layout`` (a blocked one their blob is held in), else reordered into channel
    blocks of 8, else channels last: the first layout a jit implementation runs in (forward, and backward when
    ``training``).  Where only oneDNN's reference one would (LRN's backward on AVX2 CPUs, windows other than 5),
    OneDnnError: NumPy's is several times faster.
    """

    def __init__(self, lib: Library, shape, across: bool, size: int, alpha: float, beta: float, k: float,
                 training: bool = True, layout: Handle | None = None):
        if size < 2:  # (oneDNN 3.2 crashes the process on a window of one)
            raise OneDnnError("oneDNN's LRN takes windows of 2 and more")
        self.lib = lib
        shape = tuple(shape)
        algorithm = LRN_ACROSS_CHANNELS if across else LRN_WITHIN_CHANNEL
        constants = ctypes.c_int64(size), ctypes.c_float(alpha), ctypes.c_float(beta), ctypes.c_float(k)
        layouts = ([layout] if layout is not None else []) + [lib.memory_desc(shape, CHANNEL_BLOCKS_OF_8),
                                                               lib.channels_last(shape)]
        for data in layouts:
            forward, backward = Handle(), Handle()
            lib.call("dnnl_lrn_forward_primitive_desc_create", ctypes.byref(forward), lib.engine, FORWARD_TRAINING,
                     algorithm, data, data, *constants, None)
            lib.call("dnnl_lrn_backward_primitive_desc_create", ctypes.byref(backward), lib.engine, algorithm, data,
                     data, data, *constants, forward, None)
            slow = [name for name in [lib.implementation(forward)] + ([lib.implementation(backward)] if training
                                                                       else [])
                    if name.startswith(REFERENCE_IMPLEMENTATIONS)]
            if not slow:
                break
        else:
            raise OneDnnError(f"only oneDNN's reference implementation ({slow[0]}) runs it on this CPU, slower than "
                              "NumPy")
        self.forward_primitive, self.backward_primitive = lib.primitive(forward), lib.primitive(backward)
        workspace = lib.chosen(forward, QUERY_WORKSPACE)
        self.workspace = lib.owned_memory(workspace) if workspace.value else None  # (memory, its buffer)
        self.operands = {arg: Operand(lib, shape, data, slot=arg) for arg in (ARG_SRC, ARG_DST, ARG_DIFF_SRC,
                                                                               ARG_DIFF_DST)}
        self.layout = self.operands[ARG_DST].layout

    def forward(self, x: Array, y: Array) -> None:
        """The normalised ``x``, written into ``y`` (arrays, or blobs' arrays: :class:`BlobArray`)."""
        self._run(self.forward_primitive, {ARG_SRC: x}, {ARG_DST: y})

    def backward(self, x: Array, dy: Array, dx: Array) -> None:
        """The input's gradient from the input and the output's gradient (after :meth:`forward` on ``x``),
        written into ``dx``."""
        self._run(self.backward_primitive, {ARG_SRC: x, ARG_DIFF_DST: dy}, {ARG_DIFF_SRC: dx})


class FusedConvolution(Passes):
    """Inference only: a convolution whose output goes on, in the same primitive, through ``steps`` in order:
    ``("affine", None)`` a scale and a shift per output channel (a BatchNorm and Scale folded in), ``("relu",
    slope)`` a ReLU, ``("add", None)`` the values of another array of the output's shape (an Eltwise SUM's other
    bottom): ``y = relu(relu(s_o * (x * w + b) + t_o) + a)`` with every step optional.  Shapes and geometry as
    :class:`Convolution`; the output, and the array added, in ``layout`` where given (the one the output's blob
    is held in), else in the one the primitive computes fastest in."""

    def __init__(self, lib: Library, input_shape, weights_shape, output_shape, group: int, stride, pad, dilation,
                 bias: bool, steps: list[tuple[str, float | None]], layout: Handle | None = None):
        self.lib = lib
        shapes, (x, w, b, y), geometry = convolution_descriptors(lib, input_shape, weights_shape, output_shape, group,
                                                                 stride, pad, dilation, bias)
        operations = [(operation, slope) for step, slope in steps for operation in self.OPERATIONS[step]]
        if layout is None and ("add", None) in operations:  # (the output's layout, which the added array takes)
            layout = lib.chosen(self._descriptor(lib, [x, w, b, y], geometry, [], None, weights_shape[0]), QUERY_DST)
        forward = self._descriptor(lib, [x, w, b, layout or y], geometry, operations, layout, weights_shape[0])
        refuse_reference(lib, forward, layout)
        self.primitive = lib.primitive(forward)
        self.operands = {arg: Operand(lib, shapes[name], lib.chosen(forward, query), slot=arg)
                         for arg, name, query in ((ARG_SRC, "x", QUERY_SRC), (ARG_WEIGHTS, "w", QUERY_WEIGHTS),
                                                  (ARG_DST, "y", QUERY_DST))}
        if bias:
            self.operands[ARG_BIAS] = Operand(lib, (weights_shape[0],))
        self.layout = self.operands[ARG_DST].layout
        self.arguments = {}  # {"scale", "shift" or "add": the argument of the post-op that reads that array}
        for index, (operation, _) in enumerate(operations):
            if operation != "relu":
                arg = self.arguments[operation] = ARG_POST_OPS * (index + 1) | ARG_SRC_1
                self.operands[arg] = (Operand(lib, shapes["y"], self.layout, slot=arg) if operation == "add"
                                      else Operand(lib, (1, weights_shape[0], 1, 1)))

    OPERATIONS = {"affine": ("scale", "shift"), "relu": ("relu",), "add": ("add",)}  # each step's post-ops

    @staticmethod
    def _descriptor(lib: Library, descriptors: list, geometry: list, operations, layout: Handle | None,
                    channels: int) -> Handle:
        """The forward primitive descriptor with ``operations`` as post-ops (the added array in ``layout``, the
        scale and shift one value for each of the output's ``channels``)."""
        per_channel = lib.memory_desc((1, channels, 1, 1))
        post_ops, attributes, forward = Handle(), Handle(), Handle()
        lib.call("dnnl_post_ops_create", ctypes.byref(post_ops))
        for operation, slope in operations:
            if operation == "relu":
                lib.call("dnnl_post_ops_append_eltwise", post_ops, ELTWISE_RELU, ctypes.c_float(slope),
                         ctypes.c_float(0))
            else:
                lib.call("dnnl_post_ops_append_binary", post_ops, BINARY_MUL if operation == "scale" else BINARY_ADD,
                         layout if operation == "add" else per_channel)
        lib.call("dnnl_primitive_attr_create", ctypes.byref(attributes))
        lib.call("dnnl_primitive_attr_set_post_ops", attributes, post_ops)
        try:
            lib.call("dnnl_convolution_forward_primitive_desc_create", ctypes.byref(forward), lib.engine,
                     FORWARD_INFERENCE, CONVOLUTION_DIRECT, *descriptors, *geometry, attributes)
        finally:  # (the descriptor keeps copies)
            lib.call("dnnl_primitive_attr_destroy", attributes)
            lib.call("dnnl_post_ops_destroy", post_ops)
        return forward

    def forward(self, x: Array, w: numpy.ndarray, b: numpy.ndarray | None, y: Array, **inputs: Array) -> None:
        """The fused output, written into ``y``; the post-ops' arrays by name: ``scale`` and ``shift`` (O,) with
        an ``affine`` step, ``add`` (the output's shape) with an ``add`` step."""
        reads = {ARG_SRC: x, ARG_WEIGHTS: w, ARG_BIAS: b, **{self.arguments[name]: array
                                                              for name, array in inputs.items()}}
        self._run(self.primitive, {arg: array for arg, array in reads.items() if array is not None}, {ARG_DST: y})


class LongShortTermMemory(Passes):
    """Inference of a one-layer LSTM over a whole sequence, left to right (oneDNN's vanilla LSTM, forward):
    input (T, N, I), initial states h_0 and c_0 and final ones (N, H) each, outputs h_t (T, N, H).  The gates
    are stacked in oneDNN's order i, f, g (the candidate, tanh), o: the input weights (4H, I), the recurrent
    ones (4H, H) and the bias (4H,), the weights reordered at each call into the layout the primitive computes
    fastest in; all arrays C-contiguous float32.  Every step continues from the one before: a sequence that
    restarts within T needs another path.  OneDnnError where only oneDNN's reference implementation would run
    it (CPUs without AVX2)."""

    LEFT_TO_RIGHT = 1  # dnnl_unidirectional_left2right
    SRC_ITER, SRC_ITER_C, DST_ITER, DST_ITER_C, WEIGHTS_ITER = 2, 3, 18, 19, 34  # (DNNL_ARG_*)

    def __init__(self, lib: Library, steps: int, batch: int, inputs: int, hidden: int):
        self.lib = lib
        shapes = {ARG_SRC: (steps, batch, inputs), ARG_DST: (steps, batch, hidden), ARG_BIAS: (1, 1, 4, hidden)}
        shapes |= dict.fromkeys((self.SRC_ITER, self.SRC_ITER_C, self.DST_ITER, self.DST_ITER_C), (1, 1, batch, hidden))
        plain = {arg: lib.memory_desc(shape) for arg, shape in shapes.items()}
        rows = {ARG_WEIGHTS: inputs, self.WEIGHTS_ITER: hidden}
        weights = {arg: lib.memory_desc((1, 1, count, 4, hidden), ANY) for arg, count in rows.items()}
        forward = Handle()
        lib.call("dnnl_lstm_forward_primitive_desc_create", ctypes.byref(forward), lib.engine, FORWARD_INFERENCE,
                 self.LEFT_TO_RIGHT, plain[ARG_SRC], plain[self.SRC_ITER], plain[self.SRC_ITER_C],
                 weights[ARG_WEIGHTS], weights[self.WEIGHTS_ITER], None, None, plain[ARG_BIAS], plain[ARG_DST],
                 plain[self.DST_ITER], plain[self.DST_ITER_C], 0, None)
        if lib.implementation(forward).startswith(REFERENCE_IMPLEMENTATIONS):  # (slower than NumPy's steps)
            raise OneDnnError(f"only oneDNN's reference LSTM ({lib.implementation(forward)}) runs on this CPU")
        self.primitive = lib.primitive(forward)
        self.operands = {arg: Operand(lib, shape) for arg, shape in shapes.items()}
        # each weight matrix, gate-major as given ((4, H, rows): dims (1, 1, rows, 4, H) with strides), and the
        # primitive's layout, in a scratch buffer
        self.weights = {}
        for index, (arg, count) in enumerate(rows.items()):
            given = Handle()
            lib.call("dnnl_memory_desc_create_with_strides", ctypes.byref(given), 5, Dims(1, 1, count, 4, hidden),
                     F32, Dims(4 * hidden * count, 4 * hidden * count, 1, hidden * count, count))
            chosen = Handle(lib.dll.dnnl_primitive_desc_query_md(forward, QUERY_WEIGHTS, index))
            self.weights[arg] = (lib.memory(given), lib.memory(chosen), lib.reorder(given, chosen),
                                 lib.dll.dnnl_memory_desc_get_size(chosen))

    def forward(self, x: numpy.ndarray, w_x: numpy.ndarray, w_h: numpy.ndarray, b: numpy.ndarray,
                h_0: numpy.ndarray, c_0: numpy.ndarray, y: numpy.ndarray, h_t: numpy.ndarray,
                c_t: numpy.ndarray) -> None:
        """Every step from ``h_0`` and ``c_0``: the outputs written into ``y``, the final states into ``h_t``
        and ``c_t``."""
        ready = {}
        for arg, matrix in ((ARG_WEIGHTS, w_x), (self.WEIGHTS_ITER, w_h)):
            given, chosen, reorder, nbytes = self.weights[arg]
            self.lib.point(given, matrix)
            self.lib.point(chosen, scratch(arg, nbytes))
            self.lib.run(reorder, {ARG_SRC: given, ARG_DST: chosen})
            ready[arg] = chosen
        reads = {ARG_SRC: x, ARG_BIAS: b, self.SRC_ITER: h_0, self.SRC_ITER_C: c_0}
        self._run(self.primitive, reads, {ARG_DST: y, self.DST_ITER: h_t, self.DST_ITER_C: c_t}, ready)
