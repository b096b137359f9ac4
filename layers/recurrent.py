"""RNN and LSTM: Caffe's recurrent layers, unrolled over a time-major sequence, with backpropagation through time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from netspec.engine import blas, onednn, primitives
from netspec.engine.fillers import FillerParams
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import doc, required


@dataclass
class RecurrentParams:
    """Parameters of RNN and LSTM (Caffe's RecurrentParameter)."""

    num_output: int = required(doc="size of the hidden state (and of the output at each step)")
    weight_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "init of every weight"})
    bias_filler: FillerParams = field(default_factory=FillerParams, metadata={"doc": "init of every bias"})
    debug_info: bool = doc(False, "Caffe's debug output of the unrolled net; accepted and ignored")
    expose_hidden: bool = doc(False, "take the initial hidden state(s) as extra bottoms and give the final "
                                     "ones as extra tops")


class Recurrent(Layer):
    """Base of RNN and LSTM: bottoms, tops, the state carried between passes, the shared shape checks.

    A subclass names its ``states`` (``("h",)``, ``("h", "c")``) and ``gates``
    (how many H-sized blocks its input transform has) and implements
    ``run_forward``/``run_backward`` on the flattened arrays.
    """

    param_blocks = {"recurrent_param": RecurrentParams}
    num_bottoms = (2, 5)
    num_tops = (1, 3)
    label_bottoms = (1,)  # cont: indicators, no gradient
    states: ClassVar[tuple[str, ...]] = ()
    gates: ClassVar[int] = 1

    @property
    def params(self) -> RecurrentParams:
        """The recurrent_param block."""
        return self.block("recurrent_param")

    def hidden(self) -> int:
        """num_output, checked."""
        value = self.params.num_output
        if value is None or value <= 0:
            raise ParamError("recurrent_param.num_output", f"must be a positive integer, got {value}")
        return value

    def exposed(self) -> int:
        """How many state bottoms (and tops) expose_hidden adds."""
        return len(self.states) if self.params.expose_hidden else 0

    def has_static(self, count: int) -> bool:
        """Whether ``count`` bottoms include the static input x_static (Caffe's rule: one beyond the others)."""
        base = 2 + self.exposed()
        if count not in (base, base + 1):
            states = ", ".join(f"{s}0" for s in self.states)
            expected = (f"x, cont, optionally x_static, then {states} (expose_hidden is on)" if self.exposed()
                        else "x, cont and optionally x_static (expose_hidden is off)")
            raise ParamError("recurrent_param.expose_hidden",
                             f"{self.type} takes {expected}: {base} or {base + 1} bottoms, got {count}")
        return count == base + 1

    def check_shapes(self, bottom_shapes) -> tuple[int, int, int, int | None]:
        """``(T, N, inputs per step, static inputs or None)``; ShapeError names the bottom at fault."""
        names = self.spec.bottoms
        static = self.has_static(len(bottom_shapes))
        x = tuple(bottom_shapes[0])
        if len(x) < 2:
            raise ShapeError(f"bottom '{names[0]}' (x) has shape {x}: expected (T, N, ...), time first")
        steps, batch = x[0], x[1]
        cont = tuple(bottom_shapes[1])
        if cont != (steps, batch):
            raise ShapeError(f"bottom '{names[1]}' (cont, the sequence-continuation indicators) has shape {cont}: "
                             f"expected (T, N) = {(steps, batch)}, one indicator per step of x {x}")
        static_size = None
        if static:
            shape = tuple(bottom_shapes[2])
            if len(shape) < 1 or shape[0] != batch:
                raise ShapeError(f"bottom '{names[2]}' (x_static) has shape {shape}: expected (N, ...) with N = "
                                 f"{batch}, as x {x}")
            static_size = math.prod(shape[1:])
        first = 2 + int(static)
        for offset, state in enumerate(self.states[:self.exposed()]):
            shape = tuple(bottom_shapes[first + offset])
            expected = (1, batch, self.hidden())
            if shape != expected:
                raise ShapeError(f"bottom '{names[first + offset]}' ({state}0, the initial state) has shape "
                                 f"{shape}: expected (1, N, num_output) = {expected}")
        return steps, batch, math.prod(x[2:]), static_size

    def top_shapes(self, bottom_shapes):
        steps, batch, _, _ = self.check_shapes(bottom_shapes)
        tops = 1 + self.exposed()
        if len(self.spec.tops) != tops:
            raise ParamError("recurrent_param.expose_hidden",
                             f"{self.type} gives {tops} top(s) here (the outputs"
                             f"{', then the final ' + ', '.join(s + '_T' for s in self.states) if tops > 1 else ''})"
                             f", got {len(self.spec.tops)}")
        h = self.hidden()
        return [(steps, batch, h)] + [(1, batch, h)] * self.exposed()

    def param_shapes(self, bottom_shapes):
        _, _, inputs, static = self.check_shapes(bottom_shapes)
        rows = self.gates * self.hidden()
        shapes = [(rows, inputs), (rows,)]
        if static is not None:
            shapes.append((rows, static))
        return shapes + [(rows, self.hidden())] + self.output_shapes()

    def output_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the blobs after the recurrent weights (RNN's output transform)."""
        return []

    def param_fillers(self):
        p = self.params
        return [p.bias_filler if len(shape) == 1 else p.weight_filler for shape in self.param_shapes_cache]

    def flops(self, bottom_shapes, top_shapes, param_shapes):
        steps, batch, _, _ = self.check_shapes(bottom_shapes)
        weights = sum(math.prod(s) for s in param_shapes if len(s) == 2)
        return 2 * steps * batch * weights + 10 * math.prod(top_shapes[0])

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        batch = bottom[0].shape[1]
        if getattr(self, "carried", None) is None or self.carried[0].shape[0] != batch:
            # the states a pass without expose_hidden starts from: the last pass's final ones, as in Caffe
            self.carried = [self.xp.zeros((batch, self.hidden()), dtype=self.dtype) for _ in self.states]

    # ---- the passes -----------------------------------------------------------------------
    def forward(self, bottom, top):
        steps, batch = bottom[0].shape[:2]
        self.static = self.has_static(len(bottom))
        self.x = bottom[0].data.reshape(steps, batch, -1)
        self.cont = bottom[1].data.reshape(steps, batch, 1)
        self.x_static = bottom[2].data.reshape(batch, -1) if self.static else None
        first = 2 + int(self.static)
        if self.exposed():
            initial = [b.data.reshape(batch, -1).copy() for b in bottom[first:first + len(self.states)]]
        else:
            initial = [state.copy() for state in self.carried]
        final = self.run_forward(initial, top[0].data)
        if self.exposed():
            for blob, state in zip(top[1:], final):
                blob.data[...] = state.reshape(blob.shape)
        else:
            for kept, state in zip(self.carried, final):
                kept[...] = state

    def input_weights(self):
        """``(W_x, b, W_static or None, W_h)`` and the index of W_h among the blobs."""
        w_static = self.blobs[2].data if self.static else None
        recurrent = 3 if self.static else 2
        return self.blobs[0].data, self.blobs[1].data, w_static, self.blobs[recurrent].data, recurrent

    def input_transform(self):
        """``W_x x_t + b (+ W_static x_static)`` for every step: (T, N, gates * H), from one matrix product."""
        xp = self.xp
        w_x, b, w_static, _, _ = self.input_weights()
        steps, batch, inputs = self.x.shape
        pre = xp.empty((steps * batch, w_x.shape[0]), dtype=self.dtype)
        blas.product(self.backend, self.x.reshape(steps * batch, inputs), w_x, pre, transpose_b=True)
        pre += b
        pre = pre.reshape(steps, batch, -1)
        if w_static is not None:
            static = xp.empty((batch, w_static.shape[0]), dtype=self.dtype)
            blas.product(self.backend, self.x_static, w_static, static, transpose_b=True)
            pre += static
        return pre

    def recurrent_weights(self):
        """W_h transposed, (H, gates * H), C-contiguous: the product at every step runs faster than on a view."""
        return self.xp.ascontiguousarray(self.input_weights()[3].T)

    def previous_outputs(self):
        """What W_h multiplies at every step, ``cont_t * h_{t-1}`` (T, N, H), from the last forward pass."""
        return self.xp.concatenate([self.initial_h[None], self.h[:-1]]) * self.cont

    def backward(self, top, propagate_down, bottom):
        steps, batch = bottom[0].shape[:2]
        final_diffs = ([t.diff.reshape(batch, -1) for t in top[1:]] if self.exposed()
                       else [None] * len(self.states))
        d_pre, d_initial = self.run_backward(top[0].diff, final_diffs)
        # d_pre: gradient of every step's pre-activation (T, N, gates * H); d_initial: of each initial state
        _, _, w_static, w_h, recurrent = self.input_weights()
        flat = d_pre.reshape(steps * batch, -1)
        d_static = d_pre.sum(axis=0) if self.static else None  # (the static input's pre-activations' gradient)
        if self.param_propagate_down[0]:
            inputs = self.x.reshape(steps * batch, -1)
            blas.product(self.backend, flat, inputs, self.blobs[0].diff, transpose_a=True, add=True)
        if self.param_propagate_down[1]:
            self.blobs[1].diff += flat.sum(axis=0)
        if self.static and self.param_propagate_down[2]:
            blas.product(self.backend, d_static, self.x_static, self.blobs[2].diff, transpose_a=True, add=True)
        if self.param_propagate_down[recurrent]:
            previous = self.previous_outputs().reshape(steps * batch, -1)
            blas.product(self.backend, flat, previous, self.blobs[recurrent].diff, transpose_a=True, add=True)
        if propagate_down[0]:
            blas.product(self.backend, flat, self.blobs[0].data, bottom[0].diff.reshape(steps * batch, -1))
        if propagate_down[1]:
            bottom[1].diff[...] = 0
        if self.static and propagate_down[2]:
            blas.product(self.backend, d_static, w_static, bottom[2].diff.reshape(batch, -1))
        first = 2 + int(self.static)
        for offset in range(self.exposed()):
            if propagate_down[first + offset]:
                bottom[first + offset].diff[...] = d_initial[offset].reshape(bottom[first + offset].shape)

    def run_forward(self, initial, out):
        """Run every step from the ``initial`` states (N, H) each, write the outputs to ``out`` (T, N, H),
        keep what backward needs, and return the final states."""
        raise NotImplementedError

    def run_backward(self, d_out, final_diffs):
        """``(gradient of the pre-activations (T, N, gates * H), gradients of the initial states)`` from the
        outputs' gradient and the final states' (None where they have none)."""
        raise NotImplementedError


@register_layer
class RNN(Recurrent):
    """RNN: Caffe's simple recurrent layer, over a time-major sequence.

    At every step t::

        h_t = tanh(W_hh (cont_t * h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static])
        o_t = tanh(W_ho h_t + b_o)

    Bottoms: x (T, N, ...) time first, the values after N of each step
    forming its input vector (I values); cont (T, N), the sequence-continuation
    indicators: 0 at the first step of a sequence drops the previous hidden
    state, 1 carries it on; optionally x_static (N, ...), one input per
    sequence added at every step.  With ``expose_hidden``: then h_0
    (1, N, num_output), the initial state.  Tops: o (T, N, num_output), and
    with ``expose_hidden`` h_T (1, N, num_output), the final state.  Without
    ``expose_hidden`` each pass starts from the final state of the one before
    (zeros at first), as Caffe does, so ``cont = 1`` at t = 0 continues a
    sequence across batches (truncated backpropagation through time; no
    gradient flows into the previous batch).  Learnable, in Caffe's order
    (so Caffe's weights load): W_xh (H, I), b_h (H,), W_xh_static (H, I_static)
    with x_static, W_hh (H, H), W_ho (H, H), b_o (H,).  The weights start from
    ``weight_filler``, the biases from ``bias_filler`` (constant 0 by
    default).  cont takes no gradient; everything else is backpropagated
    through time.  Not in place.

    Example::

        - name: rnn
          type: RNN
          bottom: [embedded, cont]
          top: rnn
          recurrent_param: {num_output: 128, weight_filler: {type: uniform, min: -0.08, max: 0.08}}
    """

    type = "RNN"
    states = ("h",)
    gates = 1

    def output_shapes(self):
        h = self.hidden()
        return [(h, h), (h,)]

    def run_forward(self, initial, out):
        xp = self.xp
        self.h = self.input_transform()  # each step's pre-activation, turned into its state in place
        steps, batch, size = self.h.shape
        w_h = self.recurrent_weights()
        self.initial_h = previous = initial[0]
        for t in range(steps):
            h = self.h[t]
            blas.product(self.backend, self.cont[t] * previous, w_h, h, add=True)
            xp.tanh(h, out=h)
            previous = h
        w_o, b_o = self.blobs[-2].data, self.blobs[-1].data
        self.o = xp.empty((steps * batch, w_o.shape[0]), dtype=self.dtype)
        blas.product(self.backend, self.h.reshape(steps * batch, size), w_o, self.o, transpose_b=True)
        self.o += b_o
        xp.tanh(self.o, out=self.o)
        self.o = self.o.reshape(out.shape)
        out[...] = self.o
        return [previous]

    def run_backward(self, d_out, final_diffs):
        xp = self.xp
        steps, batch, size = self.h.shape
        d_o = d_out * (1 - self.o * self.o)
        w_o = self.blobs[-2].data
        if self.param_propagate_down[-2]:
            blas.product(self.backend, d_o.reshape(-1, size), self.h.reshape(-1, size), self.blobs[-2].diff,
                         transpose_a=True, add=True)
        if self.param_propagate_down[-1]:
            self.blobs[-1].diff += d_o.reshape(-1, size).sum(axis=0)
        d_h = xp.empty(d_o.shape, dtype=self.dtype)
        blas.product(self.backend, d_o.reshape(-1, size), w_o, d_h.reshape(-1, size))
        if final_diffs[0] is not None:
            d_h[-1] += final_diffs[0]
        w_h = self.input_weights()[3]
        d_pre = xp.empty_like(d_h)
        carried = xp.zeros((batch, size), dtype=self.dtype)
        step = xp.empty((batch, size), dtype=self.dtype)
        for t in range(steps - 1, -1, -1):
            d_pre[t] = (d_h[t] + carried) * (1 - self.h[t] * self.h[t])
            blas.product(self.backend, d_pre[t], w_h, step)
            carried = self.cont[t] * step
        return d_pre, [carried]


@register_layer
class LSTM(Recurrent):
    """LSTM: Caffe's long short-term memory layer, over a time-major sequence.

    At every step t, with the gates stacked in Caffe's order i, f, o, g::

        [i, f, o, g]_t = W_hc (cont_t * h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static]
        i, f, o = sigmoid(i, f, o);  g = tanh(g)
        c_t = cont_t * f_t * c_{t-1} + i_t * g_t
        h_t = o_t * tanh(c_t)

    Bottoms: x (T, N, ...) time first, the values after N of each step
    forming its input vector (I values); cont (T, N), the sequence-continuation
    indicators: 0 at the first step of a sequence drops the previous h and c,
    1 carries them on; optionally x_static (N, ...), one input per sequence
    added at every step.  With ``expose_hidden``: then h_0 and c_0
    (1, N, num_output each), the initial states.  Tops: h (T, N, num_output),
    and with ``expose_hidden`` h_T and c_T (1, N, num_output each), the final
    states.  Without ``expose_hidden`` each pass starts from the final states
    of the one before (zeros at first), as Caffe does, so ``cont = 1`` at
    t = 0 continues a sequence across batches (no gradient flows into the
    previous batch).  Learnable, in Caffe's order (so Caffe's weights load):
    W_xc (4H, I), b_c (4H,), W_xc_static (4H, I_static) with x_static, W_hc
    (4H, H).  The weights start from ``weight_filler``, the bias from
    ``bias_filler`` (constant 0 by default).  cont takes no gradient;
    everything else is backpropagated through time.  Not in place.  On the
    CPU in float32, where no sequence restarts after the first step (cont is
    1 from t = 1 on), oneDNN's LSTM primitive runs the forward pass
    (``NETSPEC_ONEDNN=0``: NumPy), and backward recomputes the gates from
    its outputs; elsewhere NumPy (or CuPy) runs the steps one by one.

    Example::

        - name: lstm
          type: LSTM
          bottom: [embedded, cont]
          top: lstm
          recurrent_param: {num_output: 256, weight_filler: {type: uniform, min: -0.08, max: 0.08}}
    """

    type = "LSTM"
    states = ("h", "c")
    gates = 4

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        steps, batch, inputs, static = self.check_shapes([b.shape for b in bottom])
        inputs += static or 0
        size = self.hidden()
        # oneDNN's LSTM, and the product of the gates' inputs (stacked) and weights that backward recomputes after it
        built = onednn.attempt(self, lambda lib: (
            primitives.LongShortTermMemory(lib, steps, batch, inputs, size),
            primitives.InnerProduct(lib, steps * batch, inputs + size, 4 * size, bias=True)))
        self.fast, self.replayer = built or (None, None)

    def run_forward(self, initial, out):
        self.initial_h, self.initial_c = initial
        if self.fast is not None and bool((self.cont[1:] == 1).all()):
            return self.forward_onednn(out)
        xp = self.xp
        size = self.hidden()
        self.acts = self.input_transform()  # each step's gates, turned in place into i, f, o (sigmoid), g (tanh)
        steps, batch, _ = self.acts.shape
        w_h = self.recurrent_weights()
        self.c = xp.empty(out.shape, dtype=self.dtype)
        self.tanh_c = xp.empty(out.shape, dtype=self.dtype)
        masked = xp.empty((batch, size), dtype=self.dtype)  # cont_t * h_{t-1}
        product = xp.empty((batch, 4 * size), dtype=self.dtype)
        h, c = initial
        for t in range(steps):
            acts = self.acts[t]
            xp.multiply(self.cont[t], h, out=masked)
            blas.product(self.backend, masked, w_h, product)
            acts += product
            self.activate(acts)
            c = self.cell(t, c)
            h = out[t]
            xp.multiply(acts[:, 2 * size:3 * size], self.tanh_c[t], out=h)
        self.h = out.copy()
        return [self.h[-1], c]

    def forward_onednn(self, out):
        """The forward pass through oneDNN's LSTM, where no sequence restarts after the first step (``cont`` is 1
        there; at the first step cont scales the initial states): only the outputs are kept, and backward
        recomputes the gates from them (:meth:`replay`)."""
        xp = self.xp
        x, w_x = self.stacked(recurrent=False)
        _, b, _, w_h, _ = self.input_weights()
        first = self.cont[0]
        final = [xp.empty_like(state) for state in (self.initial_h, self.initial_c)]
        self.fast.forward(x, w_x, w_h, b, first * self.initial_h, first * self.initial_c, out, *final)
        self.h = None if self.inference else out.copy()  # (backward's replay reads the outputs; no backward here)
        self.acts = None  # (the gates: replay computes them when backward needs them)
        return final

    def stacked(self, recurrent: bool):
        """What multiplies the weights at every step, side by side: ``[x_t, x_static, cont_t h_{t-1}]`` (T, N, K),
        with x_static where there is one and ``cont_t h_{t-1}`` when ``recurrent``; and those weights, side by
        side as well (4H, K)."""
        w_x, _, w_static, w_h, _ = self.input_weights()
        parts, weights = [self.x], [w_x]
        if w_static is not None:
            parts.append(self.xp.broadcast_to(self.x_static, (*self.x.shape[:2], self.x_static.shape[1])))
            weights.append(w_static)
        if recurrent:
            parts.append(self.previous_outputs())
            weights.append(w_h)
        if len(parts) == 1:
            return self.x, w_x
        return self.xp.concatenate(parts, axis=2), self.xp.concatenate(weights, axis=1)

    def replay(self) -> None:
        """Every step's activated gates, c_t and tanh(c_t) after a forward pass through oneDNN, which kept only the
        outputs: with each h_{t-1} known, the gates' pre-activations of all the steps are one matrix product
        (on oneDNN's threads), and only the cells' elementwise recurrence runs step by step."""
        xp = self.xp
        steps, batch, size = self.h.shape
        rows, weights = self.stacked(recurrent=True)
        self.acts = xp.empty((steps, batch, 4 * size), dtype=self.dtype)
        self.replayer.forward(rows.reshape(steps * batch, -1), weights, self.input_weights()[1],
                              self.acts.reshape(steps * batch, -1))
        self.activate(self.acts)
        self.c = xp.empty(self.h.shape, dtype=self.dtype)
        self.tanh_c = xp.empty(self.h.shape, dtype=self.dtype)
        c = self.initial_c
        for t in range(steps):
            c = self.cell(t, c)

    def cell(self, t: int, c):
        """Step ``t``'s cell from the one before, ``c``, and the step's activated gates: ``c_t = cont_t f_t c +
        i_t g_t`` into ``self.c[t]`` (returned), and its tanh into ``self.tanh_c[t]``."""
        size = self.hidden()
        acts, c_t = self.acts[t], self.c[t]
        self.xp.multiply(self.cont[t], acts[:, size:2 * size], out=c_t)
        c_t *= c
        c_t += acts[:, :size] * acts[:, 3 * size:]
        self.xp.tanh(c_t, out=self.tanh_c[t])
        return c_t

    def activate(self, gates) -> None:
        """The gates' non-linearities in place on (..., 4H) pre-activations: the sigmoid on i, f and o, computed
        stably as ``(tanh(x / 2) + 1) / 2``, and tanh on g, through one tanh of every gate."""
        sigmoids = gates[..., :3 * self.hidden()]
        sigmoids *= 0.5
        self.xp.tanh(gates, out=gates)
        sigmoids *= 0.5
        sigmoids += 0.5

    def run_backward(self, d_out, final_diffs):
        xp = self.xp
        if self.acts is None:
            self.replay()
        steps, batch, size = self.h.shape
        w_h = self.input_weights()[3]
        d_pre = xp.empty(self.acts.shape, dtype=self.dtype)
        d_h = xp.empty((batch, size), dtype=self.dtype)
        d_h_next = xp.zeros((batch, size), dtype=self.dtype)
        if final_diffs[0] is not None:
            d_h_next += final_diffs[0]  # h_T's gradient joins h's at the last step
        d_c = xp.zeros((batch, size), dtype=self.dtype) if final_diffs[1] is None else final_diffs[1].copy()
        for t in range(steps - 1, -1, -1):
            cont, acts, tanh_c, d = self.cont[t], self.acts[t], self.tanh_c[t], d_pre[t]
            i, f, o, g = (acts[:, k * size:(k + 1) * size] for k in range(4))
            c_prev = self.c[t - 1] if t > 0 else self.initial_c
            xp.add(d_out[t], d_h_next, out=d_h)
            d_c += d_h * o * (1 - tanh_c * tanh_c)
            # the gates' gradients before their non-linearities: sigmoid' = s (1 - s), tanh' = 1 - g^2
            xp.multiply(d_c, g, out=d[:, :size])
            xp.multiply(d_c, cont, out=d[:, size:2 * size])
            d[:, size:2 * size] *= c_prev
            xp.multiply(d_h, tanh_c, out=d[:, 2 * size:3 * size])
            sigmoids = acts[:, :3 * size]
            d[:, :3 * size] *= sigmoids * (1 - sigmoids)
            xp.multiply(d_c, i, out=d[:, 3 * size:])
            d[:, 3 * size:] *= 1 - g * g
            d_c *= cont
            d_c *= f
            blas.product(self.backend, d, w_h, d_h_next)
            d_h_next *= cont
        return d_pre, [d_h_next, d_c]
