"""bfloat16 values held as their 16 bits (uint16 arrays): what cuBLAS and cuDNN read under ``precision:
bf16-mixed``, without an array type of their own (neither NumPy nor CuPy has one without a further library).

bfloat16 is float32's top half: its sign, its 8-bit exponent and the first 7
bits of its significand, so a float32 value narrows by rounding its bits to
the nearest multiple of 2**16 (ties to even) and widens exactly, by appending 16 zero bits.  A value past the
largest bfloat16 rounds to infinity; a NaN becomes 0x7FFF, as CUDA's
``__float2bfloat16_rn`` makes it.  On CuPy each is one kernel
(:mod:`netspec.engine.kernels`), elsewhere (NumPy, the GPU stand-in) array
code computes the same bits.
"""

from __future__ import annotations

import numpy

from netspec.engine import kernels

NAN = 0x7FFF  # the bits a NaN narrows to


def narrow(xp, x, out) -> None:
    """``out`` (uint16, C-contiguous, as many values) = the bits of float32 ``x`` (C-contiguous) rounded to
    bfloat16."""
    if kernels.compiled(xp):
        kernels.narrow_bfloat16(x, out.reshape(x.shape))
        return
    bits = x.reshape(-1).view(numpy.uint32)
    rounded = (bits + numpy.uint32(0x7FFF) + ((bits >> numpy.uint32(16)) & numpy.uint32(1))) >> numpy.uint32(16)
    nan = (bits & numpy.uint32(0x7FFFFFFF)) > numpy.uint32(0x7F800000)
    out.reshape(-1)[...] = xp.where(nan, numpy.uint32(NAN), rounded).astype(numpy.uint16)


def widen(xp, bits, out, add: bool = False) -> None:
    """``out`` (float32, C-contiguous) = the bfloat16 values whose bits ``bits`` (uint16, as many) holds, or
    ``out +=`` them with ``add``."""
    if kernels.compiled(xp):
        kernels.widen_bfloat16(bits.reshape(out.shape), add, out)
        return
    values = (bits.reshape(-1).astype(numpy.uint32) << numpy.uint32(16)).view(numpy.float32).reshape(out.shape)
    if add:
        out += values
    else:
        out[...] = values
