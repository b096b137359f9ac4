"""BatchNorm: normalise each channel by batch statistics (TRAIN) or stored ones (TEST)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from netspec.engine import onednn, primitives
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ShapeError
from netspec.spec.schema import doc


@dataclass
class BatchNormParams:
    """Parameters of BatchNorm."""

    use_global_stats: bool | None = doc(None, "use the stored statistics (default: true in TEST, false in TRAIN)")
    moving_average_fraction: float = doc(0.999, "decay of the stored running sums")
    eps: float = doc(1e-5, "added to the variance")
    sync: bool = doc(False, "in a distributed run, take the batch statistics over every rank's batch")


@register_layer
class BatchNorm(Layer):
    """BatchNorm: ``y = (x - mean_c) / sqrt(var_c + eps)``, with no scale or shift (follow it with Scale).

    In TRAIN the mean and (biased) variance are taken over N and the spatial
    axes, and the stored running sums are updated as in Caffe:
    ``f = f * maf + 1``, ``mean_sum = mean_sum * maf + mean``,
    ``var_sum = var_sum * maf + m/(m-1) * var``.  With ``use_global_stats``
    (the default in TEST) ``mean = mean_sum / f`` and ``var = var_sum / f``.
    In a distributed run each rank normalises by its own batch's statistics
    unless ``sync: true``, which takes them (and their gradients) over all
    ranks' batches together, as one process with the whole batch would.

    Bottom/top: (N, C, ...).  Blobs (never trained, saved with the weights):
    mean sums (C,), variance sums (C,), factor f (1,).  Runs in place, and
    keeps its own copy of what backward needs (the normalised output on NumPy,
    the input on oneDNN), since layers after it in place overwrite the top.
    On oneDNN a per-channel Scale in place right after it runs fused with
    it, as one primitive (``netspec time`` names the pair ``bn1+scale1``).

    Example::

        - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
        - {name: scale1, type: Scale, bottom: conv1, top: conv1, scale_param: {bias_term: true}}
    """

    type = "BatchNorm"
    takes_held = True
    fast_records = True
    param_blocks = {"batch_norm_param": BatchNormParams}
    scale_layer = None  # the Scale absorbed (:meth:`absorb`)
    inplace_ok = True
    learnable = False

    def top_shapes(self, bottom_shapes):
        if len(bottom_shapes[0]) < 2:
            raise ShapeError(f"BatchNorm needs a bottom with a channel axis, got shape {bottom_shapes[0]}")
        return [bottom_shapes[0]]

    def param_shapes(self, bottom_shapes):
        channels = bottom_shapes[0][1]
        return [(channels,), (channels,), (1,)]

    @property
    def global_stats(self) -> bool:
        """Whether the stored statistics are used instead of the batch's."""
        given = self.block("batch_norm_param").use_global_stats
        return self.phase == "TEST" if given is None else given

    @property
    def changes_blobs(self) -> bool:
        """Forward passes add to the running sums outside use_global_stats."""
        return not self.global_stats

    @property
    def records(self) -> bool:
        # (the batch's statistics go into the running sums; the stored ones are copied with NumPy at each pass)
        return super().records and self.global_stats and all(onednn.constant(blob.values.stored())
                                                             for blob in self.blobs)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.top_blob = top[0]
        self.layout = onednn.layout_of(bottom[0].values)
        self.fast = self._onednn(bottom[0].shape)
        if self.fast is not None:
            onednn.hold_outputs(self.fast, top)

    def _onednn(self, shape) -> primitives.Normalization | None:
        """oneDNN's primitives for this shape and the layers absorbed, or None for the NumPy path."""
        p = self.block("batch_norm_param")
        if not 2 <= len(shape) <= 5 or (p.sync and self.backend.comm.size > 1):
            return None
        flags = onednn.NORMALIZE_GLOBAL_STATS if self.global_stats else 0
        if self.scale_layer is not None:
            flags |= onednn.NORMALIZE_SCALE | (onednn.NORMALIZE_SHIFT if len(self.scale_layer.blobs) > 1 else 0)
        fast = onednn.attempt_in(self, self.layout, lambda lib, layout: primitives.Normalization(
            lib, shape, p.eps, flags, keeps_input=not self.inference, layout=layout))
        if fast is None:
            return None
        self.shape = shape
        self.mean, self.var = numpy.empty(shape[1], self.dtype), numpy.empty(shape[1], self.dtype)
        return fast

    def absorb(self, following):
        """On oneDNN, a Scale with one factor a channel in place on the top right after this layer runs in the
        same primitive: Caffe's BatchNorm and Scale pair normalised and scaled in one pass.  (ReLU stays its own
        layer: oneDNN's pass for it costs little.)"""
        if self.fast is None or not following:
            return 0
        layer, bottom, tops = following[0]
        if layer.type != "Scale" or bottom != [self.top_blob] or tops != [self.top_blob] or layer.fast is None:
            return 0
        previous, self.scale_layer = self.fast, layer
        self.fast = self._onednn(self.shape)
        if self.fast is None:
            self.scale_layer, self.fast = None, previous
            return 0
        return 1

    def forward(self, bottom, top):
        xp = self.xp
        p = self.block("batch_norm_param")
        channels = bottom[0].shape[1]
        if self.global_stats:
            mean, var = self.stored_statistics()
        if self.fast is not None:
            if self.global_stats:
                self.mean[...], self.var[...] = mean, var
            self.fast.forward(bottom[0].values, top[0].values, self.fused_arguments())
            mean, var = self.mean, self.var
        else:
            x, y = bottom[0].data, top[0].data
            broadcast = (1, channels) + (1,) * (x.ndim - 2)
            if not self.global_stats:
                axes = (0,) + tuple(range(2, x.ndim))
                mean = self.across_ranks(x.mean(axis=axes), "mean")
                var = self.across_ranks(((x - mean.reshape(broadcast)) ** 2).mean(axis=axes), "variance")
            self.inv_std = (1.0 / xp.sqrt(var + p.eps)).astype(self.dtype)
            xp.multiply(x - mean.reshape(broadcast), self.inv_std.reshape(broadcast), out=y)
            if not self.global_stats:
                self.normalized = y.copy()
        if not self.global_stats:
            self.update_sums(mean, var, bottom[0].count // channels * (self.backend.comm.size if p.sync else 1))

    def stored_statistics(self):
        """The mean and variance the running sums hold (``sum / f``; zeros before any batch)."""
        factor = self.blobs[2].data[0].astype(numpy.float64)  # kept on the device: a GPU is not waited for
        scale = self.xp.where(factor == 0, 0.0, 1.0 / self.xp.where(factor == 0, 1.0, factor)).astype(self.dtype)
        return self.blobs[0].data * scale, self.blobs[1].data * scale

    def fused_arguments(self, shift: bool = True) -> dict:
        """The statistics, and the absorbed Scale's factors (and bias, with ``shift``), as oneDNN arguments."""
        arguments = {onednn.ARG_MEAN: self.mean, onednn.ARG_VARIANCE: self.var}
        if self.scale_layer is not None:
            arguments[onednn.ARG_SCALE] = self.scale_layer.blobs[0].data
            if shift and len(self.scale_layer.blobs) > 1:
                arguments[onednn.ARG_SHIFT] = self.scale_layer.blobs[1].data
        return arguments

    def update_sums(self, mean, var, count: int) -> None:
        """Caffe's running sums, from a batch's statistics over ``count`` values a channel."""
        maf = self.block("batch_norm_param").moving_average_fraction
        self.blobs[2].data *= maf
        self.blobs[2].data += 1
        self.blobs[0].data *= maf
        self.blobs[0].data += mean
        self.blobs[1].data *= maf
        self.blobs[1].data += var * (count / max(count - 1, 1))

    def across_ranks(self, means, what: str):
        """``means`` of this rank's batch, or with ``sync`` their average over every rank's equal-sized batch."""
        comm = self.backend.comm
        if comm.size == 1 or not self.block("batch_norm_param").sync:
            return means
        host = numpy.ascontiguousarray(self.backend.to_host(means))
        comm.allreduce_mean(host, f"averaging the batch {what} of BatchNorm '{self.name}'")
        return self.backend.asarray(host, dtype=means.dtype)

    def backward(self, top, propagate_down, bottom):
        if self.fast is not None and (propagate_down[0] or self.scale_layer is not None):
            scale = self.scale_layer
            self.fast.backward_into(top[0].gradient, bottom[0].gradient if propagate_down[0] else None,
                                    self.fused_arguments(shift=False), scale.blobs if scale else [],
                                    scale.param_propagate_down if scale else [])
            return
        if not propagate_down[0] or self.fast is not None:
            return
        dy, dx = top[0].diff, bottom[0].diff
        broadcast = (1, dy.shape[1]) + (1,) * (dy.ndim - 2)
        if self.global_stats:
            self.xp.multiply(dy, self.inv_std.reshape(broadcast), out=dx)
            return
        y = self.normalized
        axes = (0,) + tuple(range(2, dy.ndim))
        means = self.xp.stack([dy.mean(axis=axes, keepdims=True), (dy * y).mean(axis=axes, keepdims=True)])
        mean_dy, mean_dy_y = self.across_ranks(means, "gradient means")
        dx[...] = (dy - mean_dy - y * mean_dy_y) * self.inv_std.reshape(broadcast)
