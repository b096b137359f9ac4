"""The GPU's own CUDA kernels: one launch each where generic array code would launch many small ones.

On a GPU the time of a small net goes to launches: im2col as array code copies
one view per kernel offset (25 launches for a 5x5 kernel), MAX pooling
compares window offset by offset, and a Gaussian draw hashes, shifts and
transforms in a dozen steps.  Each function here does the same work in one
CUDA kernel, compiled by CuPy on first use and cached by it (in memory, and on
disk under ``CUPY_CACHE_DIR``); the kernels are made once per process.

Layers call these only where :func:`compiled` says the array module runs CUDA
(CuPy); NumPy and the GPU stand-in run the layers' generic code, which the
kernels must match: the device check compares them (the layer checks on the
GPU against the same naive references).  Every kernel writes each output
element from one thread, without atomics, so results do not depend on
scheduling.  Index arithmetic is 32-bit (``index_t``), which GPUs divide
several times faster than 64-bit numbers, wherever every array a launch
touches has fewer than 2**31 values; 64-bit past that, so no array is too
large.  Arrays a kernel indexes itself (``raw``) go in as they are, indexed
by the position of an element in C order: CuPy 14 addresses a C-contiguous
array of any number of axes at that offset directly (another through its
strides), so none is reshaped flat first, a call of the host's each.
"""

from __future__ import annotations

import functools
import math
import re

import numpy


def compiled(xp) -> bool:
    """Whether the array module ``xp`` runs these kernels: CuPy (not NumPy, not the GPU stand-in)."""
    return getattr(xp, "__name__", "") == "cupy"


def _elementwise(name: str, params: str, outputs: str, body: str, preamble: str = "", arrays=()):
    """The kernel ``name`` (made once), its index arithmetic as wide as the largest of ``arrays`` needs."""
    wide = any(array.size >= 2 ** 31 for array in arrays)
    return _kernel(name + ("_wide" if wide else ""), params, outputs, body,
                   f"typedef {'long long' if wide else 'int'} index_t;\n{preamble}")


@functools.cache
def _kernel(name: str, params: str, outputs: str, body: str, preamble: str):
    import cupy  # (only reached where compiled() said CuPy)
    return cupy.ElementwiseKernel(params, outputs, body, f"netspec_{name}", preamble=preamble)


# SplitMix64's finaliser with the constants of netspec.engine.backend.MIX: the same bits on the host and here
_MIX = """
__device__ unsigned long long netspec_mix(unsigned long long z) {
    z *= 0x9E3779B97F4A7C15ULL; z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL; z ^= z >> 27;
    z *= 0x94D049BB133111EBULL; return z ^ (z >> 31);
}
"""


def offset_argument(offset):
    """A draw's offset as the kernels and array code take it: a number, as uint64; or, in a captured CUDA graph,
    the device value (0-d uint64) each launch finds it in (:mod:`netspec.engine.capture`), as it is."""
    return numpy.uint64(offset) if isinstance(offset, int) else offset


def uniform(out, offset: int, kept: int) -> None:
    """Fill ``out`` (contiguous) with :meth:`netspec.engine.backend.Backend.random`'s values of one draw: element
    ``i`` is the top ``kept`` bits of the mix of ``i + offset`` (modulo 2**64) where ``kept`` is 53, else of
    32-bit word ``i`` (the low half of the mix of ``i / 2 + offset`` for an even ``i``, the high half for an odd
    one), times 2**-kept."""
    body = """
        const unsigned long long hash = netspec_mix(((unsigned long long)i >> halves) + offset);
        const unsigned long long bits = halves ? ((i & 1) ? hash >> 32 : hash & 0xFFFFFFFFULL) : hash;
        out = (T)((double)(bits >> shift) * scale);
    """
    halves = int(kept < 53)
    kernel = _elementwise("uniform", "uint64 offset, int32 halves, int32 shift, float64 scale", "T out", body, _MIX)
    kernel(offset_argument(offset), halves, (32 if halves else 64) - kept, math.ldexp(1.0, -kept), out)


