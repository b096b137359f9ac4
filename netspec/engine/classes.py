"""The classes a classifier gives against the classes its dataset holds: ``netspec check`` and ``train`` ask.

A net copied from another dataset keeps that dataset's ``num_output``.  With
fewer outputs than the dataset has classes, training fails only when it meets
a label past them; with more, it trains classes no label names.  For every
SoftmaxWithLoss and Accuracy whose labels come from a data layer that knows
its classes (:meth:`netspec.engine.layer.Layer.label_classes`, a dataset's
manifest), the class axis of its scores is compared with them.
"""

from __future__ import annotations

from netspec.errors import Problem
from netspec.graph.graph import Graph

CLASSIFYING = {"SoftmaxWithLoss": "softmax_param", "Accuracy": "accuracy_param"}  # layer type -> its axis block


def class_problems(graph: Graph) -> tuple[list[Problem], list[str]]:
    """``(errors, warnings)``: a Problem at the layer giving the scores for fewer classes than the dataset holds,
    a warning line for more; one for each such layer."""
    producers, found, scorers = {}, {}, {}
    for node in graph.nodes:
        block = CLASSIFYING.get(node.layer.type)
        if block is not None and len(node.bottoms) > 1:
            data = _source(producers, node.bottoms[1])
            classes = None if data is None else data.layer(data.spec, graph.state.phase).label_classes(
                _named(producers, node.bottoms[1]))
            axis = node.layer(node.spec, graph.state.phase).block(block).axis % len(node.bottom_shapes[0])
            given = node.bottom_shapes[0][axis]
            if classes and given != classes:
                scorer = _source(producers, node.bottoms[0]) or node
                scorers[scorer.name] = scorer
                found[scorer.name, _named(producers, node.bottoms[0]), given, data.name, classes] = True
        for top in node.tops:
            producers[top] = node
    errors, warnings = [], []
    for name, scores, given, data, classes in found:
        scorer = scorers[name]
        where = f"its top '{scores}' scores {given} classes, but the labels of layer '{data}' have {classes}"
        if given < classes:
            errors.append(Problem(f"{where}: give it num_output: {classes}", file=scorer.spec.file,
                                  line=scorer.spec.line, layer=scorer.name))
        else:
            warnings.append(f"warning: layer '{scorer.name}': {where}; {given - classes} output(s) stand for no class")
    return errors, warnings


def _named(producers: dict, blob: str) -> str:
    """The name ``blob`` has where its writer made it (a Split's top is named after the blob it copies)."""
    node = producers.get(blob)
    while node is not None and node.layer.type == "Split":
        blob = node.bottoms[0]
        node = producers.get(blob)
    return blob


def _source(producers: dict, blob: str):
    """The node that wrote ``blob``, through the Splits the compiler adds (None: no node did)."""
    node = producers.get(blob)
    while node is not None and node.layer.type == "Split":
        node = producers.get(node.bottoms[0])
    return node
