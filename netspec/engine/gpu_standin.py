"""A GPU stand-in for tests: NumPy behind CuPy's rules, so every GPU-only branch runs on the CPU.

With ``NETSPEC_GPU_STANDIN=1`` in the environment, ``--device gpu`` (and
``Backend("gpu")``) takes this module as its array library instead of CuPy.
Its arrays (:class:`DeviceArray`) hold NumPy arrays but refuse what CuPy
refuses, so a host round trip or a mix of host and device arrays fails on a
machine with no GPU, as it would on one:

- implicit conversion to NumPy (``numpy.asarray(device_array)``, handing one
  to h5py or to a C library) raises TypeError, as CuPy's ``__array__`` does;
- a NumPy array (of any rank, 0 included) beside a device array in a ufunc or
  a NumPy function raises TypeError, as CuPy's "Unsupported type" does; Python
  and NumPy scalars are accepted, as CuPy accepts them;
- reductions and truth values (``allclose``) give 0-d device arrays, never host
  scalars; an integer index gives a 0-d view; a device array is no index
  (``range(x)``); lists are no operands of a ufunc;
- every read of device values on the host (``float()``, ``int()``, ``bool()``,
  ``.item()``, ``.tolist()``, ``.get()``, :func:`asnumpy`) is counted in
  :data:`reads` as the synchronisation it is on a GPU, and so is every
  operation whose result's size depends on the values (``flatnonzero``,
  ``bincount``, a boolean mask's selection...), which CuPy sizes by reading a
  count back.

Indexing with NumPy arrays and assigning NumPy arrays into device arrays copy
them to the device, as CuPy does; they are counted in :data:`uploads`.

A stream other than the null one captures a CUDA graph as CUDA does
(``Stream.begin_capture``, ``end_capture``, ``Graph.launch``): while it
captures, the work asked of the device is recorded, not done (arrays made then
hold values nobody may trust), and a read of device values on the host, a copy
from the host or a wait for the device raises, as CUDA refuses them; a launch
does the recorded work again, reading every array as it is then and every
host value as it was at capture.  This module proves nothing about CUDA
kernels or speed: it makes the first run on a real GPU short.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
import types
from collections import Counter

import numpy
from numpy.lib.mixins import NDArrayOperatorsMixin

ENVIRONMENT = "NETSPEC_GPU_STANDIN"  # the variable that turns the stand-in on ("1")
DESCRIPTION = "netspec's GPU stand-in (NumPy on the CPU with CuPy's rules; NETSPEC_GPU_STANDIN=1)"



def requested() -> bool:
    """Whether the environment asks for the stand-in (``NETSPEC_GPU_STANDIN=1``)."""
    return os.environ.get(ENVIRONMENT) == "1"


reads: Counter = Counter()  # host reads of device values by kind ('float', 'asnumpy', ...): each a synchronisation
uploads: Counter = Counter()  # host arrays copied to the device, by kind ('asarray', 'index', 'setitem')


def reset_counts() -> None:
    """Forget the reads and uploads counted so far."""
    reads.clear()
    uploads.clear()


class DeviceArray(NDArrayOperatorsMixin):
    """An array "on the device": a NumPy array that only this module's functions and its own methods read."""

    __slots__ = ("_host",)
    __array_priority__ = 100

    def __init__(self, host: numpy.ndarray):
        self._host = host

    # what CuPy refuses
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (GPU stand-in: as CuPy, "
                        "read device arrays with Backend.to_host)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(isinstance(value, list | tuple) for value in inputs):
            raise TypeError(f"{ufunc.__name__}: a list or tuple operand: CuPy refuses it (Unsupported type); make "
                            "it an array first (GPU stand-in)")
        if ufunc.__name__ in THROUGH_CUBLAS:
            _refused_in_capture(f"{ufunc.__name__} (CuPy's cuBLAS wrappers)")
        return _call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, function, kinds, args, kwargs):
        return _call(function, args, kwargs)

    # reads of device values on the host: each a synchronisation on a GPU
    def _read(self, kind: str):
        _refused_in_capture(f"reading a device array on the host ({kind})")
        reads[kind] += 1
        return self._host

    def __float__(self):
        return float(self._read("float"))

    def __int__(self):
        return int(self._read("int"))

    def __index__(self):
        raise TypeError("a device array cannot be an index (CuPy's arrays have no __index__; GPU stand-in)")

    def __bool__(self):
        return bool(self._read("bool"))

    def __complex__(self):
        return complex(self._read("complex"))

    def item(self):
        """The only value, on the host: a synchronisation."""
        return self._read("item").item()

    def __format__(self, spec):
        return format(self._read("format")[()] if self.ndim == 0 else self._read("format"), spec)

    def tobytes(self, order="C"):
        """The values' bytes on the host: a synchronisation."""
        return self._read("tobytes").tobytes(order)

    def __reduce__(self):  # (pickling reads the values: a synchronisation)
        return DeviceArray, (self._read("pickle").copy(),)

    def tolist(self):
        """The values as nested lists on the host: a synchronisation."""
        return self._read("tolist").tolist()

    def get(self):
        """A NumPy copy on the host (CuPy's ``ndarray.get``): a synchronisation."""
        return self._read("get").copy()

    def set(self, values: numpy.ndarray, stream=None) -> None:
        """Copy a host array of this array's shape and dtype in (CuPy's ``ndarray.set``, refusing what it refuses;
        counted in :data:`uploads`)."""
        if not isinstance(values, numpy.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(values).__name__} (GPU "
                            "stand-in)")
        if values.shape != self.shape or values.dtype != self.dtype:
            raise ValueError(f"set: a {values.dtype} array of shape {values.shape} into a {self.dtype} one of "
                             f"shape {self.shape}: CuPy refuses a mismatch (GPU stand-in)")
        if not self._host.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array (GPU stand-in)")
        _refused_in_capture("a copy from the host")
        uploads["set"] += 1
        target = self._host

        def copy() -> None:  # (reads the host array when it runs, as the GPU's copy engine does)
            target[...] = values

        _queue_on(stream, copy)

    # what stays on the device
    @property
    def shape(self):
        return self._host.shape

    @shape.setter
    def shape(self, shape):
        self._host.shape = shape

    @property
    def dtype(self):
        return self._host.dtype

    @property
    def data(self):
        """Where the values lie (``.data.ptr``, as CuPy's memory pointer gives it)."""
        return types.SimpleNamespace(ptr=self._host.__array_interface__["data"][0])

    @property
    def T(self):  # noqa: N802 - NumPy's name
        return DeviceArray(self._host.T)

    def __getattr__(self, name):
        if name.startswith("_") or name in HOST_ONLY:  # (no way to the host but the counted ones)
            raise AttributeError(f"{name}: not on a device array (GPU stand-in)")
        value = getattr(self._host, name)  # shape-like attributes pass as they are; methods run on the device
        if callable(value):
            return lambda *args, **kwargs: _call(value, args, kwargs, self._host if name in IN_PLACE_METHODS else None)
        return _wrap(value)

    def __len__(self):
        return len(self._host)

    def __iter__(self):
        return (self[index] for index in range(len(self)))

    def __getitem__(self, key):
        key = _index(key)
        picked = self._host[key]
        if isinstance(picked, numpy.generic):  # (every axis indexed by an integer: CuPy gives a 0-d view)
            picked = self._host[(*key, ...) if isinstance(key, tuple) else (key, ...)]
        elif not numpy.may_share_memory(picked, self._host):  # (an array index: a gather, a kernel on a GPU)
            _note(lambda: numpy.copyto(picked, self._host[key]))
        return _wrap(picked)

    def __setitem__(self, key, value):
        key, value = _index(key), _uploaded(value, "setitem")

        def assign() -> None:
            self._host[key] = value

        _run(assign)

    def __repr__(self):
        return f"{self._read('repr')!r} (on the GPU stand-in)"

    def __copy__(self):
        return array(self)

    def __deepcopy__(self, memo):
        return DeviceArray(self._host.copy())


