"""16-bit floats held as their bits (uint16 arrays): the operands cuBLAS and cuDNN take under ``precision:
bf16-mixed`` (bfloat16) and ``fp16-mixed`` (float16), whatever array type the array module has for them (NumPy
and CuPy have float16, and no bfloat16 without a further library).

bfloat16 is float32's top half: its sign, its 8-bit exponent and the first 7
bits of its significand, so a float32 value narrows by rounding its bits to
the nearest multiple of 2**16 (ties to even) and widens exactly, by appending
16 zero bits.  A value past the largest bfloat16 rounds to infinity; a NaN
becomes 0x7FFF, as CUDA's ``__float2bfloat16_rn`` makes it.  On CuPy each is
one kernel (:mod:`netspec.engine.kernels`), elsewhere (NumPy, the GPU
stand-in) array code computes the same bits.  float16 (5 bits of exponent, 10
of significand: 65,504 at most) narrows and widens as the array module casts
(to nearest, ties to even; past 65,504, infinity), through a float16 view of
the bits.
"""

from __future__ import annotations

import numpy

from netspec.engine import kernels

PRECISIONS = ("bf16-mixed", "fp16-mixed")  # the precisions whose products and convolutions take 16-bit operands
NAN = 0x7FFF  # the bits a NaN narrows to in bfloat16


def narrow(xp, x, out, precision: str) -> None:
    """``out`` (uint16, C-contiguous, as many values) = the bits of float32 ``x`` (C-contiguous) rounded to
    ``precision``'s 16-bit float."""
    if precision == "fp16-mixed":
        with numpy.errstate(over="ignore"):  # (past 65,504: infinity, what loss scaling looks for)
            out.reshape(x.shape).view(numpy.float16)[...] = x
        return
    if kernels.compiled(xp):
        kernels.narrow_bfloat16(x, out.reshape(x.shape))
        return
    bits = x.reshape(-1).view(numpy.uint32)
    rounded = (bits + numpy.uint32(0x7FFF) + ((bits >> numpy.uint32(16)) & numpy.uint32(1))) >> numpy.uint32(16)
    nan = (bits & numpy.uint32(0x7FFFFFFF)) > numpy.uint32(0x7F800000)
    out.reshape(-1)[...] = xp.where(nan, numpy.uint32(NAN), rounded).astype(numpy.uint16)


def widen(xp, bits, out, precision: str, add: bool = False) -> None:
    """``out`` (float32, C-contiguous) = the ``precision`` 16-bit floats whose bits ``bits`` (uint16, as many)
    holds, or ``out +=`` them with ``add``."""
    if precision == "bf16-mixed" and kernels.compiled(xp):
        kernels.widen_bfloat16(bits.reshape(out.shape), add, out)
        return
    if precision == "fp16-mixed":
        values = bits.reshape(out.shape).view(numpy.float16)
    else:
        values = (bits.reshape(-1).astype(numpy.uint32) << numpy.uint32(16)).view(numpy.float32).reshape(out.shape)
    if add:
        out += values
    else:
        out[...] = values
