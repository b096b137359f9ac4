"""16-bit floats held as bits (netspec.engine.half): float32 narrowed to bfloat16 or float16 to nearest, ties to
even, widened exactly; and the products the mixed precisions make with them, against float32 products of the
rounded operands."""

from __future__ import annotations

import numpy as np
import pytest
from devices import DEVICES

from netspec.engine import blas, half
from netspec.engine.backend import Backend

EDGES = [  # (float32 value, its bfloat16 bits)
    (1.0, 0x3F80), (-2.0, 0xC000), (0.0, 0x0000), (-0.0, 0x8000),
    (np.float32(1 + 2 ** -8), 0x3F80),  # (a tie: the even neighbour, down)
    (np.float32(1 + 3 * 2 ** -8), 0x3F82),  # (a tie: the even neighbour, up)
    (np.float32(1 + 2 ** -8 + 2 ** -20), 0x3F81),  # (past the tie: up)
    (np.finfo(np.float32).max, 0x7F80),  # (past the largest bfloat16: infinity)
    (np.inf, 0x7F80), (-np.inf, 0xFF80), (np.nan, half.NAN), (-np.nan, half.NAN),
    (np.float32(2 ** -140), 0x0000),  # (a float32 subnormal far below bfloat16's: to 0)
]


@pytest.mark.parametrize("device", DEVICES)
def test_narrowing_rounds_to_nearest_even_and_widening_is_exact(device):
    backend = Backend(device)
    xp = backend.xp
    values = np.array([value for value, _ in EDGES], dtype=np.float32)
    bits = xp.empty(values.size, dtype=np.uint16)
    half.narrow(xp, backend.asarray(values), bits, "bf16-mixed")
    assert [hex(int(b)) for b in backend.to_host(bits)] == [hex(b) for _, b in EDGES]
    rng = np.random.default_rng(0)
    many = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-30, 30, 10_000)).astype(np.float32)
    narrowed = xp.empty(many.size, dtype=np.uint16)
    half.narrow(xp, backend.asarray(many), narrowed, "bf16-mixed")
    host = backend.to_host(narrowed)
    exact = (host.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(exact - many) <= np.abs(many) * 2.0 ** -8)  # (half a unit in the 8th bit at most)
    widened = xp.full(many.size, 1.0, dtype=np.float32)
    half.widen(xp, narrowed, widened, "bf16-mixed")
    np.testing.assert_array_equal(backend.to_host(widened), exact)
    half.widen(xp, narrowed, widened, "bf16-mixed", add=True)
    np.testing.assert_array_equal(backend.to_host(widened), exact + exact)


@pytest.mark.parametrize("device", DEVICES)
def test_float16_narrows_as_the_array_module_casts(device):
    backend = Backend(device)
    xp = backend.xp
    values = np.array([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65520.0, -1e9, 2.0 ** -24, np.nan],
                      dtype=np.float32)
    bits = xp.empty(values.size, dtype=np.uint16)
    half.narrow(xp, backend.asarray(values), bits, "fp16-mixed")
    with np.errstate(over="ignore"):  # (65,520 and -1e9 past float16's largest: infinities)
        expected = values.astype(np.float16)
    np.testing.assert_array_equal(backend.to_host(bits), expected.view(np.uint16))
    widened = xp.ones(values.size, dtype=np.float32)
    half.widen(xp, bits, widened, "fp16-mixed", add=True)
    np.testing.assert_array_equal(backend.to_host(widened), expected.astype(np.float32) + 1)


def rounded(x: np.ndarray, precision: str) -> np.ndarray:
    """float32 ``x`` rounded to ``precision``'s 16-bit float, as float64."""
    if precision == "fp16-mixed":
        return x.astype(np.float16).astype(np.float64)
    bits = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16
    return (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize(("transpose_a", "transpose_b", "add"), [(False, False, False), (True, False, True),
                                                                 (False, True, False)])
def test_mixed_products_take_their_operands_rounded_to_16_bits(transpose_a, transpose_b, add, precision):
    backend = Backend("gpu")
    backend.precision = precision
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 30) if transpose_a else (30, 40)).astype(np.float32)
    b = rng.standard_normal((20, 40) if transpose_b else (40, 20)).astype(np.float32)
    start = rng.standard_normal((30, 20)).astype(np.float32)
    out = backend.asarray(start)
    blas.product(backend, backend.asarray(a), backend.asarray(b), out, transpose_a, transpose_b, add)
    left, right = rounded(a, precision), rounded(b, precision)
    expected = (left.T if transpose_a else left) @ (right.T if transpose_b else right) + (start if add else 0)
    exact = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b) + (start if add else 0)
    got = backend.to_host(out)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # (float32 sums of 16-bit products)
    assert np.abs(got - exact).max() > 1e-4  # (the rounding shows: these are not float32 products)