def _wrap(value):
    """NumPy's results as device values: arrays and NumPy scalars become device arrays (CuPy's reductions give
    0-d arrays), tuples and lists keep their shape, anything else passes."""
    if isinstance(value, numpy.ndarray):
        return DeviceArray(value)
    if isinstance(value, numpy.generic):
        return DeviceArray(numpy.asarray(value))
    if isinstance(value, tuple | list):
        return type(value)(_wrap(item) for item in value)
    return value


def _device_only(value, where: str):
    """``value`` with its device arrays as the NumPy arrays they hold, refusing host arrays as CuPy does."""
    if isinstance(value, DeviceArray):
        return value._host
    if isinstance(value, numpy.ndarray):
        raise TypeError(f"{where}: a NumPy (host) array beside device arrays: CuPy refuses the mix "
                        "(Unsupported type numpy.ndarray); move it with Backend.asarray first (GPU stand-in)")
    if isinstance(value, tuple | list):
        return type(value)(_device_only(item, where) for item in value)
    if isinstance(value, dict):
        return {key: _device_only(item, where) for key, item in value.items()}
    return value


def _uploaded(value, kind: str):
    """A value for indexing, assignment or a new device array: device arrays as they are held (in lists too),
    host arrays as they are (a copy to the device, counted)."""
    if isinstance(value, DeviceArray):
        return value._host
    if isinstance(value, numpy.ndarray):
        _refused_in_capture("a copy from the host")
        uploads[kind] += 1
    if isinstance(value, list):
        return [_uploaded(item, kind) for item in value]
    return value


