"""cuDNN's convolutions on a GPU, through NVIDIA's cuDNN frontend (the ``cudnn`` module of
``nvidia-cudnn-frontend``, in the ``gpu`` extra; its wheel loads the ``libcudnn`` of ``nvidia-cudnn-cu13``).

A Convolution layer on CuPy builds, at setup, one cuDNN graph for each pass
it runs (:class:`Convolution`: the forward product, the input's gradient and
the weights' gradient), with cuDNN's heuristics choosing the engine, and runs
each pass as one call.  Every tensor is described as the layer holds it
(NCHW, packed): cuDNN's frontend would otherwise lay outputs out NHWC.
Caffe's padding is symmetric, but its output size truncates toward zero,
so a kernel overhanging the padded input by less than a stride gives an
output: the graphs pad past the far edge by the geometry's ``far_pad``.
cuDNN writes its outputs (alpha 1, beta 0), so the weights' gradient goes
through a scratch array and is then added to the diff, as Caffe accumulates
it.  Float32 runs on engines that compute in float32, unless ``tf32`` lets
it take TF32's tensor cores, or ``bf16-mixed`` and ``fp16-mixed`` have its
graphs read and write bfloat16 or float16 (the layer rounds and widens:
:mod:`netspec.engine.half`),
and ``deterministic`` keeps only the engines cuDNN marks deterministic.

Where the frontend or ``libcudnn`` is missing, or ``NETSPEC_CUDNN=0``,
:func:`unavailable` says why, once, on the ``paths:`` line, and every layer
runs its im2col and cuBLAS path; a geometry no engine supports leaves that
layer on it too, named with cuDNN's reason.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict

import numpy

from netspec.engine import half, kernels
from netspec.errors import DeviceError, first_line

ENVIRONMENT = "NETSPEC_CUDNN"  # "0": cuDNN off
ALIGNMENT = 256  # bytes: where the weights' scratch gradient starts after cuDNN's workspace
PASSES = ("fprop", "dgrad", "wgrad")  # the forward product, the input's gradient, the weights' gradient
# each pass's operands (x: the input, w: the weights, y: the output), its two inputs then what it writes
OPERANDS = {"fprop": ("x", "w", "y"), "dgrad": ("y", "w", "x"), "wgrad": ("x", "y", "w")}


@functools.cache
def _frontend():
    """``(the cudnn module, cuDNN's version)``, or ``(None, why it cannot run)``."""
    if os.environ.get(ENVIRONMENT) == "0":
        return None, f"off ({ENVIRONMENT}=0)"
    try:
        import cudnn
    except Exception as exc:  # noqa: BLE001 - (its import loads libraries: ImportError, OSError, or theirs)
        return None, f"the cuDNN frontend cannot be imported ({first_line(exc)}; pip install -e '.[gpu]')"
    try:
        version = cudnn.backend_version()  # (loads libcudnn)
    except (RuntimeError, OSError) as exc:
        return None, f"libcudnn cannot be loaded ({first_line(exc)})"
    frontend = getattr(cudnn, "__version__", "of unknown version")
    return cudnn, f"cuDNN {version // 10000}.{version // 100 % 100}.{version % 100} (frontend {frontend})"


def unavailable() -> str | None:
    """Why cuDNN does not run here (None: it does)."""
    module, what = _frontend()
    return None if module is not None else what


def runs_on(xp) -> bool:
    """Whether convolutions on the array module ``xp`` run on cuDNN: on CuPy, where cuDNN runs."""
    return kernels.compiled(xp) and unavailable() is None


def version() -> str:
    """cuDNN's version and its frontend's, as the ``paths:`` line names them."""
    return _frontend()[1]


_handles: dict[tuple[int, int], list] = {}  # (device, thread) -> [handle, the stream it is bound to]


def _handle(xp) -> int:
    """cuDNN's handle of this thread on the current device, bound to the current stream."""
    cudnn = _frontend()[0]
    key = (xp.cuda.Device().id, threading.get_ident())
    held = _handles.get(key)
    if held is None:
        held = _handles[key] = [cudnn.create_handle(), None]
    stream = xp.cuda.get_current_stream().ptr
    if held[1] != stream:
        cudnn.set_stream(handle=held[0], stream=stream)
        held[1] = stream
    return held[0]


def _packed(shape) -> list[int]:
    """The strides, in elements, of a C-contiguous array of ``shape``."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return strides


def graphs_for(xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, dtype, deterministic: bool = False,
               precision: str = "fp32", passes=PASSES, bias: bool = False, relu: float | None = None) -> Convolution:
    """The :class:`Convolution` of these arguments on the current device and thread, built once (nets with many
    convolutions of one geometry, and nets built again, share it); GraphRefused again where it was refused."""
    precision = precision if numpy.dtype(dtype) == numpy.float32 else "fp32"  # (it changes float32 alone)
    key = (xp.cuda.Device().id, threading.get_ident(), tuple(x_shape), tuple(w_shape), tuple(y_shape), tuple(pad),
           tuple(far_pad), tuple(stride), tuple(dilation), numpy.dtype(dtype), deterministic, precision,
           tuple(passes), bias, relu)
    if key in _built:
        _built.move_to_end(key)
    else:
        try:
            _built[key] = Convolution(xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, dtype,
                                      deterministic, precision, passes, bias, relu)
        except GraphRefused as exc:
            _built[key] = str(exc)  # (the reason alone: an exception kept would keep its callers' frames alive)
        if len(_built) > KEPT_GRAPHS:  # (the least recently asked for: layers holding it keep it alive)
            _built.popitem(last=False)
    built = _built[key]
    if isinstance(built, str):
        raise GraphRefused(built)
    return built


KEPT_GRAPHS = 256  # the geometries graphs_for keeps built (a process asked for many input sizes keeps the latest)
_built: OrderedDict[tuple, Convolution | str] = OrderedDict()  # (see graphs_for; a refusal's reason where refused)
WORKSPACE_LIMIT = 256 * 2 ** 20  # the most scratch memory an engine may ask for (some FFT engines ask for far more)


class Convolution:
    """The cuDNN graphs of one convolution (``x_shape`` NCHW, ``w_shape`` (K, C/group, kh, kw), the group count
    following from the two), for the ``passes`` asked (:data:`PASSES`), built at once: GraphRefused if cuDNN has
    no engine for one (its reason).  With ``bias`` the forward graph adds a bias per output channel to the
    product, and with ``relu`` (a negative slope, 0 for ReLU itself) it then applies Caffe's ReLU, all in one
    call (:attr:`fused`).  Under ``precision`` bf16-mixed or fp16-mixed a float32 convolution's graphs read and
    write bfloat16 or float16 (:attr:`half`: the precision, the arrays they take then being the bits,
    :mod:`netspec.engine.half`), summing in float32; under tf32 float32 ones may take TF32's tensor cores."""

    def __init__(self, xp, x_shape, w_shape, y_shape, pad, far_pad, stride, dilation, dtype,
                 deterministic: bool = False, precision: str = "fp32", passes=PASSES, bias: bool = False,
                 relu: float | None = None):
        cudnn = _frontend()[0]
        self.xp, self.dtype = xp, numpy.dtype(dtype)
        types = {numpy.dtype(numpy.float32): cudnn.data_type.FLOAT, numpy.dtype(numpy.float64): cudnn.data_type.DOUBLE,
                 numpy.dtype(numpy.float16): cudnn.data_type.HALF}
        if self.dtype not in types:
            raise GraphRefused(f"cuDNN takes float16, float32 or float64 arrays, not {self.dtype}")
        self.half = precision if precision in half.PRECISIONS and self.dtype == numpy.float32 else None
        io = {None: types[self.dtype], "bf16-mixed": cudnn.data_type.BFLOAT16,
              "fp16-mixed": cudnn.data_type.HALF}[self.half]
        self.io_dtype = numpy.dtype(numpy.uint16) if self.half else self.dtype  # (what run takes)
        compute = cudnn.data_type.DOUBLE if io == cudnn.data_type.DOUBLE else cudnn.data_type.FLOAT
        self.shapes = {"x": tuple(x_shape), "w": tuple(w_shape), "y": tuple(y_shape), "b": (1, w_shape[0], 1, 1)}
        self.fused = {"bias": bias, "relu": relu}  # (what the forward graph does after the product)
        geometry = {"pre_padding": list(pad), "post_padding": list(far_pad), "stride": list(stride),
                    "dilation": list(dilation), "compute_data_type": compute}
        self.graphs = {}
        name = "setup"  # (what failed, in a refusal: the handle, or a pass)
        try:
            handle = _handle(xp)
            sm_version = int(xp.cuda.Device().compute_capability)  # (given: the frontend would ask the CUDA runtime)
            for name in passes:
                self.graphs[name] = self._build(cudnn, handle, sm_version, name, io, compute, geometry,
                                                deterministic, precision == "tf32")
        except (cudnn.cudnnGraphNotSupportedError, RuntimeError, ValueError) as exc:
            raise GraphRefused(f"{name}: {first_line(exc)}") from None
        largest = max(graph.get_workspace_size() for graph, _ in self.graphs.values())
        self.workspace_bytes = -(-largest // ALIGNMENT) * ALIGNMENT  # (the weights' scratch gradient after it)

    def _build(self, cudnn, handle, sm_version: int, name: str, io, compute, geometry, deterministic: bool,
               tf32: bool):
        """One pass's graph, built, and its tensors in the order the pass takes its arrays (two in, one out)."""
        graph = cudnn.pygraph(name=name, io_data_type=io, intermediate_data_type=compute, compute_data_type=compute,
                              handle=handle, sm_version=sm_version)
        *inputs, output = OPERANDS[name]
        a, b = (self._tensor(graph, name, key, io) for key in inputs)
        tensors = [a, b]
        if name == "fprop":
            out = graph.conv_fprop(image=a, weight=b, name=name, **geometry)
            if self.fused["bias"]:
                tensors.append(self._tensor(graph, name, "b", io))
                out = graph.bias(input=out, bias=tensors[-1], name="bias")
            if self.fused["relu"] is not None:
                out = graph.relu(input=out, negative_slope=self.fused["relu"] or None, name="relu")
        elif name == "dgrad":
            out = graph.conv_dgrad(loss=a, filter=b, name=name, **geometry)
        else:
            out = graph.conv_wgrad(image=a, loss=b, name=name, **geometry)
        shape = self.shapes[output]
        out.set_output(True).set_dim(list(shape)).set_stride(_packed(shape)).set_data_type(io)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        notes = cudnn.numerical_note
        left_out = [notes.NONDETERMINISTIC] if deterministic else []
        if io == cudnn.data_type.FLOAT and not tf32:  # (float32 as such: tensor cores take TF32's 10-bit inputs)
            left_out += [notes.TENSOR_CORE, notes.DOWN_CONVERT_INPUTS]
        if self.half:  # (16-bit inputs, their products summed in float32)
            left_out += [notes.REDUCED_PRECISION_REDUCTION]
        if left_out:
            graph.deselect_numeric_notes(left_out)
        graph.deselect_workspace_greater_than(WORKSPACE_LIMIT)
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
        return graph, (*tensors, out)

    def _tensor(self, graph, name: str, key: str, io):
        """The graph's tensor of operand ``key`` (x, w, y or b), packed as the layer holds it."""
        shape = self.shapes[key]
        return graph.tensor(name=f"{name}_{key}", dim=list(shape), stride=_packed(shape), data_type=io)

    def run(self, name: str, arrays, workspace) -> None:
        """Pass ``name`` on the current stream, on ``arrays``, its inputs then its output: fprop ``y =
        conv(x, w)`` (``[x, w, y]``; ``[x, w, b, y]`` with the bias fused, ``b`` of shape (1, K, 1, 1), then the
        ReLU where fused), dgrad ``dx = conv^T(dy, w)`` (``[dy, w, dx]``), wgrad ``dw = x (*) dy`` (``[x, dy,
        dw]``); ``workspace`` (uint8, at least :attr:`workspace_bytes`) for cuDNN's scratch.  Every array
        C-contiguous, of the graph's shape and dtype."""
        graph, tensors = self.graphs[name]
        if len(arrays) != len(tensors):
            raise ValueError(f"cuDNN {name}: {len(tensors)} arrays were expected, got {len(arrays)}")
        for array, tensor in zip(arrays, tensors):
            if tuple(array.shape) != tuple(tensor.get_dim()) or array.dtype != self.io_dtype \
                    or not array.flags.c_contiguous:
                raise ValueError(f"cuDNN {name}: a C-contiguous {self.io_dtype} array of shape "
                                 f"{tuple(tensor.get_dim())} was expected, got {array.dtype} {tuple(array.shape)}")
        try:
            graph.execute({tensor: array.data.ptr for tensor, array in zip(tensors, arrays)},
                          workspace.data.ptr, handle=_handle(self.xp))
        except (RuntimeError, ValueError) as exc:
            raise DeviceError(f"cuDNN's {name} failed: {first_line(exc)}") from None


class GraphRefused(Exception):  # noqa: N818 - a refusal, not an error: the layer falls back
    """cuDNN cannot run a convolution (its reason): the layer runs im2col and cuBLAS instead."""
