"""bfloat16 held as bits (netspec.engine.bfloat16): float32 narrowed to nearest, ties to even, widened exactly;
and the products precision bf16-mixed makes with them, against float32 products of the rounded operands."""

from __future__ import annotations

import numpy as np
import pytest
from devices import DEVICES

from netspec.engine import bfloat16, blas
from netspec.engine.backend import Backend

EDGES = [  # (float32 value, its bfloat16 bits)
    (1.0, 0x3F80), (-2.0, 0xC000), (0.0, 0x0000), (-0.0, 0x8000),
    (np.float32(1 + 2 ** -8), 0x3F80),  # (a tie: the even neighbour, down)
    (np.float32(1 + 3 * 2 ** -8), 0x3F82),  # (a tie: the even neighbour, up)
    (np.float32(1 + 2 ** -8 + 2 ** -20), 0x3F81),  # (past the tie: up)
    (np.finfo(np.float32).max, 0x7F80),  # (past the largest bfloat16: infinity)
    (np.inf, 0x7F80), (-np.inf, 0xFF80), (np.nan, bfloat16.NAN), (-np.nan, bfloat16.NAN),
    (np.float32(2 ** -140), 0x0000),  # (a float32 subnormal far below bfloat16's: to 0)
]


@pytest.mark.parametrize("device", DEVICES)
def test_narrowing_rounds_to_nearest_even_and_widening_is_exact(device):
    backend = Backend(device)
    xp = backend.xp
    values = np.array([value for value, _ in EDGES], dtype=np.float32)
    bits = xp.empty(values.size, dtype=np.uint16)
    bfloat16.narrow(xp, backend.asarray(values), bits)
    assert [hex(int(b)) for b in backend.to_host(bits)] == [hex(b) for _, b in EDGES]
    rng = np.random.default_rng(0)
    many = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-30, 30, 10_000)).astype(np.float32)
    narrowed = xp.empty(many.size, dtype=np.uint16)
    bfloat16.narrow(xp, backend.asarray(many), narrowed)
    host = backend.to_host(narrowed)
    exact = (host.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(exact - many) <= np.abs(many) * 2.0 ** -8)  # (half a unit in the 8th bit at most)
    widened = xp.full(many.size, 1.0, dtype=np.float32)
    bfloat16.widen(xp, narrowed, widened)
    np.testing.assert_array_equal(backend.to_host(widened), exact)
    bfloat16.widen(xp, narrowed, widened, add=True)
    np.testing.assert_array_equal(backend.to_host(widened), exact + exact)


@pytest.mark.gpu
@pytest.mark.parametrize(("transpose_a", "transpose_b", "add"), [(False, False, False), (True, False, True),
                                                                 (False, True, False)])
def test_bf16_mixed_products_take_their_operands_rounded_to_bfloat16(transpose_a, transpose_b, add):
    backend = Backend("gpu")
    backend.precision = "bf16-mixed"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 30) if transpose_a else (30, 40)).astype(np.float32)
    b = rng.standard_normal((20, 40) if transpose_b else (40, 20)).astype(np.float32)
    start = rng.standard_normal((30, 20)).astype(np.float32)
    out = backend.asarray(start)
    blas.product(backend, backend.asarray(a), backend.asarray(b), out, transpose_a, transpose_b, add)

    def rounded(x):
        bits = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16
        return (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)

    left, right = rounded(a), rounded(b)
    expected = (left.T if transpose_a else left) @ (right.T if transpose_b else right) + (start if add else 0)
    exact = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b) + (start if add else 0)
    got = backend.to_host(out)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # (float32 sums of bfloat16 products)
    assert np.abs(got - exact).max() > 1e-4  # (the rounding shows: these are not float32 products)