def _index(key):
    """An index with its device arrays unwrapped and its host arrays counted as uploads; a boolean mask counted as
    a read (CuPy reads back how many elements it picks, to size the result or check the values)."""
    parts = tuple(_uploaded(part, "index") for part in (key if isinstance(key, tuple) else (key,)))
    if any(getattr(part, "dtype", None) == numpy.bool_ for part in parts):
        _refused_in_capture("a boolean mask's selection (its size is read back)")
        reads["mask"] += 1
    return parts if isinstance(key, tuple) else parts[0]


class _Ufunc:
    """A NumPy ufunc that takes device arrays (``xp.add``, ``xp.add.at``, ``xp.maximum.reduce``...)."""

    def __init__(self, ufunc: numpy.ufunc):
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._ufunc, args, kwargs)

    def __getattr__(self, method):
        attribute = getattr(self._ufunc, method)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: _call(attribute, args, kwargs, _device_only(args[0], method)
                                              if method == "at" else None)


# functions whose result's size depends on the values: CuPy reads a count back to the host to size it
SIZED_BY_VALUES = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "bincount", "compress", "extract"})
# functions that give one truth value: CuPy keeps it on the device, as a 0-d array (reading it is a synchronisation)
TRUTH_VALUES = frozenset({"allclose", "array_equal", "array_equiv"})
# what a NumPy array offers that reaches host memory: CuPy's arrays have none of it
HOST_ONLY = frozenset({"ctypes", "flat", "tofile", "dump", "dumps"})  # (and every name starting with "_")
# functions and methods that write into their first argument (or the array itself), not into a result
IN_PLACE_FUNCTIONS = frozenset({"copyto", "put_along_axis", "put", "place", "putmask", "fill_diagonal"})
IN_PLACE_METHODS = frozenset({"fill", "put", "sort", "partition", "itemset", "setfield"})
UNFILLED = frozenset({"empty", "empty_like"})  # functions that make an array without a kernel
# functions CuPy runs through its cuBLAS wrappers, which refuse a capturing stream (they bind their handle to it)
THROUGH_CUBLAS = frozenset({"matmul", "dot", "tensordot", "einsum", "inner"})