def standard_normal(out, first: int, second: int) -> None:
    """Fill ``out`` (contiguous) with Box-Muller's pairs from two float64 draws, offsets ``first`` and ``second``:
    element ``2j`` is ``sqrt(-2 log(1 - u_j)) cos(2 pi v_j)`` and ``2j + 1`` the same with ``sin``, as
    :meth:`netspec.engine.backend.Backend.standard_normal` computes it from two :func:`uniform` draws of 53
    bits."""
    body = """
        const double scale = 1.1102230246251565e-16;  // 2**-53
        const unsigned long long pair = (unsigned long long)i >> 1;
        const double u = (double)(netspec_mix(pair + first) >> 11) * scale;
        const double v = (double)(netspec_mix(pair + second) >> 11) * scale;
        const double turn = v * 6.283185307179586;
        out = (T)(sqrt(-2.0 * log(1.0 - u)) * ((i & 1) ? sin(turn) : cos(turn)));
    """
    _elementwise("standard_normal", "uint64 first, uint64 second", "T out", body, _MIX)(
        offset_argument(first), offset_argument(second), out)


def integers(out, offset: int, low: int, span: int, words: bool) -> None:
    """Fill ``out`` (contiguous, of any number type) with whole numbers low to low + span - 1 (span at most
    2**32) from one draw, as :class:`netspec.engine.backend.DeviceGenerator` makes them: with ``words``,
    ``low + (w_i span >> 32)`` for the draw's 32-bit word ``w_i`` (:func:`uniform`'s), else ``low + (h_i span >>
    64)`` for its 64-bit hash ``h_i``."""
    body = """
        const unsigned long long hash = netspec_mix(((unsigned long long)i >> words) + offset);
        const unsigned long long word = (i & 1) ? hash >> 32 : hash & 0xFFFFFFFFULL;
        out = (T)(double)(low + (long long)(words ? (word * span) >> 32 : __umul64hi(hash, span)));  // (exact)
    """
    _elementwise("integers", "uint64 offset, int64 low, uint64 span, int32 words", "T out", body, _MIX)(
        offset_argument(offset), numpy.int64(low), numpy.uint64(span), int(words), out)


def narrow_bfloat16(x, out) -> None:
    """``out`` (uint16) = the bits of float32 ``x`` rounded to bfloat16, as :func:`netspec.engine.half.narrow`
    makes them (to nearest, ties to even; a NaN 0x7FFF)."""
    body = """
        const unsigned int bits = __float_as_uint(x);
        out = ((bits & 0x7FFFFFFFu) > 0x7F800000u) ? (unsigned short)0x7FFF
                                                    : (unsigned short)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    """
    _elementwise("narrow_bfloat16", "float32 x", "uint16 out", body)(x, out)


def widen_bfloat16(bits, add: bool, out) -> None:
    """``out`` (float32) = the bfloat16 values of ``bits`` (uint16), or ``out +=`` them with ``add``."""
    body = """
        const float value = __uint_as_float(((unsigned int)bits) << 16);
        out = add ? out + value : value;
    """
    _elementwise("widen_bfloat16", "uint16 bits, bool add", "float32 out", body)(bits, add, out)


