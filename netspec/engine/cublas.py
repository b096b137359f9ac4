"""cuBLAS through its C API (the ``libcublas`` CuPy loaded, with ctypes): products a CUDA graph may capture.

CuPy's cuBLAS wrappers bind their handle to the current stream before every
call, and CuPy refuses that while a stream captures a graph, so a captured
training step could not make a product through them.  netspec keeps handles
of its own instead, one per device and thread: bound to the current stream
only when it changes (so a call costs no more than the product's own launch),
each with a workspace of its own (cuBLAS would otherwise take memory during a
capture), reading alpha and beta from host memory (cuBLAS's default; a graph
keeps the values they had at the capture).

The functions take CuPy's wrappers' arguments, in their order
(:mod:`netspec.engine.blas` calls them; the GPU stand-in emulates the same
functions on the memory its arrays point to).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading

from netspec.errors import DeviceError

WORKSPACE_BYTES = 32 * 2 ** 20  # each handle's workspace: what cuBLAS's documentation advises for Hopper GPUs
MATH_MODES = {False: 0, True: 3}  # cublasMath_t by TF32 allowed: CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
# cublasStatus_t values other than success, as cuBLAS's documentation names them
STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
          13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_SIGNATURES = {  # name: argument types (every function returns a cublasStatus_t)
    "cublasCreate_v2": [ctypes.POINTER(_P)],
    "cublasSetStream_v2": [_P, _P],
    "cublasSetWorkspace_v2": [_P, _P, ctypes.c_size_t],
    "cublasSetMathMode": [_P, _I],
    **{name: [_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I] for name in ("cublasSgemm_v2", "cublasDgemm_v2")},
    **{name: [_P, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I] for name in ("cublasSgemv_v2", "cublasDgemv_v2")},
    **{name: [_P, _I, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _L, _P, _P, _I, _L, _I]
       for name in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched")},
    "cublasGemmEx": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I],
}
CUDA_R_32F = 0  # cudaDataType_t: float32
HALF_TYPES = {"bf16-mixed": 14, "fp16-mixed": 2}  # ... of the operands by precision: CUDA_R_16BF, CUDA_R_16F
CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 68, -1  # cublasComputeType_t, cublasGemmAlgo_t


class CuBlas:
    """The cuBLAS functions netspec calls, from the library at ``path``, with handles made on ``xp`` (CuPy)."""

    def __init__(self, xp, path: str):
        self.xp = xp
        self.dll = ctypes.CDLL(path)
        for name, arguments in _SIGNATURES.items():
            function = getattr(self.dll, name)
            function.argtypes, function.restype = arguments, ctypes.c_int
        # (device, thread) -> [handle, its stream, its workspace, whether it may take TF32's tensor cores]
        self._handles: dict[tuple[int, int], list] = {}

    def _call(self, name: str, *arguments) -> None:
        status = getattr(self.dll, name)(*arguments)
        if status:
            raise DeviceError(f"cuBLAS {name} failed: CUBLAS_STATUS_{STATUS.get(status, status)}")

    def current_handle(self, tf32: bool = False) -> int:
        """The handle of this thread on the current device, bound to the current stream; with ``tf32``, float32
        products may run on tensor cores, their inputs rounded to TF32 (10 bits of significand)."""
        xp = self.xp
        key = (xp.cuda.Device().id, threading.get_ident())
        held = self._handles.get(key)
        if held is None:
            handle = _P()
            self._call("cublasCreate_v2", ctypes.byref(handle))
            held = self._handles[key] = [handle.value, None, xp.empty(WORKSPACE_BYTES, dtype=xp.uint8), False]
        if held[3] != tf32:
            self._call("cublasSetMathMode", held[0], MATH_MODES[tf32])
            held[3] = tf32
        stream = xp.cuda.get_current_stream().ptr
        if held[1] != stream:
            self._call("cublasSetStream_v2", held[0], stream)
            # (after the stream: binding one sets cuBLAS's own workspace back)
            self._call("cublasSetWorkspace_v2", held[0], held[2].data.ptr, held[2].nbytes)
            held[1] = stream
        return held[0]

    def sgemm(self, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        """``C = alpha op(A) op(B) + beta C``, float32, column-major (cublasSgemm)."""
        self._call("cublasSgemm_v2", handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def dgemm(self, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        """The same in float64 (cublasDgemm)."""
        self._call("cublasDgemm_v2", handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def sgemm_strided_batched(self, handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                              c, ldc, stride_c, count) -> None:
        """:meth:`sgemm` on ``count`` matrices of each operand at once, each ``stride_*`` elements after the one
        before it (0: the same matrix for every product) (cublasSgemmStridedBatched)."""
        self._call("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                   stride_b, beta, c, ldc, stride_c, count)

    def dgemm_strided_batched(self, handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                              c, ldc, stride_c, count) -> None:
        """The same in float64 (cublasDgemmStridedBatched)."""
        self._call("cublasDgemmStridedBatched", handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                   stride_b, beta, c, ldc, stride_c, count)

    def gemm_half(self, precision, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        """``C = alpha op(A) op(B) + beta C``, A and B 16-bit floats (bfloat16 or float16 by ``precision``:
        :data:`HALF_TYPES`), C float32, the products summed in float32 (cublasGemmEx)."""
        operands = HALF_TYPES[precision]
        self._call("cublasGemmEx", handle, transa, transb, m, n, k, alpha, a, operands, lda, b, operands, ldb,
                   beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    def sgemv(self, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy) -> None:
        """``y = alpha op(A) x + beta y``, float32, A column-major (cublasSgemv)."""
        self._call("cublasSgemv_v2", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)

    def dgemv(self, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy) -> None:
        """The same in float64 (cublasDgemv)."""
        self._call("cublasDgemv_v2", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)


@functools.cache
def library(xp) -> CuBlas:
    """cuBLAS as CuPy (``xp``) loaded it: the same library file, so that both agree on every type."""
    xp.cuda.device.get_cublas_handle()  # (CuPy loads its cuBLAS with its first handle)
    return CuBlas(xp, _loaded_path())


def _loaded_path() -> str:
    """Where the libcublas this process loaded lies (or, failing that, the one the loader finds)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libcublas.so" in path:
                    return path
    except OSError:
        pass
    found = ctypes.util.find_library("cublas")
    if found is None:
        raise DeviceError("cuBLAS cannot be found: CuPy's libcublas is not loaded and the loader finds none")
    return found
