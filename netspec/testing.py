"""Checks for layer types: the ones netspec's own test suite runs on every built-in layer.

Use them on a layer you wrote, to check it the way the built-in ones are
checked.  The checks work on nets from :func:`one_layer_net`, in float64,
whose Input layer feeds arrays you choose to one layer of the type under test
(the net's last layer).  A failed check raises ``AssertionError`` with a
message naming what differs, so a check can be called from a pytest test (or
from anywhere else) as it is:

- :func:`check_forward`: the tops equal a reference you write in NumPy;
- :func:`gradient_check`: the gradients of ``backward`` equal central
  differences of ``forward`` (bottoms and learnable blobs);
- :func:`check_accumulation`: ``backward`` accumulates into parameter diffs
  and overwrites bottom diffs, as the net expects;
- :func:`check_inplace`: running in place (bottom and top one blob) gives the
  tops and gradients of running out of place;
- :func:`check_reshape`: the layer follows its bottoms to a new batch size;
- :func:`check_layer`: all of the above that apply, in one call;
- :func:`check_float32`: in float32, what training computes, the layer's tops
  and gradients are its float64 ones to float32's precision.

A check runs on the device of the net it is given: :func:`one_layer_net` and
:func:`check_layer` take ``device`` (``"cpu"``, the default, ``"gpu"`` or
``"gpu:N"``, which need CuPy), and the checks bring tops, diffs and
parameters to the host to compare them, so a reference is NumPy code on every
device.

A check uses up the net it is given (it runs passes and overwrites data and
diffs); build a fresh net for each one, which is cheap.

Example, for a layer that doubles its input::

    import numpy as np

    from netspec.engine.layer import Layer
    from netspec.engine.registry import register_layer
    from netspec.testing import check_layer, gradient_check, one_layer_net


    @register_layer
    class Doubler(Layer):
        type = "Doubler"
        learnable = False
        inplace_ok = True

        def top_shapes(self, bottom_shapes):
            return [bottom_shapes[0]]

        def forward(self, bottom, top):
            self.xp.multiply(bottom[0].data, 2, out=top[0].data)

        def backward(self, top, propagate_down, bottom):
            if propagate_down[0]:
                self.xp.multiply(top[0].diff, 2, out=bottom[0].diff)


    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 4))
    check_layer("Doubler", [x], reference=lambda bottoms, params: [2 * bottoms[0]])

or one check at a time (``one_layer_net(..., params={"doubler_param": {...}})``
would give a layer its parameter blocks as a net file does)::

    net = one_layer_net("Doubler", [x.shape], bottoms=[x])
    gradient_check(net)

The arrays a reference receives are copies of the bottoms' and learnable
blobs' data (float64); it returns one array per top.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import yaml

from netspec.engine.net import Net, load_net
from netspec.engine.registry import layer_class
from netspec.engine.trust import OWN

Reference = Callable[[list[np.ndarray], list[np.ndarray]], Sequence[np.ndarray]]

__all__ = ["check_accumulation", "check_float32", "check_forward", "check_inplace", "check_layer", "check_reshape",
           "gradient_check", "one_layer_net", "run_forward"]


def one_layer_net(layer_type: str, bottom_shapes, tops: int | list[str] = 1, params: dict | None = None,
                  phase: str = "TRAIN", inplace: bool = False, bottoms=None, seed: int = 0,
                  dtype=np.float64, device: str = "cpu") -> Net:
    """A net whose Input layer feeds ``bottom_shapes`` to one layer of ``layer_type``.

    The layer under test is the net's last layer, named ``under_test``; its
    bottoms are ``b0, b1...`` and its tops ``t0, t1...`` (or the names in
    ``tops``).  ``params`` holds its keys as in a net file
    (``{"convolution_param": {...}, "loss_weight": 2}``).  With ``inplace``
    its first top is its first bottom.  ``force_backward`` is on, so every
    bottom but labels receives a gradient.  ``bottoms`` (arrays) are copied
    into the inputs; learnable blobs are random, in +-[0.5, 1.5), the same
    on every ``device`` (``"cpu"``, ``"gpu"`` or ``"gpu:N"``).

    Raises what :func:`netspec.load_net` raises for a layer that cannot be
    built (``ConfigError``, ``ShapeError``...) or a device that is not there
    (``DeviceError``).
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
    net = load_net(yaml.safe_dump({"force_backward": True, "layers": layers}), phase=phase, device=device,
                   dtype=dtype, seed=seed, trust=OWN)  # (the layer under test is the caller's own)
    rng = np.random.default_rng(seed + 1)
    for blob, value in zip(net.bottom_blobs[-1], bottoms or []):
        blob.data[...] = net.backend.asarray(value)
    if net.layers[-1].learnable:
        for blob in net.layers[-1].blobs:
            blob.data[...] = net.backend.asarray(rng.uniform(0.5, 1.5, blob.shape) * rng.choice([-1, 1], blob.shape))
    return net