def channels_first(out, bias, y) -> None:
    """``y`` (N, O, ...) written with a product's ``out`` (O, N, ...) transposed, plus ``bias`` (O values) per
    channel when given: a convolution's columns product moved into its top."""
    o, n = out.shape[:2]
    body = """
        const index_t q = (index_t)i % inner, rest = (index_t)i / inner;
        const index_t ch = rest % o, b = rest / o;
        y = out[(ch * n + b) * inner + q] + (has_bias ? bias[ch] : (T)0);
    """
    _elementwise("channels_first", "raw T out, raw T bias, int32 o, int32 n, int32 inner, bool has_bias", "T y",
                 body, arrays=(out,))(
        out, out if bias is None else bias, o, n, out.size // (o * n), bias is not None, y)


def im2col(x, kernel, pad, stride, dilation, out_size, cols) -> None:
    """Columns of an (N, C, H, W) array ``x`` (contiguous) into ``cols`` (C, kh, kw, N, H', W'): every input value
    each kernel offset sees, zero where it sees the padding."""
    n, c, h, w = x.shape
    body = """
        index_t rest = (index_t)i;
        const int ox = rest % ow; rest /= ow;
        const int oy = rest % oh; rest /= oh;
        const index_t b = rest % n; rest /= n;
        const int j = rest % kw; rest /= kw;
        const int k = rest % kh;
        const index_t ch = rest / kh;
        const int y = oy * sh - ph + k * dh, xx = ox * sw - pw + j * dw;
        cols = (y >= 0 && y < h && xx >= 0 && xx < w) ? x[((b * c + ch) * h + y) * w + xx] : (T)0;
    """
    _elementwise("im2col", "raw T x, int32 n, int32 c, int32 h, int32 w, int32 kh, int32 kw, int32 oh, int32 ow, "
                           "int32 ph, int32 pw, int32 sh, int32 sw, int32 dh, int32 dw", "T cols", body,
                 arrays=(x, cols))(
        x, n, c, h, w, *kernel, *out_size, *pad, *stride, *dilation, cols)


def col2im(cols, kernel, pad, stride, dilation, out_size, dx) -> None:
    """The adjoint of :func:`im2col`: ``dx`` (N, C, H, W) written with the sum of every column value taken from
    each input position (``cols`` contiguous, (C, kh, kw, N, H', W'))."""
    n, c, h, w = dx.shape
    body = """
        index_t rest = (index_t)i;
        const int xx = rest % w; rest /= w;
        const int y = rest % h; rest /= h;
        const index_t ch = rest % c;
        const index_t b = rest / c;
        T sum = 0;
        for (int k = 0; k < kh; ++k) {
            const int ty = y + ph - k * dh;
            if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
            for (int j = 0; j < kw; ++j) {
                const int tx = xx + pw - j * dw;
                if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
                sum += cols[((((ch * kh + k) * kw + j) * n + b) * oh + ty / sh) * ow + tx / sw];
            }
        }
        dx = sum;
    """
    _elementwise("col2im", "raw T cols, int32 n, int32 c, int32 h, int32 w, int32 kh, int32 kw, int32 oh, "
                           "int32 ow, int32 ph, int32 pw, int32 sh, int32 sw, int32 dh, int32 dw", "T dx", body,
                 arrays=(cols, dx))(
        cols, n, c, h, w, *kernel, *out_size, *pad, *stride, *dilation, dx)


# One pooling window by Caffe's rule: it starts at o*stride - pad, ends at the padded input's far edge at the latest
# (the count AVE divides by), then is clipped to the input.
_WINDOW = """
        index_t rest = (index_t)i;
        const int ox = rest % ow; rest /= ow;
        const int oy = rest % oh;
        const index_t plane = rest / oh;
        int y0 = oy * sh - ph, x0 = ox * sw - pw;
        int y1 = min(y0 + kh, h + ph), x1 = min(x0 + kw, w + pw);
        const int count = (y1 - y0) * (x1 - x0);
        y0 = max(y0, 0); x0 = max(x0, 0); y1 = min(y1, h); x1 = min(x1, w);
        const T* in = &x[plane * h * w];
"""
_POOL_PARAMS = "raw T x, int32 h, int32 w, int32 oh, int32 ow, int32 kh, int32 kw, int32 sh, int32 sw, int32 ph, " \
               "int32 pw"


def max_pool(x, geo, y, mask) -> None:
    """MAX pooling of ``x`` (N, C, H, W, contiguous) into ``y`` (N, C, H', W'), and in ``mask`` (int32, y's shape)
    each window's first maximum in row-major order, as an index into its H x W plane (Caffe's rule: a value
    replaces the maximum only when strictly greater; padding is never chosen)."""
    body = _WINDOW + """
        int best = y0 * w + x0;
        T top = in[best];
        for (int yy = y0; yy < y1; ++yy)
            for (int xx = x0; xx < x1; ++xx)
                if (in[yy * w + xx] > top) { top = in[yy * w + xx]; best = yy * w + xx; }
        y = top;
        mask = best;
    """
    _elementwise("max_pool", _POOL_PARAMS, "T y, int32 mask", body, arrays=(x, y))(
        x, *_pool_args(x, geo), y, mask)


def ave_pool(x, geo, y) -> None:
    """AVE pooling (Caffe's): each window's sum over the input divided by the window's size clipped to the padded
    input (padding counts, the overhang of a ceil-rounded last window does not)."""
    body = _WINDOW + """
        T sum = 0;
        for (int yy = y0; yy < y1; ++yy)
            for (int xx = x0; xx < x1; ++xx)
                sum += in[yy * w + xx];
        y = sum / (T)count;
    """
    _elementwise("ave_pool", _POOL_PARAMS, "T y", body, arrays=(x, y))(x, *_pool_args(x, geo), y)


# The windows covering input position (y, x) of a plane: outputs oy0..oy1-1 and ox0..ox1-1.
_COVERING = """
        index_t rest = (index_t)i;
        const int xx = rest % w; rest /= w;
        const int yy = rest % h;
        const index_t plane = rest / h;
        const int py = yy + ph, px = xx + pw;
        const int oy0 = py < kh ? 0 : (py - kh) / sh + 1, oy1 = min(py / sh + 1, oh);
        const int ox0 = px < kw ? 0 : (px - kw) / sw + 1, ox1 = min(px / sw + 1, ow);
        const T* g = &dy[plane * oh * ow];
        T sum = 0;
"""
_POOL_BACKWARD_PARAMS = "raw T dy, int32 h, int32 w, int32 oh, int32 ow, int32 kh, int32 kw, int32 sh, int32 sw, " \
                        "int32 ph, int32 pw"


def max_pool_backward(dy, mask, geo, dx) -> None:
    """The gradient of :func:`max_pool`: ``dx`` (N, C, H, W) written with the sum of the gradients of the windows
    whose maximum it was."""
    body = _COVERING + """
        const int* chosen = &mask[plane * oh * ow];
        for (int oy = oy0; oy < oy1; ++oy)
            for (int ox = ox0; ox < ox1; ++ox)
                if (chosen[oy * ow + ox] == yy * w + xx) sum += g[oy * ow + ox];
        dx = sum;
    """
    params = _POOL_BACKWARD_PARAMS + ", raw int32 mask"
    _elementwise("max_pool_backward", params, "T dx", body, arrays=(dy, dx))(
        dy, *_pool_args(dx, geo), mask, dx)


def ave_pool_backward(dy, geo, dx) -> None:
    """The gradient of :func:`ave_pool`: ``dx`` (N, C, H, W) written with each covering window's gradient over
    that window's size."""
    body = _COVERING + """
        for (int oy = oy0; oy < oy1; ++oy)
            for (int ox = ox0; ox < ox1; ++ox) {
                const int y0 = oy * sh - ph, x0 = ox * sw - pw;
                const int count = (min(y0 + kh, h + ph) - y0) * (min(x0 + kw, w + pw) - x0);
                sum += g[oy * ow + ox] / (T)count;
            }
        dx = sum;
    """
    _elementwise("ave_pool_backward", _POOL_BACKWARD_PARAMS, "T dx", body, arrays=(dy, dx))(
        dy, *_pool_args(dx, geo), dx)


def _pool_args(x, geo) -> tuple[int, ...]:
    """The geometry arguments of the pooling kernels: input size, output size, kernel, stride, padding."""
    return (*x.shape[2:], *geo.out, *geo.kernel, *geo.stride, *geo.pad)


def softmax_loss(scores, values, prob, epsilon: float, ignore_label: int | None, floor: float):
    """SoftmaxWithLoss's forward pass, one thread a position: ``prob`` (outer, classes, inner) written with the
    softmax of ``scores`` (contiguous, the same shape) over axis 1; returns, each (outer, 1, inner) like the label
    ``values``, the loss at each position (0 where not valid), the labels as int64 (0 standing in where not valid
    or bad), where they are valid (not ``ignore_label``) and where a valid one is bad (not a whole number in
    [0, classes)).  With ``epsilon`` the loss is label smoothing's ``-(1 - epsilon) log p[label] - epsilon
    mean_k log p[k]``; every log is of ``max(p, floor)``."""
    import cupy
    classes, inner = scores.shape[1:]
    body = """
        const index_t base = ((index_t)i / inner) * classes * inner + (index_t)i % inner;
        T top = x[base];
        for (int k = 1; k < classes; ++k) top = max(top, x[base + k * inner]);
        T sum = 0;
        for (int k = 0; k < classes; ++k) {
            const T e = exp(x[base + k * inner] - top);
            p[base + k * inner] = e;
            sum += e;
        }
        const T least = (T)tiny;
        T logs = 0;
        for (int k = 0; k < classes; ++k) {
            const T q = p[base + k * inner] / sum;
            p[base + k * inner] = q;
            if (epsilon != 0) logs += log(max(q, least));
        }
        valid = !(has_ignore && (double)v == ignore);
        bad = valid && !(v >= 0 && v < classes && v == floor(v));
        label = (valid && !bad) ? (long long)v : 0;
        T log_p = log(max(p[base + label * inner], least));
        if (epsilon != 0) log_p = (T)(1 - epsilon) * log_p + (T)epsilon * logs / (T)classes;
        loss = valid ? -log_p : (T)0;
    """
    kernel = _elementwise("softmax_loss", "T v, raw T x, int32 classes, int32 inner, float64 epsilon, "
                                          "bool has_ignore, float64 ignore, float64 tiny",
                          "raw T p, T loss, int64 label, bool valid, bool bad", body, arrays=(scores,))
    outputs = [cupy.empty(values.shape, dtype=dtype) for dtype in (scores.dtype, cupy.int64, bool, bool)]
    kernel(values, scores, classes, inner, epsilon, ignore_label is not None,
           0.0 if ignore_label is None else float(ignore_label), floor, prob,
           *outputs)
    return outputs


def softmax_loss_backward(prob, labels, valid, epsilon: float, scale, grad) -> None:
    """SoftmaxWithLoss's gradient into ``grad`` (outer, classes, inner): ``(p - t) * scale`` where valid, 0
    elsewhere, with the target ``t = (1 - epsilon) onehot(label) + epsilon / classes``; ``scale`` a device array
    of one value (the loss's gradient over the normaliser)."""
    classes, inner = prob.shape[1:]
    body = """
        const index_t position = ((index_t)i / (classes * inner)) * inner + (index_t)i % inner;
        const int k = ((index_t)i / inner) % classes;
        const T target = (T)(epsilon / classes) + (k == labels[position] ? (T)(1 - epsilon) : (T)0);
        grad = valid[position] ? (p - target) * scale[0] : (T)0;
    """
    _elementwise("softmax_loss_backward", "T p, raw int64 labels, raw bool valid, raw T scale, int32 classes, "
                                          "int32 inner, float64 epsilon", "T grad", body, arrays=(prob,))(
        prob, labels, valid, scale, classes, inner, epsilon, grad)


def relu_backward(dy, y, slope: float, dx) -> None:
    """ReLU's gradient: ``dx = dy`` where ``y > 0``, else ``dy * slope`` (Caffe's rule; where ``y`` is NaN as
    the layer's array code does), ``y`` the output (or, for a negative slope, the input); one launch where array
    code takes a comparison and a product."""
    _elementwise("relu_backward", "T dy, T y, float64 slope", "T dx",
                 "dx = dy * (y > (T)0 ? (T)1 : (T)slope);")(dy, y, slope, dx)


def update_name(rule: str) -> str:
    """The name of :func:`update`'s kernel for the rule of type ``rule`` (a C identifier)."""
    return "update_" + re.sub(r"\W", "_", rule.lower())


def update(rule: str, step: str, histories: dict, diff, data, scalars, rate_at: int, decay_at: int | None,
           scale: float, decay: float, l1: bool, hyper: dict[str, float]) -> None:
    """A group's whole update in one launch (:class:`netspec.training.optimizer.Optimizer`): the gradient ``diff``
    times ``scale`` (1 / iter_size), plus ``decay`` times the regulariser (``data``, or its sign with ``l1``),
    the rule's ``step`` (CUDA statements setting ``T step`` from ``g``, ``rate``, the ``hyper`` parameters and
    the ``histories`` (``{name: array}``, as the rule names them), which it updates), then with a decoupled decay
    (``decay_at``: where its rate lies in ``scalars``) the regulariser times that rate added to the step; the
    step written into ``diff`` and subtracted from ``data``.  The rates are read from ``scalars`` (device memory
    written before each step) at ``rate_at`` and ``decay_at``."""
    names = list(hyper)
    body = f"""
        const T rate = scalars[rate_at];
        const T reg = !l1 ? data : (data > (T)0 ? (T)1 : data < (T)0 ? (T)-1 : data);
        T g = diff;
        if (scale != 1.0) g *= (T)scale;
        if (decay != 0.0) g += (T)decay * reg;
        T step;
        {{ {step} }}
        if (decay_at >= 0) step += scalars[decay_at] * reg;
        diff = step;
        data -= step;
    """
    params = ", ".join(["raw T scalars", "int32 rate_at", "int32 decay_at", "float64 scale", "float64 decay", "bool l1",
                        *(f"float64 {name}" for name in names)])
    outputs = ", ".join(["T diff", "T data", *(f"T {name}" for name in histories)])
    _elementwise(update_name(rule), params, outputs, body, arrays=(diff,))(
        scalars, rate_at, -1 if decay_at is None else decay_at, scale, decay, l1, *(hyper[name] for name in names),
        diff, data, *histories.values())


def mark_failures(bad, values, number: int, when, value) -> None:
    """Where ``bad`` and no earlier check failed (``when`` < 0): ``when`` = ``number`` and ``value`` = the value
    there (:meth:`netspec.engine.backend.Backend.check_later`); one launch, no reduction."""
    _elementwise("mark_failures", "bool bad, T v, int64 number", "int64 when, T value",
                 "if (bad && when < 0) { when = number; value = v; }")(bad, values, numpy.int64(number), when, value)


# One position of an (N, C, H, W) array, its channel, and the channels of its LRN window.
_ACROSS = """
        const index_t q = (index_t)i % hw, rest = (index_t)i / hw;
        const int ch = rest % c;
        const index_t base = (rest / c) * c * hw + q;
        const int first = max(ch - half, 0), last = min(ch + half, c - 1);
"""


def lrn(x, local_size: int, k: float, multiplier: float, beta: float, scale, y) -> None:
    """LRN across channels (Caffe's): ``scale = k + multiplier * sum of x^2 over the local_size channels centred on
    each`` (none past the edges) and ``y = x * scale^-beta``, ``x`` contiguous."""
    body = _ACROSS + """
        T sum = 0;
        for (int d = first; d <= last; ++d) { const T v = x[base + d * hw]; sum += v * v; }
        const T s = (T)k + (T)multiplier * sum;
        scale = s;
        y = x[base + ch * hw] * pow(s, (T)-beta);
    """
    _elementwise("lrn", "raw T x, int32 c, int32 hw, int32 half, float64 k, float64 multiplier, float64 beta",
                 "T scale, T y", body, arrays=(x,))(
        x, x.shape[1], math.prod(x.shape[2:]), (local_size - 1) // 2, k, multiplier, beta, scale, y)


def lrn_backward(x, y, dy, scale, local_size: int, multiplier: float, beta: float, dx) -> None:
    """The gradient of :func:`lrn`: ``dx = dy scale^-beta - 2 multiplier beta x * sum over the window of
    dy y / scale`` (the window is symmetric), every input contiguous."""
    body = _ACROSS + """
        T spread = 0;
        for (int d = first; d <= last; ++d) { const index_t at = base + d * hw; spread += dy[at] * y[at] / scale[at]; }
        const index_t at = base + ch * hw;
        dx = dy[at] * pow(scale[at], (T)-beta) - (T)(2 * multiplier * beta) * x[at] * spread;
    """
    _elementwise("lrn_backward", "raw T x, raw T y, raw T dy, raw T scale, int32 c, int32 hw, int32 half, "
                                 "float64 multiplier, float64 beta", "T dx", body, arrays=(x,))(
        x, y, dy, scale, x.shape[1], math.prod(x.shape[2:]), (local_size - 1) // 2, multiplier, beta,
        dx)
