"""Matrix products and sums written into a given array, added to it when asked: one cuBLAS call on a GPU.

Caffe's layers add their parameters' gradients to what the diffs hold
(``dW += dy^T x``, ``db += sum of dy``), so that shared parameters and
several backward passes accumulate.  Array code makes each of those two
launches (the product or the sum into a temporary, then the addition), and on
a GPU each launch costs the host more time than the small nets' arithmetic.
cuBLAS adds in the same call (``beta = 1``), and sums are products with a
vector of ones, so on CuPy each of these is one call straight to cuBLAS
(:mod:`netspec.engine.cublas`: cheaper to make than CuPy's ``matmul``, and one
a CUDA graph may capture); elsewhere (NumPy, or a type cuBLAS is not asked
for here) array code does the same.

cuBLAS reads matrices column by column: a C-order (rows, columns) array is,
to it, the transposed matrix with a leading dimension of ``columns``, so
``out = op(a) op(b)`` is asked of it as ``out^T = op(b)^T op(a)^T``.
"""

from __future__ import annotations

import functools
import itertools

import numpy

from netspec.engine import cublas, half, kernels

_ONE = {numpy.dtype(dtype): numpy.ones((), dtype) for dtype in (numpy.float32, numpy.float64)}
_ZERO = {dtype: numpy.zeros((), dtype) for dtype in _ONE}  # (cuBLAS reads alpha and beta from host memory)
_OP_N, _OP_T = 0, 1  # cublasOperation_t: as stored, transposed


@functools.cache
def _library(xp):
    """cuBLAS's functions where the array module ``xp`` has them (CuPy, or the GPU stand-in's stand-in for
    them), else None."""
    if kernels.compiled(xp):
        return cublas.library(xp)
    return getattr(getattr(xp, "cuda", None), "cublas", None)


def _cublas(backend, a, b, out, contiguous: bool = True):
    """``(cuBLAS's functions, a handle)`` where ``backend``'s array module has cuBLAS and the arrays are all
    float32 or all float64 and none is empty, else None (array code then); with ``contiguous``, ValueError for an
    array that is not C-contiguous, since cuBLAS would read or write memory beside it.  The handle takes TF32's
    tensor cores for float32 where the backend's precision is tf32
    (:attr:`netspec.engine.backend.Backend.precision`)."""
    library = _library(backend.xp)
    if library is None or out.dtype not in _ONE or a.dtype != out.dtype or b.dtype != out.dtype:
        return None
    if not (a.size and b.size and out.size):
        return None
    if contiguous and not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("blas: cuBLAS takes C-contiguous arrays only")
    return library, library.current_handle(backend.precision == "tf32")


def product(backend, a, b, out, transpose_a: bool = False, transpose_b: bool = False, add: bool = False) -> None:
    """``out = op(a) @ op(b)``, or ``out += op(a) @ op(b)`` with ``add``; ``op`` transposes where asked; every
    array 2-D and C-contiguous, on ``backend``'s device.  Under precision bf16-mixed or fp16-mixed, float32
    products on cuBLAS take their operands rounded to bfloat16 or float16 (:mod:`netspec.engine.half`), sum in
    float32 and write float32."""
    xp, blas = backend.xp, _cublas(backend, a, b, out)
    if blas is None:
        left, right = (a.T if transpose_a else a), (b.T if transpose_b else b)
        if add:
            out += left @ right
        else:
            xp.matmul(left, right, out=out)
        return
    library, handle = blas
    m, k = a.shape[::-1] if transpose_a else a.shape  # (op(a) is m x k, op(b) k x n)
    inner, n = b.shape[::-1] if transpose_b else b.shape
    if (m, n) != out.shape or inner != k:
        raise ValueError(f"blas.product: op(a) {m}x{k} @ op(b) {inner}x{n} into {out.shape}: the shapes do not agree")
    gemm = library.sgemm if out.dtype == numpy.float32 else library.dgemm
    left, right = a.data.ptr, b.data.ptr
    if backend.precision in half.PRECISIONS and out.dtype == numpy.float32:
        gemm, narrowed = functools.partial(library.gemm_half, backend.precision), backend.half_scratch(a.size, b.size)
        for array, bits in zip((a, b), narrowed):
            half.narrow(xp, array, bits, backend.precision)
        left, right = (bits.data.ptr for bits in narrowed)
    gemm(handle, _OP_T if transpose_b else _OP_N, _OP_T if transpose_a else _OP_N, n, m, k,
         _ONE[out.dtype].ctypes.data, right, b.shape[1], left, a.shape[1],
         (_ONE if add else _ZERO)[out.dtype].ctypes.data, out.data.ptr, n)