def _host(net: Net, array) -> np.ndarray:
    """A NumPy copy, on the host, of ``array`` (an array on ``net``'s device)."""
    return np.array(net.backend.to_host(array))


def run_forward(net: Net) -> list[np.ndarray]:
    """Forward the last layer (the one under test) with the backend's seed at 7; return NumPy copies of its tops.

    Checks nothing; the fixed seed makes random layers (Dropout) repeat.
    """
    net.backend.seed(7)
    net.forward_layer(len(net.layers) - 1)
    return [_host(net, t.data) for t in net.top_blobs[-1]]


def gradient_check(net: Net, eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-6,
                   samples: int = 40, check_params: bool = True) -> None:
    """Check the analytic gradients of the last layer against central differences.

    The objective is a fixed random projection of the tops; ``backward`` is
    given its gradient as top diffs, and up to ``samples`` random entries of
    every bottom that takes a gradient (not label bottoms) and, with
    ``check_params``, of every learnable blob are each moved by ``+-eps``
    to compare ``(f(x + eps) - f(x - eps)) / (2 eps)`` with the analytic
    diff.  Use a float64 net (:func:`one_layer_net` makes one).  The bottoms
    are restored and the layer forwarded once more at the end.

    Raises AssertionError naming the first entry whose analytic and numeric
    derivatives differ by more than ``atol + rtol * max(|analytic|, |numeric|)``.
    """
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
        return sum(float((net.backend.to_host(t.data) * p).sum()) for t, p in zip(top, projections))

    objective()
    for blob, projection in zip(top, projections):
        blob.diff[...] = net.backend.asarray(projection)
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward(top, wanted, bottom)
    analytic_bottoms = [_host(net, b.diff) for b in bottom]
    analytic_params = [_host(net, p.diff) for p in layer.blobs]

    def compare(array, analytic, label):
        flat = array.reshape(-1)
        picks = rng.choice(flat.size, size=min(samples, flat.size), replace=False)
        for index in picks:
            saved = flat[index].copy()  # (CuPy gives a view of the element)
            flat[index] = saved + eps
            plus = objective()
            flat[index] = saved - eps
            minus = objective()
            flat[index] = saved
            numeric = (plus - minus) / (2 * eps)
            got = analytic.reshape(-1)[index]
            if not abs(got - numeric) <= atol + rtol * max(abs(got), abs(numeric)):
                raise AssertionError(f"{label}[{index}]: analytic {got!r} vs numeric {numeric!r}")

    for i, original in enumerate(originals):
        if wanted[i]:
            compare(original, analytic_bottoms[i], f"bottom {i}")
    if check_params and layer.learnable:
        for i, blob in enumerate(layer.blobs):
            compare(blob.data, analytic_params[i], f"param {i}")
    objective()


def _compare_tops(got: list[np.ndarray], expected, what: str) -> None:
    """Raise AssertionError unless ``got`` and ``expected`` have one array per top, of equal shapes and values."""
    if len(got) != len(expected):
        raise AssertionError(f"{what}: the layer has {len(got)} top(s), the reference returned {len(expected)}")
    for index, (g, e) in enumerate(zip(got, expected)):
        if g.shape != np.shape(e):
            raise AssertionError(f"{what}: top {index} has shape {g.shape}, the reference {np.shape(e)}")
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12, err_msg=f"{what}: top {index}")


def check_forward(net: Net, reference: Reference) -> None:
    """Check that forwarding the last layer gives the tops ``reference(bottoms, params)`` returns.

    ``reference`` receives NumPy copies of the bottoms' and learnable blobs'
    data and returns one array per top.  Raises AssertionError when the
    number of tops, a shape, or a value (beyond ``rtol=1e-10, atol=1e-12``)
    differs.
    """
    layer = net.layers[-1]
    expected = reference([_host(net, b.data) for b in net.bottom_blobs[-1]], [_host(net, b.data) for b in layer.blobs])
    for blob in net.top_blobs[-1]:  # every element must be written: a net may give the top a buffer other blobs use
        if not any(blob.data is b.data for b in net.bottom_blobs[-1]):  # (a Split top may read its bottom's data)
            blob.data[...] = np.nan
    _compare_tops(run_forward(net), expected, "forward")


