"""Training iterations as one CUDA graph (``cuda_graph: true``, ``netspec train --cuda-graph``).

After WARM_UP eager iterations (every lazily made array made, every kernel
compiled, every workspace at its size), one iteration's device work is
captured (:mod:`netspec.engine.capture`): zeroing the gradients, the forward
pass of every layer but those that copy a batch from the host, the backward
pass and the update.  Each later iteration feeds those data layers and writes
the learning rates on the host, then launches the graph: the same kernels on
the same arrays as an eager iteration, with the same random draws, so a
graphed run trains as an eager one does (on the GPU stand-in, bit for bit).
Display, tests, snapshots and signals keep their intervals: they sit between
iterations.

A run that cannot be captured trains eagerly, saying why in one line: a
setting or layer known to need the host inside an iteration (:func:`why_not_graphed`),
or any work a capture refuses (a layer reading the device on the host),
named with its layer.
"""

from __future__ import annotations

from netspec.engine.capture import CaptureError, Graph

WARM_UP = 2  # eager iterations before the capture


def why_not_graphed(solver) -> str | None:
    """Why ``solver``'s iterations cannot be captured as a graph, known before trying; None if they may be."""
    if not solver.backend.is_gpu:
        return "the device is the CPU, which runs no CUDA graphs"
    if solver.comm.size > 1:
        return "several processes exchange gradients as the backward pass goes"
    if solver.params.iter_size > 1:
        return f"iter_size {solver.params.iter_size} feeds a batch from the host between passes of one update"
    if solver.debug_info:
        return "debug_info reads every blob on the host"
    if solver.loss_scale is not None:
        return "fp16-mixed reads on the host, every iteration, whether the scaled gradients overflowed"
    python = next((layer.name for layer in solver.net.layers if layer.type == "Python"), None)
    if python is not None:
        return f"layer '{python}' is a Python layer, whose code runs on the host"
    return None


class GraphedIterations:
    """The iterations of ``solver`` (forward, backward and update each), graphed once warm; see the module."""

    def __init__(self, solver):
        self.solver = solver
        net = solver.net
        self.fed = [index for index, layer in enumerate(net.layers) if layer.from_host]
        self.captured = [index for index in range(len(net.layers)) if index not in self.fed]
        Graph.stream_for(solver.backend)  # (the stream every iteration then runs on)
        self.eager_left = WARM_UP
        self.graph: Graph | None = None
        self.refused: str | None = None  # why the capture failed (the run then trains eagerly)
        self.at: str = ""  # the pass and layer the work is at (a refusal names it)

    def iteration(self, rate: float, iteration: int):
        """Train one iteration at learning rate ``rate``; return its loss (on the device)."""
        solver = self.solver
        if self.refused is not None or self.eager_left:
            self.eager_left = max(self.eager_left - 1, 0)
            loss = solver.forward_backward()
            solver.optimizer.step(rate, iteration)
            return loss
        for index in self.fed:
            solver.net.forward_layer(index)
        solver.optimizer.set_rates(rate, iteration)
        if self.graph is None:
            try:
                self.graph = Graph(solver.backend, self.work)
            except CaptureError as exc:
                self.refused = f"cuda_graph: {self.at} cannot be captured ({exc}): training goes on without graphs"
                solver.log.message(self.refused)
                return self.work()  # (the iteration the capture did not do)
            solver.log.message(f"cuda_graph: iteration {iteration} captured as one CUDA graph, launched for it and "
                               "every later one")
        self.graph.launch()
        return self.graph.result.copy()  # (the next launch writes the graph's again)

    def work(self):
        """An iteration's device work after its data and rates: gradients zeroed, the forward pass of the layers
        the graph runs, the backward pass, the update; the loss."""
        net = self.solver.net
        self.at = "zeroing the gradients"
        net.clear_param_diffs()
        for index in self.captured:
            self.at = f"layer '{net.layers[index].name}' (forward)"
            net.forward_layer(index)
        self.at = "the loss"
        loss = net.device_loss()
        for index in reversed(range(len(net.layers))):
            self.at = f"layer '{net.layers[index].name}' (backward)"
            net.backward_layer(index)
        self.at = "the update"
        self.solver.optimizer.apply()
        self.at = "the end of the capture"
        return loss