def matmul(backend, a, b, out, add: bool = False) -> None:
    """``out[...] = a @ b``, or ``out += a @ b`` with ``add``: matrix products over the last two axes, batched over
    the others as NumPy's ``matmul`` broadcasts them (``out`` has the batch axes of the broadcast), every array on
    ``backend``'s device.  The arrays may be views: each of their matrices stored row by row or column by column
    (a transposed view, a head of attention's projections, a matrix broadcast over a batch).

    On cuBLAS each product of the batch along one batch axis is one strided batched call (the other batch axes,
    merged where their strides allow, looped over: a call each), so a CUDA graph may capture it, where CuPy's
    ``matmul`` binds its own handle to the stream and cannot be captured; products whose arrays are laid out
    otherwise run as array code.  The products are made in float32 (or TF32 where the precision says so), never
    from 16-bit operands."""
    xp = backend.xp
    blas = _cublas(backend, a, b, out, contiguous=False)
    batches = None if blas is None else _batches(xp, a, b, out)
    if batches is None:
        if add:
            out += xp.matmul(a, b)
        else:
            xp.matmul(a, b, out=out)
        return
    library, handle = blas
    gemm = library.sgemm_strided_batched if out.dtype == numpy.float32 else library.dgemm_strided_batched
    a, b, out, (lead_a, columns_a), (lead_b, columns_b), lead_out, axes = batches
    if a.shape[-2] != out.shape[-2] or b.shape[-1] != out.shape[-1] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"blas.matmul: {a.shape[-2:]} @ {b.shape[-2:]} into {out.shape[-2:]}: the shapes do not "
                         "agree")
    batched = max(range(len(axes)), key=lambda axis: axes[axis][0], default=None)  # (the longest batch axis)
    count, batch_strides = (1, (0, 0, 0)) if batched is None else axes[batched]
    looped = axes[:batched] + axes[batched + 1:] if batched is not None else []
    m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
    for index in itertools.product(*(range(extent) for extent, _ in looped)):
        offsets = [out.itemsize * sum(i * steps[operand] for i, (_, steps) in zip(index, looped))
                   for operand in range(3)]
        gemm(handle, _OP_T if columns_b else _OP_N, _OP_T if columns_a else _OP_N, n, m, k,
             _ONE[out.dtype].ctypes.data, b.data.ptr + offsets[1], lead_b, batch_strides[1],
             a.data.ptr + offsets[0], lead_a, batch_strides[0], (_ONE if add else _ZERO)[out.dtype].ctypes.data,
             out.data.ptr + offsets[2], lead_out, batch_strides[2], count)


def separable(backend, rows, x, columns, out) -> None:
    """``out[...] = rows @ x @ columns`` for every matrix of ``x`` (its last two axes), ``rows`` and ``columns``
    2-D: a linear map along each of the two axes (adaptive average pooling, bilinear resizing's gradient), as two
    :func:`matmul` calls, the two matrices broadcast over the batch."""
    between = backend.xp.empty((*x.shape[:-1], columns.shape[1]), dtype=out.dtype)
    matmul(backend, x, columns, between)
    matmul(backend, rows, between, out)


