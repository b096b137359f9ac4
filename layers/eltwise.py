"""Eltwise: element-wise SUM (with coefficients), PROD or MAX of equally shaped bottoms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.net_spec import LayerSpec
from netspec.spec.schema import doc


@dataclass
class EltwiseParams:
    """Parameters of Eltwise."""

    operation: Literal["PROD", "SUM", "MAX"] = doc("SUM", "PROD, SUM or MAX")
    coeff: list[float] = doc([], "SUM only: one coefficient per bottom (default all 1)")
    stable_prod_grad: bool = doc(True, "PROD: each bottom's gradient as the product of the others (false: the "
                                       "top over the bottom, NaN where a bottom is 0, as Caffe's option)")


@register_layer
class Eltwise(Layer):
    """Eltwise: ``y = sum_i c_i x_i`` (SUM), ``prod_i x_i`` (PROD) or ``max_i x_i`` (MAX).

    Bottoms: two or more of one shape.  Top: that shape.  MAX follows
    Caffe's loop: the first two bottoms compare as ``x_0 > x_1 ? x_0 : x_1``
    (a tie goes to the second, a NaN in the first is passed over), each later
    bottom replaces the maximum only where strictly greater; the gradient
    goes to the bottom chosen.  Not in place.

    Example::

        - {name: res2a, type: Eltwise, bottom: [res2a_branch1, res2a_branch2c], top: res2a}
    """

    type = "Eltwise"
    takes_held = True
    fast_records = True
    computed_by = ("Convolution",)  # (a residual block's SUM, fused into the convolution before it: Convolution.absorb)
    param_blocks = {"eltwise_param": EltwiseParams}
    num_bottoms = (2, None)

    def top_shapes(self, bottom_shapes):
        p = self.block("eltwise_param")
        if p.coeff and p.operation != "SUM":
            raise ParamError("eltwise_param.coeff", f"coefficients apply to SUM only, not {p.operation}")
        if p.coeff and len(p.coeff) != len(bottom_shapes):
            raise ParamError("eltwise_param.coeff", f"give one coefficient per bottom ({len(bottom_shapes)})")
        for name, shape in zip(self.spec.bottoms[1:], bottom_shapes[1:]):
            if shape != bottom_shapes[0]:
                raise ShapeError(f"bottoms must have one shape: '{self.spec.bottoms[0]}' is {bottom_shapes[0]} "
                                 f"but '{name}' is {shape}")
        return [bottom_shapes[0]]

    @classmethod
    def may_write_over_bottom(cls, spec: LayerSpec) -> bool:
        """A SUM may: it adds the bottom its top is written over first (:meth:`reshape`)."""
        return spec.blocks["eltwise_param"].operation == "SUM"

    def coefficients(self, count: int) -> list[float]:
        """The SUM coefficient of each bottom."""
        return self.block("eltwise_param").coeff or [1.0] * count

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.fast = self.fast_gradients = None
        # the bottoms in the order the sum adds them: first the one whose data the top's is, if any (an
        # inference net's sum written over its shortcut: netspec.graph.memory.sum_aliases)
        self.order = sorted(range(len(bottom)), key=lambda index: not top[0].shares_data(bottom[index]))
        if self.block("eltwise_param").operation == "SUM":
            shape, coeffs = bottom[0].shape, self.coefficients(len(bottom))
            # the sum, and each bottom's gradient as a scaled copy of the top's
            self.fast, self.fast_gradients = onednn.attempt_in(
                self, onednn.common_layout([blob.values for blob in bottom]), lambda lib, layout: (
                    primitives.Sum(lib, shape, [coeffs[index] for index in self.order], layout),
                    [primitives.Sum(lib, shape, [c], layout) for c in coeffs])
            ) or (None, None)
            if self.fast is not None:
                onednn.hold_outputs(self.fast, top)

    def forward(self, bottom, top):
        if self.fast is not None:
            self.fast([bottom[index].values for index in self.order], top[0].values)
            return
        xp = self.xp
        out = top[0].data
        operation = self.block("eltwise_param").operation
        if operation == "SUM":
            coeffs = self.coefficients(len(bottom))
            first, *rest = self.order
            xp.multiply(bottom[first].data, coeffs[first], out=out)
            for index in rest:
                out += bottom[index].data if coeffs[index] == 1 else coeffs[index] * bottom[index].data
        elif operation == "PROD":
            xp.multiply(bottom[0].data, bottom[1].data, out=out)
            for blob in bottom[2:]:
                out *= blob.data
        else:
            first = bottom[0].data > bottom[1].data
            self.argmax = xp.where(first, 0, 1).astype(xp.int32)
            xp.copyto(out, xp.where(first, bottom[0].data, bottom[1].data))
            for index, blob in enumerate(bottom[2:], start=2):
                better = blob.data > out
                xp.copyto(self.argmax, index, where=better)  # (no mask selection: no count read back)
                xp.copyto(out, blob.data, where=better)

    def backward(self, top, propagate_down, bottom):
        if self.fast is not None:
            for index, (blob, wanted) in enumerate(zip(bottom, propagate_down)):
                if wanted:
                    self.fast_gradients[index]([top[0].gradient], blob.gradient)
            return
        dy = top[0].diff
        operation = self.block("eltwise_param").operation
        coeffs = self.coefficients(len(bottom))
        for index, (blob, wanted) in enumerate(zip(bottom, propagate_down)):
            if not wanted:
                continue
            if operation == "SUM":
                self.xp.multiply(dy, coeffs[index], out=blob.diff)
            elif operation == "PROD" and not self.block("eltwise_param").stable_prod_grad:
                self.xp.multiply(dy, top[0].data / blob.data, out=blob.diff)
            elif operation == "PROD":
                others = dy.copy()
                for other_index, other in enumerate(bottom):
                    if other_index != index:
                        others *= other.data
                blob.diff[...] = others
            else:
                self.xp.multiply(dy, self.argmax == index, out=blob.diff)
