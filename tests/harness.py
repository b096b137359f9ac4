"""Helpers for layer tests: a one-layer net in float64, gradient checks by central differences."""

from __future__ import annotations

import numpy as np
import yaml

import netspec


def one_layer_net(layer_type: str, bottom_shapes, tops: int | list[str] = 1, params: dict | None = None,
                  phase: str = "TRAIN", inplace: bool = False, bottoms=None, seed: int = 0,
                  dtype=np.float64) -> netspec.Net:
    """A net whose Input layer feeds ``bottom_shapes`` to one layer of ``layer_type``.

    ``force_backward`` is on, so every bottom but labels receives a gradient.
    ``bottoms`` (arrays) are copied into the inputs; learnable blobs are random.
    """
    names = [f"b{i}" for i in range(len(bottom_shapes))]
    top_names = tops if isinstance(tops, list) else [f"t{i}" for i in range(tops)]
    if inplace:
        top_names = [names[0]] + top_names[1:]
    layers = []
    if names:
        layers.append({"name": "input", "type": "Input", "top": names,
                       "input_param": {"shape": [{"dim": list(s)} for s in bottom_shapes]}})
    layers.append({"name": "under_test", "type": layer_type, "bottom": names, "top": top_names, **(params or {})})
    net = netspec.load_net(yaml.safe_dump({"force_backward": True, "layers": layers}), phase=phase, dtype=dtype,
                           seed=seed)
    rng = np.random.default_rng(seed + 1)
    for blob, value in zip(net.bottom_blobs[-1], bottoms or []):
        blob.data[...] = value
    if net.layers[-1].learnable:
        for blob in net.layers[-1].blobs:
            blob.data[...] = rng.uniform(0.5, 1.5, blob.shape) * rng.choice([-1, 1], blob.shape)
    return net


def run_forward(net: netspec.Net) -> list[np.ndarray]:
    """Forward the layer under test; return copies of its tops."""
    net.backend.seed(7)
    net.forward_layer(len(net.layers) - 1)
    return [t.data.copy() for t in net.top_blobs[-1]]


def gradient_check(net: netspec.Net, eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-6,
                   samples: int = 40, check_params: bool = True) -> None:
    """Compare the analytic gradients of the last layer with central differences of a random projection."""
    layer = net.layers[-1]
    bottom, top = net.bottom_blobs[-1], net.top_blobs[-1]
    originals = [b.data.copy() for b in bottom]
    rng = np.random.default_rng(3)
    projections = [rng.standard_normal(t.shape) for t in top]
    wanted = [i not in type(layer).label_bottoms for i in range(len(bottom))]

    def objective() -> float:
        for blob, original in zip(bottom, originals):
            blob.data[...] = original
        net.backend.seed(11)
        layer.forward(bottom, top)
        return sum(float((t.data * p).sum()) for t, p in zip(top, projections))

    objective()
    for blob, projection in zip(top, projections):
        blob.diff[...] = projection
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward(top, wanted, bottom)
    analytic_bottoms = [b.diff.copy() for b in bottom]
    analytic_params = [p.diff.copy() for p in layer.blobs]

    def compare(array, analytic, label):
        flat = array.reshape(-1)
        picks = rng.choice(flat.size, size=min(samples, flat.size), replace=False)
        for index in picks:
            saved = flat[index]
            flat[index] = saved + eps
            plus = objective()
            flat[index] = saved - eps
            minus = objective()
            flat[index] = saved
            numeric = (plus - minus) / (2 * eps)
            got = analytic.reshape(-1)[index]
            assert abs(got - numeric) <= atol + rtol * max(abs(got), abs(numeric)), (
                f"{label}[{index}]: analytic {got!r} vs numeric {numeric!r}")

    for i, original in enumerate(originals):
        if wanted[i]:
            compare(original, analytic_bottoms[i], f"bottom {i}")
    if check_params and layer.learnable:
        for i, blob in enumerate(layer.blobs):
            compare(blob.data, analytic_params[i], f"param {i}")
    objective()
