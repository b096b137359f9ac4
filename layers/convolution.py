"""Convolution: 2-D cross-correlation by im2col and one matrix product per group (depthwise: directly, offset by
offset), or by oneDNN on the CPU; and Im2col, the columns themselves as a layer."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from netspec.engine import blas, cudnn_conv, half, kernels, onednn, primitives
from netspec.engine.fillers import FillerParams
from netspec.engine.layer import Layer, weighted_flops
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.spatial import hw, pad_hw, require_4d, window
from netspec.spec.schema import doc, required


@dataclass
class ConvolutionParams:
    """Parameters of Convolution (Caffe's ConvolutionParameter, 2-D)."""

    num_output: int = required(doc="number of output channels")
    bias_term: bool = doc(True, "add a learned bias per output channel")
    kernel_size: list[int] = doc([], "kernel size: one value, or (height, width)")
    pad: list[int] = doc([], "zero padding: one value, or (height, width); default 0")
    stride: list[int] = doc([], "stride: one value, or (height, width); default 1")
    dilation: list[int] = doc([], "dilation: one value, or (height, width); default 1")
    kernel_h: int | None = doc(None, "kernel height (with kernel_w, instead of kernel_size)")
    kernel_w: int | None = doc(None, "kernel width")
    pad_h: int | None = doc(None, "padding height (with pad_w)")
    pad_w: int | None = doc(None, "padding width")
    stride_h: int | None = doc(None, "stride height (with stride_w)")
    stride_w: int | None = doc(None, "stride width")
    dilation_h: int | None = doc(None, "dilation height (with dilation_w)")
    dilation_w: int | None = doc(None, "dilation width")
    group: int = doc(1, "split channels into this many independent groups")
    weight_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "weight init"})
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "bias init"})


BATCH_INNER_MAX_WIDTH = 16
BATCH_OUTER = (1, 0, 2, 3)  # the column layout (C, kh, kw, N, H', W'), the GPU kernels'
COLUMN_BYTES = 256 * 2 ** 20  # the most memory one part of the batch's columns takes (one sample at least)


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a convolution's shapes, computed once from params and the bottom shape.

    ``far_pad`` is the zero padding past the input's far edge: ``pad``, or
    more where the last window overhangs the padded input (Caffe's truncated
    output size; see :func:`conv_geometry`).
    """

    kernel: tuple[int, int]
    pad: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    out: tuple[int, int]
    order: tuple[int, int, int, int]
    far_pad: tuple[int, int]

    @property
    def inverse(self) -> tuple[int, int, int, int]:
        """The axis order that turns an array in ``order`` back into (N, C, H, W)."""
        return tuple(self.order.index(axis) for axis in range(4))

    def arranged(self, n: int, c: int, h: int, w: int) -> tuple[int, int, int, int]:
        """The shape of an (n, c, h, w) array in ``order``."""
        return tuple((n, c, h, w)[axis] for axis in self.order)

    def is_pointwise(self) -> bool:
        """True for a 1x1 kernel with stride 1 and no padding (im2col is then a transpose)."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)


def spatial_params(params: ConvolutionParams, prefix: str = "convolution_param"):
    """``(kernel, pad, stride, dilation)`` as (height, width) pairs, each checked against its least value."""
    kernel = hw(params, "kernel_size", prefix)
    pad = hw(params, "pad", prefix, 0)
    stride = hw(params, "stride", prefix, 1)
    dilation = hw(params, "dilation", prefix, 1)
    for name, pair, low in (("kernel_size", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1),
                            ("pad", pad, 0)):
        if min(pair) < low:
            raise ParamError(f"{prefix}.{name}", f"must be at least {low}, got {pair}")
    return kernel, pad, stride, dilation


def check_channels(params: ConvolutionParams, channels: int) -> None:
    """num_output positive, and group dividing it and the input's ``channels`` (Convolution's, Deconvolution's)."""
    if params.num_output is None or params.num_output <= 0:
        raise ParamError("convolution_param.num_output", "must be a positive integer")
    if params.group <= 0 or channels % params.group or params.num_output % params.group:
        raise ShapeError(f"group {params.group} must divide both the input channels ({channels}) and "
                         f"num_output ({params.num_output})", "convolution_param.group")


def truncated_division(a: int, b: int) -> int:
    """``a / b`` as C++ divides ints (b positive): the quotient rounded toward zero, not down."""
    return a // b if a >= 0 else -(-a // b)


