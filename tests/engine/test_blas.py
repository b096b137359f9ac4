"""netspec.engine.blas: products and sums into a given array, added to it when asked, against NumPy's.

On the GPU (CuPy, or the stand-in's emulation of cuBLAS's column-major calls) they are single cuBLAS calls, so
these tests check the mapping of C-order arrays to cuBLAS's arguments, for every transposition; on the CPU they
are array code.
"""

from __future__ import annotations

import numpy
import pytest
from devices import DEVICES

from netspec.engine import blas
from netspec.engine.backend import Backend


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("add", [False, True])
def test_product_matches_numpy(device, dtype, transpose_a, transpose_b, add):
    backend, rng = Backend(device), numpy.random.default_rng(1)
    m, n, k = 5, 7, 3  # (all different: a swapped dimension or leading dimension shows)
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(dtype)
    before = rng.standard_normal((m, n)).astype(dtype)
    out = backend.asarray(before.copy())  # (on the CPU asarray is the array itself)
    blas.product(backend, backend.asarray(a), backend.asarray(b), out, transpose_a, transpose_b, add)
    expected = (a.T if transpose_a else a) @ (b.T if transpose_b else b) + (before if add else 0)
    numpy.testing.assert_allclose(backend.to_host(out), expected, rtol=1e-5 if dtype == numpy.float32 else 1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("add", [False, True])
def test_sums_match_numpy(device, dtype, axis, add):
    backend, rng = Backend(device), numpy.random.default_rng(2)
    a = rng.standard_normal((4, 6)).astype(dtype)
    before = rng.standard_normal(a.shape[1 - axis]).astype(dtype)
    out = backend.asarray(before.copy())  # (on the CPU asarray is the array itself)
    blas.sums(backend, backend.asarray(a), backend.ones(9, dtype), out, axis, add)  # (more ones than needed)
    expected = a.sum(axis=axis) + (before if add else 0)
    numpy.testing.assert_allclose(backend.to_host(out), expected, rtol=1e-5 if dtype == numpy.float32 else 1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_other_types_take_array_code(device):
    backend = Backend(device)
    a = backend.asarray(numpy.arange(6, dtype=numpy.float16).reshape(2, 3))
    out = backend.asarray(numpy.ones((2, 2), numpy.float16))
    blas.product(backend, a, a, out, transpose_b=True, add=True)
    numpy.testing.assert_array_equal(backend.to_host(out), numpy.array([[6, 15], [15, 51]], numpy.float16))


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_axis_takes_array_code(device):
    backend = Backend(device)
    a, b = backend.asarray(numpy.zeros((3, 0), numpy.float32)), backend.asarray(numpy.zeros((0, 2), numpy.float32))
    out = backend.asarray(numpy.full((3, 2), 5, numpy.float32))
    blas.product(backend, a, b, out, add=True)
    numpy.testing.assert_array_equal(backend.to_host(out), numpy.full((3, 2), 5, numpy.float32))


@pytest.mark.gpu
def test_on_cublas_shapes_that_disagree_and_strided_views_are_refused():
    backend = Backend("gpu")
    a, b = (backend.asarray(numpy.ones(shape, numpy.float32)) for shape in ((3, 4), (5, 2)))
    with pytest.raises(ValueError, match="the shapes do not agree"):
        blas.product(backend, a, b, backend.asarray(numpy.zeros((3, 2), numpy.float32)))
    with pytest.raises(ValueError, match="C-contiguous"):
        blas.product(backend, a[:, ::2], b[:2], backend.asarray(numpy.zeros((3, 2), numpy.float32)))
    with pytest.raises(ValueError, match="2 sums of"):
        blas.sums(backend, a, backend.ones(4, numpy.float32), backend.asarray(numpy.zeros(2, numpy.float32)), 1)