def _call(function, args, kwargs, written=None):
    """``function`` of device arrays, its results on the device (``out=``, when given, is the result itself);
    ``written``: the array it writes into, where that is neither ``out`` nor its result (an in-place method's)."""
    name = getattr(function, "__name__", "function")
    if name in THROUGH_CUBLAS:
        _refused_in_capture(f"{name} (CuPy's cuBLAS wrappers)")
    if name in SIZED_BY_VALUES or (name == "where" and len(args) + len(kwargs) == 1):
        _refused_in_capture(f"{name} (its result's size is read back)")
        reads[name] += 1
    host_args, host_kwargs = _device_only(args, name), _device_only(kwargs, name)
    if written is None and name in IN_PLACE_FUNCTIONS and host_args:
        written = host_args[0]
    out = kwargs.get("out")
    if written is not None or isinstance(out, DeviceArray) or (isinstance(out, tuple) and out
                                                               and isinstance(out[0], DeviceArray)):
        _run(lambda: function(*host_args, **host_kwargs))
        if out is None:
            return None
        return out if not isinstance(out, tuple) else out[0] if len(out) == 1 else out
    with numpy.errstate(all="ignore") if _capture is not None else contextlib.nullcontext():
        result = function(*host_args, **host_kwargs)  # (in a capture: of values nobody may trust, and no warning)
    if name in TRUTH_VALUES:
        result = numpy.asarray(result)
    result = _wrap(result)
    if name not in UNFILLED:
        _note_result(function, host_args, host_kwargs, result)
    return result


def _function(function):
    def on_device(*args, **kwargs):
        return _call(function, args, kwargs)
    on_device.__name__ = function.__name__
    on_device.__doc__ = function.__doc__
    return on_device


class _Namespace(types.ModuleType):
    """NumPy's functions (or a submodule's: ``linalg``) taking and giving device arrays."""

    def __init__(self, name: str, source):
        super().__init__(name)
        self._source = source

    def __getattr__(self, name):
        value = getattr(self._source, name)
        if isinstance(value, numpy.ufunc):
            value = _Ufunc(value)
        elif isinstance(value, types.ModuleType):
            value = _Namespace(f"{self.__name__}.{name}", value)
        elif callable(value) and not isinstance(value, type):
            value = _function(value)
        setattr(self, name, value)  # (looked up once)
        return value


def asarray(value, dtype=None, order=None):
    """``value`` on the device: a device array as it is (cast to ``dtype``), anything else copied there."""
    if isinstance(value, DeviceArray):
        return value if dtype is None or value.dtype == dtype else value.astype(dtype)
    _refused_in_capture("a copy from the host")
    uploads["asarray"] += 1
    return DeviceArray(numpy.array(_uploaded(value, "asarray"), dtype=dtype, order=order or "K"))


def array(value, dtype=None, copy=True, order="K"):
    """A new device array of ``value`` (copied to the device when it is on the host)."""
    if isinstance(value, DeviceArray):
        return _call(numpy.array, (value,), {"dtype": dtype, "copy": copy, "order": order})
    _refused_in_capture("a copy from the host")
    uploads["array"] += 1
    return DeviceArray(numpy.array(_uploaded(value, "array"), dtype=dtype, order=order))


def asnumpy(value):
    """A NumPy copy on the host of a device array (a synchronisation); host values pass."""
    if isinstance(value, DeviceArray):
        return value.get()
    return numpy.asarray(value)


class _Device:
    """``cuda.Device(index)``: the stand-in's only device, 0."""

    def __init__(self, index: int = 0):
        self.id = index

    def use(self) -> None:
        """Make it the current device (there is only one)."""

    def synchronize(self) -> None:
        """Wait for the work queued on every stream."""
        _refused_in_capture("a wait for the device")
        for stream in list(_Stream.waiting):
            stream.run_until(stream.queued)


class _Runtime:
    """``cuda.runtime``: one device."""

    class CUDARuntimeError(RuntimeError):
        """CUDA's errors (the stand-in raises none)."""

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return 1