def conv_geometry(params: ConvolutionParams, shape: tuple, prefix: str = "convolution_param") -> ConvGeometry:
    """Validate the spatial params against a (N, C, H, W) bottom and compute the output size.

    The size is Caffe's ``(H + 2*pad - extent) / stride + 1`` with C++'s
    division, which rounds toward zero: a dilated kernel ``extent`` wide that
    overhangs the padded input by less than a stride still gives one output,
    its taps past the input reading 0 (``far_pad``), as Caffe's im2col does.
    A size below 1 is a ShapeError.
    """
    kernel, pad, stride, dilation = spatial_params(params, prefix)
    out, far_pad = [], []
    for size, k, p, s, d in zip(shape[2:], kernel, pad, stride, dilation):
        extent = d * (k - 1) + 1
        out.append(truncated_division(size + 2 * p - extent, s) + 1)
        far_pad.append(max(p, (out[-1] - 1) * s + extent - size - p))
    if min(out) < 1:
        raise ShapeError(f"the output would be {out[0]}x{out[1]}: (input + 2*pad - dilated kernel) / stride + 1, "
                         f"rounded toward zero as Caffe does, for bottom shape {tuple(shape)} with kernel {kernel}, "
                         f"pad {pad}, stride {stride}, dilation {dilation}", f"{prefix}.kernel_size")
    # Column layout: im2col copies runs as long as the innermost axis of the columns.  With the
    # batch outermost (C, N, H, W) those runs are output rows; with the batch innermost (C, H, W, N)
    # they are rows times the batch, but moving the batch to the inside costs a slow transpose of
    # the input and output.  Narrow outputs gain from the batch inside, wide ones do not.
    order = (1, 2, 3, 0) if out[1] <= BATCH_INNER_MAX_WIDTH else BATCH_OUTER
    return ConvGeometry(kernel, pad, stride, dilation, tuple(out), order, tuple(far_pad))


def for_device(geo: ConvGeometry, xp) -> ConvGeometry:
    """``geo`` with the column layout the device's :func:`im2col` writes fastest: on a GPU the batch outermost,
    the layout of its single kernels (:mod:`netspec.engine.kernels`)."""
    return dataclasses.replace(geo, order=BATCH_OUTER) if kernels.compiled(xp) else geo


def _window(padded, i: int, j: int, geo: ConvGeometry):
    """The view of a padded input (in ``geo.order``) seen by kernel offset (i, j)."""
    (oh, ow), (sh, sw), (dh, dw) = geo.out, geo.stride, geo.dilation
    return window(padded, (geo.order.index(2), i * dh, sh, oh), (geo.order.index(3), j * dw, sw, ow))


def _padded_shape(shape, geo: ConvGeometry) -> tuple[int, ...]:
    n, c, h, w = shape
    return geo.arranged(n, c, h + geo.pad[0] + geo.far_pad[0], w + geo.pad[1] + geo.far_pad[1])


def _interior(padded, shape, geo: ConvGeometry):
    return window(padded, (geo.order.index(2), geo.pad[0], 1, shape[2]), (geo.order.index(3), geo.pad[1], 1, shape[3]))


def column_shape(shape, geo: ConvGeometry) -> tuple[int, ...]:
    """The shape of :func:`im2col`'s columns of an array of ``shape`` (N, C, H, W)."""
    return (shape[1], *geo.kernel, *geo.arranged(shape[0], 1, *geo.out)[1:])


