"""A classifier's per-class figures on its test data: the confusion matrix, each class's precision and recall.

``netspec test --report`` asks.  The classifier is the net's first Accuracy
layer (else its first SoftmaxWithLoss): its scores and labels are read after
each forward pass, the prediction being the first class of the highest score;
labels equal to its ``ignore_label`` are left out.
"""

from __future__ import annotations

import numpy

from netspec.errors import ConfigError

SCORED = {"Accuracy": "accuracy_param", "SoftmaxWithLoss": "softmax_param"}  # layer type -> its axis block


class Confusion:
    """The confusion matrix of a net's classifier (rows: labels, columns: predictions), filled pass by pass."""

    def __init__(self, net):
        node = next((node for kind in SCORED for node in net.nodes if node.layer.type == kind), None)
        if node is None:
            raise ConfigError(f"net '{net.name}' has no Accuracy or SoftmaxWithLoss layer to report on")
        layer = net.layer_by_name[node.name]
        self.scores, self.labels = node.bottoms[0], node.bottoms[1]
        self.axis = layer.block(SCORED[node.layer.type]).axis % len(net.blobs[self.scores].shape)
        loss = layer.block("loss_param") if "loss_param" in layer.param_blocks else None
        self.ignore = loss.ignore_label if loss is not None else layer.block("accuracy_param").ignore_label
        self.classes = net.blobs[self.scores].shape[self.axis]
        self.matrix = numpy.zeros((self.classes, self.classes), dtype=numpy.int64)
        source = net.data_layer()
        names = source.label_names(self.labels) if source is not None else None
        self.names = names if names and len(names) == self.classes else [str(k) for k in range(self.classes)]

    def add(self, net) -> None:
        """Count the pass ``net`` just ran (this net, or the same net built for another batch size: one read of
        the scores and labels)."""
        backend = net.backend
        predicted = numpy.argmax(backend.to_host(net.blobs[self.scores].data), axis=self.axis).reshape(-1)
        labels = backend.to_host(net.blobs[self.labels].data).reshape(-1)
        kept = labels != self.ignore if self.ignore is not None else numpy.ones(labels.shape, dtype=bool)
        numpy.add.at(self.matrix, (labels[kept].astype(numpy.int64), predicted[kept]), 1)

    def figures(self) -> dict:
        """Every class's records, precision and recall (None where no record was predicted or labelled as it),
        and the matrix, as JSON-ready data."""
        hits, labelled, predicted = numpy.diag(self.matrix), self.matrix.sum(axis=1), self.matrix.sum(axis=0)
        return {"classes": self.names, "records": labelled.tolist(),
                "precision": [float(h / p) if p else None for h, p in zip(hits, predicted)],
                "recall": [float(h / n) if n else None for h, n in zip(hits, labelled)],
                "confusion": self.matrix.tolist()}

    def text(self, widest: int = 20) -> str:
        """The figures as a table, then the matrix when it has at most ``widest`` classes."""
        figures = self.figures()
        width = max(len("class"), *map(len, self.names))
        lines = [f"{'class':<{width}}  {'records':>8}  {'precision':>9}  {'recall':>6}"]
        for name, count, precision, recall in zip(self.names, figures["records"], figures["precision"],
                                                  figures["recall"]):
            shown = [f"{value:.3f}" if value is not None else "-" for value in (precision, recall)]
            lines.append(f"{name:<{width}}  {count:>8}  {shown[0]:>9}  {shown[1]:>6}")
        if self.classes > widest:
            return "\n".join(lines + [f"(the {self.classes} x {self.classes} confusion matrix is in --json)"])
        cell = max(len(str(self.matrix.max())), *map(len, self.names))
        lines.append("confusion (rows: labels, columns: predictions):")
        lines.append(" " * width + "".join(f"  {name:>{cell}}" for name in self.names))
        for name, row in zip(self.names, self.matrix):
            lines.append(f"{name:<{width}}" + "".join(f"  {count:>{cell}}" for count in row))
        return "\n".join(lines)

