"""BatchReindex: rows of a blob picked by index; ``row_indices``, the check of indices stored as floats, and
``take_rows``/``add_rows``, rows picked and their gradients added back (Embed's too).

Caffe's Filter is not here: its top's first axis is the number of nonzero
selector values, known only once data exists, while netspec's graph fixes every
blob's shape (and the layers after it build their fast paths for it) before any
array exists.
"""

from __future__ import annotations

import math

import numpy

from netspec import threads
from netspec.engine.layer import Layer, checked_indices
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError

THREADED_BYTES = 1 << 23  # rows taken from which a CPU gather runs on every core (2 cores: 4 MiB, slower)

def row_indices(layer: Layer, values, rows: int, bottom: int, of_what: str):
    """``values`` (indices stored as floats, as Caffe stores them) as int64 indices into ``rows`` rows.

    A value that is not a whole number in [0, rows) (-1, 1.5, 1e30, NaN) is a
    DataError naming the layer, the bottom and the value, never truncated or
    wrapped; ``of_what`` says what the indices pick rows of.
    """
    if not layer.backend.is_gpu:
        indices = whole_rows(values, rows)
        if indices is not None:
            return indices

    def describe(value, count: int) -> str:
        return (f"layer '{layer.name}': index {value} of bottom '{layer.spec.bottoms[bottom]}' is not a row of "
                f"{of_what}, a whole number 0 to {rows - 1} ({count} such {'index' if count == 1 else 'indices'} in "
                "the batch)")

    return checked_indices(layer, values, rows, describe)


def whole_rows(values, rows: int):
    """On the CPU, ``values`` as int64 when every one is a whole number in [0, rows); None when one is not (or
    there are none): then :func:`checked_indices` finds and names it.  A few passes over the values, where
    finding the bad ones takes a dozen."""
    if not values.size or not (values.min() >= 0 and values.max() < rows):  # (a NaN fails both comparisons)
        return None
    if not (numpy.trunc(values) == values).all():
        return None
    return values.astype(numpy.int64)  # (whole numbers in range: exact)


def take_rows(layer: Layer, source, indices, out, bias=None) -> None:
    """``out[...] = source[indices] (+ bias)``: rows of ``source`` along its first axis, at ``indices`` that
    :func:`row_indices` checked, and ``bias`` added to each where given.

    On the CPU NumPy's take writes them into ``out`` without a temporary (its mode 'clip', as 'raise' would check
    the indices again through a buffer; the indices are valid), and the bias is added in place, on every core
    (a part of the rows each) where they are many enough to pay for the hand-off (:data:`THREADED_BYTES`)."""
    if layer.backend.is_gpu:
        out[...] = source[indices] if bias is None else source[indices] + bias
        return
    picks, rows = indices.reshape(-1), out.reshape((indices.size, *source.shape[1:]))

    def take(part: slice) -> None:
        numpy.take(source, picks[part], axis=0, out=rows[part], mode="clip")
        if bias is not None:
            rows[part] += bias

    if out.nbytes >= THREADED_BYTES:
        threads.in_parts(picks.size, take)
    else:
        take(slice(0, picks.size))


def add_rows(layer: Layer, target, indices, rows) -> None:
    """``target[indices[i]] += rows[i]`` along the first axis of ``target`` (C-contiguous), a row picked twice
    receiving both, added in the same order on every run.

    On the CPU NumPy's ``add.at`` does it over the flattened arrays (its fast path takes one-dimensional
    indices).  On a GPU ``add.at`` adds atomically, in an order that changes from run to run, so a resumed
    training would part from an uninterrupted one: there the rows are sorted by index (a stable sort) and summed
    in that order as running sums in float64; each index's total (the running sum at its last row less the one
    before its first) is added at its last row, zeros at the others, so every atomic add but one per target row
    adds an exact zero and the order no longer matters.  The work grows with the rows picked, not with
    ``target``'s (a vocabulary's) rows.
    """
    xp = layer.xp
    picks = indices.reshape(-1)
    width = math.prod(target.shape[1:])
    if not layer.backend.is_gpu:
        flat = (picks.reshape(-1, 1) * width + xp.arange(width)).reshape(-1)
        xp.add.at(target.reshape(-1), flat, rows.reshape(-1))
        return
    order = xp.argsort(picks, kind="stable")
    in_order = picks[order]
    running = xp.zeros((picks.size + 1, width), dtype=numpy.float64)
    xp.cumsum(rows.reshape(picks.size, width)[order], axis=0, dtype=numpy.float64, out=running[1:])
    first = xp.searchsorted(in_order, in_order, "left")  # where each row's index begins in the sorted order
    last = xp.concatenate([in_order[1:] != in_order[:-1], xp.ones(1, dtype=bool)])  # ... and whether it ends there
    totals = (running[1:] - running[first]) * last.reshape(-1, 1)
    xp.add.at(target.reshape(target.shape[0], width), in_order, totals.astype(target.dtype))


@register_layer
class BatchReindex(Layer):
    """BatchReindex: ``y[i] = x[indices[i]]``, rows of x along the first axis in any order, repeats allowed.

    Bottoms: x (N, ...) and indices (M,): whole numbers 0 to N-1 stored as
    floats (anything else is a DataError naming the layer and the value).
    Top: (M, ...).  The gradient of x adds the top's rows back where they came
    from (a row taken twice gets both), rows never taken get 0; the indices
    take none.  Not in place.

    Example::

        - {name: shuffled, type: BatchReindex, bottom: [features, permutation], top: shuffled}
    """

    type = "BatchReindex"
    num_bottoms = (2, 2)
    label_bottoms = (1,)

    def top_shapes(self, bottom_shapes):
        x, indices = bottom_shapes
        if not x:
            raise ShapeError(f"bottom '{self.spec.bottoms[0]}' has no axes: BatchReindex picks rows of its first axis")
        if len(indices) != 1:
            raise ShapeError(f"index bottom '{self.spec.bottoms[1]}' has shape {indices}: expected one axis "
                             f"(the rows of '{self.spec.bottoms[0]}' to take, in order)")
        return [indices + x[1:]]

    def forward(self, bottom, top):
        x = bottom[0]
        self.indices = row_indices(self, bottom[1].data, x.shape[0], 1, f"bottom '{self.spec.bottoms[0]}'")
        take_rows(self, x.data, self.indices, top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 0
            add_rows(self, bottom[0].diff, self.indices, top[0].diff)
        if propagate_down[1]:
            bottom[1].diff[...] = 0
