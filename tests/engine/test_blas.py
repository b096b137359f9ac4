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


def operands(backend, dtype, layout: str):
    """``(a, b, expected a @ b)`` with a and b device views laid out as ``layout`` says, and the host's product."""
    rng = numpy.random.default_rng(3)
    if layout.startswith("heads"):  # (N, heads, T, D) views of (N, T, parts, heads, D) projections, as attention
        # takes them: more heads than samples, or fewer
        projections = rng.standard_normal((2, 4, 2, 3, 5) if layout == "heads" else (3, 4, 2, 2, 5)).astype(dtype)
        on_device = backend.asarray(projections)
        a, b = (on_device.transpose(2, 0, 3, 1, 4)[part] for part in (0, 1))
        return a, b.swapaxes(-1, -2), numpy.matmul(projections[:, :, 0].transpose(0, 2, 1, 3),
                                                   projections[:, :, 1].transpose(0, 2, 3, 1))
    a, b = rng.standard_normal((2, 3, 4, 5)).astype(dtype), rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    if layout == "contiguous":
        return backend.asarray(a), backend.asarray(b), a @ b
    if layout == "transposed":  # (each matrix stored column by column)
        return (backend.asarray(a.swapaxes(-1, -2).copy()).swapaxes(-1, -2),
                backend.asarray(b.swapaxes(-1, -2).copy()).swapaxes(-1, -2), a @ b)
    if layout == "broadcast":  # (one matrix for the whole batch)
        return backend.asarray(a[0, 0]), backend.asarray(b), a[0, 0] @ b
    if layout == "rows apart":  # (every other row: matrices of a larger leading dimension)
        tall = rng.standard_normal((2, 3, 8, 5)).astype(dtype)
        return backend.asarray(tall)[:, :, ::2], backend.asarray(b), tall[:, :, ::2] @ b
    if layout == "columns apart":  # (every other column: no layout cuBLAS reads, array code)
        wide = rng.standard_normal((2, 3, 4, 10)).astype(dtype)
        return backend.asarray(wide)[..., ::2], backend.asarray(b), wide[..., ::2] @ b
    assert layout == "reversed"  # (a batch axis stepping backwards: array code)
    return backend.asarray(a)[::-1], backend.asarray(b), a[::-1] @ b


LAYOUTS = ["contiguous", "transposed", "heads", "heads (fewer)", "broadcast", "rows apart", "columns apart",
           "reversed"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("add", [False, True])
def test_batched_products_match_numpy(device, dtype, layout, add):
    backend = Backend(device)
    a, b, expected = operands(backend, dtype, layout)
    before = numpy.random.default_rng(4).standard_normal(expected.shape).astype(dtype)
    out = backend.asarray(before.copy())
    blas.matmul(backend, a, b, out, add)
    numpy.testing.assert_allclose(backend.to_host(out), expected + (before if add else 0),
                                  rtol=1e-5 if dtype == numpy.float32 else 1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("layout, calls", [("contiguous", 1), ("transposed", 1), ("heads", 2),
                                           ("heads (fewer)", 2), ("broadcast", 1), ("rows apart", 1)])
def test_on_cublas_batched_products_are_strided_batched_calls(monkeypatch, layout, calls):
    """Never CuPy's matmul (which a CUDA graph cannot capture): one call along the longest batch axis, a call for
    each step of the others (attention's heads: one call per sample, or per head where they are fewer)."""
    backend = Backend("gpu")
    library = blas._library(backend.xp)
    made = []
    batched = library.sgemm_strided_batched
    monkeypatch.setattr(library, "sgemm_strided_batched", lambda *arguments: made.append(arguments[-1]) or
                        batched(*arguments))
    monkeypatch.setattr(backend.xp, "matmul", None)  # (called: TypeError)
    a, b, expected = operands(backend, numpy.float32, layout)
    out = backend.asarray(numpy.zeros(expected.shape, numpy.float32))
    blas.matmul(backend, a, b, out)
    numpy.testing.assert_allclose(backend.to_host(out), expected, rtol=1e-5)
    assert len(made) == calls and made[0] == expected[..., 0, 0].size // calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_a_batched_product_into_transposed_matrices(monkeypatch, device, dtype):
    """``out`` a view whose matrices are stored column by column (MatMul's gradient of a transposed bottom): on
    cuBLAS the product of the transposes is asked instead, not CuPy's matmul."""
    backend = Backend(device)
    if backend.is_gpu:
        monkeypatch.setattr(backend.xp, "matmul", None)  # (called: TypeError)
    a, b, expected = operands(backend, dtype, "contiguous")
    stored = backend.asarray(numpy.zeros(expected.swapaxes(-1, -2).shape, dtype))
    blas.matmul(backend, a, b, stored.swapaxes(-1, -2))
    numpy.testing.assert_allclose(backend.to_host(stored).swapaxes(-1, -2), expected,
                                  rtol=1e-5 if dtype == numpy.float32 else 1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["columns apart", "reversed"])
def test_on_the_gpu_layouts_cublas_cannot_read_take_array_code(monkeypatch, layout):
    """Outside a capture they compute the same; inside one CuPy's matmul would refuse, naming the layer."""
    backend = Backend("gpu")
    library = blas._library(backend.xp)
    monkeypatch.setattr(library, "sgemm_strided_batched", None)  # (called: TypeError)
    a, b, expected = operands(backend, numpy.float32, layout)
    before = numpy.ones(expected.shape, numpy.float32)
    out = backend.asarray(before.copy())
    blas.matmul(backend, a, b, out, add=True)
    numpy.testing.assert_allclose(backend.to_host(out), expected + before, rtol=1e-5)


@pytest.mark.gpu
def test_on_cublas_batched_shapes_that_disagree_are_refused():
    backend = Backend("gpu")
    a, b = (backend.asarray(numpy.ones(shape, numpy.float32)) for shape in ((3, 4, 5), (3, 7, 6)))
    with pytest.raises(ValueError, match="the shapes do not agree"):
        blas.matmul(backend, a, b, backend.asarray(numpy.zeros((3, 4, 6), numpy.float32)))
