"""Each class's accuracy over a whole test pass, for the test events of metrics.jsonl.

An Accuracy layer with a second top gives each class's accuracy within one
batch (Caffe's rule), and averaging those over a pass would weigh a batch
holding one record of a class as much as one holding a hundred.  So a test
pass adds up the layer's per-class hits and counts instead (on the device,
read once), over every rank, and the event records, under ``per_class``,
each such top's list of ``hits / records`` by class: None for a class the
pass held no record of.
"""

from __future__ import annotations

import numpy

from netspec.training.distributed import mean_over_ranks


class PerClassAccuracy:
    """Sums the per-class hits and counts of ``net``'s Accuracy layers that have a second top, pass by pass."""

    def __init__(self, net):
        self.tops = {layer.name: layer.spec.tops[1] for layer in net.layers
                     if layer.type == "Accuracy" and len(layer.spec.tops) > 1}
        self.hits: dict[str, object] = {}
        self.counts: dict[str, object] = {}

    def __bool__(self) -> bool:
        return bool(self.tops)

    def add(self, net) -> None:
        """Count the pass ``net`` just ran (the test net, or its copy for the last records)."""
        for name in self.tops:
            layer = net.layer_by_name[name]
            self.hits[name] = self.hits.get(name, 0) + layer.class_hits
            self.counts[name] = self.counts.get(name, 0) + layer.class_counts

    def figures(self, net, comm, what: str) -> dict[str, list[float | None]]:
        """``{top: [accuracy of class k, ...]}`` over what :meth:`add` counted on every rank of ``comm``
        (``what`` names the exchange in its errors); the sums start again."""
        figures = {}
        for name, top in self.tops.items():
            counted = numpy.concatenate([net.backend.to_host(self.hits[name]), net.backend.to_host(self.counts[name])])
            summed = mean_over_ranks(comm, dict(enumerate(counted.astype(numpy.float64).tolist())), what)
            hits, counts = numpy.split(numpy.array(list(summed.values())), 2)  # (means of sums: the same ratios)
            figures[top] = [float(h / c) if c else None for h, c in zip(hits, counts)]
        self.hits, self.counts = {}, {}
        return figures