def check_accumulation(net: Net) -> None:
    """Check that the last layer's backward accumulates into parameter diffs and overwrites bottom diffs.

    Runs forward, then backward twice with every top diff at 1 (parameter
    diffs zeroed first, bottom diffs NaN): each parameter diff must be twice
    what it was after the first backward, each bottom diff (but labels')
    written whole the first time and unchanged by the second.  Raises
    AssertionError naming the blob that breaks the rule.
    """
    layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
    run_forward(net)
    for blob in top:
        blob.diff[...] = 1.0
    for blob in layer.blobs:
        blob.diff[...] = 0
    wanted = [i not in type(layer).label_bottoms for i in range(len(bottom))]
    for blob, w in zip(bottom, wanted):
        if w and blob not in top:  # (a net may give the diff a buffer other blobs use)
            blob.diff[...] = np.nan
    layer.backward(top, wanted, bottom)
    once_params = [_host(net, p.diff) for p in layer.blobs]
    once_bottoms = [_host(net, b.diff) for b in bottom]
    for index, (once, w) in enumerate(zip(once_bottoms, wanted)):
        if w and not np.isfinite(once).all():
            raise AssertionError(f"bottom {index}: backward left elements of the diff unwritten (bottom diffs are "
                                 "overwritten whole)")
    layer.backward(top, wanted, bottom)
    for index, (p, once) in enumerate(zip(layer.blobs, once_params)):
        np.testing.assert_allclose(_host(net, p.diff), 2 * once, rtol=1e-12, err_msg=(
            f"param {index}: a second backward must add to the diff (parameter diffs accumulate)"))
    for index, (b, once, w) in enumerate(zip(bottom, once_bottoms, wanted)):
        if w:
            np.testing.assert_allclose(_host(net, b.diff), once, rtol=1e-12, err_msg=(
                f"bottom {index}: a second backward must give the same diff (bottom diffs are overwritten)"))


def check_inplace(build: Callable[..., Net], gradient: bool = True) -> None:
    """Check that the layer computes the same in place as out of place.

    ``build(inplace=...)`` returns a fresh :func:`one_layer_net` of the layer
    (``lambda inplace: one_layer_net("Doubler", [x.shape], bottoms=[x],
    inplace=inplace)``).  The in-place net gets the out-of-place net's
    learnable blobs; both are forwarded and given one top diff, and the first
    top and the first bottom's diff must agree; with ``gradient``, a third net,
    in place, must pass :func:`gradient_check`.  Raises AssertionError where
    they differ (``ConfigError`` from ``build`` when the layer refuses to run
    in place).
    """
    plain, inplace = build(inplace=False), build(inplace=True)
    for net in (plain, inplace):
        for blob, value in zip(net.layers[-1].blobs, plain.layers[-1].blobs):
            blob.data[...] = value.data
    expected, got = run_forward(plain), run_forward(inplace)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12, err_msg="in place: top 0 differs from out of place")
    grads = []
    for net in (plain, inplace):
        top = net.top_blobs[-1]
        top[0].diff[...] = net.backend.asarray(np.linspace(-1, 1, top[0].data.size).reshape(top[0].shape))
        net.layers[-1].backward(top, [True] * len(net.bottom_blobs[-1]), net.bottom_blobs[-1])
        grads.append(_host(net, net.bottom_blobs[-1][0].diff))
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-14,
                               err_msg="in place: the diff of bottom 0 differs from out of place")
    if gradient:
        gradient_check(build(inplace=True))


def check_reshape(net: Net, reference: Reference, bottoms: Sequence[np.ndarray] | None = None) -> None:
    """Check that the last layer follows its bottoms to new shapes.

    The bottoms are reshaped to ``bottoms`` (by default: each bottom stacked
    twice along axis 0, twice the batch) and filled with them, the layer is
    reshaped and forwarded, and the tops must equal ``reference(bottoms,
    params)`` as in :func:`check_forward`.  Raises AssertionError when a top's
    number, shape or values differ.
    """
    layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
    if bottoms is None:
        bottoms = [np.concatenate([_host(net, b.data)] * 2) for b in bottom]
    new = [np.array(b, dtype=np.float64) for b in bottoms]
    for blob, value in zip(bottom, new):
        blob.reshape(value.shape)
        blob.data[...] = net.backend.asarray(value)
    layer.reshape(bottom, top)
    got = run_forward(net)
    expected = reference([b.copy() for b in new], [_host(net, b.data) for b in layer.blobs])
    _compare_tops(got, expected, "after reshape")