# ---- streams and graphs -------------------------------------------------------------------------------------

_capture: list | None = None  # the work of the graph being captured (None: no stream captures)


class StreamCaptureError(RuntimeError):
    """What CUDA answers to a read, a copy from the host or a wait while a stream captures
    (cudaErrorStreamCaptureUnsupported); the capture is then invalidated, as CUDA invalidates it."""


def _refused_in_capture(what: str) -> None:
    """Raise StreamCaptureError for ``what`` while a stream captures (and end the capture: it is lost)."""
    global _capture
    if _capture is not None:
        _capture = None
        raise StreamCaptureError(f"{what} while a stream captures a CUDA graph: CUDA refuses it "
                                 "(cudaErrorStreamCaptureUnsupported; GPU stand-in)")


def _run(work) -> None:
    """Do ``work``, a write into arrays that exist: now, or, while a stream captures, at each launch of the
    graph."""
    if _capture is None:
        work()
    else:
        _capture.append(work)


def _note(work) -> None:
    """Note ``work``, done already, for each launch of the graph being captured (if one is)."""
    if _capture is not None:
        _capture.append(work)


def _note_result(function, host_args, host_kwargs, result) -> None:
    """Note, while a stream captures, that a launch computes ``result`` (an array ``function`` made) again."""
    if _capture is None:
        return
    made = [item._host for item in (result if isinstance(result, tuple | list) else (result,))
            if isinstance(item, DeviceArray)]
    if made:
        def again() -> None:
            values = function(*host_args, **host_kwargs)
            for target, value in zip(made, values if isinstance(values, tuple | list) else (values,)):
                numpy.copyto(target, value)

        _capture.append(again)


class _Graph:
    """``cuda.Graph``: the work a stream captured, done again at each :meth:`launch`."""

    def __init__(self, work: list):
        self._work = work

    def launch(self, stream=None) -> None:
        """Do the captured work, in the order it was asked for."""
        for work in self._work:
            work()


class _Stream:
    """``cuda.Stream``: work asked of the current stream is done when it is asked for; a copy from the host onto
    another stream (``ndarray.set(values, stream)``) waits in that stream's queue until an event recorded after it
    is waited for (:meth:`wait_event`, ``Event.synchronize``) or the device is, and then reads the host values as
    they are, so a missing wait shows as a wrong value.  One that is not the null stream captures graphs."""

    null = None  # the null stream (set below)
    current = None  # the current stream
    waiting: list = []  # the streams with work queued

    def __init__(self, non_blocking: bool = False, null: bool = False):
        self.is_null = null
        self.ptr = 0 if null else id(self)
        self._before: list = []
        self._queue: list = []  # work asked for and not yet done
        self.done = self.queued = 0  # how much work was done, and asked for, on this stream

    def queue(self, work) -> None:
        """Ask for ``work`` on this stream: done later, in order."""
        self._queue.append(work)
        self.queued += 1
        if self not in _Stream.waiting:
            _Stream.waiting.append(self)

    def run_until(self, position: int) -> None:
        """Do the queued work up to the ``position``-th asked for."""
        while self.done < position:
            self._queue.pop(0)()
            self.done += 1
        if not self._queue and self in _Stream.waiting:
            _Stream.waiting.remove(self)

    def wait_event(self, event) -> None:
        """Let later work on this stream start only after the work before ``event``'s record (done now)."""
        event.reached()

    def __enter__(self):
        self._before.append(_Stream.current)
        _Stream.current = self
        return self

    def __exit__(self, *exc) -> None:
        _Stream.current = self._before.pop()

    def use(self) -> _Stream:
        """Make it the current stream."""
        _Stream.current = self
        return self

    def begin_capture(self, mode=None) -> None:
        """Start capturing a graph: what the device is asked from now on is recorded, not done."""
        global _capture
        if self.is_null:
            raise StreamCaptureError("the null stream cannot capture a graph (cudaErrorStreamCaptureImplicit; "
                                     "GPU stand-in)")
        if _capture is not None:
            raise StreamCaptureError("a stream is capturing already (GPU stand-in)")
        _capture = []

    def end_capture(self) -> _Graph:
        """End the capture: the graph of what was recorded."""
        global _capture
        if _capture is None:
            raise StreamCaptureError("the capture was invalidated: something was refused while it went on "
                                     "(cudaErrorStreamCaptureInvalidated; GPU stand-in)")
        work, _capture = _capture, None
        return _Graph(work)

    def is_capturing(self) -> bool:
        """Whether this stream captures a graph now."""
        return _capture is not None and not self.is_null

    def synchronize(self) -> None:
        """Wait for the work queued on this stream."""
        _refused_in_capture("a wait for the device")
        self.run_until(self.queued)


