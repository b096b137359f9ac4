"""Pooling: MAX or AVE over 2-D windows, with Caffe's ceil rounding and padding rules (by oneDNN on the CPU), or
over PyTorch's adaptive windows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from netspec.engine import blas, kernels, onednn, primitives
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.selection import add_rows
from netspec.layers.spatial import hw, pad_hw, require_4d, window
from netspec.spec.schema import doc


@dataclass
class PoolingParams:
    """Parameters of Pooling (Caffe's PoolingParameter, 2-D)."""

    pool: Literal["MAX", "AVE"] = doc("MAX", "MAX or AVE")
    kernel_size: list[int] = doc([], "window size: one value, or (height, width)")
    stride: list[int] = doc([], "stride: one value, or (height, width); default 1")
    pad: list[int] = doc([], "padding: one value, or (height, width); default 0")
    kernel_h: int | None = doc(None, "window height (with kernel_w)")
    kernel_w: int | None = doc(None, "window width")
    stride_h: int | None = doc(None, "stride height (with stride_w)")
    stride_w: int | None = doc(None, "stride width")
    pad_h: int | None = doc(None, "padding height (with pad_w)")
    pad_w: int | None = doc(None, "padding width")
    global_pooling: bool = doc(False, "pool over the whole spatial extent")
    round_mode: Literal["CEIL", "FLOOR"] = doc("CEIL", "how the output size is rounded (Caffe: CEIL)")
    count_include_pad: bool = doc(True, "AVE: the padding counts in a window's divisor (Caffe's and PyTorch's "
                                        "rule); false: only the input positions it covers (ONNX's default)")
    output_size: list[int] = doc([], "adaptive pooling (PyTorch's) to this output size: one value, or (height, "
                                     "width); instead of kernel_size, stride and pad")
    output_h: int | None = doc(None, "adaptive output height (with output_w)")
    output_w: int | None = doc(None, "adaptive output width")


@dataclass(frozen=True)
class PoolGeometry:
    """Kernel, stride, padding, output size and the padding needed past the input's far edge; or, for adaptive
    pooling whose windows differ in size, ``bins``: along each axis, every output's window (start, end), with
    ``kernel`` the largest (stride and padding then unused)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]
    far_pad: tuple[int, int]
    bins: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] | None = None


ADAPTIVE_KEYS = ("output_size", "output_h", "output_w")
WINDOW_KEYS = ("global_pooling", "kernel_size", "kernel_h", "kernel_w", "stride", "stride_h", "stride_w", "pad",
               "pad_h", "pad_w")


def adaptive_bins(size: int, out: int) -> tuple[tuple[int, int], ...]:
    """PyTorch's adaptive windows along one axis: output i pools ``floor(i*size/out)`` to ``ceil((i+1)*size/out)``."""
    return tuple((i * size // out, -(-(i + 1) * size // out)) for i in range(out))


def adaptive_geometry(p: PoolingParams, shape) -> PoolGeometry:
    """The geometry of adaptive pooling; when the output size divides the input's, an ordinary pooling (windows and
    strides of input/output, which is what its windows are then)."""
    key = "pooling_param"
    for name in WINDOW_KEYS:
        if getattr(p, name) not in (None, [], False):
            raise ParamError(f"{key}.{name}", f"give output_size (adaptive pooling) or {name}, not both")
    out = hw(p, "output_size", key)
    if min(out) < 1:
        raise ParamError(f"{key}.output_size", f"must be positive, got {out}")
    sizes = tuple(shape[2:])
    if all(size % n == 0 for size, n in zip(sizes, out)):
        kernel = tuple(size // n for size, n in zip(sizes, out))
        return PoolGeometry(kernel, kernel, (0, 0), out, (0, 0))
    bins = tuple(adaptive_bins(size, n) for size, n in zip(sizes, out))
    kernel = tuple(max(end - start for start, end in axis) for axis in bins)
    return PoolGeometry(kernel, (1, 1), (0, 0), out, (0, 0), bins)


def pool_geometry(p: PoolingParams, shape) -> PoolGeometry:
    """Output size by Caffe's rule: rounded up, and the last window must start inside the padded input (or, with
    ``output_size``, :func:`adaptive_geometry`)."""
    key = "pooling_param"
    if any(getattr(p, name) not in (None, []) for name in ADAPTIVE_KEYS):
        return adaptive_geometry(p, shape)
    if p.global_pooling:
        if p.kernel_size or p.kernel_h is not None:
            raise ParamError(f"{key}.global_pooling", "give global_pooling or kernel_size, not both")
        kernel, stride, pad = tuple(shape[2:]), (1, 1), (0, 0)
    else:
        kernel = hw(p, "kernel_size", key)
        stride, pad = hw(p, "stride", key, 1), hw(p, "pad", key, 0)
    if min(kernel) < 1 or min(stride) < 1 or min(pad) < 0:
        raise ParamError(key, f"kernel and stride must be positive and pad non-negative, got kernel {kernel}, "
                              f"stride {stride}, pad {pad}")
    if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
        raise ParamError(f"{key}.pad", f"pad {pad} must be smaller than the kernel {kernel}")
    out, far = [], []
    for size, k, s, q in zip(shape[2:], kernel, stride, pad):
        if size + 2 * q < k:
            raise ShapeError(f"the {k}-wide window does not fit the padded input ({size} + 2*{q}); "
                             f"bottom shape {tuple(shape)}", f"{key}.kernel_size")
        rounding = math.ceil if p.round_mode == "CEIL" else math.floor
        n = rounding((size + 2 * q - k) / s) + 1
        if any(pad) and (n - 1) * s >= size + q:  # (Caffe: on both axes as soon as either is padded)
            n -= 1
        out.append(n)
        far.append(max(0, (n - 1) * s + k - size - q))
    return PoolGeometry(kernel, stride, pad, tuple(out), tuple(far))


@register_layer
class Pooling(Layer):
    """Pooling: the maximum (MAX) or mean (AVE) of each window, per channel.

    Bottom: (N, C, H, W).  Top: (N, C, H', W') with Caffe's rounding
    ``H' = ceil((H + 2*pad - kernel) / stride) + 1``, minus one when the last
    window would start in the padding or past the input, on each axis as soon
    as either is padded, as in Caffe (``round_mode: FLOOR`` rounds down
    instead).  MAX never picks a padded position; its gradient goes to the
    first maximum of each window.  AVE divides by the window clipped to the
    padded input, so padding counts but the overhang of a ceil-rounded last
    window does not (``count_include_pad: false``: by the input positions the
    window covers, ONNX's rule).  ``global_pooling`` pools all of H x W.

    Adaptive pooling (PyTorch's ``AdaptiveAvgPool2d``/``AdaptiveMaxPool2d``):
    ``output_size`` (or ``output_h``/``output_w``) instead of the window
    gives the top's H' x W'; output ``i`` pools rows ``floor(i*H/H')`` to
    ``ceil((i+1)*H/H') - 1`` (likewise columns), so windows may differ in
    size and overlap, and H' may exceed H.  Where H' divides H and W'
    divides W, that is an ordinary pooling (windows and strides H/H', W/W').

    Not in place.  On the CPU in float32 oneDNN's primitives run it, with
    the same results (``NETSPEC_ONEDNN=0``: NumPy), but for adaptive
    windows of different sizes (NumPy); on a GPU one CUDA kernel a pass.

    Example::

        - name: pool1
          type: Pooling
          bottom: conv1
          top: pool1
          pooling_param: {pool: MAX, kernel_size: 2, stride: 2}
        - {name: pool2, type: Pooling, bottom: conv5, top: pool2, pooling_param: {pool: AVE, output_size: 7}}
    """

    type = "Pooling"
    takes_held = True
    fast_records = True
    param_blocks = {"pooling_param": PoolingParams}

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        kernel = pool_geometry(self.block("pooling_param"), bottom_shapes[0]).kernel
        return math.prod(top_shapes[0]) * kernel[0] * kernel[1]

    def top_shapes(self, bottom_shapes):
        shape = bottom_shapes[0]
        require_4d(shape, self.type)
        return [(*shape[:2], *pool_geometry(self.block("pooling_param"), shape).out)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.geo = pool_geometry(self.block("pooling_param"), bottom[0].shape)
        maximum = self.block("pooling_param").pool == "MAX"
        if self.geo.bins is not None:  # adaptive windows of different sizes: NumPy runs them
            self.fast = None
            # each axis's windows' starts and ends, on the device once (not copied there at each pass)
            self.bin_edges = [tuple(self.xp.asarray(part) for part in zip(*bins)) for bins in self.geo.bins]
            if not maximum:
                self.averages = [self.averaging(bins) for bins in self.geo.bins]
            return
        self.rescale = None
        if not maximum:
            self.divisor = self.xp.asarray(self.window_sizes(bottom[0].shape), dtype=self.dtype)
            if kernels.compiled(self.xp):  # (the CUDA kernels divide by Caffe's window sizes)
                self.rescale = self._rescale(self.window_sizes(bottom[0].shape, include_pad=True))
        if maximum and kernels.compiled(self.xp):
            self.mask = self.xp.empty(top[0].shape, dtype=self.xp.int32)  # each window's choice, as Caffe keeps it
        self.fast = self._onednn(bottom[0].shape, top[0].shape, maximum, onednn.layout_of(bottom[0].values))
        if self.fast is not None and self.rescale is None:  # (a rescaled top is written plain anyway)
            onednn.hold_outputs(self.fast, top)

    def _onednn(self, bottom_shape, top_shape, maximum: bool, layout) -> primitives.Pooling | None:
        """oneDNN's primitives for this geometry (taking the bottom in ``layout``, where it is held in one), or
        None when they cannot run it (NumPy does).

        oneDNN's averages divide by the whole window; ``rescale`` turns them into this layer's where some window's
        divisor differs (None where none does).
        """
        geo = self.geo
        fast = onednn.attempt_in(self, layout, lambda lib, layout: primitives.Pooling(
            lib, bottom_shape, top_shape, geo.kernel, geo.stride, geo.pad, geo.far_pad, maximum, layout))
        if fast is not None and not maximum:
            self.rescale = self._rescale(geo.kernel[0] * geo.kernel[1])
        return fast

    def _rescale(self, divided_by):
        """The factors that turn averages divided by ``divided_by`` into this layer's (None where they agree)."""
        if not bool((self.divisor != divided_by).any()):
            return None
        return (divided_by / self.divisor).astype(self.dtype)

    def window_sizes(self, shape, include_pad: bool | None = None):
        """(H', W') count of positions each AVE window covers inside the padded input (with ``count_include_pad``
        false, or ``include_pad`` false: inside the input)."""
        if include_pad is None:
            include_pad = self.block("pooling_param").count_include_pad
        counts = []
        for size, k, s, q, n in zip(shape[2:], self.geo.kernel, self.geo.stride, self.geo.pad, self.geo.out):
            starts = [o * s - q for o in range(n)]
            counts.append([min(start + k, size + q) - start if include_pad else min(start + k, size) - max(start, 0)
                           for start in starts])
        return self.xp.outer(self.xp.asarray(counts[0]), self.xp.asarray(counts[1]))

    def padded(self, x, value):
        """``x`` padded by ``pad`` before and by ``pad`` or the ceil overhang after."""
        (ph, pw), (fh, fw) = self.geo.pad, self.geo.far_pad
        return pad_hw(self.xp, x, ph, fh, pw, fw, value)

    @property
    def records(self) -> bool:
        return super().records and self.rescale is None  # (a rescale is NumPy's)

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast.forward(bottom[0].values, top[0].values)
            if self.rescale is not None:
                top[0].data[...] *= self.rescale
            return
        geo = self.geo
        maximum = self.block("pooling_param").pool == "MAX"
        if kernels.compiled(self.xp) and geo.bins is None:
            x = bottom[0].data
            if maximum:
                kernels.max_pool(x, geo, top[0].data, self.mask)
            else:
                kernels.ave_pool(x, geo, top[0].data)
                if self.rescale is not None:
                    top[0].data[...] *= self.rescale
        elif geo.bins is not None and maximum:
            rows, self.column_choice = self.max_along(self.adaptive_windows(bottom[0].data, 3), geo.kernel[1])
            top[0].data[...], self.row_choice = self.max_along(self.adaptive_windows(rows, 2), geo.kernel[0])
        elif geo.bins is not None:
            heights, widths = self.averages
            blas.separable(self.backend, heights, bottom[0].data, widths.T, top[0].data)
        elif maximum:
            # A 2-D window's maximum is the row-wise maximum of column-wise maxima, and taking the
            # first maximum in each pass gives Caffe's first maximum in row-major scan order.
            padded = self.padded(bottom[0].data, -self.xp.inf)
            rows, self.column_choice = self.max_along(self.windows(padded, 3), geo.kernel[1])
            top[0].data[...], self.row_choice = self.max_along(self.windows(rows, 2), geo.kernel[0])
        else:
            padded = self.padded(bottom[0].data, 0.0)
            rows = self.sum_along(padded, 3, geo.kernel[1], geo.stride[1], geo.out[1])
            top[0].data[...] = self.sum_along(rows, 2, geo.kernel[0], geo.stride[0], geo.out[0])
            top[0].data[...] /= self.divisor

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.fast is not None:
            dy = top[0].gradient if self.rescale is None else top[0].diff * self.rescale
            self.fast.backward(dy, bottom[0].gradient)
            return
        geo = self.geo
        if geo.bins is not None:
            self.adaptive_backward(top[0].diff, bottom[0].diff)
            return
        if kernels.compiled(self.xp):
            dy = top[0].diff
            if self.block("pooling_param").pool == "MAX":
                kernels.max_pool_backward(dy, self.mask, geo, bottom[0].diff)
            else:
                kernels.ave_pool_backward(dy if self.rescale is None else dy * self.rescale, geo, bottom[0].diff)
            return
        n, c, h, w = bottom[0].shape
        padded_h, padded_w = h + geo.pad[0] + geo.far_pad[0], w + geo.pad[1] + geo.far_pad[1]
        if self.block("pooling_param").pool == "MAX":
            rows = self.scatter_along(top[0].diff, 2, geo.kernel[0], geo.stride[0], padded_h, self.row_choice)
            grad = self.scatter_along(rows, 3, geo.kernel[1], geo.stride[1], padded_w, self.column_choice)
        else:
            rows = self.scatter_along(top[0].diff / self.divisor, 2, geo.kernel[0], geo.stride[0], padded_h)
            grad = self.scatter_along(rows, 3, geo.kernel[1], geo.stride[1], padded_w)
        bottom[0].diff[...] = grad[:, :, geo.pad[0]:geo.pad[0] + h, geo.pad[1]:geo.pad[1] + w]

    def windows(self, x, axis: int):
        """A function of an offset: the values every window along ``axis`` (2 or 3) sees there (views of ``x``)."""
        index = axis - 2
        return lambda offset: window(x, (axis, offset, self.geo.stride[index], self.geo.out[index]))

    def adaptive_windows(self, x, axis: int):
        """:meth:`windows` for adaptive windows (copies); past its end a window sees its last value again."""
        starts, ends = self.bin_edges[axis - 2]
        return lambda offset: x.take(self.xp.minimum(starts + offset, ends - 1), axis=axis)

    def averaging(self, bins):
        """Adaptive AVE along one axis as a matrix (outputs, inputs): each row averages one output's window."""
        matrix = self.xp.zeros((len(bins), bins[-1][1]), dtype=self.dtype)
        for row, (start, end) in enumerate(bins):
            matrix[row, start:end] = 1 / (end - start)
        return matrix

    def adaptive_backward(self, dy, dx) -> None:
        """The input's gradient for adaptive windows, written into ``dx``: AVE through :meth:`averaging`'s
        matrices, MAX to the first maximum :meth:`forward` chose in each window."""
        xp = self.xp
        if self.block("pooling_param").pool == "AVE":
            heights, widths = self.averages
            blas.separable(self.backend, heights.T, dy, widths, dx)
            return
        n, c, h, w = dx.shape
        (row_starts, _), (column_starts, _) = self.bin_edges
        rows = row_starts[:, None] + self.row_choice
        columns = column_starts + xp.take_along_axis(self.column_choice, rows, 2)
        flat = (xp.arange(n * c).reshape(n, c, 1, 1) * h + rows) * w + columns
        dx[...] = 0
        add_rows(self, dx.reshape(-1), flat.ravel(), dy.ravel())  # (windows overlap: an input chosen twice gets both)

    def max_along(self, seen, kernel: int):
        """Maximum over 1-D windows, ``seen(offset)`` giving what each window sees at an offset, and the offset of
        each window's first maximum."""
        xp = self.xp
        out = seen(0).copy()
        choice = xp.zeros(out.shape, dtype=xp.int8 if kernel < 128 else xp.int32)
        better = xp.empty(out.shape, dtype=bool)
        step = xp.empty_like(choice)
        for offset in range(1, kernel):
            view = seen(offset)
            xp.greater(view, out, out=better)
            # choice = offset where better, kept elsewhere; arithmetic, since a masked copy
            # with an unpredictable mask is several times slower on CPUs
            xp.subtract(offset, choice, out=step)
            step *= better
            choice += step
            xp.maximum(out, view, out=out)
        return out, choice

    def sum_along(self, x, axis: int, kernel: int, stride: int, size: int):
        """Sum over 1-D windows along ``axis``."""
        out = window(x, (axis, 0, stride, size)).copy()
        for offset in range(1, kernel):
            out += window(x, (axis, offset, stride, size))
        return out

    def scatter_along(self, dy, axis: int, kernel: int, stride: int, extent: int, choice=None):
        """Spread ``dy`` back over the ``extent`` input positions of its windows along ``axis``.

        With ``choice`` each window's gradient goes to its chosen offset only; without, to every offset.
        """
        xp = self.xp
        shape = list(dy.shape)
        shape[axis] = extent
        grad = xp.zeros(shape, dtype=self.dtype)
        share = dy
        if choice is not None:
            share, chosen = xp.empty_like(dy), xp.empty(dy.shape, dtype=bool)
        for offset in range(kernel):
            if choice is not None:
                xp.equal(choice, offset, out=chosen)
                xp.multiply(dy, chosen, out=share)
            window(grad, (axis, offset, stride, dy.shape[axis]))[...] += share
        return grad