def _batches(xp, a, b, out):
    """For :func:`matmul` on cuBLAS: ``(a, b, out, a's matrix layout, b's, out's leading dimension, the batch
    axes)``, a and b broadcast to out's batch axes (:func:`_matrix_layout`, :func:`_merged_batch_axes`), and where
    ``out``'s matrices are stored column by column, the product of the transposes asked instead (``out^T = b^T
    a^T``, all three views); None where cuBLAS cannot read or write one of them (batches overlapping or
    reversed)."""
    if (_matrix_layout(out) or (0, False))[1]:
        a, b, out = b.swapaxes(-1, -2), a.swapaxes(-1, -2), out.swapaxes(-1, -2)
    shape = out.shape[:-2]
    a, b = xp.broadcast_to(a, shape + a.shape[-2:]), xp.broadcast_to(b, shape + b.shape[-2:])
    layouts = [_matrix_layout(array) for array in (a, b, out)]
    if None in layouts or layouts[2][1]:
        return None
    axes = _merged_batch_axes(shape, [[step // out.itemsize for step in array.strides[:-2]] for array in (a, b, out)])
    if any(min(steps) < 0 or steps[2] == 0 for _, steps in axes):
        return None
    return a, b, out, layouts[0], layouts[1], layouts[2][0], axes


def _matrix_layout(array) -> tuple[int, bool] | None:
    """How cuBLAS reads the matrices of ``array`` (its last two axes): ``(leading dimension, stored column by
    column)`` for matrices stored row by row (False) or column by column (True), each row (column) a run of
    elements; None otherwise."""
    rows, columns = array.shape[-2:]
    row_stride, column_stride = (stride // array.itemsize for stride in array.strides[-2:])
    if any(stride % array.itemsize for stride in array.strides):
        return None
    if column_stride == 1 or columns == 1:
        lead = row_stride if rows > 1 else columns
        if lead >= columns:
            return lead, False
    if row_stride == 1 or rows == 1:
        lead = column_stride if columns > 1 else rows
        if lead >= rows:
            return lead, True
    return None


def _merged_batch_axes(shape, strides) -> list[tuple[int, tuple[int, ...]]]:
    """The batch axes of ``shape`` as ``(extent, (stride of each array))``, in elements, axes of one element
    dropped and neighbours merged where every array steps through both as through one axis."""
    axes: list[tuple[int, tuple[int, ...]]] = []
    for axis, extent in enumerate(shape):
        steps = tuple(array[axis] for array in strides)
        if extent == 1:
            continue
        if axes and all(outer == inner * extent for outer, inner in zip(axes[-1][1], steps)):
            axes[-1] = (axes[-1][0] * extent, steps)
        else:
            axes.append((extent, steps))
    return axes


def sums(backend, a, ones, out, axis: int, add: bool = False) -> None:
    """``out = a.sum(axis)``, or ``out += a.sum(axis)`` with ``add``, for a 2-D C-contiguous ``a`` on ``backend``'s
    device; ``ones`` holds at least as many ones as the axis summed (:meth:`netspec.engine.backend.Backend.ones`)."""
    blas = _cublas(backend, a, ones, out)
    if blas is None:
        if add:
            out += a.sum(axis=axis)
        else:
            a.sum(axis=axis, out=out)
        return
    library, handle = blas
    rows, columns = a.shape  # (to cuBLAS: a (columns, rows) matrix; the rows' sums are its transpose's product)
    if out.size != a.shape[1 - axis] or ones.size < a.shape[axis]:
        raise ValueError(f"blas.sums: {out.size} sums of {a.shape} along axis {axis} from {ones.size} ones")
    gemv = library.sgemv if out.dtype == numpy.float32 else library.dgemv
    gemv(handle, _OP_T if axis == 1 else _OP_N, columns, rows, _ONE[out.dtype].ctypes.data, a.data.ptr, columns,
         ones.data.ptr, 1, (_ONE if add else _ZERO)[out.dtype].ctypes.data, out.data.ptr, 1)