_Stream.null = _Stream.current = _Stream(null=True)


def _queue_on(stream, work) -> None:
    """Do ``work`` now if it is asked of the current stream (or none is named), else queue it on ``stream``."""
    if stream is None or stream is _Stream.current:
        work()
    else:
        stream.queue(work)


def _get_current_stream() -> _Stream:
    """``cuda.get_current_stream()``."""
    return _Stream.current


class _MemoryPool:
    """CuPy's memory pool as far as netspec asks: the stand-in keeps no pool of its own."""

    def used_bytes(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass

    def malloc(self, size: int):
        """(Never called: the stand-in's arrays are NumPy's.)"""
        raise NotImplementedError


_POOL = _MemoryPool()


def get_default_memory_pool() -> _MemoryPool:
    """The (empty) memory pool."""
    return _POOL


@contextlib.contextmanager
def _using_allocator(allocator=None):
    """``cuda.using_allocator``: arrays made within come from ``allocator`` (here: NumPy's memory, as always)."""
    yield


class _Event:
    """``cuda.Event``: the host's clock when recorded, and how far its stream's queue then went."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.time = None
        self._stream, self._position = None, 0

    def record(self, stream=None) -> None:
        """Take the time, and note the work asked of ``stream`` (the current one) so far."""
        self.time = time.perf_counter()
        self._stream = stream or _Stream.current
        self._position = self._stream.queued

    def reached(self) -> None:
        """Do the work asked of the event's stream before it was recorded."""
        if self._stream is not None:
            self._stream.run_until(self._position)

    def synchronize(self) -> None:
        """Wait for the work before the event."""
        _refused_in_capture("a wait for the device")
        self.reached()


def _get_elapsed_time(start: _Event, end: _Event) -> float:
    """Milliseconds between two recorded events."""
    return 1000 * (end.time - start.time)


def _host_matrix(pointer: int, rows: int, columns: int, lead: int, dtype, transposed: bool = False):
    """The column-major ``rows`` x ``columns`` matrix of leading dimension ``lead`` at ``pointer`` (cuBLAS's way of
    reading memory), as a NumPy view; transposed where asked."""
    dtype = numpy.dtype(dtype)
    size = ((columns - 1) * lead + rows) * dtype.itemsize
    memory = (ctypes.c_char * size).from_address(pointer)
    view = numpy.ndarray((rows, columns), dtype, memory, strides=(dtype.itemsize, lead * dtype.itemsize))
    return view.T if transposed else view


def _host_scalar(pointer: int, dtype):
    """The value of ``dtype`` at the host ``pointer`` (how cuBLAS takes alpha and beta)."""
    return numpy.ndarray((), dtype, (ctypes.c_char * numpy.dtype(dtype).itemsize).from_address(pointer))[()]


def _gemm(dtype, precision=None):
    def gemm(handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """cuBLAS's ``C = alpha op(A) op(B) + beta C`` on column-major matrices (C not read where beta is 0);
        A and B 16-bit floats where a mixed ``precision`` says so (bfloat16's bits, or float16), widened when the
        product is made."""
        operands = {None: dtype, "bf16-mixed": numpy.uint16, "fp16-mixed": numpy.float16}[precision]
        left = _host_matrix(a, *((k, m) if transa else (m, k)), lda, operands, bool(transa))
        right = _host_matrix(b, *((n, k) if transb else (k, n)), ldb, operands, bool(transb))
        out, scale, keep = _host_matrix(c, m, n, ldc, dtype), _host_scalar(alpha, dtype), _host_scalar(beta, dtype)

        def values(matrix):
            if precision == "bf16-mixed":
                return (matrix.astype(numpy.uint32) << numpy.uint32(16)).view(dtype)
            return matrix.astype(dtype)

        def multiply() -> None:  # (alpha and beta read when asked, as host pointers are: kept in a graph)
            with numpy.errstate(over="ignore", invalid="ignore"):  # (infinities pass silently, as on a GPU)
                out[...] = scale * (values(left) @ values(right)) + (keep * out if keep else 0)

        _run(multiply)
    return gemm


def _gemm_strided_batched(dtype):
    gemm = _gemm(dtype)

    def batched(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                count):
        """cuBLAS's strided batched product: :func:`_gemm`'s on ``count`` matrices of each operand, each
        ``stride_*`` elements after the one before it."""
        size = numpy.dtype(dtype).itemsize
        for index in range(count):
            gemm(handle, transa, transb, m, n, k, alpha, a + index * stride_a * size, lda,
                 b + index * stride_b * size, ldb, beta, c + index * stride_c * size, ldc)
    return batched


def _gemv(dtype):
    def gemv(handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        """cuBLAS's ``y = alpha op(A) x + beta y`` on a column-major A (m x n) and contiguous vectors."""
        matrix = _host_matrix(a, m, n, lda, dtype, bool(trans))
        vector = _host_matrix(x, matrix.shape[1], 1, matrix.shape[1], dtype)
        out, scale, keep = _host_matrix(y, matrix.shape[0], 1, matrix.shape[0], dtype), _host_scalar(alpha, dtype), \
            _host_scalar(beta, dtype)

        def multiply() -> None:
            out[...] = scale * (matrix @ vector) + (keep * out if keep else 0)

        _run(multiply)
    return gemv


class _PinnedMemoryPointer(bytearray):
    """``cuda.PinnedMemoryPointer``: the buffer under an array :func:`empty_pinned` makes (page-locked memory on a
    GPU; plain here)."""


# cuBLAS as netspec.engine.cublas calls it, on the memory the device arrays point to
_cublas = types.SimpleNamespace(sgemm=_gemm(numpy.float32), dgemm=_gemm(numpy.float64), sgemv=_gemv(numpy.float32),
                                sgemm_strided_batched=_gemm_strided_batched(numpy.float32),
                                dgemm_strided_batched=_gemm_strided_batched(numpy.float64),
                                gemm_half=lambda precision, *arguments: _gemm(numpy.float32, precision)(*arguments),
                                dgemv=_gemv(numpy.float64), current_handle=lambda tf32=False: 0)
cuda = types.SimpleNamespace(Device=_Device, runtime=_Runtime, Event=_Event, get_elapsed_time=_get_elapsed_time,
                             get_current_stream=_get_current_stream, cublas=_cublas, Stream=_Stream, Graph=_Graph,
                             MemoryPool=_MemoryPool, using_allocator=_using_allocator,
                             PinnedMemoryPointer=_PinnedMemoryPointer)


def empty_pinned(shape, dtype=numpy.float64) -> numpy.ndarray:
    """``cupyx.empty_pinned``: a host array over a page-locked buffer (its ``base``)."""
    dtype = numpy.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return numpy.ndarray(shape, dtype, _PinnedMemoryPointer(max(1, int(numpy.prod(shape)) * dtype.itemsize)))
ndarray = DeviceArray
__version__ = f"stand-in (NumPy {numpy.__version__})"

_NUMPY = _Namespace("numpy", numpy)


def __getattr__(name):
    """Every other public name is NumPy's, on device arrays."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_NUMPY, name)
