"""MultiHeadAttention: scaled dot-product attention over several heads, with PyTorch's projections (transformers')."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.engine import blas, onednn, primitives
from netspec.engine.fillers import FillerParams
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.softmax import softmax
from netspec.spec.schema import doc, required

ROLES = ("query", "key", "value")


@dataclass
class MultiHeadAttentionParams:
    """Parameters of MultiHeadAttention."""

    num_heads: int = required(doc="number of heads; must divide the embedding size E")
    causal: bool = doc(False, "position t attends to positions <= t only (query and key of one length)")
    bias_term: bool = doc(True, "learn the projections' biases")
    weight_filler: FillerParams = field(default_factory=lambda: FillerParams(type="xavier", variance_norm="AVERAGE"),
                                        metadata={"doc": "init of both projections' weights"})
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "init of both biases"})


def split_heads(projected, n: int, parts: int, heads: int):
    """(N * T, parts * E) projections as (parts, N, heads, T, E / heads) (a view: writing into it fills the
    projections)."""
    return projected.reshape(n, projected.shape[0] // n, parts, heads, -1).transpose(2, 0, 3, 1, 4)


@dataclass
class AttentionPrimitives:
    """MultiHeadAttention's oneDNN primitives: the input projections (an inner product for each of
    :meth:`MultiHeadAttention.sources`), the output projection, and the softmax over the key positions."""

    projections: list[primitives.InnerProduct]
    output: primitives.InnerProduct
    softmax: primitives.Softmax


@register_layer
class MultiHeadAttention(Layer):
    """MultiHeadAttention: ``y = concat_h(softmax(q_h k_h^T / sqrt(D) + M) v_h) W_o^T + b_o`` (Vaswani et al. 2017).

    ``q = x_q W_q^T + b_q``, ``k = x_k W_k^T + b_k``, ``v = x_v W_v^T + b_v``
    (E wide), each cut into ``num_heads`` heads ``h`` of ``D = E / num_heads``
    values; the softmax runs over the key positions.  ``M`` is 0, or with
    ``causal`` -inf where a key position comes after the query position.

    Bottoms, batch first: one (N, T, E) (self-attention: x_q = x_k = x_v), or
    three, query (N, T_q, E), key (N, T_k, E) and value (N, T_k, E).  Top:
    (N, T_q, E).  Every bottom receives gradients.  Not in place.  On the
    CPU in float32 oneDNN runs the projections and the softmax.

    Learnable, as PyTorch's ``nn.MultiheadAttention`` stores them (its
    weights copy over as they are): in_proj_weight (3E, E), the rows W_q, W_k,
    W_v; in_proj_bias (3E,); out_proj weight W_o (E, E); out_proj bias (E,);
    without ``bias_term`` the two weights only.  Weights default to xavier
    with AVERAGE (PyTorch's init of in_proj_weight), biases to 0.

    Example (a decoder's masked self-attention over (N, T, E) tokens)::

        - name: attn
          type: MultiHeadAttention
          bottom: tokens
          top: attn
          multi_head_attention_param: {num_heads: 8, causal: true}
    """

    type = "MultiHeadAttention"
    param_blocks = {"multi_head_attention_param": MultiHeadAttentionParams}
    num_bottoms = (1, 3)

    @property
    def params(self) -> MultiHeadAttentionParams:
        """The multi_head_attention_param block."""
        return self.block("multi_head_attention_param")

    def dims(self, bottom_shapes) -> tuple[int, int, int, int]:
        """``(N, T_q, T_k, E)``, validated; the errors name the bottom or parameter at fault."""
        heads = self.params.num_heads
        if heads is None or heads <= 0:
            raise ParamError("multi_head_attention_param.num_heads", f"must be a positive integer, got {heads}")
        if len(bottom_shapes) == 2:
            raise ShapeError("MultiHeadAttention takes 1 bottom (self-attention) or 3 (query, key, value), got 2",
                             "bottom")
        shapes = [tuple(shape) for shape in bottom_shapes]
        for name, role, shape in zip(self.spec.bottoms, ROLES if len(shapes) == 3 else ("x",), shapes):
            if len(shape) != 3:
                raise ShapeError(f"bottom '{name}' ({role}) has shape {shape}: expected (N, T, E), batch first")
        n, tq, e = shapes[0]
        for name, role, shape in zip(self.spec.bottoms[1:], ROLES[1:], shapes[1:]):
            if (shape[0], shape[2]) != (n, e):
                raise ShapeError(f"bottom '{name}' ({role}) has shape {shape}: expected N = {n} and E = {e}, as the "
                                 f"query {shapes[0]}")
        tk = shapes[-1][1]
        if len(shapes) == 3 and shapes[1][1] != tk:
            raise ShapeError(f"the key '{self.spec.bottoms[1]}' {shapes[1]} and the value '{self.spec.bottoms[2]}' "
                             f"{shapes[2]} must have one length T_k")
        if e % heads:
            raise ShapeError(f"{heads} heads do not divide the embedding size E = {e}",
                             "multi_head_attention_param.num_heads")
        if self.params.causal and tq != tk:
            raise ShapeError(f"causal needs the query and the key of one length, got T_q = {tq} and T_k = {tk}",
                             "multi_head_attention_param.causal")
        return n, tq, tk, e

    def top_shapes(self, bottom_shapes):
        n, tq, _, e = self.dims(bottom_shapes)
        return [(n, tq, e)]

    def param_shapes(self, bottom_shapes):
        e = self.dims(bottom_shapes)[3]
        if self.params.bias_term:
            return [(3 * e, e), (3 * e,), (e, e), (e,)]
        return [(3 * e, e), (e, e)]

    def param_fillers(self):
        p = self.params
        fillers = [p.weight_filler, p.bias_filler] if p.bias_term else [p.weight_filler]
        return fillers * 2  # in projection, then out projection

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        n, tq, tk, e = self.dims(bottom_shapes)
        projected = n * (2 * tq + 2 * tk) * e  # the values of q and the output (T_q rows), of k and v (T_k)
        return 2 * projected * e + 4 * n * tq * tk * e + (projected if self.params.bias_term else 0)

    def blob_indices(self) -> tuple[int, int | None, int, int | None]:
        """Where in ``blobs`` the in-projection weight and bias and the out-projection weight and bias are
        (None: no bias)."""
        return (0, 1, 2, 3) if self.params.bias_term else (0, None, 1, None)

    @staticmethod
    def sources(count: int) -> list[tuple[int, int, int]]:
        """``(bottom index, first, how many)`` of q, k, v (in_proj_weight's blocks of E rows) for each of ``count``
        bottoms: one bottom makes all three in one product."""
        return [(0, 0, 3)] if count == 1 else [(i, i, 1) for i in range(3)]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        n, tq, tk, e = self.dims([b.shape for b in bottom])
        self.mask = self.xp.triu(self.xp.full((tq, tq), -math.inf, dtype=self.dtype), 1) if self.params.causal else None
        sources = self.sources(len(bottom))
        self.source_rows = [slice(first * e, (first + parts) * e) for _, first, parts in sources]  # of in_proj
        bias, heads = self.params.bias_term, self.params.num_heads
        product = primitives.InnerProduct
        self.fast = onednn.attempt(self, lambda lib: AttentionPrimitives(
            [product(lib, n * bottom[index].shape[1], e, parts * e, bias) for index, _, parts in sources],
            product(lib, n * tq, e, e, bias), primitives.Softmax(lib, (n, heads, tq, tk), 3)))

    def projection(self, source: int | None) -> tuple:
        """The input projection of ``source`` (an index into :meth:`sources`), or the output projection (None):
        ``(oneDNN's primitive or None, W, W's diff, b, b's diff, learn)``, with W and b views of the blobs' rows
        (b and its diff None without bias) and ``learn`` their param_propagate_down."""
        w_in, b_in, w_out, b_out = self.blob_indices()
        weights, bias, rows = (w_out, b_out, slice(None)) if source is None else (w_in, b_in, self.source_rows[source])
        primitive = None
        if self.fast is not None:
            primitive = self.fast.output if source is None else self.fast.projections[source]
        w = self.blobs[weights]
        if bias is None:
            return primitive, w.data[rows], w.diff[rows], None, None, [self.param_propagate_down[weights], False]
        b = self.blobs[bias]
        return (primitive, w.data[rows], w.diff[rows], b.data[rows], b.diff[rows],
                [self.param_propagate_down[weights], self.param_propagate_down[bias]])

    def project(self, source: int | None, x, out) -> None:
        """``out = x W^T + b`` for the :meth:`projection` of ``source``."""
        primitive, w, _, b, _, _ = self.projection(source)
        if primitive is not None:
            primitive.forward(x, w, b, out)
            return
        blas.product(self.backend, x, w, out, transpose_b=True)
        if b is not None:
            out += b

    def project_backward(self, source: int | None, x, dy, dx) -> None:
        """:meth:`project`'s backward from the output's gradient ``dy``: W's and b's gradients added to their
        diffs where param_propagate_down says, x's written into ``dx`` (None: not wanted)."""
        primitive, w, w_diff, _, b_diff, learn = self.projection(source)
        if primitive is not None:
            primitive.accumulate(x, dy, dx, w, w_diff, b_diff, learn)
            return
        if learn[0]:
            blas.product(self.backend, dy, x, w_diff, transpose_a=True, add=True)
        if b_diff is not None and learn[1]:
            blas.sums(self.backend, dy, self.backend.ones(dy.shape[0], dy.dtype), b_diff, axis=0, add=True)
        if dx is not None:
            blas.product(self.backend, dy, w, dx)

    def forward(self, bottom, top):
        xp = self.xp
        n, _, e = bottom[0].shape
        heads = self.params.num_heads
        projections = []
        for source, (index, _, parts) in enumerate(self.sources(len(bottom))):
            x = bottom[index].data.reshape(-1, e)
            projected = xp.empty((x.shape[0], parts * e), dtype=self.dtype)
            self.project(source, x, projected)
            projections.extend(split_heads(projected, n, parts, heads))
        q, k, v = projections  # (N, heads, T, D) views
        q *= 1 / math.sqrt(e // heads)
        scores = xp.empty((*q.shape[:-1], k.shape[-2]), dtype=self.dtype)  # (N, heads, T_q, T_k)
        blas.matmul(self.backend, q, k.swapaxes(-1, -2), scores)
        if self.mask is not None:
            scores += self.mask
        if self.fast is not None:
            self.fast.softmax.forward(scores, scores)
        else:
            rows = scores.reshape(-1, scores.shape[-1], 1)
            softmax(xp, rows, rows)
        self.q, self.k, self.v, self.attention = q, k, v, scores  # what backward needs
        self.context = xp.empty((scores.shape[0] * scores.shape[2], e), dtype=self.dtype)  # (N * T_q, E)
        blas.matmul(self.backend, scores, v, split_heads(self.context, n, 1, heads)[0])
        self.project(None, self.context, top[0].data.reshape(-1, e))

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        n, _, e = bottom[0].shape
        heads = self.params.num_heads
        d_context = xp.empty_like(self.context)
        self.project_backward(None, self.context, top[0].diff.reshape(-1, e), d_context)
        d_context = split_heads(d_context, n, 1, heads)[0]
        p = self.attention
        d_scores = xp.empty_like(p)
        blas.matmul(self.backend, d_context, self.v.swapaxes(-1, -2), d_scores)
        # the softmax's backward: sum_j p_ij dp_ij = d_context_i . context_i, as context_i = sum_j p_ij v_j
        d_scores -= (d_context * split_heads(self.context, n, 1, heads)[0]).sum(axis=-1, keepdims=True)
        d_scores *= p
        for source, (index, first, parts) in enumerate(self.sources(len(bottom))):
            x = bottom[index].data.reshape(-1, e)
            d_projected = xp.empty((x.shape[0], parts * e), dtype=self.dtype)  # the gradients of q, k, v's rows
            for role, view in zip(ROLES[first:first + parts], split_heads(d_projected, n, parts, heads)):
                if role == "query":
                    blas.matmul(self.backend, d_scores, self.k, view)
                    view *= 1 / math.sqrt(e // heads)
                elif role == "key":
                    blas.matmul(self.backend, d_scores.swapaxes(-1, -2), self.q, view)  # (q was scaled in forward)
                else:
                    blas.matmul(self.backend, p.swapaxes(-1, -2), d_context, view)
            dx = bottom[index].diff.reshape(-1, e) if propagate_down[index] else None
            self.project_backward(source, x, d_projected, dx)
