"""BatchNorm: normalise each channel by batch statistics (TRAIN) or stored ones (TEST)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

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
    mean sums (C,), variance sums (C,), factor f (1,).  Runs in place; in
    TRAIN it keeps its own copy of the normalised output for backward, since
    layers after it in place (Scale, ReLU) overwrite the top.

    Example::

        - {name: bn1, type: BatchNorm, bottom: conv1, top: conv1}
        - {name: scale1, type: Scale, bottom: conv1, top: conv1, scale_param: {bias_term: true}}
    """

    type = "BatchNorm"
    param_blocks = {"batch_norm_param": BatchNormParams}
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

    def forward(self, bottom, top):
        xp = self.xp
        p = self.block("batch_norm_param")
        x = bottom[0].data
        axes = (0,) + tuple(range(2, x.ndim))
        broadcast = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if self.global_stats:
            factor = float(self.blobs[2].data[0])
            scale = 0.0 if factor == 0 else 1.0 / factor
            mean = self.blobs[0].data * scale
            var = self.blobs[1].data * scale
        else:
            mean = self.across_ranks(x.mean(axis=axes), "mean")
            var = self.across_ranks(((x - mean.reshape(broadcast)) ** 2).mean(axis=axes), "variance")
            count = x.size // x.shape[1] * (self.backend.comm.size if p.sync else 1)
            maf = p.moving_average_fraction
            self.blobs[2].data *= maf
            self.blobs[2].data += 1
            self.blobs[0].data *= maf
            self.blobs[0].data += mean
            self.blobs[1].data *= maf
            self.blobs[1].data += var * (count / max(count - 1, 1))
        self.inv_std = (1.0 / xp.sqrt(var + p.eps)).astype(self.dtype).reshape(broadcast)
        xp.multiply(x - mean.reshape(broadcast), self.inv_std, out=top[0].data)
        if not self.global_stats:
            self.normalized = top[0].data.copy()

    def across_ranks(self, means, what: str):
        """``means`` of this rank's batch, or with ``sync`` their average over every rank's equal-sized batch."""
        comm = self.backend.comm
        if comm.size == 1 or not self.block("batch_norm_param").sync:
            return means
        host = numpy.ascontiguousarray(self.backend.to_host(means))
        comm.allreduce_mean(host, f"averaging the batch {what} of BatchNorm '{self.name}'")
        return self.backend.asarray(host, dtype=means.dtype)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        if self.global_stats:
            self.xp.multiply(dy, self.inv_std, out=bottom[0].diff)
            return
        y = self.normalized
        axes = (0,) + tuple(range(2, dy.ndim))
        means = self.xp.stack([dy.mean(axis=axes, keepdims=True), (dy * y).mean(axis=axes, keepdims=True)])
        mean_dy, mean_dy_y = self.across_ranks(means, "gradient means")
        bottom[0].diff[...] = (dy - mean_dy - y * mean_dy_y) * self.inv_std