def batch_parts(shape, geo: ConvGeometry, itemsize: int) -> tuple[list[slice], int]:
    """The parts of a batch of ``shape`` whose columns im2col makes one at a time, each within COLUMN_BYTES (one
    sample at least), and how many values the largest part's columns hold."""
    n = shape[0]
    per_sample = math.prod(column_shape((1, *shape[1:]), geo))
    size = max(1, min(n, COLUMN_BYTES // (per_sample * itemsize)))
    return [slice(start, min(start + size, n)) for start in range(0, n, size)], per_sample * size


def im2col(xp, x, geo: ConvGeometry, out=None):
    """Columns (C, kh, kw, *rest): every input value each kernel offset sees; in ``out`` (contiguous, as many
    values) when given.

    ``rest`` is (N, out_h, out_w), or (out_h, out_w, N) when ``geo.order``
    puts the batch innermost; see :func:`conv_geometry`.  On a GPU with the
    batch outermost, one kernel.
    """
    shape = column_shape(x.shape, geo)
    cols = xp.empty(shape, dtype=x.dtype) if out is None else out.reshape(shape)
    if kernels.compiled(xp) and geo.order == BATCH_OUTER:
        kernels.im2col(xp.ascontiguousarray(x), geo.kernel, geo.pad, geo.stride, geo.dilation, geo.out, cols)
        return cols
    if geo.is_pointwise():
        cols.reshape(_padded_shape(x.shape, geo))[...] = x.transpose(geo.order)
        return cols
    allocate = xp.zeros if any(geo.far_pad) else xp.empty
    padded = allocate(_padded_shape(x.shape, geo), dtype=x.dtype)
    _interior(padded, x.shape, geo)[...] = x.transpose(geo.order)
    for i in range(geo.kernel[0]):
        for j in range(geo.kernel[1]):
            cols[:, i, j] = _window(padded, i, j, geo)
    return cols


def col2im(xp, cols, x_shape, geo: ConvGeometry, out=None):
    """The adjoint of :func:`im2col`: sums column gradients back into an (N, C, H, W) array (``out`` when given).
    On a GPU with the batch outermost, one kernel."""
    if kernels.compiled(xp) and geo.order == BATCH_OUTER:
        dx = xp.empty(x_shape, dtype=cols.dtype) if out is None else out
        kernels.col2im(xp.ascontiguousarray(cols), geo.kernel, geo.pad, geo.stride, geo.dilation, geo.out, dx)
        return dx
    if geo.is_pointwise():
        dx = cols.reshape(_padded_shape(x_shape, geo)).transpose(geo.inverse)
    else:
        padded = xp.zeros(_padded_shape(x_shape, geo), dtype=cols.dtype)
        for i in range(geo.kernel[0]):
            for j in range(geo.kernel[1]):
                _window(padded, i, j, geo)[...] += cols[:, i, j]
        dx = _interior(padded, x_shape, geo).transpose(geo.inverse)
    if out is None:
        return dx
    out[...] = dx
    return out


def _taps(geo: ConvGeometry):
    """Each kernel offset (i, j) and the spans (:func:`window`'s) of the padded input it sees, along axes 2 and 3."""
    (oh, ow), (sh, sw), (dh, dw) = geo.out, geo.stride, geo.dilation
    for i in range(geo.kernel[0]):
        for j in range(geo.kernel[1]):
            yield i, j, ((2, i * dh, sh, oh), (3, j * dw, sw, ow))


def _sample(xp, x, k: int, geo: ConvGeometry):
    """Sample ``k`` of an (N, C, H, W) array as (C, 1, H, W), zero padded."""
    (ph, pw), (fh, fw), (c, h, w) = geo.pad, geo.far_pad, x.shape[1:]
    return pad_hw(xp, x[k].reshape(c, 1, h, w), ph, fh, pw, fw)


def depthwise(xp, x, weights, bias, geo: ConvGeometry, out) -> None:
    """A depthwise convolution (one group an input channel: weights (C*m, 1, kh, kw)) written into ``out``: each
    kernel offset's view of the padded input times that offset's weights, summed.  One sample at a time, so its
    arrays stay in the processor's cache: several times faster than im2col's one-row products per channel."""
    c = x.shape[1]
    w = weights.reshape(c, -1, *geo.kernel)
    for k in range(x.shape[0]):
        padded = _sample(xp, x, k, geo)
        y = out[k].reshape(w.shape[:2] + geo.out)
        y[...] = 0 if bias is None else bias.reshape(*w.shape[:2], 1, 1)
        for i, j, spans in _taps(geo):
            y += window(padded, *spans) * w[:, :, i, j, None, None]


def depthwise_backward(xp, x, weights, dy, geo: ConvGeometry, dx=None, weights_diff=None) -> None:
    """The gradients of :func:`depthwise`: the input's written into ``dx``, the weights' added to ``weights_diff``
    (None: not wanted)."""
    c, h, w = x.shape[1:]
    kernel = weights.reshape(c, -1, *geo.kernel)
    dw = None if weights_diff is None else weights_diff.reshape(kernel.shape)
    (ph, pw) = geo.pad
    for k in range(x.shape[0]):
        padded = _sample(xp, x, k, geo)
        grad = None if dx is None else xp.zeros_like(padded)
        g = dy[k].reshape(kernel.shape[:2] + geo.out)
        for i, j, spans in _taps(geo):
            if dw is not None:
                dw[:, :, i, j] += (g * window(padded, *spans)).sum(axis=(2, 3))  # (a reduction: capturable)
            if grad is not None:  # (each input channel gets the sum over its m outputs)
                share = g * kernel[:, :, i, j, None, None]
                window(grad, *spans)[...] += share.sum(axis=1, keepdims=True) if share.shape[1] > 1 else share
        if dx is not None:
            dx[k] = grad[:, 0, ph:ph + h, pw:pw + w]


@register_layer
class Convolution(Layer):
    """Convolution: learned 2-D filters (cross-correlation, as in Caffe).

    ``y[n, o] = b[o] + sum_{c, i, j} W[o, c, i, j] * x_pad[n, g(o)*C/G + c, s*h + d*i, s*w + d*j]``

    Bottom: (N, C, H, W).  Top: (N, num_output, H', W') with
    ``H' = (H + 2*pad - (dilation*(kernel-1) + 1)) / stride + 1``, the
    division rounded toward zero as in Caffe (a kernel overhanging the padded
    input by less than a stride gives one output, reading 0 past the input).
    Learnable: weights (num_output, C/group, kh, kw), bias (num_output,) if
    ``bias_term``.  Fillers default to constant 0, as in Caffe: set
    ``weight_filler``.  Not in place.  On the CPU in float32 the passes run
    as oneDNN primitives when the library is there (``NETSPEC_ONEDNN=0``
    turns them off); otherwise, and for a geometry oneDNN refuses, by im2col,
    or, for a depthwise convolution (``group`` equal to the input channels,
    MobileNet's), directly, kernel offset by offset.  im2col runs in parts of
    the batch whose columns fit 256 MiB, in a workspace every layer of the net
    shares, and makes them again for the backward pass rather than keep them;
    on a GPU it is one CUDA kernel each way.

    Example::

        - name: conv1
          type: Convolution
          bottom: data
          top: conv1
          convolution_param:
            num_output: 20
            kernel_size: 5
            weight_filler: {type: xavier}
    """

    type = "Convolution"
    takes_held = True
    fast_records = True
    param_blocks = {"convolution_param": ConvolutionParams}

    @property
    def params(self) -> ConvolutionParams:
        """The convolution_param block."""
        return self.block("convolution_param")

    def geometry(self, shape) -> ConvGeometry:
        """Validated geometry for a bottom shape."""
        require_4d(shape, self.type)
        check_channels(self.params, shape[1])
        return conv_geometry(self.params, shape)

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        return [(shape[0], self.params.num_output, *self.geometry(shape).out)]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        return weighted_flops(top_shapes[0], param_shapes)

    def param_shapes(self, bottom_shapes):
        p = self.params
        geo = self.geometry(bottom_shapes[0])
        shapes = [(p.num_output, bottom_shapes[0][1] // p.group, *geo.kernel)]
        return shapes + [(p.num_output,)] if p.bias_term else shapes

    def param_fillers(self):
        return [self.params.weight_filler, self.params.bias_filler][:len(self.param_shapes_cache)]

    absorbed = ()  # (layer, bottoms, tops) of each layer a net runs fused into this one (:meth:`absorb`)
    FUSES = ("BatchNorm", "Scale", "ReLU", "Eltwise", "ReLU")  # the layers it can absorb, in that order
    fuses_backward = False  # (training fuses a ReLU's forward pass alone; an inference net makes no backward pass)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.geo = for_device(self.geometry(bottom[0].shape), self.xp)
        self.shapes = bottom[0].shape, top[0].shape
        self.bottom_blob, self.top_blob = bottom[0], top[0]
        self.folded = onednn.FromConstants()  # (the weights and bias oneDNN takes, where it :attr:`folds`)
        self.fast = self._onednn(*self.shapes)
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)
        self.depthwise = 1 < self.params.group == bottom[0].shape[1]
        self.parts, count = batch_parts(bottom[0].shape, self.geo, self.xp.dtype(self.dtype).itemsize)
        self.cudnn = self._cudnn(*self.shapes)
        self._cudnn_views = None  # (see cudnn_buffers)
        if self.cudnn is not None:
            self._size_cudnn_buffers()  # (the shared workspace made at setup, at its largest)
        elif self.fast is None and not self.depthwise:
            self.backend.workspace(count, self.dtype)

    def _cudnn(self, bottom_shape, top_shape) -> cudnn_conv.Convolution | None:
        """cuDNN's graphs for this geometry, on CuPy where cuDNN runs, or None (im2col and cuBLAS run it; where
        cuDNN refused the geometry, ``cudnn_refused`` says why, for the paths line).  The forward graph adds the
        bias (or the shift of an absorbed BatchNorm and Scale) and applies an absorbed ReLU where cuDNN can fuse
        them (else they run after it, and ``cudnn_unfused`` says why)."""
        self.cudnn_refused = self.cudnn_unfused = None
        if not cudnn_conv.runs_on(self.xp):
            return None
        geo = self.geo
        relu = next((layer.block("relu_param").negative_slope for layer, _, _ in self.absorbed if layer.type == "ReLU"),
                    None)
        bias = self.params.bias_term or self._affine()
        tries = ([{"bias": bias, "relu": relu}] if relu is not None else []) + ([{"bias": True}] if bias else []) + [{}]
        try:
            for asked in tries:
                try:
                    return cudnn_conv.graphs_for(
                        self.xp, bottom_shape, self.blobs[0].shape, top_shape, geo.pad, geo.far_pad, geo.stride,
                        geo.dilation, self.dtype, self.backend.deterministic, self.backend.precision,
                        ("fprop",) if self.inference else cudnn_conv.PASSES, **asked)
                except cudnn_conv.GraphRefused as exc:
                    if not asked:
                        raise
                    self.cudnn_unfused = str(exc)
        except cudnn_conv.GraphRefused as exc:
            self.cudnn_refused = str(exc)
        return None

    def _fused_relu(self) -> bool:
        """Whether cuDNN's forward graph applies the absorbed ReLU."""
        return self.cudnn is not None and self.cudnn.fused["relu"] is not None

    def _size_cudnn_buffers(self) -> None:
        """Make the buffers :meth:`cudnn_buffers` gives as large as this layer needs, at setup (a CUDA graph's
        capture may not grow them): where the graphs take 16-bit floats, the backend's 16-bit scratch large enough
        for every pass's operands too."""
        if self.cudnn.half:
            x, w, y = (math.prod(shape) for shape in (self.shapes[0], self.blobs[0].shape, self.shapes[1]))
            self.backend.half_scratch(x, w, self.blobs[0].shape[0], y)  # (the forward pass's operands)
            self.backend.half_scratch(x, y, w, w, x)  # (the backward pass's: x, dy and w, then both gradients)
        self.backend.workspace(self._cudnn_bytes(), self.xp.uint8)

    def _cudnn_bytes(self) -> int:
        """The bytes of the shared workspace this layer's cuDNN passes take: cuDNN's own workspace, then, unless
        the graphs take 16-bit floats, the weights' gradient as cuDNN writes it."""
        return self.cudnn.workspace_bytes + (0 if self.cudnn.half else self.blobs[0].data.nbytes)

    def cudnn_buffers(self):
        """cuDNN's workspace and the weights' gradient as cuDNN writes it (before it is added to the diff), in the
        workspace the net's layers share; the views made once for each workspace (on a GPU each is a call of the
        host's), at the first pass (a view made at setup would keep a workspace another layer then outgrows).
        Where the graphs take 16-bit floats the gradient goes through the backend's 16-bit scratch instead (None
        here)."""
        start = self.cudnn.workspace_bytes
        shared = self.backend.workspace(self._cudnn_bytes(), self.xp.uint8)
        if self.cudnn.half:
            return shared, None
        if self._cudnn_views is None or self._cudnn_views[0] is not shared:
            self._cudnn_views = (shared, shared[:start], shared[start:].view(self.dtype).reshape(self.blobs[0].shape))
        return self._cudnn_views[1:]

    def _cudnn_run(self, *passes: tuple[str, list, object, bool]) -> None:
        """cuDNN's ``passes``, each ``(name, inputs, out, add)``: the pass ``name`` on ``inputs`` (float arrays),
        written into ``out``, or added to it with ``add`` (cuDNN writes its result: it goes through scratch memory
        first).  Where the graphs read and write 16-bit floats (precision bf16-mixed or fp16-mixed), the inputs go
        in rounded to them, an array the passes share rounded once, and each result is widened into its ``out``."""
        workspace, scratch = self.cudnn_buffers()
        if self.cudnn.half:
            inputs = list({id(array): array for _, arrays, _, _ in passes for array in arrays}.values())
            bits = self.backend.half_scratch(*(array.size for array in inputs), *(out.size for _, _, out, _ in passes))
            rounded = {id(array): narrowed.reshape(array.shape) for array, narrowed in zip(inputs, bits)}
            for array in inputs:
                half.narrow(self.xp, array, rounded[id(array)], self.cudnn.half)
            for (name, arrays, out, add), result in zip(passes, bits[len(inputs):]):
                self.cudnn.run(name, [rounded[id(array)] for array in arrays] + [result.reshape(out.shape)],
                               workspace)
                half.widen(self.xp, result, out, self.cudnn.half, add)
            return
        for name, arrays, out, add in passes:
            if add:
                result = scratch.reshape(out.shape)
                self.cudnn.run(name, [*arrays, result], workspace)
                out += result
            else:
                self.cudnn.run(name, [*arrays, out], workspace)

    @property
    def output(self):
        """The blob the pass writes last: the top, or the top of an absorbed Eltwise."""
        return self.absorbed[-1][2][0] if self.absorbed else self.top_blob

    def _onednn(self, bottom_shape, top_shape) -> primitives.Convolution | None:
        """oneDNN's primitives for this geometry, or None when they cannot run it (the im2col path does)."""
        geo, p = self.geo, self.params
        geometry = (bottom_shape, self.blobs[0].shape, top_shape, p.group, geo.stride, geo.pad, geo.dilation,
                    p.bias_term)
        if not self.absorbed:
            return onednn.attempt_in(self, onednn.layout_of(self.bottom_blob.values),
                                     lambda lib, layout: primitives.Convolution(lib, *geometry, layout=layout))
        # the sum written over the shortcut (the memory plan gave it the shortcut's data): the product added to
        # what the output holds, with the BatchNorm and Scale folded into the weights (oneDNN's jit kernels take
        # that sum only as the first of the steps after the product)
        accumulate = self._shortcut() is not None and self.output.shares_data(self._shortcut())
        steps = [("affine", None)] if self._affine() and not accumulate else []
        steps += [("relu", layer.block("relu_param").negative_slope) if layer.type == "ReLU"
                  else ("accumulate" if accumulate else "add", None)
                  for layer, _, _ in self.absorbed if layer.type in ("ReLU", "Eltwise")]
        geometry = (*geometry[:-1], p.bias_term or (self._affine() and accumulate))
        return onednn.attempt_in(self, onednn.layout_of(self.output.values), lambda lib, layout: (
            primitives.FusedConvolution(lib, *geometry, steps=steps, layout=layout)))  # (the output's, held)

    def _affine(self) -> bool:
        """Whether a BatchNorm or Scale is absorbed (folded into a scale and shift per channel)."""
        return bool(self.absorbed) and self.absorbed[0][0].type in ("BatchNorm", "Scale")

    def _accumulates(self) -> bool:
        """Whether oneDNN's primitive adds the product to what the output holds (the shortcut's values)."""
        return getattr(self.fast, "accumulates", False)

    @property
    def folds(self) -> bool:
        """Whether oneDNN's primitive takes the weights and bias with the absorbed BatchNorm and Scale folded in
        (:meth:`folded_weights_and_bias`, once in a frozen net): where it adds the product to the output's values
        (the sum written over the shortcut)."""
        return self._affine() and self._accumulates()

    @property
    def records(self) -> bool:
        # (the BatchNorm and Scale absorbed, and the weights they are folded into, are folded with NumPy at each
        # pass: the same only from constants; the shortcut is copied into the output where a new array given to
        # either parted them)
        folded = self._folded_blobs() if self.folds else self._folded_blobs()[len(self.blobs):]
        return (super().records and all(onednn.constant(blob.values.stored()) for blob in folded)
                and not (self._accumulates() and not self.output.shares_data(self._shortcut())))

    def absorb(self, following):
        """In a net that trains, on cuDNN, a ReLU in place on the top, where cuDNN's forward graph can apply it:
        its forward pass only (the net runs its backward pass, which reads the top as in place).

        In an inference net, the layers that follow, each optional, in this order: a BatchNorm (stored
        statistics), a Scale (one factor a channel) and a ReLU in place on the top; then, where oneDNN runs this
        layer and holds its top in a blocked layout (so nothing else reads it), an Eltwise SUM of the top and one
        other blob (coefficients 1), and a ReLU in place on that (a residual block's end).  The sum is written
        into a blob of its own, or, where the memory plan gave it the other blob's data (netspec.graph.memory.
        sum_aliases), over that blob, the product then added to it where it stands (not after a ReLU: oneDNN's
        fast kernels take that sum only first).  BatchNorm and Scale are folded into a scale and shift per
        channel of the output, or into the weights and bias where the product is added over the other blob
        (from their parameters at each pass, so weights loaded later count; once in a frozen net).  On oneDNN
        all of them run in its primitive (none when it refuses them); on NumPy and CuPy the weights and bias are
        scaled and shifted before the product, and the others run after it (on cuDNN the ReLU in its forward graph
        where it can)."""
        if not self.inference:
            return self._absorb_relu(following[0])
        taken, position = [], -1
        for layer, bottom, tops in following:
            position = next((i for i in range(position + 1, len(self.FUSES)) if self.FUSES[i] == layer.type), None)
            output = taken[-1][2][0] if taken else self.top_blob
            if position is None or not self._fuses(layer, bottom, tops, output, [layer for layer, _, _ in taken]):
                break
            taken.append((layer, bottom, tops))
        types = [layer.type for layer, _, _ in taken]
        tries = [taken, taken[:types.index("Eltwise")]] if "Eltwise" in types else [taken]  # (oneDNN may refuse)
        previous = self.fast
        for candidate in tries:
            self.absorbed = tuple(candidate)
            if previous is None or not candidate:  # (NumPy and CuPy need no primitive; cuDNN a graph)
                self._rebuild_cudnn()
                return len(candidate)
            self.fast = self._onednn(*self.shapes)
            if self.fast is not None:
                return len(candidate)
        self.absorbed, self.fast = (), previous
        return 0

    def _absorb_relu(self, following) -> int:
        """1 where ``following`` (a layer, its bottoms and tops) is a ReLU in place on the top that cuDNN's forward
        graph applies, else 0 (nothing absorbed).  Not with a negative slope: its backward pass reads a copy of
        its input that its forward pass keeps."""
        layer, bottom, tops = following
        if (self.cudnn is None or layer.type != "ReLU" or not bottom == tops == [self.top_blob]
                or layer.block("relu_param").negative_slope < 0):
            return 0
        self.absorbed = (following,)
        self._rebuild_cudnn()
        if self._fused_relu():
            return 1
        unfused, self.absorbed = self.cudnn_unfused, ()
        self._rebuild_cudnn()
        self.cudnn_unfused = self.cudnn_unfused or unfused  # (why the ReLU runs on its own, for the paths line)
        return 0

    def _rebuild_cudnn(self) -> None:
        """cuDNN's graphs again, for what is absorbed now (where cuDNN runs this layer)."""
        if self.cudnn is not None:
            self.cudnn = self._cudnn(*self.shapes)
            self._cudnn_views = None
            if self.cudnn is not None:
                self._size_cudnn_buffers()

    def _fuses(self, layer, bottom, tops, output, before: list) -> bool:
        """Whether ``layer`` (with its ``bottom`` and ``tops``) can follow the layers absorbed so far (``before``),
        the last of which writes ``output``."""
        if layer.type != "Eltwise":
            return (bottom == tops == [output] and (layer.type != "Scale" or layer.per_channel())
                    and (layer.type != "BatchNorm" or layer.global_stats))
        others = [blob for blob in bottom if blob is not output]
        # (the sum is written as the product is: into memory of its own, or over the other bottom, whose data
        # the memory plan gave it: the product is then added to that bottom where it stands)
        return (self.fast is not None and onednn.layout_of(output.values) is not None
                and layer.block("eltwise_param").operation == "SUM" and len(bottom) == 2 and len(others) == 1
                and layer.coefficients(2) == [1.0, 1.0] and tops[0] not in bottom
                and not onednn.may_overlap(tops[0].values, self.bottom_blob.values)
                and (not onednn.may_overlap(tops[0].values, others[0].values)
                     or tops[0].shares_data(others[0]) and not any(done.type == "ReLU" for done in before)))

    def _folded_blobs(self) -> list:
        """The blobs the folded weights and bias come from: this layer's, then the absorbed BatchNorm's and
        Scale's."""
        return [*self.blobs, *(blob for layer, _, _ in self.absorbed if layer.type in ("BatchNorm", "Scale")
                               for blob in layer.blobs)]

    def _shortcut(self):
        """The bottom of the absorbed Eltwise the convolution's product is added to (None without one)."""
        return next((blob for layer, bottom, _ in self.absorbed if layer.type == "Eltwise" for blob in bottom
                     if blob is not self.top_blob), None)

    def output_scale_and_shift(self):
        """The per-channel ``(scale, shift)`` of the absorbed BatchNorm and Scale (their folded parameters)."""
        xp, channels = self.xp, self.blobs[0].shape[0]
        scale, shift = xp.ones(channels, self.dtype), xp.zeros(channels, self.dtype)
        for layer, _, _ in self.absorbed:
            if layer.type == "BatchNorm":
                mean, var = layer.stored_statistics()
                scale = 1 / xp.sqrt(var + layer.block("batch_norm_param").eps)
                shift = -mean * scale
            elif layer.type == "Scale":
                gamma = layer.blobs[0].data
                scale, shift = gamma * scale, gamma * shift + (layer.blobs[1].data if len(layer.blobs) > 1 else 0)
        return scale.astype(self.dtype), shift.astype(self.dtype)

    def folded_weights_and_bias(self):
        """The weights and bias (None without bias_term or anything absorbed) that compute the convolution and the
        absorbed BatchNorm and Scale in one product."""
        weights = self.blobs[0].data
        bias = self.blobs[1].data if self.params.bias_term else None
        if not self._affine():
            return weights, bias
        scale, shift = self.output_scale_and_shift()
        return weights * scale.reshape(-1, 1, 1, 1), shift if bias is None else bias * scale + shift

    def grouped_weights(self):
        """Weights as (G, O/G, C/G*kh*kw)."""
        g = self.params.group
        weights = self.blobs[0].data
        return weights.reshape(g, weights.shape[0] // g, -1)

    def forward(self, bottom, top):
        if self.fast is not None:
            weights, bias = self.blobs[0].data, self.blobs[1].data if self.params.bias_term else None
            inputs = {}
            if self.folds:
                sources = [blob.values.stored() for blob in self._folded_blobs()]
                weights, bias = self.folded.get(sources, self.folded_weights_and_bias)
            elif self._affine():
                inputs["scale"], inputs["shift"] = self.output_scale_and_shift()
            shortcut = self._shortcut()
            if shortcut is not None and not self._accumulates():
                inputs["add"] = shortcut.values
            elif shortcut is not None and not self.output.shares_data(shortcut):  # (a new array given to either
                self.output.data[...] = shortcut.data  # since the net was built: the values the product is added to)
            self.fast.forward(bottom[0].values, weights, bias, self.output.values, **inputs)
            return
        weights, bias = self.folded_weights_and_bias()
        if self.cudnn is not None:
            y, fused_bias = top[0].data, self.cudnn.fused["bias"]
            self._cudnn_run(("fprop", [bottom[0].data, weights] + ([bias.reshape(1, -1, 1, 1)] if fused_bias else []),
                             y, False))
            if bias is not None and not fused_bias:
                y += bias.reshape(1, -1, 1, 1)
        elif self.depthwise:
            depthwise(self.xp, bottom[0].data, weights, bias, self.geo, top[0].data)
        else:
            xp, g, x, y = self.xp, self.params.group, bottom[0].data, top[0].data
            o = y.shape[1]
            grouped = weights.reshape(g, o // g, -1)
            for part in self.parts:
                cols = self.columns(x[part])
                matrices = cols.reshape(g, -1, math.prod(cols.shape[3:]))
                out = xp.empty((g, o // g, matrices.shape[2]), dtype=y.dtype)
                for group in range(g):
                    blas.product(self.backend, grouped[group], matrices[group], out[group])
                out = out.reshape(o, -1)
                if kernels.compiled(xp):  # (the bias added as the product moves, in one kernel)
                    kernels.channels_first(out.reshape(o, *cols.shape[3:]), bias, y[part])
                    continue
                if bias is not None:
                    out += bias.reshape(o, 1)
                y[part] = out.reshape(o, *cols.shape[3:]).transpose(self.geo.inverse)
        for layer, layer_bottom, layer_top in self.absorbed:
            if layer.type not in ("BatchNorm", "Scale") and not (layer.type == "ReLU" and self._fused_relu()):
                layer.forward(layer_bottom, layer_top)  # (BatchNorm and Scale folded into the weights)

    def backward(self, top, propagate_down, bottom):
        if self.fast is not None:
            bias = self.blobs[1] if self.params.bias_term else None
            self.fast.backward(bottom[0].values, top[0].gradient, bottom[0].gradient if propagate_down[0] else None,
                               self.blobs[0], bias, self.param_propagate_down)
            return
        xp, g = self.xp, self.params.group
        dy = top[0].diff
        bias_diff = self.params.bias_term and self.param_propagate_down[1]
        if self.cudnn is not None:
            if bias_diff:
                self.blobs[1].diff += dy.sum(axis=(0, 2, 3))
            passes = []  # (dy rounded once for both where they take 16-bit floats)
            if self.param_propagate_down[0]:
                passes.append(("wgrad", [bottom[0].data, dy], self.blobs[0].diff, True))
            if propagate_down[0]:
                passes.append(("dgrad", [dy, self.blobs[0].data], bottom[0].diff, False))
            self._cudnn_run(*passes)
            return
        if self.depthwise:
            if bias_diff:
                self.blobs[1].diff += dy.sum(axis=(0, 2, 3))
            depthwise_backward(xp, bottom[0].data, self.blobs[0].data, dy, self.geo,
                               bottom[0].diff if propagate_down[0] else None,
                               self.blobs[0].diff if self.param_propagate_down[0] else None)
            return
        o, x = dy.shape[1], bottom[0].data
        for part in self.parts:
            dy_cols = xp.ascontiguousarray(dy[part].transpose(self.geo.order)).reshape(g, o // g, -1)
            if bias_diff:  # (the sum of each channel's contiguous row)
                rows = dy_cols.reshape(o, -1)
                ones = self.backend.ones(rows.shape[1], self.dtype)
                blas.sums(self.backend, rows, ones, self.blobs[1].diff, 1, add=True)
            if self.param_propagate_down[0]:  # (group by group: a product of 2-D arrays, one transposed, runs
                cols = self.columns(x[part]).reshape(g, -1, dy_cols.shape[2])  # several times faster on a GPU)
                grad = self.blobs[0].diff.reshape(g, o // g, -1)
                for group in range(g):
                    blas.product(self.backend, dy_cols[group], cols[group], grad[group], transpose_b=True, add=True)
            if propagate_down[0]:  # (the columns' gradient where the columns were)
                dcols = self.workspace_for(x[part].shape)
                grouped, matrices = self.grouped_weights(), dcols.reshape(g, -1, dy_cols.shape[2])
                for group in range(g):
                    blas.product(self.backend, grouped[group], dy_cols[group], matrices[group], transpose_a=True)
                col2im(xp, dcols.reshape(column_shape(x[part].shape, self.geo)), x[part].shape, self.geo,
                       out=bottom[0].diff[part])

    def columns(self, x):
        """:func:`im2col` of ``x`` (a part of the batch) into the workspace the net's layers share."""
        return im2col(self.xp, x, self.geo, out=self.workspace_for(x.shape))

    def workspace_for(self, shape):
        """The shared workspace's first values, as many as the columns of a part of the batch of ``shape``."""
        return self.backend.workspace(math.prod(column_shape(shape, self.geo)), self.dtype)


@dataclass
class Im2colParams(ConvolutionParams):
    """Parameters of Im2col: Convolution's geometry (its num_output, group and fillers are not used)."""

    num_output: int | None = doc(None, "not used")


@register_layer
class Im2col(Layer):
    """Im2col: every window a convolution with ``convolution_param``'s geometry would see, as channels (Caffe's).

    ``y[n, (c*kh + i)*kw + j, h, w] = x_pad[n, c, s*h + d*i, s*w + d*j]``

    Bottom: (N, C, H, W).  Top: (N, C*kh*kw, H', W') with H' as Convolution's.  The gradient sums
    each window's back into place.  Not in place.

    Example::

        - {name: cols, type: Im2col, bottom: data, top: cols, convolution_param: {kernel_size: 3, pad: 1}}
    """

    type = "Im2col"
    param_blocks = {"convolution_param": Im2colParams}
    learnable = False

    def geometry(self, shape) -> ConvGeometry:
        """Validated geometry for a bottom shape."""
        require_4d(shape, self.type)
        return conv_geometry(self.block("convolution_param"), shape)

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        geo = self.geometry(shape)
        return [(shape[0], shape[1] * geo.kernel[0] * geo.kernel[1], *geo.out)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.geo = self.geometry(bottom[0].shape)

    def columns_to_top(self) -> tuple[int, int, int, int]:
        """The axis order taking im2col's columns (C*kh*kw, *rest), ``rest`` being N, H', W' in the geometry's
        order, to the top's (N, C*kh*kw, H', W')."""
        rest = [axis for axis in self.geo.order if axis != 1]
        return 1 + rest.index(0), 0, 1 + rest.index(2), 1 + rest.index(3)

    def forward(self, bottom, top):
        cols = im2col(self.xp, bottom[0].data, self.geo)
        top[0].data[...] = cols.reshape(-1, *cols.shape[3:]).transpose(self.columns_to_top())

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            order = self.columns_to_top()
            rows = top[0].diff.transpose(tuple(order.index(axis) for axis in range(4)))
            cols = self.xp.ascontiguousarray(rows).reshape(bottom[0].shape[1], *self.geo.kernel, *rows.shape[1:])
            bottom[0].diff[...] = col2im(self.xp, cols, bottom[0].shape, self.geo)
