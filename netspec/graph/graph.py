"""The compiled net: layers in execution order with every blob named and shaped, as plain data.

A :class:`Graph` holds no arrays and no layer objects: each :class:`Node` names
its layer's class, spec, blobs, shapes, FLOPs, sharing and backward needs.
The engine's :class:`netspec.engine.net.Net` creates the layers from it, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netspec.spec.net_spec import LayerSpec, NetState, ParamSpec


@dataclass
class Node:
    """One layer placed in the graph, with its blobs named as the net will hold them.

    ``layer`` is the layer's class (its registered type); the net instantiates it.
    """

    layer: type
    spec: LayerSpec
    bottoms: list[str]
    tops: list[str]
    bottom_shapes: list[tuple] = field(default_factory=list)
    top_shapes: list[tuple] = field(default_factory=list)
    param_shapes: list[tuple] = field(default_factory=list)
    flops: int = 0
    param_specs: list[ParamSpec] = field(default_factory=list)
    param_owners: list[tuple[int, int] | None] = field(default_factory=list)
    loss_weights: list[float] = field(default_factory=list)
    inplace: list[bool] = field(default_factory=list)
    need_backward: bool = False
    bottom_need_backward: list[bool] = field(default_factory=list)
    top_diff_written: list[bool] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The layer's name."""
        return self.spec.name

    @property
    def param_propagate_down(self) -> list[bool]:
        """Which learnable blobs take a gradient (those with a non-zero lr_mult)."""
        return [param.lr_mult != 0 for param in self.param_specs]

    def learnable_count(self) -> int:
        """Learnable parameters owned by this node (shared ones counted at their owner)."""
        if not self.layer.learnable:
            return 0
        return sum(math.prod(s) for s, owner in zip(self.param_shapes, self.param_owners) if owner is None)


@dataclass
class Graph:
    """A compiled net: nodes in execution order and every blob's shape."""

    name: str
    state: NetState
    nodes: list[Node]
    blob_shapes: dict[str, tuple]
    outputs: list[str]
    config_hash: str
    file: str | None

    def learnable_count(self) -> int:
        """Total learnable parameters (each shared blob once)."""
        return sum(node.learnable_count() for node in self.nodes)
