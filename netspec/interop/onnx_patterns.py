"""Subgraphs of ONNX operators rewritten before conversion: those exporters write for one function netspec has as
a layer, as that function's own operator (GELU, which exporters before opset 20 write as
``x * 0.5 * (1 + erf(x / sqrt(2)))``: Div or Mul, Erf, Add, Mul, Mul), and, where asked, a BatchNormalization
folded into the convolution before it.
"""

from __future__ import annotations

import collections
import math

import numpy


def _near(value, target: float) -> bool:
    return value is not None and value.size == 1 and math.isclose(float(value.reshape(-1)[0]), target, rel_tol=1e-4)


class _Graph:
    """The nodes, who produces and who reads each tensor, and the constants."""

    def __init__(self, nodes: list, constants: dict, outputs: set[str]):
        self.nodes, self.constants, self.outputs = nodes, constants, outputs
        self.producer = {name: node for node in nodes for name in node.output}
        self.readers = collections.defaultdict(list)
        for node in nodes:
            for name in node.input:
                self.readers[name].append(node)

    def only_reader(self, tensor: str, op: str):
        """The node of type ``op`` that alone reads ``tensor`` (which is no graph output), else None."""
        readers = self.readers.get(tensor, [])
        if len(readers) != 1 or readers[0].op_type != op or tensor in self.outputs:
            return None
        return readers[0]

    def operands(self, node) -> tuple[str | None, numpy.ndarray | None]:
        """A binary node's computed operand and constant one, either order (None, None where not so)."""
        first, second = node.input[:2]
        if second in self.constants and first not in self.constants:
            return first, self.constants[second]
        if first in self.constants and second not in self.constants:
            return second, self.constants[first]
        return None, None


def _gelu(graph: _Graph, erf) -> tuple[list, object] | None:
    """The nodes of the GELU pattern around ``erf`` and the Gelu node standing for them, or None."""
    from onnx import helper

    scaled = graph.producer.get(erf.input[0])
    if scaled is None or scaled.op_type not in ("Div", "Mul") or graph.only_reader(scaled.output[0], "Erf") is None:
        return None
    x, factor = graph.operands(scaled)
    if x is None or not _near(factor, math.sqrt(2) if scaled.op_type == "Div" else 1 / math.sqrt(2)):
        return None
    if scaled.op_type == "Div" and scaled.input[0] != x:
        return None
    plus_one = graph.only_reader(erf.output[0], "Add")
    if plus_one is None or not _near(graph.operands(plus_one)[1], 1.0):
        return None
    first = graph.only_reader(plus_one.output[0], "Mul")
    if first is None:
        return None
    other = first.input[1] if first.input[0] == plus_one.output[0] else first.input[0]
    half = graph.producer.get(other)
    if other == x:  # x * (1 + erf) * 0.5
        last = graph.only_reader(first.output[0], "Mul")
        if last is None or not _near(graph.operands(last)[1], 0.5):
            return None
        nodes = [scaled, erf, plus_one, first, last]
    elif half is not None and half.op_type == "Mul" and graph.operands(half)[0] == x and \
            _near(graph.operands(half)[1], 0.5) and graph.only_reader(other, "Mul") is first:  # (x * 0.5) * (1 + erf)
        last = first
        nodes = [scaled, erf, plus_one, half, first]
    else:
        return None
    return nodes, helper.make_node("Gelu", [x], [last.output[0]], name=erf.name or last.name)


def fold_batchnorm(nodes: list, constants: dict, outputs: set[str]) -> tuple[list, list[str]]:
    """``nodes`` with each inference BatchNormalization that alone reads a Conv's output (weights and statistics
    constant) folded into that Conv's weights and bias (new constants in ``constants``); a note of how many."""
    from onnx import helper

    graph = _Graph(nodes, constants, outputs)
    folded: dict[int, object] = {}
    for norm in nodes:
        conv = graph.producer.get(norm.input[0]) if norm.op_type == "BatchNormalization" else None
        if conv is None or conv.op_type != "Conv" or graph.only_reader(conv.output[0], norm.op_type) is not norm:
            continue
        values = [constants.get(name) for name in (*conv.input[1:2], *norm.input[1:5])]
        bias = constants.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else 0.0
        training = any(attr.name == "training_mode" and attr.i for attr in norm.attribute)
        if any(value is None for value in values) or bias is None or training or any(norm.output[1:]):
            continue
        weights, scale, shift, mean, variance = (value.astype(numpy.float64) for value in values)
        epsilon = next((attr.f for attr in norm.attribute if attr.name == "epsilon"), 1e-5)
        factor = scale / numpy.sqrt(variance + epsilon)
        names = [f"{norm.output[0]}/folded_weights", f"{norm.output[0]}/folded_bias"]
        constants[names[0]] = (weights * factor.reshape(-1, *[1] * (weights.ndim - 1))).astype(numpy.float32)
        constants[names[1]] = ((bias - mean) * factor + shift).astype(numpy.float32)
        replacement = helper.make_node("Conv", [conv.input[0], *names], [norm.output[0]], name=conv.name)
        replacement.attribute.extend(conv.attribute)
        folded[id(conv)], folded[id(norm)] = replacement, None
    result = [folded.get(id(node), node) for node in nodes if folded.get(id(node), node) is not None]
    count = sum(1 for node in folded.values() if node is not None)
    return result, [f"BatchNormalization folded into the convolution before it: {count}"] if count else []


def recognise(nodes: list, constants: dict, outputs: set[str]) -> tuple[list, list[str]]:
    """``nodes`` (in order) with each pattern replaced by its operator, at the place of the pattern's last node;
    and a note for each kind found."""
    graph = _Graph(nodes, constants, outputs)
    replaced, found = {}, 0
    for node in nodes:
        if node.op_type != "Erf":
            continue
        match = _gelu(graph, node)
        if match is None:
            continue
        members, gelu = match
        for member in members:
            replaced[id(member)] = None
        replaced[id(members[-1])] = gelu  # (where the pattern's last node was: after everything it reads)
        found += 1
    result = []
    for node in nodes:
        if id(node) not in replaced:
            result.append(node)
        elif replaced[id(node)] is not None:
            result.append(replaced[id(node)])
    notes = [f"GELU recognised in {found} Erf subgraph(s) (x * 0.5 * (1 + erf(x / sqrt(2))))"] if found else []
    return result, notes
