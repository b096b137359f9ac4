"""oneDNN's primitives as netspec's layers run them: one class per kind of layer, created once per layer and shape.

Each class builds its primitive descriptors through the binding
(:mod:`netspec.engine.onednn`: the library, its constants, the operands that
wrap NumPy arrays and the blocked layouts held between layers) and runs the
passes it was built for.  A layer creates one at setup through
:func:`netspec.engine.onednn.attempt`, so a refusal leaves it on its NumPy
path; :class:`Weighted` runs layers with weights (convolution, inner
product), :class:`Passes` the others.
"""

from __future__ import annotations

import ctypes

import numpy

from netspec.engine.blob import BlobArray
from netspec.engine.onednn import (
    ANY,
    ARG_BIAS,
    ARG_DIFF_BIAS,
    ARG_DIFF_DST,
    ARG_DIFF_SCALE,
    ARG_DIFF_SHIFT,
    ARG_DIFF_SRC,
    ARG_DIFF_WEIGHTS,
    ARG_DST,
    ARG_MEAN,
    ARG_MULTIPLE_SRC,
    ARG_POST_OPS,
    ARG_SCALE,
    ARG_SHIFT,
    ARG_SRC,
    ARG_SRC_1,
    ARG_VARIANCE,
    ARG_WEIGHTS,
    ARG_WORKSPACE,
    BACKWARD,
    BACKWARD_DATA,
    BINARY_ADD,
    BINARY_MUL,
    CHANNEL_BLOCKS_OF_8,
    CONVOLUTION_DIRECT,
    DATA_TYPE_UNDEF,
    ELTWISE_RELU,
    ELTWISE_RELU_USE_DST,
    F32,
    FORWARD_INFERENCE,
    FORWARD_TRAINING,
    LRN_ACROSS_CHANNELS,
    LRN_WITHIN_CHANNEL,
    NORMALIZE_SCALE,
    NORMALIZE_SHIFT,
    PLAIN,
    POOLING_AVG_INCLUDE_PADDING,
    POOLING_MAX,
    QUERY_DIFF_DST,
    QUERY_DIFF_SRC,
    QUERY_DIFF_WEIGHTS,
    QUERY_DST,
    QUERY_SRC,
    QUERY_WEIGHTS,
    QUERY_WORKSPACE,
    REFERENCE_IMPLEMENTATIONS,
    SOFTMAX_ACCURATE,
    SOFTMAX_LOG,
    Array,
    ConstantCopy,
    Dims,
    Handle,
    Library,
    OneDnnError,
    Operand,
    constant,
    refuse_reference,
    scratch,
)


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
        # the input for backward: (memory, its buffer)
        self.saved_input = lib.owned_memory(data) if keeps_input else None

    def forward(self, x: Array, y: Array, channels: dict[int, numpy.ndarray]) -> None:
        """Normalise ``x`` into ``y`` (arrays, or blobs' arrays: :class:`BlobArray`; the batch statistics written
        into ``channels`` unless given there)."""
        if self.saved_input is None:
            self._run(self.forward_primitive, {ARG_SRC: x, **channels}, {ARG_DST: y})
            return
        held = self.operands[ARG_SRC].held(x)
        if held is not None and held.latest != PLAIN:
            self.lib.run(self.copy, {ARG_SRC: held.memory, ARG_DST: self.saved_input[0]})
        else:
            self.lib.point(self.input, x.array() if isinstance(x, BlobArray) else x)
            self.lib.run(self.keep, {ARG_SRC: self.input, ARG_DST: self.saved_input[0]})
        self._run(self.forward_primitive, channels, {ARG_DST: y}, {ARG_SRC: self.saved_input[0]})

    def backward(self, dy: Array, dx: Array, channels: dict[int, numpy.ndarray]) -> None:
        """The input's gradient from the output's (and the scale's and shift's, into ``channels``), after
        :meth:`forward` and with the statistics it used."""
        self._run(self.backward_primitive, {ARG_DIFF_DST: dy, **channels}, {ARG_DIFF_SRC: dx},
                  {ARG_SRC: self.saved_input[0]})


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
            self.lib.point(memory, array, strided=True)
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
    bottom) or ``("accumulate", None)`` the values the output array holds before the pass (that bottom, where the
    sum is written over it): ``y = relu(relu(s_o * (x * w + b) + t_o) + a)`` with every step optional.  Shapes
    and geometry as :class:`Convolution`; the output, and the array added, in ``layout`` where given (the one the
    output's blob is held in), else in the one the primitive computes fastest in."""

    def __init__(self, lib: Library, input_shape, weights_shape, output_shape, group: int, stride, pad, dilation,
                 bias: bool, steps: list[tuple[str, float | None]], layout: Handle | None = None):
        self.lib = lib
        shapes, (x, w, b, y), geometry = convolution_descriptors(lib, input_shape, weights_shape, output_shape, group,
                                                                 stride, pad, dilation, bias)
        operations = [(operation, slope) for step, slope in steps for operation in self.OPERATIONS[step]]
        if layout is None and {("add", None), ("accumulate", None)} & set(operations):  # (a layout the output
            # and the array added share)
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
        self.accumulates = ("accumulate", None) in operations
        for index, (operation, _) in enumerate(operations):
            if operation not in ("relu", "accumulate"):
                arg = self.arguments[operation] = ARG_POST_OPS * (index + 1) | ARG_SRC_1
                self.operands[arg] = (Operand(lib, shapes["y"], self.layout, slot=arg) if operation == "add"
                                      else Operand(lib, (1, weights_shape[0], 1, 1)))

    OPERATIONS = {"affine": ("scale", "shift"), "relu": ("relu",), "add": ("add",),  # each step's post-ops
                  "accumulate": ("accumulate",)}

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
            elif operation == "accumulate":  # (oneDNN's sum post-op: the output's values, in its data type)
                lib.call("dnnl_post_ops_append_sum", post_ops, ctypes.c_float(1), ctypes.c_int32(0), DATA_TYPE_UNDEF)
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
        """The fused output, written into ``y`` (added to what it holds with an ``accumulate`` step); the
        post-ops' arrays by name: ``scale`` and ``shift`` (O,) with an ``affine`` step, ``add`` (the output's
        shape) with an ``add`` step."""
        reads = {ARG_SRC: x, ARG_WEIGHTS: w, ARG_BIAS: b, **{self.arguments[name]: array
                                                              for name, array in inputs.items()}}
        if self.accumulates:  # (its values brought into the memory the primitive writes)
            reads[ARG_DST] = y
        self._run(self.primitive, {arg: array for arg, array in reads.items() if array is not None}, {ARG_DST: y})


class LongShortTermMemory(Passes):
    """Inference of a one-layer LSTM over a whole sequence, left to right (oneDNN's vanilla LSTM, forward):
    input (T, N, I), initial states h_0 and c_0 and final ones (N, H) each, outputs h_t (T, N, H).  The gates
    are stacked in Caffe's order i, f, o, g (the candidate, tanh): the input weights (4H, I), the recurrent ones
    (4H, H) and the bias (4H,), the weights reordered into oneDNN's gate order (i, f, g, o) and the layout the
    primitive computes fastest in at each call, or once for a :func:`constant` matrix (a frozen net's); all
    arrays C-contiguous float32.  Every step continues from the one before: a sequence that restarts within T
    needs another path.  OneDnnError where only oneDNN's reference implementation would run it (CPUs without
    AVX2)."""

    LEFT_TO_RIGHT = 1  # dnnl_unidirectional_left2right
    SRC_ITER, SRC_ITER_C, DST_ITER, DST_ITER_C, WEIGHTS_ITER = 2, 3, 18, 19, 34  # (DNNL_ARG_*)
    # the gates as Caffe stacks them (i, f, o, g) and as oneDNN does (i, f, g, o): (Caffe's first, how many,
    # oneDNN's first), and Caffe's gate at each of oneDNN's places
    GATES = ((0, 2, 0), (3, 1, 2), (2, 1, 3))
    ONEDNN_ORDER = [first + k for first, count, _ in sorted(GATES, key=lambda run: run[2]) for k in range(count)]

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
        # primitive's layout: a reorder of each run of gates from the one into its place in the other
        self.weights, self.constant_copies = {}, {arg: ConstantCopy() for arg in rows}
        for index, (arg, count) in enumerate(rows.items()):
            given = Handle()
            lib.call("dnnl_memory_desc_create_with_strides", ctypes.byref(given), 5, Dims(1, 1, count, 4, hidden),
                     F32, Dims(4 * hidden * count, 4 * hidden * count, 1, hidden * count, count))
            chosen = Handle(lib.dll.dnnl_primitive_desc_query_md(forward, QUERY_WEIGHTS, index))
            parts = []
            for first, gates, target in self.GATES:
                source, place = Handle(), Handle()
                try:
                    lib.call("dnnl_memory_desc_create_submemory", ctypes.byref(source), given,
                             Dims(1, 1, count, gates, hidden), Dims(0, 0, 0, first, 0))
                    lib.call("dnnl_memory_desc_create_submemory", ctypes.byref(place), chosen,
                             Dims(1, 1, count, gates, hidden), Dims(0, 0, 0, target, 0))
                except OneDnnError as exc:
                    raise OneDnnError(f"oneDNN's LSTM ({lib.implementation(forward)}) keeps its weights in a layout "
                                      f"whose gates cannot be reordered one by one ({exc})") from None
                parts.append((lib.memory(source), lib.memory(place), lib.reorder(source, place)))
            self.weights[arg] = parts, lib.memory(chosen), lib.dll.dnnl_memory_desc_get_size(chosen)

    def forward(self, x: numpy.ndarray, w_x: numpy.ndarray, w_h: numpy.ndarray, b: numpy.ndarray,
                h_0: numpy.ndarray, c_0: numpy.ndarray, y: numpy.ndarray, h_t: numpy.ndarray,
                c_t: numpy.ndarray) -> None:
        """Every step from ``h_0`` and ``c_0``: the outputs written into ``y``, the final states into ``h_t``
        and ``c_t``."""
        ready = {arg: self._weights(arg, matrix) for arg, matrix in ((ARG_WEIGHTS, w_x), (self.WEIGHTS_ITER, w_h))}
        b = b.reshape(4, -1)[self.ONEDNN_ORDER]  # (the bias, 4H values, in oneDNN's gate order)
        reads = {ARG_SRC: x, ARG_BIAS: b, self.SRC_ITER: h_0, self.SRC_ITER_C: c_0}
        self._run(self.primitive, reads, {ARG_DST: y, self.DST_ITER: h_t, self.DST_ITER_C: c_t}, ready)

    def _weights(self, arg: int, matrix: numpy.ndarray) -> Handle:
        """The memory holding ``matrix`` (Caffe's gate order) in oneDNN's gate order and the primitive's layout:
        reordered into the argument's scratch buffer, or for a :func:`constant` matrix into a buffer of its own
        at the first call for it (:class:`ConstantCopy`)."""
        parts, chosen, nbytes = self.weights[arg]
        if constant(matrix):
            buffer, fresh = self.constant_copies[arg].buffer_for(matrix, nbytes)
        else:
            buffer, fresh = scratch(arg, nbytes), True
        for source, place, reorder in parts if fresh else ():
            self.lib.point(source, matrix)
            self.lib.point(place, buffer)
            self.lib.run(reorder, {ARG_SRC: source, ARG_DST: place})
        self.lib.point(chosen, buffer)
        return chosen