FLOAT32_RTOL = 1e-4  # float32's rounding, through a layer's few operations, as ||error|| / ||float64 result||


def check_float32(build: Callable[..., Net], rtol: float = FLOAT32_RTOL, gradient: bool = True) -> None:
    """Check that the layer in float32 computes what it computes in float64, to float32's precision.

    ``build(dtype=...)`` returns a fresh :func:`one_layer_net` of the layer in
    that dtype.  Both nets get the float32 net's bottoms and learnable blobs
    (so only the arithmetic differs), are forwarded and given the same top
    diffs; every top, bottom diff (but labels') and parameter diff of the
    float32 net must lie within ``rtol * ||float64 result||`` of the float64
    one (Euclidean norms, each array whole).  The float64 gradients are the
    ones :func:`gradient_check` checks against finite differences, which in
    float32 would measure the differences' own rounding; ``gradient=False``
    compares the tops alone (a layer without a gradient).  Raises
    AssertionError naming the first array that differs more.
    """
    single, double = build(dtype=np.float32), build(dtype=np.float64)
    for source, target in zip(single.bottom_blobs[-1] + single.layers[-1].blobs,
                              double.bottom_blobs[-1] + double.layers[-1].blobs):
        target.data[...] = double.backend.asarray(_host(single, source.data).astype(np.float64))
    results = []
    for net in (single, double):
        layer, bottom, top = net.layers[-1], net.bottom_blobs[-1], net.top_blobs[-1]
        tops = run_forward(net)
        arrays = {f"top {i}": value for i, value in enumerate(tops)}
        results.append(arrays)
        if not gradient:
            continue
        rng = np.random.default_rng(5)
        for blob in top:
            blob.diff[...] = net.backend.asarray(rng.standard_normal(blob.shape).astype(net.dtype))
        for blob in layer.blobs:
            blob.diff[...] = 0
        wanted = [i not in type(layer).label_bottoms for i in range(len(bottom))]
        layer.backward(top, wanted, bottom)
        arrays.update({f"bottom {i} diff": _host(net, b.diff) for i, b in enumerate(bottom) if wanted[i]})
        arrays.update({f"param {i} diff": _host(net, p.diff) for i, p in enumerate(layer.blobs)})
    for name, expected in results[1].items():
        got = results[0][name]
        if got.dtype != np.float32:
            raise AssertionError(f"{name}: {got.dtype} in the float32 net")
        error, size = np.linalg.norm(got - expected), np.linalg.norm(expected)
        if not error <= rtol * size:  # (NaN fails)
            raise AssertionError(f"{name}: float32 differs from float64 by {error:.3g}, more than {rtol:g} of the "
                                 f"result's norm {size:.3g}")


def check_layer(layer_type: str, bottoms: Sequence[np.ndarray], reference: Reference | None = None,
                params: dict | None = None, tops: int = 1, phase: str = "TRAIN", inplace: bool | None = None,
                gradient: bool = True, accumulation: bool = True, reshape: bool = True, device: str = "cpu") -> None:
    """Run every check that applies to a layer of ``layer_type`` fed ``bottoms`` (float64 arrays).

    With a ``reference``: :func:`check_forward` and (with ``reshape``)
    :func:`check_reshape` at twice the batch.  With ``gradient``:
    :func:`gradient_check`; with ``accumulation``: :func:`check_accumulation`.
    :func:`check_inplace` when ``inplace`` is true, or, by default, when the
    layer class says it may run in place (``inplace_ok``).  ``params``,
    ``tops``, ``phase`` and ``device`` go to :func:`one_layer_net`.  Turn off
    the checks that cannot hold: ``gradient=False`` for a layer without a
    gradient (ArgMax, Accuracy), ``reshape=False`` when a bottom must not grow
    with the batch.  Raises the AssertionError of the first check that fails.
    """
    arrays = [np.asarray(b, dtype=np.float64) for b in bottoms]
    shapes = [a.shape for a in arrays]

    def build(inplace: bool = False) -> Net:
        return one_layer_net(layer_type, shapes, tops, params, phase=phase, inplace=inplace, bottoms=arrays,
                             device=device)

    if reference is not None:
        check_forward(build(), reference)
        if reshape:
            check_reshape(build(), reference)
    if gradient:
        gradient_check(build())
    if accumulation:
        check_accumulation(build())
    if inplace is None:
        inplace = layer_class(layer_type).inplace_ok
    if inplace:
        check_inplace(build, gradient=gradient)
