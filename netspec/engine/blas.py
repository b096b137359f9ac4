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


def _cublas(backend, a, b, out):
    """``(cuBLAS's functions, a handle)`` where ``backend``'s array module has cuBLAS and the arrays are all
    float32 or all float64 and none is empty, else None (array code then); ValueError for an array that is not
    C-contiguous, since cuBLAS would read or write memory beside it.  The handle takes TF32's tensor cores for
    float32 where the backend's precision is tf32 (:attr:`netspec.engine.backend.Backend.precision`)."""
    library = _library(backend.xp)
    if library is None or out.dtype not in _ONE or a.dtype != out.dtype or b.dtype != out.dtype:
        return None
    if not (a.size and b.size and out.size):
        return None
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
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
