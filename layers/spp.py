"""SPP: spatial pyramid pooling, a fixed-length feature from any map size (Caffe's SPP layer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from netspec.engine.blob import Blob
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.layers.pooling import Pooling, PoolingParams, pool_geometry
from netspec.layers.spatial import require_4d
from netspec.spec.net_spec import LayerSpec
from netspec.spec.schema import doc, required


@dataclass
class SPPParams:
    """Parameters of SPP (Caffe's SPPParameter)."""

    pyramid_height: int = required(doc="levels: level l pools each channel into 2^l x 2^l bins")
    pool: Literal["MAX", "AVE"] = doc("MAX", "MAX or AVE")


@register_layer
class SPP(Layer):
    """SPP: each channel pooled into 1, 2x2, 4x4... bins, the levels flattened and joined (He et al. 2014).

    Level ``l`` (0 to ``pyramid_height - 1``) pools with ``b = 2^l`` bins a
    side: window ``k = ceil(H / b)``, stride ``k``, padding
    ``(k*b - H + 1) // 2`` (and likewise along W), by Caffe's Pooling rules.
    Bottom: (N, C, H, W).  Top: (N, C * sum_l 4^l), level 0 first, each level
    in (C, b, b) order; with one level, (N, C, 1, 1), as Caffe leaves its one
    pooling's top.  Not in place.

    Example::

        - {name: spp, type: SPP, bottom: conv5, top: spp, spp_param: {pyramid_height: 3}}
    """

    type = "SPP"
    param_blocks = {"spp_param": SPPParams}
    learnable = False

    def level_params(self, level: int, shape) -> PoolingParams:
        """The pooling of one level of the pyramid for a (N, C, H, W) bottom."""
        bins = 2 ** level
        kernels = [math.ceil(size / bins) for size in shape[2:]]
        pads = [(k * bins - size + 1) // 2 for k, size in zip(kernels, shape[2:])]
        return PoolingParams(pool=self.block("spp_param").pool, kernel_h=kernels[0], kernel_w=kernels[1],
                             stride_h=kernels[0], stride_w=kernels[1], pad_h=pads[0], pad_w=pads[1])

    def levels(self, shape) -> list[PoolingParams]:
        """Every level's pooling, checked to give its bins."""
        require_4d(shape, self.type)
        height = self.block("spp_param").pyramid_height
        if height is None or height < 1:
            raise ParamError("spp_param.pyramid_height", f"must be at least 1, got {height}")
        levels = [self.level_params(level, shape) for level in range(height)]
        for level, params in enumerate(levels):
            try:
                out = pool_geometry(params, shape).out
            except (ParamError, ShapeError):  # (a window of padding only: the map is smaller than the bins)
                out = None
            if out != (2 ** level, 2 ** level):
                raise ShapeError(f"a {shape[2]}x{shape[3]} map is too small for {2 ** level}x{2 ** level} bins at "
                                 f"level {level}", "spp_param.pyramid_height")
        return levels

    def top_shapes(self, bottom_shapes):
        n, c = bottom_shapes[0][:2]
        height = len(self.levels(bottom_shapes[0]))
        if height == 1:  # (Caffe's one pooling writes the top itself, unflattened)
            return [(n, c, 1, 1)]
        return [(n, c * sum(4 ** level for level in range(height)))]

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        shape = bottom[0].shape
        self.pools = []
        for level, params in enumerate(self.levels(shape)):
            spec = LayerSpec(name=f"{self.name}/level{level}", type="Pooling", bottoms=[], tops=[],
                             blocks={"pooling_param": params}, params=[], include=[], exclude=[], loss_weight=None,
                             propagate_down=None, file=self.spec.file, line=self.spec.line, key_lines={})
            pool, bins = Pooling(spec, self.phase), 2 ** level
            pooled = Blob((shape[0], shape[1], bins, bins), self.xp, self.dtype, spec.name)
            pool.setup(bottom, [pooled], self.backend, self.dtype)
            self.pools.append((pool, pooled))
        self.gradient = Blob(shape, self.xp, self.dtype, f"{self.name}/gradient")  # one level's, for the sum

    def forward(self, bottom, top):
        start, out = 0, top[0].data.reshape(top[0].shape[0], -1)
        for pool, pooled in self.pools:
            pool.forward(bottom, [pooled])
            width = pooled.count // pooled.shape[0]
            out[:, start:start + width] = pooled.data.reshape(pooled.shape[0], width)
            start += width

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.gradient.share_data(bottom[0])
        start, dy = 0, top[0].diff.reshape(top[0].shape[0], -1)
        bottom[0].diff[...] = 0
        for pool, pooled in self.pools:
            width = pooled.count // pooled.shape[0]
            pooled.diff[...] = dy[:, start:start + width].reshape(pooled.shape)
            pool.backward([pooled], [True], [self.gradient])
            bottom[0].diff += self.gradient.diff
            start += width
