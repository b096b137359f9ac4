"""MatMul: the matrix product of two bottoms, batched over their leading axes (attention's scores and mixes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from netspec.engine import blas
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.spec.schema import doc


@dataclass
class MatMulParams:
    """Parameters of MatMul."""

    transpose_a: bool = doc(False, "use the first bottom's last two axes swapped")
    transpose_b: bool = doc(False, "use the second bottom's last two axes swapped")


@register_layer
class MatMul(Layer):
    """MatMul: ``y = op(a) @ op(b)`` over the last two axes, batched over the others (which must agree).

    ``op`` swaps the last two axes where ``transpose_a`` / ``transpose_b``
    say.  Bottoms: a (..., M, K) and b (..., K, N) after ``op``.  Top:
    (..., M, N).  Both bottoms receive gradients.  Not in place.

    Example (attention's scores, queries times keys)::

        - {name: scores, type: MatMul, bottom: [q, k], top: scores, mat_mul_param: {transpose_b: true}}
    """

    type = "MatMul"
    param_blocks = {"mat_mul_param": MatMulParams}
    num_bottoms = (2, 2)
    learnable = False

    def operand_shapes(self, a, b) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The bottoms' shapes after their transposes (validated)."""
        p = self.block("mat_mul_param")
        if len(a) < 2 or len(a) != len(b):
            raise ShapeError(f"bottoms need at least 2 axes and as many each: {tuple(a)} and {tuple(b)}")
        a = (*a[:-2], a[-1], a[-2]) if p.transpose_a else tuple(a)
        b = (*b[:-2], b[-1], b[-2]) if p.transpose_b else tuple(b)
        if a[:-2] != b[:-2] or a[-1] != b[-2]:
            raise ShapeError(f"cannot multiply {a} by {b} (after transposes): the batch axes must agree and a's "
                             "last axis must match b's second to last")
        return a, b

    def top_shapes(self, bottom_shapes):
        a, b = self.operand_shapes(*bottom_shapes)
        return [(*a[:-1], b[-1])]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        a, _ = self.operand_shapes(*bottom_shapes)
        return 2 * math.prod(top_shapes[0]) * a[-1]

    def operands(self, arrays):
        """The two bottoms' ``arrays`` (their data or their diffs), transposed as the parameters say (views)."""
        p = self.block("mat_mul_param")
        a, b = arrays
        return (a.swapaxes(-1, -2) if p.transpose_a else a), (b.swapaxes(-1, -2) if p.transpose_b else b)

    def forward(self, bottom, top):
        a, b = self.operands([blob.data for blob in bottom])
        blas.matmul(self.backend, a, b, top[0].data)

    def backward(self, top, propagate_down, bottom):
        a, b = self.operands([blob.data for blob in bottom])
        da, db = self.operands([blob.diff for blob in bottom])  # (d op(a) is op of a's gradient: written through)
        dy = top[0].diff
        if propagate_down[0]:  # d op(a) = dy op(b)^T
            blas.matmul(self.backend, dy, b.swapaxes(-1, -2), da)
        if propagate_down[1]:  # d op(b) = op(a)^T dy
            blas.matmul(self.backend, a.swapaxes(-1, -2), dy, db)
